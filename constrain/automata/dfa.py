"""Byte DFAs: the dense transition tables that masks walk, and the operations on them.

A :class:`ByteDFA` has byte edges only (anchors are folded in by the subset construction), a dead state of -1, and
a digest by which equal automata are shared.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import cached_property
from itertools import accumulate

import numpy as np
from numba import njit

from constrain.automata.limits import MAX_DFA_STATES, MAX_NFA_STATES
from constrain.automata.minimize import _bfs_order, _reduce, _reduce_edges, _renumber_in_place, column_classes
from constrain.errors import AutomatonTooLarge, StructureError

DEAD = -1

# --------------------------------------------------------------------------------------------------------------
# DFA


@dataclass(frozen=True, eq=False)
class ByteDFA:
    """A deterministic automaton over bytes. State 0 is the start; ``trans[s, b]`` is the next state or -1.

    A grammar rule's automaton also has call edges: ``calls[s, k]`` is the state reached after one whole match
    of rule ``callees[k]`` read from state ``s`` (or -1); a regex has none (``calls`` has 0 columns). After
    :meth:`trimmed`, every state can still reach acceptance, so "not dead" means "can still match".
    """

    trans: np.ndarray  # int32 (n_states, 256)
    accepting: np.ndarray  # bool (n_states,)
    calls: np.ndarray = None  # type: ignore[assignment]  # int32 (n_states, len(callees))
    callees: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.calls is None:
            object.__setattr__(self, "calls", np.empty((self.trans.shape[0], 0), dtype=np.int32))

    @property
    def num_states(self) -> int:
        return int(self.trans.shape[0])

    @cached_property
    def num_calls(self) -> int:
        """Its call edges."""
        return int(np.count_nonzero(self.calls >= 0)) if self.calls.shape[1] else 0

    def with_callees(self, callees: tuple[int, ...]) -> ByteDFA:
        """This DFA with its call columns naming ``callees``: the same arrays, and its count of call edges once
        counted (a shared rule DFA is renumbered for every grammar that calls it)."""
        out = ByteDFA(self.trans, self.accepting, self.calls, callees)
        out.__dict__["num_calls"] = self.num_calls
        return out

    @property
    def nbytes(self) -> int:
        """The bytes of its arrays (what caches bounded in bytes count)."""
        return self.trans.nbytes + self.accepting.nbytes + self.calls.nbytes

    @cached_property
    def edge_list(self) -> np.ndarray:
        """The byte edges as rows ``(state, first byte, last byte, target)``, one per maximal range."""
        trans = self.trans
        starts = np.ones(trans.shape, dtype=bool)
        starts[:, 1:] = trans[:, 1:] != trans[:, :-1]
        state, first = np.nonzero(starts)
        last = np.empty_like(first)
        last[:-1] = first[1:] - 1
        last[np.append(state[1:] != state[:-1], True)] = 255
        target = trans[state, first]
        keep = target >= 0
        return np.column_stack([state[keep], first[keep], last[keep], target[keep]]).astype(np.int32)

    @cached_property
    def digest(self) -> bytes:
        """A digest of the byte table and the accepting states (a call-free DFA's identity up to its numbering:
        minimal DFAs of one language, numbered by :meth:`reduced`, have the same digest). Made when first asked
        for.

        The table is hashed in a compact form that only it gives and that gives it back: each byte's class of
        identical columns (numbered in byte order) and one column per class. A string automaton of thousands of
        states reads a few dozen distinct columns, so this hashes a tenth of the bytes (a 5,476-state counted
        email: 2 ms instead of 7)."""
        reps, class_of = column_classes(self.trans)
        digest = hashlib.sha256(class_of.astype(np.uint8).tobytes())
        digest.update(np.take(self.trans, reps, axis=1).tobytes())
        digest.update(self.accepting.tobytes())
        return digest.digest()[:16]

    @property
    def is_empty(self) -> bool:
        """True when the automaton matches nothing at all."""
        return not bool(self.accepting.any())

    def _edges(self) -> np.ndarray:
        """Byte and call columns side by side (what trimming and minimisation look at)."""
        return np.ascontiguousarray(np.hstack([self.trans, self.calls])) if self.callees else self.trans

    def reduced(self) -> ByteDFA:
        """The equivalent trimmed DFA with the fewest states, numbered breadth first from the start (so equal
        languages give equal tables): states that cannot reach acceptance, or that the start cannot reach, are
        dropped, and the rest refined (:func:`partial_dfa_blocks`) over the classes of identical columns. One
        compiled kernel, so a small rule costs microseconds."""
        table, accepting = _reduce(self._edges(), self.accepting)
        if table.shape[0] == self.num_states and self.callees == () and np.array_equal(table, self.trans):
            return self
        return ByteDFA(
            np.ascontiguousarray(table[:, :256]), accepting, np.ascontiguousarray(table[:, 256:]), self.callees
        )

    def without_words(self, words: list[bytes]) -> ByteDFA:
        """This minimal, trimmed, call-free DFA's language less the given ``words``, as the minimal DFA numbered
        as :meth:`reduced` numbers states, built without a minimisation pass (see :func:`_trie_complement`).

        The language must be prefix-free (an accepting state reads nothing, as for a quoted JSON string) and each
        word in it: ValueError otherwise. :class:`~constrain.errors.AutomatonTooLarge` when the result would have
        more than :data:`~constrain.automata.limits.MAX_DFA_STATES` states (found before its table is made)."""
        if not self._prefix_free:
            raise StructureError("without_words needs a call-free DFA whose accepting states read nothing")
        data, offsets = _packed(words)
        trans, accepting, status, accepts = _trie_complement(data, offsets, self.trans, self.accepting, MAX_DFA_STATES)
        if status == 1:
            raise StructureError("a word to remove is not in the language")
        if status == 2:
            raise AutomatonTooLarge(f"the automaton needs more than {MAX_DFA_STATES:,} DFA states")
        out = ByteDFA(trans, accepting)
        object.__setattr__(out, "_words_removed_from", self)
        # every state is reached from the start (numbered breadth first from it), so acceptance is reachable
        # exactly when some state accepts: known now for the grammar checks, which ask it of every such rule
        out._call_free_acceptance[True] = accepts
        return out

    @cached_property
    def _prefix_free(self) -> bool:
        """Whether it is call-free and its accepting states read nothing (what :meth:`without_words` needs): asked
        once per DFA, since the same string automaton has names removed for every object's keys."""
        return not self.calls.shape[1] and not bool((self.trans[self.accepting] >= 0).any())

    @property
    def words_removed_from(self) -> ByteDFA | None:
        """The DFA this one was made from by :meth:`without_words`, or None."""
        return self.__dict__.get("_words_removed_from")

    @cached_property
    def states_before_removal(self) -> np.ndarray | None:
        """For a DFA made by :meth:`without_words`: per state, the state of :attr:`words_removed_from` that the
        same text leads to (whose language is this state's plus finitely many words). None for another DFA."""
        base = self.words_removed_from
        if base is None:
            return None
        pairs, ok = _paired_states(self.trans, base.trans)
        return pairs if ok else None

    def numbered_breadth_first(self) -> ByteDFA:
        """This call-free DFA with its states numbered as :meth:`reduced` numbers them: for an automaton built
        minimal, with every state reachable, the canonical table without the cost of minimising. Its own arrays
        are renumbered in place and returned in a new DFA, so this one must be a table just built that nothing
        else holds."""
        order = _bfs_order(self.trans, np.arange(self.num_states, dtype=np.int32), self.num_states)
        if (order < 0).any():
            raise StructureError("a state cannot be reached from the start")
        _renumber_in_place(self.trans, self.accepting, order)
        return ByteDFA(self.trans, self.accepting)

    @cached_property
    def _language_hashes(self) -> dict[int, np.ndarray]:
        return {}

    def language_hashes(self, depth: int) -> np.ndarray:
        """:func:`bounded_language_hashes` of this call-free DFA's states, computed once per depth: rule DFAs are
        shared across structures, so a lexical rule is hashed once per process."""
        hashes = self._language_hashes.get(depth)
        if hashes is None:
            hashes = bounded_language_hashes(self.trans, self.accepting, depth)
            hashes.flags.writeable = False
            self._language_hashes[depth] = hashes
        return hashes

    def reaches_acceptance(self, usable_calls: np.ndarray, byte_edges: bool = True) -> bool:
        """Whether acceptance is reachable from the start through the call columns marked in ``usable_calls``
        (bool, one per callee) and, when ``byte_edges``, through byte edges. Kept for a call-free DFA, whose
        answer never changes (rule DFAs are shared by every grammar that uses them)."""
        if self.callees:
            return bool(_reaches_acceptance(self.trans, self.calls, self.accepting, usable_calls, byte_edges))
        known = self._call_free_acceptance
        if byte_edges not in known:
            known[byte_edges] = bool(_reaches_acceptance(self.trans, self.calls, self.accepting, usable_calls,
                                                         byte_edges))  # fmt: skip
        return known[byte_edges]

    @cached_property
    def _call_free_acceptance(self) -> dict[bool, bool]:
        return {}

    def matches(self, data: bytes) -> bool:
        """Whether ``data`` is accepted (a slow reference used by tests and error messages)."""
        state = 0
        for byte in data:
            state = int(self.trans[state, byte])
            if state < 0:
                return False
        return bool(self.accepting[state])


_HASH_MULTIPLIERS = np.random.default_rng(0x636F6E737472).integers(1, 2**63, size=256, dtype=np.uint64) | np.uint64(1)


def bounded_language_hashes(trans: np.ndarray, accepting: np.ndarray, depth: int) -> np.ndarray:
    """Per state of a trimmed, call-free DFA: a 64-bit hash of its language cut at ``depth`` bytes.

    Two states get the same hash when (up to a hash collision, about 2^-64 per pair) every string of at most
    ``depth`` bytes leads them both to the dead state, or both to accepting states, or both to live
    non-accepting ones. A token walk only reads tokens of at most the trie's depth, so such states have the same
    walk: this is what lets a string of ``maxLength`` 500 share the walk of an unbounded string once fewer than
    500 characters fit in any token, and lets different structures share the walks of the same lexical pieces.
    """
    return _bounded_hashes(np.ascontiguousarray(trans, dtype=np.int32), accepting, depth, _HASH_MULTIPLIERS)


@njit(cache=True)
def mix64(x):
    """A 64-bit finaliser (SplitMix64's): every input bit flips about half the output bits."""
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


@njit(cache=True)
def _bounded_hashes(trans, accepting, depth, multipliers):
    """Round k hashes each state's acceptance with the round k-1 hashes of its targets (the dead state has a
    constant hash), each weighted by the sum of the multipliers of the bytes leading there; ``depth`` rounds.
    The sum is linear, so the bytes are grouped by target once: a round then costs one term per distinct target
    of a state (a few, for a string's states) instead of one per byte class."""
    n, width = trans.shape
    seen = np.full(n + 1, -1, dtype=np.int64)  # per target + 1: the last state that led there
    slot = np.empty(n + 1, dtype=np.int64)
    ptr = np.zeros(n + 1, dtype=np.int64)
    for s in range(n):
        count = 0
        for b in range(width):
            t = trans[s, b] + 1
            if seen[t] != s:
                seen[t] = s
                count += 1
        ptr[s + 1] = ptr[s] + count
    targets = np.empty(ptr[n], dtype=np.int32)
    weights = np.zeros(ptr[n], dtype=np.uint64)
    seen[:] = -1
    for s in range(n):
        count = ptr[s]
        for b in range(width):
            t = trans[s, b] + 1
            if seen[t] != s:
                seen[t] = s
                slot[t] = count
                targets[count] = t - 1
                count += 1
            weights[slot[t]] += multipliers[b]
    base = np.empty(n, dtype=np.uint64)
    for s in range(n):
        base[s] = np.uint64(0x2545F4914F6CDD1D) if accepting[s] else np.uint64(0x3C6EF372FE94F82B)
    hashes = np.empty(n, dtype=np.uint64)
    for s in range(n):
        hashes[s] = mix64(base[s])
    nxt = np.empty(n, dtype=np.uint64)
    dead = np.uint64(0x9E3779B97F4A7C15)
    for _ in range(depth):
        for s in range(n):
            acc = np.uint64(0)
            for k in range(ptr[s], ptr[s + 1]):
                t = targets[k]
                acc += (hashes[t] if t >= 0 else dead) * weights[k]
            nxt[s] = mix64(acc ^ base[s])
        hashes, nxt = nxt, hashes
    return hashes


# --------------------------------------------------------------------------------------------------------------
# Kernels


@njit(cache=True)
def _reaches_acceptance(trans, calls, accepting, usable_calls, byte_edges):
    n = trans.shape[0]
    seen = np.zeros(n, dtype=np.bool_)
    stack = np.empty(n, dtype=np.int32)
    seen[0] = True
    stack[0] = 0
    top = 1
    while top > 0:
        top -= 1
        s = stack[top]
        if accepting[s]:
            return True
        for k in range(calls.shape[1]):
            t = calls[s, k]
            if usable_calls[k] and t >= 0 and not seen[t]:
                seen[t] = True
                stack[top] = t
                top += 1
        if byte_edges:
            for b in range(256):
                t = trans[s, b]
                if t >= 0 and not seen[t]:
                    seen[t] = True
                    stack[top] = t
                    top += 1
    return False


@njit(cache=True)
def _paired_states(trans, base_trans):
    """``(pairs, ok)``: per state of ``trans``, the state of ``base_trans`` the same text leads to from both
    starts (-1 for a state the start cannot reach); ``ok`` False when a text leads ``trans`` somewhere but the base
    to the dead state, or the same state to two base states (then the base is not a superset automaton)."""
    n = trans.shape[0]
    pairs = np.full(n, -1, dtype=np.int32)
    queue = np.empty(n, dtype=np.int32)
    pairs[0] = 0
    queue[0] = 0
    head, tail = 0, 1
    while head < tail:
        a = queue[head]
        head += 1
        b = pairs[a]
        for byte in range(256):
            x = trans[a, byte]
            if x < 0:
                continue
            y = base_trans[b, byte]
            if y < 0:
                return pairs, False
            if pairs[x] < 0:
                pairs[x] = y
                queue[tail] = x
                tail += 1
            elif pairs[x] != y:
                return pairs, False
    return pairs, True


@njit(cache=True)
def _trie_complement(data, offsets, trans, accepting, max_states):
    """``(table, accepting, status, whether some state accepts)`` for :meth:`ByteDFA.without_words`: the words
    (``data[offsets[i]:offsets[i+1]]``) form a trie that runs beside the DFA, and a byte the trie does not read
    continues in the DFA.

    The result is minimal as built once equal subtries are merged: two trie nodes are equivalent exactly when
    the DFA is in the same state there and their children read the same bytes into equivalent nodes; a trie node
    is never equivalent to a DFA state (it rejects a word below it that the state accepts); a node where a word
    ends is dead (accepting states read nothing, so it is a leaf); the DFA itself is minimal. Merging goes
    bottom-up (a child is made after its parent) with a hash table whose hits are compared in full. States are
    numbered breadth first from the start, as :meth:`ByteDFA.reduced` numbers them. ``status``: 0 done, 1 when a
    word is not accepted, 2 when the result would have more than ``max_states`` states (its table is not made)."""
    num_dfa = trans.shape[0]
    size = data.shape[0] + 1
    first_child = np.full(size, -1, dtype=np.int32)
    sibling = np.full(size, -1, dtype=np.int32)
    byte_of = np.zeros(size, dtype=np.int32)
    state_of = np.zeros(size, dtype=np.int32)
    count = 1
    for w in range(offsets.shape[0] - 1):
        node = 0
        for j in range(offsets[w], offsets[w + 1]):
            b = data[j]
            child = first_child[node]
            while child >= 0 and byte_of[child] != b:
                child = sibling[child]
            if child < 0:
                t = trans[state_of[node], b]
                if t < 0:
                    return np.empty((0, 256), dtype=np.int32), np.empty(0, dtype=np.bool_), 1, False
                child = count
                count += 1
                byte_of[child] = b
                state_of[child] = t
                sibling[child] = first_child[node]
                first_child[node] = child
            node = child
        if not accepting[state_of[node]]:
            return np.empty((0, 256), dtype=np.int32), np.empty(0, dtype=np.bool_), 1, False
    # Classes of trie nodes, leaves (dead) -1.
    class_of = np.full(count, -1, dtype=np.int32)
    rep = np.empty(count, dtype=np.int32)
    class_hash = np.empty(count, dtype=np.uint64)
    slots = 1
    while slots < 2 * count:
        slots *= 2
    table = np.full(slots, -1, dtype=np.int32)
    num_classes = 0
    for node in range(count - 1, -1, -1):
        if first_child[node] < 0 and node > 0:
            continue
        h = np.uint64(state_of[node]) * np.uint64(0x9E3779B97F4A7C15)
        degree = 0
        child = first_child[node]
        while child >= 0:
            x = np.uint64(byte_of[child] * 1_000_003 + class_of[child] + 2) * np.uint64(0xBF58476D1CE4E5B9)
            h += x ^ (x >> np.uint64(31))
            degree += 1
            child = sibling[child]
        slot = np.int64(h & np.uint64(slots - 1))
        found = -1
        while table[slot] >= 0:
            k = table[slot]
            if class_hash[k] == h and state_of[rep[k]] == state_of[node]:
                other = rep[k]
                same = True
                other_degree = 0
                c = first_child[other]
                while c >= 0:
                    other_degree += 1
                    c = sibling[c]
                if other_degree != degree:
                    same = False
                child = first_child[node]
                while same and child >= 0:
                    c = first_child[other]
                    while c >= 0 and byte_of[c] != byte_of[child]:
                        c = sibling[c]
                    if c < 0 or class_of[c] != class_of[child]:
                        same = False
                    child = sibling[child]
                if same:
                    found = k
                    break
            slot = (slot + 1) & (slots - 1)
        if found < 0:
            found = num_classes
            num_classes += 1
            rep[found] = node
            class_hash[found] = h
            table[slot] = found
        class_of[node] = found
    # Breadth first from the root's class over classes (ids 0..num_classes-1) and DFA states (num_classes + q).
    total = num_classes + num_dfa
    if total > max_states:
        return np.empty((0, 256), dtype=np.int32), np.empty(0, dtype=np.bool_), 2, False
    number = np.full(total, -1, dtype=np.int32)
    queue = np.empty(total, dtype=np.int32)
    out = np.full((total, 256), -1, dtype=np.int32)
    out_accepting = np.zeros(total, dtype=np.bool_)
    row = np.empty(256, dtype=np.int32)
    accepts = False
    number[class_of[0]] = 0
    queue[0] = class_of[0]
    head, tail = 0, 1
    while head < tail:
        s = queue[head]
        if s < num_classes:
            node = rep[s]
            q = state_of[node]
            for b in range(256):
                t = trans[q, b]
                row[b] = num_classes + t if t >= 0 else -1
            child = first_child[node]
            while child >= 0:
                row[byte_of[child]] = class_of[child]
                child = sibling[child]
        else:
            q = s - num_classes
            out_accepting[head] = accepting[q]
            accepts = accepts or accepting[q]
            for b in range(256):
                t = trans[q, b]
                row[b] = num_classes + t if t >= 0 else -1
        for b in range(256):
            t = row[b]
            if t >= 0:
                if number[t] < 0:
                    number[t] = tail
                    queue[tail] = t
                    tail += 1
                out[head, b] = number[t]
        head += 1
    return out[:tail].copy(), out_accepting[:tail].copy(), 0, accepts


def _packed(words: list[bytes]) -> tuple[np.ndarray, np.ndarray]:
    """``words`` as the kernels read them: their bytes end to end, and where each begins (one more offset, the
    end)."""
    offsets = np.fromiter(accumulate(map(len, words), initial=0), dtype=np.int64, count=len(words) + 1)
    return np.frombuffer(b"".join(words), dtype=np.uint8), offsets


def words_dfa(words: list[bytes]) -> ByteDFA:
    """The minimal DFA of a finite set of byte strings (an enum's values, a choice), numbered as
    :meth:`ByteDFA.reduced` numbers states: the same automaton as the subset construction of their alternative,
    made from their trie instead, minimised as edges (no table of the trie is written).
    :class:`~constrain.errors.AutomatonTooLarge` when the words hold more than
    :data:`~constrain.automata.limits.MAX_NFA_STATES` bytes (their alternative's NFA would have as many states),
    checked before anything is built, or when the trie has more than
    :data:`~constrain.automata.limits.MAX_DFA_STATES` states, where the subset construction stops too."""
    ordered = sorted(set(words))
    if sum(map(len, ordered)) > MAX_NFA_STATES:
        raise AutomatonTooLarge(f"the automaton needs more than {MAX_NFA_STATES:,} NFA states")
    trans, accepting, too_large = _words_table(*_packed(ordered), MAX_DFA_STATES)
    if too_large:
        raise AutomatonTooLarge(f"the automaton needs more than {MAX_DFA_STATES:,} DFA states")
    return ByteDFA(trans, accepting)


@njit(cache=True)
def _words_table(data, offsets, max_states):
    """``(table, accepting, too_large)`` for :func:`words_dfa`: the trie of the sorted, distinct words
    ``data[offsets[i]:offsets[i+1]]`` as edges (each word shares the states of its common prefix with the one
    before it), grouped by tail (a state's edges are made in byte order, the words being sorted), over classes
    of bytes (each byte read one class, every other byte one class leading nowhere), then minimised."""
    total = data.shape[0]
    tail = np.empty(total, dtype=np.int32)
    label = np.empty(total, dtype=np.int32)
    head = np.empty(total, dtype=np.int32)
    accepting = np.zeros(total + 1, dtype=np.bool_)
    longest = 0
    for w in range(offsets.shape[0] - 1):
        longest = max(longest, offsets[w + 1] - offsets[w])
    path = np.zeros(longest + 1, dtype=np.int32)  # the states along the word before
    states, edges = 1, 0
    for w in range(offsets.shape[0] - 1):
        start, length = offsets[w], offsets[w + 1] - offsets[w]
        common = 0
        if w > 0:
            before, before_length = offsets[w - 1], offsets[w] - offsets[w - 1]
            while common < length and common < before_length and data[start + common] == data[before + common]:
                common += 1
        for i in range(common, length):
            tail[edges] = path[i]
            label[edges] = data[start + i]
            head[edges] = states
            path[i + 1] = states
            states += 1
            edges += 1
        accepting[path[length]] = True
    if states > max_states:
        return np.empty((0, 256), dtype=np.int32), accepting[:0], True
    class_of = np.full(256, -1, dtype=np.int32)
    for e in range(edges):
        class_of[label[e]] = 0
    k = 0
    for b in range(256):
        if class_of[b] == 0:
            class_of[b] = k
            k += 1
    for b in range(256):
        if class_of[b] < 0:
            class_of[b] = k
    first = np.zeros(states + 1, dtype=np.int64)  # a stable counting sort of the edges by tail
    for e in range(edges):
        first[tail[e] + 1] += 1
    for s in range(states):
        first[s + 1] += first[s]
    by_tail = np.empty(edges, dtype=np.int32)
    by_label = np.empty(edges, dtype=np.int32)
    by_head = np.empty(edges, dtype=np.int32)
    for e in range(edges):
        j = first[tail[e]]
        first[tail[e]] += 1
        by_tail[j] = tail[e]
        by_label[j] = class_of[label[e]]
        by_head[j] = head[e]
    reduced, out_accepting = _reduce_edges(states, k + 1, by_tail, by_label, by_head, accepting[:states])
    table = np.empty((reduced.shape[0], 256), dtype=np.int32)
    for s in range(reduced.shape[0]):
        for b in range(256):
            table[s, b] = reduced[s, class_of[b]]
    return table, out_accepting, False
