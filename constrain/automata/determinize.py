"""Subset construction over a byte NFA's flat edge arrays (numba kernels).

The NFA is indexed by byte class (bytes that no edge tells apart), subsets are interned in a hash table, and a
construction that fits one slice of work is determinised, trimmed and minimised in a single kernel call.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from constrain.automata.dfa import DEAD
from constrain.automata.minimize import _reduce_edges


@njit(cache=True)
def _determinize_in_one_slice(
    byte_flat, eps_flat, call_flat, begin, end, n, start, accept, slice_work, max_states, max_members, max_cells
):
    """The whole of :meth:`ByteNFA.determinize` in one kernel call when the subset construction finishes within
    one slice of work, as it does for almost every rule (each kernel call costs microseconds of dispatch, which
    for a small rule is most of its cost): ``(status, finished, trans, accepting, calls, used, call edges)``,
    the arrays empty when it did not finish."""
    nfa = _index_nfa(byte_flat, eps_flat, call_flat, begin, end, n, accept)
    work = _new_work(16, nfa[11], nfa[12])
    work, done, count, status = _subset_construction(
        start, nfa[0], nfa[1], nfa[2], nfa[3], nfa[4], nfa[5], nfa[6], nfa[7], nfa[8], nfa[9],
        work, 0, 0, slice_work, max_states, max_members, max_cells,
    )  # fmt: skip
    if status or done != count:
        empty = np.empty((0, 0), dtype=np.int32)
        return status, False, empty, np.empty(0, dtype=np.bool_), empty, np.empty(0, dtype=np.int64), 0
    trans, accepting, calls, used, num_calls = _reduced_subsets(work[3], work[4], work[5], count, nfa[10], nfa[13])
    return status, True, trans, accepting, calls, used, num_calls


_NO_PAIRS = np.zeros((0, 2), dtype=np.int32)


@njit(cache=True)
def _index_nfa(byte_flat, eps_flat, call_flat, begin, end, n, accept):
    """An NFA's edge lists (flat ``src, lo, hi, dst`` / ``src, dst`` / ``src, rule, dst``) grouped by source, as
    :func:`_subset_construction` reads them: ``(start, byte, epsilon and call (ptr, rows), final, important,
    class of each byte, number of byte classes, number of rules called, the rules called)``; the call rows name
    a rule by its place among the rules called. The start's closure also follows ``begin``
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
    # the called rules numbered densely: a rule of a large grammar calls a few of its thousands of rules
    rule_ids = np.unique(call_rows[:, 1]).astype(np.int64)
    for k in range(call_rows.shape[0]):
        call_rows[k, 1] = np.searchsorted(rule_ids, call_rows[k, 1])
    return (start_ptr, start_rows, byte_ptr, byte_rows, eps_ptr, eps_rows, call_ptr, call_rows, final, important,
            byte_class, num_classes, rule_ids.shape[0], rule_ids)  # fmt: skip


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
def _reduced_subsets(trans, calls, accepting, count, byte_class, rule_ids):
    """The minimal DFA (:func:`_reduce`) of the first ``count`` subsets, their transitions by byte class written
    out over the 256 bytes, with only the call columns some subset uses: ``(byte table, accepting, table of
    those call columns, the rules of those columns, its call edges)``; call column ``r`` calls rule
    ``rule_ids[r]``."""
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
    num_calls = 0
    for s in range(table.shape[0]):
        for c in range(num_classes):
            out_trans[s, first_byte[c] : first_byte[c + 1]] = table[s, c]
        for c in range(columns.shape[0]):
            out_calls[s, c] = table[s, num_classes + c]
            if out_calls[s, c] >= 0:
                num_calls += 1
    return out_trans, out_accepting, out_calls, rule_ids[columns], num_calls


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
    """The important states of the epsilon closure of ``seeds[:num_seeds]``, sorted, into ``out``: ``(their
    count, the states the closure visited)``."""
    top = 0
    steps = 0
    for j in range(num_seeds):
        s = seeds[j]
        if stamp[s] != generation:
            stamp[s] = generation
            stack[top] = s
            top += 1
    k = 0
    while top > 0:
        top -= 1
        steps += 1
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
        return k, steps
    for i in range(1, k):  # most closures are a few states: sorted in place, without a call of the sort
        v = out[i]
        j = i - 1
        while j >= 0 and out[j] > v:
            out[j + 1] = out[j]
            j -= 1
        out[j + 1] = v
    return k, steps


@njit(cache=True, inline="always")
def _intern(out, k, work, count, max_states, max_members, max_cells):
    """The id of the subset ``out[:k]``, added when new: ``(id, work, count)``; id -2 when past ``max_states``,
    -3 when the subsets would hold more than ``max_members`` states in all, -4 when the transition table would
    pass ``max_cells`` cells."""
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
    if offsets[count] + k > max_members:
        return -3, work, count
    if count == trans.shape[0]:
        capacity = 2 * count
        if capacity * (trans.shape[1] + calls.shape[1]) > max_cells:
            return -4, work, count
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
        grown_members = np.empty(max(min(2 * members.shape[0], max_members), start + k), dtype=np.int32)
        grown_members[:start] = members[:start]
        members = grown_members
    members[start : start + k] = out[:k]
    offsets[count + 1] = start + k
    hashes[count] = h
    table[slot] = count
    return count, (members, offsets, hashes, trans, calls, accepting, table), count + 1


@njit(cache=True, inline="always")
def _successor(
    seeds, num_seeds, eps_ptr, eps_rows, important, stamp, generation, stack, out, work, count, max_states,
    max_members, max_cells,
):  # fmt: skip
    """The subset reached through ``seeds`` (its id, -1 when it reads and accepts nothing, -2 or -3 past a limit:
    see :func:`_intern`), the states its closure visited, and the grown ``work`` and ``count``."""
    k, steps = _close(seeds, num_seeds, eps_ptr, eps_rows, important, stamp, generation, stack, out)
    if k == 0:
        return -1, steps, work, count
    target, work, count = _intern(out, k, work, count, max_states, max_members, max_cells)
    return target, steps, work, count


@njit(cache=True)
def _subset_construction(
    start, start_ptr, start_rows, byte_ptr, byte_rows, eps_ptr, eps_rows, call_ptr, call_rows, final, important,
    work, done, count, slice_work, max_states, max_members, max_cells,
):  # fmt: skip
    """Expand subsets ``done``.. (adding the start subset first when there is none yet) until about
    ``slice_work`` states and edges have been visited: ``(work, done, count, status)``, status 1 when the
    automaton needs more than ``max_states`` states, 2 when its subsets would hold more than ``max_members`` NFA
    states in all, 3 when its transition table would pass ``max_cells`` cells."""
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
        k, _ = _close(seeds, 1, start_ptr, start_rows, important, stamp, generation, stack, out)
        if k == 0:  # nothing can be read or accepted: one dead start state
            work[5][0] = False
            return work, 1, 1, 0
        first_id, work, count = _intern(out, k, work, count, max_states, max_members, max_cells)
        if first_id < 0:
            return work, done, count, -1 - first_id
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
        # One target subset per class range, then one per called rule.
        num_ranges = max(num_cuts - 1, 0)
        num_groups = num_ranges + (work[4].shape[1] if num_calls else 0)
        for g in range(num_groups):
            num_seeds = 0
            if g < num_ranges:
                visited += num_edges
                a = cuts[g]
                for e in range(num_edges):
                    if lo[e] <= a and hi[e] >= a:
                        seeds[num_seeds] = dst[e]
                        num_seeds += 1
            else:
                visited += num_calls
                for e in range(num_calls):
                    if call_rule[e] == g - num_ranges:
                        seeds[num_seeds] = call_dst[e]
                        num_seeds += 1
            if num_seeds == 0:
                continue
            generation += 1
            target, steps, work, count = _successor(
                seeds, num_seeds, eps_ptr, eps_rows, important, stamp, generation, stack, out, work, count,
                max_states, max_members, max_cells,
            )  # fmt: skip
            visited += num_seeds + steps
            if target < -1:
                return work, done, count, -1 - target
            if target >= 0:
                if g < num_ranges:
                    work[3][i, cuts[g] : cuts[g + 1]] = target
                else:
                    work[4][i, g - num_ranges] = target
        done += 1
    return work, done, count, 0
