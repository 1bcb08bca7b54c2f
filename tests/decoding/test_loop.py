"""The decoding loop on a small synthetic model: rows end where they should, masks hold, bad input is refused.

The model is a seeded table of logits indexed by the last token read, so every run is deterministic and its
forward passes can be counted. The real models (transformers, llama.cpp) run the same loop in
tests/generation/test_llm.py.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from constrain.compilers.regex import compile_regex
from constrain.decoding.loop import Decoding
from constrain.decoding.params import SamplingParams
from constrain.errors import ArgumentError, ContextLengthError, ShapeError, VocabularyError
from constrain.testing import tiny_vocabulary

TOKENS = ["a", "b", "c", "ab", "1", "2", "-", " "]


class TableModel:
    """Logits of the next token = row ``last token`` of a seeded random table; counts its forward passes."""

    max_batch = None
    sparse_limit = 0

    def __init__(self, width: int, *, seed: int = 0, context_length: int | None = None, eos_bias: float = 0.0):
        rng = np.random.default_rng(seed)
        self.table = rng.normal(size=(width, width)).astype(np.float32)
        self.table[:, width - 1] += eos_bias
        self.logits_width = width
        self.context_length = context_length
        self.passes = 0
        self._last: list[int] = []

    def prefill(self, prompts):
        self.passes += 1
        self._last = [p[-1] for p in prompts]
        return self.table[self._last].copy()

    def extend(self, tokens):
        self.passes += 1
        self._last = [row[-1] for row in tokens]
        return self.table[self._last].copy()


@pytest.fixture(scope="module")
def vocab():
    return tiny_vocabulary(TOKENS)


def text(vocab, tokens):
    return vocab.decode(tokens).decode()


def test_rows_follow_their_structures_and_stop_at_the_end(vocab):
    model = TableModel(vocab.size, seed=1)
    structure = compile_regex(r"[ab]{2,4}-[12]", vocab)
    rows = Decoding(
        model, [[0], [1], [2]], structures=structure, max_new_tokens=20, eos_ids=vocab.eos_ids.tolist()
    ).run()
    for row in rows:
        assert re.fullmatch(r"[ab]{2,4}-[12]", text(vocab, row.tokens))
        assert row.finish_reason == "stop" and row.complete


def test_a_complete_structure_with_nothing_left_but_the_end_costs_no_forward_pass(vocab):
    model = TableModel(vocab.size)
    structure = compile_regex(r"abc", vocab)
    # the structure's own end ids; one token per pass
    rows = Decoding(model, [[0]], structures=structure, max_new_tokens=10, fast_forward="off").run()
    assert text(vocab, rows[0].tokens) == "abc"
    # one pass per token that had a choice to make: the prompt's pass picks the first, then one per token read
    # until the structure is complete; the end of sequence that alone remains needs none
    assert model.passes == len(rows[0].tokens)


def test_free_rows_run_to_max_new_tokens_without_an_end_token(vocab):
    model = TableModel(vocab.size, eos_bias=-1e9)
    rows = Decoding(model, [[0], [3]], max_new_tokens=7, eos_ids=vocab.eos_ids.tolist()).run()
    assert [len(r.tokens) for r in rows] == [7, 7]
    assert all(r.finish_reason == "length" for r in rows)


def test_a_likely_end_token_stops_a_free_row(vocab):
    model = TableModel(vocab.size, eos_bias=1e9)
    rows = Decoding(model, [[0]], max_new_tokens=7, eos_ids=vocab.eos_ids.tolist()).run()
    assert rows[0].tokens == [] and rows[0].finish_reason == "stop"


def test_an_incomplete_structure_at_max_new_tokens_is_reported(vocab):
    model = TableModel(vocab.size)
    structure = compile_regex(r"[ab]{10}", vocab)
    rows = Decoding(model, [[0]], structures=structure, max_new_tokens=3, eos_ids=vocab.eos_ids.tolist()).run()
    assert rows[0].finish_reason == "length" and not rows[0].complete


def test_mixed_rows_one_structure_per_row(vocab):
    model = TableModel(vocab.size, seed=3)
    digits = compile_regex(r"[12]{3}", vocab)
    rows = Decoding(
        model, [[0], [0]], structures=[digits, None], max_new_tokens=5, eos_ids=vocab.eos_ids.tolist()
    ).run()
    assert re.fullmatch(r"[12]{3}", text(vocab, rows[0].tokens))
    assert rows[1].matcher is None


def test_each_step_yields_the_tokens_appended_in_it(vocab):
    model = TableModel(vocab.size, seed=2, eos_bias=-1e9)
    decoding = Decoding(model, [[0], [1]], max_new_tokens=4, sampling=SamplingParams(temperature=1.0, seed=5))
    steps = list(decoding)
    assert len(steps) == 4
    for row in (0, 1):
        assert [t for step in steps for r, t in step if r == row] == decoding.rows[row].tokens


def test_seeded_sampling_is_reproducible(vocab):
    structure = compile_regex(r"[abc12 -]{5}", vocab)
    runs = [
        Decoding(
            TableModel(vocab.size, seed=4),
            [[0]],
            structures=structure,
            sampling=SamplingParams(temperature=1.5, seed=11),
            max_new_tokens=8,
        )
        .run()[0]
        .tokens
        for _ in range(2)
    ]
    assert runs[0] == runs[1]


def test_bad_input(vocab):
    model = TableModel(vocab.size, context_length=16)
    with pytest.raises(ArgumentError, match="max_new_tokens"):
        Decoding(model, [[0]], max_new_tokens=0)
    with pytest.raises(ArgumentError, match="prompts"):
        Decoding(model, [[]])
    with pytest.raises(ContextLengthError, match="12 tokens and max_new_tokens=5"):
        Decoding(model, [[0] * 12], max_new_tokens=5)
    with pytest.raises(ShapeError, match="2 structures for 3 prompts"):
        s = compile_regex("a", vocab)
        Decoding(model, [[0], [0], [0]], structures=[s, s], max_new_tokens=2)
    narrow = TableModel(vocab.size - 2)
    with pytest.raises(VocabularyError, match="do not match"):
        Decoding(narrow, [[0]], structures=compile_regex("a", vocab), max_new_tokens=2)
    decoding = Decoding(model, [[0]], max_new_tokens=2)
    decoding.run()
    with pytest.raises(ArgumentError, match="runs once"):
        decoding.run()
    model.max_batch = 1
    with pytest.raises(ArgumentError, match="at most 1"):
        Decoding(model, [[0], [1]], max_new_tokens=2)
