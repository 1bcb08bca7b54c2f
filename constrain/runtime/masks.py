"""Token masks: for an automaton state, the packed bitmask of vocabulary tokens it can read.

A mask is one walk of the vocabulary's byte trie through the DFA, pruned at the first byte the DFA rejects, so
its cost is the number of trie nodes the state can reach, not the vocabulary size. Masks are cached per state
in a store bounded in bytes that every matcher (and thread) of one compiled structure shares.
"""

from __future__ import annotations

from collections.abc import Hashable

import numpy as np
from numba import njit

from constrain.automata.dfa import ByteDFA
from constrain.cache import BoundedCache
from constrain.errors import ArgumentError
from constrain.vocab.vocabulary import Vocabulary

#: Automata with at most this many states get every mask computed at compile time.
EAGER_STATES = 64
#: Default bound of one structure's mask cache.
DEFAULT_CACHE_BYTES = 256 * 1024 * 1024


@njit(cache=True, nogil=True)
def walk_trie(trans, start, node_key, node_next, node_token_ptr, token_ids, root_children, stack, out):
    """Set in ``out`` (uint32 words) the bit of every token whose bytes the DFA reads from ``start``.

    ``trans`` is the DFA's (n_states, 256) table flattened; ``node_key`` packs each trie node's depth and byte.
    Every state of a trimmed DFA can still reach acceptance, so reading a token's bytes without falling into the
    dead state is exactly "the token is allowed". Only the first bytes ``start`` accepts are visited, through
    ``root_children``.
    """
    stack[0] = start
    for first in range(256):
        child = root_children[first]
        if child < 0 or trans[(start << 8) | first] < 0:
            continue
        i = child
        end = node_next[child]
        while i < end:
            key = node_key[i]
            depth = key >> 8
            state = trans[(stack[depth - 1] << 8) | (key & 255)]
            if state < 0:
                i = node_next[i]
                continue
            stack[depth] = state
            for k in range(node_token_ptr[i], node_token_ptr[i + 1]):
                t = token_ids[k]
                out[t >> 5] |= np.uint32(1) << np.uint32(t & 31)
            i += 1


@njit(cache=True, nogil=True)
def walk_bytes(trans, state, data, start, end):
    """The DFA state after reading ``data[start:end]`` from ``state``, or -1 when a byte is rejected."""
    for i in range(start, end):
        state = trans[state, data[i]]
        if state < 0:
            return -1
    return state


def check_cache_bytes(cache_bytes: int) -> None:
    """ArgumentError unless ``cache_bytes`` (the bytes of masks a structure keeps) is an int, 0 or more."""
    if isinstance(cache_bytes, bool) or not isinstance(cache_bytes, int) or cache_bytes < 0:
        raise ArgumentError("cache_bytes", cache_bytes, "bytes of masks to keep (an int, 0 or more)")


class MaskCache:
    """Masks of one automaton over one vocabulary, cached per state (LRU, bounded in bytes, thread-safe).

    Subclasses say how to walk the trie from a state and whether it may end the text (:meth:`_walk`; ending adds
    the end-of-sequence bits), or compute a whole mask themselves (:meth:`compute`). States must be hashable.
    """

    def __init__(self, vocab: Vocabulary, *, cache_bytes: int = DEFAULT_CACHE_BYTES):
        check_cache_bytes(cache_bytes)
        self.vocab = vocab
        self.width = (vocab.size + 31) // 32
        self._eos_words = vocab.eos_words
        self._cache = BoundedCache(cache_bytes)  # counts against the process's cache budget too

    def _walk(self, state: Hashable, words: np.ndarray) -> bool:
        """Set in ``words`` the bits of the tokens ``state`` can read; return whether it may end the text."""
        raise NotImplementedError

    def compute(self, state: Hashable) -> np.ndarray:
        """The mask of ``state`` as read-only int32 words, computed now (uncached)."""
        words = np.zeros(self.width, dtype=np.uint32)
        if self._walk(state, words):
            words |= self._eos_words
        mask = words.view(np.int32)
        mask.flags.writeable = False
        return mask

    def get(self, state: Hashable) -> np.ndarray:
        """The (read-only) mask of ``state``, from the cache when it is there."""
        mask = self._cache.get(state)
        if mask is None:
            mask = self.compute(state)
            self._cache.put(state, mask, mask.nbytes)
        return mask

    @property
    def eos_mask(self) -> np.ndarray:
        """The mask allowing end-of-sequence tokens only (what a finished matcher allows)."""
        return self._eos_words.view(np.int32)

    @property
    def cached_states(self) -> int:
        """How many states have their mask in memory."""
        return len(self._cache)


class StateMasks(MaskCache):
    """Masks of a DFA's states. A small automaton gets every mask at construction, in a plain list."""

    def __init__(self, dfa: ByteDFA, vocab: Vocabulary, *, cache_bytes: int = DEFAULT_CACHE_BYTES):
        super().__init__(vocab, cache_bytes=cache_bytes)
        self.dfa = dfa
        self._flat_trans = np.ascontiguousarray(dfa.trans).reshape(-1)
        self._stack_size = vocab.trie.max_depth + 1
        self._eager: list[np.ndarray] | None = None
        if dfa.num_states <= min(EAGER_STATES, cache_bytes // (4 * self.width)):
            self._eager = [self.compute(state) for state in range(dfa.num_states)]

    def _walk(self, state: int, words: np.ndarray) -> bool:
        trie = self.vocab.trie
        stack = np.empty(self._stack_size, dtype=np.int32)  # one per call: threads may compute masks at once
        walk_trie(
            self._flat_trans, state, trie.node_key, trie.node_next, trie.node_token_ptr, trie.token_ids,
            trie.root_children, stack, words,
        )  # fmt: skip
        return bool(self.dfa.accepting[state])

    def get(self, state: int) -> np.ndarray:
        if self._eager is not None:
            return self._eager[state]
        return super().get(state)

    @property
    def cached_states(self) -> int:
        return len(self._eager) if self._eager is not None else super().cached_states
