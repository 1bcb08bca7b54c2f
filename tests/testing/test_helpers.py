"""constrain.testing: its vocabularies, its brute-force masks against the matcher's, its walks against ``re``."""

from __future__ import annotations

import random
import re

import numpy as np
import pytest

from constrain.compilers.lark import compile_lark
from constrain.compilers.regex import compile_regex
from constrain.errors import VocabularyError
from constrain.kernels.bitmask import bitmask_to_bool
from constrain.testing import (
    accepts_text,
    brute_force_mask,
    brute_force_state_mask,
    byte_vocabulary,
    check_mask,
    random_vocabulary,
    random_walk,
    tiny_vocabulary,
    token_length_weights,
)

PATTERN = r"(ab|b[0-9]{1,3})+-?c*"
SMALL_GRAMMAR = r"""
start: list
list: "[" [item ("," item)*] "]"
item: list | /[ab]+/ | "1"
"""


def test_vocabularies_put_one_end_of_sequence_id_after_their_tokens():
    tiny = tiny_vocabulary([b"a", "é", None, b"ab"])
    assert tiny.size == 5 and tiny.eos_ids.tolist() == [4]
    assert [tiny.token_bytes(i) for i in range(4)] == [b"a", "é".encode(), b"", b"ab"]
    assert tiny.matchable.tolist() == [True, True, False, True, False]
    every = byte_vocabulary(extra=[b"ab", "é"])
    assert every.size == 259 and every.eos_ids.tolist() == [258]
    assert all(every.token_bytes(b) == bytes([b]) for b in range(256))
    assert every.token_bytes(256) == b"ab" and every.token_bytes(257) == "é".encode()
    assert byte_vocabulary().eos_ids.tolist() == [256]


def test_random_vocabulary_is_seeded_and_made_of_runs_of_the_units():
    units = ["ab", "c", "[", "]"]
    a = random_vocabulary(units, count=500, lengths=(2, 3), seed=3, extra=["z"])
    assert a.fingerprint == random_vocabulary(units, count=500, lengths=(2, 3), seed=3, extra=["z"]).fingerprint
    assert a.fingerprint != random_vocabulary(units, count=500, lengths=(2, 3), seed=4, extra=["z"]).fingerprint
    tokens = [a.token_bytes(i) for i in range(a.size - 1)]
    assert tokens == sorted(tokens) and b"z" in tokens and a.eos_ids.tolist() == [a.size - 1]
    assert all(t == b"z" or re.fullmatch(rb"(ab|c|\[|\]){2,3}", t) for t in tokens)
    with_bytes = random_vocabulary("xy", count=10, all_bytes=True)
    assert {bytes([b]) for b in range(256)} <= {with_bytes.token_bytes(i) for i in range(with_bytes.size)}


def _states_along_walks(structure, seed: int, walks: int = 20):
    """Matchers at the start and after every prefix of some random walks (and after the end of sequence)."""
    rng = random.Random(seed)
    out = [structure.matcher()]
    for _ in range(walks):
        tokens = random_walk(structure, rng, max_tokens=30, stop=0.3) or []
        m = structure.matcher()
        for t in tokens:
            m.advance(t)
            out.append(m.copy())
        if m.is_accepting():
            m.advance(int(structure.vocab.eos_ids[0]))
            out.append(m)
    return out


def test_brute_force_mask_equals_the_matchers_mask_on_a_regex():
    vocab = random_vocabulary(["a", "b", "0", "7", "-", "c"], count=400, lengths=(1, 4), all_bytes=True)
    structure = compile_regex(PATTERN, vocab)
    matchers = _states_along_walks(structure, seed=1)
    assert any(m.is_finished() for m in matchers) and any(not m.is_accepting() for m in matchers)
    for m in matchers:
        want = brute_force_mask(m)
        assert np.array_equal(bitmask_to_bool(m.mask(), vocab.size), want), m
        check_mask(m)
    # a sample of ids: only those are tried
    m = matchers[0]
    sample = [0, 5, 97, vocab.size - 1]
    got = brute_force_mask(m, sample)
    assert not got[[i for i in range(vocab.size) if i not in sample]].any()
    assert np.array_equal(got[sample], brute_force_mask(m)[sample])


def test_brute_force_mask_equals_the_matchers_mask_on_a_small_grammar():
    vocab = random_vocabulary(["[", "]", ",", "a", "b", "1"], count=600, lengths=(1, 4))
    structure = compile_lark(SMALL_GRAMMAR, vocab)
    for m in _states_along_walks(structure, seed=2):
        assert np.array_equal(bitmask_to_bool(m.mask(), vocab.size), brute_force_mask(m)), m
        check_mask(m, tokens=range(0, vocab.size, 3))
    # the state-level brute force agrees at the start
    start = brute_force_state_mask(structure, structure.start)
    assert np.array_equal(start, brute_force_mask(structure.matcher()))


def test_check_mask_names_the_tokens_a_wrong_mask_gets_wrong():
    vocab = tiny_vocabulary([b"a", b"b", b"ab"])
    structure = compile_regex("ab", vocab)
    m = structure.matcher()
    check_mask(m)
    wrong = m.mask().copy()
    wrong[0] ^= 0b010  # "b" allowed at the start
    structure.masks.get = lambda state: wrong
    with pytest.raises(AssertionError, match=r"differ on 1 tokens\nid 1 'b': the mask allows it, the brute force"):
        check_mask(m)
    wrong[0] ^= 0b010 | (1 << 7)  # an id past the vocabulary
    with pytest.raises(AssertionError, match="past the vocabulary: \\[7\\]"):
        check_mask(m)


@pytest.mark.parametrize("seed", range(8))
def test_a_random_walk_ends_accepting_and_its_text_matches_the_regex(seed):
    vocab = random_vocabulary(["a", "b", "0", "7", "-", "c"], count=400, lengths=(1, 4), seed=seed)
    structure = compile_regex(PATTERN, vocab)
    for rng in (random.Random(seed), np.random.default_rng(seed)):
        for weights in (None, token_length_weights(vocab)):
            tokens = random_walk(structure, rng, max_tokens=200, weights=weights)
            assert tokens is not None
            m = structure.matcher()
            m.advance(tokens)
            assert m.is_accepting()
            assert re.fullmatch(PATTERN, vocab.decode(tokens).decode())


def test_random_walks_are_seeded_leave_the_matcher_alone_and_may_not_end():
    vocab = byte_vocabulary()
    structure = compile_regex("[a-z]{3,40}", vocab)
    assert random_walk(structure, 5) == random_walk(structure, random.Random(5))
    m = structure.matcher()
    m.advance(list(b"xy"))
    tokens = random_walk(m, 0, stop=1.0)
    assert m.num_tokens == 2 and len(tokens) == 1  # from "xy", the first chance to stop is after one more letter
    assert random_walk(structure, 0, max_tokens=2) is None  # three letters at least
    stuck = compile_regex("a(cd|b)", tiny_vocabulary([b"a", b"b", b"c"]))  # no token reads "d"
    with pytest.raises(AssertionError, match="dead end"):
        for seed in range(20):
            random_walk(stuck, seed)


def test_token_length_weights_prefer_short_tokens():
    vocab = tiny_vocabulary([b"a", b"abc", None])
    assert token_length_weights(vocab).tolist() == [1 / 4, 1 / 16, 1.0, 1.0]
    assert token_length_weights(vocab, power=1).tolist() == [1 / 2, 1 / 4, 1.0, 1.0]


def test_accepts_text_equals_re_on_short_strings():
    structure = compile_regex(PATTERN, byte_vocabulary())
    rng = random.Random(0)
    for _ in range(500):
        text = "".join(rng.choice("ab07-c") for _ in range(rng.randint(0, 7)))
        assert accepts_text(structure, text) == bool(re.fullmatch(PATTERN, text)), text
    # any vocabulary with a single-byte token for each byte of the text
    some = compile_regex("ab+", tiny_vocabulary([b"ab", b"b", b"a"]))
    assert accepts_text(some, b"abb") and not accepts_text(some, "ba")
    with pytest.raises(VocabularyError, match="byte 0x63"):
        accepts_text(some, "abc")
