"""Byte-level NFAs: the builder every structure's automaton starts from.

Structures are compiled to automata over *bytes*, not characters, because tokens are byte strings: a token
can end in the middle of a UTF-8 character. Character sets are expanded to UTF-8 byte-range sequences here.

Two zero-width markers model the anchors ``^`` and ``$`` exactly: an edge labelled ``BEGIN`` may only be taken
before any byte is read, an edge labelled ``END`` only after the last one. The subset construction folds them
into the start state and into acceptance, so the resulting :class:`ByteDFA` has byte edges only.

"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import chain

import numpy as np

from constrain.automata.determinize import (
    _NO_PAIRS,
    _WORK_PER_SLICE,
    _determinize_in_one_slice,
    _index_nfa,
    _new_work,
    _reduced_subsets,
    _subset_construction,
)
from constrain.automata.dfa import ByteDFA
from constrain.automata.limits import (
    MAX_DFA_STATES,
    MAX_NFA_STATES,
    MAX_SUBSET_MEMBERS,
    MAX_TABLE_CELLS,
    check_deadline,
)
from constrain.automata.utf8 import _utf8_paths
from constrain.errors import AutomatonTooLarge

#: Marker labels (outside the byte range 0-255) for the anchors.
BEGIN = 256
END = 257


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

    def mark(self) -> tuple[int, int, int, int, int]:
        """Where the construction stands: its states and the lengths of its edge lists (see :meth:`replicate`)."""
        return self.size, len(self._bytes), len(self._epsilon), len(self._markers), len(self._calls)

    def markers_since(self, mark: tuple[int, int, int, int, int]) -> bool:
        """Whether marker or call edges were added since ``mark``."""
        return len(self._markers) != mark[3] or len(self._calls) != mark[4]

    def replicate(self, mark: tuple[int, int, int, int, int], src: int, dst: int, pairs: list[tuple[int, int]]) -> None:
        """Copy the fragment built since ``mark`` from ``src`` to ``dst`` (its byte and epsilon edges, which join
        ``src``, ``dst`` and the states made since ``mark``) between each ``(src, dst)`` of ``pairs``, each copy
        with states of its own. The fragment may have no marker or call edges."""
        size, num_bytes, num_epsilon = mark[:3]
        if self.markers_since(mark):
            raise ValueError("replicate copies byte and epsilon edges only")
        inner = self.size - size
        if self.size + inner * len(pairs) > MAX_NFA_STATES:
            raise AutomatonTooLarge(f"the automaton needs more than {MAX_NFA_STATES:,} NFA states")
        ends = np.array(pairs, dtype=np.int64)
        starts, stops = ends[:, :1], ends[:, 1:]
        offsets = self.size - size + inner * np.arange(len(pairs), dtype=np.int64)[:, None]

        def moved(states: np.ndarray) -> np.ndarray:  # (edges,) -> (copies, edges)
            return np.where(states == src, starts, np.where(states == dst, stops, states + offsets))

        edges = np.array(self._bytes[num_bytes:], dtype=np.int64).reshape(-1, 4)
        copied = np.empty((len(pairs), len(edges), 4), dtype=np.int64)
        copied[:, :, 0], copied[:, :, 3] = moved(edges[:, 0]), moved(edges[:, 3])
        copied[:, :, 1], copied[:, :, 2] = edges[:, 1], edges[:, 2]
        self._bytes += copied.ravel().tolist()
        edges = np.array(self._epsilon[num_epsilon:], dtype=np.int64).reshape(-1, 2)
        copied = np.empty((len(pairs), len(edges), 2), dtype=np.int64)
        copied[:, :, 0], copied[:, :, 1] = moved(edges[:, 0]), moved(edges[:, 1])
        self._epsilon += copied.ravel().tolist()
        self.size += inner * len(pairs)
        check_deadline()

    def determinize(self, start: int, accept: int, *, work_per_slice: int | None = None) -> ByteDFA:
        """Subset construction to a trimmed, minimised :class:`ByteDFA`.

        ``BEGIN`` markers are followed from the start only; a subset accepts when one of its states reaches
        ``accept`` through epsilons and ``END`` markers. Subsets keep only the states that read something or
        accept, so equivalent subsets meet. One kernel call does it all when one slice of work finishes the
        subset construction (almost every rule); a larger automaton is built again in slices, with the time limit
        checked in between. ``work_per_slice`` (states visited) defaults to a few milliseconds' worth."""
        markers = np.array(self._markers, dtype=np.int32) if self._markers else None
        return determinize_arrays(
            np.array(self._bytes, dtype=np.int32), np.array(self._epsilon, dtype=np.int32),
            np.array(self._calls, dtype=np.int32), markers, self.size, start, accept, work_per_slice=work_per_slice,
        )  # fmt: skip


def determinize_arrays(
    byte_flat: np.ndarray,
    eps_flat: np.ndarray,
    call_flat: np.ndarray,
    markers: np.ndarray | None,
    n: int,
    start: int,
    accept: int,
    *,
    work_per_slice: int | None = None,
) -> ByteDFA:
    """:meth:`ByteNFA.determinize` of an NFA given as flat int32 edge arrays (``src, lo, hi, dst`` per byte edge,
    ``src, dst`` per epsilon, ``src, rule, dst`` per call, ``src, marker, dst`` per anchor marker or None) over
    ``n`` states: what an automaton built by a kernel rather than by :class:`ByteNFA` hands over."""
    work_per_slice = _WORK_PER_SLICE if work_per_slice is None else work_per_slice
    begin = end = _NO_PAIRS
    if markers is not None and len(markers):
        markers = markers.reshape(-1, 3)
        begin = np.ascontiguousarray(markers[markers[:, 1] == BEGIN][:, [0, 2]])
        end = np.ascontiguousarray(markers[markers[:, 1] == END][:, [0, 2]])
    check_deadline()
    status, finished, trans, accepting, calls, used, num_calls = _determinize_in_one_slice(
        byte_flat, eps_flat, call_flat, begin, end, n, start, accept, work_per_slice, MAX_DFA_STATES,
        MAX_SUBSET_MEMBERS, MAX_TABLE_CELLS,
    )  # fmt: skip
    if not finished and not status:  # a large automaton: again, in slices with the time limit between them
        nfa = _index_nfa(byte_flat, eps_flat, call_flat, begin, end, n, accept)
        byte_class, num_classes, num_rules, rule_ids = nfa[-4:]
        work = _new_work(64, num_classes, num_rules)
        done, count = 0, 0
        while not status:
            check_deadline()
            work, done, count, status = _subset_construction(
                start, *nfa[:-4], work, done, count, work_per_slice, MAX_DFA_STATES, MAX_SUBSET_MEMBERS,
                MAX_TABLE_CELLS,
            )  # fmt: skip
            if done == count:
                break
        if not status:
            trans, accepting, calls, used, num_calls = _reduced_subsets(
                work[3], work[4], work[5], count, byte_class, rule_ids
            )
    if status == 1:
        raise AutomatonTooLarge(f"the automaton needs more than {MAX_DFA_STATES:,} DFA states")
    if status == 2:
        raise AutomatonTooLarge(
            f"the automaton's subset construction needs more than {MAX_SUBSET_MEMBERS:,} NFA states in all its "
            "subsets (each DFA state stands for many NFA states)"
        )
    if status:
        raise AutomatonTooLarge(
            f"the automaton's transition table needs more than {MAX_TABLE_CELLS:,} cells (DFA states x (byte "
            "classes + rules called))"
        )
    dfa = ByteDFA(trans, accepting, calls, tuple(used.tolist()))
    dfa.__dict__["num_calls"] = num_calls  # counted by the kernel: a rule's first use would count it again
    return dfa


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
