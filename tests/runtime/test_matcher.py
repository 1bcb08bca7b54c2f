"""The per-sequence Matcher: advancing, rolling back, masks, forced tokens and errors."""

from __future__ import annotations

import re
import threading

import numpy as np
import pytest

from constrain.compilers.regex import compile_regex
from constrain.errors import ArgumentError, ShapeError, TokenError
from constrain.kernels.bitmask import allocate_token_bitmask
from constrain.vocab.vocabulary import Vocabulary

TOKENS = [b"a", b"b", b"c", b"ab", b"abc", b"-", b"1", b"12", b"\xc3", b"\xa9", "é".encode(), b" "]
EOS = 12
SPECIAL = 13


@pytest.fixture(scope="module")
def vocab() -> Vocabulary:
    return Vocabulary.from_token_bytes(TOKENS + [None, b"<s>"], eos_ids=[EOS], special_ids=[SPECIAL])


def allowed(matcher) -> set[int]:
    return set(matcher.allowed_tokens().tolist())


def test_advance_rollback_and_acceptance(vocab):
    m = compile_regex("ab(c|-1)", vocab).matcher()
    assert allowed(m) == {0, 3, 4}
    m.advance(3)  # "ab"
    assert allowed(m) == {2, 5}
    assert not m.is_accepting()
    m.advance(2)
    assert m.is_accepting() and not m.is_finished()
    assert allowed(m) == {EOS}
    m.advance(EOS)
    assert m.is_finished() and m.is_accepting()
    m.rollback(2)
    assert allowed(m) == {2, 5}
    m.advance([5, 6])
    assert m.is_accepting()
    assert m.num_tokens == 3


def test_disallowed_token_raises_and_changes_nothing(vocab):
    m = compile_regex("abc", vocab).matcher()
    m.advance(0)
    before = allowed(m)
    with pytest.raises(TokenError, match="not allowed"):
        m.advance(2)
    with pytest.raises(TokenError, match="position 1"):
        m.advance([1, 0])  # "b" fine, then "a" is not: neither is applied
    assert allowed(m) == before and m.num_tokens == 1
    with pytest.raises(TokenError, match="end-of-sequence"):
        m.advance(EOS)
    with pytest.raises(TokenError, match="special"):
        m.advance(SPECIAL)
    with pytest.raises(TokenError, match="out of range"):
        m.advance(10_000)
    with pytest.raises(TokenError, match="out of range"):
        m.advance(-1)
    with pytest.raises(TokenError, match="roll back"):
        m.rollback(5)


def test_tokens_split_inside_a_character(vocab):
    m = compile_regex("é+", vocab).matcher()
    assert allowed(m) == {8, 10}
    m.advance(8)  # first byte of é
    assert allowed(m) == {9}
    m.advance(9)
    assert m.is_accepting()


def test_copy_is_independent(vocab):
    m = compile_regex("(a|b)+", vocab).matcher()
    m.advance(0)
    c = m.copy()
    c.advance(1)
    assert m.num_tokens == 1 and c.num_tokens == 2
    c.rollback(2)
    assert c.num_tokens == 0 and m.num_tokens == 1


def test_accepts_and_validate_tokens_change_nothing(vocab):
    m = compile_regex("abc", vocab).matcher()
    assert m.accepts(0) and not m.accepts(1)
    assert m.validate_tokens([0, 1, 2, EOS, 0]) == 4
    assert m.validate_tokens([1]) == 0
    assert m.num_tokens == 0


def test_forced_tokens(vocab):
    structure = compile_regex("-1c", vocab)
    m = structure.matcher()
    assert m.forced_tokens() == [5, 6, 2]
    assert m.num_tokens == 0  # probing does not move the matcher
    assert compile_regex("a|b", vocab).matcher().forced_tokens() == []


def test_fill_bitmask_rows_and_padding(vocab):
    structure = compile_regex("a", vocab)
    m = structure.matcher()
    bitmask = allocate_token_bitmask(3, 100)  # logits wider than the vocabulary
    m.fill_bitmask(bitmask, 2)
    assert (bitmask[0] == -1).all()
    bits = np.unpackbits(bitmask[2].view(np.uint8), bitorder="little")
    assert np.flatnonzero(bits).tolist() == [0]
    with pytest.raises(ShapeError, match="row 3"):
        m.fill_bitmask(bitmask, 3)
    with pytest.raises(ShapeError, match="int32"):
        m.fill_bitmask(bitmask.astype(np.int64), 0)
    with pytest.raises(ShapeError):
        m.fill_bitmask(np.zeros((1, 0), np.int32), 0)


def test_finished_matcher_allows_only_eos(vocab):
    m = compile_regex("a?", vocab).matcher()
    m.advance(EOS)
    assert allowed(m) == {EOS}
    with pytest.raises(TokenError, match="after the end"):
        m.advance(0)


def test_real_tokenizations_are_accepted(real_vocab, gemma_tokenizer, cl100k):
    encode = (
        (lambda s: gemma_tokenizer.encode(s, add_special_tokens=False))
        if real_vocab.kind != "tiktoken"
        else cl100k.encode_ordinary
    )
    cases = {
        r"\d{4}-\d{2}-\d{2}": ["2024-01-31", "1999-12-01"],
        r"[a-z]+@[a-z]+\.(com|org)": ["john@example.com", "x@y.org"],
        r"(?s)[^\x00]{0,40}": ["Ünïcödé ✓ 日本語 😀\n\ttabs", "code = {'a': [1, 2]}"],
        r"(hello|héllo) (world|wörld)!": ["héllo wörld!", "hello world!"],
    }
    for pattern, texts in cases.items():
        structure = compile_regex(pattern, real_vocab)
        for text in texts:
            assert re.fullmatch(pattern, text)
            m = structure.matcher()
            for token in encode(text):
                assert m.accepts(token), (pattern, text, token)
                m.advance(token)
            assert m.is_accepting()
            m.advance(int(real_vocab.eos_ids[0]))
            assert m.is_finished()


def test_invalid_text_is_rejected_at_some_token(real_vocab, gemma_tokenizer, cl100k):
    encode = (
        (lambda s: gemma_tokenizer.encode(s, add_special_tokens=False))
        if real_vocab.kind != "tiktoken"
        else cl100k.encode_ordinary
    )
    structure = compile_regex(r"\d{4}-\d{2}-\d{2}", real_vocab)
    for text in ["2024-1-31", "2024-01-311", "20240131", "2024-01-3"]:
        m = structure.matcher()
        tokens = encode(text)
        n = m.validate_tokens(tokens)
        if n == len(tokens):
            m.advance(tokens)
            assert not m.is_accepting(), text


def test_matchers_share_one_structure_across_threads(gemma_vocab):
    pattern = r"[a-z]{1,8}(,[a-z]{1,8}){0,20}"
    structure = compile_regex(pattern, gemma_vocab)
    results: list[bytes] = []
    errors: list[BaseException] = []

    def work(seed: int) -> None:
        rng = np.random.default_rng(seed)
        bitmask = allocate_token_bitmask(1, gemma_vocab.size)
        m = structure.matcher()
        tokens = []
        try:
            for _ in range(40):
                m.fill_bitmask(bitmask, 0)
                bits = np.unpackbits(bitmask[0].view(np.uint8), bitorder="little")[: gemma_vocab.size]
                choices = np.flatnonzero(bits)
                if m.is_accepting() and rng.random() < 0.2:
                    break
                choices = choices[~np.isin(choices, gemma_vocab.eos_ids)]
                if len(choices) == 0:
                    break
                token = int(rng.choice(choices))
                m.advance(token)
                tokens.append(token)
            if m.is_accepting():
                results.append(gemma_vocab.decode(tokens))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert results
    for text in results:
        assert re.fullmatch(pattern, text.decode()), text


# -- what a token id may be --------------------------------------------------------------------------------------


def _digits_matcher():
    from constrain.testing import byte_vocabulary

    return compile_regex(r"[0-9]+", byte_vocabulary()).matcher()


def test_the_samplers_output_is_a_token():
    """Sampler.sample on 1-D torch logits gives a 0-d tensor: advance reads it as the token it holds."""
    import torch

    from constrain import Sampler, SamplingParams

    matcher = _digits_matcher()
    logits = torch.full((matcher.structure.vocab.size,), -1e9)
    logits[ord("7")] = 0.0
    token = Sampler(SamplingParams(temperature=0.0)).sample(logits)
    assert isinstance(token, torch.Tensor) and token.ndim == 0
    matcher.advance(token)
    assert matcher.num_tokens == 1 and matcher.accepts(torch.tensor([ord("8")]))
    matcher.advance(np.array(ord("8")))
    matcher.advance(np.int32(ord("9")))
    matcher.advance(torch.tensor([ord("1"), ord("2")], dtype=torch.int32))
    matcher.advance(np.array([ord("3")], dtype=np.uint8))
    assert matcher.num_tokens == 6 and matcher.is_accepting()


@pytest.mark.parametrize("bad", [True, np.bool_(True), 1.0, None, "12", b"12", np.float32(49.0), [49, 2.5], ["1"]])
def test_what_is_not_a_token_id_is_refused(bad):
    matcher = _digits_matcher()
    with pytest.raises(TokenError):
        matcher.advance(bad)
    assert matcher.num_tokens == 0  # nothing read
    if not isinstance(bad, list):
        with pytest.raises(TokenError):
            matcher.accepts(bad)


def test_float_and_bool_arrays_are_refused():
    import torch

    matcher = _digits_matcher()
    for bad in (torch.tensor(49.0), torch.tensor([True]), np.array([49.0]), np.array(True)):
        with pytest.raises(TokenError):
            matcher.advance(bad)
    assert matcher.num_tokens == 0


# -- speculative drafts ------------------------------------------------------------------------------------------


def mask_after(matcher, tokens):
    probe = matcher.copy()
    probe.advance(tokens)
    return probe.mask()


def test_draft_rows_are_the_masks_after_each_prefix_and_stop_at_a_rejected_draft(vocab):
    m = compile_regex("ab(c|-1)(1|2)*", vocab).matcher()
    m.advance(0)  # "a"
    bitmask = allocate_token_bitmask(6, vocab.size)
    bitmask[:] = 7  # rows the call must overwrite
    drafts = [1, 5, 6, 0]  # "b", "-", "1", then "a": rejected
    assert m.validate_tokens(drafts) == 3
    assert m.fill_draft_bitmasks(drafts, bitmask, start_row=1) == 3
    assert (bitmask[0] == 7).all()  # rows before start_row are left alone
    for j in range(4):
        assert np.array_equal(bitmask[1 + j], mask_after(m, drafts[:j]))
    assert (bitmask[5] == 0).all()  # after the rejected draft: nothing may be drawn
    assert m.num_tokens == 1  # the matcher did not move
    assert m.fill_draft_bitmasks([3], bitmask) == 0  # "ab" after "a" is rejected at once
    assert np.array_equal(bitmask[0], m.mask()) and (bitmask[1] == 0).all()


def test_tree_rows_follow_each_path_and_prune_rejected_subtrees(vocab):
    m = compile_regex("(ab|a-)1*", vocab).matcher()
    #   node: 0 "a"   1 "ab"   2 "b" (below 0)   3 "-" (below 0)   4 "1" (below 2)   5 "c" (below 1: rejected)
    #         6 "1" (below 5: pruned with its parent)   7 "1" (below 1)
    tokens = [0, 3, 1, 5, 6, 2, 6, 6]
    parents = [-1, -1, 0, 0, 2, 1, 5, 1]
    bitmask = allocate_token_bitmask(len(tokens) + 1, vocab.size)
    kept = m.fill_tree_bitmasks(tokens, parents, bitmask)
    assert kept.tolist() == [True, True, True, True, True, False, False, True]
    assert np.array_equal(bitmask[0], m.mask())
    paths = {0: [0], 1: [3], 2: [0, 1], 3: [0, 5], 4: [0, 1, 6], 7: [3, 6]}
    for node, path in paths.items():
        assert np.array_equal(bitmask[1 + node], mask_after(m, path))
    assert (bitmask[1 + 5] == 0).all() and (bitmask[1 + 6] == 0).all()
    assert m.num_tokens == 0


def test_bad_drafts_and_trees_raise_typed_errors(vocab):
    m = compile_regex("ab", vocab).matcher()
    bitmask = allocate_token_bitmask(3, vocab.size)
    with pytest.raises(ShapeError, match="do not fit"):
        m.fill_draft_bitmasks([0, 1, 2], bitmask)  # 4 rows needed
    with pytest.raises(ShapeError, match="do not fit"):
        m.fill_draft_bitmasks([0], bitmask, start_row=2)
    with pytest.raises(ArgumentError, match="parents"):
        m.fill_tree_bitmasks([0, 1], [-1, 1], bitmask)  # a node below itself
    with pytest.raises(ArgumentError, match="parents"):
        m.fill_tree_bitmasks([0, 1], [-1, -2], bitmask)
    with pytest.raises(ShapeError, match="parent indices"):
        m.fill_tree_bitmasks([0, 1], [-1], bitmask)
    with pytest.raises(TokenError):
        m.fill_draft_bitmasks([0, "b"], bitmask)
