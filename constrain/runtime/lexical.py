"""The per-vocabulary store of lexical walks, and the masks of lexical states.

The wide states of a structure (inside a string, a number, a date) belong to rules that call no other rule. The
walk of such a state depends only on its language cut at the trie's depth, so it is keyed by a hash of that
language (:func:`~constrain.automata.dfa.bounded_language_hashes`) and shared by every structure over the
vocabulary, in memory and on disk; a new string-like state borrows large first-byte subtrees from a known walk.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass

import numpy as np
from numba import njit

from constrain.automata.dfa import ByteDFA, mix64
from constrain.cache import BoundedCache, cache_dir, read_cache_file, reject_cache_file, write_cache_file
from constrain.vocab.vocabulary import Vocabulary

_NO_RANGES = np.zeros((0, 3), dtype=np.int64)
_NO_RANGES.flags.writeable = False


def _pop_ranges(trie, pops: np.ndarray) -> np.ndarray:
    """Read-only rows (first node, end node, depth read) of the trie subtrees below the pop nodes ``pops``."""
    if not len(pops):
        return _NO_RANGES
    ranges = _subtrees_below(pops, len(pops), trie.node_key, trie.node_next)
    ranges.flags.writeable = False
    return ranges


@njit(cache=True, nogil=True)
def _subtrees_below(pops, count, node_key, node_next):
    """Rows (first node, end node, depth read) of the subtrees below ``pops[:count]``; -1 is the root."""
    found = np.empty((count, 3), dtype=np.int64)
    for k in range(count):
        node = pops[k]
        if node < 0:  # a return before the first byte: the whole trie
            found[k, 0], found[k, 1], found[k, 2] = 0, node_key.shape[0], 0
        else:
            found[k, 0], found[k, 1], found[k, 2] = node + 1, node_next[node], node_key[node] >> 8
    return found


def _entry_bytes(entry: tuple[np.ndarray, np.ndarray]) -> int:
    return entry[0].nbytes + entry[1].nbytes


@njit(cache=True, nogil=True)
def _subtree_keys(trans, hashes, state, first_bytes, borrowable, dead):
    """What ``state`` could lend, by first-byte subtree: the hash of the state after each first byte (``dead``
    where it is dead), and for each large subtree its key in the lender index, that hash mixed with the subtree's
    index (0 where dead). Two states with the same hash after a byte have the same walk below it (up to a hash
    collision)."""
    after = np.empty(first_bytes.shape[0], dtype=np.uint64)
    for j in range(first_bytes.shape[0]):
        t = trans[state, first_bytes[j]]
        after[j] = hashes[t] if t >= 0 else dead
    keys = np.zeros(borrowable.shape[0], dtype=np.uint64)
    for k in range(borrowable.shape[0]):
        if after[borrowable[k]] != dead:
            keys[k] = mix64(after[borrowable[k]] ^ mix64(np.uint64(k + 1))) | np.uint64(1)
    return after, keys


@njit(cache=True, nogil=True)
def _index_find(table_keys, table_walks, keys):
    """(found, walk) per key of the open-addressing table ``table_keys``/``table_walks``."""
    mask = table_keys.shape[0] - 1
    found = np.zeros(keys.shape[0], dtype=np.bool_)
    walks = np.zeros(keys.shape[0], dtype=np.uint64)
    for i in range(keys.shape[0]):
        key = keys[i]
        if key == 0:
            continue
        slot = np.int64(key & np.uint64(mask))
        while table_keys[slot] != 0:
            if table_keys[slot] == key:
                found[i] = True
                walks[i] = table_walks[slot]
                break
            slot = (slot + 1) & mask
    return found, walks


@njit(cache=True, nogil=True)
def _index_put(table_keys, table_walks, keys, walk):
    """Record ``walk`` under each nonzero key (the table must keep a free slot); returns the keys added."""
    mask = table_keys.shape[0] - 1
    added = 0
    for i in range(keys.shape[0]):
        key = keys[i]
        if key == 0:
            continue
        slot = np.int64(key & np.uint64(mask))
        while table_keys[slot] != 0 and table_keys[slot] != key:
            slot = (slot + 1) & mask
        added += table_keys[slot] == 0
        table_keys[slot] = key
        table_walks[slot] = walk
    return added


@njit(cache=True, nogil=True)
def _two_byte_hashes(trans, hashes, state, first, second, dead):
    """The hash of ``state``'s state after each two-byte node's bytes (``first[p]``, ``second[p]``), or ``dead``."""
    after = np.empty(first.shape[0], dtype=np.uint64)
    for p in range(first.shape[0]):
        t = trans[state, first[p]]
        if t >= 0:
            t = trans[t, second[p]]
        after[p] = hashes[t] if t >= 0 else dead
    return after


@dataclass(frozen=True, eq=False)
class _DeepLender:
    """A large lexical walk, ready to lend the tokens and pops of its two-byte subtrees."""

    after: np.ndarray  # uint64 per two-byte node: the hash of the walk's state after its two bytes (or _DEAD)
    words: np.ndarray  # the walk's mask words
    pops: np.ndarray  # int32, sorted: its pop nodes (a lexical walk's range rows are those of its pop nodes)


@dataclass(frozen=True, eq=False)
class _DeepLenders:
    """The deep lenders stacked for the walk kernel: slot ``l`` is row ``l`` of ``after`` and ``words``, and
    ``pops[pops_ptr[l]:pops_ptr[l + 1]]``."""

    keys: tuple[int, ...]
    after: np.ndarray  # uint64 (L, two-byte nodes)
    words: np.ndarray  # uint32 (L, width)
    pops: np.ndarray  # int32
    pops_ptr: np.ndarray  # int64 (L + 1,)

    @classmethod
    def stack(cls, lenders: dict[int, _DeepLender], num_depth2: int, width: int) -> _DeepLenders:
        found = list(lenders.values())
        return cls(
            tuple(lenders),
            np.stack([d.after for d in found]) if found else np.zeros((0, num_depth2), dtype=np.uint64),
            np.stack([d.words for d in found]) if found else np.zeros((0, width), dtype=np.uint32),
            np.concatenate([d.pops for d in found] + [np.zeros(0, dtype=np.int32)]),
            np.cumsum([0] + [len(d.pops) for d in found], dtype=np.int64),
        )


class LexicalMasks:
    """Local walks of lexical (call-free) rule states, one store per vocabulary, shared by every structure.

    A call-free state's walk depends only on its language cut at the trie's depth, so walks are keyed by
    :func:`~constrain.automata.dfa.bounded_language_hashes`: equal pieces in different schemas (a JSON string, a
    number, a date) share one walk, kept in memory and on disk under ``cache_dir("masks", ...)``.

    The store also composes new walks from old ones. Below the trie node of a first byte ``b``, a state's walk
    depends only on the state ``b`` leads to; so a new state borrows that subtree from any known walk whose state
    leads, on ``b``, to an equal language. A string state that differs from a plain string in one character
    (inside a property name the schema excludes) walks only that character's subtree.

    One level down the same holds: inside a walked first-byte subtree, a two-byte node whose state has the
    language of a large known walk's state after the same two bytes takes that walk's tokens and pops. The state
    of "any key but these names" after ``{"a`` differs from a plain string, but after ``{"ab`` it is one again
    (unless a declared name starts with ``ab``): the ``a`` subtree's ten thousand tokens are then mostly borrowed.
    """

    #: Bumped whenever what a walk records, or its file, changes, so stale files on disk are never read.
    FORMAT = 6
    _stores: dict[str, LexicalMasks] = {}
    _stores_lock = threading.Lock()
    #: Bytes of walks kept in memory per vocabulary (the disk keeps the rest).
    MAX_BYTES = 256 * 1024 * 1024
    #: Most (hash, first byte) lender keys remembered before the index starts over.
    MAX_LENDERS = 262_144
    #: Slots of the lender index at first (a power of two); it doubles while it is more than half full.
    FIRST_LENDER_SLOTS = 8192
    #: First-byte subtrees with fewer tokens than this are walked, not borrowed.
    MIN_BORROWED_TOKENS = 256
    #: Large walks kept as lenders of two-byte subtrees. A lender's credit starts at the two-byte nodes where its
    #: state comes back to itself (all of them for a plain string's body, the state most names and strings come
    #: back to) and grows by the nodes it lends; a new walk replaces the lender with the least credit when it
    #: starts with more, and the others' credit is then halved. So a stream of large walks that seldom lend
    #: (formats, counted strings) does not push out the lenders in use.
    MAX_DEEP_LENDERS = 4
    #: Hash of a dead state after two bytes in a deep lender's table: matches no live state (up to 2^-64).
    _DEAD = np.uint64(0x9E3779B97F4A7C15)

    def __init__(self, vocab: Vocabulary):
        self.vocab = vocab
        self.folder = cache_dir("masks", f"v{self.FORMAT}", vocab.fingerprint[:32])  # None: memory only
        # The walks saved by earlier processes, listed once: a new state's lookup then costs no system call.
        self._on_disk = set() if self.folder is None else {n for n in os.listdir(self.folder) if n.endswith(".walk")}
        trie = vocab.trie
        self.depth = trie.max_depth
        first = [0] if trie.num_nodes else []
        while first and trie.node_next[first[-1]] < trie.num_nodes:
            first.append(int(trie.node_next[first[-1]]))
        self.first_nodes = np.asarray(first, dtype=np.int32)
        self.first_bytes = trie.node_byte[self.first_nodes].astype(np.int64)
        spans = trie.node_token_ptr[trie.node_next[self.first_nodes]] - trie.node_token_ptr[self.first_nodes]
        self.borrowable = np.flatnonzero(spans >= self.MIN_BORROWED_TOKENS)  # indices into first_nodes
        self._subtree_slot = np.full(len(first), -1, dtype=np.int32)  # first-node index -> row of _subtree_words
        self._subtree_slot[self.borrowable] = np.arange(len(self.borrowable), dtype=np.int32)
        self._no_subtrees = np.zeros(len(first), dtype=np.bool_)
        width = (vocab.size + 31) // 32
        self._subtree_words = np.zeros((len(self.borrowable), width), dtype=np.uint32)
        for k, j in enumerate(self.borrowable):
            self._subtree_words[k] = self._token_words(j)
        # The small subtrees have no keys in the lender index (they would crowd it): a walk borrows them from its
        # main lender, found through the large ones.
        self._small = np.setdiff1d(np.arange(len(first)), self.borrowable)
        self._small_words = np.zeros(width, dtype=np.uint32)
        for j in self._small:
            self._small_words |= self._token_words(j)
        # The tokens outside the trie (the rest of the last word too): a walk read from disk may allow none.
        self._not_trie_words = ~(self._small_words | np.bitwise_or.reduce(self._subtree_words, axis=0))
        # The two-byte nodes, with their first-byte subtree (index into first_nodes) and their two bytes.
        self.depth2_nodes = np.flatnonzero(trie.node_depth == 2).astype(np.int32)
        self._depth2_subtree = np.searchsorted(self.first_nodes, self.depth2_nodes, side="right") - 1
        self._depth2_first = self.first_bytes[self._depth2_subtree]
        self._depth2_second = trie.node_byte[self.depth2_nodes].astype(np.int64)
        self._deep_lenders: dict[int, _DeepLender] = {}  # walk key -> lender
        self._deep_credit: dict[int, float] = {}  # walk key -> see MAX_DEEP_LENDERS
        self._deep = _DeepLenders.stack({}, len(self.depth2_nodes), width)  # the same, as the kernel reads them
        #: Two-byte nodes borrowed from deep lenders so far (a statistic for tests and benchmarks).
        self.deep_borrowed_nodes = 0
        self._entries = BoundedCache(self.MAX_BYTES)  # bounded-language hash -> (words, pop ranges)
        # An open-addressing table (in arrays, read by kernels) from the key of a large subtree's language to the
        # walk that lends it, and each lending walk's hashes after each first byte (see _subtree_keys).
        # It starts small and doubles up to twice MAX_LENDERS slots (a few thousand keys serve most processes).
        self._lender_keys = np.zeros(self.FIRST_LENDER_SLOTS, dtype=np.uint64)  # 0: an empty slot
        self._lender_walks = np.zeros(self.FIRST_LENDER_SLOTS, dtype=np.uint64)
        self._num_lenders = 0
        self._walk_after: dict[int, np.ndarray] = {}
        # Lending walk -> (its pop ranges, the first-byte subtree of each).
        self._lent_ranges: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self._scratch = threading.local()
        self._lock = threading.Lock()
        # Reading a walk back costs about what walking a few thousand tokens does: only large walks are saved.
        self.persist_min_tokens = max(1, vocab.size // 4)

    @classmethod
    def of(cls, vocab: Vocabulary) -> LexicalMasks:
        with cls._stores_lock:
            store = cls._stores.get(vocab.fingerprint)
            if store is None:
                store = cls._stores[vocab.fingerprint] = cls(vocab)
            return store

    def _token_words(self, j: int) -> np.ndarray:
        """The tokens of first-byte subtree ``j`` as packed words."""
        trie = self.vocab.trie
        node = self.first_nodes[j]
        ids = trie.token_ids[trie.node_token_ptr[node] : trie.node_token_ptr[trie.node_next[node]]]
        words = np.zeros((self.vocab.size + 31) // 32, dtype=np.uint32)
        np.bitwise_or.at(words, ids >> 5, np.left_shift(np.uint32(1), (ids & 31).astype(np.uint32)))
        return words

    def walk(self, trans: np.ndarray, accepting: np.ndarray, hashes: np.ndarray, state: int):
        """(words, pop ranges) of a call-free state: global ``trans``/``accepting`` and the bounded-language
        ``hashes`` of its rule's states (indexed by global state)."""
        key = int(hashes[state])
        entry = self._entries.get(key)
        if entry is None:
            name = f"{key:016x}.walk"
            entry = self._load(self.folder / name, key) if name in self._on_disk else None
            if entry is None:
                self._on_disk.discard(name)
                entry, walked_tokens, (after, keys) = self._compose(trans, accepting, hashes, state)
                large = walked_tokens >= self.persist_min_tokens
                if large and self.folder is not None and self._save(self.folder / name, key, entry):
                    self._on_disk.add(name)
            else:
                after, keys = self._subtree_keys(trans, hashes, state)
                large = True  # only large walks are saved
            self._entries.put(key, entry, _entry_bytes(entry))
            # Only a large walk lends two-byte subtrees: such walks (a plain string's) are few, and a composed
            # one would mostly lend back what it borrowed.
            deep = self._deep_lender(trans, hashes, state, entry) if large else None
            with self._lock:
                if self._num_lenders + len(keys) > self.MAX_LENDERS:
                    self._lender_keys[:] = 0
                    self._num_lenders = 0
                    self._lent_ranges.clear()
                    self._walk_after.clear()
                while 2 * (self._num_lenders + len(keys)) > len(self._lender_keys):
                    self._grow_lender_index()
                # The latest walk becomes the lender of each of its subtrees, even those it borrowed: its words are
                # the likeliest to be in the CPU cache still (keeping the first lender measured slower).
                self._num_lenders += _index_put(self._lender_keys, self._lender_walks, keys, np.uint64(key))
                self._walk_after[key] = after
                if deep is not None and key not in self._deep_lenders:
                    self._admit_deep_lender(key, deep, int(np.count_nonzero(deep.after == hashes[state])))
        return entry

    def walk_without_words(self, dfa: ByteDFA, state: int) -> tuple[np.ndarray, np.ndarray] | None:
        """(words, pop ranges) of ``state`` of a DFA made by :meth:`~constrain.automata.dfa.ByteDFA.without_words` (the
        keys of an object other than its properties), from the walk of the state it pairs with in the DFA the words
        were removed from (a plain string's, which every structure shares): the same but for the tokens that end
        exactly where a removed word does, and for the returns after them. Each new set of names would otherwise
        have its walks composed, state by state along the names, which are the slowest masks of open objects.
        None for another DFA, or where the two differ in another way (they do not, as built)."""
        pairs = dfa.states_before_removal
        if pairs is None or pairs[state] < 0:
            return None
        base = dfa.words_removed_from
        base_hashes = base.language_hashes(self.depth)
        base_words, base_ranges = self.walk(base.trans, base.accepting, base_hashes, int(pairs[state]))
        trie = self.vocab.trie
        nodes = self._pops_buffer()
        status, count = _removed_nodes(
            dfa.trans, dfa.accepting, dfa.language_hashes(self.depth), state, base.trans, base.accepting, base_hashes,
            int(pairs[state]), trie.node_key, trie.node_next, trie.root_children, trie.max_depth, nodes,
        )  # fmt: skip
        if status:
            return None
        if not count:
            return base_words, base_ranges
        removed = nodes[:count]
        words = base_words.copy()
        _clear_node_tokens(words, removed, trie.node_token_ptr, trie.token_ids)
        words.flags.writeable = False
        ranges = base_ranges[~np.isin(base_ranges[:, 0] - 1, removed)] if len(base_ranges) else base_ranges
        ranges.flags.writeable = False
        return words, ranges

    def _admit_deep_lender(self, key: int, deep: _DeepLender, credit: int) -> None:
        """Keep ``deep`` as a lender, in place of the one with the least credit if there is no room and it has
        less credit than ``deep`` starts with (see MAX_DEEP_LENDERS). Called with the lock held."""
        if len(self._deep_lenders) >= self.MAX_DEEP_LENDERS:
            least = min(self._deep_credit, key=self._deep_credit.__getitem__)
            if self._deep_credit[least] >= credit:
                return
            del self._deep_lenders[least], self._deep_credit[least]
            self._deep_credit = {k: n / 2 for k, n in self._deep_credit.items()}
        self._deep_lenders[key] = deep
        self._deep_credit[key] = credit
        self._deep = _DeepLenders.stack(self._deep_lenders, len(self.depth2_nodes), len(deep.words))

    def _deep_lender(self, trans, hashes, state: int, entry: tuple[np.ndarray, np.ndarray]) -> _DeepLender:
        """A walk as a lender of two-byte subtrees: the hash of its state after each two-byte node's bytes."""
        after = _two_byte_hashes(trans, hashes, state, self._depth2_first, self._depth2_second, self._DEAD)
        return _DeepLender(after, entry[0], np.sort(entry[1][:, 0] - 1).astype(np.int32))

    def _subtree_keys(self, trans, hashes, state) -> tuple[np.ndarray, np.ndarray]:
        """``state``'s hashes after each first byte, and its large subtrees' keys in the lender index."""
        return _subtree_keys(trans, hashes, state, self.first_bytes, self.borrowable, self._DEAD)

    def _ranges_by_subtree(self, walk_key: int, ranges: np.ndarray) -> np.ndarray:
        """The first-byte subtree (index into ``first_nodes``) of each pop range of a lending walk, kept per walk
        with the ranges it was computed from: a walk evicted and composed again lists the same ranges in another
        order (its lenders differ), and rows taken by a stale index would be wrong ones."""
        found = self._lent_ranges.get(walk_key)
        if found is None or found[0] is not ranges:
            found = (ranges, np.searchsorted(self.first_nodes, ranges[:, 0] - 1, side="right") - 1)
            self._lent_ranges[walk_key] = found
        return found[1]

    def _pops_buffer(self) -> np.ndarray:
        """A per-thread scratch array for the pop nodes of one walk (one entry per trie node at most)."""
        buffer = getattr(self._scratch, "pops", None)
        if buffer is None:
            buffer = self._scratch.pops = np.empty(self.vocab.trie.num_nodes, dtype=np.int32)
        return buffer

    def _grow_lender_index(self) -> None:
        """Double the lender index, each key kept with its walk (under the lock)."""
        keys, walks = self._lender_keys, self._lender_walks
        self._lender_keys = np.zeros(2 * len(keys), dtype=np.uint64)
        self._lender_walks = np.zeros(2 * len(keys), dtype=np.uint64)
        used = keys != 0
        keys, walks = keys[used], walks[used]
        for walk in np.unique(walks):
            _index_put(self._lender_keys, self._lender_walks, keys[walks == walk], walk)

    def _compose(self, trans, accepting, hashes, state):
        """(walk, tokens walked, the state's first-byte keys) of a state not seen yet."""
        trie = self.vocab.trie
        words = np.zeros((self.vocab.size + 31) // 32, dtype=np.uint32)
        lender_of = np.full(len(self.first_nodes), -1, dtype=np.int32)
        lenders: list[tuple[int, tuple[np.ndarray, np.ndarray]]] = []
        main_live = self._no_subtrees
        small_whole = False
        after, keys = self._subtree_keys(trans, hashes, state)
        with self._lock:
            found, walk_keys = _index_find(self._lender_keys, self._lender_walks, keys)
        units = np.flatnonzero(found)
        named = walk_keys[units]
        # The main lender is the walk the index names for most large subtrees. It lends every subtree where its
        # state after the byte hashes as this one's, small ones too; the others lend what is left.
        for _, walk_key in sorted(((np.count_nonzero(named == w), w) for w in set(named.tolist())), reverse=True):
            lender, lender_after = self._entries.get(walk_key), self._walk_after.get(walk_key)
            if lender is None or lender_after is None:
                continue
            if lenders:
                lent = self.borrowable[units[named == walk_key]]
                lent = lent[lender_of[lent] < 0]
            else:
                same = lender_after == after
                lent = np.flatnonzero(same & (after != self._DEAD))
                main_live = lender_after != self._DEAD
                small_whole = bool(same[self._small].all())
            if len(lent):
                lender_of[lent] = len(lenders)
                lenders.append((walk_key, lender))
        if len(lenders) == 1:
            lender_words = lenders[0][1][0].reshape(1, -1)
        elif lenders:
            lender_words = np.stack([entry[0] for _, entry in lenders])
        else:
            lender_words = np.zeros((1, 1), dtype=np.uint32)
        deep = self._deep
        used = np.zeros(len(deep.keys), dtype=np.int64)
        pops = self._pops_buffer()
        num_pops, walked_tokens = _walk_lexical(
            trans, accepting, hashes, state, self.first_nodes, self.first_bytes, lender_of, lender_words, main_live,
            small_whole, self._subtree_slot, self._subtree_words, self._small_words, trie.node_key, trie.node_next,
            trie.node_token_ptr, trie.token_ids, self.depth, words, pops, self.depth2_nodes, deep.after, deep.words,
            deep.pops, deep.pops_ptr, used,
        )  # fmt: skip
        if used.any():
            self.deep_borrowed_nodes += int(used.sum())
            with self._lock:
                for walk_key, n in zip(deep.keys, used.tolist()):
                    if n and walk_key in self._deep_credit:
                        self._deep_credit[walk_key] += n
        rows = [_pop_ranges(trie, pops[:num_pops])]
        for slot, (walk_key, (_, lender_ranges)) in enumerate(lenders):
            if len(lender_ranges):
                subtree = self._ranges_by_subtree(walk_key, lender_ranges)
                rows.append(lender_ranges[lender_of[subtree] == slot])
        ranges = np.concatenate(rows) if len(rows) > 1 else rows[0]
        words.flags.writeable = False
        ranges.flags.writeable = False
        return (words, ranges), int(walked_tokens), (after, keys)

    def _owner(self, key: int) -> str:
        """Whose a walk file is: this format, vocabulary and key (see :func:`~constrain.cache.write_cache_file`)."""
        return f"constrain.LexicalMasks/{self.FORMAT}/{self.vocab.fingerprint}/{key:016x}"

    def _load(self, path, key: int) -> tuple[np.ndarray, np.ndarray] | None:
        """The walk of ``key`` saved by :meth:`_save`: the pop ranges (int64 rows of 3), then the mask words (both
        aligned where they lie). None when it is missing, or damaged (then reported and deleted, see
        :func:`~constrain.cache.open_cache_file`)."""
        width = (self.vocab.size + 31) // 32
        payload = read_cache_file(path, self._owner(key), max_bytes=4 * width + 24 * self.vocab.trie.num_nodes)
        if payload is None:
            return None
        if payload.size < 4 * width or (payload.size - 4 * width) % 24:
            reject_cache_file(path, f"{payload.size} bytes do not hold {width} mask words and rows of pop ranges")
            return None
        ranges = payload[: payload.size - 4 * width].view(np.int64).reshape(-1, 3)
        words = payload[payload.size - 4 * width :].view(np.uint32)
        problem = self._walk_problem(words, ranges)
        if problem is not None:
            reject_cache_file(path, problem)
            return None
        return words, ranges

    def _walk_problem(self, words: np.ndarray, ranges: np.ndarray) -> str | None:
        """What makes a walk read from disk unfit for the kernels, or None. A file can pass its checksum and still
        be wrong (a writer can recompute it): every pop range must be one the walks record, the subtree below a
        trie node with children, ``(node + 1, node_next[node], node_depth[node])``, each node once; the words may
        allow only tokens of the trie."""
        if np.bitwise_and(words, self._not_trie_words).any():
            return "its mask allows tokens outside the vocabulary's trie"
        if not len(ranges):
            return None
        trie = self.vocab.trie
        first = ranges[:, 0]
        if first.min() < 1 or first.max() > trie.num_nodes:
            return "a pop range starts outside the trie"
        nodes = first - 1
        ends = trie.node_next[nodes]
        if not (
            (ranges[:, 1] == ends).all() and (ranges[:, 2] == trie.node_depth[nodes]).all() and (ends > first).all()
        ):
            return "a pop range is not the subtree below a trie node"
        nodes.sort()
        if (nodes[1:] == nodes[:-1]).any():
            return "a pop range is repeated"
        return None

    def _save(self, path, key: int, entry: tuple[np.ndarray, np.ndarray]) -> bool:
        """Write a walk for later processes; False when the cache folder cannot be written (a read-only cache only
        costs the walk next time)."""
        return write_cache_file(path, self._owner(key), np.ascontiguousarray(entry[1], dtype=np.int64), entry[0])


@njit(cache=True, nogil=True)
def _removed_nodes(
    trans,
    accepting,
    hashes,
    state,
    base_trans,
    base_accepting,
    base_hashes,
    base_state,
    node_key,
    node_next,
    root_children,
    depth_cap,
    out,
):
    """The trie nodes (into ``out``) where ``state`` of a DFA less some words rejects what ``base_state`` of the
    DFA they were removed from accepts, reading both side by side down the trie and skipping every subtree where
    their states have the same bounded language. Returns ``(status, count)``: status 1 when the two differ in
    another way than by words that end in an accepting base state which reads nothing more (or ``out`` is full)."""
    stack = np.empty((2, depth_cap + 1), dtype=np.int32)
    stack[0, 0] = state
    stack[1, 0] = base_state
    count = 0
    for first in range(256):
        child = root_children[first]
        if child < 0:
            continue
        i = child
        end = node_next[child]
        while i < end:
            key = node_key[i]
            depth = key >> 8
            byte = key & 255
            a = trans[stack[0, depth - 1], byte]
            b = base_trans[stack[1, depth - 1], byte]
            if (a < 0 and b < 0) or (a >= 0 and b >= 0 and hashes[a] == base_hashes[b]):
                i = node_next[i]
                continue
            if a < 0:  # a removed word ends here, if the base's state there accepts and reads nothing more
                if not base_accepting[b] or count == out.shape[0]:
                    return 1, count
                for c in range(256):
                    if base_trans[b, c] >= 0:
                        return 1, count
                out[count] = i
                count += 1
                i = node_next[i]
                continue
            if b < 0 or accepting[a] != base_accepting[b]:
                return 1, count
            stack[0, depth] = a
            stack[1, depth] = b
            i += 1
    return 0, count


@njit(cache=True, nogil=True)
def _clear_node_tokens(words, nodes, node_token_ptr, token_ids):
    """Clear in ``words`` the tokens that end at the trie ``nodes``."""
    for node in nodes:
        _clear_tokens(words, token_ids, node_token_ptr[node], node_token_ptr[node + 1])


@njit(cache=True, nogil=True)
def _walk_lexical(
    trans,
    accepting,
    hashes,
    state,
    first_nodes,
    first_bytes,
    lender_of,
    lender_words,
    main_live,
    small_whole,
    subtree_slot,
    subtree_words,
    small_words,
    node_key,
    node_next,
    node_token_ptr,
    token_ids,
    depth_cap,
    out,
    pops,
    depth2_nodes,
    deep_after,
    deep_words,
    deep_pops,
    deep_pops_ptr,
    deep_used,
):
    """The walk of a call-free state: a plain DFA walk that records, as pops, the trie nodes with children where
    the state is accepting. A first-byte subtree with a lender (``lender_of[j] >= 0``) is not walked: its tokens
    are the lender's (lender 0 lends most; ``main_live[j]`` says where it has tokens of its own, ``small_whole``
    whether it lends all the small subtrees); its pops are the lender's, added by the caller. ``subtree_words``
    holds the large subtrees' tokens (row ``subtree_slot[j]``), ``small_words`` those of all the small ones.
    Neither is a two-byte node ``depth2_nodes[p]`` whose state hashes as deep lender ``l``'s state did there
    (``deep_after[l, p]``): its tokens are those ``deep_words[l]`` allows, its pops are that lender's pops inside
    it, and ``deep_used[l]`` counts it. Returns (pops written, tokens walked)."""
    width = out.shape[0]
    if lender_of.max() >= 0:
        # The main lender (0) lends most. Its tokens come in by one pass over the words of each large subtree it
        # lends, or by one pass over its words less those of the small subtrees (the ones it lends are copied
        # below) and of the large subtrees it has tokens in but does not lend: whichever reads fewer subtrees.
        lent = 0
        kept = 0
        for j in range(first_nodes.shape[0]):
            if subtree_slot[j] >= 0:
                lent += lender_of[j] == 0
                kept += lender_of[j] != 0 and main_live[j]
        main = lender_words[0]
        if lent <= kept:
            for j in range(first_nodes.shape[0]):
                if subtree_slot[j] >= 0 and lender_of[j] == 0:
                    _or_and(out, main, subtree_words[subtree_slot[j]])
            if small_whole:
                _or_and(out, main, small_words)
        else:
            excluded = np.zeros_like(small_words) if small_whole else small_words.copy()
            for j in range(first_nodes.shape[0]):
                if subtree_slot[j] >= 0 and lender_of[j] != 0 and main_live[j]:
                    _or(excluded, subtree_words[subtree_slot[j]])
            for w in range(width):
                out[w] |= main[w] & ~excluded[w]
        for j in range(first_nodes.shape[0]):
            if subtree_slot[j] >= 0 and lender_of[j] > 0:
                _or_and(out, lender_words[lender_of[j]], subtree_words[subtree_slot[j]])
    stack = np.empty(depth_cap + 1, dtype=np.int32)
    num_pops = 0
    walked = 0
    num_deep = deep_after.shape[0]
    # Per two-byte node: its deep lender, if any (read only when there are deep lenders).
    lender_at = np.full(depth2_nodes.shape[0] if num_deep else 0, -1, dtype=np.int32)
    p = 0  # the next two-byte node (nodes are visited in increasing order)
    lent_pop = deep_pops_ptr[:-1].copy()  # per deep lender, its next pop node
    for j in range(first_nodes.shape[0]):
        if trans[state, first_bytes[j]] < 0:  # first bytes are contiguous, nodes spread
            continue
        node = first_nodes[j]
        end = node_next[node]
        if lender_of[j] >= 0:
            if subtree_slot[j] < 0 and not small_whole:
                _copy_tokens(out, lender_words[lender_of[j]], token_ids, node_token_ptr[node], node_token_ptr[end])
            continue
        walked += node_token_ptr[end] - node_token_ptr[node]
        bulk = -1  # a deep lender whose words are copied for the whole subtree, then corrected below
        if num_deep:
            while p < depth2_nodes.shape[0] and depth2_nodes[p] < node:
                p += 1
            bulk = _assign_deep_lenders(
                trans, hashes, trans[state, first_bytes[j]], p, end, subtree_slot[j], node_key, node_next,
                node_token_ptr, depth2_nodes, deep_after, lender_at,
            )  # fmt: skip
        if bulk >= 0:
            # The lender's tokens of the whole subtree at once; those of the two-byte nodes it does not lend are
            # cleared, and walked (or taken from their own lender) below. The first byte's own tokens are set by
            # both (its state is live), so they need no correction.
            _or_and(out, deep_words[bulk], subtree_words[subtree_slot[j]])
            q = p
            while q < depth2_nodes.shape[0] and depth2_nodes[q] < end:
                if lender_at[q] != bulk:
                    i = depth2_nodes[q]
                    _clear_tokens(out, token_ids, node_token_ptr[i], node_token_ptr[node_next[i]])
                q += 1
        stack[0] = state
        i = node
        while i < end:
            key = node_key[i]
            depth = key >> 8
            s = trans[stack[depth - 1], key & 255]
            if s < 0:
                i = node_next[i]
                continue
            if depth == 2 and num_deep:
                while depth2_nodes[p] < i:
                    p += 1
                lender = lender_at[p]
                if lender >= 0:
                    after = node_next[i]
                    if lender != bulk:
                        for k in range(node_token_ptr[i], node_token_ptr[after]):
                            tok = token_ids[k]
                            out[tok >> 5] |= deep_words[lender, tok >> 5] & (np.uint32(1) << np.uint32(tok & 31))
                    walked -= node_token_ptr[after] - node_token_ptr[i]
                    q = lent_pop[lender]
                    stop = deep_pops_ptr[lender + 1]
                    while q < stop and deep_pops[q] < i:
                        q += 1
                    while q < stop and deep_pops[q] < after:
                        pops[num_pops] = deep_pops[q]
                        num_pops += 1
                        q += 1
                    lent_pop[lender] = q
                    deep_used[lender] += 1
                    i = after
                    continue
            stack[depth] = s
            for k in range(node_token_ptr[i], node_token_ptr[i + 1]):
                tok = token_ids[k]
                out[tok >> 5] |= np.uint32(1) << np.uint32(tok & 31)
            if accepting[s] and node_next[i] != i + 1:
                pops[num_pops] = i
                num_pops += 1
            i += 1
    return num_pops, walked


@njit(cache=True, nogil=True)
def _or_and(out, a, b):
    """``out |= a & b`` over whole rows, in a loop of its own: with its rows in locals it vectorises (indexing
    a 2-D array by a row read from memory inside the loop does not)."""
    for w in range(out.shape[0]):
        out[w] |= a[w] & b[w]


@njit(cache=True, nogil=True)
def _or(out, a):
    for w in range(out.shape[0]):
        out[w] |= a[w]


@njit(cache=True, nogil=True, inline="always")
def _clear_tokens(out, token_ids, lo, hi):
    for k in range(lo, hi):
        tok = token_ids[k]
        out[tok >> 5] &= ~(np.uint32(1) << np.uint32(tok & 31))


@njit(cache=True, nogil=True, inline="always")
def _copy_tokens(out, words, token_ids, lo, hi):
    for k in range(lo, hi):
        tok = token_ids[k]
        out[tok >> 5] |= words[tok >> 5] & (np.uint32(1) << np.uint32(tok & 31))


#: A deep lender's words are copied for a whole first-byte subtree when it lends at least this many of its tokens
#: (a copy and mask of the subtree's words costs about what setting this many token bits one by one does).
_BULK_LENT_TOKENS = 2048


@njit(cache=True, nogil=True)
def _assign_deep_lenders(
    trans,
    hashes,
    after_first,
    p,
    end,
    slot,
    node_key,
    node_next,
    node_token_ptr,
    depth2_nodes,
    deep_after,
    lender_at,
):
    """Fill ``lender_at`` for the two-byte nodes ``depth2_nodes[p:]`` below ``end`` (one first-byte subtree, the
    state ``after_first`` after its byte): the first deep lender whose state there hashes as this walk's, or -1.
    Returns the lender to copy the whole subtree from (the one lending most tokens, when enough and the subtree
    has its words, ``slot >= 0``), or -1."""
    num_deep = deep_after.shape[0]
    lent_tokens = np.zeros(num_deep, dtype=np.int64)
    q = p
    while q < depth2_nodes.shape[0] and depth2_nodes[q] < end:
        i = depth2_nodes[q]
        s = trans[after_first, node_key[i] & 255]
        lender = -1
        if s >= 0:
            for d in range(num_deep):
                if deep_after[d, q] == hashes[s]:
                    lender = d
                    break
        lender_at[q] = lender
        if lender >= 0:
            lent_tokens[lender] += node_token_ptr[node_next[i]] - node_token_ptr[i]
        q += 1
    best = np.argmax(lent_tokens)
    return best if slot >= 0 and lent_tokens[best] >= _BULK_LENT_TOKENS else -1
