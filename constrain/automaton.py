"""Byte-level automata: an NFA builder, subset construction, trimming and minimisation.

Structures are compiled to automata over *bytes*, not characters, because tokens are byte strings: a token
can end in the middle of a UTF-8 character. Character sets are expanded to UTF-8 byte-range sequences here.

Two zero-width markers model the anchors ``^`` and ``$`` exactly: an edge labelled ``BEGIN`` may only be taken
before any byte is read, an edge labelled ``END`` only after the last one. The subset construction folds them
into the start state and into acceptance, so the resulting :class:`ByteDFA` has byte edges only.
"""

from __future__ import annotations

import contextvars
import hashlib
import math
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cached_property, lru_cache
from itertools import chain

import numpy as np
from numba import njit
from numba.core import event as numba_events

from . import collector
from .errors import StructureError

MAX_CODE_POINT = 0x10FFFF
SURROGATES = (0xD800, 0xDFFF)

#: Marker labels (outside the byte range 0-255) for the anchors.
BEGIN = 256
END = 257

DEAD = -1

#: Hostile-input guards: an automaton past these sizes is refused rather than built.
MAX_NFA_STATES = 2_000_000
MAX_DFA_STATES = 200_000


class CompileTimeout(StructureError):
    """Building a structure's automata ran past the time limit its caller set (see :func:`deadline`)."""


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
    """The CPU seconds spent holding numba's compiler lock: compiling kernels (the first run on a machine, a few
    seconds) or loading them from the cache (the first use in a process). The lock is re-entrant, so only the
    outermost hold of each thread counts."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._local = threading.local()

    def on_start(self, event) -> None:
        depth = getattr(self._local, "depth", 0)
        self._local.depth = depth + 1
        if depth == 0:
            self._local.started = time.process_time()

    def on_end(self, event) -> None:
        self._local.depth -= 1
        if self._local.depth == 0:
            self.seconds += time.process_time() - self._local.started


_KERNEL_COMPILES = _KernelCompileTime()
numba_events.register("numba:compiler_lock", _KERNEL_COMPILES)


def compile_clock() -> float:
    """This process's CPU seconds, less those spent compiling or loading numba kernels: the clock compile time
    limits read, so a first compile on a fresh machine is not refused for the kernels' one-off cost."""
    return time.process_time() - _KERNEL_COMPILES.seconds


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


class AutomatonTooLarge(StructureError):
    """The structure needs more automaton states than the configured limit."""


# --------------------------------------------------------------------------------------------------------------
# UTF-8 encoding of code-point ranges


_UTF8_LENGTH_BOUNDS = ((0, 0x7F), (0x80, 0x7FF), (0x800, 0xFFFF), (0x10000, MAX_CODE_POINT))


def _encode(cp: int, length: int) -> list[int]:
    if length == 1:
        return [cp]
    out = []
    for _ in range(length - 1):
        out.append(0x80 | (cp & 0x3F))
        cp >>= 6
    lead = {2: 0xC0, 3: 0xE0, 4: 0xF0}[length]
    out.append(lead | cp)
    return out[::-1]


def _split_same_length(lo: int, hi: int, length: int) -> list[list[tuple[int, int]]]:
    """Byte-range sequences for [lo, hi], all of whose code points encode to ``length`` bytes."""
    if length == 1:
        return [[(lo, hi)]]
    # Split until each range is "rectangular": every byte position varies over a full sub-range.
    for i in range(1, length):
        mask = (1 << (6 * i)) - 1
        if lo & ~mask != hi & ~mask:
            if lo & mask != 0:
                return _split_same_length(lo, lo | mask, length) + _split_same_length((lo | mask) + 1, hi, length)
            if hi & mask != mask:
                return _split_same_length(lo, (hi & ~mask) - 1, length) + _split_same_length(hi & ~mask, hi, length)
    a, b = _encode(lo, length), _encode(hi, length)
    return [list(zip(a, b))]


def utf8_sequences(lo: int, hi: int) -> list[list[tuple[int, int]]]:
    """Sequences of inclusive byte ranges whose concatenations encode exactly the code points in [lo, hi].

    Surrogates (U+D800-U+DFFF) have no UTF-8 encoding and are left out.
    """
    sequences: list[list[tuple[int, int]]] = []
    pieces = [(lo, hi)]
    if lo <= SURROGATES[1] and hi >= SURROGATES[0]:
        pieces = [(lo, SURROGATES[0] - 1), (SURROGATES[1] + 1, hi)]
    for a, b in pieces:
        if a > b:
            continue
        for length, (blo, bhi) in enumerate(_UTF8_LENGTH_BOUNDS, start=1):
            x, y = max(a, blo), min(b, bhi)
            if x <= y:
                sequences.extend(_split_same_length(x, y, length))
    return sequences


@lru_cache(maxsize=4096)
def _utf8_paths(ranges: tuple[tuple[int, int], ...]) -> tuple[int, list[tuple[int, int, int, int]]]:
    """The byte paths that read one code point of ``ranges``, as ``(number of inner states, edges)``; an edge is
    ``(from, first byte, last byte, to)`` with -1 for the outer source and target, inner states numbered from 0.
    Sequences that share a leading byte range share their first inner state, so large classes stay small. Cached:
    the same classes recur in every pattern."""
    prefix_states: dict[tuple[tuple[int, int], ...], int] = {(): -1}
    edges = []
    for lo, hi in ranges:
        for seq in utf8_sequences(lo, hi):
            state = -1
            for depth in range(len(seq) - 1):
                key = tuple(seq[: depth + 1])
                nxt = prefix_states.get(key)
                if nxt is None:
                    nxt = prefix_states[key] = len(prefix_states) - 1
                    edges.append((state, seq[depth][0], seq[depth][1], nxt))
                state = nxt
            edges.append((state, seq[-1][0], seq[-1][1], -1))
    return len(prefix_states) - 1, edges


def code_point_ranges(code_points: Iterable[int]) -> list[tuple[int, int]]:
    """Sorted, merged inclusive ranges covering the given code points."""
    ranges: list[tuple[int, int]] = []
    for cp in sorted(set(code_points)):
        if ranges and ranges[-1][1] + 1 == cp:
            ranges[-1] = (ranges[-1][0], cp)
        else:
            ranges.append((cp, cp))
    return ranges


def complement_ranges(ranges: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """All code points not in ``ranges`` (which must be sorted and disjoint)."""
    out = []
    nxt = 0
    for lo, hi in ranges:
        if lo > nxt:
            out.append((nxt, lo - 1))
        nxt = hi + 1
    if nxt <= MAX_CODE_POINT:
        out.append((nxt, MAX_CODE_POINT))
    return out


# --------------------------------------------------------------------------------------------------------------
# NFA


class ByteNFA:
    """A Thompson-style NFA under construction: byte-range edges, epsilon edges, anchor-marker edges and calls.

    Edges are kept in flat lists of ints rather than per-state lists: building is a Python loop over a
    structure, so a state costs a counter and an edge one list extension, and the subset construction (a compiled
    kernel) reads them as arrays.
    """

    __slots__ = ("size", "_bytes", "_epsilon", "_markers", "_calls")

    def __init__(self) -> None:
        self.size = 0
        self._bytes: list[int] = []  # src, lo, hi, dst per edge
        self._epsilon: list[int] = []  # src, dst
        self._markers: list[int] = []  # src, marker, dst
        self._calls: list[int] = []  # src, rule, dst

    def new_state(self) -> int:
        if self.size >= MAX_NFA_STATES:
            raise AutomatonTooLarge(f"the automaton needs more than {MAX_NFA_STATES:,} NFA states")
        if self.size % 4096 == 0:
            check_deadline()
        self.size += 1
        return self.size - 1

    def add_epsilon(self, src: int, dst: int) -> None:
        self._epsilon += (src, dst)

    def add_marker(self, src: int, marker: int, dst: int) -> None:
        self._markers += (src, marker, dst)

    def add_bytes(self, src: int, lo: int, hi: int, dst: int) -> None:
        self._bytes += (src, lo, hi, dst)

    def add_literal(self, src: int, data: bytes, dst: int) -> None:
        """A path from ``src`` to ``dst`` reading exactly ``data`` (not empty), its inner states made at once."""
        if self.size + len(data) - 1 > MAX_NFA_STATES:
            raise AutomatonTooLarge(f"the automaton needs more than {MAX_NFA_STATES:,} NFA states")
        if len(data) == 1:
            self._bytes += (src, data[0], data[0], dst)
            return
        inner = range(self.size, self.size + len(data) - 1)  # the states between two bytes
        self.size += len(data) - 1
        # rows (tail, byte, byte, head), flattened without a Python-level loop: keys and punctuation are most of
        # what a JSON schema's rules read
        self._bytes += chain.from_iterable(zip(chain((src,), inner), data, data, chain(inner, (dst,))))

    def add_call(self, src: int, rule: int, dst: int) -> None:
        """An edge that reads one whole match of grammar rule ``rule`` (a pushdown call)."""
        self._calls += (src, rule, dst)

    def add_dfa(self, dfa: ByteDFA, src: int, dst: int) -> None:
        """A copy of a call-free DFA between ``src`` and ``dst``: its start follows ``src``, its accepting states
        lead to ``dst``. How a regex parsed and determinised once is spliced wherever it appears."""
        if self.size + dfa.num_states > MAX_NFA_STATES:
            raise AutomatonTooLarge(f"the automaton needs more than {MAX_NFA_STATES:,} NFA states")
        base = self.size
        self.size += dfa.num_states
        self._bytes += (dfa.edge_list + np.array([base, 0, 0, base], dtype=np.int32)).ravel().tolist()
        self._epsilon += (src, base)
        for final in np.flatnonzero(dfa.accepting).tolist():
            self._epsilon += (base + final, dst)

    def add_code_points(self, src: int, ranges: Sequence[tuple[int, int]], dst: int) -> None:
        """Edges from ``src`` to ``dst`` reading exactly one UTF-8 encoded code point from ``ranges``.

        Byte-range sequences that share a leading range share their first intermediate state, so large
        classes stay small.
        """
        if len(ranges) == 1 and ranges[0][1] < 0x80:
            self.add_bytes(src, ranges[0][0], ranges[0][1], dst)
            return
        num_inner, edges = _utf8_paths(tuple(ranges))
        if self.size + num_inner > MAX_NFA_STATES:
            raise AutomatonTooLarge(f"the automaton needs more than {MAX_NFA_STATES:,} NFA states")
        base = self.size
        self.size += num_inner
        for a, lo, hi, b in edges:
            self._bytes += (src if a < 0 else base + a, lo, hi, dst if b < 0 else base + b)

    def determinize(self, start: int, accept: int, *, work_per_slice: int | None = None) -> ByteDFA:
        """Subset construction to a trimmed, minimised :class:`ByteDFA`.

        ``BEGIN`` markers are followed from the start only; a subset accepts when one of its states reaches
        ``accept`` through epsilons and ``END`` markers. Subsets keep only the states that read something or
        accept, so equivalent subsets meet. One kernel call does it all when one slice of work finishes the
        subset construction (almost every rule); a larger automaton is built again in slices, with the time limit
        checked in between. ``work_per_slice`` (states visited) defaults to a few milliseconds' worth."""
        work_per_slice = _WORK_PER_SLICE if work_per_slice is None else work_per_slice
        n = self.size
        begin = end = _NO_PAIRS
        if self._markers:
            markers = np.array(self._markers, dtype=np.int32).reshape(-1, 3)
            begin = np.ascontiguousarray(markers[markers[:, 1] == BEGIN][:, [0, 2]])
            end = np.ascontiguousarray(markers[markers[:, 1] == END][:, [0, 2]])
        byte_flat = np.array(self._bytes, dtype=np.int32)
        eps_flat = np.array(self._epsilon, dtype=np.int32)
        call_flat = np.array(self._calls, dtype=np.int32)
        check_deadline()
        status, finished, trans, accepting, calls, used = _determinize_in_one_slice(
            byte_flat, eps_flat, call_flat, begin, end, n, start, accept, work_per_slice, MAX_DFA_STATES
        )
        if not finished and not status:  # a large automaton: again, in slices with the time limit between them
            nfa = _index_nfa(byte_flat, eps_flat, call_flat, begin, end, n, accept)
            byte_class, num_classes, num_rules = nfa[-3:]
            work = _new_work(64, num_classes, num_rules)
            done, count = 0, 0
            while not status:
                check_deadline()
                work, done, count, status = _subset_construction(
                    start, *nfa[:-3], work, done, count, work_per_slice, MAX_DFA_STATES
                )
                if done == count:
                    break
            if not status:
                trans, accepting, calls, used = _reduced_subsets(work[3], work[4], work[5], count, byte_class)
        if status:
            raise AutomatonTooLarge(f"the automaton needs more than {MAX_DFA_STATES:,} DFA states")
        return ByteDFA(trans, accepting, calls, tuple(used.tolist()))


def compile_kernels() -> None:
    """Compile now (or load from numba's on-disk cache) the determinisation kernels, those only an automaton
    larger than one slice of work reaches included. Otherwise the first such automaton on a machine (a long
    pattern, a large schema) pays their compilation, tens of seconds, in the middle of a compile. The set-up
    script calls this once per machine; a server may call it at start-up."""
    nfa = ByteNFA()
    start, accept = nfa.new_state(), nfa.new_state()
    nfa.add_literal(start, b"ab", accept)
    nfa.add_call(start, 0, accept)
    nfa.determinize(start, accept)
    nfa.determinize(start, accept, work_per_slice=1)  # the sliced path


@njit(cache=True)
def _determinize_in_one_slice(byte_flat, eps_flat, call_flat, begin, end, n, start, accept, slice_work, max_states):
    """The whole of :meth:`ByteNFA.determinize` in one kernel call when the subset construction finishes within
    one slice of work, as it does for almost every rule (each kernel call costs microseconds of dispatch, which
    for a small rule is most of its cost): ``(status, finished, trans, accepting, calls, used)``, the arrays
    empty when it did not finish."""
    nfa = _index_nfa(byte_flat, eps_flat, call_flat, begin, end, n, accept)
    work = _new_work(16, nfa[11], nfa[12])
    work, done, count, status = _subset_construction(
        start, nfa[0], nfa[1], nfa[2], nfa[3], nfa[4], nfa[5], nfa[6], nfa[7], nfa[8], nfa[9],
        work, 0, 0, slice_work, max_states,
    )  # fmt: skip
    if status or done != count:
        empty = np.empty((0, 0), dtype=np.int32)
        return status, False, empty, np.empty(0, dtype=np.bool_), empty, np.empty(0, dtype=np.int64)
    trans, accepting, calls, used = _reduced_subsets(work[3], work[4], work[5], count, nfa[10])
    return status, True, trans, accepting, calls, used


_NO_PAIRS = np.zeros((0, 2), dtype=np.int32)


@njit(cache=True)
def _index_nfa(byte_flat, eps_flat, call_flat, begin, end, n, accept):
    """An NFA's edge lists (flat ``src, lo, hi, dst`` / ``src, dst`` / ``src, rule, dst``) grouped by source, as
    :func:`_subset_construction` reads them: ``(start, byte, epsilon and call (ptr, rows), final, important,
    class of each byte, number of byte classes, number of rules)``. The start's closure also follows ``begin``
    markers; a state is final when epsilons and ``end`` markers reach ``accept``.

    Byte edges are read over the NFA's byte classes (the bytes no edge tells apart form one class): a rule reads
    a few dozen classes, so the subset construction and the minimisation work on tables a few dozen columns
    wide, and only the minimal DFA is written out over 256 bytes."""
    byte_rows = byte_flat.reshape(-1, 4).copy()
    is_cut = np.zeros(257, dtype=np.bool_)
    is_cut[0] = True
    for e in range(byte_rows.shape[0]):
        is_cut[byte_rows[e, 1]] = True
        is_cut[byte_rows[e, 2] + 1] = True
    byte_class = np.empty(256, dtype=np.int32)
    num_classes = -1
    for b in range(256):
        if is_cut[b]:
            num_classes += 1
        byte_class[b] = num_classes
    num_classes += 1
    for e in range(byte_rows.shape[0]):
        byte_rows[e, 1] = byte_class[byte_rows[e, 1]]
        byte_rows[e, 2] = byte_class[byte_rows[e, 2]]
    byte_ptr, byte_rows = _group_by_source(byte_rows, n)
    eps_ptr, eps_rows = _group_by_source(eps_flat.reshape(-1, 2), n)
    call_ptr, call_rows = _group_by_source(call_flat.reshape(-1, 3), n)
    start_ptr, start_rows = eps_ptr, eps_rows
    if begin.shape[0]:
        start_ptr, start_rows = _group_by_source(np.concatenate((eps_rows, begin)), n)
    final = np.zeros(n, dtype=np.bool_)
    final[accept] = True
    if end.shape[0]:
        final = _reaching(np.concatenate((eps_rows, end)), n, accept)
    important = final.copy()
    for s in range(n):
        if byte_ptr[s + 1] > byte_ptr[s] or call_ptr[s + 1] > call_ptr[s]:
            important[s] = True
    num_rules = 0
    for k in range(call_rows.shape[0]):
        num_rules = max(num_rules, call_rows[k, 1] + 1)
    return (start_ptr, start_rows, byte_ptr, byte_rows, eps_ptr, eps_rows, call_ptr, call_rows, final, important,
            byte_class, num_classes, num_rules)  # fmt: skip


@njit(cache=True)
def _new_work(capacity, num_classes, num_rules):
    """The growable arrays of :func:`_subset_construction`, empty."""
    return (
        np.empty(capacity * 4, dtype=np.int32),  # members of the subsets, concatenated
        np.zeros(capacity + 1, dtype=np.int64),  # where each subset's members start
        np.empty(capacity, dtype=np.uint64),  # hash of each subset
        np.full((capacity, num_classes), DEAD, dtype=np.int32),  # transitions by byte class
        np.full((capacity, num_rules), DEAD, dtype=np.int32),  # call transitions
        np.zeros(capacity, dtype=np.bool_),  # accepting
        np.full(capacity * 2, DEAD, dtype=np.int32),  # open-addressing table of subset ids
    )


@njit(cache=True)
def _reduced_subsets(trans, calls, accepting, count, byte_class):
    """The minimal DFA (:func:`_reduce`) of the first ``count`` subsets, their transitions by byte class written
    out over the 256 bytes, with only the call columns some subset uses: ``(byte table, accepting, table of
    those call columns, the rules of those columns)``."""
    num_rules = calls.shape[1]
    used = np.zeros(num_rules, dtype=np.bool_)
    for s in range(count):
        for r in range(num_rules):
            if calls[s, r] >= 0:
                used[r] = True
    columns = np.flatnonzero(used)
    num_classes = trans.shape[1]
    m = 0
    for s in range(count):
        for c in range(num_classes):
            if trans[s, c] >= 0:
                m += 1
        for c in range(columns.shape[0]):
            if calls[s, columns[c]] >= 0:
                m += 1
    tail = np.empty(m, dtype=np.int32)
    label = np.empty(m, dtype=np.int32)
    head = np.empty(m, dtype=np.int32)
    e = 0
    for s in range(count):  # by tail, then label: classes, then the call columns
        for c in range(num_classes + columns.shape[0]):
            t = trans[s, c] if c < num_classes else calls[s, columns[c - num_classes]]
            if t >= 0:
                tail[e] = s
                label[e] = c
                head[e] = t
                e += 1
    table, out_accepting = _reduce_edges(count, num_classes + columns.shape[0], tail, label, head, accepting[:count])
    out_trans = np.empty((table.shape[0], 256), dtype=np.int32)
    out_calls = np.empty((table.shape[0], columns.shape[0]), dtype=np.int32)
    # a class is a run of consecutive bytes (its bounds are cut points), so a row is written a run at a time
    first_byte = np.empty(num_classes + 1, dtype=np.int32)
    first_byte[num_classes] = 256
    for b in range(255, -1, -1):
        first_byte[byte_class[b]] = b
    for s in range(table.shape[0]):
        for c in range(num_classes):
            out_trans[s, first_byte[c] : first_byte[c + 1]] = table[s, c]
        for c in range(columns.shape[0]):
            out_calls[s, c] = table[s, num_classes + c]
    return out_trans, out_accepting, out_calls, columns


#: Work (states visited) the kernel does between two looks at the time limit: a few milliseconds.
_WORK_PER_SLICE = 1 << 20


@njit(cache=True)
def _group_by_source(rows, n):
    """A stable counting sort of ``rows`` by their first column, with the start of each source's rows."""
    ptr = np.zeros(n + 1, dtype=np.int64)
    for k in range(rows.shape[0]):
        ptr[rows[k, 0] + 1] += 1
    for s in range(n):
        ptr[s + 1] += ptr[s]
    fill = ptr[:-1].copy()
    out = np.empty_like(rows)
    for k in range(rows.shape[0]):
        s = rows[k, 0]
        out[fill[s]] = rows[k]
        fill[s] += 1
    return ptr, out


@njit(cache=True)
def _reaching(edges, n, target):
    """The states from which ``edges`` (src, dst) alone reach ``target``."""
    seen = np.zeros(n, dtype=np.bool_)
    seen[target] = True
    changed = True
    while changed:
        changed = False
        for k in range(edges.shape[0]):
            if seen[edges[k, 1]] and not seen[edges[k, 0]]:
                seen[edges[k, 0]] = True
                changed = True
    return seen


@njit(cache=True, inline="always")
def _close(seeds, num_seeds, ptr, rows, important, stamp, generation, stack, out):
    """The important states of the epsilon closure of ``seeds[:num_seeds]``, sorted, into ``out``; their count."""
    top = 0
    for j in range(num_seeds):
        s = seeds[j]
        if stamp[s] != generation:
            stamp[s] = generation
            stack[top] = s
            top += 1
    k = 0
    while top > 0:
        top -= 1
        s = stack[top]
        if important[s]:
            out[k] = s
            k += 1
        for e in range(ptr[s], ptr[s + 1]):
            t = rows[e, 1]
            if stamp[t] != generation:
                stamp[t] = generation
                stack[top] = t
                top += 1
    if k > 16:
        out[:k].sort()
        return k
    for i in range(1, k):  # most closures are a few states: sorted in place, without a call of the sort
        v = out[i]
        j = i - 1
        while j >= 0 and out[j] > v:
            out[j + 1] = out[j]
            j -= 1
        out[j + 1] = v
    return k


@njit(cache=True, inline="always")
def _intern(out, k, work, count, max_states):
    """The id of the subset ``out[:k]``, added when new: ``(id, work, count)``; id -2 when past ``max_states``."""
    members, offsets, hashes, trans, calls, accepting, table = work
    h = np.uint64(14695981039346656037)
    for j in range(k):
        h = (h ^ np.uint64(out[j] + 1)) * np.uint64(1099511628211)
    mask = table.shape[0] - 1
    slot = np.int64(h & np.uint64(mask))
    while table[slot] >= 0:
        other = table[slot]
        start = offsets[other]
        if hashes[other] == h and offsets[other + 1] - start == k:
            same = True
            for j in range(k):
                if members[start + j] != out[j]:
                    same = False
                    break
            if same:
                return other, work, count
        slot = (slot + 1) & mask
    if count >= max_states:
        return -2, work, count
    if count == trans.shape[0]:
        capacity = 2 * count
        grown = np.full((capacity, trans.shape[1]), -1, dtype=np.int32)
        grown[:count] = trans
        trans = grown
        grown_calls = np.full((capacity, calls.shape[1]), -1, dtype=np.int32)
        grown_calls[:count] = calls
        calls = grown_calls
        grown_accepting = np.zeros(capacity, dtype=np.bool_)
        grown_accepting[:count] = accepting
        accepting = grown_accepting
        grown_hashes = np.empty(capacity, dtype=np.uint64)
        grown_hashes[:count] = hashes
        hashes = grown_hashes
        grown_offsets = np.zeros(capacity + 1, dtype=np.int64)
        grown_offsets[: count + 1] = offsets[: count + 1]
        offsets = grown_offsets
        table = np.full(2 * capacity, -1, dtype=np.int32)
        mask = table.shape[0] - 1
        for i in range(count):
            slot = np.int64(hashes[i] & np.uint64(mask))
            while table[slot] >= 0:
                slot = (slot + 1) & mask
            table[slot] = i
        slot = np.int64(h & np.uint64(mask))
        while table[slot] >= 0:
            slot = (slot + 1) & mask
    start = offsets[count]
    if start + k > members.shape[0]:
        grown_members = np.empty(max(2 * members.shape[0], start + k), dtype=np.int32)
        grown_members[:start] = members[:start]
        members = grown_members
    members[start : start + k] = out[:k]
    offsets[count + 1] = start + k
    hashes[count] = h
    table[slot] = count
    return count, (members, offsets, hashes, trans, calls, accepting, table), count + 1


@njit(cache=True, inline="always")
def _successor(seeds, num_seeds, eps_ptr, eps_rows, important, stamp, generation, stack, out, work, count, max_states):
    """The subset reached through ``seeds`` (its id, -1 when it reads and accepts nothing, -2 past
    ``max_states``), the size of its closure, and the grown ``work`` and ``count``."""
    k = _close(seeds, num_seeds, eps_ptr, eps_rows, important, stamp, generation, stack, out)
    if k == 0:
        return -1, 0, work, count
    target, work, count = _intern(out, k, work, count, max_states)
    return target, k, work, count


@njit(cache=True)
def _subset_construction(
    start, start_ptr, start_rows, byte_ptr, byte_rows, eps_ptr, eps_rows, call_ptr, call_rows, final, important,
    work, done, count, slice_work, max_states,
):  # fmt: skip
    """Expand subsets ``done``.. (adding the start subset first when there is none yet) until about
    ``slice_work`` states have been visited: ``(work, done, count, status)``, status 1 when the automaton needs
    more than ``max_states`` states."""
    n = final.shape[0]
    stamp = np.zeros(n, dtype=np.int64)
    stack = np.empty(n, dtype=np.int32)
    out = np.empty(n, dtype=np.int32)
    seeds = np.empty(max(byte_rows.shape[0], call_rows.shape[0], 1), dtype=np.int32)
    lo = np.empty(byte_rows.shape[0], dtype=np.int32)
    hi = np.empty(byte_rows.shape[0], dtype=np.int32)
    dst = np.empty(byte_rows.shape[0], dtype=np.int32)
    call_rule = np.empty(call_rows.shape[0], dtype=np.int32)
    call_dst = np.empty(call_rows.shape[0], dtype=np.int32)
    width = work[3].shape[1]  # byte classes
    is_cut = np.zeros(width + 1, dtype=np.bool_)
    cuts = np.empty(width + 1, dtype=np.int32)
    generation = 0
    if count == 0:
        seeds[0] = start
        generation += 1
        k = _close(seeds, 1, start_ptr, start_rows, important, stamp, generation, stack, out)
        if k == 0:  # nothing can be read or accepted: one dead start state
            work[5][0] = False
            return work, 1, 1, 0
        _, work, count = _intern(out, k, work, count, max_states)
    visited = 0
    while done < count and visited < slice_work:
        i = done
        first, last = work[1][i], work[1][i + 1]
        num_edges = 0
        num_calls = 0
        is_final = False
        for j in range(first, last):
            s = work[0][j]
            is_final = is_final or final[s]
            for e in range(byte_ptr[s], byte_ptr[s + 1]):
                lo[num_edges] = byte_rows[e, 1]
                hi[num_edges] = byte_rows[e, 2]
                dst[num_edges] = byte_rows[e, 3]
                num_edges += 1
            for e in range(call_ptr[s], call_ptr[s + 1]):
                call_rule[num_calls] = call_rows[e, 1]
                call_dst[num_calls] = call_rows[e, 2]
                num_calls += 1
        work[5][i] = is_final
        visited += last - first + num_edges + num_calls
        # Class ranges: between two consecutive cut points every edge either covers the whole range or none of it.
        for e in range(num_edges):
            is_cut[lo[e]] = True
            is_cut[hi[e] + 1] = True
        num_cuts = 0
        for b in range(width + 1):
            if is_cut[b]:
                cuts[num_cuts] = b
                num_cuts += 1
                is_cut[b] = False
        for c in range(num_cuts - 1):
            a, b = cuts[c], cuts[c + 1]
            num_seeds = 0
            for e in range(num_edges):
                if lo[e] <= a and hi[e] >= a:
                    seeds[num_seeds] = dst[e]
                    num_seeds += 1
            if num_seeds == 0:
                continue
            generation += 1
            target, k, work, count = _successor(
                seeds, num_seeds, eps_ptr, eps_rows, important, stamp, generation, stack, out, work, count, max_states
            )
            visited += num_seeds + k
            if target == -2:
                return work, done, count, 1
            if target >= 0:
                work[3][i, a:b] = target
        # Calls: one target subset per called rule.
        for rule in range(work[4].shape[1] if num_calls else 0):
            num_seeds = 0
            for e in range(num_calls):
                if call_rule[e] == rule:
                    seeds[num_seeds] = call_dst[e]
                    num_seeds += 1
            if num_seeds == 0:
                continue
            generation += 1
            target, k, work, count = _successor(
                seeds, num_seeds, eps_ptr, eps_rows, important, stamp, generation, stack, out, work, count, max_states
            )
            visited += num_seeds + k
            if target == -2:
                return work, done, count, 1
            if target >= 0:
                work[4][i, rule] = target
        done += 1
    return work, done, count, 0

# --------------------------------------------------------------------------------------------------------------
# DFA


@dataclass(frozen=True, eq=False)
class ByteDFA:
    """A deterministic automaton over bytes. State 0 is the start; ``trans[s, b]`` is the next state or -1.

    A grammar rule's automaton also has call edges: ``calls[s, k]`` is the state reached after one whole match
    of rule ``callees[k]`` read from state ``s`` (or -1); a regex has none (``calls`` has 0 columns). After
    :meth:`trimmed`, every state can still reach acceptance, so "not dead" means "can still match".
    """

    trans: np.ndarray  # int32 (n_states, 256)
    accepting: np.ndarray  # bool (n_states,)
    calls: np.ndarray = None  # type: ignore[assignment]  # int32 (n_states, len(callees))
    callees: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.calls is None:
            object.__setattr__(self, "calls", np.empty((self.trans.shape[0], 0), dtype=np.int32))

    @property
    def num_states(self) -> int:
        return int(self.trans.shape[0])

    @cached_property
    def edge_list(self) -> np.ndarray:
        """The byte edges as rows ``(state, first byte, last byte, target)``, one per maximal range."""
        trans = self.trans
        starts = np.ones(trans.shape, dtype=bool)
        starts[:, 1:] = trans[:, 1:] != trans[:, :-1]
        state, first = np.nonzero(starts)
        last = np.empty_like(first)
        last[:-1] = first[1:] - 1
        last[np.append(state[1:] != state[:-1], True)] = 255
        target = trans[state, first]
        keep = target >= 0
        return np.column_stack([state[keep], first[keep], last[keep], target[keep]]).astype(np.int32)

    @cached_property
    def digest(self) -> bytes:
        """A digest of the byte table and the accepting states (a call-free DFA's identity up to its numbering:
        minimal DFAs of one language, numbered by :meth:`reduced`, have the same digest). Made when first asked
        for: hashing a table costs tens of microseconds."""
        digest = hashlib.blake2b(self.trans.tobytes(), digest_size=16)
        digest.update(self.accepting.tobytes())
        return digest.digest()

    @property
    def is_empty(self) -> bool:
        """True when the automaton matches nothing at all."""
        return not bool(self.accepting.any())

    def _edges(self) -> np.ndarray:
        """Byte and call columns side by side (what trimming and minimisation look at)."""
        return np.ascontiguousarray(np.hstack([self.trans, self.calls])) if self.callees else self.trans

    def reduced(self) -> ByteDFA:
        """The equivalent trimmed DFA with the fewest states, numbered breadth first from the start (so equal
        languages give equal tables): states that cannot reach acceptance, or that the start cannot reach, are
        dropped, and the rest refined (:func:`partial_dfa_blocks`) over the classes of identical columns. One
        compiled kernel, so a small rule costs microseconds."""
        table, accepting = _reduce(self._edges(), self.accepting)
        if table.shape[0] == self.num_states and self.callees == () and np.array_equal(table, self.trans):
            return self
        return ByteDFA(
            np.ascontiguousarray(table[:, :256]), accepting, np.ascontiguousarray(table[:, 256:]), self.callees
        )

    def without_words(self, words: list[bytes]) -> ByteDFA:
        """This minimal, trimmed, call-free DFA's language less the given ``words``, as the minimal DFA numbered
        as :meth:`reduced` numbers states, built without a minimisation pass (see :func:`_trie_complement`).

        The language must be prefix-free (an accepting state reads nothing, as for a quoted JSON string) and each
        word in it: ValueError otherwise."""
        if self.calls.shape[1] or (self.trans[self.accepting] >= 0).any():
            raise ValueError("without_words needs a call-free DFA whose accepting states read nothing")
        data = np.frombuffer(b"".join(words), dtype=np.uint8)
        offsets = np.zeros(len(words) + 1, dtype=np.int64)
        np.cumsum([len(w) for w in words], out=offsets[1:])
        trans, accepting, ok = _trie_complement(data, offsets, self.trans, self.accepting)
        if not ok:
            raise ValueError("a word to remove is not in the language")
        out = ByteDFA(trans, accepting)
        object.__setattr__(out, "_words_removed_from", self)
        return out

    @property
    def words_removed_from(self) -> ByteDFA | None:
        """The DFA this one was made from by :meth:`without_words`, or None."""
        return self.__dict__.get("_words_removed_from")

    @cached_property
    def states_before_removal(self) -> np.ndarray | None:
        """For a DFA made by :meth:`without_words`: per state, the state of :attr:`words_removed_from` that the
        same text leads to (whose language is this state's plus finitely many words). None for another DFA."""
        base = self.words_removed_from
        if base is None:
            return None
        pairs, ok = _paired_states(self.trans, base.trans)
        return pairs if ok else None

    def numbered_breadth_first(self) -> ByteDFA:
        """This call-free DFA with its states numbered as :meth:`reduced` numbers them: for an automaton built
        minimal, with every state reachable, the canonical table without the cost of minimising."""
        order = _bfs_order(self.trans, np.arange(self.num_states, dtype=np.int32), self.num_states)
        if (order < 0).any():
            raise ValueError("a state cannot be reached from the start")
        return ByteDFA(*_renumbered(self.trans, self.accepting, order))

    @cached_property
    def _language_hashes(self) -> dict[int, np.ndarray]:
        return {}

    def language_hashes(self, depth: int) -> np.ndarray:
        """:func:`bounded_language_hashes` of this call-free DFA's states, computed once per depth: rule DFAs are
        shared across structures, so a lexical rule is hashed once per process."""
        hashes = self._language_hashes.get(depth)
        if hashes is None:
            hashes = bounded_language_hashes(self.trans, self.accepting, depth)
            hashes.flags.writeable = False
            self._language_hashes[depth] = hashes
        return hashes

    def reaches_acceptance(self, usable_calls: np.ndarray, byte_edges: bool = True) -> bool:
        """Whether acceptance is reachable from the start through the call columns marked in ``usable_calls``
        (bool, one per callee) and, when ``byte_edges``, through byte edges. Kept for a call-free DFA, whose
        answer never changes (rule DFAs are shared by every grammar that uses them)."""
        if self.callees:
            return bool(_reaches_acceptance(self.trans, self.calls, self.accepting, usable_calls, byte_edges))
        known = self._call_free_acceptance
        if byte_edges not in known:
            known[byte_edges] = bool(_reaches_acceptance(self.trans, self.calls, self.accepting, usable_calls,
                                                         byte_edges))  # fmt: skip
        return known[byte_edges]

    @cached_property
    def _call_free_acceptance(self) -> dict[bool, bool]:
        return {}

    def matches(self, data: bytes) -> bool:
        """Whether ``data`` is accepted (a slow reference used by tests and error messages)."""
        state = 0
        for byte in data:
            state = int(self.trans[state, byte])
            if state < 0:
                return False
        return bool(self.accepting[state])


_HASH_MULTIPLIERS = np.random.default_rng(0x636F6E737472).integers(1, 2**63, size=256, dtype=np.uint64) | np.uint64(1)


def bounded_language_hashes(trans: np.ndarray, accepting: np.ndarray, depth: int) -> np.ndarray:
    """Per state of a trimmed, call-free DFA: a 64-bit hash of its language cut at ``depth`` bytes.

    Two states get the same hash when (up to a hash collision, about 2^-64 per pair) every string of at most
    ``depth`` bytes leads them both to the dead state, or both to accepting states, or both to live
    non-accepting ones. A token walk only reads tokens of at most the trie's depth, so such states have the same
    walk: this is what lets a string of ``maxLength`` 500 share the walk of an unbounded string once fewer than
    500 characters fit in any token, and lets different structures share the walks of the same lexical pieces.
    """
    return _bounded_hashes(np.ascontiguousarray(trans, dtype=np.int32), accepting, depth, _HASH_MULTIPLIERS)


@njit(cache=True)
def mix64(x):
    """A 64-bit finaliser (SplitMix64's): every input bit flips about half the output bits."""
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


@njit(cache=True)
def _bounded_hashes(trans, accepting, depth, multipliers):
    """Round k hashes each state's acceptance with the round k-1 hashes of its targets (the dead state has a
    constant hash), each weighted by the sum of the multipliers of the bytes leading there; ``depth`` rounds.
    The sum is linear, so the bytes are grouped by target once: a round then costs one term per distinct target
    of a state (a few, for a string's states) instead of one per byte class."""
    n, width = trans.shape
    seen = np.full(n + 1, -1, dtype=np.int64)  # per target + 1: the last state that led there
    slot = np.empty(n + 1, dtype=np.int64)
    ptr = np.zeros(n + 1, dtype=np.int64)
    for s in range(n):
        count = 0
        for b in range(width):
            t = trans[s, b] + 1
            if seen[t] != s:
                seen[t] = s
                count += 1
        ptr[s + 1] = ptr[s] + count
    targets = np.empty(ptr[n], dtype=np.int32)
    weights = np.zeros(ptr[n], dtype=np.uint64)
    seen[:] = -1
    for s in range(n):
        count = ptr[s]
        for b in range(width):
            t = trans[s, b] + 1
            if seen[t] != s:
                seen[t] = s
                slot[t] = count
                targets[count] = t - 1
                count += 1
            weights[slot[t]] += multipliers[b]
    base = np.empty(n, dtype=np.uint64)
    for s in range(n):
        base[s] = np.uint64(0x2545F4914F6CDD1D) if accepting[s] else np.uint64(0x3C6EF372FE94F82B)
    hashes = np.empty(n, dtype=np.uint64)
    for s in range(n):
        hashes[s] = mix64(base[s])
    nxt = np.empty(n, dtype=np.uint64)
    dead = np.uint64(0x9E3779B97F4A7C15)
    for _ in range(depth):
        for s in range(n):
            acc = np.uint64(0)
            for k in range(ptr[s], ptr[s + 1]):
                t = targets[k]
                acc += (hashes[t] if t >= 0 else dead) * weights[k]
            nxt[s] = mix64(acc ^ base[s])
        hashes, nxt = nxt, hashes
    return hashes


# --------------------------------------------------------------------------------------------------------------
# Kernels


@njit(cache=True)
def _reaches_acceptance(trans, calls, accepting, usable_calls, byte_edges):
    n = trans.shape[0]
    seen = np.zeros(n, dtype=np.bool_)
    stack = np.empty(n, dtype=np.int32)
    seen[0] = True
    stack[0] = 0
    top = 1
    while top > 0:
        top -= 1
        s = stack[top]
        if accepting[s]:
            return True
        for k in range(calls.shape[1]):
            t = calls[s, k]
            if usable_calls[k] and t >= 0 and not seen[t]:
                seen[t] = True
                stack[top] = t
                top += 1
        if byte_edges:
            for b in range(256):
                t = trans[s, b]
                if t >= 0 and not seen[t]:
                    seen[t] = True
                    stack[top] = t
                    top += 1
    return False


@njit(cache=True)
def _partition(n):
    """A refinable partition of ``n`` elements, as :func:`_mark` and :func:`_split` use it: ``(elements in set
    order, each element's place, each element's set, each set's first place, its end, its marked count, the
    touched sets)``, every element in set 0 (whose end the caller sets)."""
    return (
        np.arange(n).astype(np.int32), np.arange(n).astype(np.int32), np.zeros(n, dtype=np.int32),
        np.zeros(n + 1, dtype=np.int64), np.zeros(n + 1, dtype=np.int64), np.zeros(n + 1, dtype=np.int64),
        np.empty(n + 1, dtype=np.int32),
    )  # fmt: skip


@njit(cache=True)
def _mark(e, elements, location, set_of, first, mid, touched, num_touched):
    """Move element ``e`` into the marked front of its set (a refinable partition); the new ``num_touched``."""
    s = set_of[e]
    i = location[e]
    j = first[s] + mid[s]
    other = elements[j]
    elements[i] = other
    location[other] = i
    elements[j] = e
    location[e] = j
    if mid[s] == 0:
        touched[num_touched] = s
        num_touched += 1
    mid[s] += 1
    return num_touched


@njit(cache=True)
def _split(elements, set_of, first, past, mid, touched, num_touched, num_sets):
    """Split every touched set into its marked and unmarked parts, the smaller part becoming a new set; the new
    number of sets."""
    for w in range(num_touched):
        s = touched[w]
        j = first[s] + mid[s]
        if j == past[s]:  # all marked: nothing to split
            mid[s] = 0
            continue
        z = num_sets
        num_sets += 1
        if mid[s] <= past[s] - j:
            first[z] = first[s]
            past[z] = j
            first[s] = j
        else:
            past[z] = past[s]
            first[z] = j
            past[s] = j
        for i in range(first[z], past[z]):
            set_of[elements[i]] = z
        mid[s] = 0
        mid[z] = 0
    return num_sets


@njit(cache=True)
def partial_dfa_blocks(table, accepting):
    """The equivalence class of each state of a partial DFA (``table`` (n, k), -1 where there is no edge): the
    algorithm of Valmari and Lehtinen (2008), which refines blocks of states and "cords" of edges in turn. It
    runs in O(m log n) for m edges, so a rule whose states read a byte or two each costs little however many
    byte classes and calls its table has (Hopcroft's algorithm over a completed table costs O(k n log n))."""
    tail, label, head = _table_edges(table)
    return _edge_blocks(table.shape[0], table.shape[1], tail, label, head, accepting)


@njit(cache=True)
def _table_edges(table):
    """The edges of a partial table as ``(tail, label, head)`` arrays, by tail and then label."""
    n, k = table.shape
    m = 0
    for s in range(n):
        for c in range(k):
            if table[s, c] >= 0:
                m += 1
    tail = np.empty(m, dtype=np.int32)
    label = np.empty(m, dtype=np.int32)
    head = np.empty(m, dtype=np.int32)
    e = 0
    for s in range(n):
        for c in range(k):
            t = table[s, c]
            if t >= 0:
                tail[e] = s
                label[e] = c
                head[e] = t
                e += 1
    return tail, label, head


@njit(cache=True)
def _incoming_edges(n, head):
    """The edges into each of ``n`` states, by a counting sort of ``head``: ``(ptr, edge ids)``, the edges into
    state ``s`` being ``ids[ptr[s]:ptr[s + 1]]``."""
    ptr = np.zeros(n + 1, dtype=np.int64)
    for e in range(head.shape[0]):
        ptr[head[e] + 1] += 1
    for s in range(n):
        ptr[s + 1] += ptr[s]
    ids = np.empty(head.shape[0], dtype=np.int32)
    fill = ptr[:n].copy()
    for e in range(head.shape[0]):
        ids[fill[head[e]]] = e
        fill[head[e]] += 1
    return ptr, ids


@njit(cache=True)
def _edge_blocks(n, k, edge_tail, edge_label, edge_head, accepting):
    """:func:`partial_dfa_blocks` of the DFA with ``n`` states and labels ``0..k-1`` given by its edges: a DFA
    whose states read a label or two each is refined without a pass over a table of every state and label."""
    # Edges grouped by label: the initial cords.
    m = edge_tail.shape[0]
    label_count = np.zeros(k + 1, dtype=np.int64)
    for e in range(m):
        label_count[edge_label[e] + 1] += 1
    tail = np.empty(m, dtype=np.int32)
    head = np.empty(m, dtype=np.int32)
    fill = np.cumsum(label_count)[:k].copy()
    for e in range(m):
        at = fill[edge_label[e]]
        tail[at] = edge_tail[e]
        head[at] = edge_head[e]
        fill[edge_label[e]] += 1
    in_ptr, incoming = _incoming_edges(n, head)
    # Blocks of states: one, then accepting states split off.
    b_elements, b_location, b_set, b_first, b_past, b_mid, b_touched = _partition(n)
    b_past[0] = n
    num_blocks = 1
    touched = 0
    for s in range(n):
        if accepting[s]:
            touched = _mark(s, b_elements, b_location, b_set, b_first, b_mid, b_touched, touched)
    num_blocks = _split(b_elements, b_set, b_first, b_past, b_mid, b_touched, touched, num_blocks)
    # Cords of edges: one per label.
    c_elements, c_location, c_set, c_first, c_past, c_mid, c_touched = _partition(m)
    num_cords = 0
    start = 0
    for c in range(k):
        count = label_count[c + 1]
        if count == 0:
            continue
        c_first[num_cords] = start
        c_past[num_cords] = start + count
        for e in range(start, start + count):
            c_set[e] = num_cords
        num_cords += 1
        start += count
    b, c = 1, 0
    while c < num_cords:
        touched = 0
        for i in range(c_first[c], c_past[c]):
            touched = _mark(tail[c_elements[i]], b_elements, b_location, b_set, b_first, b_mid, b_touched, touched)
        num_blocks = _split(b_elements, b_set, b_first, b_past, b_mid, b_touched, touched, num_blocks)
        c += 1
        while b < num_blocks:
            touched = 0
            for i in range(b_first[b], b_past[b]):
                s = b_elements[i]
                for j in range(in_ptr[s], in_ptr[s + 1]):
                    touched = _mark(incoming[j], c_elements, c_location, c_set, c_first, c_mid, c_touched, touched)
            num_cords = _split(c_elements, c_set, c_first, c_past, c_mid, c_touched, touched, num_cords)
            b += 1
    return b_set


@njit(cache=True)
def _reduce(edges, accepting):
    """See :meth:`ByteDFA.reduced`: ``(table, accepting)`` of the minimal trimmed DFA.

    Every step but the last runs on the table's distinct columns (a rule reads a few dozen byte classes, not
    256 bytes): identical columns of the untrimmed table stay identical once trimmed, so they refine alike."""
    n, width = edges.shape
    reps, class_of = column_classes(edges)
    k = reps.shape[0]
    columns = np.empty((n, k), dtype=np.int32)
    for s in range(n):
        for c in range(k):
            columns[s, c] = edges[s, reps[c]]
    tail, label, head = _table_edges(columns)
    reduced, out_accepting = _reduce_edges(n, k, tail, label, head, accepting)
    table = np.empty((reduced.shape[0], width), dtype=np.int32)
    for s in range(reduced.shape[0]):
        for c in range(width):
            table[s, c] = reduced[s, class_of[c]]
    return table, out_accepting


@njit(cache=True)
def _reduce_edges(n, k, tail, label, head, accepting):
    """``(table (states, k), accepting)`` of the minimal trimmed DFA of the one with ``n`` states given by its
    edges over labels ``0..k-1``, listed by tail and then label. States are numbered breadth first from the
    start, labels in order, as :meth:`ByteDFA.reduced` promises; only the result is written as a table."""
    m = tail.shape[0]
    # Trim: the states that can reach acceptance (a reverse breadth-first search over the edges).
    in_ptr, incoming = _incoming_edges(n, head)
    alive = accepting.copy()
    queue = np.empty(n, dtype=np.int32)
    front, back = 0, 0
    for s in range(n):
        if alive[s]:
            queue[back] = s
            back += 1
    while front < back:
        t = queue[front]
        front += 1
        for j in range(in_ptr[t], in_ptr[t + 1]):
            s = tail[incoming[j]]
            if not alive[s]:
                alive[s] = True
                queue[back] = s
                back += 1
    if not alive[0]:
        return np.full((1, k), -1, dtype=np.int32), np.zeros(1, dtype=np.bool_)
    remap = np.full(n, -1, dtype=np.int32)
    kept = 0
    for s in range(n):
        if alive[s]:
            remap[s] = kept
            kept += 1
    kept_accepting = np.empty(kept, dtype=np.bool_)
    for s in range(n):
        if remap[s] >= 0:
            kept_accepting[remap[s]] = accepting[s]
    num_kept = 0
    for e in range(m):
        if alive[tail[e]] and alive[head[e]]:
            num_kept += 1
    k_tail = np.empty(num_kept, dtype=np.int32)
    k_label = np.empty(num_kept, dtype=np.int32)
    k_head = np.empty(num_kept, dtype=np.int32)
    out_ptr = np.zeros(kept + 1, dtype=np.int64)
    j = 0
    for e in range(m):
        if alive[tail[e]] and alive[head[e]]:
            k_tail[j] = remap[tail[e]]
            k_label[j] = label[e]
            k_head[j] = remap[head[e]]
            out_ptr[k_tail[j] + 1] += 1
            j += 1
    for s in range(kept):
        out_ptr[s + 1] += out_ptr[s]
    block_of = _edge_blocks(kept, k, k_tail, k_label, k_head, kept_accepting)
    num_blocks = 0
    for s in range(kept):
        num_blocks = max(num_blocks, block_of[s] + 1)
    # Breadth first from the start's block, each block read through its first state, labels in order. Blocks the
    # start cannot reach get -1 and are dropped (a product automaton has such states).
    first_state = np.full(num_blocks, -1, dtype=np.int32)
    for s in range(kept):
        if first_state[block_of[s]] < 0:
            first_state[block_of[s]] = s
    order = np.full(num_blocks, -1, dtype=np.int32)
    order[block_of[0]] = 0
    queue[0] = block_of[0]
    front, back = 0, 1
    while front < back:
        s = first_state[queue[front]]
        front += 1
        for e in range(out_ptr[s], out_ptr[s + 1]):
            b = block_of[k_head[e]]
            if order[b] < 0:
                order[b] = back
                queue[back] = b
                back += 1
    table = np.full((back, k), -1, dtype=np.int32)
    out_accepting = np.zeros(back, dtype=np.bool_)
    for b in range(num_blocks):
        if order[b] < 0:
            continue
        s = first_state[b]
        out_accepting[order[b]] = kept_accepting[s]
        for e in range(out_ptr[s], out_ptr[s + 1]):
            table[order[b], k_label[e]] = order[block_of[k_head[e]]]
    return table, out_accepting


@njit(cache=True)
def _paired_states(trans, base_trans):
    """``(pairs, ok)``: per state of ``trans``, the state of ``base_trans`` the same text leads to from both
    starts (-1 for a state the start cannot reach); ``ok`` False when a text leads ``trans`` somewhere but the base
    to the dead state, or the same state to two base states (then the base is not a superset automaton)."""
    n = trans.shape[0]
    pairs = np.full(n, -1, dtype=np.int32)
    queue = np.empty(n, dtype=np.int32)
    pairs[0] = 0
    queue[0] = 0
    head, tail = 0, 1
    while head < tail:
        a = queue[head]
        head += 1
        b = pairs[a]
        for byte in range(256):
            x = trans[a, byte]
            if x < 0:
                continue
            y = base_trans[b, byte]
            if y < 0:
                return pairs, False
            if pairs[x] < 0:
                pairs[x] = y
                queue[tail] = x
                tail += 1
            elif pairs[x] != y:
                return pairs, False
    return pairs, True


@njit(cache=True)
def _trie_complement(data, offsets, trans, accepting):
    """``(table, accepting, ok)`` for :meth:`ByteDFA.without_words`: the words (``data[offsets[i]:offsets[i+1]]``)
    form a trie that runs beside the DFA, and a byte the trie does not read continues in the DFA.

    The result is minimal as built once equal subtries are merged: two trie nodes are equivalent exactly when
    the DFA is in the same state there and their children read the same bytes into equivalent nodes; a trie node
    is never equivalent to a DFA state (it rejects a word below it that the state accepts); a node where a word
    ends is dead (accepting states read nothing, so it is a leaf); the DFA itself is minimal. Merging goes
    bottom-up (a child is made after its parent) with a hash table whose hits are compared in full. States are
    numbered breadth first from the start, as :meth:`ByteDFA.reduced` numbers them. ``ok`` is False when a word
    is not accepted."""
    num_dfa = trans.shape[0]
    size = data.shape[0] + 1
    first_child = np.full(size, -1, dtype=np.int32)
    sibling = np.full(size, -1, dtype=np.int32)
    byte_of = np.zeros(size, dtype=np.int32)
    state_of = np.zeros(size, dtype=np.int32)
    count = 1
    for w in range(offsets.shape[0] - 1):
        node = 0
        for j in range(offsets[w], offsets[w + 1]):
            b = data[j]
            child = first_child[node]
            while child >= 0 and byte_of[child] != b:
                child = sibling[child]
            if child < 0:
                t = trans[state_of[node], b]
                if t < 0:
                    return np.empty((0, 256), dtype=np.int32), np.empty(0, dtype=np.bool_), False
                child = count
                count += 1
                byte_of[child] = b
                state_of[child] = t
                sibling[child] = first_child[node]
                first_child[node] = child
            node = child
        if not accepting[state_of[node]]:
            return np.empty((0, 256), dtype=np.int32), np.empty(0, dtype=np.bool_), False
    # Classes of trie nodes, leaves (dead) -1.
    class_of = np.full(count, -1, dtype=np.int32)
    rep = np.empty(count, dtype=np.int32)
    class_hash = np.empty(count, dtype=np.uint64)
    slots = 1
    while slots < 2 * count:
        slots *= 2
    table = np.full(slots, -1, dtype=np.int32)
    num_classes = 0
    for node in range(count - 1, -1, -1):
        if first_child[node] < 0 and node > 0:
            continue
        h = np.uint64(state_of[node]) * np.uint64(0x9E3779B97F4A7C15)
        degree = 0
        child = first_child[node]
        while child >= 0:
            x = np.uint64(byte_of[child] * 1_000_003 + class_of[child] + 2) * np.uint64(0xBF58476D1CE4E5B9)
            h += x ^ (x >> np.uint64(31))
            degree += 1
            child = sibling[child]
        slot = np.int64(h & np.uint64(slots - 1))
        found = -1
        while table[slot] >= 0:
            k = table[slot]
            if class_hash[k] == h and state_of[rep[k]] == state_of[node]:
                other = rep[k]
                same = True
                other_degree = 0
                c = first_child[other]
                while c >= 0:
                    other_degree += 1
                    c = sibling[c]
                if other_degree != degree:
                    same = False
                child = first_child[node]
                while same and child >= 0:
                    c = first_child[other]
                    while c >= 0 and byte_of[c] != byte_of[child]:
                        c = sibling[c]
                    if c < 0 or class_of[c] != class_of[child]:
                        same = False
                    child = sibling[child]
                if same:
                    found = k
                    break
            slot = (slot + 1) & (slots - 1)
        if found < 0:
            found = num_classes
            num_classes += 1
            rep[found] = node
            class_hash[found] = h
            table[slot] = found
        class_of[node] = found
    # Breadth first from the root's class over classes (ids 0..num_classes-1) and DFA states (num_classes + q).
    total = num_classes + num_dfa
    number = np.full(total, -1, dtype=np.int32)
    queue = np.empty(total, dtype=np.int32)
    out = np.full((total, 256), -1, dtype=np.int32)
    out_accepting = np.zeros(total, dtype=np.bool_)
    row = np.empty(256, dtype=np.int32)
    number[class_of[0]] = 0
    queue[0] = class_of[0]
    head, tail = 0, 1
    while head < tail:
        s = queue[head]
        if s < num_classes:
            node = rep[s]
            q = state_of[node]
            for b in range(256):
                t = trans[q, b]
                row[b] = num_classes + t if t >= 0 else -1
            child = first_child[node]
            while child >= 0:
                row[byte_of[child]] = class_of[child]
                child = sibling[child]
        else:
            q = s - num_classes
            out_accepting[head] = accepting[q]
            for b in range(256):
                t = trans[q, b]
                row[b] = num_classes + t if t >= 0 else -1
        for b in range(256):
            t = row[b]
            if t >= 0:
                if number[t] < 0:
                    number[t] = tail
                    queue[tail] = t
                    tail += 1
                out[head, b] = number[t]
        head += 1
    return out[:tail].copy(), out_accepting[:tail].copy(), True


@njit(cache=True)
def _renumbered(trans, accepting, order):
    """``(trans, accepting)`` with state ``s`` renamed ``order[s]`` (a permutation)."""
    table = np.empty_like(trans)
    out = np.empty_like(accepting)
    for s in range(trans.shape[0]):
        row = order[s]
        out[row] = accepting[s]
        for b in range(trans.shape[1]):
            t = trans[s, b]
            table[row, b] = order[t] if t >= 0 else -1
    return table, out


@njit(cache=True)
def _bfs_order(trans, block_of, num_blocks):
    """New block numbers in breadth-first order from the start state's block."""
    n = trans.shape[0]
    representative = np.full(num_blocks, -1, dtype=np.int32)
    for s in range(n):
        if representative[block_of[s]] < 0:
            representative[block_of[s]] = s
    order = np.full(num_blocks, -1, dtype=np.int32)
    queue = np.empty(num_blocks, dtype=np.int32)
    order[block_of[0]] = 0
    queue[0] = block_of[0]
    head, tail = 0, 1
    while head < tail:
        b = queue[head]
        head += 1
        s = representative[b]
        for byte in range(trans.shape[1]):
            t = trans[s, byte]
            if t >= 0 and order[block_of[t]] < 0:
                order[block_of[t]] = tail
                queue[tail] = block_of[t]
                tail += 1
    return order


@njit(cache=True)
def column_classes(trans):
    """Columns of ``trans`` (bytes, symbols) that are identical form a class: one representative column per
    class (the first; classes are numbered in column order), and each column's class. Columns are hashed row by
    row (the table is row-major, so reading it by columns would miss the cache on every cell), grouped by hash
    in a small open-addressing table, then checked exactly: a collision falls back to comparing with every
    class."""
    n, width = trans.shape
    hashes = np.full(width, np.uint32(2166136261), dtype=np.uint32)  # 32 bits: the loop runs in vector lanes
    for s in range(n):
        for b in range(width):
            hashes[b] = (hashes[b] ^ np.uint32(trans[s, b] + 2)) * np.uint32(16777619)
    size = 1
    while size < 2 * width:
        size *= 2
    slot_hash = np.empty(size, dtype=np.uint32)
    slot_column = np.full(size, -1, dtype=np.int64)
    first = np.empty(width, dtype=np.int64)  # the first column with the same hash
    for b in range(width):
        h = hashes[b]
        slot = np.int64(h & np.uint32(size - 1))
        while slot_column[slot] >= 0 and slot_hash[slot] != h:
            slot = (slot + 1) & (size - 1)
        if slot_column[slot] < 0:
            slot_column[slot] = b
            slot_hash[slot] = h
        first[b] = slot_column[slot]
    same = np.ones(width, dtype=np.bool_)
    for s in range(n):
        for b in range(width):
            if trans[s, b] != trans[s, first[b]]:
                same[b] = False
    reps = np.empty(width, dtype=np.int64)
    class_of = np.empty(width, dtype=np.int64)
    num = 0
    for b in range(width):
        if first[b] != b and same[b]:
            class_of[b] = class_of[first[b]]
            continue
        found = -1
        if first[b] != b:  # a collision: compare with every class exactly
            for r in range(num):
                other = reps[r]
                equal = True
                for s in range(n):
                    if trans[s, b] != trans[s, other]:
                        equal = False
                        break
                if equal:
                    found = r
                    break
        if found < 0:
            reps[num] = b
            found = num
            num += 1
        class_of[b] = found
    return reps[:num], class_of
