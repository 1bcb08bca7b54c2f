"""Counted strings: JSON string bodies with a bound on their number of characters, as byte automata.

A length bound counts code points, while the automaton reads bytes (a character is one to four UTF-8 bytes, or an
escape of two to six). Two constructions: a plain string's counted bodies built directly as a chain of one
character's automaton (:func:`_counted_chars`), and a pattern's or format's text automaton walked beside an escape
tracker and a character count, keeping only the counts that can still end in range (:func:`_counted_walk`), then
folded by the numba minimiser (:func:`_folded`).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from constrain.automata.dfa import DEAD, ByteDFA
from constrain.automata.interning import grown, insert, lookup, new_index
from constrain.automata.limits import AUTOMATON_CACHE_BYTES, check_deadline
from constrain.automata.minimize import _reduce, column_classes
from constrain.cache import memoized
from constrain.compilers.json_schema.cdfa import _CDFA
from constrain.compilers.json_schema.errors import _TooLarge
from constrain.compilers.json_schema.values import _CHAR
from constrain.grammar.ir import Automaton
from constrain.grammar.rules import terminal_dfa

#: Most states of the byte-level product of a pattern with a character counter before it is minimised (its
#: table is states x byte classes int32: a few dozen MiB at this size). Only the counts that can still end in range
#: are made (see :func:`_counted_dfa`).
MAX_COUNTED_STATES = 1 << 18


def _escape_tracker() -> tuple[np.ndarray, np.ndarray]:
    """Where a canonical JSON string body is within its current character, read byte by byte: state 0 between
    characters (or inside a UTF-8 sequence), 1 after a backslash, 2-5 after ``\\u`` and 0-3 hex digits. Returns
    ``(next, starts)``, both (6, 256): the next state, and whether the byte read there begins a character (not a
    UTF-8 continuation byte, nor inside an escape). A body's bytes fix it, so it runs beside any body automaton."""
    nxt = np.zeros((6, 256), dtype=np.int32)
    nxt[0, 0x5C] = 1
    nxt[1, ord("u")] = 2
    nxt[2:5] = np.arange(3, 6, dtype=np.int32)[:, None]
    starts = np.zeros((6, 256), dtype=np.int32)
    starts[0] = 1
    starts[0, 0x80:0xC0] = 0
    return nxt, starts


_TRACKER = _escape_tracker()


@memoized(AUTOMATON_CACHE_BYTES, lambda automaton, *bounds: automaton.dfa.nbytes)
def _counted_chars(lo: int, hi: int | None, open_quote: bool, close_quote: bool) -> Automaton:
    """Canonical JSON string bodies of ``lo`` to ``hi`` characters (``hi=None``: at least ``lo``), after an
    opening quote and before a closing one when asked, as a minimal byte DFA.

    Built directly rather than by determinising ``"`` (char){lo,hi} ``"``: a character's encoding is a prefix
    code (its minimal automaton accepts in one state with no edge out), so the counted language is that
    automaton copied once per count, each copy's accepting state being the next copy's start. The copies are
    told apart by the characters left to read, so the chain is minimal as built; it is only numbered breadth
    first, as :meth:`~constrain.automata.dfa.ByteDFA.reduced` numbers states. A 255-character bound (3,572 states)
    takes a few milliseconds instead of a dozen. Shared per process (the same bounds recur), as an
    :class:`~constrain.grammar.ir.Automaton` whose key is hashed once."""
    char = terminal_dfa(_CHAR)
    (accept,) = np.flatnonzero(char.accepting)
    inner = np.delete(np.arange(char.num_states), accept)  # a copy's states: all but the accepting one
    local = np.full(char.num_states, DEAD, dtype=np.int32)
    local[inner] = np.arange(len(inner), dtype=np.int32)
    width = len(inner)
    body = char.trans[inner]
    # One copy, its targets relative to its own first row; the accepting state becomes the next copy's start.
    template = np.where(body < 0, DEAD, np.where(body == accept, width, local[np.maximum(body, 0)]))
    # Unbounded: after `lo` characters, one more state, accepting, that reads like the last copy's start (the
    # last copy's inner states then serve both); with `lo` = 0, one copy that leads back to its own start.
    copies = hi if hi is not None else max(lo, 1)
    first = 1 if open_quote else 0
    end = first + copies * width  # the state after `copies` characters (unless a copy loops)
    rows = end + (0 if hi is None and lo == 0 else 1) + (1 if close_quote else 0)
    looping = hi is None and lo == 0
    trans = _chain_table(template.astype(np.int32), copies, first, rows, looping)
    if looping:
        starts = np.array([first])
    elif hi is None:
        trans[end] = trans[end - width]  # the last copy's characters already end at `end`
        starts = np.array([end])
    else:
        starts = first + width * np.arange(lo, hi + 1)  # after a whole count of characters
    accepting = np.zeros(rows, dtype=bool)
    if close_quote:
        trans[starts, ord('"')] = rows - 1  # a character never starts with a bare quote
        accepting[rows - 1] = True
    else:
        accepting[starts] = True
    if open_quote:
        trans[0, ord('"')] = first
    return Automaton(ByteDFA(trans, accepting).numbered_breadth_first())


@njit(cache=True)
def _chain_table(template, copies, first, rows, looping):
    """The transitions of :func:`_counted_chars`' chain: ``copies`` copies of ``template`` (one character's states,
    ``width`` meaning the next copy's start) from row ``first`` on, in a table of ``rows`` rows, the rest dead;
    ``looping``: the copy's end leads back to its start instead."""
    width = template.shape[0]
    trans = np.full((rows, 256), -1, dtype=np.int32)
    for c in range(copies):
        offset = first + c * width
        for w in range(width):
            for b in range(256):
                t = template[w, b]
                if t >= 0:
                    trans[offset + w, b] = first if looping and t == width else t + offset
    return trans


def _counted_dfa(d: _CDFA, lo: int, hi: int | None, quoted: bool = False) -> ByteDFA:
    """The canonical JSON string bodies (between double quotes when ``quoted``) that decode to a string of ``d``
    with ``lo`` to ``hi`` code points (``hi=None``: at least ``lo``), as a minimal byte DFA: the states of
    :func:`_counted_walk`, folded by the numba minimiser. Raises _TooLarge past :data:`MAX_COUNTED_STATES` states
    before minimising."""
    return _folded(_counted_walk(d, lo, hi, MAX_COUNTED_STATES), quoted)


_Walk = tuple[np.ndarray, np.ndarray, np.ndarray]


def _folded(walk: _Walk, quoted: bool) -> ByteDFA:
    """A :func:`_counted_walk`'s states as a minimal byte DFA, between double quotes when ``quoted``."""
    table, accepting, class_of = walk
    check_deadline()
    if quoted:  # a state of its own reads the opening quote; accepting states read the closing one
        quote = int(class_of[0x22])
        assert not (table[accepting, quote] >= 0).any()  # a body reads '"' only inside an escape
        total = table.shape[0] + 2
        closed = np.full((total, table.shape[1]), DEAD, dtype=np.int32)
        closed[1:-1] = np.where(table >= 0, table + 1, DEAD)
        closed[0, quote] = 1
        closed[1:-1][accepting, quote] = total - 1
        accepting = np.zeros(total, dtype=np.bool_)
        accepting[-1] = True
        table = closed
    reduced, out_accepting = _reduce(table, accepting)
    return ByteDFA(np.take(reduced, class_of, axis=1), out_accepting)


def _counted_walk(d: _CDFA, lo: int, hi: int | None, max_states: int) -> _Walk:
    """``(table, accepting, class_of)``: the canonical JSON string bodies that decode to a string of ``d`` with
    ``lo`` to ``hi`` code points, as a DFA over byte classes (``class_of`` maps a byte to its column; the quote is
    a class of its own), not minimised.

    Built once at the byte level rather than as a product over code points written back as blocks: the body
    automaton of ``d`` runs beside :data:`_TRACKER`, which says which bytes begin a character, and a count of the
    characters read is kept beside the pairs (:func:`_count_walk`, over the byte classes the pairs tell apart).
    Only the counts that can still end in range are kept: a pair from which every completion needs more
    characters than are left is dead, and one from which no completion can pass ``hi`` (nor fall short of
    ``lo``) forgets its count. Raises _TooLarge past ``max_states`` states."""
    body = d.encode_json().to_byte_dfa()
    track_next, track_starts = _TRACKER
    trans, pairs = _pair_walk(body.trans, track_next)
    check_deadline()
    starts = np.where(trans >= 0, track_starts[pairs[:, 1]], 0).astype(np.int32)  # (n, 256)
    final = body.accepting[pairs[:, 0]].astype(np.bool_)
    least, most = _remaining_chars(trans, starts, final)
    # byte classes: the pairs' columns, with the quote a class of its own (it closes a quoted string)
    marker = np.zeros((1, 256), dtype=np.int32)
    marker[0, 0x22] = 1
    reps, class_of = column_classes(np.ascontiguousarray(np.vstack([trans, starts, marker])))
    ktrans = np.take(trans, reps, axis=1)
    kstarts = np.take(starts, reps, axis=1)
    table, accepting, status = _count_walk(
        ktrans, kstarts, final, least, most, lo, -1 if hi is None else hi, max_states
    )
    if status:
        raise _TooLarge("counted product")
    return table, accepting, class_of


@njit(cache=True)
def _pair_walk(body, track_next):
    """``(trans, pairs)``: the (body state, tracker state) pairs reachable from (0, 0), numbered breadth first
    (the new pairs of a row in the order of their codes ``e * 6 + t``), and their transitions (n, 256) over those
    numbers (-1: none)."""
    n_body = body.shape[0]
    number = np.full(n_body * 6, -1, dtype=np.int32)  # by code
    codes = np.empty(n_body * 6, dtype=np.int32)  # by number
    trans = np.empty((n_body * 6, 256), dtype=np.int32)
    fresh = np.empty(256, dtype=np.int32)
    number[0] = 0
    codes[0] = 0
    count = 1
    head = 0
    while head < count:
        e, t = divmod(codes[head], 6)
        n_fresh = 0
        for b in range(256):
            target = body[e, b]
            if target < 0:
                continue
            code = target * 6 + track_next[t, b]
            if number[code] == -1:
                number[code] = -2  # met in this row, numbered below
                fresh[n_fresh] = code
                n_fresh += 1
        for code in np.sort(fresh[:n_fresh]):
            number[code] = count
            codes[count] = code
            count += 1
        for b in range(256):
            target = body[e, b]
            trans[head, b] = -1 if target < 0 else number[target * 6 + track_next[t, b]]
        head += 1
    pairs = np.empty((count, 2), dtype=np.int32)
    for i in range(count):
        pairs[i, 0], pairs[i, 1] = divmod(codes[i], 6)
    return trans[:count].copy(), pairs


@njit(cache=True)
def _remaining_chars(trans, starts, final):
    """``(least, most)`` per pair: the fewest and the most characters a completion to acceptance still reads
    (-1: none can complete; ``most`` -1 too when there is no bound). ``least`` by a 0-1 breadth-first search
    backwards from the accepting pairs; ``most`` by peeling the completing pairs from the accepting ends
    backwards (Kahn's order): a pair never peeled reaches a cycle, so its count is unbounded. Two bytes from one
    pair to another that differ in weight count with the larger."""
    n = trans.shape[0]
    # the edges backwards, grouped by their target: (source, weight)
    into = np.zeros(n + 1, dtype=np.int64)
    for a in range(n):
        for b in range(256):
            if trans[a, b] >= 0:
                into[trans[a, b] + 1] += 1
    for i in range(n):
        into[i + 1] += into[i]
    fill = into[:-1].copy()
    source = np.empty(into[n], dtype=np.int32)
    weight = np.empty(into[n], dtype=np.int32)
    for a in range(n):
        for b in range(256):
            c = trans[a, b]
            if c >= 0:
                source[fill[c]] = a
                weight[fill[c]] = starts[a, b]
                fill[c] += 1
    least = np.full(n, -1, dtype=np.int64)
    size = into[n] + n + 1  # a pair enters the deque once per edge that lowers it, or as an accepting pair
    queue = np.empty(size, dtype=np.int32)
    head = 0
    tail = 0
    for s in range(n):
        if final[s]:
            least[s] = 0
            queue[tail] = s
            tail += 1
    while head != tail:
        c = queue[head]
        head = (head + 1) % size
        for k in range(into[c], into[c + 1]):
            a = source[k]
            w = weight[k]
            if least[a] < 0 or least[c] + w < least[a]:
                least[a] = least[c] + w
                if w:
                    queue[tail] = a
                    tail = (tail + 1) % size
                else:
                    head = head - 1 if head > 0 else size - 1
                    queue[head] = a
    # most: a completing pair is peeled once every edge out of it to a completing pair leads to a peeled one
    most = np.full(n, -1, dtype=np.int64)
    waiting = np.zeros(n, dtype=np.int64)
    for a in range(n):
        if least[a] >= 0:
            for b in range(256):
                c = trans[a, b]
                if c >= 0 and least[c] >= 0:
                    waiting[a] += 1
    ready = np.empty(n, dtype=np.int32)
    top = 0
    for a in range(n):
        if least[a] >= 0 and waiting[a] == 0:
            ready[top] = a
            top += 1
    while top:
        top -= 1
        s = ready[top]
        best = 0 if final[s] else -1
        for b in range(256):
            c = trans[s, b]
            if c >= 0 and least[c] >= 0:
                best = max(best, most[c] + starts[s, b])
        most[s] = best
        for k in range(into[s], into[s + 1]):
            a = source[k]
            if least[a] >= 0:
                waiting[a] -= 1
                if waiting[a] == 0:
                    ready[top] = a
                    top += 1
    return least, most


@njit(cache=True)
def _count_walk(trans, starts, final, least, most, lo, hi, max_states):
    """``(table, accepting, status)``: the reachable (pair, count) states of a pair automaton (``trans`` over byte
    classes, ``starts`` 1 where a class begins a character) with a count of characters, numbered breadth first.
    With ``hi`` >= 0: a count past ``hi``, or one that cannot complete without passing it (``least``), is dead,
    and one that can no longer pass it nor fall short of ``lo`` (``most``) becomes ``hi + 1``, free. With
    ``hi`` -1: the count saturates at ``lo``. ``status`` 1 past ``max_states`` states."""
    n, k = trans.shape
    free = hi + 1 if hi >= 0 else lo
    width = np.int64(free + 1)
    pair_of = np.zeros(64, dtype=np.int32)
    count_of = np.zeros(64, dtype=np.int32)
    table = np.empty((64, k), dtype=np.int32)
    c0 = 0
    if hi >= 0 and most[0] >= 0 and lo <= 0 and most[0] <= hi:
        c0 = free
    count_of[0] = c0
    slots, values = new_index(np.int64(c0))  # the pair 0 with its count: 0 * width + c0
    count = 1
    head = 0
    while head < count:
        p = pair_of[head]
        c = count_of[head]
        for j in range(k):
            q = trans[p, j]
            if q < 0 or least[q] < 0:
                table[head, j] = -1
                continue
            c2 = c
            if hi >= 0:
                if c != free:
                    c2 = c + starts[p, j]
                    if c2 > hi or c2 + least[q] > hi:
                        table[head, j] = -1
                        continue
                    if most[q] >= 0 and c2 >= lo and c2 + most[q] <= hi:
                        c2 = free
            else:
                c2 = min(c + starts[p, j], lo)
            key = np.int64(q) * width + c2
            slot, found = lookup(slots, values, key)
            if found < 0:
                if count >= max_states:
                    return table[:0], np.zeros(0, dtype=np.bool_), 1
                found = count
                slots, values = insert(slots, values, slot, key, count)
                if count == pair_of.shape[0]:
                    pair_of, count_of, table = grown(pair_of, count_of, table, count)
                pair_of[count] = q
                count_of[count] = c2
                count += 1
            table[head, j] = found
        head += 1
    accepting = np.zeros(count, dtype=np.bool_)
    for i in range(count):
        c = count_of[i]
        accepting[i] = final[pair_of[i]] and (c == free or (c >= lo and (hi < 0 or c <= hi)))
    return table[:count].copy(), accepting, 0
