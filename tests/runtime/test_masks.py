"""Token masks against a brute-force answer: every token's bytes walked through the DFA one byte at a time."""

from __future__ import annotations

import numpy as np
import pytest

from constrain.automata.regex import regex_to_dfa
from constrain.compilers.regex import compile_regex
from constrain.kernels.bitmask import bitmask_to_bool
from constrain.runtime.masks import StateMasks
from constrain.testing import byte_vocabulary, tiny_vocabulary
from constrain.vocab.vocabulary import Vocabulary

REGEXES = [
    r"[a-zA-Z0-9._%+-]+@[a-zA-Z0-9.-]+\.[a-zA-Z]{2,}",
    r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})",
    r"-?(0|[1-9]\d*)(\.\d+)?([eE][+-]?\d+)?",
    r"(yes|no|maybe|très bien|日本語|😀+)",
    r"[^\"\\]{0,12}",
    r"(?s).{0,3}",
    r" *\n?\t?[ \n]{0,2}",
    r"(ab|cd)*[é-ü]?",
]


def brute_force_mask(dfa, vocab: Vocabulary, state: int) -> np.ndarray:
    """Bool (size,): walk every token's bytes from ``state``, one byte position at a time for all tokens."""
    lengths = np.diff(vocab.offsets)
    current = np.full(vocab.size, state, dtype=np.int64)
    alive = vocab.matchable.copy()
    for position in range(int(lengths.max(initial=0))):
        reading = alive & (lengths > position)
        idx = np.nonzero(reading)[0]
        current[idx] = dfa.trans[current[idx], vocab.data[vocab.offsets[idx] + position]]
        alive &= current >= 0
    if dfa.accepting[state]:
        alive[vocab.eos_ids] = True
    return alive


@pytest.mark.parametrize("pattern", REGEXES)
def test_every_state_mask_equals_brute_force_on_real_vocabularies(real_vocab, pattern):
    dfa = regex_to_dfa(pattern)
    masks = StateMasks(dfa, real_vocab)
    for state in range(dfa.num_states):
        got = bitmask_to_bool(masks.get(state), real_vocab.size)
        want = brute_force_mask(dfa, real_vocab, state)
        assert np.array_equal(got, want), (pattern, state, np.nonzero(got != want)[0][:10])


def test_special_tokens_are_never_allowed(real_vocab):
    dfa = regex_to_dfa(r"(?s).*")
    mask = bitmask_to_bool(StateMasks(dfa, real_vocab).get(0), real_vocab.size)
    special = ~real_vocab.matchable
    special[real_vocab.eos_ids] = False  # the start of .* accepts, so EOS is allowed
    assert not mask[special].any()
    assert mask[real_vocab.eos_ids].all()


def test_eos_allowed_exactly_in_accepting_states():
    vocab = Vocabulary.from_token_bytes([b"a", b"b", b"ab", None, b"ba"], eos_ids=[5, 6])
    dfa = regex_to_dfa("(ab)+")
    masks = StateMasks(dfa, vocab)
    for state in range(dfa.num_states):
        bits = bitmask_to_bool(masks.get(state), vocab.size)
        assert bits[5] == bits[6] == bool(dfa.accepting[state])


def test_large_automaton_masks_are_computed_lazily_and_bounded():
    vocab = byte_vocabulary()
    dfa = regex_to_dfa("[a-z]{200}")
    width_bytes = 4 * ((vocab.size + 31) // 32)
    masks = StateMasks(dfa, vocab, cache_bytes=10 * width_bytes)
    assert masks.cached_states == 0
    for state in range(dfa.num_states):
        masks.get(state)
    assert masks.cached_states == 10
    assert np.array_equal(masks.get(5), masks.compute(5))


def test_small_automaton_masks_are_precomputed():
    vocab = tiny_vocabulary([b"x", b"y"])
    structure = compile_regex("x+y", vocab)
    assert structure.masks.cached_states == structure.dfa.num_states
