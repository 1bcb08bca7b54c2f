"""The numba kernels of a pushdown machine: appending rule DFAs to one global state space, and the mask walk of
the vocabulary trie that carries a set of configurations (see :mod:`constrain.runtime.pushdown`)."""

from __future__ import annotations

import numpy as np
from numba import njit

from constrain.runtime.lexical import _subtrees_below


@njit(cache=True, nogil=True)
def _append_rule(
    table, accepting, calls, callee_start, rule, offset, trans, g_accepting, plain, state_rule, call_ptr, call_start,
    call_return,
):  # fmt: skip
    """Write one rule's DFA into the machine's arrays from global state ``offset`` (whose ``call_ptr`` says where
    its call edges start), in one pass over its rows: its transitions moved by ``offset``, its accepting states,
    its rule, its call edges (``call_start`` from ``callee_start`` by callee column: the callee's start, or its
    ``-1 - rule`` marker when that rule is not added yet; ``call_return`` the caller's state after the callee
    returns) and which states are plain (neither call nor accept). Returns how many edges the machine then has."""
    edge = call_ptr[offset]
    for i in range(table.shape[0]):
        s = offset + i
        for j in range(256):
            t = table[i, j]
            trans[s, j] = t + offset if t >= 0 else t
        g_accepting[s] = accepting[i]
        state_rule[s] = rule
        for k in range(calls.shape[1]):
            t = calls[i, k]
            if t >= 0:
                call_start[edge] = callee_start[k]
                call_return[edge] = offset + t
                edge += 1
        call_ptr[s + 1] = edge
        plain[s] = edge == call_ptr[s] and not accepting[i]
    return edge


@njit(cache=True, nogil=True)
def _expand(
    accepting,
    call_ptr,
    call_start,
    call_return,
    pool_state,
    pool_parent,
    pool_top,
    in_state,
    in_parent,
    n,
    out_state,
    out_parent,
    work_state,
    work_parent,
):
    """Closure of the configurations ``(in_state[j], in_parent[j])`` for j < n into ``out_*``: pushes allocate
    the caller's return frame in the pool from ``pool_top``. Returns (count, new pool top); count -1 when a
    bound is exceeded, ``-2 - rule`` when a call edge leads to a rule not built yet."""
    cap = out_state.shape[0]
    count = 0
    w = 0
    for j in range(n):
        work_state[w] = in_state[j]
        work_parent[w] = in_parent[j]
        w += 1
    while w > 0:
        w -= 1
        state = work_state[w]
        parent = work_parent[w]
        duplicate = False
        for j in range(count):
            if out_state[j] == state and out_parent[j] == parent:
                duplicate = True
                break
        if duplicate:
            continue
        if count >= cap or w + (call_ptr[state + 1] - call_ptr[state]) + 1 >= work_state.shape[0]:
            return -1, pool_top
        out_state[count] = state
        out_parent[count] = parent
        count += 1
        for k in range(call_ptr[state], call_ptr[state + 1]):
            if call_start[k] < 0:  # a callee not built yet (-1 - rule): the caller builds it and walks again
                return -1 + call_start[k], pool_top
            if pool_top >= pool_state.shape[0]:
                return -1, pool_top
            pool_state[pool_top] = call_return[k]
            pool_parent[pool_top] = parent
            work_state[w] = call_start[k]
            work_parent[w] = pool_top
            w += 1
            pool_top += 1
        if accepting[state] and parent >= 0:
            work_state[w] = pool_state[parent]
            work_parent[w] = pool_parent[parent]
            w += 1
    return count, pool_top


@njit(cache=True, nogil=True)
def _close_level(
    d,
    accepting,
    call_ptr,
    call_start,
    call_return,
    pool_state,
    pool_parent,
    level_state,
    level_parent,
    level_n,
    closed_state,
    closed_parent,
    closed_n,
    pool_mark,
    closed_mark,
    work_state,
    work_parent,
):
    """Compute ``closed[d]``, the closure of ``level[d]``. Returns 0, or what :func:`_expand` returns when it
    stops (-1: the configurations outgrow the bounds; ``-2 - rule``: a callee to build first).
    Configurations that can neither call nor return are their own closure; the walk's inner loop tests that
    itself (a call per trie node, its array arguments reference-counted each time, made a whole-vocabulary walk
    ten times slower), so this is called where some configuration calls or returns, or once per range."""
    if _plain_level(d, accepting, call_ptr, level_state, level_n):
        _copy_level(
            d, level_state, level_parent, level_n, closed_state, closed_parent, closed_n, pool_mark, closed_mark
        )
        return 0
    count, top = _expand(
        accepting, call_ptr, call_start, call_return, pool_state, pool_parent, pool_mark[d],
        level_state[d], level_parent[d], level_n[d], closed_state[d], closed_parent[d], work_state, work_parent,
    )  # fmt: skip
    if count < 0:
        return count
    closed_n[d] = count
    closed_mark[d] = top
    return 0


@njit(cache=True, nogil=True, inline="always")
def _plain_level(d, accepting, call_ptr, level_state, level_n):
    """Whether no configuration of ``level[d]`` can call or return (the level is then its own closure)."""
    for j in range(level_n[d]):
        s = level_state[d, j]
        if call_ptr[s] != call_ptr[s + 1] or accepting[s]:
            return False
    return True


@njit(cache=True, nogil=True, inline="always")
def _bottom_returns(d, accepting, closed_state, closed_parent, closed_n):
    """Whether a configuration of ``closed[d]`` is a bottom frame that may return to a caller below the walk (a
    plain level never is: its states do not accept)."""
    for j in range(closed_n[d]):
        if closed_parent[d, j] < 0 and accepting[closed_state[d, j]]:
            return True
    return False


@njit(cache=True, nogil=True, inline="always")
def _copy_level(d, level_state, level_parent, level_n, closed_state, closed_parent, closed_n, pool_mark, closed_mark):
    """``closed[d]`` = ``level[d]``, for a level that is its own closure (no frame pushed)."""
    for j in range(level_n[d]):
        closed_state[d, j] = level_state[d, j]
        closed_parent[d, j] = level_parent[d, j]
    closed_n[d] = level_n[d]
    closed_mark[d] = pool_mark[d]


@njit(cache=True, nogil=True)
def _walk_pushdown(
    trans,
    accepting,
    call_ptr,
    call_start,
    call_return,
    top_state,
    top_parent,
    pool_used,
    pool_state,
    pool_parent,
    node_key,
    node_next,
    node_token_ptr,
    token_ids,
    root_children,
    ranges,
    expand_base,
    out,
    pops,
    work,
    levels,
    marks,
):
    """Set in ``out`` the bit of every token whose bytes some configuration can read, over the trie subtrees in
    ``ranges``. Returns (0, the subtrees below the pop nodes, as :meth:`Machine.walk` does) when ``pops`` has
    room to record them (else none are recorded), (-1, nothing) when the configurations outgrow ``MAX_CONFIGS``,
    or (``-2 - rule``, nothing) when a call edge leads to a rule not built yet: the caller builds it and walks
    again (the bits set so far are all right).

    A configuration is a top state and the pool index of the frame below it. ``level[d]`` holds the
    configurations after ``d`` bytes of the current trie path and ``closed[d]`` their closure, computed once per
    trie node and shared by its children; a configuration that can neither call nor return is its own closure.
    Frames pushed for a level are dropped (the pool top rewound) when the walk moves to another branch. A range
    over the whole trie visits only the first bytes the closed configurations accept (``root_children``).
    """
    work_state, work_parent = work[0], work[1]
    level_state, level_parent, closed_state, closed_parent = levels[0], levels[1], levels[2], levels[3]
    level_n = marks[0]
    closed_n = marks[1]  # -1: not computed for the current path
    pool_mark = marks[2]  # pool top when level d was made
    closed_mark = marks[3]  # pool top after level d's closure
    node_at = marks[4]  # the trie node of each level on the current path
    level_n[:] = 0
    closed_n[:] = -1
    pool_mark[:] = 0
    closed_mark[:] = 0
    node_at[:] = -1
    span_start = np.empty(256, dtype=np.int64)
    span_end = np.empty(256, dtype=np.int64)
    record = pops.shape[0] > 0
    num_pops = 0
    for r in range(ranges.shape[0]):
        base = ranges[r, 2]
        for j in range(top_state.shape[0]):
            level_state[base, j] = top_state[j]
            level_parent[base, j] = top_parent[j]
        level_n[base] = top_state.shape[0]
        closed_n[base] = -1
        pool_mark[base] = pool_used
        if not expand_base:  # the caller already expanded them
            for j in range(top_state.shape[0]):
                closed_state[base, j] = top_state[j]
                closed_parent[base, j] = top_parent[j]
            closed_n[base] = top_state.shape[0]
            closed_mark[base] = pool_used
        node_at[base] = -1
        num_spans = 1
        span_start[0] = ranges[r, 0]
        span_end[0] = ranges[r, 1]
        if base == 0 and ranges[r, 0] == 0 and ranges[r, 1] == node_key.shape[0]:
            if closed_n[0] < 0:
                status = _close_level(
                    0, accepting, call_ptr, call_start, call_return, pool_state, pool_parent, level_state,
                    level_parent, level_n, closed_state, closed_parent, closed_n, pool_mark, closed_mark,
                    work_state, work_parent,
                )  # fmt: skip
                if status < 0:
                    return status, np.empty((0, 3), dtype=np.int64)
                if record and _bottom_returns(0, accepting, closed_state, closed_parent, closed_n):
                    pops[num_pops] = node_at[0]
                    num_pops += 1
            num_spans = 0
            for byte in range(256):
                child = root_children[byte]
                if child < 0:
                    continue
                for j in range(closed_n[0]):
                    if trans[closed_state[0, j], byte] >= 0:
                        span_start[num_spans] = child
                        span_end[num_spans] = node_next[child]
                        num_spans += 1
                        break
        for span in range(num_spans):
            i = span_start[span]
            end = span_end[span]
            while i < end:
                key = node_key[i]
                depth = key >> 8
                byte = key & 255
                parent = depth - 1
                if closed_n[parent] < 0:
                    s0 = level_state[parent, 0]
                    if level_n[parent] == 1 and call_ptr[s0] == call_ptr[s0 + 1] and not accepting[s0]:
                        closed_state[parent, 0] = s0  # the common case first: one plain configuration
                        closed_parent[parent, 0] = level_parent[parent, 0]
                        closed_n[parent] = 1
                        closed_mark[parent] = pool_mark[parent]
                    elif _plain_level(parent, accepting, call_ptr, level_state, level_n):
                        _copy_level(
                            parent, level_state, level_parent, level_n, closed_state, closed_parent, closed_n,
                            pool_mark, closed_mark,
                        )  # fmt: skip
                    else:  # some configuration calls or returns
                        status = _close_level(
                            parent, accepting, call_ptr, call_start, call_return, pool_state, pool_parent,
                            level_state, level_parent, level_n, closed_state, closed_parent, closed_n, pool_mark,
                            closed_mark, work_state, work_parent,
                        )  # fmt: skip
                        if status < 0:
                            return status, np.empty((0, 3), dtype=np.int64)
                        if record and _bottom_returns(parent, accepting, closed_state, closed_parent, closed_n):
                            pops[num_pops] = node_at[parent]
                            num_pops += 1
                count = 0
                for j in range(closed_n[parent]):
                    t = trans[closed_state[parent, j], byte]
                    if t < 0:
                        continue
                    up = closed_parent[parent, j]
                    duplicate = False
                    for m in range(count):
                        if level_state[depth, m] == t and level_parent[depth, m] == up:
                            duplicate = True
                            break
                    if duplicate:
                        continue
                    level_state[depth, count] = t
                    level_parent[depth, count] = up
                    count += 1
                if count == 0:
                    i = node_next[i]
                    continue
                level_n[depth] = count
                pool_mark[depth] = closed_mark[parent]
                closed_n[depth] = -1
                node_at[depth] = i
                for k in range(node_token_ptr[i], node_token_ptr[i + 1]):
                    t = token_ids[k]
                    out[t >> 5] |= np.uint32(1) << np.uint32(t & 31)
                i += 1
    return 0, _subtrees_below(pops, num_pops, node_key, node_next)
