"""Limits on compile work: CPU-time deadlines, automaton size caps, and the memory caches keep between compiles.

Hostile input must be refused rather than built: a compile runs under :func:`time_limited` (every compiler's
``time_limit=``) and its loops call :func:`check_deadline`; automata past :data:`MAX_NFA_STATES`,
:data:`MAX_DFA_STATES`, :data:`MAX_SUBSET_MEMBERS` or :data:`MAX_TABLE_CELLS` raise
:class:`~constrain.errors.AutomatonTooLarge`, and a grammar of more than :data:`MAX_GRAMMAR_RULES` rules a
:class:`~constrain.errors.GrammarError`. Together they bound what one compile builds: a rule's automaton holds at
most :data:`MAX_DFA_STATES` rows of 256 int32 (200 MiB), and its subset construction at most
:data:`MAX_SUBSET_MEMBERS` and :data:`MAX_TABLE_CELLS` int32 besides. What is kept between compiles is bounded in
bytes by the ``*_CACHE_BYTES`` budgets below (864 MiB over all the caches, plus, in each, at most one entry larger
than its whole budget, kept until the next one is put).
"""

from __future__ import annotations

import contextvars
import math
import threading
import time

from numba.core import event as numba_events

from constrain import collector
from constrain.errors import ArgumentError, CompileTimeout

#: Hostile-input guards: an automaton past these sizes is refused rather than built. A grammar's repetition
#: (:class:`~constrain.grammar.ir.Repeat`) or a ``maxLength`` whose copies could not fit is refused before any is
#: built.
MAX_NFA_STATES = 2_000_000
MAX_DFA_STATES = 200_000
#: NFA states the subset construction may keep in all its subsets together (int32 each, so 256 MiB): an NFA
#: whose every DFA state stands for thousands of NFA states (an object of thousands of optional properties, nested
#: counted repetitions) is refused at this bound rather than when it has used gigabytes.
MAX_SUBSET_MEMBERS = 1 << 26
#: Cells of the subset construction's transition table (DFA states x (byte classes + rules called), int32 each,
#: so 256 MiB): a rule that calls thousands of others (an ``anyOf`` of thousands of objects read in place) is
#: refused at this bound rather than when its table has taken gigabytes and seconds beyond its time limit.
MAX_TABLE_CELLS = 1 << 26
#: Rules one grammar may have (Lark, GBNF, JSON Schema, a :class:`~constrain.grammar.ir.Grammar`).
MAX_GRAMMAR_RULES = 50_000

#: CPU seconds a compile may take before it is refused: the default ``time_limit`` of :func:`constrain.compile`
#: and of every compiler.
DEFAULT_TIME_LIMIT = 5.0

#: Bytes each per-process cache of automata may keep: regexes by pattern
#: (:func:`~constrain.automata.regex.regex_to_dfa`), grammar terminals by pattern
#: (:func:`~constrain.grammar.rules.terminal_dfa`), and the JSON Schema compiler's string languages, string
#: automata, counted strings and key automata by constraint (seven caches).
AUTOMATON_CACHE_BYTES = 64 << 20
#: Bytes of rule automata kept by rule body, shared by every grammar built in the process.
RULE_CACHE_BYTES = 128 << 20
#: Bytes each small per-process memo may keep: the UTF-8 byte paths of character classes, the digit patterns of
#: fraction bounds.
PIECE_CACHE_BYTES = 16 << 20
#: Bytes of compiled structures :func:`constrain.compile` keeps (their automata; each structure's mask cache
#: is bounded by its own ``cache_bytes`` besides).
COMPILE_CACHE_BYTES = 256 << 20


class _Deadline:
    """A time limit in force: when it runs out (a :func:`compile_clock` value, infinite for none), when the block
    started, whether it paused the garbage collector, and the wall-clock time before which the CPU clock is not
    read again.

    A thread's CPU time grows no faster than the wall clock, so until as much wall-clock time has passed as the
    limit (or the collector's pause) allows, neither can have been reached, and the CPU clock is not read at all:
    reading it is a system call that takes a microsecond on a quiet machine and tens of microseconds, sometimes
    milliseconds, on a loaded virtual one, and a compile looks at its limit hundreds of times."""

    __slots__ = ("at", "started", "paused", "next_look")

    def __init__(self, at: float, started: float):
        self.at = at
        self.started = started
        self.paused = False
        self.next_look = time.perf_counter() + min(collector.PAUSE_AFTER, at - started)

    def look(self, now: float) -> None:
        """Read the CPU clock (``now``: the wall clock): pause the collector or raise when due, and set when to
        look again: once as much wall-clock time has passed as the CPU time left before either, and not sooner
        than :data:`_LOOK_EVERY` from now."""
        clock = compile_clock()
        if not self.paused and clock - self.started > collector.PAUSE_AFTER:
            collector.pause(long=True)
            self.paused = True
        if clock > self.at:
            raise CompileTimeout("building the automata ran past the time limit")
        left = self.at - clock
        if not self.paused:
            left = min(left, collector.PAUSE_AFTER - (clock - self.started))
        self.next_look = now + max(left, _LOOK_EVERY)


#: Least wall-clock time between two reads of the CPU clock near a limit: it may be noticed this much late.
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


def deadline(at: float | None, *, started: float | None = None) -> _DeadlineBlock:
    """Within the block, automaton construction raises :class:`CompileTimeout` once :func:`compile_clock`
    passes ``at`` (None: no limit). CPU time, so a loaded machine does not change the outcome; the guard against
    hostile inputs that no size limit catches. A block that runs longer than
    :data:`~constrain.collector.PAUSE_AFTER` pauses the garbage collector until it ends (see
    :mod:`constrain.collector`). ``started``: :func:`compile_clock` now, when the caller has just read it."""
    return _DeadlineBlock(at, started)


class _DeadlineBlock:
    """The context manager :func:`deadline` returns (a class rather than a generator: every compile enters one)."""

    __slots__ = ("_at", "_started", "_limit", "_token")

    def __init__(self, at: float | None, started: float | None):
        self._at, self._started = at, started

    def __enter__(self) -> None:
        started = compile_clock() if self._started is None else self._started
        self._limit = _Deadline(math.inf if self._at is None else self._at, started)
        self._token = _DEADLINE.set(self._limit)

    def __exit__(self, *exc: object) -> None:
        _DEADLINE.reset(self._token)
        if self._limit.paused:
            collector.resume()


def time_limited(seconds: float | None, what: str) -> _TimeLimit:
    """The block runs under a limit of ``seconds`` of :func:`compile_clock` from now (None: none of its own),
    and within any limit already in force: what every compiler's ``time_limit=`` means, so a compiler called by
    another (choices by way of a regex, a Pydantic type by way of its JSON Schema) keeps its caller's limit. When
    this limit is the one that runs out, the :class:`CompileTimeout` says that ``what`` did not compile within
    it."""
    if seconds is not None and (isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not seconds >= 0):
        raise ArgumentError("time_limit", seconds, "seconds of CPU time (a number, 0 or more), or None for no limit")
    return _TimeLimit(seconds, what)


class _TimeLimit:
    """The context manager :func:`time_limited` returns."""

    __slots__ = ("_seconds", "_what", "_block")

    def __init__(self, seconds: float | None, what: str):
        self._seconds, self._what, self._block = seconds, what, None

    def __enter__(self) -> None:
        seconds = self._seconds
        outer = _DEADLINE.get()
        # The caller's limit comes first when it ends no later than this one: it reports its own. The clock has
        # moved on since the caller's limit started, so one that ends within ``seconds`` of its start needs no
        # reading.
        if outer is not None and (seconds is None or outer.at <= outer.started + seconds):
            return
        now = None if seconds is None else compile_clock()
        at = math.inf if now is None else now + seconds
        if outer is not None and outer.at <= at:
            return
        self._block = _DeadlineBlock(None if seconds is None else at, now)
        self._block.__enter__()

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        block, self._block = self._block, None
        if block is None:
            return
        block.__exit__(kind, exc, tb)
        if isinstance(exc, CompileTimeout) and self._seconds is not None:  # else an inner limit ran out: it said so
            where = f" (at rule {exc.rule!r})" if exc.rule else ""
            limit = f"time_limit={self._seconds:g} s{where}"
            message = f"{self._what} did not compile within {limit} (None lifts the limit)"
            raise CompileTimeout(message, rule=exc.rule) from exc


def seconds_allowed() -> float | None:
    """The seconds the time limit in force allows from its start (None when there is none): what a piece of work
    deferred past the block (a rule built when a matcher first reaches it) may take on its own."""
    limit = _DEADLINE.get()
    if limit is None or math.isinf(limit.at):
        return None
    return limit.at - limit.started


def check_deadline() -> None:
    """Raise :class:`CompileTimeout` when the time limit in force has run out."""
    limit = _DEADLINE.get()
    if limit is None:
        return
    now = time.perf_counter()
    if now >= limit.next_look:
        limit.look(now)
