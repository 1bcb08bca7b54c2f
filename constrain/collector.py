"""Pausing Python's cyclic garbage collector while a long compile runs.

A large compile allocates structures that survive every collection (expression trees, rule automata, the
compiler's tables), so each automatic full collection during it walks all of them again, and the larger the
process already is, the longer each takes (cityjson, 3,959 rules, spends about a third of its compile in full
collections in a process that has compiled 1,200 schemas before it). Pausing every compile would make small ones
slower (their collection moves to the first mask, their garbage lives longer), so only a compile that has already
run :data:`PAUSE_AFTER` seconds pauses (see :func:`~constrain.automata.limits.deadline`). Reference
counting still frees whatever a compile drops; cycles it leaves are collected once no pause is under way.

A long-lived process can also take what it holds after start-up out of the collector's sight (:func:`freeze`):
the tokenizer's tables, the imported modules and numba's dispatchers are hundreds of thousands of objects that
every full collection would otherwise walk again, for 0.1 s or more each, in whatever mask or compile it lands in.

The end of such a long compile also gives the C heap's free pages back to the system (glibc's ``malloc_trim``):
the automata of a schema that needs hundreds of MiB for a moment are freed when it ends, but glibc keeps the
pages of its heap, so without this one such schema would leave a long-lived process that much larger for good.
"""

from __future__ import annotations

import ctypes
import functools
import gc
import threading
from collections.abc import Callable

#: CPU seconds a compile runs before it pauses the collector (2.5% of the MaskBench dev set compile longer).
PAUSE_AFTER = 0.1
#: Objects allocated during a pause past which its end collects the two younger generations at once: a large
#: compile's survivors then move to the oldest generation in one pass, during the compile, instead of in a
#: young-generation pass in the first mask and a middle-generation pass in some later one.
LARGE_PAUSE = 100_000

_lock = threading.Lock()
_pauses = 0  # pauses under way, in every thread
_disabled = False  # whether this module disabled the collector (one the process disabled stays disabled)
_long = False  # whether a pause under way is a long compile's: when the last one ends, free pages are given back


def pause(*, long: bool = False) -> None:
    """Turn automatic collection off until every :func:`pause` has had its :func:`resume`. ``long``: the pause
    is a compile's that has run :data:`PAUSE_AFTER` already; when the pauses end, the C heap's free pages are given
    back to the system (:func:`release_free_memory`)."""
    global _pauses, _disabled, _long
    with _lock:
        if _pauses == 0 and gc.isenabled():
            gc.disable()
            _disabled = True
        _pauses += 1
        _long = _long or long


def resume() -> None:
    global _pauses, _disabled, _long
    with _lock:
        _pauses -= 1
        release = _pauses == 0 and _long
        if _pauses == 0:
            _long = False
        if _pauses == 0 and _disabled:
            _disabled = False
            if gc.get_count()[0] > LARGE_PAUSE:
                gc.collect(1)
            gc.enable()
    if release:
        release_free_memory()


def freeze() -> None:
    """Collect what start-up left, then move every object still alive to a generation no collection walks
    (:func:`gc.freeze`): a server calls it once its model, vocabulary and :func:`~constrain.warmup` are ready, so a
    full collection later walks only what requests made. Objects frozen are never collected, so only what lives for
    the whole process should be alive when it is called."""
    gc.collect()
    gc.freeze()


def release_free_memory() -> None:
    """Give the free pages of the C heap back to the system, where the C library can (glibc's ``malloc_trim``;
    elsewhere nothing). A few milliseconds for a heap of a GiB, so only after a long compile."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim``, or None where the C library has none (musl, macOS, Windows)."""
    try:
        return ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError, TypeError):
        return None
