"""Automata over Unicode code points (:class:`_CDFA`): built from regexes or byte DFAs, combined (intersection,
difference), minimised, escaped as JSON string bodies, and written back as regex ASTs or byte DFAs.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections import defaultdict

import numpy as np

from constrain.automata.dfa import ByteDFA
from constrain.automata.limits import check_deadline
from constrain.automata.minimize import column_classes, partial_dfa_blocks
from constrain.automata.nfa import ByteNFA
from constrain.automata.regex import regex_to_dfa
from constrain.compilers.json_schema.errors import _check_time, _TooLarge
from constrain.compilers.json_schema.regex_ast import _EPS, _FULL, _merge_ranges, _r_alt, _r_cat, _r_set, _r_star
from constrain.errors import AutomatonTooLarge, RegexError

#: Largest regex text written for one derived string/number language (characters).
MAX_REGEX_CHARS = 60_000
#: Most automaton states of one derived string/number language.
MAX_AUTOMATON_STATES = 4_000

_SPECIAL_ESCAPES = {0x22: '\\"', 0x5C: "\\\\", 0x08: "\\b", 0x0C: "\\f", 0x0A: "\\n", 0x0D: "\\r", 0x09: "\\t"}


def _escape_of(cp: int) -> str:
    return _SPECIAL_ESCAPES.get(cp) or f"\\u{cp:04x}"


#: The code points a JSON string must escape, in order.
_SPECIALS = [cp for cp in range(0x5D) if cp < 0x20 or cp in (0x22, 0x5C)]


class _CDFA:
    """A DFA over Unicode code points (or small symbol alphabets): ``edges[s]`` are sorted disjoint
    ``(lo, hi, target)``; state 0 is the start. Used to combine string and number constraints exactly
    (intersection, difference, escaping) before writing the result back as a regex."""

    __slots__ = ("edges", "accept")

    def __init__(self, edges: list[list[tuple[int, int, int]]], accept: list[bool]):
        self.edges = edges
        self.accept = accept

    @property
    def n(self) -> int:
        return len(self.accept)

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
    def from_regex(pattern: str) -> _CDFA:
        try:
            dfa = regex_to_dfa(pattern)
        except RegexError as exc:
            if "matches no string" in str(exc):
                return _CDFA.empty()
            raise
        except AutomatonTooLarge as exc:  # a budget like the compiler's own: refused or relaxed where it is used
            raise _TooLarge(str(exc)) from None
        return _cdfa_from_bytes(dfa.trans, dfa.accepting)

    def is_empty(self) -> bool:
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
        """The language of canonical JSON string bodies whose decoded text this DFA accepts."""
        edges: list[list[tuple[int, int, int]]] = []
        accept = list(self.accept)
        extra: list[dict] = []
        n = self.n
        tries: dict[int, int] = {}
        for s in range(n):
            out = []
            for lo, hi, t in self.edges[s]:
                # plain parts
                for a, b in _subtract_specials(lo, hi):
                    out.append((a, b, t))
                for cp in _SPECIALS[bisect_left(_SPECIALS, lo) : bisect_right(_SPECIALS, hi)]:
                    esc = _escape_of(cp)
                    node = tries.get(s)
                    if node is None:
                        node = tries[s] = n + len(extra)
                        extra.append({})
                        out.append((0x5C, 0x5C, node))
                    for i, ch in enumerate(esc[1:]):
                        table = extra[node - n]
                        if i == len(esc) - 2:
                            table[ord(ch)] = t
                        else:
                            nxt = table.get(ord(ch))
                            if nxt is None:
                                nxt = n + len(extra)
                                extra.append({})
                                table[ord(ch)] = nxt
                            node = nxt
            out.sort()
            edges.append(out)
        for table in extra:
            edges.append([(cp, cp, t) for cp, t in sorted(table.items())])
            accept.append(False)
        return _CDFA(edges, accept)

    def to_ast(self, budget: int = MAX_REGEX_CHARS) -> tuple | None:
        return _eliminate(self, budget)

    def to_byte_dfa(self, quoted: bool = False) -> ByteDFA:
        """The same language over UTF-8 bytes (between double quotes when ``quoted``), trimmed and minimised."""
        nfa = ByteNFA()
        states = [nfa.new_state() for _ in range(self.n)]
        accept = nfa.new_state()
        start = states[0]
        if quoted:
            start = nfa.new_state()
            nfa.add_bytes(start, 0x22, 0x22, states[0])
        for s, edges in enumerate(self.edges):
            by_target: dict[int, list[tuple[int, int]]] = defaultdict(list)
            for lo, hi, t in edges:
                by_target[t].append((lo, hi))
            for t, ranges in by_target.items():
                nfa.add_code_points(states[s], _merge_ranges(ranges), states[t])
            if self.accept[s]:
                if quoted:
                    nfa.add_bytes(states[s], 0x22, 0x22, accept)
                else:
                    nfa.add_epsilon(states[s], accept)
        return nfa.determinize(start, accept)


def _subtract_specials(lo: int, hi: int) -> list[tuple[int, int]]:
    out = []
    for a, b in ((0x20, 0x21), (0x23, 0x5B), (0x5D, 0x10FFFF)):
        x, y = max(lo, a), min(hi, b)
        if x <= y:
            out.append((x, y))
    return out


def _runs(row: np.ndarray, first: int) -> list[tuple[int, int, int]]:
    """Maximal runs of equal non-negative targets in ``row`` (indices offset by ``first``)."""
    out = []
    n = len(row)
    i = 0
    while i < n:
        t = int(row[i])
        j = i
        while j + 1 < n and row[j + 1] == t:
            j += 1
        if t >= 0:
            out.append((first + i, first + j, t))
        i = j + 1
    return out


def _cdfa_from_bytes(trans: np.ndarray, accepting: np.ndarray) -> _CDFA:
    """Collapse a byte DFA that reads valid UTF-8 into a DFA over code points."""
    memo: dict[tuple[int, int], list[tuple[int, int, int]]] = {}
    index = {0: 0}
    order = [0]
    edges: list[list[tuple[int, int, int]]] = []
    i = 0
    while i < len(order):
        s = order[i]
        out = list(_runs(trans[s, 0:0x80], 0))
        for lead in range(0xC2, 0xF5):
            t1 = int(trans[s, lead])
            if t1 < 0:
                continue
            k = 1 if lead < 0xE0 else 2 if lead < 0xF0 else 3
            base = (lead & (0x1F, 0x0F, 0x07)[k - 1]) << (6 * k)
            out.extend((base + a, base + b, t) for a, b, t in _continuations(trans, t1, k, memo))
        merged = []
        for lo, hi, t in _merge_edges(out):
            j = index.get(t)
            if j is None:
                j = index[t] = len(order)
                order.append(t)
            merged.append((lo, hi, j))
        edges.append(merged)
        i += 1
    return _CDFA(edges, [bool(accepting[s]) for s in order])


def _continuations(
    trans: np.ndarray, state: int, k: int, memo: dict[tuple[int, int], list[tuple[int, int, int]]]
) -> list[tuple[int, int, int]]:
    """The code-point edges ``(lo, hi, target)`` of the ``k`` continuation bytes read from ``state``, the value
    their bits make (memoised in ``memo`` per state and count)."""
    key = (state, k)
    if key in memo:
        return memo[key]
    out: list[tuple[int, int, int]] = []
    size = 64 ** (k - 1)
    for a, b, t in _runs(trans[state, 0x80:0xC0], 0):
        if k == 1:
            out.append((a, b, t))
            continue
        sub = _continuations(trans, t, k - 1, memo)
        if len(sub) == 1 and sub[0][0] == 0 and sub[0][1] == size - 1:
            out.append((a * size, (b + 1) * size - 1, sub[0][2]))
        else:
            for c in range(a, b + 1):
                out.extend((c * size + x, c * size + y, u) for x, y, u in sub)
    memo[key] = _merge_edges(out)
    return memo[key]


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
    index = {(0, 0): 0}
    order = [(0, 0)]
    edges: list[list[tuple[int, int, int]]] = []
    accept: list[bool] = []
    i = 0
    while i < len(order):
        sa, sb = order[i]
        if len(order) > MAX_AUTOMATON_STATES * 4:
            raise _TooLarge("product automaton")
        if i % 256 == 0:
            _check_time()
        eb = b.edges[sb] if sb >= 0 else []
        out = []
        j = 0
        for lo, hi, ta in a.edges[sa]:
            pos = lo
            while j < len(eb) and eb[j][1] < lo:
                j += 1
            k = j
            while k < len(eb) and eb[k][0] <= hi:
                blo, bhi, tb = eb[k]
                if minus and blo > pos:
                    out.append((pos, blo - 1, (ta, -1)))
                x, y = max(lo, blo), min(hi, bhi)
                if x <= y:
                    out.append((x, y, (ta, tb)))
                pos = max(pos, bhi + 1)
                if bhi > hi:
                    break
                k += 1
            if minus and pos <= hi:
                out.append((pos, hi, (ta, -1)))
        row = []
        for lo, hi, pair in out:
            t = index.get(pair)
            if t is None:
                t = index[pair] = len(order)
                order.append(pair)
            row.append((lo, hi, t))
        edges.append(_merge_edges(row))
        acc_b = sb >= 0 and b.accept[sb]
        accept.append(a.accept[sa] and (not acc_b if minus else acc_b))
        i += 1
    return _CDFA(edges, accept)


def _minimize(d: _CDFA) -> _CDFA:
    # reachable from the start
    seen = {0}
    stack = [0]
    while stack:
        s = stack.pop()
        for _, _, t in d.edges[s]:
            if t not in seen:
                seen.add(t)
                stack.append(t)
    # co-reachable
    rev: dict[int, list[int]] = defaultdict(list)
    for s in seen:
        for _, _, t in d.edges[s]:
            rev[t].append(s)
    alive = {s for s in seen if d.accept[s]}
    stack = list(alive)
    while stack:
        s = stack.pop()
        for p in rev[s]:
            if p not in alive:
                alive.add(p)
                stack.append(p)
    if 0 not in alive:
        return _CDFA.empty()
    states = sorted(alive)
    pos = {s: i for i, s in enumerate(states)}
    bounds = sorted(
        {lo for s in states for lo, _, t in d.edges[s] if t in alive}
        | {hi + 1 for s in states for _, hi, t in d.edges[s] if t in alive}
    )
    m = max(len(bounds) - 1, 0)
    rows = [[-1] * max(m, 1) for _ in states]  # lists: slice assignment in numpy costs a microsecond per edge
    for s in states:
        row = rows[pos[s]]
        for lo, hi, t in d.edges[s]:
            if t in alive:
                a = bisect_right(bounds, lo) - 1
                b = bisect_right(bounds, hi + 1) - 1
                row[a:b] = [pos[t]] * (b - a)
    check_deadline()
    table = np.array(rows, dtype=np.int32)
    columns = np.ascontiguousarray(table[:, column_classes(table)[0]])  # identical columns refine alike
    block_of = partial_dfa_blocks(columns, np.array([d.accept[s] for s in states], dtype=np.bool_)).tolist()
    # renumber blocks in BFS order from the start
    start_block = block_of[pos[0]]
    number = {start_block: 0}
    queue = [start_block]
    rep: dict[int, int] = {}
    for i, b in enumerate(block_of):
        rep.setdefault(b, i)
    edges: list[list[tuple[int, int, int]]] = []
    accept: list[bool] = []
    qi = 0
    while qi < len(queue):
        r = rep[queue[qi]]
        qi += 1
        row = []
        for c, t in enumerate(rows[r][:m]):
            if t < 0:
                continue
            target = number.get(block_of[t])
            if target is None:
                target = number[block_of[t]] = len(queue)
                queue.append(block_of[t])
            row.append((bounds[c], bounds[c + 1] - 1, target))
        edges.append(_merge_edges(row))
        accept.append(bool(d.accept[states[r]]))
    return _CDFA(edges, accept)


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
