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


# -- log-probabilities, per-row budgets, rows stopped by the caller -----------------------------------------------


def _direct_log_softmax(x: np.ndarray) -> np.ndarray:
    """log-softmax in float64 the textbook way, -inf entries kept."""
    x = x.astype(np.float64)
    m = x[np.isfinite(x)].max()
    return x - m - np.log(np.exp(x - m).sum())


def _replayed_logprobs(model, vocab, structure, prompt, tokens, *, frequency=0.0, presence=0.0):
    """Per generated token, the log-softmax of the logits the model gave at its position, after the penalties
    (counting the tokens generated before it) and the structure's mask, computed directly."""
    matcher = structure.matcher() if structure is not None else None
    last = prompt[-1]
    out = []
    for j, token in enumerate(tokens):
        z = model.table[last].astype(np.float64).copy()
        seen = tokens[:j]
        for t in set(seen):
            z[t] -= frequency * seen.count(t) + presence
        if matcher is not None:
            allowed = np.zeros(z.shape[0], dtype=bool)
            allowed[matcher.allowed_tokens()] = True
            z[~allowed] = -np.inf
            matcher.advance(token)
        out.append(_direct_log_softmax(z))
        last = token
    return out


@pytest.mark.parametrize("temperature", [0.0, 1.7])
def test_logprobs_are_the_log_softmax_of_the_masked_logits(vocab, temperature):
    model = TableModel(vocab.size, seed=6)
    structure = compile_regex(r"[abc12 ]{3,6}", vocab)
    sampling = SamplingParams(temperature=temperature, seed=3, frequency_penalty=0.7, presence_penalty=0.4)
    decoding = Decoding(
        model, [[0], [4]], structures=structure, sampling=sampling, max_new_tokens=6, fast_forward="off", logprobs=3,
        eos_ids=vocab.eos_ids.tolist(),
    )  # fmt: skip
    rows = decoding.run()
    for prompt, row in zip([[0], [4]], rows):
        assert len(row.logprobs) == len(row.tokens) > 0
        expected = _replayed_logprobs(model, vocab, structure, prompt, row.tokens, frequency=0.7, presence=0.4)
        for entry, token, lp in zip(row.logprobs, row.tokens, expected):
            assert entry.token == token
            assert entry.logprob == pytest.approx(lp[token], abs=1e-5)
            # the three most likely tokens, by decreasing log-probability, with their values
            best = sorted(np.flatnonzero(np.isfinite(lp)).tolist(), key=lambda t: (-lp[t], t))[:3]
            assert [t for t, _ in entry.top] == best
            assert [v for _, v in entry.top] == pytest.approx([lp[t] for t in best], abs=1e-5)
            assert all(a[1] >= b[1] for a, b in zip(entry.top, entry.top[1:]))
        if temperature == 0.0:  # greedy takes the most likely token under the structure
            assert all(entry.top[0][0] == entry.token for entry in row.logprobs)


def test_logprobs_of_a_free_row_and_no_cost_without_them(vocab):
    model = TableModel(vocab.size, seed=7, eos_bias=-1e9)
    row = Decoding(model, [[2]], max_new_tokens=4, logprobs=20).run()[0]
    expected = _replayed_logprobs(model, vocab, None, [2], row.tokens)
    for entry, lp in zip(row.logprobs, expected):
        assert entry.logprob == pytest.approx(lp[entry.token], abs=1e-5)
        assert len(entry.top) == min(20, int(np.isfinite(lp).sum()))
    assert Decoding(model, [[2]], max_new_tokens=4).run()[0].logprobs is None


def test_forced_tokens_have_probability_one(vocab):
    model = TableModel(vocab.size, seed=8)
    structure = compile_regex(r"-1[ab]2", vocab)
    row = Decoding(model, [[0]], structures=structure, max_new_tokens=8, logprobs=2).run()[0]
    assert text(vocab, row.tokens) in ("-1a2", "-1b2")
    assert row.forced == 3  # "-", "1" from the start, "2" after the choice
    entries = row.logprobs
    assert len(entries) == 4
    for j in (0, 1, 3):
        assert entries[j].logprob == 0.0 and entries[j].top == [(row.tokens[j], 0.0)]
    sampled = entries[2]
    assert sampled.logprob < 0.0 and sampled.token == row.tokens[2]
    # "a" and "b", the only tokens the structure allows there, and nothing it rules out
    assert sorted(t for t, _ in sampled.top) == [TOKENS.index("a"), TOKENS.index("b")]


def test_logprobs_per_row_and_bad_values(vocab):
    model = TableModel(vocab.size, seed=9, eos_bias=-1e9)
    rows = Decoding(model, [[0], [1]], max_new_tokens=3, logprobs=[None, 0]).run()
    assert rows[0].logprobs is None
    assert len(rows[1].logprobs) == 3 and all(entry.top == [] for entry in rows[1].logprobs)
    for bad in (21, -1, True, [1], "2"):
        with pytest.raises(ArgumentError, match="logprobs"):
            Decoding(model, [[0], [1]], max_new_tokens=3, logprobs=bad)


def test_max_new_tokens_per_row(vocab):
    model = TableModel(vocab.size, eos_bias=-1e9, context_length=16)
    rows = Decoding(model, [[0], [3], [5]], max_new_tokens=[3, 5, 1]).run()
    assert [len(r.tokens) for r in rows] == [3, 5, 1]
    assert [r.max_new_tokens for r in rows] == [3, 5, 1]
    assert all(r.finish_reason == "length" for r in rows)
    # the context is checked per row: a long prompt with a small budget fits beside a short one with a large one
    Decoding(model, [[0] * 12, [0] * 2], max_new_tokens=[4, 14])
    with pytest.raises(ContextLengthError, match="12 tokens and max_new_tokens=5"):
        Decoding(model, [[0] * 12, [0] * 2], max_new_tokens=[5, 2])
    for bad in ([3], [3, 0, 1], [3, 2.0, 1], (True, 1, 1)):
        with pytest.raises(ArgumentError, match="max_new_tokens"):
            Decoding(model, [[0], [3], [5]], max_new_tokens=bad)


class FeedRecorder(TableModel):
    """A table model that records what each pass fed every row."""

    def __init__(self, width, **kwargs):
        super().__init__(width, **kwargs)
        self.feeds = []

    def extend(self, tokens):
        self.feeds.append([list(t) for t in tokens])
        return super().extend(tokens)


def test_stop_row_ends_a_row_and_the_loop_stops_feeding_it(vocab):
    model = FeedRecorder(vocab.size, seed=2, eos_bias=-1e9)
    decoding = Decoding(model, [[0], [1]], max_new_tokens=6)
    pad = decoding._pad
    for n, step in enumerate(decoding):
        assert step
        if n == 1:
            decoding.stop_row(0)
            decoding.stop_row(0)  # a second call changes nothing
    first, second = decoding.rows
    assert len(first.tokens) == 2 and first.finish_reason == "stop"
    assert len(second.tokens) == 6 and second.finish_reason == "length"
    # after the stop, row 0 was fed padding only
    assert model.feeds[0][0] == [first.tokens[0]]
    assert [feed[0] for feed in model.feeds[1:]] == [[pad]] * (len(model.feeds) - 1)
    assert [feed[1] for feed in model.feeds] == [[t] for t in second.tokens[:-1]]


def test_stopping_every_row_ends_the_decoding_without_another_pass(vocab):
    model = TableModel(vocab.size, seed=2, eos_bias=-1e9)
    decoding = Decoding(model, [[0], [1]], max_new_tokens=50)
    for _ in decoding:
        decoding.stop_row(0)
        decoding.stop_row(-1)
    assert model.passes == 1 and decoding.done
    assert [r.finish_reason for r in decoding.rows] == ["stop", "stop"]
    with pytest.raises(ArgumentError, match="row index"):
        decoding.stop_row(2)


def test_contrastive_decoding_is_refused_under_speculation(vocab):
    from constrain.decoding import Contrastive, PromptLookup, Speculation

    model = TableModel(vocab.size)
    model.verify = model.rollback = lambda *a: None
    contrastive = Contrastive(amateur_temperature=2.0)
    with pytest.raises(ArgumentError, match="contrastive"):
        Decoding(model, [[0]], max_new_tokens=3, contrastive=contrastive, speculation=Speculation(PromptLookup(), k=2))
