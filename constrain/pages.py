"""Large arrays mapped a page at a time, without numpy's request for transparent huge pages, and their pages kept
for the next array once no array uses them.

numpy asks the kernel to back each allocation of 4 MiB or more with transparent huge pages
(``madvise(MADV_HUGEPAGE)``). Where the kernel's THP ``defrag`` setting is ``madvise`` (a common default), the
first write to each 2 MiB page then compacts memory synchronously whenever no free huge page is at hand. A
pushdown's transition table grows while a mask appends a large rule (a counted pattern of thousands of states),
and copying 26 MB into its new 100 MB table took 0.2 to 0.4 s that way, against 10 ms in ordinary pages.

:func:`empty` maps such arrays directly: anonymous memory, zero pages until written. The first write to each
4 KiB page of a fresh mapping is a page fault, which costs 2 to 3 µs on a virtual machine; a mask that appends a
rule of a few dozen states writes tens of pages of a machine's table, and those faults were most of its time. So a
mapping no array uses any longer is kept (up to :data:`KEPT_BYTES` in all) and handed to the next array that
fits in it, its pages already written; a kept mapping is given back to the system once that bound would be
passed. Smaller arrays come from numpy's allocator as usual.
"""

from __future__ import annotations

import math
import mmap
import sys
import threading

import numpy as np

#: Arrays of at least this many bytes are mapped here: a lazily built pushdown's first table (1 MiB) and every
#: larger one.
MAPPED_BYTES = 1 << 20
#: Bytes of mappings kept for reuse once no array uses them (their resident part is what was written, at most
#: this); the free ones past it are given back when the next array is made.
KEPT_BYTES = 32 << 20
#: A kept mapping is handed to an array that needs at least this share of it, so a small table does not hold a
#: large mapping.
_FIT = 4

_lock = threading.Lock()
#: Every mapping handed out or kept. An array made on one holds it (through its base, or the base of the array it
#: views), so one that nothing else references is free.
_mappings: list[mmap.mmap] = []
#: ``sys.getrefcount`` of a free mapping read while iterating over :data:`_mappings`: the list's reference, the
#: loop variable's and the call's argument.
_FREE_REFS = 3


def empty(shape: tuple[int, ...], dtype: np.dtype | type) -> np.ndarray:
    """A writable array of ``shape`` and ``dtype`` whose content is unspecified: zeros in a fresh mapping,
    whatever the last array wrote in a reused one."""
    dtype = np.dtype(dtype)
    count = math.prod(shape)
    nbytes = count * dtype.itemsize
    if nbytes < MAPPED_BYTES:
        return np.empty(shape, dtype=dtype)
    return np.frombuffer(_mapping(nbytes), dtype=dtype, count=count).reshape(shape)


def _mapping(nbytes: int) -> mmap.mmap:
    """A free kept mapping of at least ``nbytes`` (the smallest that fits), or a new one; free mappings past
    :data:`KEPT_BYTES` are closed, the largest first. A mapping larger than that bound is not kept at all: it is
    given back with the last array on it, as a hostile schema's table of hundreds of MiB must be."""
    if nbytes > KEPT_BYTES:
        return mmap.mmap(-1, nbytes)
    with _lock:
        free = [m for m in _mappings if sys.getrefcount(m) <= _FREE_REFS]
        fits = [m for m in free if nbytes <= len(m) <= _FIT * nbytes]
        chosen = min(fits, key=len) if fits else None
        kept = 0
        for m in sorted(free, key=len):
            if m is chosen:
                continue
            if kept + len(m) <= KEPT_BYTES:
                kept += len(m)
            else:
                _mappings.remove(m)
                m.close()
        if chosen is None:
            chosen = mmap.mmap(-1, nbytes)
            _mappings.append(chosen)
        return chosen


def kept_bytes() -> int:
    """Bytes of the mappings kept for reuse that no array uses now."""
    with _lock:
        return sum(len(m) for m in _mappings if sys.getrefcount(m) <= _FREE_REFS)
