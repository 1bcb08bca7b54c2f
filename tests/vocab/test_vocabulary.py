"""Vocabulary: synthetic vocabularies, the fingerprint, token ids out of range, save/load and the disk cache."""

from __future__ import annotations

import pickle
import time

import numpy as np
import pytest

from constrain.errors import TokenError, VocabularyError
from constrain.vocab.vocabulary import Vocabulary
from tests.vocab.test_trie import _check_trie

# ------------------------------------------------------------------------------------------------ synthetic


def test_from_token_bytes():
    tokens = [b"a", b"ab", None, b"", b"b", b"<eos>", b"a", b"abc", b"\xff\x00", b"<s>"]
    v = Vocabulary.from_token_bytes(tokens, eos_ids=[5, 12], special_ids=[9])
    assert v.size == 13 and v.kind == "synthetic"
    assert v.matchable.tolist() == [True, True, False, False, True, False, True, True, True, False, False, False, False]
    assert v.eos_ids.tolist() == [5, 12] and v.eos_set == {5, 12}
    bits = np.unpackbits(v.eos_words.view(np.uint8), bitorder="little")  # token t is bit t & 31 of word t >> 5
    assert np.flatnonzero(bits).tolist() == [5, 12] and not v.eos_words.flags.writeable
    assert v.token_bytes(1) == b"ab" and v.token_bytes(8) == b"\xff\x00"
    assert v.token_bytes(5) == b"" and v.special_names[5] == "<eos>" and v.special_names[9] == "<s>"
    assert v.decode([0, 5, 1, 2, 8, 12]) == b"aab\xff\x00"
    t = v.trie
    # preorder: a(0,6) -> ab(1) -> abc(7) ; b(4) ; \xff(-) -> \xff\x00(8)
    assert t.node_byte.tolist() == [ord("a"), ord("b"), ord("c"), ord("b"), 0xFF, 0x00]
    assert t.node_depth.tolist() == [1, 2, 3, 1, 1, 2]
    assert t.node_next.tolist() == [3, 3, 3, 4, 6, 6]
    assert t.node_token_ptr.tolist() == [0, 2, 3, 4, 5, 5, 6]
    assert t.token_ids.tolist() == [0, 6, 1, 7, 4, 8]
    _check_trie(v, 10, 0)


def test_from_token_bytes_edge_cases():
    empty = Vocabulary.from_token_bytes([], eos_ids=[])
    assert empty.size == 0 and empty.trie.num_nodes == 0 and empty.decode([]) == b""
    only_specials = Vocabulary.from_token_bytes([b"x"], eos_ids=[0])
    assert only_specials.trie.num_nodes == 0 and not only_specials.matchable.any()
    with pytest.raises(VocabularyError, match="token 1 must be bytes"):
        Vocabulary.from_token_bytes([b"a", "b"], eos_ids=[0])
    with pytest.raises(VocabularyError, match="eos id"):
        Vocabulary.from_token_bytes([b"a"], eos_ids=[-1])
    all_bytes = Vocabulary.from_token_bytes([bytes([b]) for b in range(256)], eos_ids=[256])
    assert all_bytes.trie.num_nodes == 256 and all_bytes.trie.node_byte.tolist() == list(range(256))


def test_fingerprint_identifies_contents():
    a = Vocabulary.from_token_bytes([b"a", b"b"], eos_ids=[2])
    assert a.fingerprint == Vocabulary.from_token_bytes([b"a", b"b", None], eos_ids=[2]).fingerprint
    assert len(a.fingerprint) == 64 and int(a.fingerprint, 16) >= 0
    for other in (
        Vocabulary.from_token_bytes([b"a", b"c"], eos_ids=[2]),
        Vocabulary.from_token_bytes([b"ab", b""], eos_ids=[2]),
        Vocabulary.from_token_bytes([b"a", b"b"], eos_ids=[1, 2]),
        Vocabulary.from_token_bytes([b"a", b"b"], eos_ids=[2], special_ids=[0]),
        Vocabulary.from_token_bytes([b"a", b"b"], eos_ids=[3]),
    ):
        assert other.fingerprint != a.fingerprint


# ------------------------------------------------------------------------------------------------ errors


def test_out_of_range_ids(gemma_vocab):
    v = gemma_vocab
    for bad in (-1, v.size, 10**9):
        with pytest.raises(TokenError, match=rf"{bad}.*0\.\.{v.size - 1}"):
            v.token_bytes(bad)
    with pytest.raises(TokenError, match=str(v.size)):
        v.decode([1, 2, v.size])
    with pytest.raises(TokenError, match="-5"):
        v.decode(np.array([-5]))
    with pytest.raises(TokenError, match="integer"):
        v.token_bytes("3")
    with pytest.raises(TokenError, match="integer"):
        v.decode([1.5])
    with pytest.raises(TokenError, match="integer"):
        v.token_bytes(True)
    assert v.token_bytes(np.int64(107)) == b"\n"
    assert v.decode(np.array([107, 107], np.int32)) == b"\n\n"
    assert v.decode([]) == b""


# ------------------------------------------------------------------------------------------------ save / cache


def _assert_same(a: Vocabulary, b: Vocabulary):
    assert a.fingerprint == b.fingerprint and a.size == b.size and a.kind == b.kind
    for name in ("data", "offsets", "matchable", "eos_ids"):
        x, y = getattr(a, name), getattr(b, name)
        assert x.dtype == y.dtype and np.array_equal(x, y), name
    for name in ("node_byte", "node_depth", "node_next", "node_token_ptr", "token_ids"):
        x, y = getattr(a.trie, name), getattr(b.trie, name)
        assert x.dtype == y.dtype and np.array_equal(x, y), name
    assert a.special_names == b.special_names


def test_save_load_round_trip(gemma_vocab, cl100k_vocab, tmp_path):
    for v in (gemma_vocab, cl100k_vocab, Vocabulary.from_token_bytes([b"x", None, b"y"], eos_ids=[1])):
        path = v.save(tmp_path / f"{v.kind}.npz")
        t0 = time.perf_counter()
        back = Vocabulary.load(path)
        assert time.perf_counter() - t0 < 1.0
        _assert_same(v, back)
        assert not back.data.flags.writeable
        _assert_same(v, pickle.loads(pickle.dumps(v)))


def test_load_rejects_bad_files(cl100k_vocab, tmp_path):
    path = cl100k_vocab.save(tmp_path / "v.npz")
    with np.load(path) as z:
        arrays = {k: z[k] for k in z.files}
    arrays["data"] = arrays["data"].copy()
    arrays["data"][0] ^= 1
    np.savez(tmp_path / "corrupt.npz", **arrays)
    with pytest.raises(VocabularyError, match="corrupt"):
        Vocabulary.load(tmp_path / "corrupt.npz")
    (tmp_path / "junk.npz").write_bytes(b"not a zip")
    with pytest.raises(VocabularyError, match="cannot read"):
        Vocabulary.load(tmp_path / "junk.npz")
    (tmp_path / "cut.npz").write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(VocabularyError, match="cannot read"):
        Vocabulary.load(tmp_path / "cut.npz")
    arrays["data"][0] ^= 1
    arrays["trie_node_depth"] = arrays["trie_node_depth"].astype(np.int64)
    np.savez(tmp_path / "types.npz", **arrays)
    with pytest.raises(VocabularyError, match="wrong shapes or types"):
        Vocabulary.load(tmp_path / "types.npz")
    del arrays["trie_token_ids"]
    np.savez(tmp_path / "partial.npz", **arrays)
    with pytest.raises(VocabularyError, match="missing"):
        Vocabulary.load(tmp_path / "partial.npz")


def test_disk_cache(gemma_tokenizer, gemma_vocab, cl100k, cl100k_vocab, tmp_path, monkeypatch):
    monkeypatch.setenv("CONSTRAIN_CACHE_DIR", str(tmp_path))
    first = Vocabulary.from_tokenizer(gemma_tokenizer)
    files = list((tmp_path / "vocab").glob("*.vocab"))
    assert len(files) == 1
    _assert_same(first, gemma_vocab)
    t0 = time.perf_counter()
    again = Vocabulary.from_tokenizer(gemma_tokenizer)
    elapsed = time.perf_counter() - t0
    _assert_same(again, gemma_vocab)
    assert elapsed < 1.0, f"cached Gemma vocabulary took {elapsed:.3f} s"  # ~0.1 s; loose for busy CI machines
    # the same tokenizer through tokenizers directly hits the same entry; other EOS choices get their own
    Vocabulary.from_tokenizer(gemma_tokenizer.backend_tokenizer)
    assert len(list((tmp_path / "vocab").glob("*.vocab"))) == 1
    custom = Vocabulary.from_tokenizer(gemma_tokenizer, eos_ids=[1])
    assert custom.eos_ids.tolist() == [1] and custom.fingerprint != gemma_vocab.fingerprint
    assert len(list((tmp_path / "vocab").glob("*.vocab"))) == 2
    # a damaged cache entry is rebuilt, not trusted
    files[0].write_bytes(b"garbage")
    _assert_same(Vocabulary.from_tokenizer(gemma_tokenizer), gemma_vocab)
    _assert_same(Vocabulary.from_tokenizer(cl100k), cl100k_vocab)
    _assert_same(Vocabulary.from_tokenizer(cl100k), cl100k_vocab)
