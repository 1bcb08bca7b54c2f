"""The JSON Schema compiler's automata over code points (:mod:`constrain.compilers.json_schema.cdfa`) as numba
kernels over arrays.

A flat automaton is ``(ptr, lo, hi, to, acc)``: state ``s``'s edges are ``lo[ptr[s]:ptr[s + 1]]`` (sorted,
disjoint) with their ``hi`` and target ``to``, and ``acc[s]`` says whether it accepts. The kernels follow the
Python definitions step for step (the same states in the same order), so a result is the same automaton
whichever way it was made; its lists of tuples are written out only when something reads them.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from constrain.automata.minimize import column_classes, partial_dfa_blocks

_SPECIAL_ESCAPES = {0x22: '\\"', 0x5C: "\\\\", 0x08: "\\b", 0x0C: "\\f", 0x0A: "\\n", 0x0D: "\\r", 0x09: "\\t"}


def _escape_of(cp: int) -> str:
    return _SPECIAL_ESCAPES.get(cp) or f"\\u{cp:04x}"


#: The code points a JSON string must escape, in order.
_SPECIALS = [cp for cp in range(0x5D) if cp < 0x20 or cp in (0x22, 0x5C)]


@njit(cache=True, nogil=True)
def _grown(arr, size):
    """``arr`` itself when it holds ``size`` items, else a copy with room for at least that many."""
    if size <= arr.shape[0]:
        return arr
    out = np.empty(max(size, 2 * arr.shape[0]), dtype=arr.dtype)
    out[: arr.shape[0]] = arr
    return out


@njit(cache=True, nogil=True)
def _product_flat(a_ptr, a_lo, a_hi, a_to, a_acc, b_ptr, b_lo, b_hi, b_to, b_acc, minus, max_states):
    """:func:`_product` over flat automata: ``(status, ptr, lo, hi, to, acc)``, status 1 past ``max_states``
    states. Pairs are numbered as the Python version numbers them (breadth first, pieces in order); a pair with
    no state of ``b`` (outside it, for a difference) has ``b = -1``."""
    width = b_acc.shape[0] + 1
    index = {np.int64(1): np.int64(0)}  # pair (a, b) -> id, keyed a * width + b + 1
    order_a = np.zeros(64, dtype=np.int64)
    order_b = np.zeros(64, dtype=np.int64)
    count = 1
    out_ptr = np.zeros(65, dtype=np.int64)
    out_lo = np.empty(256, dtype=np.int64)
    out_hi = np.empty(256, dtype=np.int64)
    out_to = np.empty(256, dtype=np.int64)
    acc = np.zeros(64, dtype=np.bool_)
    piece_lo = np.empty(16, dtype=np.int64)
    piece_hi = np.empty(16, dtype=np.int64)
    piece_b = np.empty(16, dtype=np.int64)
    m = 0
    i = 0
    while i < count:
        if count > max_states:
            return 1, out_ptr[:1], out_lo[:0], out_hi[:0], out_to[:0], acc[:0]
        sa = order_a[i]
        sb = order_b[i]
        jb = b_ptr[sb] if sb >= 0 else 0
        eb = b_ptr[sb + 1] if sb >= 0 else 0
        row_start = m
        for ea in range(a_ptr[sa], a_ptr[sa + 1]):
            lo, hi, ta = a_lo[ea], a_hi[ea], a_to[ea]
            # the pieces of this edge, in order: gaps outside b (a difference) and overlaps with b's edges
            num = 0
            pos = lo
            while jb < eb and b_hi[jb] < lo:
                jb += 1
            k = jb
            while k < eb and b_lo[k] <= hi:
                blo, bhi = b_lo[k], b_hi[k]
                if num + 2 > piece_lo.shape[0]:
                    piece_lo = _grown(piece_lo, num + 2)
                    piece_hi = _grown(piece_hi, num + 2)
                    piece_b = _grown(piece_b, num + 2)
                if minus and blo > pos:
                    piece_lo[num], piece_hi[num], piece_b[num] = pos, blo - 1, -1
                    num += 1
                x, y = max(lo, blo), min(hi, bhi)
                if x <= y:
                    piece_lo[num], piece_hi[num], piece_b[num] = x, y, b_to[k]
                    num += 1
                pos = max(pos, bhi + 1)
                if bhi > hi:
                    break
                k += 1
            if minus and pos <= hi:
                if num + 1 > piece_lo.shape[0]:
                    piece_lo = _grown(piece_lo, num + 1)
                    piece_hi = _grown(piece_hi, num + 1)
                    piece_b = _grown(piece_b, num + 1)
                piece_lo[num], piece_hi[num], piece_b[num] = pos, hi, -1
                num += 1
            for p in range(num):
                key = ta * width + piece_b[p] + 1
                target = index.get(key, -1)
                if target < 0:
                    target = count
                    index[key] = target
                    order_a = _grown(order_a, count + 1)
                    order_b = _grown(order_b, count + 1)
                    order_a[count] = ta
                    order_b[count] = piece_b[p]
                    count += 1
                if m > row_start and out_to[m - 1] == target and out_hi[m - 1] + 1 == piece_lo[p]:
                    out_hi[m - 1] = piece_hi[p]  # what _merge_edges does to the row
                    continue
                out_lo = _grown(out_lo, m + 1)
                out_hi = _grown(out_hi, m + 1)
                out_to = _grown(out_to, m + 1)
                out_lo[m], out_hi[m], out_to[m] = piece_lo[p], piece_hi[p], target
                m += 1
        out_ptr = _grown(out_ptr, i + 2)
        out_ptr[i + 1] = m
        acc = _grown(acc, i + 1)
        acc_b = sb >= 0 and b_acc[sb]
        acc[i] = a_acc[sa] and ((not acc_b) if minus else acc_b)
        i += 1
    return 0, out_ptr[: count + 1].copy(), out_lo[:m].copy(), out_hi[:m].copy(), out_to[:m].copy(), acc[:count].copy()


@njit(cache=True, nogil=True)
def _minimize_flat(ptr, lo, hi, to, acc):
    """:func:`_minimize` over a flat automaton: trimmed, minimal, numbered breadth first from the start with its
    edges read in order (so equal languages give equal automata), each state's edges merged."""
    n = acc.shape[0]
    # reachable from the start, then able to reach acceptance (a search of the reversed edges)
    start = np.zeros(n, dtype=np.bool_)
    start[0] = True
    seen = _reached(ptr, to, start)
    rev_count = np.zeros(n + 1, dtype=np.int64)
    for s in range(n):
        if seen[s]:
            for e in range(ptr[s], ptr[s + 1]):
                rev_count[to[e] + 1] += 1
    for s in range(n):
        rev_count[s + 1] += rev_count[s]
    rev = np.empty(rev_count[n], dtype=np.int64)
    fill = rev_count[:n].copy()
    for s in range(n):
        if seen[s]:
            for e in range(ptr[s], ptr[s + 1]):
                rev[fill[to[e]]] = s
                fill[to[e]] += 1
    alive = _reached(rev_count, rev, seen & acc)
    if not alive[0]:
        return np.zeros(2, dtype=np.int64), lo[:0].copy(), hi[:0].copy(), to[:0].copy(), np.zeros(1, dtype=np.bool_)
    pos = np.full(n, -1, dtype=np.int64)
    kept = 0
    for s in range(n):
        if alive[s]:
            pos[s] = kept
            kept += 1
    # the column bounds: every edge's first and past-last symbol
    num_bounds = 0
    for s in range(n):
        if alive[s]:
            for e in range(ptr[s], ptr[s + 1]):
                if alive[to[e]]:
                    num_bounds += 2
    bounds = np.empty(num_bounds, dtype=np.int64)
    num_bounds = 0
    for s in range(n):
        if alive[s]:
            for e in range(ptr[s], ptr[s + 1]):
                if alive[to[e]]:
                    bounds[num_bounds] = lo[e]
                    bounds[num_bounds + 1] = hi[e] + 1
                    num_bounds += 2
    bounds = np.unique(bounds)
    m = max(bounds.shape[0] - 1, 0)
    table = np.full((kept, max(m, 1)), -1, dtype=np.int32)
    kept_acc = np.empty(kept, dtype=np.bool_)
    for s in range(n):
        if alive[s]:
            r = pos[s]
            kept_acc[r] = acc[s]
            for e in range(ptr[s], ptr[s + 1]):
                t = to[e]
                if alive[t]:
                    a = np.searchsorted(bounds, lo[e])
                    b = np.searchsorted(bounds, hi[e] + 1)
                    table[r, a:b] = pos[t]
    reps, _ = column_classes(table)
    columns = np.empty((kept, reps.shape[0]), dtype=np.int32)
    for r in range(kept):
        for c in range(reps.shape[0]):
            columns[r, c] = table[r, reps[c]]
    block_of = partial_dfa_blocks(columns, kept_acc)
    num_blocks = 0
    for r in range(kept):
        num_blocks = max(num_blocks, block_of[r] + 1)
    rep = np.full(num_blocks, -1, dtype=np.int64)
    for r in range(kept):
        if rep[block_of[r]] < 0:
            rep[block_of[r]] = r
    number = np.full(num_blocks, -1, dtype=np.int64)
    queue = np.empty(num_blocks, dtype=np.int64)
    number[block_of[pos[0]]] = 0
    queue[0] = block_of[pos[0]]
    back = 1
    out_ptr = np.zeros(num_blocks + 1, dtype=np.int64)
    out_lo = np.empty(16, dtype=np.int64)
    out_hi = np.empty(16, dtype=np.int64)
    out_to = np.empty(16, dtype=np.int64)
    out_acc = np.empty(num_blocks, dtype=np.bool_)
    e = 0
    front = 0
    while front < back:
        r = rep[queue[front]]
        row_start = e
        for c in range(m):
            t = table[r, c]
            if t < 0:
                continue
            b = block_of[t]
            if number[b] < 0:
                number[b] = back
                queue[back] = b
                back += 1
            target = number[b]
            if e > row_start and out_to[e - 1] == target and out_hi[e - 1] + 1 == bounds[c]:
                out_hi[e - 1] = bounds[c + 1] - 1
                continue
            out_lo = _grown(out_lo, e + 1)
            out_hi = _grown(out_hi, e + 1)
            out_to = _grown(out_to, e + 1)
            out_lo[e], out_hi[e], out_to[e] = bounds[c], bounds[c + 1] - 1, target
            e += 1
        out_acc[front] = kept_acc[r]
        front += 1
        out_ptr[front] = e
    return out_ptr[: back + 1].copy(), out_lo[:e].copy(), out_hi[:e].copy(), out_to[:e].copy(), out_acc[:back].copy()


#: The JSON escapes of the code points a string must escape (:data:`_SPECIALS`), one row each: the characters
#: after the backslash, -1 past the end.
_SPECIAL_CODES = np.full((0x5D, 5), -1, dtype=np.int64)
for _cp in _SPECIALS:
    _text = _escape_of(_cp)[1:]
    _SPECIAL_CODES[_cp, : len(_text)] = [ord(_c) for _c in _text]
_IS_SPECIAL = np.zeros(0x5D, dtype=np.bool_)
_IS_SPECIAL[_SPECIALS] = True


@njit(cache=True, nogil=True)
def _encode_json_flat(ptr, lo, hi, to, acc, codes, is_special):
    """:meth:`_CDFA.encode_json` over a flat automaton (the same states in the same order): the plain parts of
    each edge, and a backslash into a trie of the escapes, whose states come after all others. States whose
    escaped characters lead to the same targets share one trie: most do (a pattern's states mostly send every
    control character to one place), and a trie per state would multiply the states to encode and determinise
    by the dozens of escapes it holds."""
    n = acc.shape[0]
    num_codes = codes.shape[0]
    out_ptr = np.zeros(n + 1, dtype=np.int64)
    out_lo = np.empty(max(16, 2 * lo.shape[0]), dtype=np.int64)
    out_hi = np.empty(max(16, 2 * lo.shape[0]), dtype=np.int64)
    out_to = np.empty(max(16, 2 * lo.shape[0]), dtype=np.int64)
    trie = np.full((16, 128), -1, dtype=np.int64)  # the escape tries' states: target per character
    num_extra = 0
    # the distinct escape targets met so far (one row per trie, its root beside it), found by hash
    targets = np.empty((16, num_codes), dtype=np.int64)
    roots = np.empty(16, dtype=np.int64)
    num_tries = 0
    slots = np.full(1 << 6, -1, dtype=np.int64)
    while slots.shape[0] < 2 * n + 16:
        slots = np.full(2 * slots.shape[0], -1, dtype=np.int64)
    mask = slots.shape[0] - 1
    target = np.empty(num_codes, dtype=np.int64)
    m = 0
    for s in range(n):
        row_start = m
        target[:] = -1
        escaped = False
        for e in range(ptr[s], ptr[s + 1]):
            a, b, t = lo[e], hi[e], to[e]
            for part in range(3):  # the plain parts: 0x20-0x21, 0x23-0x5B, 0x5D and up
                p_lo = 0x20 if part == 0 else (0x23 if part == 1 else 0x5D)
                p_hi = 0x21 if part == 0 else (0x5B if part == 1 else 0x10FFFF)
                x, y = max(a, p_lo), min(b, p_hi)
                if x <= y:
                    out_lo = _grown(out_lo, m + 1)
                    out_hi = _grown(out_hi, m + 1)
                    out_to = _grown(out_to, m + 1)
                    out_lo[m], out_hi[m], out_to[m] = x, y, t
                    m += 1
            for cp in range(max(a, 0), min(b, num_codes - 1) + 1):
                if is_special[cp]:
                    target[cp] = t
                    escaped = True
        if escaped:
            h = np.int64(1469598103934665603)
            for cp in range(num_codes):
                h = (h ^ (target[cp] + 2)) * np.int64(1099511628211)
            slot = h & mask
            node = -1
            while slots[slot] >= 0:
                k = slots[slot]
                if (targets[k] == target).all():
                    node = roots[k]
                    break
                slot = (slot + 1) & mask
            if node < 0:  # a trie of its own, recorded for the states that escape alike
                node = n + num_extra
                num_extra += 1
                if num_extra > trie.shape[0]:
                    trie = _grown_rows(trie, num_extra)
                for cp in range(num_codes):
                    t = target[cp]
                    if t < 0:
                        continue
                    at = node
                    length = 0
                    while length < codes.shape[1] and codes[cp, length] >= 0:
                        length += 1
                    for i in range(length):
                        ch = codes[cp, i]
                        if i == length - 1:
                            trie[at - n, ch] = t
                        else:
                            nxt = trie[at - n, ch]
                            if nxt < 0:
                                nxt = n + num_extra
                                num_extra += 1
                                if num_extra > trie.shape[0]:
                                    trie = _grown_rows(trie, num_extra)
                                trie[at - n, ch] = nxt
                            at = nxt
                if num_tries == targets.shape[0]:
                    targets = _grown_rows(targets, num_tries + 1)
                    roots = _grown(roots, num_tries + 1)
                targets[num_tries] = target
                roots[num_tries] = node
                slots[slot] = num_tries
                num_tries += 1
            out_lo = _grown(out_lo, m + 1)
            out_hi = _grown(out_hi, m + 1)
            out_to = _grown(out_to, m + 1)
            out_lo[m], out_hi[m], out_to[m] = 0x5C, 0x5C, node
            m += 1
        # the row sorted by (lo, hi, target): its parts are disjoint, so by lo; a short insertion sort
        for i in range(row_start + 1, m):
            x_lo, x_hi, x_to = out_lo[i], out_hi[i], out_to[i]
            j = i - 1
            while j >= row_start and out_lo[j] > x_lo:
                out_lo[j + 1], out_hi[j + 1], out_to[j + 1] = out_lo[j], out_hi[j], out_to[j]
                j -= 1
            out_lo[j + 1], out_hi[j + 1], out_to[j + 1] = x_lo, x_hi, x_to
        out_ptr[s + 1] = m
    total = n + num_extra
    full_ptr = np.empty(total + 1, dtype=np.int64)
    full_ptr[: n + 1] = out_ptr
    for k in range(num_extra):
        for ch in range(128):
            t = trie[k, ch]
            if t >= 0:
                out_lo = _grown(out_lo, m + 1)
                out_hi = _grown(out_hi, m + 1)
                out_to = _grown(out_to, m + 1)
                out_lo[m], out_hi[m], out_to[m] = ch, ch, t
                m += 1
        full_ptr[n + k + 1] = m
    full_acc = np.zeros(total, dtype=np.bool_)
    full_acc[:n] = acc
    return full_ptr, out_lo[:m].copy(), out_hi[:m].copy(), out_to[:m].copy(), full_acc


@njit(cache=True, nogil=True)
def _grown_rows(table, rows):
    """``table`` with room for at least ``rows`` rows (doubled; the new rows -1)."""
    if rows <= table.shape[0]:
        return table
    grown = np.full((max(rows, 2 * table.shape[0]), table.shape[1]), -1, dtype=table.dtype)
    grown[: table.shape[0]] = table
    return grown


@njit(cache=True, nogil=True)
def _utf8_bytes(cp, length, out):
    """The UTF-8 bytes of ``cp`` in ``length`` bytes, into ``out``."""
    if length == 1:
        out[0] = cp
        return
    for i in range(length - 1, 0, -1):
        out[i] = 0x80 | (cp & 0x3F)
        cp >>= 6
    out[0] = (0xC0 if length == 2 else (0xE0 if length == 3 else 0xF0)) | cp


@njit(cache=True, nogil=True)
def _byte_nfa_flat(ptr, lo, hi, to, acc, quoted):
    """The byte NFA :meth:`_CDFA.to_byte_dfa` determinises, over a flat automaton: ``(edges (src, lo, hi, dst)
    flattened, epsilons (src, dst) flattened, number of states, start, accept)``. State ``s`` is the automaton's
    own; a code-point range becomes its UTF-8 byte-range sequences (surrogates left out), and the sequences
    leaving one state share the inner state of an equal leading range, so large classes stay small. A sequence
    whose last bytes may be any continuation byte ends in a tail shared by every state that goes to the same
    target (a class such as "anything but a digit", on every state of a pattern, is then a few states, not a
    dozen per state)."""
    n = acc.shape[0]
    accept = n
    size = n + 1
    start = 0
    edges = np.empty(1024, dtype=np.int32)
    num = 0
    eps = np.empty(2 * n + 2, dtype=np.int32)
    num_eps = 0
    if quoted:
        start = size
        size += 1
        edges[0], edges[1], edges[2], edges[3] = start, 0x22, 0x22, 0
        num = 4
    # the inner states made for the state being read: parent, lo, hi -> state
    made_parent = np.empty(64, dtype=np.int64)
    made_lo = np.empty(64, dtype=np.int64)
    made_hi = np.empty(64, dtype=np.int64)
    made_state = np.empty(64, dtype=np.int64)
    pending_lo = np.empty(64, dtype=np.int64)
    pending_hi = np.empty(64, dtype=np.int64)
    pending_len = np.empty(64, dtype=np.int64)
    blo = np.empty(4, dtype=np.int64)
    bhi = np.empty(4, dtype=np.int64)
    tails = np.full((n, 3), -1, dtype=np.int64)  # (target, k): the state that reads k continuation bytes to it
    for s in range(n):
        num_made = 0
        for e in range(ptr[s], ptr[s + 1]):
            t = to[e]
            # the pieces of [lo, hi] of one encoded length, surrogates left out
            num_pending = 0
            for length in range(1, 5):
                first = 0 if length == 1 else (0x80 if length == 2 else (0x800 if length == 3 else 0x10000))
                last = 0x7F if length == 1 else (0x7FF if length == 2 else (0xFFFF if length == 3 else 0x10FFFF))
                for half in range(2):
                    a, b = max(lo[e], first), min(hi[e], last)
                    if length == 3:
                        if half == 0:
                            b = min(b, 0xD7FF)
                        else:
                            a = max(a, 0xE000)
                    elif half == 1:
                        continue
                    if a <= b:
                        pending_lo = _grown(pending_lo, num_pending + 1)
                        pending_hi = _grown(pending_hi, num_pending + 1)
                        pending_len = _grown(pending_len, num_pending + 1)
                        pending_lo[num_pending], pending_hi[num_pending], pending_len[num_pending] = a, b, length
                        num_pending += 1
            while num_pending > 0:
                num_pending -= 1
                a, b, length = pending_lo[num_pending], pending_hi[num_pending], pending_len[num_pending]
                split = False
                for i in range(1, length):
                    mask = (1 << (6 * i)) - 1
                    if (a & ~mask) != (b & ~mask):
                        if a & mask != 0:
                            cut = a | mask
                        elif b & mask != mask:
                            cut = (b & ~mask) - 1
                        else:
                            continue
                        pending_lo = _grown(pending_lo, num_pending + 2)
                        pending_hi = _grown(pending_hi, num_pending + 2)
                        pending_len = _grown(pending_len, num_pending + 2)
                        pending_lo[num_pending], pending_hi[num_pending], pending_len[num_pending] = cut + 1, b, length
                        pending_lo[num_pending + 1], pending_hi[num_pending + 1] = a, cut
                        pending_len[num_pending + 1] = length
                        num_pending += 2
                        split = True
                        break
                if split:
                    continue
                _utf8_bytes(a, length, blo)
                _utf8_bytes(b, length, bhi)
                # the last `full` bytes read any continuation byte: a tail shared by every state that goes to t
                last = length - 1
                while last >= 1 and blo[last] == 0x80 and bhi[last] == 0xBF:
                    last -= 1
                full = length - 1 - last
                end = t
                if full:
                    for k in range(1, full + 1):
                        tail = tails[t, k - 1]
                        if tail < 0:
                            tail = tails[t, k - 1] = size
                            size += 1
                            edges = _grown(edges, num + 4)
                            edges[num], edges[num + 1], edges[num + 2], edges[num + 3] = tail, 0x80, 0xBF, end
                            num += 4
                        end = tail
                    length = last + 1
                state = s
                for d in range(length - 1):
                    found = -1
                    for j in range(num_made):
                        if made_parent[j] == state and made_lo[j] == blo[d] and made_hi[j] == bhi[d]:
                            found = made_state[j]
                            break
                    if found < 0:
                        found = size
                        size += 1
                        made_parent = _grown(made_parent, num_made + 1)
                        made_lo = _grown(made_lo, num_made + 1)
                        made_hi = _grown(made_hi, num_made + 1)
                        made_state = _grown(made_state, num_made + 1)
                        made_parent[num_made], made_lo[num_made], made_hi[num_made] = state, blo[d], bhi[d]
                        made_state[num_made] = found
                        num_made += 1
                        edges = _grown(edges, num + 4)
                        edges[num], edges[num + 1], edges[num + 2], edges[num + 3] = state, blo[d], bhi[d], found
                        num += 4
                    state = found
                edges = _grown(edges, num + 4)
                d = length - 1
                edges[num], edges[num + 1], edges[num + 2], edges[num + 3] = state, blo[d], bhi[d], end
                num += 4
        if acc[s]:
            if quoted:
                edges = _grown(edges, num + 4)
                edges[num], edges[num + 1], edges[num + 2], edges[num + 3] = s, 0x22, 0x22, accept
                num += 4
            else:
                eps[num_eps], eps[num_eps + 1] = s, accept
                num_eps += 2
    return edges[:num].copy(), eps[:num_eps].copy(), size, start, accept


@njit(cache=True, nogil=True)
def _is_empty_flat(ptr, to, acc):
    """Whether no accepting state can be reached from the start."""
    start = np.zeros(acc.shape[0], dtype=np.bool_)
    start[0] = True
    return not (_reached(ptr, to, start) & acc).any()


@njit(cache=True, nogil=True)
def _reached(ptr, to, seeds):
    """The states reached from the ``seeds`` (a mask) along the edges ``to[ptr[s]:ptr[s + 1]]`` of each state ``s``
    (a depth-first search), the seeds included."""
    seen = seeds.copy()
    stack = np.flatnonzero(seeds)
    stack = np.concatenate((stack, np.empty(seeds.shape[0] - stack.shape[0], dtype=stack.dtype)))
    top = np.int64(np.count_nonzero(seeds))
    while top > 0:
        top -= 1
        s = stack[top]
        for e in range(ptr[s], ptr[s + 1]):
            t = to[e]
            if not seen[t]:
                seen[t] = True
                stack[top] = t
                top += 1
    return seen


@njit(cache=True, nogil=True)
def _append3(a, b, c, count, x, y, z):
    """Append ``(x, y, z)`` to the parallel arrays ``a, b, c`` holding ``count`` items: the arrays, grown."""
    a = _grown(a, count + 1)
    b = _grown(b, count + 1)
    c = _grown(c, count + 1)
    a[count], b[count], c[count] = x, y, z
    return a, b, c


@njit(cache=True, nogil=True)
def _continuations_flat(trans, state, k, memo_start, memo_end, pool_lo, pool_hi, pool_to, pool_count):
    """The code-point edges ``(lo, hi, target)`` of the ``k`` continuation bytes read from ``state`` (the value
    their bits make), made (with those of fewer bytes they
    need) in the pool, where ``memo_start[k - 1, state]``/``memo_end`` say where each list is (-1: not made):
    ``(pool_lo, pool_hi, pool_to, pool_count)``."""
    stack_state = np.empty(256, dtype=np.int64)
    stack_k = np.empty(256, dtype=np.int64)
    stack_state[0], stack_k[0] = state, k
    top = 1
    run_lo = np.empty(64, dtype=np.int64)
    run_hi = np.empty(64, dtype=np.int64)
    run_to = np.empty(64, dtype=np.int64)
    while top > 0:
        s, level = stack_state[top - 1], stack_k[top - 1]
        if memo_start[level - 1, s] >= 0:
            top -= 1
            continue
        # the runs of equal targets over the 64 continuation bytes
        num_runs = 0
        i = 0
        while i < 64:
            t = trans[s, 0x80 + i]
            j = i
            while j + 1 < 64 and trans[s, 0x80 + j + 1] == t:
                j += 1
            if t >= 0:
                run_lo[num_runs], run_hi[num_runs], run_to[num_runs] = i, j, t
                num_runs += 1
            i = j + 1
        if level > 1:  # each run's target needs its lists of one byte fewer first
            pending = False
            for r in range(num_runs):
                if memo_start[level - 2, run_to[r]] < 0:
                    stack_state = _grown(stack_state, top + 1)
                    stack_k = _grown(stack_k, top + 1)
                    stack_state[top], stack_k[top] = run_to[r], level - 1
                    top += 1
                    pending = True
            if pending:
                continue
        top -= 1
        start = pool_count
        size = 1 << (6 * (level - 1))
        for r in range(num_runs):
            a, b, t = run_lo[r], run_hi[r], run_to[r]
            if level == 1:
                if pool_count > start and pool_to[pool_count - 1] == t and pool_hi[pool_count - 1] + 1 == a:
                    pool_hi[pool_count - 1] = b
                else:
                    pool_lo, pool_hi, pool_to = _append3(pool_lo, pool_hi, pool_to, pool_count, a, b, t)
                    pool_count += 1
                continue
            sub_start, sub_end = memo_start[level - 2, t], memo_end[level - 2, t]
            if sub_end - sub_start == 1 and pool_lo[sub_start] == 0 and pool_hi[sub_start] == size - 1:
                lo_, hi_, to_ = a * size, (b + 1) * size - 1, pool_to[sub_start]
                if pool_count > start and pool_to[pool_count - 1] == to_ and pool_hi[pool_count - 1] + 1 == lo_:
                    pool_hi[pool_count - 1] = hi_
                else:
                    pool_lo, pool_hi, pool_to = _append3(pool_lo, pool_hi, pool_to, pool_count, lo_, hi_, to_)
                    pool_count += 1
                continue
            for c in range(a, b + 1):
                for e in range(sub_start, sub_end):
                    lo_, hi_, to_ = c * size + pool_lo[e], c * size + pool_hi[e], pool_to[e]
                    if pool_count > start and pool_to[pool_count - 1] == to_ and pool_hi[pool_count - 1] + 1 == lo_:
                        pool_hi[pool_count - 1] = hi_
                    else:
                        pool_lo, pool_hi, pool_to = _append3(pool_lo, pool_hi, pool_to, pool_count, lo_, hi_, to_)
                        pool_count += 1
        memo_start[level - 1, s], memo_end[level - 1, s] = start, pool_count
    return pool_lo, pool_hi, pool_to, pool_count


@njit(cache=True, nogil=True)
def _cdfa_from_bytes_flat(trans, accepting):
    """A byte DFA that reads valid UTF-8 collapsed into a flat DFA over code points: the states reached from
    the byte DFA's start, numbered as found, each reading the ASCII runs of its row and, through each lead byte,
    the code points its continuation bytes spell."""
    n = trans.shape[0]
    memo_start = np.full((3, n), -1, dtype=np.int64)
    memo_end = np.full((3, n), -1, dtype=np.int64)
    pool_lo = np.empty(256, dtype=np.int64)
    pool_hi = np.empty(256, dtype=np.int64)
    pool_to = np.empty(256, dtype=np.int64)
    pool_count = 0
    index = np.full(n, -1, dtype=np.int64)
    order = np.empty(n, dtype=np.int64)
    index[0], order[0] = 0, 0
    count = 1
    out_ptr = np.zeros(n + 1, dtype=np.int64)
    out_lo = np.empty(256, dtype=np.int64)
    out_hi = np.empty(256, dtype=np.int64)
    out_to = np.empty(256, dtype=np.int64)  # byte states until the row is numbered
    row_lo = np.empty(256, dtype=np.int64)
    row_hi = np.empty(256, dtype=np.int64)
    row_to = np.empty(256, dtype=np.int64)
    m = 0
    i = 0
    while i < count:
        s = order[i]
        num = 0
        b = 0
        while b < 0x80:
            t = trans[s, b]
            j = b
            while j + 1 < 0x80 and trans[s, j + 1] == t:
                j += 1
            if t >= 0:
                row_lo, row_hi, row_to = _append3(row_lo, row_hi, row_to, num, b, j, t)
                num += 1
            b = j + 1
        for lead in range(0xC2, 0xF5):
            t1 = trans[s, lead]
            if t1 < 0:
                continue
            k = 1 if lead < 0xE0 else (2 if lead < 0xF0 else 3)
            base = (lead & (0x1F if k == 1 else (0x0F if k == 2 else 0x07))) << (6 * k)
            if memo_start[k - 1, t1] < 0:
                pool_lo, pool_hi, pool_to, pool_count = _continuations_flat(
                    trans, t1, k, memo_start, memo_end, pool_lo, pool_hi, pool_to, pool_count
                )
            for e in range(memo_start[k - 1, t1], memo_end[k - 1, t1]):
                row_lo, row_hi, row_to = _append3(
                    row_lo, row_hi, row_to, num, base + pool_lo[e], base + pool_hi[e], pool_to[e]
                )
                num += 1
        # _merge_edges: sorted by (lo, hi, target) (they come sorted but for an automaton that is not UTF-8),
        # then adjacent runs toward one target joined; targets numbered in order of appearance
        for e in range(1, num):  # an insertion sort, which finds them in order
            x_lo, x_hi, x_to = row_lo[e], row_hi[e], row_to[e]
            j = e - 1
            while j >= 0 and (
                row_lo[j] > x_lo
                or (row_lo[j] == x_lo and (row_hi[j] > x_hi or (row_hi[j] == x_hi and row_to[j] > x_to)))
            ):
                row_lo[j + 1], row_hi[j + 1], row_to[j + 1] = row_lo[j], row_hi[j], row_to[j]
                j -= 1
            row_lo[j + 1], row_hi[j + 1], row_to[j + 1] = x_lo, x_hi, x_to
        row_start = m
        for e in range(num):
            lo_, hi_, t = row_lo[e], row_hi[e], row_to[e]
            if m > row_start and out_to[m - 1] == t and out_hi[m - 1] + 1 == lo_:
                out_hi[m - 1] = hi_
                continue
            out_lo, out_hi, out_to = _append3(out_lo, out_hi, out_to, m, lo_, hi_, t)
            m += 1
        for e in range(row_start, m):
            t = out_to[e]
            if index[t] < 0:
                index[t] = count
                order[count] = t
                count += 1
            out_to[e] = index[t]
        out_ptr[i + 1] = m
        i += 1
    acc = np.empty(count, dtype=np.bool_)
    for j in range(count):
        acc[j] = accepting[order[j]]
    return out_ptr[: count + 1].copy(), out_lo[:m].copy(), out_hi[:m].copy(), out_to[:m].copy(), acc
