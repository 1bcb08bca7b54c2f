"""Automata over Unicode code points (:class:`_CDFA`): built from regexes or byte DFAs, combined (intersection,
difference), minimised, escaped as JSON string bodies, and written back as regex ASTs or byte DFAs.
"""

from __future__ import annotations

from collections import defaultdict
from itertools import chain

import numpy as np

from constrain.automata.dfa import ByteDFA
from constrain.automata.limits import MAX_NFA_STATES, check_deadline
from constrain.automata.nfa import determinize_arrays
from constrain.automata.regex import regex_to_dfa, search_dfa
from constrain.compilers.json_schema.cdfa_kernels import (
    _IS_SPECIAL,
    _SPECIAL_CODES,
    _byte_nfa_flat,
    _cdfa_from_bytes_flat,
    _encode_json_flat,
    _is_empty_flat,
    _minimize_flat,
    _product_flat,
)
from constrain.compilers.json_schema.errors import _check_time, _TooLarge
from constrain.compilers.json_schema.regex_ast import _EPS, _FULL, _merge_ranges, _r_alt, _r_cat, _r_set, _r_star
from constrain.errors import AutomatonTooLarge, RegexError

# Automata here are immutable once made: an operation's result keeps flat arrays (see :class:`_CDFA`), and its
# lists of tuples, when read, are a copy of them that nothing may change.

#: Largest regex text written for one derived string/number language (characters).
MAX_REGEX_CHARS = 60_000
#: Most automaton states of one derived string/number language.
MAX_AUTOMATON_STATES = 4_000


class _CDFA:
    """A DFA over Unicode code points (or small symbol alphabets): ``edges[s]`` are sorted disjoint
    ``(lo, hi, target)``; state 0 is the start. Used to combine string and number constraints exactly
    (intersection, difference, escaping) before writing the result back as a regex or a byte DFA.

    The operations (:meth:`intersect`, :meth:`minus`, :meth:`minimized`, :meth:`encode_json`,
    :meth:`to_byte_dfa`) are numba kernels over flat arrays (``ptr, lo, hi, to, acc``): a result holds only
    those, and its ``edges`` and ``accept`` lists are written out the first time something reads them. An
    automaton made from lists is read into arrays by each operation (its lists may still be changed until then:
    a builder may set ``accept`` after making it)."""

    __slots__ = ("_edges", "_accept", "_flat")

    def __init__(self, edges: list[list[tuple[int, int, int]]], accept: list[bool]):
        self._edges = edges
        self._accept = accept
        self._flat: tuple | None = None

    @classmethod
    def _of_flat(cls, flat: tuple) -> _CDFA:
        d = cls.__new__(cls)
        d._edges = d._accept = None
        d._flat = flat
        return d

    @property
    def edges(self) -> list[list[tuple[int, int, int]]]:
        if self._edges is None:
            self._write_out()
        return self._edges

    @property
    def accept(self) -> list[bool]:
        if self._accept is None:
            self._write_out()
        return self._accept

    def _write_out(self) -> None:
        ptr, lo, hi, to, acc = self._flat
        bounds, lo, hi, to = ptr.tolist(), lo.tolist(), hi.tolist(), to.tolist()
        self._edges = [list(zip(lo[a:b], hi[a:b], to[a:b])) for a, b in zip(bounds, bounds[1:])]
        self._accept = acc.tolist()

    def flat(self) -> tuple:
        """``(ptr, lo, hi, to, acc)``: kept for a result, read from the lists each time otherwise."""
        if self._flat is not None:
            return self._flat
        edges, accept = self._edges, self._accept
        ptr = np.zeros(len(accept) + 1, dtype=np.int64)
        np.cumsum([len(row) for row in edges], out=ptr[1:])
        flat = np.fromiter(chain.from_iterable(chain.from_iterable(edges)), dtype=np.int64, count=3 * int(ptr[-1]))
        flat = flat.reshape(-1, 3)
        return (
            ptr, np.ascontiguousarray(flat[:, 0]), np.ascontiguousarray(flat[:, 1]),
            np.ascontiguousarray(flat[:, 2]), np.array(accept, dtype=np.bool_),
        )  # fmt: skip

    def frozen(self) -> _CDFA:
        """The same automaton holding only its flat arrays, which each operation then reads as they are: for one
        kept and combined many times (a cached one), instead of reading its lists into arrays at every use."""
        return self if self._flat is not None else _CDFA._of_flat(self.flat())

    @property
    def n(self) -> int:
        return len(self._accept) if self._accept is not None else int(self._flat[4].shape[0])

    @property
    def num_edges(self) -> int:
        """Its edges, counted without writing out the lists of a result that holds only flat arrays."""
        return sum(map(len, self._edges)) if self._edges is not None else int(self._flat[0][-1])

    @staticmethod
    def empty() -> _CDFA:
        return _CDFA([[]], [False])

    @staticmethod
    def universal(ranges=_FULL) -> _CDFA:
        return _CDFA([[(lo, hi, 0) for lo, hi in ranges]], [True])

    @staticmethod
    def literals(strings) -> _CDFA:
        edges: list[dict[int, int]] = [{}]
        accept = [False]
        for text in strings:
            s = 0
            for ch in text:
                cp = ord(ch)
                nxt = edges[s].get(cp)
                if nxt is None:
                    nxt = len(accept)
                    edges[s][cp] = nxt
                    edges.append({})
                    accept.append(False)
                s = nxt
            accept[s] = True
        return _CDFA([[(cp, cp, t) for cp, t in sorted(e.items())] for e in edges], accept)

    @staticmethod
    def length(lo: int, hi: int | None, ranges=_FULL) -> _CDFA:
        count = (hi if hi is not None else lo) + 1
        if count > MAX_AUTOMATON_STATES:
            raise _TooLarge("length bound")
        edges = []
        for i in range(count):
            nxt = i + 1 if i + 1 < count else (i if hi is None else None)
            edges.append([] if nxt is None else [(a, b, nxt) for a, b in ranges])
        return _CDFA(edges, [i >= lo for i in range(count)])

    @staticmethod
    def from_regex(pattern: str, *, search: bool = False) -> _CDFA:
        """The strings ``pattern`` matches, or with ``search`` the strings in which it matches somewhere."""
        try:
            dfa = search_dfa(pattern) if search else regex_to_dfa(pattern)
        except RegexError as exc:
            if "matches no string" in str(exc):
                return _CDFA.empty()
            raise
        except AutomatonTooLarge as exc:  # a budget like the compiler's own: refused or relaxed where it is used
            raise _TooLarge(str(exc)) from None
        return _CDFA.of_text(dfa)

    @staticmethod
    def of_text(dfa: ByteDFA) -> _CDFA:
        """The language of a byte DFA over UTF-8 text, over code points."""
        return _CDFA._of_flat(_cdfa_from_bytes_flat(dfa.trans, dfa.accepting))

    def is_empty(self) -> bool:
        if self._flat is not None:
            ptr, _, _, to, acc = self._flat
            return bool(_is_empty_flat(ptr, to, acc))
        seen, stack = {0}, [0]
        while stack:
            s = stack.pop()
            if self.accept[s]:
                return False
            for _, _, t in self.edges[s]:
                if t not in seen:
                    seen.add(t)
                    stack.append(t)
        return True

    def accepts(self, text: str) -> bool:
        s = 0
        for ch in text:
            cp = ord(ch)
            for lo, hi, t in self.edges[s]:
                if lo <= cp <= hi:
                    s = t
                    break
            else:
                return False
        return self.accept[s]

    def intersect(self, other: _CDFA) -> _CDFA:
        return _product(self, other, False)

    def minus(self, other: _CDFA) -> _CDFA:
        return _product(self, other, True)

    def length_range(self) -> tuple[int, int | None]:
        """Shortest and longest accepted lengths (None: unbounded); the DFA must be trimmed."""
        dist = {0: 0}
        frontier = [0]
        shortest = None
        while frontier:
            nxt = []
            for s in frontier:
                if self.accept[s] and shortest is None:
                    shortest = dist[s]
                for _, _, t in self.edges[s]:
                    if t not in dist:
                        dist[t] = dist[s] + 1
                        nxt.append(t)
            frontier = nxt
        # longest: cycle -> unbounded; else longest path in a DAG
        color = [0] * self.n
        longest: dict[int, int] = {}

        def visit(s: int) -> int | None:
            stack = [(s, iter(self.edges[s]))]
            color[s] = 1
            while stack:
                state, it = stack[-1]
                advanced = False
                for _, _, t in it:
                    if color[t] == 1:
                        return None
                    if color[t] == 0:
                        color[t] = 1
                        stack.append((t, iter(self.edges[t])))
                        advanced = True
                        break
                if not advanced:
                    stack.pop()
                    color[state] = 2
                    best = 0 if self.accept[state] else -1
                    for _, _, t in self.edges[state]:
                        if longest[t] >= 0:
                            best = max(best, longest[t] + 1)
                    longest[state] = best
            return longest[s]

        top = visit(0)
        return (shortest or 0), (None if top is None else top)

    def minimized(self) -> _CDFA:
        return _minimize(self)

    def from_state(self, start: int, accept_only: int | None = None) -> _CDFA:
        """The same automaton started at ``start`` (accepting only in ``accept_only`` when given)."""
        index = {start: 0}
        order = [start]
        edges = []
        i = 0
        while i < len(order):
            row = []
            for lo, hi, t in self.edges[order[i]]:
                if t not in index:
                    index[t] = len(order)
                    order.append(t)
                row.append((lo, hi, index[t]))
            edges.append(row)
            i += 1
        accept = [self.accept[s] if accept_only is None else s == accept_only for s in order]
        return _CDFA(edges, accept)

    def encode_json(self) -> _CDFA:
        """The language of canonical JSON string bodies whose decoded text this DFA accepts: each state reads the
        characters a string may hold as they are, and a backslash into a trie of the escapes of the others (its
        states numbered after every state of this DFA)."""
        return _CDFA._of_flat(_encode_json_flat(*self.flat(), _SPECIAL_CODES, _IS_SPECIAL))

    def to_ast(self, budget: int = MAX_REGEX_CHARS) -> tuple | None:
        return _eliminate(self, budget)

    def to_byte_dfa(self, quoted: bool = False) -> ByteDFA:
        """The same language over UTF-8 bytes (between double quotes when ``quoted``), trimmed and minimised."""
        edges, eps, size, start, accept = _byte_nfa_flat(*self.flat(), quoted)
        if size > MAX_NFA_STATES:
            raise AutomatonTooLarge(f"the automaton needs more than {MAX_NFA_STATES:,} NFA states")
        return determinize_arrays(edges, eps, _NO_CALLS, None, size, start, accept)


_NO_CALLS = np.zeros(0, dtype=np.int32)


def _merge_edges(edges: list[tuple[int, int, int]]) -> list[tuple[int, int, int]]:
    edges = sorted(edges)
    out: list[tuple[int, int, int]] = []
    for lo, hi, t in edges:
        if out and out[-1][2] == t and out[-1][1] + 1 == lo:
            out[-1] = (out[-1][0], hi, t)
        else:
            out.append((lo, hi, t))
    return out


def _product(a: _CDFA, b: _CDFA, minus: bool) -> _CDFA:
    """Pairs of states of ``a`` and ``b`` reached from the start: both accept (intersection), or ``a`` accepts
    and ``b`` does not (difference, where a pair may be outside ``b``). _TooLarge past 4 x
    :data:`MAX_AUTOMATON_STATES` pairs."""
    _check_time()
    status, *flat = _product_flat(*a.flat(), *b.flat(), minus, MAX_AUTOMATON_STATES * 4)
    if status:
        raise _TooLarge("product automaton")
    _check_time()
    return _CDFA._of_flat(tuple(flat))


def _minimize(d: _CDFA) -> _CDFA:
    """The trimmed minimal automaton of ``d``, numbered breadth first with edges read in order."""
    check_deadline()
    return _CDFA._of_flat(_minimize_flat(*d.flat()))


def _eliminate(d: _CDFA, budget: int) -> tuple | None:
    """State elimination: a regex AST for the language of ``d`` (None when empty); raises _TooLarge past
    ``budget`` characters."""
    n = d.n
    start, final = n, n + 1
    label: dict[tuple[int, int], tuple] = {}
    succ: dict[int, set[int]] = defaultdict(set)
    pred: dict[int, set[int]] = defaultdict(set)

    def add(p: int, q: int, node: tuple) -> None:
        new = _r_alt(label.get((p, q)), node)
        if new[1] > budget:
            raise _TooLarge("regex")
        if len(label) % 256 == 0:
            _check_time()
        label[(p, q)] = new
        succ[p].add(q)
        pred[q].add(p)

    for s in range(n):
        by_target: dict[int, list[tuple[int, int]]] = defaultdict(list)
        for lo, hi, t in d.edges[s]:
            by_target[t].append((lo, hi))
        for t, ranges in by_target.items():
            add(s, t, _r_set(_merge_ranges(ranges)))
        if d.accept[s]:
            add(s, final, _EPS)
    add(start, 0, _EPS)
    remaining = set(range(n))
    while remaining:
        s = min(remaining, key=lambda x: (len(pred[x] - {x}) * len(succ[x] - {x}), -x))
        remaining.discard(s)
        loop = label.pop((s, s), None)
        middle = _r_star(loop) if loop is not None else _EPS
        ins = [p for p in pred[s] if p != s]
        outs = [q for q in succ[s] if q != s]
        for p in ins:
            for q in outs:
                add(p, q, _r_cat(label[(p, s)], middle, label[(s, q)]))
        for p in ins:
            label.pop((p, s), None)
            succ[p].discard(s)
        for q in outs:
            label.pop((s, q), None)
            pred[q].discard(s)
        pred.pop(s, None)
        succ.pop(s, None)
    return label.get((start, final))
