"""The Thompson construction of a calling rule's body, in one numba kernel.

A rule that calls others reads only literals and calls (its terminals are hoisted into rules of their own), so
its body is a small program: sequences, alternatives and repetitions over literals and calls. The rule DFA cache
already writes that program out as a plain tuple per composite node (:func:`constrain.grammar.rules._body_key`);
:func:`flat_body` turns the tuples into arrays, and :func:`thompson_nfa` builds the NFA's edge arrays from them,
which the determinisation kernel reads as they are. Built node by node in Python instead, the NFA of an object's
rule costs as much as its subset construction.

The kernel joins what it built before as :func:`constrain.grammar.rules._build` does: a shared expression
(:func:`~constrain.grammar.ir.shared`) is built once per target state, and a sequence whose remaining items were
built toward the same target before joins them. The NFA may be numbered otherwise than the one built in Python,
and may join a little less (a composite is known by its place in the body, not by its value), but it reads the
same language, so the rule's minimal DFA is the same.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from numba import njit, types
from numba.typed import Dict

from constrain.errors import GrammarError

#: Kinds of composite nodes in :func:`flat_body`'s arrays.
SEQ, ALT, REPEAT = 0, 1, 2
#: What :func:`thompson_nfa` reports besides success: the NFA passed its state bound, or a repetition alone would.
TOO_MANY_STATES, TOO_MANY_COPIES = 1, 2

#: Tags of a body's key (:func:`constrain.grammar.rules._body_key` writes them, :func:`flat_body` reads them): a
#: sequence, one marked shared, an alternative, one marked shared, a repetition, a literal leaf, a call leaf.
SEQ_TAG, SHARED_SEQ_TAG, ALT_TAG, SHARED_ALT_TAG, REPEAT_TAG = ",", ",s", "|", "|s", "*"
LITERAL_TAG, CALL_TAG = "L", "R"

_NODE_KINDS = {SEQ_TAG: (SEQ, False), SHARED_SEQ_TAG: (SEQ, True), ALT_TAG: (ALT, False), SHARED_ALT_TAG: (ALT, True)}


def flat_body(key: tuple, columns: Mapping[str, int]) -> tuple | None:
    """The arrays :func:`thompson_nfa` reads for the body whose rule DFA cache key is ``key`` (its composites in
    post-order, the root last), its calls numbered by ``columns``; None when the body is a leaf or reads a
    terminal or a token (built in Python). Raises :class:`GrammarError` for an alternative with no options or a
    repetition whose bounds are out of order, as the construction in Python does."""
    if not key or type(key[0]) is not tuple or (key[0][0] not in _NODE_KINDS and key[0][0] != REPEAT_TAG):
        return None  # a leaf alone: one edge or a DFA, no program
    kinds: list[int] = []
    shared: list[bool] = []
    bounds: list[int] = []  # min, max (-1: unbounded) per node
    spans: list[int] = []  # first child, number of children per node
    children: list[int] = []  # a composite by its number, a leaf as -1 - its number
    leaves: dict[tuple, int] = {}
    leaf_rows: list[int] = []  # kind (0 literal, 1 call), offset of its bytes or call column, length
    text = bytearray()
    for node in key:
        tag = node[0]
        if tag == REPEAT_TAG:
            low, high, parts = node[1], node[2], node[3:]
            if low < 0 or (high is not None and high < low):
                raise GrammarError(f"repeats between {low} and {high} times")
            kinds.append(REPEAT)
            shared.append(False)
            bounds += (low, -1 if high is None else high)
        else:
            kind, mark = _NODE_KINDS[tag]
            parts = node[1:]
            if kind == ALT and not parts:
                raise GrammarError("has an alternative with no options")
            kinds.append(kind)
            shared.append(mark)
            bounds += (0, 0)
        spans += (len(children), len(parts))
        for part in parts:
            if type(part) is int:
                children.append(part)
                continue
            leaf = leaves.get(part)
            if leaf is None:
                tag = part[0]
                if tag == LITERAL_TAG:
                    value = part[1]
                    data = value.encode() if isinstance(value, str) else bytes(value)
                    leaf_rows += (0, len(text), len(data))
                    text += data
                elif tag == CALL_TAG:
                    leaf_rows += (1, columns[part[1]], 0)
                else:
                    return None  # a terminal or a token
                leaf = leaves[part] = len(leaves)
            children.append(-1 - leaf)
    return (
        np.array(kinds, dtype=np.int8),
        np.array(shared, dtype=np.bool_),
        np.array(bounds, dtype=np.int64),
        np.array(spans, dtype=np.int64),
        np.array(children, dtype=np.int64),
        np.array(leaf_rows, dtype=np.int64),
        np.frombuffer(bytes(text), dtype=np.uint8),
    )


@njit(cache=True)
def _grow(rows, used, more):
    """``rows`` with room for ``more`` after its first ``used`` entries."""
    if used + more <= rows.shape[0]:
        return rows
    out = np.empty(max(2 * rows.shape[0], used + more), dtype=rows.dtype)
    out[:used] = rows[:used]
    return out


@njit(cache=True)
def _push(tasks, top, code, src, dst, entered):
    """``tasks`` (4 entries a task, ``top`` of them used) with one more task, and its new ``top``."""
    tasks = _grow(tasks, top, 4)
    tasks[top], tasks[top + 1], tasks[top + 2], tasks[top + 3] = code, src, dst, entered
    return tasks, top + 4


@njit(cache=True)
def _epsilon(eps, ne, src, dst):
    """``eps`` (2 entries an edge, ``ne`` of them used) with the edge ``src -> dst``, and its new ``ne``."""
    eps = _grow(eps, ne, 2)
    eps[ne], eps[ne + 1] = src, dst
    return eps, ne + 2


@njit(cache=True)
def thompson_nfa(kinds, shared, bounds, spans, children, leaf_rows, text, max_states):
    """The NFA of :func:`flat_body`'s program from state 0 (start) to state 1 (accept): ``(status, states, byte
    edges (src, lo, hi, dst), epsilon edges (src, dst), call edges (src, column, dst), copies)``, flat int32;
    ``copies`` is what a repetition would have made when the status is :data:`TOO_MANY_COPIES`."""
    byte = np.empty(256, dtype=np.int32)
    eps = np.empty(64, dtype=np.int32)
    call = np.empty(64, dtype=np.int32)
    nb = ne = nc = 0
    n = 2
    # tasks, 4 entries each: code (a node >= 0, a leaf < 0), source, target, entered (a shared node's entry made)
    tasks, top = _push(np.empty(256, dtype=np.int64), 0, kinds.shape[0] - 1, 0, 1, 0)
    entries = Dict.empty(key_type=types.int64, value_type=types.int64)  # (shared node, target) -> its entry
    joins = Dict.empty(key_type=types.int64, value_type=types.int64)  # (rest of a sequence, target) -> state
    cells = Dict.empty(key_type=types.int64, value_type=types.int64)  # (item, id of the rest after it) -> id
    rest_of = np.full(children.shape[0], -1, dtype=np.int64)  # per child of a sequence: the id of its rest
    num_leaves = leaf_rows.shape[0] // 3
    while top > 0:
        top -= 4
        code, src, dst, entered = tasks[top], tasks[top + 1], tasks[top + 2], tasks[top + 3]
        if n > max_states:
            return TOO_MANY_STATES, n, byte[:nb], eps[:ne], call[:nc], 0
        if code < 0:  # a leaf: a literal's path or a call
            leaf = -1 - code
            kind, at, size = leaf_rows[3 * leaf], leaf_rows[3 * leaf + 1], leaf_rows[3 * leaf + 2]
            if kind == 1:
                call = _grow(call, nc, 3)
                call[nc], call[nc + 1], call[nc + 2] = src, at, dst
                nc += 3
            elif size == 0:
                eps, ne = _epsilon(eps, ne, src, dst)
            else:
                byte = _grow(byte, nb, 4 * size)
                state = src
                for i in range(size):
                    nxt = dst
                    if i < size - 1:
                        nxt = n
                        n += 1
                    b = text[at + i]
                    byte[nb], byte[nb + 1], byte[nb + 2], byte[nb + 3] = state, b, b, nxt
                    nb += 4
                    state = nxt
            continue
        kind = kinds[code]
        first, count = spans[2 * code], spans[2 * code + 1]
        if kind != REPEAT and shared[code] and entered == 0:  # built once toward dst, entered by an epsilon
            key = code * 4294967296 + dst
            entry = entries.get(key, -1)
            if entry < 0:
                entry = n
                n += 1
                entries[key] = entry
                tasks, top = _push(tasks, top, code, entry, dst, 1)
            eps, ne = _epsilon(eps, ne, src, entry)
            continue
        if kind == ALT:
            for c in range(first + count - 1, first - 1, -1):
                tasks, top = _push(tasks, top, children[c], src, dst, 0)
            continue
        if kind == SEQ:
            if count == 0:
                eps, ne = _epsilon(eps, ne, src, dst)
                continue
            end, entry = count, dst
            if count >= 2:
                if rest_of[first + 1] < 0:  # name each rest of this sequence, from its end
                    rest = 0
                    for c in range(first + count - 1, first, -1):
                        cell = (children[c] + num_leaves) * 4294967296 + rest
                        found = cells.get(cell, -1)
                        if found < 0:
                            found = len(cells) + 1
                            cells[cell] = found
                        rest = found
                        rest_of[c] = rest
                for j in range(1, count):
                    found = joins.get(rest_of[first + j] * 4294967296 + dst, -1)
                    if found >= 0:
                        end, entry = j, found
                        break
            state = src
            for i in range(end):
                nxt = entry
                if i < end - 1:
                    nxt = n
                    n += 1
                    if count >= 2:
                        joins[rest_of[first + i + 1] * 4294967296 + dst] = nxt
                tasks, top = _push(tasks, top, children[first + i], state, nxt, 0)
                state = nxt
            continue
        # a repetition of its one child between bounds[2 * code] and bounds[2 * code + 1] (-1: unbounded) times
        item, low, high = children[first], bounds[2 * code], bounds[2 * code + 1]
        copies = low if high < 0 else high
        if copies - 1 > max_states - n:
            return TOO_MANY_COPIES, n, byte[:nb], eps[:ne], call[:nc], copies
        eps = _grow(eps, ne, 6 + 2 * max(high - low, 0))
        state = src
        for _ in range(low):
            nxt = n
            n += 1
            tasks, top = _push(tasks, top, item, state, nxt, 0)
            state = nxt
        if high < 0:
            loop, back = n, n + 1
            n += 2
            tasks, top = _push(tasks, top, item, loop, back, 0)
            eps[ne : ne + 6] = (state, loop, back, loop, loop, dst)
            ne += 6
            continue
        for i in range(high - low, 0, -1):
            eps[ne], eps[ne + 1] = state, dst
            ne += 2
            nxt = dst
            if i != 1:
                nxt = n
                n += 1
            tasks, top = _push(tasks, top, item, state, nxt, 0)
            state = nxt
        if state != dst:
            eps[ne], eps[ne + 1] = state, dst
            ne += 2
    if n > max_states:
        return TOO_MANY_STATES, n, byte[:nb], eps[:ne], call[:nc], 0
    return 0, n, byte[:nb], eps[:ne], call[:nc], 0
