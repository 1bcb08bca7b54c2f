"""The byte trie of a vocabulary's matchable tokens: its preorder layout, checked on the real vocabularies."""

from __future__ import annotations

import numpy as np

from constrain.vocab.trie import TokenTrie
from constrain.vocab.vocabulary import Vocabulary

# ------------------------------------------------------------------------------------------------ the trie


def _parents(trie: TokenTrie) -> np.ndarray:
    depth = trie.node_depth.astype(np.int64)
    parent = np.full(depth.shape[0], -1, np.int64)
    for d in range(2, int(depth.max()) + 1):
        upper = np.flatnonzero(depth == d - 1)
        nodes = np.flatnonzero(depth == d)
        parent[nodes] = upper[np.searchsorted(upper, nodes) - 1]
    return parent


def _lookup(trie: TokenTrie, data: bytes) -> int:
    """Node reached from the root by ``data`` (siblings skipped with node_next), or -1."""
    n = trie.num_nodes
    node, depth = 0, 1
    for k, b in enumerate(data):
        while node < n and trie.node_depth[node] == depth and trie.node_byte[node] != b:
            node = int(trie.node_next[node])
        if node >= n or trie.node_depth[node] != depth:
            return -1
        if k == len(data) - 1:
            return node
        node, depth = node + 1, depth + 1
    return -1


def _check_trie(vocab: Vocabulary, sample: int, seed: int):
    t = vocab.trie
    n = t.num_nodes
    assert t.node_byte.dtype == np.uint8 and t.node_depth.dtype == np.int32 and t.node_next.dtype == np.int32
    assert t.node_token_ptr.dtype == np.int32 and t.token_ids.dtype == np.int32
    assert t.node_token_ptr.shape == (n + 1,) and t.node_token_ptr[0] == 0 and t.node_token_ptr[-1] == len(t.token_ids)
    assert np.all(np.diff(t.node_token_ptr) >= 0)
    # every matchable token exactly once
    assert np.array_equal(np.sort(t.token_ids), np.flatnonzero(vocab.matchable))
    # preorder shape
    depth = t.node_depth.astype(np.int64)
    assert depth[0] == 1 and np.all(depth[1:] <= depth[:-1] + 1)
    nxt = t.node_next.astype(np.int64)
    assert np.all(nxt > np.arange(n)) and np.all(nxt <= n)
    inside = nxt < n
    assert np.all(depth[nxt[inside]] <= depth[inside])  # the first node after a subtree is not below it
    stepped = np.flatnonzero(inside)
    before = nxt[stepped] - 1  # last node of the subtree is still below (or is) the node itself
    assert np.all(depth[before] >= depth[stepped])
    siblings = stepped[depth[nxt[stepped]] == depth[stepped]]
    assert np.all(t.node_byte[siblings] < t.node_byte[nxt[siblings]])  # children sorted by byte, no duplicates
    leaves_with_no_token = (nxt == np.arange(n) + 1) & (np.diff(t.node_token_ptr) == 0)
    assert not leaves_with_no_token.any()
    # brute force on a sample: the path to a node spells the tokens stored at it
    parent = _parents(t)
    rng = np.random.default_rng(seed)
    for i in rng.choice(n, size=min(sample, n), replace=False):
        path = []
        j = int(i)
        while j >= 0:
            path.append(int(t.node_byte[j]))
            j = int(parent[j])
        spelled = bytes(reversed(path))
        assert len(spelled) == t.node_depth[i]
        for tok in t.token_ids[t.node_token_ptr[i] : t.node_token_ptr[i + 1]]:
            assert vocab.token_bytes(int(tok)) == spelled
    for i in rng.choice(n, size=min(20, n), replace=False):
        assert len(t.node_path(int(i))) == t.node_depth[i]
        for tok in t.token_ids[t.node_token_ptr[i] : t.node_token_ptr[i + 1]]:
            assert t.node_path(int(i)) == vocab.token_bytes(int(tok))
    # and each sampled token is found by walking its bytes
    ids = np.flatnonzero(vocab.matchable)
    for tok in rng.choice(ids, size=min(sample, len(ids)), replace=False):
        node = _lookup(t, vocab.token_bytes(int(tok)))
        assert node >= 0
        assert int(tok) in t.token_ids[t.node_token_ptr[node] : t.node_token_ptr[node + 1]]


def test_gemma_trie(gemma_vocab):
    _check_trie(gemma_vocab, 2000, 1)
    # <0x41> and "A" share a node, listed in ascending id order
    node = _lookup(gemma_vocab.trie, b"A")
    at = gemma_vocab.trie.token_ids[gemma_vocab.trie.node_token_ptr[node] : gemma_vocab.trie.node_token_ptr[node + 1]]
    assert 238 + 0x41 in at.tolist() and len(at) >= 2 and np.all(np.diff(at) > 0)


def test_cl100k_trie(cl100k_vocab):
    _check_trie(cl100k_vocab, 2000, 2)
