"""Large arrays mapped a page at a time, without numpy's request for transparent huge pages.

numpy asks the kernel to back each allocation of 4 MiB or more with transparent huge pages
(``madvise(MADV_HUGEPAGE)``). Where the kernel's THP ``defrag`` setting is ``madvise`` (a common default), the
first write to each 2 MiB page then compacts memory synchronously whenever no free huge page is at hand. A
pushdown's transition table grows while a mask appends a large rule (a counted pattern of thousands of states),
and copying 26 MB into its new 100 MB table took 0.2 to 0.4 s that way, against 10 ms in ordinary pages.

:func:`empty` maps such arrays directly: anonymous memory, zero pages until written, given back to the system when
the array is freed. Smaller arrays come from numpy's allocator as usual.
"""

from __future__ import annotations

import math
import mmap

import numpy as np

#: Arrays of at least this many bytes are mapped here: numpy asks for huge pages from 4 MiB on.
MAPPED_BYTES = 4 << 20


def empty(shape: tuple[int, ...], dtype: np.dtype | type) -> np.ndarray:
    """A writable array of ``shape`` and ``dtype`` whose content is unspecified (zeros, when it is mapped)."""
    dtype = np.dtype(dtype)
    count = math.prod(shape)
    nbytes = count * dtype.itemsize
    if nbytes < MAPPED_BYTES:
        return np.empty(shape, dtype=dtype)
    return np.frombuffer(mmap.mmap(-1, nbytes), dtype=dtype, count=count).reshape(shape)
