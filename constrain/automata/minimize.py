"""Minimisation of partial DFAs by partition refinement (Valmari and Lehtinen), over edge lists.

Only the minimal DFA is written out as a 256-byte table; the refinement reads each state's few edges.
"""

from __future__ import annotations

import numpy as np
from numba import njit


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
def _renumber_in_place(trans, accepting, order):
    """Rename state ``s`` of ``(trans, accepting)`` to ``order[s]`` (a permutation) in the arrays themselves: a
    table of thousands of states is not allocated (and faulted in) a second time. The targets are renamed, then
    the rows moved along each cycle of the permutation."""
    n, width = trans.shape
    for s in range(n):
        for b in range(width):
            t = trans[s, b]
            if t >= 0:
                trans[s, b] = order[t]
    placed = np.zeros(n, dtype=np.bool_)
    carried = np.empty(width, dtype=trans.dtype)
    for s in range(n):
        if placed[s]:
            continue
        placed[s] = True
        q = order[s]
        if q == s:
            continue
        carried[:] = trans[s]  # row s, on its way to row order[s]
        carried_accepting = accepting[s]
        while q != s:
            for b in range(width):
                t = trans[q, b]
                trans[q, b] = carried[b]
                carried[b] = t
            a = accepting[q]
            accepting[q] = carried_accepting
            carried_accepting = a
            placed[q] = True
            q = order[q]
        trans[s, :] = carried
        accepting[s] = carried_accepting


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
