"""Boolean operations on call-free byte DFAs: intersection, difference, complement and union.

What regex lookahead (:mod:`constrain.automata.regex`) and the combination of string constraints are built from.
Each result is trimmed and minimal (numbered as :meth:`~constrain.automata.dfa.ByteDFA.reduced` numbers states).

Products are bounded: the reachable pairs of states are built over the byte classes the two automata share (the
bytes that neither tells apart), and a product that would pass ``max_states`` (by default
:data:`~constrain.automata.limits.MAX_DFA_STATES`) raises :class:`~constrain.errors.AutomatonTooLarge` before it
is finished; its table is states x classes, so that bound also bounds its memory. The compile time limit in
force is looked at before and after each product (:func:`~constrain.automata.limits.check_deadline`): one
product is a single kernel call of at most ``max_states`` x 256 steps.

:func:`complement` is relative to valid UTF-8 text (every string of code points), not to every byte string: the
complement of a language of text is text.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
from numba import njit

from constrain.automata.dfa import ByteDFA
from constrain.automata.interning import grown, insert, lookup, new_index
from constrain.automata.limits import MAX_DFA_STATES, check_deadline
from constrain.automata.minimize import _reduce, column_classes
from constrain.automata.nfa import ByteNFA
from constrain.automata.utf8 import MAX_CODE_POINT
from constrain.errors import AutomatonTooLarge, StructureError

_INTERSECT = 0
_DIFFERENCE = 1


def intersect(a: ByteDFA, b: ByteDFA, max_states: int = MAX_DFA_STATES) -> ByteDFA:
    """The strings both ``a`` and ``b`` accept, as a minimal DFA."""
    return _product_dfa(a, b, _INTERSECT, max_states)


def difference(a: ByteDFA, b: ByteDFA, max_states: int = MAX_DFA_STATES) -> ByteDFA:
    """The strings ``a`` accepts and ``b`` does not, as a minimal DFA."""
    return _product_dfa(a, b, _DIFFERENCE, max_states)


def complement(a: ByteDFA, max_states: int = MAX_DFA_STATES) -> ByteDFA:
    """The UTF-8 texts ``a`` does not accept, as a minimal DFA."""
    return difference(any_text(), a, max_states)


def union(*dfas: ByteDFA, max_states: int = MAX_DFA_STATES) -> ByteDFA:
    """The strings any of ``dfas`` accepts, as a minimal DFA (the subset construction over their copies)."""
    if not dfas:
        return empty()
    if len(dfas) == 1:
        return _call_free(dfas[0]).reduced()
    nfa = ByteNFA()
    start, accept = nfa.new_state(), nfa.new_state()
    for dfa in dfas:
        nfa.add_dfa(_call_free(dfa), start, accept)
    out = nfa.determinize(start, accept)
    if out.num_states > max_states:
        raise AutomatonTooLarge(f"the union needs more than {max_states:,} DFA states")
    return out


def equivalent(a: ByteDFA, b: ByteDFA) -> bool:
    """Whether ``a`` and ``b`` accept the same strings (both differences empty)."""
    return difference(a, b).is_empty and difference(b, a).is_empty


@lru_cache(maxsize=1)
def any_text() -> ByteDFA:
    """Every UTF-8 text, the empty one included: the universe :func:`complement` is relative to."""
    nfa = ByteNFA()
    start, accept = nfa.new_state(), nfa.new_state()
    nfa.add_code_points(start, [(0, 0xD7FF), (0xE000, MAX_CODE_POINT)], start)
    nfa.add_epsilon(start, accept)
    return nfa.determinize(start, accept)


@lru_cache(maxsize=1)
def empty() -> ByteDFA:
    """The DFA that accepts nothing."""
    return ByteDFA(np.full((1, 256), -1, dtype=np.int32), np.zeros(1, dtype=np.bool_))


def epsilon() -> ByteDFA:
    """The DFA that accepts only the empty string."""
    return ByteDFA(np.full((1, 256), -1, dtype=np.int32), np.ones(1, dtype=np.bool_))


def _call_free(dfa: ByteDFA) -> ByteDFA:
    if dfa.calls.shape[1]:
        raise StructureError("boolean operations take call-free DFAs (a regex's, not a grammar rule's)")
    return dfa


def _product_dfa(a: ByteDFA, b: ByteDFA, mode: int, max_states: int) -> ByteDFA:
    _call_free(a)
    _call_free(b)
    if a.is_empty:
        return empty()
    if mode == _INTERSECT and b.is_empty:
        return empty()
    check_deadline()
    # The byte classes of the pair: bytes that lead every state of both automata to the same place.
    reps, class_of = column_classes(np.ascontiguousarray(np.vstack([a.trans, b.trans])))
    ka = np.take(a.trans, reps, axis=1)
    kb = np.take(b.trans, reps, axis=1)
    table, accepting, status = _product(ka, a.accepting, kb, b.accepting, mode, max_states)
    if status:
        raise AutomatonTooLarge(f"the product of two automata needs more than {max_states:,} DFA states")
    check_deadline()
    reduced, out_accepting = _reduce(table, accepting)
    trans = np.take(reduced, class_of, axis=1)
    return ByteDFA(trans, out_accepting)


@njit(cache=True)
def _product(ta, acc_a, tb, acc_b, mode, max_states):
    """``(table, accepting, status)``: the reachable pairs of states of two DFAs over the same classes, numbered
    breadth first from (0, 0), as a table over those classes. ``mode`` 0: both must read on (intersection); 1: the
    first must, the second may die (its dead state, -1, then reads anything into itself: difference). ``status`` 1
    when there would be more than ``max_states`` pairs (the table is then not finished)."""
    k = ta.shape[1]
    nb1 = np.int64(tb.shape[0] + 1)
    slots, values = new_index(np.int64(1))  # the pair (0, 0): 0 * nb1 + (0 + 1)
    pair_a = np.zeros(64, dtype=np.int32)
    pair_b = np.zeros(64, dtype=np.int32)
    table = np.empty((64, k), dtype=np.int32)
    count = 1
    head = 0
    while head < count:
        x = pair_a[head]
        y = pair_b[head]
        for c in range(k):
            nx = ta[x, c]
            ny = tb[y, c] if y >= 0 else -1
            if nx < 0 or (ny < 0 and mode == 0):
                table[head, c] = -1
                continue
            key = np.int64(nx) * nb1 + np.int64(ny + 1)
            slot, found = lookup(slots, values, key)
            if found < 0:
                if count >= max_states:
                    return table[:0], np.zeros(0, dtype=np.bool_), 1
                found = count
                slots, values = insert(slots, values, slot, key, count)
                if count == pair_a.shape[0]:
                    pair_a, pair_b, table = grown(pair_a, pair_b, table, count)
                pair_a[count] = nx
                pair_b[count] = ny
                count += 1
            table[head, c] = found
        head += 1
    accepting = np.zeros(count, dtype=np.bool_)
    for i in range(count):
        in_b = pair_b[i] >= 0 and acc_b[pair_b[i]]
        accepting[i] = acc_a[pair_a[i]] and (in_b if mode == 0 else not in_b)
    return table[:count].copy(), accepting, 0
