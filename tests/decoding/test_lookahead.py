"""Lookahead drafts (:mod:`constrain.decoding.lookahead`): the pool fills from the text and from the target's Jacobi
guesses, its drafts get accepted, and greedy output is the same with and without them.

The synthetic models compute the logits of the next token from the tokens read so far (a seeded table indexed by
the last token, or a fixed sequence indexed by the position), keep what they read and roll back; the real Gemma 3
270M runs the same check at the end (slow).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence

import numpy as np
import pytest

from constrain.compilers.regex import compile_regex
from constrain.decoding.lookahead import LookaheadDrafts
from constrain.decoding.loop import Decoding
from constrain.decoding.params import SamplingParams
from constrain.decoding.speculative import DraftContext, Speculation
from constrain.errors import ArgumentError
from constrain.testing import tiny_vocabulary

TOKENS = ["a", "b", "c", "d", "e", "-", "1", "2", "f", "g", "h", "i"]


class VerifyingModel:
    """A model of the loop that can verify drafts: ``next_logits(read)`` gives the logits after the tokens read;
    counts its forward passes."""

    max_batch = 1
    sparse_limit = 0
    context_length = None

    def __init__(self, next_logits: Callable[[list[int]], np.ndarray], width: int):
        self.next_logits = next_logits
        self.logits_width = width
        self.passes = 0
        self.read: list[int] = []

    def prefill(self, prompts: Sequence[Sequence[int]]) -> np.ndarray:
        self.read = []
        return self.extend(prompts)

    def extend(self, tokens: Sequence[Sequence[int]]) -> np.ndarray:
        return self.verify(tokens[0], 1)[None, 0]

    def verify(self, tokens: Sequence[int], keep: int, allowed: object = None) -> np.ndarray:
        self.passes += 1
        self.read += [int(t) for t in tokens]
        ends = range(len(self.read) - keep + 1, len(self.read) + 1)
        return np.stack([self.next_logits(self.read[:end]) for end in ends]).astype(np.float32)

    def rollback(self, num_tokens: int) -> None:
        assert 0 <= num_tokens <= len(self.read)
        del self.read[len(self.read) - num_tokens :]


def markov(width: int, *, seed: int = 0, cycle: int = 0) -> VerifyingModel:
    """Logits from a seeded table row of the last token; with ``cycle``, token ``t < cycle`` strongly prefers
    ``(t + 1) % cycle`` (repetitive text)."""
    table = np.random.default_rng(seed).normal(size=(width, width))
    table[:, width - 1] -= 10.0  # end of sequence unlikely
    for t in range(cycle):
        table[t, (t + 1) % cycle] += 10.0
    return VerifyingModel(lambda read: table[read[-1]], width)


def by_position(width: int, prompt_length: int, sequence: Sequence[int]) -> VerifyingModel:
    """Logits peaked on ``sequence[i]`` for the ``i``-th generated token, whatever the tokens read: the target's
    guess at a position does not depend on the guesses before it, so one Jacobi step gets every one right."""

    def next_logits(read: list[int]) -> np.ndarray:
        row = np.zeros(width)
        row[sequence[(len(read) - prompt_length) % len(sequence)]] = 5.0
        return row

    return VerifyingModel(next_logits, width)


@pytest.fixture(scope="module")
def vocab():
    return tiny_vocabulary(TOKENS)


def decode(model, prompt, source=None, k=4, **options):
    options.setdefault("max_new_tokens", 30)
    speculation = Speculation(source, k) if source is not None else None
    decoding = Decoding(model, [prompt], speculation=speculation, **options)
    return decoding.run()[0].tokens, decoding


def test_the_pool_fills_from_repetitive_text_and_its_drafts_are_accepted(vocab):
    model = markov(vocab.size, cycle=5)
    plain, _ = decode(model, [0, 1, 2])
    passes, model.passes = model.passes, 0
    assert plain[:6] == [3, 4, 0, 1, 2, 3]  # the cycle a b c d e
    source = LookaheadDrafts()
    tokens, decoding = decode(model, [0, 1, 2], source)
    assert tokens == plain
    stats = decoding.speculation_stats
    assert source.count("text") > 0 and source.size >= source.count("text")
    assert stats.accepted > 0 and stats.accepted == sum(source.accepted.values())
    assert source.accepted["text"] > 0
    assert model.passes < passes / 2  # 30 tokens in well under 15 passes


def test_one_jacobi_step_gives_guesses_that_are_drafted_and_accepted(vocab):
    width, prompt = vocab.size, [0, 11, 10, 11, 10]
    sequence = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]  # no repeated n-gram: the text cannot draft it

    def run(source):
        model = by_position(width, len(prompt), sequence)
        tokens, decoding = decode(model, prompt, source, max_new_tokens=len(sequence))
        return tokens, decoding, model.passes

    plain, _, plain_passes = run(None)
    assert plain == sequence
    # the prompt's "a l k l" drafts l k l after the first token; the target rejects it, and its guesses at the
    # rejected positions (c d e f) are drafted next round and accepted
    source = LookaheadDrafts()
    tokens, decoding, passes = run(source)
    assert tokens == plain
    assert source.verified == {"text": 4, "guess": 4}
    assert source.accepted == {"text": 0, "guess": 4}
    assert decoding.speculation_stats.acceptance_at == [0.5] * 4  # rejected, then all accepted
    text_only = LookaheadDrafts(guesses=False)
    tokens, _, text_passes = run(text_only)
    assert tokens == plain and text_only.count("guess") == 0 and text_only.accepted["guess"] == 0
    assert passes < text_passes <= plain_passes


@pytest.mark.parametrize("k", [1, 3, 4, 6])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_greedy_output_is_the_same_with_and_without_lookahead(vocab, k, seed):
    structure = compile_regex(r"((ab|c)+-[12]{1,3}-)+", vocab)
    eos = vocab.eos_ids.tolist()
    for fast_forward in ("off", "tokens"):
        for cycle in (0, 4):
            model = markov(vocab.size, seed=seed, cycle=cycle)
            options = {"structures": structure, "eos_ids": eos, "fast_forward": fast_forward, "max_new_tokens": 40}
            plain, _ = decode(model, [0, 1, 5, 6], **options)
            tokens, decoding = decode(model, [0, 1, 5, 6], LookaheadDrafts(ngram=3), k, **options)
            assert tokens == plain
            assert decoding.rows[0].matcher.num_tokens >= len(tokens)
            # free text as well
            plain, _ = decode(model, [0, 1, 2], fast_forward=fast_forward)
            tokens, _ = decode(model, [0, 1, 2], LookaheadDrafts(max_key=1), k, fast_forward=fast_forward)
            assert tokens == plain


def test_sampled_output_keeps_to_the_structure(vocab):
    structure = compile_regex(r"((ab|c)+-[12]{1,3}-)+", vocab)
    model = markov(vocab.size, seed=3, cycle=4)
    tokens, decoding = decode(
        model, [0, 1], LookaheadDrafts(), structures=structure, sampling=SamplingParams(temperature=1.0, seed=7)
    )
    assert len(tokens) <= 30 and decoding.speculation_stats.rounds > 0
    assert decoding.rows[0].matcher.num_tokens >= len(tokens)


def context(vocab, tokens, matcher=None, k=4):
    params = SamplingParams(temperature=0.0)
    return DraftContext(tokens, 1, matcher, k, params, vocab.size, np.random.default_rng(0))


def test_the_structure_picks_among_the_continuations_of_a_key(vocab):
    a, b, c, one, two, dash = 0, 1, 2, 6, 7, 5
    source = LookaheadDrafts(max_key=1)
    # text: "a b c" then "a 1 2": key a has both continuations, "1 2 -" the more recent
    tokens = [a, b, c, dash, a, one, two, dash, a]
    assert source.propose(context(vocab, tokens)).tokens == [one, two, dash, a]  # chained from the pool at "-"
    matcher = compile_regex(r"a(bc-a)*", vocab).matcher()
    matcher.advance([a, b, c, dash, a])  # the structure allows b next, not 1
    draft = source.propose(context(vocab, tokens, matcher.copy())).tokens
    assert draft == [b, c, dash, a]
    assert matcher.validate_tokens(draft) == 4
    # nothing the structure accepts: no draft
    matcher = compile_regex(r"abc-a12-ad", vocab).matcher()
    matcher.advance(tokens)
    assert source.propose(context(vocab, tokens, matcher)).tokens == []


def test_the_longer_key_wins_and_the_pool_is_bounded(vocab):
    source = LookaheadDrafts(ngram=2, max_key=2, pool_size=2)
    a, b, c, d, e = 0, 1, 2, 3, 4
    # after "a" came b, then c; after "d a" came e: the longer key "d a" decides
    tokens = [d, a, e, b, a, b, c, a, c, d, a]
    assert source.propose(context(vocab, tokens, k=1)).tokens == [e]
    assert all(len(continuations) <= 2 for continuations in source.pool.values())
    assert all(len(continuation) == 1 for continuations in source.pool.values() for continuation in continuations)
    # another sequence: the text is forgotten, the pool kept
    size = source.size
    assert source.propose(context(vocab, [e, a], k=1)).tokens == [c]
    assert source.size >= size


def test_guesses_after_a_rejection_are_drafted_when_the_text_has_nothing_and_text_replaces_them(vocab):
    a, b, c, d, e, one, two = 0, 1, 2, 3, 4, 6, 7
    source = LookaheadDrafts(ngram=3, max_key=1)
    assert source.propose(context(vocab, [a, b, c, a], k=2)).tokens == [b, c]
    # the target wants d after "a", and guesses e after the draft b and 1 after c
    logits = np.zeros((3, vocab.size))
    logits[0, d] = logits[1, e] = logits[2, one] = 1.0
    source.observe([b, c], 0, logits)
    assert source.verified == {"text": 2, "guess": 0} and source.accepted == {"text": 0, "guess": 0}
    # the loop appended d: the refined guess "e 1" follows it
    assert source.propose(context(vocab, [a, b, c, a, d], k=4)).tokens == [e, one]
    assert source.pool[(d,)] == {(e, one): "guess"} and source.pool[(e,)] == {(one,): "guess"}
    source.observe([e, one], 2, np.zeros((3, vocab.size)))
    assert source.accepted == {"text": 0, "guess": 2}
    # text after d wins over the guess; the text repeating the guess replaces it
    assert source.propose(context(vocab, [a, b, c, a, d, two, d], k=2)).tokens == [two, d]
    assert source.pool[(d,)] == {(e, one): "guess", (two, d): "text"}
    assert source.propose(context(vocab, [a, b, c, a, d, two, d, e, one, d], k=2)).tokens == [e, one]
    assert source.pool[(d,)] == {(two, d): "text", (e, one): "text"} and source.count("guess") == 0


def test_bad_arguments():
    for kwargs in ({"ngram": 1}, {"ngram": 2.5}, {"ngram": True}, {"max_key": 0}, {"pool_size": 0}):
        with pytest.raises(ArgumentError):
            LookaheadDrafts(**kwargs)
    with pytest.raises(ArgumentError, match="guesses"):
        LookaheadDrafts(guesses="yes")
    with pytest.raises(ArgumentError, match="k"):
        Speculation(LookaheadDrafts(), k=0)


@pytest.mark.slow
def test_gemma_greedy_json_is_the_same_with_and_without_lookahead():
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from constrain.compilers.json_schema import compile_json_schema
    from constrain.integrations.transformers_model import TransformersModel
    from constrain.models.gemma import load_default_model

    torch.set_num_threads(1)
    model = TransformersModel(*load_default_model())
    schema = {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 12},
            "age": {"type": "integer", "minimum": 0},
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 3},
        },
        "required": ["name", "age", "tags"],
    }
    structure = compile_json_schema(schema, model.vocab)
    prompt = model.encode(
        'People, one JSON object per line:\n{"name":"Ada","age":36,"tags":["math","code"]}\n'
        '{"name":"Alan","age":41,"tags":["code","logic"]}\n'
    )
    options = {"structures": structure, "eos_ids": model.vocab.eos_ids.tolist(), "max_new_tokens": 48}
    for fast_forward in ("off", "text"):
        plain, _ = decode(model, prompt, fast_forward=fast_forward, tokenize=model.tokenize, **options)
        source = LookaheadDrafts()
        tokens, decoding = decode(model, prompt, source, fast_forward=fast_forward, tokenize=model.tokenize, **options)
        assert tokens == plain
        assert decoding.speculation_stats.rounds > 0 and source.size > 0
    json.loads(model.vocab.decode(tokens).decode())
