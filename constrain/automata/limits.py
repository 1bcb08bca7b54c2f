"""Limits on compile work: CPU-time deadlines and automaton size caps.

Hostile input must be refused rather than built: a compile runs inside :func:`deadline` and its loops call
:func:`check_deadline`; automata past :data:`MAX_NFA_STATES` or :data:`MAX_DFA_STATES` raise
:class:`AutomatonTooLarge`.
"""

from __future__ import annotations

import contextvars
import math
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from numba.core import event as numba_events

from constrain import collector
from constrain.errors import CompileTimeout

#: Hostile-input guards: an automaton past these sizes is refused rather than built.
MAX_NFA_STATES = 2_000_000
MAX_DFA_STATES = 200_000


class _Deadline:
    """A time limit in force: when it runs out (a :func:`compile_clock` value, infinite for none), when the block
    started, whether it paused the garbage collector, and the wall-clock time before which the CPU clock is not
    read again. Reading the CPU clock is a system call of about a microsecond, and the limit is looked at hundreds
    of times in a small compile."""

    __slots__ = ("at", "started", "paused", "next_look")

    def __init__(self, at: float, started: float):
        self.at = at
        self.started = started
        self.paused = False
        self.next_look = 0.0


#: How long (wall-clock seconds) a look at the time limit holds: it may be noticed this much late.
_LOOK_EVERY = 0.001

_DEADLINE: contextvars.ContextVar[_Deadline | None] = contextvars.ContextVar("constrain_deadline", default=None)


class _KernelCompileTime(numba_events.Listener):
    """The CPU seconds each thread spends holding numba's compiler lock: compiling kernels (the first run on a
    machine, a few seconds) or loading them from the cache (the first use in a process). The lock is re-entrant,
    so only the outermost hold of each thread counts."""

    def __init__(self) -> None:
        self._local = threading.local()

    def on_start(self, event) -> None:
        depth = getattr(self._local, "depth", 0)
        self._local.depth = depth + 1
        if depth == 0:
            self._local.started = time.thread_time()

    def on_end(self, event) -> None:
        self._local.depth -= 1
        if self._local.depth == 0:
            self._local.seconds = self.seconds() + time.thread_time() - self._local.started

    def seconds(self) -> float:
        """This thread's seconds so far."""
        return getattr(self._local, "seconds", 0.0)


_KERNEL_COMPILES = _KernelCompileTime()
numba_events.register("numba:compiler_lock", _KERNEL_COMPILES)


def compile_clock() -> float:
    """The calling thread's CPU seconds, less those it spent compiling or loading numba kernels: the clock compile
    time limits read. CPU time, so a loaded machine does not change the outcome; the thread's own, so compiles
    running in other threads at the same time do not count against it; and a first compile on a fresh machine is
    not refused for the kernels' one-off cost."""
    return time.thread_time() - _KERNEL_COMPILES.seconds()


@contextmanager
def deadline(at: float | None) -> Iterator[None]:
    """Within the block, automaton construction raises :class:`CompileTimeout` once :func:`compile_clock`
    passes ``at`` (None: no limit). CPU time, so a loaded machine does not change the outcome; the guard against
    hostile inputs that no size limit catches. A block that runs longer than
    :data:`~constrain.collector.PAUSE_AFTER` pauses the garbage collector until it ends (see
    :mod:`constrain.collector`)."""
    limit = _Deadline(math.inf if at is None else at, compile_clock())
    token = _DEADLINE.set(limit)
    try:
        yield
    finally:
        _DEADLINE.reset(token)
        if limit.paused:
            collector.resume()


def check_deadline() -> None:
    limit = _DEADLINE.get()
    if limit is None:
        return
    now = time.perf_counter()
    if now < limit.next_look:
        return
    limit.next_look = now + _LOOK_EVERY
    clock = compile_clock()
    if not limit.paused and clock - limit.started > collector.PAUSE_AFTER:
        collector.pause()
        limit.paused = True
    if clock > limit.at:
        raise CompileTimeout("building the automata ran past the time limit")
