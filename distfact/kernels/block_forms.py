"""Forms of a CSR block made from its arrays (its entries by kept column, by band of columns), kept while the block
lives (issue 19); pure numeric, no Dask.

A block the in-process executor holds in memory is the same object in every pass, and its arrays are not written after
ingest: a form made from them in one pass serves every later one. A form is kept for its block (while the block lives,
its three arrays are the same objects and the form's parameter is equal), within ``FORMS_BYTES`` for all forms,
forgotten when the block is collected. A block read anew in every pass (a store larger than memory) is a new object
each time: a form that costs more to make than one pass saves is made at a block's second sight only
(:func:`block_form`'s ``second_sight``), so such blocks never pay for it.
"""

from __future__ import annotations

import threading
import weakref

import numpy as np

#: Bytes of forms kept between passes, in all (about a block's CSR arrays' size each): beyond, a form is made in every
#: pass (``second_sight``: not at all)
FORMS_BYTES = 256 << 20
# (id(A), kind) -> (weak reference to A, A's indptr, indices, data, the parameter, the form or None, its bytes)
_forms: dict = {}
_forms_bytes = 0
_lock = threading.RLock()  # re-entered when a collection the lock's holder set off forgets a block


def block_form(A, kind: str, parameter, make, second_sight: bool = False):
    """A's form of ``kind`` for ``parameter`` (a number, or an array compared by value): the one kept for A, else
    ``make()``'s (a tuple of arrays, or None: nothing is kept), kept if ``FORMS_BYTES`` allows. ``second_sight``: None
    at the first call for A (A is remembered, not its form), the form from the second on; None from then on if it
    cannot be kept."""
    key = (id(A), kind)
    entry = _forms.get(key)
    same = (entry is not None and entry[0]() is A and entry[1] is A.indptr and entry[2] is A.indices
            and entry[3] is A.data and _equal(entry[4], parameter))
    if same and (entry[5] is not None or entry[6] < 0):
        return entry[5]
    if second_sight and not same:
        _keep(A, key, parameter, None, 0)  # seen once
        return None
    form = make()
    if form is not None and not _keep(A, key, parameter, form, sum(array.nbytes for array in form)) and second_sight:
        _keep(A, key, parameter, None, -1)  # no room: not made again for A
        return None
    return form


def _keep(A, key, parameter, form, nbytes: int) -> bool:
    """Keep ``form`` for A (``nbytes`` < 0: a mark that it cannot be kept) unless there is no room for it."""
    global _forms_bytes
    with _lock:
        _forget(key)  # a form of A for another parameter, or of a block that had A's id
        if _forms_bytes + max(nbytes, 0) > FORMS_BYTES:
            return False
        _forms[key] = (weakref.ref(A, lambda _, key=key: _forget(key)), A.indptr, A.indices, A.data,
                       parameter.copy() if isinstance(parameter, np.ndarray) else parameter, form, nbytes)
        _forms_bytes += max(nbytes, 0)
    return True


def _equal(kept, parameter) -> bool:
    if isinstance(parameter, np.ndarray):
        return isinstance(kept, np.ndarray) and np.array_equal(kept, parameter)
    return not isinstance(kept, np.ndarray) and kept == parameter


def _forget(key) -> None:
    global _forms_bytes
    with _lock:
        entry = _forms.pop(key, None)
        if entry is not None:
            _forms_bytes -= max(entry[6], 0)
