"""Choosing where to run: nothing (in-process), a scheduler address, or a LocalCluster."""

from __future__ import annotations

import contextlib
import logging
import math
import os

logger = logging.getLogger("distfact")


@contextlib.contextmanager
def client_for(scheduler: str | None = None, local_cluster: int | None = None, tls_dir=None):
    """Yield a ``distributed.Client`` for ``scheduler`` (an address or a scheduler file ending
    in .json; over TLS with the certificates in ``tls_dir``, see ``engine/tls.py``) or a new
    ``LocalCluster`` of ``local_cluster`` single-threaded worker processes; yield None (the
    in-process default) when neither is given."""
    if scheduler and local_cluster:
        raise ValueError("give either a scheduler address or --local-cluster, not both")
    if tls_dir is not None and not scheduler:
        raise ValueError("--tls-dir (tls_dir) is for connecting to a scheduler: give its address too (a local "
                         "cluster or the in-process scheduler has no network traffic to protect)")
    if not scheduler and not local_cluster:
        yield None
        return
    from distributed import Client, LocalCluster

    if local_cluster:
        import dask

        # distfact places each block's tasks itself; stealing moved whole blocks (as in cluster/dask.yaml).
        # The setting is read when the scheduler starts.
        with dask.config.set({"distributed.scheduler.work-stealing": False}):
            cluster = LocalCluster(n_workers=int(local_cluster), threads_per_worker=1, processes=True,
                                   dashboard_address="127.0.0.1:0", host="127.0.0.1", silence_logs=logging.WARNING)
        with cluster, Client(cluster) as client:
            logger.info("LocalCluster with %d workers; dashboard %s", local_cluster, client.dashboard_link)
            yield client
        return
    with connect(scheduler, tls_dir) as client:
        logger.info("connected to %s; dashboard %s", client.scheduler.address, client.dashboard_link)
        yield client


#: The bounds, in seconds, of the waits on other processes, by their names in Dask's configuration
#: (``distfact.timeouts.<name>``: ``dask.config.set({"distfact.timeouts.connect": "30s"})``, the environment variable
#: ``DASK_DISTFACT__TIMEOUTS__CONNECT=30s`` or a Dask YAML file, e.g. for a scheduler across a slow network or
#: workers whose first import reads a slow shared file system); ``timeout(name)`` reads one.
TIMEOUTS = {
    "connect": 10,  # to reach a scheduler and hear it answer
    "first-worker": 30,  # for a first worker to join before a fit gives up
    "rejoin": 20,  # for a rerun after a lost worker to see the cluster regain its size
    "worker-check": 10,  # for every worker to answer a trivial request before a fit
    "worker-import": 120,  # more for a worker's first import of distfact (cold: numba, scikit-learn, ...)
}


def timeout(name: str) -> float:
    """The bound in seconds of the wait ``name`` of ``TIMEOUTS``: Dask's configuration ``distfact.timeouts.<name>``
    (seconds, or a duration such as ``"2 minutes"``) if set, else the default there. A value that is no positive
    duration is a ``ValueError`` naming the key."""
    import dask
    from dask.utils import parse_timedelta

    key = f"distfact.timeouts.{name}"
    value = dask.config.get(key, TIMEOUTS[name])
    try:
        seconds = parse_timedelta(value, default="s")
    except (TypeError, ValueError, KeyError, AttributeError):  # dask's parser raises each, by the value's type
        seconds = None
    if not isinstance(seconds, (int, float)) or not (seconds > 0 and math.isfinite(seconds)):
        raise ValueError(f"Dask's configuration {key} = {value!r} is not a positive duration (e.g. 10 or \"30s\")")
    return seconds


def scheduler_file_address(path: str) -> str:
    """The address in a Dask scheduler file (the JSON ``dask scheduler --scheduler-file`` writes); a file that is
    missing or is no scheduler file is a ``ValueError`` naming it."""
    import json

    if not os.path.isfile(path):
        raise ValueError(f"scheduler file {path!r} does not exist (start a cluster with cluster/start-local.sh, "
                         "which writes one)")
    try:
        with open(path, "rb") as f:
            doc = json.loads(f.read().decode("utf-8"))
    except (OSError, ValueError) as exc:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise ValueError(f"scheduler file {path!r} is not a Dask scheduler file (not JSON text: {exc})") from None
    address = doc.get("address") if isinstance(doc, dict) else None
    if not isinstance(address, str) or "://" not in address:
        raise ValueError(f"scheduler file {path!r} is not a Dask scheduler file (no \"address\" such as "
                         "\"tcp://host:8786\")")
    return address


def probe_scheduler(address: str, security=None) -> None:
    """Resolve ``address``, connect and ask who is there, within ``timeout("connect")`` seconds in all: a
    ``ValueError`` if nothing answers, or something answers that is not a Dask scheduler (e.g. a web server, which
    would wait forever for a request line: ``distributed.Client`` has no bound on that handshake). It runs on a
    daemon thread with its own event loop (so it works inside a running loop, a notebook's, and a name lookup that
    hangs cannot keep the process from exiting); the wait for it is what is bounded."""
    import asyncio
    import socket
    import threading

    from distributed.comm import connect as comm_connect
    from distributed.comm.addressing import parse_address, parse_host_port, unparse_host_port

    scheme, location = parse_address(address)
    if scheme not in ("tcp", "tls"):  # in-process or other transports: nothing a web server could sit behind
        return
    try:
        host, port = parse_host_port(location)
    except ValueError as exc:
        raise ValueError(f"the scheduler address {address!r} is not an address such as tcp://host:8786 ({exc})") \
            from None
    connection_args = {} if security is None else security.get_connection_args("client")
    bound = timeout("connect")

    async def identity(target):
        comm = await comm_connect(target, timeout=bound, **connection_args)
        try:
            await comm.write({"op": "identity"})
            return await comm.read()
        finally:
            comm.abort()

    outcome = {}

    def ask():
        try:
            ip = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][4][0]
            loop = asyncio.new_event_loop()
            try:
                outcome["answer"] = loop.run_until_complete(
                    asyncio.wait_for(identity(f"{scheme}://{unparse_host_port(ip, port)}"), bound))
            finally:
                loop.close()
        except BaseException as exc:  # reported by the waiting thread
            outcome["error"] = exc

    thread = threading.Thread(target=ask, name="distfact-scheduler-probe", daemon=True)
    thread.start()
    thread.join(bound + 1)
    error = outcome.get("error")
    hint = (" (over TLS: do the scheduler and this client use certificates of the same authority?)"
            if scheme == "tls" else "")
    if thread.is_alive() or isinstance(error, (asyncio.TimeoutError, TimeoutError)):
        raise ValueError(f"cannot reach a Dask scheduler at {address!r} within {bound:g} s (no answer){hint}; is it "
                         "running, reachable from here, and a Dask scheduler (not another server)?")
    if isinstance(error, OSError):
        raise ValueError(f"cannot reach a Dask scheduler at {address!r} ({error.strerror or error}){hint}; is it "
                         "running and reachable from here?")
    if error is not None:  # a server speaking another protocol: a garbled frame
        raise ValueError(f"the server at {address!r} is not a Dask scheduler (its answer could not be read: "
                         f"{type(error).__name__})")
    answer = outcome["answer"]
    if not isinstance(answer, dict) or answer.get("type") != "Scheduler":
        raise ValueError(f"the server at {address!r} is not a Dask scheduler (it answered {str(answer)[:80]!r})")


def connect(scheduler: str, tls_dir=None):
    """A ``distributed.Client`` for a scheduler address or a scheduler file (``*.json``), over TLS with the
    certificates in ``tls_dir`` (else with the Dask configuration's ``distributed.comm.tls`` settings, if any).
    An unreachable scheduler, a server that is no Dask scheduler, a missing or invalid scheduler file, or a TLS
    scheduler without certificates is a ``ValueError`` saying so within about ``timeout("connect")`` seconds, never a
    hang."""
    import dask
    from distributed import Client
    from distributed.security import Security

    from .tls import security_from_dir

    if scheduler.endswith(".json"):
        address = scheduler_file_address(scheduler)
        kwargs = {"scheduler_file": scheduler}
    else:
        kwargs, address = {"address": scheduler}, scheduler
    security = None if tls_dir is None else security_from_dir(tls_dir)
    configured = dask.config.get("distributed.comm.tls.ca-file", None)
    if security is not None and not address.startswith("tls://"):
        raise ValueError(f"the scheduler at {address!r} does not speak TLS, but certificates were given "
                         f"({os.fspath(tls_dir)!r}); start it with TLS (cluster/start-local.sh --tls) or drop them")
    if address.startswith("tls://") and security is None and not configured:
        raise ValueError(f"the scheduler at {address!r} speaks TLS: give its certificate directory (--tls-dir DIR, "
                         "or tls_dir in a pipeline's [cluster]) or set distributed.comm.tls in the Dask configuration")
    probe_scheduler(address, security if security is not None else (Security() if configured else None))
    bound = timeout("connect")
    try:
        return Client(**kwargs, timeout=f"{bound}s", security=security)
    except (OSError, TimeoutError) as exc:
        raise ValueError(f"cannot reach a Dask scheduler at {scheduler!r} within {bound:g} s ({exc}); "
                         "is it running and reachable from here?") from exc


def worker_facts(store_path: str | None) -> dict:
    """Run on each worker: the distfact version there, and why the store is unreadable there, if it is.
    (Pickled by reference: where distfact is not installed, unpickling this function is what fails.)"""
    from distfact._version import __version__
    from distfact.store.reading import unreadable

    return {"version": __version__, "store_error": None if store_path is None else unreadable(store_path)}


def _ask_each_worker(client, addresses: list, seconds: float, function, *args) -> dict:
    """``function(*args)`` on each worker of ``addresses``, each given ``seconds``: ``{address: result, or the
    exception (a TimeoutError for a worker that did not answer)}``."""
    import asyncio

    async def ask(address):
        try:
            answer = await asyncio.wait_for(client._run(function, *args, workers=[address], on_error="return"),
                                            seconds)
            return answer.get(address, TimeoutError())
        except OSError as exc:  # TimeoutError included
            return exc

    async def ask_all():
        return await asyncio.gather(*(ask(address) for address in addresses))

    return dict(zip(addresses, client.sync(ask_all)))


def check_workers(client, store_path: str | None, n_workers: int = 1) -> None:
    """Before a fit on a cluster: at least one worker (waiting up to ``timeout("first-worker")`` s; for
    ``n_workers`` up to ``timeout("rejoin")`` s more, then going on with those there are); every worker answering a
    trivial request within ``timeout("worker-check")`` s (a frozen or overloaded worker), then importing distfact
    within ``timeout("worker-import")`` s (a first import compiles and loads a lot: it is timed apart from the
    answer), at this process's version, and reading the store at ``store_path``; a ``ValueError`` naming the workers
    and what is wrong otherwise, rather than tasks failing or hanging later. (Workers that join after the check are
    not checked.)"""
    from distfact._version import __version__

    first_worker, rejoin = timeout("first-worker"), timeout("rejoin")
    check, cold_import = timeout("worker-check"), timeout("worker-import")
    try:
        client.wait_for_workers(1, timeout=first_worker)
    except TimeoutError as exc:
        raise ValueError(f"no Dask worker joined the scheduler at {client.scheduler.address} within "
                         f"{first_worker:g} s") from exc
    if n_workers > 1:
        try:
            client.wait_for_workers(n_workers, timeout=rejoin)
        except TimeoutError:
            logger.warning("%d of the %d workers are back after %g s; going on with them",
                           len(client.scheduler_info()["workers"]), n_workers, rejoin)
    # first a builtin (nothing to import on the worker), then distfact's own check, which imports it
    answers = _ask_each_worker(client, list(client.scheduler_info()["workers"]), check, os.getpid)
    responsive = [address for address, answer in answers.items() if not isinstance(answer, BaseException)]
    facts = {**answers, **_ask_each_worker(client, responsive, cold_import, worker_facts, store_path)}
    current = client.scheduler_info()["workers"]  # a worker that left meanwhile (lost, restarting) is no concern
    names = {address: info.get("name") for address, info in current.items()}
    problems = []
    for address, fact in sorted(facts.items()):
        if address not in current:
            continue
        worker = f"{names.get(address)} ({address})" if names.get(address) not in (None, address) else address
        if isinstance(fact, TimeoutError):
            problems.append(f"{worker}: did not answer within {check:g} s (frozen or overloaded?)"
                            if address not in responsive else
                            f"{worker}: answers, but did not import distfact within {cold_import:g} s")
        elif isinstance(fact, BaseException):
            missing = "No module named 'distfact" in str(fact)
            problems.append(f"{worker}: cannot run distfact ({fact})" + (
                f"; install distfact {__version__} there (cluster/Dockerfile does)" if missing else ""))
        elif fact["version"] != __version__:
            problems.append(f"{worker}: runs distfact {fact['version']}, this process {__version__}; install the "
                            "same version on the workers")
        elif fact["store_error"] is not None:
            problems.append(f"{worker}: cannot read the store {store_path!r} ({fact['store_error']}); the store "
                            "must be on a file system every worker mounts at the same path")
    if problems:
        raise ValueError("the Dask workers cannot run this fit:\n  " + "\n  ".join(problems))

