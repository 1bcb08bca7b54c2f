"""Byte-level automata: an NFA builder, subset construction, trimming and minimisation.

Structures are compiled to automata over *bytes*, not characters, because tokens are byte strings: a token
can end in the middle of a UTF-8 character. Character sets are expanded to UTF-8 byte-range sequences here.

Two zero-width markers model the anchors ``^`` and ``$`` exactly: an edge labelled ``BEGIN`` may only be taken
before any byte is read, an edge labelled ``END`` only after the last one. The subset construction folds them
into the start state and into acceptance, so the resulting :class:`ByteDFA` has byte edges only.
"""

from __future__ import annotations

import contextvars
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
from numba import njit

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


_DEADLINE: contextvars.ContextVar[float | None] = contextvars.ContextVar("constrain_deadline", default=None)


@contextmanager
def deadline(at: float | None) -> Iterator[None]:
    """Within the block, automaton construction raises :class:`CompileTimeout` once :func:`time.process_time`
    passes ``at`` (None: no limit). CPU time, so a loaded machine does not change the outcome; the guard against
    hostile inputs that no size limit catches."""
    token = _DEADLINE.set(at)
    try:
        yield
    finally:
        _DEADLINE.reset(token)


def check_deadline() -> None:
    at = _DEADLINE.get()
    if at is not None and time.process_time() > at:
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


def _byte_groups(out, closure_of, unions) -> list[tuple[int, int, frozenset[int]]]:
    """Split the byte edges ``out`` (lo, hi, target) of one subset into maximal byte ranges with one set of
    targets each: ``(first byte, end byte, closure of the targets)``. A sweep over the range ends, so a subset
    with many edges costs O(E log E), not O(E^2)."""
    events: dict[int, list[tuple[int, int]]] = {}
    for lo, hi, dst in out:
        events.setdefault(lo, []).append((dst, 1))
        events.setdefault(hi + 1, []).append((dst, -1))
    active: dict[int, int] = {}
    groups = []
    cuts = sorted(events)
    for a, b in zip(cuts, cuts[1:]):
        for dst, delta in events[a]:
            count = active.get(dst, 0) + delta
            if count:
                active[dst] = count
            else:
                del active[dst]
        if not active:
            continue
        targets = frozenset(active)
        nxt = unions.get(targets)
        if nxt is None:
            nxt = frozenset().union(*(closure_of(t) for t in targets))
            unions[targets] = nxt
        if groups and groups[-1][1] == a and groups[-1][2] is nxt:
            groups[-1] = (groups[-1][0], b, nxt)  # adjacent ranges going to the same subset: one range
        else:
            groups.append((a, b, nxt))
    return groups


class ByteNFA:
    """A Thompson-style NFA under construction: byte-range edges, epsilon edges and anchor-marker edges."""

    __slots__ = ("edges", "epsilon", "markers", "calls")

    def __init__(self) -> None:
        self.edges: list[list[tuple[int, int, int]]] = []
        self.epsilon: list[list[int]] = []
        self.markers: list[list[tuple[int, int]]] = []
        self.calls: list[list[tuple[int, int]]] = []

    def new_state(self) -> int:
        if len(self.edges) >= MAX_NFA_STATES:
            raise AutomatonTooLarge(f"the automaton needs more than {MAX_NFA_STATES:,} NFA states")
        if len(self.edges) % 4096 == 0:
            check_deadline()
        self.edges.append([])
        self.epsilon.append([])
        self.markers.append([])
        self.calls.append([])
        return len(self.edges) - 1

    def add_epsilon(self, src: int, dst: int) -> None:
        self.epsilon[src].append(dst)

    def add_marker(self, src: int, marker: int, dst: int) -> None:
        self.markers[src].append((marker, dst))

    def add_bytes(self, src: int, lo: int, hi: int, dst: int) -> None:
        self.edges[src].append((lo, hi, dst))

    def add_call(self, src: int, rule: int, dst: int) -> None:
        """An edge that reads one whole match of grammar rule ``rule`` (a pushdown call)."""
        self.calls[src].append((rule, dst))

    def add_code_points(self, src: int, ranges: Sequence[tuple[int, int]], dst: int) -> None:
        """Edges from ``src`` to ``dst`` reading exactly one UTF-8 encoded code point from ``ranges``.

        Byte-range sequences that share a leading range share their first intermediate state, so large
        classes stay small.
        """
        if len(ranges) == 1 and ranges[0][1] < 0x80:
            self.add_bytes(src, ranges[0][0], ranges[0][1], dst)
            return
        prefix_states: dict[tuple[tuple[int, int], ...], int] = {(): src}
        for lo, hi in ranges:
            for seq in utf8_sequences(lo, hi):
                state = src
                for depth in range(len(seq) - 1):
                    key = tuple(seq[: depth + 1])
                    nxt = prefix_states.get(key)
                    if nxt is None:
                        nxt = self.new_state()
                        prefix_states[key] = nxt
                        self.add_bytes(state, seq[depth][0], seq[depth][1], nxt)
                    state = nxt
                self.add_bytes(state, seq[-1][0], seq[-1][1], dst)

    def _closure(self, states: Iterable[int], marker: int | None) -> frozenset[int]:
        """Epsilon closure, also following edges labelled ``marker`` when given."""
        seen = set(states)
        stack = list(seen)
        while stack:
            s = stack.pop()
            nexts = list(self.epsilon[s])
            if marker is not None:
                nexts.extend(dst for m, dst in self.markers[s] if m == marker)
            for t in nexts:
                if t not in seen:
                    seen.add(t)
                    stack.append(t)
        return frozenset(seen)

    def determinize(self, start: int, accept: int) -> ByteDFA:
        """Subset construction to a trimmed, minimised :class:`ByteDFA`."""
        epsilon, edges = self.epsilon, self.edges
        closures: dict[int, frozenset[int]] = {}
        unions: dict[frozenset[int], frozenset[int]] = {}

        def closure_of(state: int) -> frozenset[int]:
            c = closures.get(state)
            if c is None:
                c = self._closure([state], None) if epsilon[state] else frozenset((state,))
                closures[state] = c
            return c

        # NFA states from which END markers and epsilons alone reach acceptance.
        ending = self._reaching(accept, END) if any(self.markers) else None
        start_set = self._closure([start], BEGIN)
        index = {start_set: 0}
        subsets = [start_set]
        accepting: list[bool] = []
        filled: list[tuple[int, int, int, int]] = []  # (dfa state, first byte, end byte, target)
        called: list[tuple[int, int, int]] = []  # (dfa state, rule, target)
        calls = self.calls
        i = 0
        while i < len(subsets):
            if i % 128 == 0:
                check_deadline()
            subset = subsets[i]
            accepting.append(accept in subset if ending is None else not ending.isdisjoint(subset))
            out = [e for s in subset for e in edges[s]]
            if len(out) == 1:
                lo, hi, dst = out[0]
                groups = [(lo, hi + 1, closure_of(dst))]
            else:
                groups = _byte_groups(out, closure_of, unions)
            for a, b, nxt in groups:
                j = index.get(nxt)
                if j is None:
                    if len(subsets) >= MAX_DFA_STATES:
                        raise AutomatonTooLarge(f"the automaton needs more than {MAX_DFA_STATES:,} DFA states")
                    j = index[nxt] = len(subsets)
                    subsets.append(nxt)
                filled.append((i, a, b, j))
            by_rule: dict[int, frozenset[int]] = {}
            for s in subset:
                for rule, dst in calls[s]:
                    by_rule[rule] = by_rule.get(rule, frozenset()) | closure_of(dst)
            for rule, nxt in by_rule.items():
                j = index.get(nxt)
                if j is None:
                    j = index[nxt] = len(subsets)
                    subsets.append(nxt)
                called.append((i, rule, j))
            i += 1
        trans = np.full((len(subsets), 256), DEAD, dtype=np.int32)
        for state, a, b, target in filled:
            trans[state, a:b] = target
        callees = tuple(sorted({rule for _, rule, _ in called}))
        column = {rule: k for k, rule in enumerate(callees)}
        call_table = np.full((len(subsets), len(callees)), DEAD, dtype=np.int32)
        for state, rule, target in called:
            call_table[state, column[rule]] = target
        dfa = ByteDFA(trans, np.array(accepting, dtype=bool), call_table, callees)
        return dfa.trimmed().minimized()

    def _reaching(self, target: int, marker: int) -> set[int]:
        """The states from which epsilon and ``marker`` edges alone reach ``target``."""
        reverse: dict[int, list[int]] = {}
        for s, outs in enumerate(self.epsilon):
            for t in outs:
                reverse.setdefault(t, []).append(s)
        for s, outs in enumerate(self.markers):
            for m, t in outs:
                if m == marker:
                    reverse.setdefault(t, []).append(s)
        seen = {target}
        stack = [target]
        while stack:
            for s in reverse.get(stack.pop(), ()):
                if s not in seen:
                    seen.add(s)
                    stack.append(s)
        return seen


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

    @property
    def is_empty(self) -> bool:
        """True when the automaton matches nothing at all."""
        return not bool(self.accepting.any())

    def _edges(self) -> np.ndarray:
        """Byte and call columns side by side (what trimming and minimisation look at)."""
        return np.ascontiguousarray(np.hstack([self.trans, self.calls])) if self.callees else self.trans

    def trimmed(self) -> ByteDFA:
        """Drop the states that cannot reach acceptance (every state is reachable by construction)."""
        alive = _coreachable(self._edges(), self.accepting)
        if not alive[0]:
            empty = np.full((1, 256), DEAD, dtype=np.int32)
            return ByteDFA(empty, np.zeros(1, dtype=bool), np.full((1, len(self.callees)), DEAD, np.int32), self.callees)
        if alive.all():
            return self
        keep = np.nonzero(alive)[0]
        remap = np.full(self.num_states + 1, DEAD, dtype=np.int32)  # the last entry stands for DEAD (-1)
        remap[keep] = np.arange(len(keep), dtype=np.int32)
        return ByteDFA(remap[self.trans[keep]], self.accepting[keep].copy(), remap[self.calls[keep]], self.callees)

    def minimized(self) -> ByteDFA:
        """The equivalent DFA with the fewest states (Hopcroft's partition refinement over byte classes)."""
        if self.num_states <= 1:
            return self
        edges = self._edges()
        # Bytes that behave identically in every state form one class; refine over classes only.
        columns = np.ascontiguousarray(edges[:, _byte_classes(edges)[0]])
        block_of = _hopcroft(columns, self.accepting)
        num_blocks = int(block_of.max()) + 1
        if num_blocks == self.num_states:
            return self
        # Renumber blocks in BFS order from the start, so state 0 stays the start.
        order = _bfs_order(edges, block_of, num_blocks)
        new_of_state = order[block_of]
        renamed = np.where(edges >= 0, new_of_state[np.maximum(edges, 0)], DEAD)
        merged = np.full((num_blocks, edges.shape[1]), DEAD, dtype=np.int32)
        merged[new_of_state] = renamed  # every state of a block has the same row up to block renaming
        accepting = np.zeros(num_blocks, dtype=bool)
        accepting[new_of_state] = self.accepting
        trans = np.ascontiguousarray(merged[:, :256])
        return ByteDFA(trans, accepting, np.ascontiguousarray(merged[:, 256:]), self.callees)

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
    trans = np.ascontiguousarray(trans, dtype=np.int32)
    reps, class_of = _byte_classes(trans)
    # The sum over bytes is linear, so the bytes of one class (identical columns) are summed once, with the sum
    # of their multipliers: the hash does not depend on how a DFA's classes fall.
    multipliers = np.zeros(len(reps), dtype=np.uint64)
    with np.errstate(over="ignore"):
        np.add.at(multipliers, class_of, _HASH_MULTIPLIERS)
    return _bounded_hashes(np.ascontiguousarray(trans[:, reps]), accepting, depth, multipliers)


@njit(cache=True)
def _mix64(x):
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


@njit(cache=True)
def _bounded_hashes(columns, accepting, depth, multipliers):
    """Round k hashes each state's acceptance with the round k-1 hashes of its targets (the dead state has a
    constant hash), weighted per byte class; ``depth`` rounds."""
    n, width = columns.shape
    base = np.empty(n, dtype=np.uint64)
    for s in range(n):
        base[s] = np.uint64(0x2545F4914F6CDD1D) if accepting[s] else np.uint64(0x3C6EF372FE94F82B)
    hashes = np.empty(n, dtype=np.uint64)
    for s in range(n):
        hashes[s] = _mix64(base[s])
    nxt = np.empty(n, dtype=np.uint64)
    dead = np.uint64(0x9E3779B97F4A7C15)
    for _ in range(depth):
        for s in range(n):
            acc = np.uint64(0)
            for c in range(width):
                t = columns[s, c]
                acc += (hashes[t] if t >= 0 else dead) * multipliers[c]
            nxt[s] = _mix64(acc ^ base[s])
        hashes, nxt = nxt, hashes
    return hashes


# --------------------------------------------------------------------------------------------------------------
# Kernels


@njit(cache=True)
def _coreachable(trans, accepting):
    """Which states can reach an accepting state (reverse breadth-first search)."""
    n, width = trans.shape
    counts = np.zeros(n + 1, dtype=np.int64)
    for s in range(n):
        for b in range(width):
            t = trans[s, b]
            if t >= 0:
                counts[t + 1] += 1
    ptr = np.cumsum(counts)
    fill = ptr[:-1].copy()
    preds = np.empty(ptr[-1], dtype=np.int32)
    for s in range(n):
        for b in range(width):
            t = trans[s, b]
            if t >= 0:
                preds[fill[t]] = s
                fill[t] += 1
    alive = accepting.copy()
    queue = np.empty(n, dtype=np.int32)
    head, tail = 0, 0
    for s in range(n):
        if alive[s]:
            queue[tail] = s
            tail += 1
    while head < tail:
        t = queue[head]
        head += 1
        for k in range(ptr[t], ptr[t + 1]):
            s = preds[k]
            if not alive[s]:
                alive[s] = True
                queue[tail] = s
                tail += 1
    return alive


@njit(cache=True)
def _hopcroft(columns, accepting):
    """Hopcroft's DFA minimisation. ``columns`` is (n, k): one column per byte class, -1 for dead.

    Returns the block (equivalence class) of each state. The dead state takes part as state ``n``.
    """
    n, k = columns.shape
    m = n + 1
    # Predecessor lists per (class, target), the dead state included.
    counts = np.zeros((k, m + 1), dtype=np.int64)
    for c in range(k):
        for s in range(m):
            t = columns[s, c] if s < n else -1
            counts[c, (t if t >= 0 else n) + 1] += 1
    ptr = np.empty((k, m + 1), dtype=np.int64)
    for c in range(k):
        acc = 0
        for t in range(m + 1):
            acc += counts[c, t]
            ptr[c, t] = acc
    preds = np.empty((k, m), dtype=np.int32)
    fill = ptr[:, :m].copy()
    for c in range(k):
        for s in range(m):
            t = columns[s, c] if s < n else -1
            t = t if t >= 0 else n
            preds[c, fill[c, t]] = s
            fill[c, t] += 1
    # Partition as ranges of a permutation of the states.
    elements = np.empty(m, dtype=np.int32)
    location = np.empty(m, dtype=np.int32)
    block_of = np.empty(m, dtype=np.int32)
    first = np.empty(m + 1, dtype=np.int32)
    end = np.empty(m + 1, dtype=np.int32)
    marked = np.zeros(m + 1, dtype=np.int32)
    pos = 0
    num_blocks = 0
    for want in (True, False):
        start = pos
        for s in range(m):
            is_accepting = accepting[s] if s < n else False
            if is_accepting == want:
                elements[pos] = s
                location[s] = pos
                block_of[s] = num_blocks
                pos += 1
        if pos > start:
            first[num_blocks] = start
            end[num_blocks] = pos
            num_blocks += 1
    in_work = np.zeros((m + 1, k), dtype=np.bool_)
    work_block = np.empty((m + 1) * k, dtype=np.int32)
    work_class = np.empty((m + 1) * k, dtype=np.int32)
    work_len = 0
    for b in range(num_blocks):
        for c in range(k):
            in_work[b, c] = True
            work_block[work_len] = b
            work_class[work_len] = c
            work_len += 1
    splitter = np.empty(m, dtype=np.int32)
    touched = np.empty(m + 1, dtype=np.int32)
    while work_len > 0:
        work_len -= 1
        b = work_block[work_len]
        c = work_class[work_len]
        in_work[b, c] = False
        size = end[b] - first[b]
        for i in range(size):
            splitter[i] = elements[first[b] + i]
        num_touched = 0
        for i in range(size):
            t = splitter[i]
            for q in range(ptr[c, t], ptr[c, t + 1]):
                p = preds[c, q]
                bp = block_of[p]
                boundary = first[bp] + marked[bp]
                if location[p] < boundary:
                    continue
                if marked[bp] == 0:
                    touched[num_touched] = bp
                    num_touched += 1
                other = elements[boundary]
                elements[boundary] = p
                elements[location[p]] = other
                location[other] = location[p]
                location[p] = boundary
                marked[bp] += 1
        for j in range(num_touched):
            bp = touched[j]
            count = marked[bp]
            marked[bp] = 0
            if count == end[bp] - first[bp]:
                continue
            new = num_blocks
            num_blocks += 1
            first[new] = first[bp]
            end[new] = first[bp] + count
            first[bp] = end[new]
            for i in range(first[new], end[new]):
                block_of[elements[i]] = new
            smaller = new if count <= end[bp] - first[bp] else bp
            for cc in range(k):
                if in_work[bp, cc]:
                    in_work[new, cc] = True
                    work_block[work_len] = new
                    work_class[work_len] = cc
                    work_len += 1
                elif not in_work[smaller, cc]:
                    in_work[smaller, cc] = True
                    work_block[work_len] = smaller
                    work_class[work_len] = cc
                    work_len += 1
    # Blocks numbered 0.. without the dead state's block.
    dead_block = block_of[n]
    out = np.empty(n, dtype=np.int32)
    for s in range(n):
        b = block_of[s]
        out[s] = b if b < dead_block else b - 1
    return out


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
def _byte_classes(trans):
    """Bytes whose columns of ``trans`` are identical form a class (hash, then verify exactly): one
    representative byte per class, and each byte's class."""
    n, width = trans.shape
    hashes = np.empty(width, dtype=np.uint64)
    for b in range(width):
        h = np.uint64(1469598103934665603)
        for s in range(n):
            h = (h ^ np.uint64(trans[s, b] + 2)) * np.uint64(1099511628211)
        hashes[b] = h
    reps = np.empty(width, dtype=np.int64)
    class_of = np.empty(width, dtype=np.int64)
    num = 0
    for b in range(width):
        found = -1
        for r in range(num):
            other = reps[r]
            if hashes[other] != hashes[b]:
                continue
            same = True
            for s in range(n):
                if trans[s, b] != trans[s, other]:
                    same = False
                    break
            if same:
                found = r
                break
        if found < 0:
            reps[num] = b
            found = num
            num += 1
        class_of[b] = found
    return reps[:num], class_of
