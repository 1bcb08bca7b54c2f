"""The byte trie of a vocabulary: tokens sorted by bytes, packed into numpy arrays for the mask walks."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np
from numba import njit

from constrain.errors import ArgumentError, VocabularyError

# --------------------------------------------------------------------------------------------------------- trie


@dataclass(frozen=True, eq=False)
class TokenTrie:
    """The byte trie of all matchable tokens, packed in numpy arrays.

    Nodes (the root excluded) are in preorder with children sorted by byte. Node ``i`` is reached from its parent
    by byte ``node_byte[i]``; it is ``node_depth[i]`` bytes deep (1 for children of the root); ``node_next[i]`` is
    the first node after its whole subtree, so a walk skips a rejected subtree in O(1). The tokens whose bytes end
    exactly at node ``i`` are ``token_ids[node_token_ptr[i]:node_token_ptr[i + 1]]`` (ascending; several ids can
    share bytes, e.g. Gemma's ``<0x41>`` and ``A``). Every matchable token appears exactly once in ``token_ids``.
    """

    node_byte: np.ndarray  # uint8[N]
    node_depth: np.ndarray  # int32[N]
    node_next: np.ndarray  # int32[N]
    node_token_ptr: np.ndarray  # int32[N + 1]
    token_ids: np.ndarray  # int32[M]

    @property
    def num_nodes(self) -> int:
        return int(self.node_byte.shape[0])

    @cached_property
    def max_depth(self) -> int:
        """The length of the longest token, in bytes."""
        return int(self.node_depth.max()) if self.num_nodes else 0

    @cached_property
    def node_key(self) -> np.ndarray:
        """``(node_depth << 8) | node_byte`` as int32: one load per node in the mask walk instead of two."""
        key = (self.node_depth.astype(np.int32) << 8) | self.node_byte
        key.flags.writeable = False
        return key

    @cached_property
    def root_children(self) -> np.ndarray:
        """int32[256]: the node of each first byte (-1 where no token starts with it). A walk that knows which
        first bytes its state accepts jumps to those subtrees instead of stepping over every child of the root,
        which are spread over the whole node array (a cache miss each)."""
        children = np.full(256, -1, dtype=np.int32)
        first = np.flatnonzero(self.node_depth == 1)
        children[self.node_byte[first]] = first
        children.flags.writeable = False
        return children

    def node_path(self, i: int) -> bytes:
        """The bytes spelled from the root to node ``i`` (a debugging aid: each ancestor is the last node before
        it one level up)."""
        i = int(i)
        if not 0 <= i < self.num_nodes:
            raise ArgumentError("i", i, f"a node id in 0..{self.num_nodes - 1}")
        depth = self.node_depth[: i + 1]
        out = bytearray(int(depth[i]))
        j = i
        for d in range(len(out), 0, -1):
            if d < len(out):
                j = int(np.flatnonzero(depth[:j] == d)[-1])
            out[d - 1] = self.node_byte[j]
        return bytes(out)

    def __repr__(self) -> str:
        return f"TokenTrie(nodes={self.num_nodes:,}, tokens={self.token_ids.shape[0]:,})"


@njit(cache=True)
def _prefix_keys(data, offsets, ids):
    """Each token's first 8 bytes as a big-endian integer, zero-padded: sorting by it sorts by bytes up to ties."""
    m = ids.shape[0]
    keys = np.empty(m, np.uint64)
    for k in range(m):
        s = offsets[ids[k]]
        length = offsets[ids[k] + 1] - s
        key = np.uint64(0)
        for j in range(8):
            key = key << np.uint64(8)
            if j < length:
                key = key | np.uint64(data[s + j])
        keys[k] = key
    return keys


@njit(cache=True)
def _bytes_less(data, offsets, a, b):
    """Token ``a``'s bytes sort before token ``b``'s, given equal first 8 bytes (ties: the smaller id first)."""
    sa = offsets[a]
    la = offsets[a + 1] - sa
    sb = offsets[b]
    lb = offsets[b + 1] - sb
    for j in range(min(8, la, lb), min(la, lb)):
        if data[sa + j] != data[sb + j]:
            return data[sa + j] < data[sb + j]
    if la != lb:
        return la < lb
    return a < b


@njit(cache=True)
def _sort_run(data, offsets, order, lo, hi, tmp):
    """Sort ``order[lo:hi]`` (tokens with equal prefix keys) by their full bytes: insertion or merge sort."""
    if hi - lo <= 32:
        for i in range(lo + 1, hi):
            t = order[i]
            j = i - 1
            while j >= lo and _bytes_less(data, offsets, t, order[j]):
                order[j + 1] = order[j]
                j -= 1
            order[j + 1] = t
        return
    width = 1
    n = hi - lo
    src = order[lo:hi].copy()
    dst = tmp[:n]
    while width < n:
        for a in range(0, n, 2 * width):
            mid = min(a + width, n)
            end = min(a + 2 * width, n)
            i = a
            j = mid
            k = a
            while i < mid and j < end:
                if _bytes_less(data, offsets, src[j], src[i]):
                    dst[k] = src[j]
                    j += 1
                else:
                    dst[k] = src[i]
                    i += 1
                k += 1
            while i < mid:
                dst[k] = src[i]
                i += 1
                k += 1
            while j < end:
                dst[k] = src[j]
                j += 1
                k += 1
        src, dst = dst, src
        width *= 2
    order[lo:hi] = src


@njit(cache=True)
def _trie_kernel(data, offsets, order, keys):
    """The trie of tokens ``order`` (sorted by prefix key, ids ascending within a key): finish the sort by full bytes,
    then derive the preorder nodes from the longest common prefix of each token with the previous one (token k adds
    the nodes for its bytes past that prefix)."""
    m = order.shape[0]
    tmp = np.empty(m, np.int64)
    k = 0
    while k < m:
        r = k + 1
        while r < m and keys[r] == keys[k]:
            r += 1
        if r - k > 1:
            _sort_run(data, offsets, order, k, r, tmp)
        k = r
    # common prefix with the previous token, and the node count
    lcp = np.zeros(m, np.int64)
    num_nodes = 0
    max_len = 0
    for k in range(m):
        b = offsets[order[k]]
        b_len = offsets[order[k] + 1] - b
        max_len = max(max_len, b_len)
        j = 0
        if k > 0:
            a = offsets[order[k - 1]]
            n = min(offsets[order[k - 1] + 1] - a, b_len)
            while j < n and data[a + j] == data[b + j]:
                j += 1
        lcp[k] = j
        num_nodes += b_len - j
    # nodes in preorder
    node_byte = np.empty(num_nodes, np.uint8)
    node_depth = np.empty(num_nodes, np.int32)
    node_next = np.empty(num_nodes, np.int32)
    counts = np.zeros(num_nodes + 1, np.int64)
    path = np.empty(max_len + 1, np.int64)  # path[d] = node at depth d on the current path
    top = 0
    n = 0
    for k in range(m):
        start = offsets[order[k]]
        length = offsets[order[k] + 1] - start
        shared = lcp[k]
        for d in range(shared + 1, top + 1):  # nodes below the shared prefix end here
            node_next[path[d]] = n
        for d in range(shared + 1, length + 1):
            node_byte[n] = data[start + d - 1]
            node_depth[n] = d
            path[d] = n
            n += 1
        top = length
        counts[path[length] + 1] += 1
    for d in range(1, top + 1):
        node_next[path[d]] = n
    node_token_ptr = np.cumsum(counts).astype(np.int32)
    return node_byte, node_depth, node_next, node_token_ptr, order.astype(np.int32)


def _build_trie(data: np.ndarray, offsets: np.ndarray, matchable: np.ndarray) -> TokenTrie:
    ids = np.flatnonzero(matchable).astype(np.int64)
    lengths = offsets[ids + 1] - offsets[ids]
    if int(lengths.sum()) >= 2**31 - 1:
        raise VocabularyError(f"the token trie could have {int(lengths.sum()):,} nodes, more than int32 can index")
    # Same array flags on every call (read-only views would make numba compile a second specialisation).
    data = np.frombuffer(np.ascontiguousarray(data, np.uint8).tobytes(), np.uint8) if data.flags.writeable else data
    offsets = np.array(offsets, np.int64)
    keys = _prefix_keys(data, offsets, ids)
    perm = np.argsort(keys, kind="stable")
    return TokenTrie(*_trie_kernel(data, offsets, ids[perm], keys[perm]))


def _trie_arrays(trie: TokenTrie) -> tuple[np.ndarray, ...]:
    return (trie.node_byte, trie.node_depth, trie.node_next, trie.node_token_ptr, trie.token_ids)
