"""Pausing Python's cyclic garbage collector while a long compile runs.

A large compile allocates structures that survive every collection (expression trees, rule automata, the
compiler's tables), so each automatic full collection during it walks all of them again, and the larger the
process already is, the longer each takes (cityjson, 3,959 rules, spends about a third of its compile in full
collections in a process that has compiled 1,200 schemas before it). Pausing every compile would make small ones
slower (their collection moves to the first mask, their garbage lives longer), so only a compile that has already
run :data:`PAUSE_AFTER` seconds pauses (see :func:`~constrain.automata.limits.deadline`). Reference
counting still frees whatever a compile drops; cycles it leaves are collected once no pause is under way.
"""

from __future__ import annotations

import gc
import threading

#: CPU seconds a compile runs before it pauses the collector (2.5% of the MaskBench dev set compile longer).
PAUSE_AFTER = 0.1
#: Objects allocated during a pause past which its end collects the two younger generations at once: a large
#: compile's survivors then move to the oldest generation in one pass, during the compile, instead of in a
#: young-generation pass in the first mask and a middle-generation pass in some later one.
LARGE_PAUSE = 100_000

_lock = threading.Lock()
_pauses = 0  # pauses under way, in every thread
_disabled = False  # whether this module disabled the collector (one the process disabled stays disabled)


def pause() -> None:
    """Turn automatic collection off until every :func:`pause` has had its :func:`resume`."""
    global _pauses, _disabled
    with _lock:
        if _pauses == 0 and gc.isenabled():
            gc.disable()
            _disabled = True
        _pauses += 1


def resume() -> None:
    global _pauses, _disabled
    with _lock:
        _pauses -= 1
        if _pauses == 0 and _disabled:
            _disabled = False
            if gc.get_count()[0] > LARGE_PAUSE:
                gc.collect(1)
            gc.enable()
