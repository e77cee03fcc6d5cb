"""A store as its metadata document describes it, read without zarr: what ``distfact info`` prints, and the first
step of opening a store (:meth:`GroupedMatrix.open <distfact.store.grouped.GroupedMatrix.open>`).

The root ``zarr.json`` is a Zarr v3 group's document whose attribute ``distfact`` is the store's metadata
(``docs/format.md``). It is plain JSON, read here with :mod:`json`: zarr's import alone takes 0.4-0.5 s on the
standard machine, the whole of ``info``'s start-up budget (issue 19). The metadata is checked as every reader checks
it (:meth:`Metadata.from_json <distfact.store.format.Metadata.from_json>`: each field, the document's consistency,
its SHA-256), and every node it lists must be there. No chunk is read: ``info`` describes a store without reading
its arrays (``GroupedMatrix.open`` goes on to read and check the small ones; a fit checks each block it reads).
"""

from __future__ import annotations

import json
import math
import os

from .format import Metadata


def store_path(path) -> tuple[str, str]:
    """The store's absolute path (workers may run elsewhere) and how messages name it; ValueError unless it is a
    directory."""
    path = os.path.abspath(os.path.normpath(os.fspath(path)))
    where = f"store {path!r}"
    if not os.path.isdir(path):
        raise ValueError(f"{where} does not exist (write one with 'distfact ingest')" if not os.path.exists(path)
                         else f"{where} is a file, not a distfact store (a directory written by 'distfact ingest')")
    return path, where


#: the keys of a Zarr v3 group's document (zarr refuses others); distfact writes no consolidated metadata
GROUP_DOCUMENT_KEYS = {"zarr_format", "node_type", "attributes", "consolidated_metadata"}


def root_metadata(path: str, where: str):
    """The ``distfact`` attribute of the store's root ``zarr.json`` (None when the group has none: not a store, or
    an ingest that did not finish); ValueError when that file is not a Zarr v3 group's document as distfact writes
    it (zarr 3 refuses a document with other keys, which a store whose arrays live in later versions would
    otherwise only meet at its next write)."""
    try:
        with open(os.path.join(path, "zarr.json"), "rb") as f:
            document = json.loads(f.read())
    except (OSError, ValueError, RecursionError) as exc:  # missing, unreadable, not UTF-8, not JSON, nested too deep
        raise ValueError(f"{where} is not a readable Zarr group: {exc}") from None
    if (not isinstance(document, dict) or document.get("zarr_format") != 3 or document.get("node_type") != "group"
            or not document.keys() <= GROUP_DOCUMENT_KEYS or document.get("consolidated_metadata") is not None):
        raise ValueError(f"{where} is not a readable Zarr group: its zarr.json is not a Zarr v3 group's document "
                         f"as distfact writes it (keys {sorted(document) if isinstance(document, dict) else '-'})")
    attributes = document.get("attributes", {})
    if not isinstance(attributes, dict):
        raise ValueError(f"{where} is not a readable Zarr group: its attributes are not a JSON object")
    return attributes.get("distfact")


def check_nodes(meta: Metadata, path: str, where: str) -> None:
    """ValueError unless every node the metadata lists is in the store: each row block, each column block, and each
    row block's mask when the store has one (their ``zarr.json``; their arrays are checked as they are read)."""
    nodes = [(f"block {b.index} (key {b.key!r}) is", b.node) for b in meta.blocks]
    nodes += [(f"column block {b.index} (key {b.key!r}) is", b.node) for b in meta.column_blocks]
    if meta.mask is not None:
        nodes += [(f"block {b.index} (key {b.key!r}), its mask is", f"{b.node}/mask") for b in meta.blocks]
    for what, node in nodes:
        if not os.path.isfile(os.path.join(path, node, "zarr.json")):
            raise ValueError(f"{where} is corrupt: {what} missing")


def read_metadata(path, version_metadata: dict | None = None) -> tuple[str, str, Metadata]:
    """(path, where, metadata) of the store at ``path``, checked (the module docstring); ``version_metadata``: the
    metadata document of an earlier version of the store to use instead (see ``GroupedMatrix.open``)."""
    path, where = store_path(path)
    doc = root_metadata(path, where)
    if doc is None:
        raise ValueError(f"{where} has no distfact metadata (not a store, or an ingest that did not finish)")
    if version_metadata is not None:
        doc = version_metadata
        where = f"{where}, version {doc.get('version', 0) if isinstance(doc, dict) else '?'}"
    meta = Metadata.from_json(doc, where)
    check_nodes(meta, path, where)
    return path, where, meta


def summary(meta: Metadata, path: str | None) -> dict:
    """A JSON-able summary of the matrix ``meta`` describes (what ``distfact info`` prints)."""
    block_counts = [0] * len(meta.groups)
    for block in meta.blocks:
        block_counts[block.group] += 1
    return {
        "path": path,
        "shape": list(meta.shape),
        "dtype": meta.dtype,
        "layout": meta.layout,
        "nnz": sum(g.nnz for g in meta.groups),
        "n_blocks": len(meta.blocks),
        "n_column_blocks": len(meta.column_blocks),
        **({"mask": meta.mask} if meta.mask else {}),
        "groups": [{"name": g.name, "rows": g.row_stop - g.row_start, "nnz": g.nnz,
                    "frobenius_norm": math.sqrt(g.sq_norm), "blocks": count}
                   for g, count in zip(meta.groups, block_counts)],
    }


def store_info(path) -> dict:
    """:func:`summary` of the store at ``path`` from its metadata alone (nothing but ``zarr.json`` files read)."""
    path, _, meta = read_metadata(path)
    return summary(meta, path)
