"""TLS for scheduler-worker-client traffic: the certificates, and Dask's ``Security`` from them.

A cluster's certificate directory holds ``ca.pem`` (a self-signed certificate authority), ``cert.pem`` and
``key.pem`` (one certificate, signed by that authority, that the scheduler, the workers and the clients all
present). With ``--tls`` (cluster/start-local.sh) the scheduler and workers require it of every peer, so a client
without it is refused. ``make_certificates`` needs the ``cryptography`` package (``pip install distfact[cluster]``);
``openssl`` makes the same files (cluster/README.md).
"""

from __future__ import annotations

import datetime
import ipaddress
import os

FILES = ("ca.pem", "cert.pem", "key.pem")


def make_certificates(directory, hosts=("localhost", "127.0.0.1"), days: int = 365) -> list[str]:
    """Write ``ca.pem``, ``cert.pem`` and ``key.pem`` (mode 0600) into ``directory``; the certificate names
    ``hosts`` (DNS names or IP addresses). The authority's own key is not kept: to add a host, make new files
    for the whole cluster. Returns the paths written; refuses to overwrite existing files."""
    try:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
    except ImportError as exc:
        raise ImportError("making certificates needs the 'cryptography' package: pip install 'distfact[cluster]' "
                          "(or make them with openssl, see cluster/README.md)") from exc
    if days < 1:
        raise ValueError(f"days must be at least 1, got {days}")
    paths = [os.path.join(directory, name) for name in FILES]
    existing = [p for p in paths if os.path.exists(p)]
    if existing:
        raise FileExistsError(f"{existing[0]!r} exists; remove the old certificates first or choose another directory")
    os.makedirs(directory, exist_ok=True)
    now = datetime.datetime.now(datetime.timezone.utc)

    def name(common):
        return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "distfact"),
                          x509.NameAttribute(NameOID.COMMON_NAME, common)])

    def signed(subject, issuer, public_key, signing_key, extensions):
        builder = (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer).public_key(public_key)
                   .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
                   .not_valid_after(now + datetime.timedelta(days=days)))
        for extension, critical in extensions:
            builder = builder.add_extension(extension, critical=critical)
        return builder.sign(signing_key, hashes.SHA256())

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = signed(name("distfact cluster CA"), name("distfact cluster CA"), ca_key.public_key(), ca_key, [
        (x509.BasicConstraints(ca=True, path_length=0), True),
        (x509.KeyUsage(digital_signature=False, content_commitment=False, key_encipherment=False,
                       data_encipherment=False, key_agreement=False, key_cert_sign=True, crl_sign=True,
                       encipher_only=False, decipher_only=False), True)])
    key = ec.generate_private_key(ec.SECP256R1())
    cert = signed(name("distfact cluster"), ca.subject, key.public_key(), ca_key, [
        (x509.SubjectAlternativeName([_alt_name(x509, host) for host in hosts]), False),
        (x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]), False)])
    contents = [ca.public_bytes(serialization.Encoding.PEM), cert.public_bytes(serialization.Encoding.PEM),
                key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                  serialization.NoEncryption())]
    for path, content in zip(paths, contents):
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "wb") as f:
            f.write(content)
    return paths


def _alt_name(x509, host: str):
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def security_from_dir(directory):
    """Dask's ``Security`` requiring TLS, from a certificate directory (see the module docstring), for every role."""
    from distributed.security import Security

    paths = [os.path.join(os.fspath(directory), name) for name in FILES]
    missing = [p for p in paths if not os.path.isfile(p)]
    if missing:
        raise ValueError(f"TLS directory {os.fspath(directory)!r} lacks {', '.join(map(os.path.basename, missing))} "
                         "(make them with: distfact make-certs DIR)")
    ca, cert, key = paths
    # one certificate in every role: a client, a scheduler or workers started from Python (dask-jobqueue) use it
    return Security(tls_ca_file=ca, require_encryption=True, **{f"tls_{role}_{part}": path for role in
                                                                ("client", "scheduler", "worker")
                                                                for part, path in (("cert", cert), ("key", key))})
