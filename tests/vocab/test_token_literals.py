"""Token literals (:meth:`Vocabulary.with_token_literals`): a derived vocabulary in which the named tokens read as
``0xFF`` + their id in three bytes, so that a structure matches them exactly where it names them; and
:meth:`Vocabulary.text_with_specials`, the text a tool-call parser reads. Real tokenizers: Gemma 3 and cl100k."""

from __future__ import annotations

import numpy as np
import pytest

from constrain.compilers.gbnf import compile_gbnf
from constrain.compilers.regex import compile_regex
from constrain.errors import TokenError
from constrain.vocab.vocabulary import LITERAL_BYTE, token_literal

START_OF_TURN = 105  # Gemma 3's <start_of_turn>: special, not an end of sequence


def ids_of(vocab, data: bytes) -> list[int]:
    """The matchable ids whose bytes are exactly ``data``."""
    lengths = np.diff(np.asarray(vocab.offsets))
    candidates = np.flatnonzero(np.asarray(vocab.matchable) & (lengths == len(data))).tolist()
    return [i for i in candidates if vocab.token_bytes(i) == data]


def holding_literal_byte(vocab) -> list[int]:
    """The matchable ids whose bytes hold 0xFF."""
    data = np.asarray(vocab.data)
    offsets = np.asarray(vocab.offsets)
    hits = np.flatnonzero(data == LITERAL_BYTE)
    owners = np.searchsorted(offsets, hits, side="right") - 1
    return sorted(i for i in set(owners.tolist()) if vocab.matchable[i])


@pytest.fixture(scope="module")
def hello(gemma_vocab) -> int:
    (i,) = ids_of(gemma_vocab, b"hello")
    return i


def test_token_literal_is_the_literal_byte_then_three_bytes_of_id():
    assert token_literal(105) == b"\xff\x00\x00\x69"
    assert token_literal(0) == b"\xff\x00\x00\x00"
    assert token_literal((1 << 24) - 1) == b"\xff\xff\xff\xff"
    assert len({token_literal(i) for i in range(0, 300_000, 997)}) == len(range(0, 300_000, 997))


def test_named_ids_read_as_their_literal_and_are_matchable(gemma_vocab, hello):
    base = gemma_vocab
    assert not base.matchable[START_OF_TURN] and base.token_bytes(START_OF_TURN) == b""
    derived = base.with_token_literals([START_OF_TURN, hello])
    assert derived is not base
    for i in (START_OF_TURN, hello):
        assert derived.matchable[i]
        assert derived.token_bytes(i) == token_literal(i)
    # the others keep their bytes and their matchability (0xFF tokens aside: see below)
    sample = np.random.default_rng(0).choice(base.size, 2000, replace=False).tolist()
    ff = set(holding_literal_byte(base))
    for i in sample:
        if i in (START_OF_TURN, hello) or i in ff:
            continue
        assert derived.token_bytes(i) == base.token_bytes(i), i
        assert derived.matchable[i] == base.matchable[i], i
    # other specials stay unmatchable
    for i in (0, 2, 3, 255999, 256000):
        assert not derived.matchable[i] and derived.token_bytes(i) == b""


def test_the_byte_fallback_token_0xff_is_unmatchable_in_the_derived_vocabulary(gemma_vocab):
    (ff,) = ids_of(gemma_vocab, b"\xff")  # <0xFF>, a byte-fallback token
    assert holding_literal_byte(gemma_vocab) == [ff]
    derived = gemma_vocab.with_token_literals([START_OF_TURN])
    assert not derived.matchable[ff] and derived.token_bytes(ff) == b""
    assert holding_literal_byte(derived) == [START_OF_TURN]  # only the literal holds the byte now
    # the literal is the only way to 0xFF: no token of the derived vocabulary starts one except the named one
    data = np.asarray(derived.data)
    starts = np.asarray(derived.offsets)[:-1]
    lengths = np.diff(np.asarray(derived.offsets))
    first = np.flatnonzero((lengths > 0) & (data[np.minimum(starts, len(data) - 1)] == LITERAL_BYTE)).tolist()
    assert first == [START_OF_TURN]


def test_cl100k_tokens_holding_0xff_are_unmatchable(cl100k_vocab):
    holders = holding_literal_byte(cl100k_vocab)
    assert holders  # cl100k has the byte token b"\xff"
    derived = cl100k_vocab.with_token_literals([100258])  # <|fim_prefix|>
    assert not any(derived.matchable[i] for i in holders)
    assert derived.token_bytes(100258) == token_literal(100258)


def test_sizes_eos_ids_names_and_kind_are_unchanged(real_vocab):
    special = next(i for i in sorted(real_vocab.special_names) if i not in set(real_vocab.eos_ids.tolist()))
    derived = real_vocab.with_token_literals([special])
    assert derived.size == real_vocab.size == len(derived)
    assert derived.eos_ids.tolist() == real_vocab.eos_ids.tolist()
    assert derived.special_names == real_vocab.special_names
    assert derived.kind == real_vocab.kind
    assert derived.fingerprint != real_vocab.fingerprint
    assert int(derived.matchable.sum()) == int(real_vocab.matchable.sum()) + 1 - len(holding_literal_byte(real_vocab))


def test_derived_vocabularies_are_cached(gemma_vocab, hello):
    first = gemma_vocab.with_token_literals([START_OF_TURN, hello])
    assert gemma_vocab.with_token_literals([hello, START_OF_TURN, hello]) is first  # order and repeats ignored
    assert gemma_vocab.with_token_literals(np.array([START_OF_TURN, hello])) is first
    other = gemma_vocab.with_token_literals([START_OF_TURN])
    assert other is not first
    assert other.matchable[hello] and other.token_bytes(hello) == b"hello"


@pytest.mark.parametrize("bad", [-1, 262_144, 10**9])
def test_ids_out_of_range_are_refused(gemma_vocab, bad):
    with pytest.raises(TokenError, match="out of range"):
        gemma_vocab.with_token_literals([START_OF_TURN, bad])


@pytest.mark.parametrize("bad", ["105", 1.0, True, None])
def test_ids_that_are_not_integers_are_refused(gemma_vocab, bad):
    with pytest.raises(TokenError, match="integer"):
        gemma_vocab.with_token_literals([bad])


@pytest.mark.parametrize("eos", [1, 106])  # <eos>, <end_of_turn>
def test_end_of_sequence_tokens_cannot_be_named(gemma_vocab, eos):
    with pytest.raises(TokenError, match="ends the sequence"):
        gemma_vocab.with_token_literals([START_OF_TURN, eos])


def test_a_named_text_token_matches_only_its_literal(gemma_vocab, hello):
    """In a structure for the derived vocabulary, ``hello`` (the token) is no longer text, but the text "hello"
    can still be spelled by other tokens."""
    derived = gemma_vocab.with_token_literals([hello])
    structure = compile_regex("hel+o", derived)
    matcher = structure.matcher()
    assert not matcher.accepts(hello)
    h, el, lo = (ids_of(gemma_vocab, t)[0] for t in (b"h", b"el", b"lo"))
    matcher.advance([h, el])
    matcher.advance(lo)
    assert matcher.is_accepting()


def test_a_structure_naming_tokens_is_compiled_for_the_derived_vocabulary(gemma_vocab, hello):
    structure = compile_gbnf('root ::= <[105]> "x" <[' + str(hello) + "]>", gemma_vocab)
    assert structure.vocab is gemma_vocab.with_token_literals([START_OF_TURN, hello])
    x = ids_of(gemma_vocab, b"x")[0]
    matcher = structure.matcher()
    matcher.advance([START_OF_TURN, x, hello])
    assert matcher.is_accepting()


def test_text_with_specials_names_special_tokens(gemma_vocab, gemma_tokenizer, hello):
    ids = [2, hello, START_OF_TURN, *gemma_tokenizer.encode(" world", add_special_tokens=False), 106, 1]
    assert gemma_vocab.text_with_specials(ids) == "<bos>hello<start_of_turn> world<end_of_turn><eos>"
    assert gemma_vocab.decode(ids) == b"hello world"  # decode leaves special tokens out
    assert gemma_vocab.text_with_specials([]) == ""
    # a derived vocabulary still names its tokens, literals included
    derived = gemma_vocab.with_token_literals([START_OF_TURN])
    assert derived.text_with_specials([hello, START_OF_TURN]) == "hello<start_of_turn>"


def test_text_with_specials_replaces_invalid_utf8_and_checks_ids(gemma_vocab, cl100k_vocab):
    (ff,) = ids_of(gemma_vocab, b"\xff")
    assert gemma_vocab.text_with_specials([ff]) == "\ufffd"
    assert cl100k_vocab.text_with_specials([100257, 100258]) == "<|endoftext|><|fim_prefix|>"
    with pytest.raises(TokenError, match="out of range"):
        gemma_vocab.text_with_specials([5, gemma_vocab.size])
