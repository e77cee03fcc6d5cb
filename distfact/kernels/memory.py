"""Arrays at a 64-byte boundary, so that BLAS takes the same code path wherever a block runs.

BLAS kernels take alignment-dependent code paths whose rounding differs; numpy's large
arrays start 16 bytes into a page, and arrays that arrive by pickling (on workers, or
statistics coming back) sit at arbitrary offsets. Aligning every input of a block task and
of the global step makes a result independent of where it ran. Dense blocks of X are
aligned once, where they are read or staged (``store/reading.py``, ``store/ingest.py``), so that the passes
never copy them.

Small fits align tens of arrays per iteration (issue 19): an aligned array costs a look at its address, and
the small arrays of one container (a block's statistics, a global state) that need copying share one aligned
allocation, each of them at a 64-byte boundary in it. The engine keeps those allocations (:class:`ReusedBuffers`)
and copies the next iteration's arrays into them once nothing refers to the earlier ones; one check over an
allocation (:func:`aligned_holding`) covers all its arrays. Arrays made here are known without a look at their
address (numpy builds ``__array_interface__`` in Python), and a small array found in a container that was not made
here is copied without that look. A container of the layout the same kept allocations saw last (a fit's global
state, a pass's outputs: the same every iteration) is copied by that layout, without the generic walk
(:class:`_Layout`).

Better still, arrays need no copy when numpy allocates them aligned: within :func:`numpy_allocates_aligned` (a fit's
thread, a pass's threads and tasks) numpy allocates through a handler that starts every allocation at a 64-byte
boundary (``numpy_allocator.py``), and an array that owns memory from it is known aligned by its handler's name,
without a look at its address (:func:`_from_aligned_handler`).
"""

from __future__ import annotations

import contextlib
import math
import sys
import weakref

import numpy as np

ALIGNMENT = 64
#: arrays of a container below this size that need a copy share one allocation (larger ones get their own, so
#: that no large array is held alive by a small one, nor all of a pass's large arrays copied at once)
SHARED_BELOW_BYTES = 1 << 16


#: whether :func:`numpy_allocates_aligned` sets numpy's aligned handler (tests compare fits without it)
USE_NUMPY_ALLOCATOR = True
_allocator = None  # (numpy's setter, the handler) once made; False where it cannot be (not Linux, or a check failed)
_handler_name = None  # numpy's get_handler_name, once the handler is made
_aligned_name = None  # the handler's name


@contextlib.contextmanager
def numpy_allocates_aligned():
    """Within: the arrays numpy allocates in this thread start at 64-byte boundaries (``numpy_allocator.py``) and are
    known aligned without a copy; where the handler cannot be made (not Linux with glibc's allocation functions, or
    its check failed), nothing changes and arrays are copied aligned as before. Nests; other threads are not
    affected (numpy keeps the handler in a context variable). Results are the same bits either way."""
    allocator = _made_allocator() if USE_NUMPY_ALLOCATOR else None
    if allocator is None:
        yield
        return
    set_handler, handler = allocator
    previous = set_handler(handler)
    try:
        yield
    finally:
        set_handler(previous)


def _made_allocator():
    """The handler (:func:`numpy_allocator.handler`), made at the first call: the import compiles or loads its
    functions; None where it cannot be made."""
    global _allocator, _handler_name, _aligned_name
    if _allocator is None:
        _allocator = False
        if sys.platform.startswith("linux"):
            try:
                from .numpy_allocator import NAME, get_handler_name, handler

                made = handler()
            except Exception:  # noqa: BLE001 - no glibc allocation functions to link, an older numba: copies remain
                made = None
            if made is not None:
                _handler_name, _aligned_name = get_handler_name, NAME
                _allocator = made
    return _allocator or None


def _from_aligned_handler(array: np.ndarray) -> bool:
    """Whether ``array`` owns memory from the aligned handler and is C-contiguous: then it starts at a 64-byte
    boundary (a view of such memory has no handler of its own: its address decides)."""
    return _handler_name is not None and _handler_name(array) == _aligned_name and array.flags.c_contiguous


def address(array: np.ndarray) -> int:
    """Where ``array``'s data start (``__array_interface__`` is cheaper than ``ctypes.data``)."""
    return array.__array_interface__["data"][0]


# Arrays this module made (aligned by construction) by id, as weak references: an array a pass aligned is
# often aligned again (a pass's arguments, a local factor at its next use), and knowing it costs less than
# its address. The reference, not the id, says it is the same array (ids are reused). Without a lock: a
# concurrent purge may drop an entry, which only means one more look at an address.
_made: dict[int, weakref.ref] = {}
_MADE_PURGE_AT = 4096


def _remember(array: np.ndarray) -> np.ndarray:
    global _made
    if len(_made) >= _MADE_PURGE_AT:
        _made = {key: ref for key, ref in list(_made.items()) if ref() is not None}
    _made[id(array)] = weakref.ref(array)
    return array


def is_aligned(array: np.ndarray) -> bool:
    """C-contiguous, starting at a 64-byte boundary."""
    return _made_here(array, _made) or _from_aligned_handler(array) or _at_aligned_address(array)


def _at_aligned_address(array: np.ndarray) -> bool:
    """C-contiguous at a 64-byte boundary, from its address (``address()`` inlined)."""
    return array.flags.c_contiguous and array.__array_interface__["data"][0] % ALIGNMENT == 0


def empty_aligned(shape, dtype) -> np.ndarray:
    """An uninitialised C-contiguous array whose data start at a 64-byte boundary (remembered as aligned: a kernel's
    output made here is known as such when a pass aligns it)."""
    dtype = np.dtype(dtype)
    shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
    size, itemsize = math.prod(shape), dtype.itemsize
    if itemsize and ALIGNMENT % itemsize == 0:  # a buffer of the dtype itself, cut at an item boundary
        buffer = np.empty(size + ALIGNMENT // itemsize, dtype=dtype)
        skip = (-address(buffer)) % ALIGNMENT
        if skip % itemsize == 0:
            return _remember(buffer[skip // itemsize:skip // itemsize + size].reshape(shape))
    nbytes = size * itemsize
    buffer = np.empty(nbytes + ALIGNMENT, dtype=np.uint8)
    offset = (-address(buffer)) % ALIGNMENT
    return _remember(buffer[offset:offset + nbytes].view(dtype).reshape(shape))


def aligned_copy(array: np.ndarray) -> np.ndarray:
    """A C-contiguous copy of ``array`` at a 64-byte boundary."""
    out = empty_aligned(array.shape, array.dtype)
    out[...] = array
    return out


CONTAINERS = (dict, list, tuple)


def aligned(value, reused: "ReusedBuffers | None" = None):
    """``value`` with every numpy array in it (also inside dicts, lists, tuples) C-contiguous at a
    64-byte boundary: arrays already so are returned as they are, others copied (in a container, also the small
    arrays this module did not make, see :func:`_collect_to_copy`); a container comes back as it is when none of
    its items was copied, else rebuilt around the copies. ``reused``: where the small arrays of a container are
    copied to (:class:`ReusedBuffers`); default: a new allocation."""
    if isinstance(value, np.ndarray):
        return value if is_aligned(value) else aligned_copy(value)
    if not isinstance(value, CONTAINERS):
        return value
    pending: list[np.ndarray] = []
    _collect_to_copy(value, pending)
    if not pending:
        return value
    return _with_copies(value, _copies(pending, reused))


def aligned_holding(value, reused: "ReusedBuffers"):
    """:func:`aligned` ``(value, reused)``, and a list of what together holds every value in the result: each kept
    allocation it was copied into, whole (one flat array whose padding is zero; its arrays one by one when their
    dtypes differ), every array copied alone or not copied, and every other item that is not a container (numbers,
    sparse matrices). So one test over a few items (a finite check) covers a whole pass's small arrays.

    A container of the layout ``reused`` saw last (:class:`_Layout`: a fit's global state, a pass's outputs, every
    iteration) is aligned by that layout, without the generic walk (issue 19)."""
    layout = reused.layout
    if layout is not None:
        done = layout.align(value, reused)
        if done is not None:
            return done
    pending: list[np.ndarray] = []
    holding: list = []
    _collect_to_copy(value, pending, holding)
    if not pending:  # nothing to copy (arrays from the aligned handler): no layout to learn either
        reused.layout = None
        return value, holding
    result = _with_copies(value, _copies(pending, reused, holding))
    reused.layout = _Layout.learn(value, result)
    return result, holding


def _collect_to_copy(container, pending: list, rest: list | None = None) -> None:
    """The arrays in ``container`` that :func:`aligned` copies into ``pending``; with ``rest``, every other item that
    is not a container into it. Copied: an array this module did not make that is small (its address is not looked
    at: numpy builds ``__array_interface__`` in Python, 1-2 µs, more than copying a small array into the container's
    shared allocation) or not aligned (:func:`_array_kept_as_is`, the test :class:`_Layout` repeats)."""
    made, handler_of, aligned_handler = _made, _handler_name, _aligned_name
    for item in container.values() if isinstance(container, dict) else container:
        if isinstance(item, np.ndarray):
            # _from_aligned_handler inlined: a small fit's arrays come from it, six an iteration (issue 19)
            if handler_of is not None and handler_of(item) == aligned_handler and item.flags.c_contiguous:
                if rest is not None:
                    rest.append(item)
            elif not _array_kept_as_is(item, made):
                pending.append(item)
            elif rest is not None:
                rest.append(item)
        elif isinstance(item, CONTAINERS):
            _collect_to_copy(item, pending, rest)
        elif rest is not None:
            rest.append(item)


def _copies(arrays: list, reused: "ReusedBuffers | None" = None, holding: list | None = None) -> dict[int, np.ndarray]:
    """Aligned copies of ``arrays`` by id: the small ones cut from one allocation (``reused``'s, when it has a free
    one for them), the others each in its own. ``holding``: the allocations' contents are appended to it (see
    :func:`aligned_holding`)."""
    out, shared, shared_ids = {}, [], []
    for array in arrays:
        key = id(array)
        if key in out:
            continue
        if array.nbytes < SHARED_BELOW_BYTES and not array.dtype.hasobject:
            shared.append(array)
            shared_ids.append(key)
            out[key] = None
        else:
            out[key] = copy = aligned_copy(array)
            if holding is not None:
                holding.append(copy)
    if shared:
        copies = _SharedCopies(shared) if reused is None else reused.free_copies(shared)
        for array, key, copy in zip(shared, shared_ids, copies.views):
            copy[...] = array
            out[key] = copy
        if holding is not None:
            if copies.whole is None:
                holding.extend(copies.views)
            else:
                holding.append(copies.whole)
    return out


class _SharedCopies:
    """One aligned allocation cut into arrays of the shapes and dtypes of ``arrays`` (not copied yet), each at a
    64-byte boundary in it."""

    def __init__(self, arrays: list):
        spans = [-(-array.nbytes // ALIGNMENT) * ALIGNMENT for array in arrays]
        self.nbytes = sum(spans)
        buffer = empty_aligned(self.nbytes, np.uint8)
        buffer[...] = 0  # the padding between the arrays: zero, so that a sum over the whole allocation is theirs
        views, start = [], 0
        for array, span in zip(arrays, spans):
            views.append(_remember(buffer[start:start + array.nbytes].view(array.dtype).reshape(array.shape)))
            start += span
        self.views = tuple(views)
        self.owner = views[0].base  # the array that owns the memory: every view of it refers to it
        dtypes = {array.dtype for array in arrays}
        #: the whole allocation as one flat array of its arrays' dtype (None when they have several)
        self.whole = buffer.view(arrays[0].dtype) if len(dtypes) == 1 else None
        self._references = 2 + len(self.views) + (self.whole is not None)

    def unused(self) -> bool:
        """Whether nothing outside this object refers to its arrays or to any view of its allocation (a view of one
        of them refers to the allocation): then writing into them changes nothing anyone can see."""
        # references: the attribute and getrefcount's argument, plus one per array and ``whole`` (their base); an
        # array's: the tuple, the loop's name and getrefcount's argument
        if sys.getrefcount(self.owner) != self._references:
            return False
        for view in self.views:
            if sys.getrefcount(view) != 3:
                return False
        return True


class ReusedBuffers:
    """Aligned copies (as :func:`aligned` makes them) whose allocations are kept and reused (issue 19).

    An owner that aligns containers of the same small arrays again and again (a fit's global state after each global
    step, a pass's statistics and new local factors) would otherwise allocate them anew each time. The shared
    allocation of a container's small arrays is kept, keyed by their shapes and dtypes, and a later container of the
    same layout is copied into it once nothing refers to the arrays it holds (reference counts: an array anyone
    still holds, or a view of it, is never overwritten; the arrays handed out are then the same objects again,
    which nobody can tell apart from new ones, as nobody held the old): ``aligned(value, reused)``. Up to ``PER_LAYOUT`` allocations per layout
    (the previous iteration's arrays are typically still held while the next are made), at most ``MAX_BYTES`` each,
    ``MAX_LAYOUTS`` layouts (the oldest dropped first). One owner thread: not to be shared between threads.
    """

    PER_LAYOUT = 3
    MAX_BYTES = 1 << 20
    MAX_LAYOUTS = 16

    def __init__(self):
        self._kept: dict[tuple, list[_SharedCopies]] = {}
        #: how :func:`aligned_holding` aligned the last container given with these buffers (None: not one it can
        #: repeat)
        self.layout: _Layout | None = None

    def free_copies(self, arrays: list, layout: tuple | None = None) -> _SharedCopies:
        """An allocation for ``arrays`` (by shape and dtype: ``layout``, when the caller has it) that nothing uses,
        kept or new."""
        if layout is None:
            layout = tuple([(array.shape, array.dtype) for array in arrays])
        kept = self._kept.get(layout)
        if kept is None:
            kept = self._kept[layout] = []
            if len(self._kept) > self.MAX_LAYOUTS:
                del self._kept[next(iter(self._kept))]
        for copies in kept:
            if copies.unused():
                return copies
        copies = _SharedCopies(arrays)
        if len(kept) < self.PER_LAYOUT and copies.nbytes <= self.MAX_BYTES:
            kept.append(copies)
        return copies


class _Layout:
    """How :func:`aligned_holding` aligned a container (a dict, list or tuple whose items are leaves or flat dicts of
    leaves; a leaf is anything but a container): which leaves it copied (small arrays this module did not make, all
    into one shared allocation) and which it kept as they were. A container of the same layout, whose leaves the
    walk would treat alike, then takes the same copies into the same kept allocations, without the walk (issue 19:
    small fits align their global state and a pass's outputs, of one layout, every iteration)."""

    __slots__ = ("kind", "keys", "slots", "shapes")

    def __init__(self, kind, keys, slots, shapes):
        #: the container's type, its keys (a dict) or length, per item (key, None: a leaf copied or not, or the
        #: inner dict's keys, and which of its leaves were copied), and the copied arrays' (shape, dtype) in order
        self.kind, self.keys, self.slots, self.shapes = kind, keys, slots, shapes

    @classmethod
    def learn(cls, value, result) -> "_Layout | None":
        """The layout of ``value``, as aligned into ``result``; None when it is not one :meth:`align` repeats (deeper
        containers, an array copied into an allocation of its own or twice, nothing copied)."""
        kind = type(value)
        if kind not in CONTAINERS or len(value) != len(result):
            return None
        keys = tuple(value) if kind is dict else len(value)
        slots, copied = [], []
        for key in (keys if kind is dict else range(keys)):
            item, made = value[key], result[key]
            if type(item) is dict:
                inner = tuple(item)
                if type(made) is not dict or tuple(made) != inner:
                    return None
                leaves = [(leaf, made[name]) for name, leaf in item.items()]
                slots.append((key, inner, tuple(new is not leaf for leaf, new in leaves)))
            elif isinstance(item, CONTAINERS):
                return None
            else:
                leaves = [(item, made)]
                slots.append((key, None, made is not item))
            for leaf, new in leaves:
                if new is not leaf:
                    if not isinstance(leaf, np.ndarray) or leaf.nbytes >= SHARED_BELOW_BYTES or leaf.dtype.hasobject:
                        return None
                    copied.append(leaf)
        if not copied or len({id(leaf) for leaf in copied}) != len(copied):
            return None
        return cls(kind, keys, tuple(slots), tuple([(leaf.shape, leaf.dtype) for leaf in copied]))

    def align(self, value, reused: "ReusedBuffers"):
        """:func:`aligned_holding` ``(value, reused)`` when ``value`` has this layout and the walk would copy the
        same leaves (the same test: a small array this module did not make, any other array kept when it is made
        here or large and aligned); None otherwise. (A leaf found twice is copied twice: equal copies.)"""
        kind = type(value)
        if kind is not self.kind:
            return None
        if kind is dict:
            if tuple(value) != self.keys:
                return None
            result = dict(value)
        else:
            if len(value) != self.keys:
                return None
            result = list(value)
        made = _made
        sources, places, holding = [], [], []
        for key, inner, copy in self.slots:
            item = value[key]
            if inner is None:  # a leaf
                target, leaves = result, ((key, item, copy),)
            else:  # a flat dict: its leaves
                if type(item) is not dict or tuple(item) != inner:
                    return None
                target = None
                if True in copy:  # rebuilt where something is copied, else kept as it is
                    target = result[key] = dict(item)
                leaves = zip(inner, item.values(), copy)
            for name, leaf, copy_it in leaves:
                if copy_it:
                    if _not_copied_by_walk(leaf, made):
                        return None
                    sources.append(leaf)
                    places.append((target, name))
                elif _kept_as_is(leaf, made):
                    holding.append(leaf)
                else:
                    return None
        # the same shapes and dtypes as the copies learnt: small arrays, none of object dtype, as the walk copies
        if tuple([(leaf.shape, leaf.dtype) for leaf in sources]) != self.shapes:
            return None
        copies = reused.free_copies(sources, self.shapes)
        for leaf, (target, name), copy in zip(sources, places, copies.views):
            copy[...] = leaf
            target[name] = copy
        holding.extend(copies.views if copies.whole is None else (copies.whole,))
        return (result if kind is dict or kind is list else kind(result)), holding


def _made_here(array: np.ndarray, made: dict) -> bool:
    """Whether this module made ``array`` (its record in ``made``, :data:`_made`, is still that array)."""
    ref = made.get(id(array))
    return ref is not None and ref() is array


def _array_kept_as_is(array: np.ndarray, made: dict) -> bool:
    """Whether :func:`aligned` keeps ``array`` as it is: made here or by the aligned handler, or large and aligned
    (its address is looked at only then)."""
    return (_from_aligned_handler(array) or _made_here(array, made)
            or (array.nbytes >= SHARED_BELOW_BYTES and _at_aligned_address(array)))


def _not_copied_by_walk(leaf, made: dict) -> bool:
    """Whether ``leaf``, to be copied as a small array, is not one :func:`_collect_to_copy` copies: not an array, or
    one this module or the aligned handler made."""
    return not isinstance(leaf, np.ndarray) or _made_here(leaf, made) or _from_aligned_handler(leaf)


def _kept_as_is(leaf, made: dict) -> bool:
    """Whether :func:`_collect_to_copy` keeps ``leaf`` as it is: an array :func:`_array_kept_as_is`, or anything
    but an array or a container."""
    if isinstance(leaf, np.ndarray):
        return _array_kept_as_is(leaf, made)
    return not isinstance(leaf, CONTAINERS)


def _with_copies(container, copies: dict):
    """``container`` with the arrays of ``copies`` replaced; containers rebuilt only where something was."""
    is_dict = isinstance(container, dict)
    changed = None
    for key, item in container.items() if is_dict else enumerate(container):
        if isinstance(item, np.ndarray):
            new = copies.get(id(item))  # a copy, or None: kept as it is
            if new is None:
                continue
        elif isinstance(item, CONTAINERS):
            new = _with_copies(item, copies)
            if new is item:
                continue
        else:
            continue
        if changed is None:
            changed = {}
        changed[key] = new
    if changed is None:
        return container
    if is_dict:
        return {**container, **changed}
    items = list(container)
    for index, new in changed.items():
        items[index] = new
    return items if type(container) is list else type(container)(items)
