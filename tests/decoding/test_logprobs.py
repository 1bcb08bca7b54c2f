"""Per-token log-probabilities on every path: plain decoding, speculative decoding and beam search report, for each
token, its log-probability under the raw model, under the structure and under the sampler's distribution, and the
entropy under the structure; each is checked against a hand computation on a table model."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

from constrain.compilers.regex import compile_regex
from constrain.decoding import PromptLookup, Speculation, TokenLogprob, beam_search, entropy
from constrain.decoding.loop import Decoding
from constrain.decoding.params import SamplingParams
from constrain.errors import BeamSearchError
from constrain.testing import tiny_vocabulary

TOKENS = ["a", "b", "c", "ab", "1", "2", "-", " "]
PATTERN = r"[abc12 ]{3,6}"


class PairModel:
    """Logits of the next token = the entry (second-to-last, last token read) of a seeded random table. Verifies
    drafts and rolls back; with ``sparse_limit`` it computes only the allowed logits it is given (the others
    ``-inf``, as a sparse output layer does) and records what it was given."""

    max_batch = None
    context_length = None

    def __init__(self, width: int, *, seed: int = 0, sparse_limit: int = 0):
        rng = np.random.default_rng(seed)
        self.table = rng.normal(scale=1.5, size=(width, width, width)).astype(np.float32)
        self.logits_width = width
        self.sparse_limit = sparse_limit
        self.rows: list[list[int]] = []
        self.allowed_given: list = []

    def after(self, sequence) -> np.ndarray:
        return self.table[sequence[-2] if len(sequence) > 1 else 0, sequence[-1]]

    def _logits(self, sequences, allowed) -> np.ndarray:
        out = np.stack([self.after(s) for s in sequences])
        self.allowed_given.append(allowed)
        for i, ids in enumerate(allowed or []):
            if ids is not None:
                sparse = np.full(self.logits_width, -np.inf, dtype=np.float32)
                sparse[ids] = out[i, ids]
                out[i] = sparse
        return out

    def prefill(self, prompts, allowed=None):
        self.rows = [list(p) for p in prompts]
        return self._logits(self.rows, allowed)

    def extend(self, tokens, allowed=None):
        for row, new in zip(self.rows, tokens):
            row += new
        return self._logits(self.rows, allowed)

    def verify(self, tokens, keep, allowed=None):
        self.rows[0] += list(tokens)
        row = self.rows[0]
        return self._logits([row[: len(row) - i] for i in range(keep - 1, -1, -1)], allowed)

    def rollback(self, num_tokens: int) -> None:
        del self.rows[0][len(self.rows[0]) - num_tokens :]

    def next_logits(self, prefixes):
        """The same model as a ``next_logits(prefixes)`` callable, for beam search."""
        return np.stack([self.after(p) for p in prefixes])


@pytest.fixture(scope="module")
def vocab():
    return tiny_vocabulary(TOKENS)


@pytest.fixture(scope="module")
def structure(vocab):
    return compile_regex(PATTERN, vocab)


def log_softmax(x: np.ndarray) -> np.ndarray:
    """The textbook log-softmax in float64, ``-inf`` entries kept."""
    x = x.astype(np.float64)
    m = x[np.isfinite(x)].max()
    return x - m - np.log(np.exp(x[np.isfinite(x)] - m).sum())


def hand_entropy(lp: np.ndarray) -> float:
    p = np.exp(lp[np.isfinite(lp)])
    return float(-(p * np.log(p)).sum())


def replay(model, structure, prompt, tokens, *, frequency=0.0, bias=None):
    """Per generated token: the raw logits at its position, and the logits after the frequency penalty (counting
    the tokens generated before it), the bias and the structure's mask."""
    matcher = structure.matcher() if structure is not None else None
    out = []
    for j, token in enumerate(tokens):
        raw = model.after(list(prompt) + list(tokens[:j])).astype(np.float64)
        z = raw.copy()
        seen = list(tokens[:j])
        for t in set(seen):
            z[t] -= frequency * seen.count(t)
        for t, b in (bias or {}).items():
            z[t] += b
        if matcher is not None:
            allowed = np.zeros(z.shape[0], dtype=bool)
            allowed[matcher.allowed_tokens()] = True
            z[~allowed] = -np.inf
            matcher.advance(token)
        out.append((raw, z))
    return out


def top_k_tempered(z: np.ndarray, temperature: float, k: int) -> np.ndarray:
    """The sampler's distribution: the logits at the temperature, the k largest kept, softmax over them."""
    t = z / temperature
    finite = np.sort(t[np.isfinite(t)])
    cut = finite[-k] if finite.size >= k else finite[0]
    t = np.where(t >= cut, t, -np.inf)
    return np.exp(log_softmax(t))


def test_entropy_of_hand_made_distributions():
    assert entropy(np.array([0.0, 0.0, -np.inf])) == pytest.approx(math.log(2))
    assert entropy(np.array([5.0, -np.inf, -np.inf])) == 0.0
    p = np.array([0.5, 0.25, 0.25])
    assert entropy(np.log(p)) == pytest.approx(-(p * np.log(p)).sum())
    assert entropy(np.log(p) + 7.0) == pytest.approx(-(p * np.log(p)).sum())  # logits: any shift
    rows = entropy(np.array([[0.0, 0.0], [0.0, -np.inf]]))
    assert rows.tolist() == pytest.approx([math.log(2), 0.0])
    assert entropy(np.full(3, -np.inf)) == 0.0


def test_sampled_records_match_a_hand_computation(vocab, structure):
    model = PairModel(vocab.size, seed=4)
    bias = {TOKENS.index("c"): 1.0, TOKENS.index("1"): -0.5}
    params = SamplingParams(temperature=1.7, top_k=3, frequency_penalty=0.6, logit_bias=bias, seed=5)
    prompts = [[0, 1], [4, 2]]
    rows = Decoding(
        model, prompts, structures=structure, sampling=params, max_new_tokens=6, fast_forward="off", logprobs=4,
        eos_ids=vocab.eos_ids.tolist(),
    ).run()  # fmt: skip
    checked = 0
    for prompt, row in zip(prompts, rows):
        assert re.fullmatch(PATTERN, vocab.decode(row.tokens).decode())
        assert len(row.logprobs) == len(row.tokens) >= 3
        for entry, token, (raw, z) in zip(row.logprobs, row.tokens, replay(model, structure, prompt, row.tokens,
                                                                           frequency=0.6, bias=bias)):  # fmt: skip
            assert isinstance(entry, TokenLogprob) and entry.token == token
            structured = log_softmax(z)
            assert entry.model_logprob == pytest.approx(log_softmax(raw)[token], abs=1e-6)
            assert entry.logprob == pytest.approx(structured[token], abs=1e-6)
            assert entry.entropy == pytest.approx(hand_entropy(structured), abs=1e-6)
            sampled = top_k_tempered(z, 1.7, 3)
            assert sampled[token] > 0  # the token was drawn from the distribution its record describes
            assert entry.sampled_logprob == pytest.approx(math.log(sampled[token]), abs=1e-5)
            best = sorted(np.flatnonzero(np.isfinite(structured)).tolist(), key=lambda t: (-structured[t], t))[:4]
            assert [t for t, _ in entry.top] == best
            # the three views differ: penalties, bias and mask move the structured one, temperature the sampled one
            assert entry.model_logprob != pytest.approx(entry.logprob, abs=1e-3)
            checked += 1
    assert checked >= 6


def test_greedy_records_and_forced_tokens(vocab):
    model = PairModel(vocab.size, seed=8)
    structure = compile_regex(r"-1[ab]2[c ]", vocab)
    row = Decoding(model, [[0]], structures=structure, max_new_tokens=8, logprobs=2).run()[0]
    assert vocab.decode(row.tokens).decode()[:2] == "-1" and row.forced == 3
    forced_at = [0, 1, 3]
    for j, entry in enumerate(row.logprobs):
        if j in forced_at:  # certain under the structure; no logits were computed at a forced position
            assert entry == TokenLogprob(row.tokens[j], 0.0, [(row.tokens[j], 0.0)], None, 0.0, 0.0)
        else:  # greedy: the arg-max, drawn with probability 1
            assert entry.sampled_logprob == 0.0
            assert entry.top[0][0] == entry.token and entry.logprob < 0.0
            assert entry.entropy == pytest.approx(hand_entropy(np.array([v for _, v in entry.top])), abs=1e-6)
            raw = model.after([0] + row.tokens[:j])
            assert entry.model_logprob == pytest.approx(log_softmax(raw)[entry.token], abs=1e-6)


def test_a_sparse_output_layer_keeps_its_rows_and_leaves_the_raw_logprob_unknown(vocab, structure):
    """Asking for log-probabilities does not cost the sparse output layer: a projected row's records hold the
    exact log-probability under the structure (the allowed tokens' logits are exact) and the same tokens as a dense
    model's, but no raw log-probability (None), which needs every logit."""
    sparse = PairModel(vocab.size, seed=2, sparse_limit=vocab.size)
    dense = PairModel(vocab.size, seed=2)
    runs = [
        Decoding(model, [[0]], structures=structure, max_new_tokens=5, logprobs=2, fast_forward="off").run()[0]
        for model in (sparse, dense)
    ]
    assert all(allowed is not None and allowed[0] is not None for allowed in sparse.allowed_given)
    assert runs[0].tokens == runs[1].tokens and runs[0].logprobs
    for mine, theirs in zip(runs[0].logprobs, runs[1].logprobs):
        assert mine.model_logprob is None and theirs.model_logprob is not None
        assert mine.logprob == pytest.approx(theirs.logprob, abs=1e-6)
        assert mine.entropy == pytest.approx(theirs.entropy, abs=1e-6)
        assert [t for t, _ in mine.top] == [t for t, _ in theirs.top]


def test_contrastive_sampled_logprob_is_the_contrastive_distribution(vocab, structure):
    from constrain.decoding import Contrastive

    model = PairModel(vocab.size, seed=3)
    row = Decoding(
        model, [[0]], structures=structure, max_new_tokens=5, fast_forward="off", logprobs=0,
        contrastive=Contrastive(amateur_temperature=2.0, alpha=0.0), sampling=SamplingParams(temperature=1.0, seed=1),
    ).run()[0]  # fmt: skip
    for entry, (_raw, z) in zip(row.logprobs, replay(model, structure, [0], row.tokens)):
        structured = log_softmax(z)
        assert entry.logprob == pytest.approx(structured[entry.token], abs=1e-6)  # the expert's, as without it
        # amateur at T=2: score = log p - log p^(1/2) + c, so the draw is from p^(1/2), renormalised
        half = np.exp(log_softmax(structured / 2))
        assert entry.sampled_logprob == pytest.approx(math.log(half[entry.token]), abs=1e-5)


# -- speculative decoding reports what plain decoding reports ---------------------------------------------------------


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_greedy_speculative_records_equal_plain_records(vocab, structure, seed):
    prompt = [0, 4, 0, 4, 0, 4, 1, 0, 4]  # repeats: prompt lookup drafts, some accepted, some rejected

    def run(speculation):
        decoding = Decoding(
            PairModel(vocab.size, seed=seed), [prompt], structures=structure, max_new_tokens=6, logprobs=3,
            eos_ids=vocab.eos_ids.tolist(), speculation=speculation,
        )  # fmt: skip
        return decoding.run()[0], decoding

    plain, _ = run(None)
    fast, decoding = run(Speculation(PromptLookup(max_ngram=2), k=3))
    assert decoding.speculation_stats.proposed > 0
    assert fast.tokens == plain.tokens
    assert fast.logprobs == plain.logprobs  # record by record, every field
    assert all(entry.model_logprob is not None and entry.sampled_logprob == 0.0 for entry in plain.logprobs)


def test_sampled_speculative_records_come_from_the_verifying_pass(vocab, structure):
    prompt = [0, 4, 0, 4, 0, 4, 1, 0, 4]
    model = PairModel(vocab.size, seed=5)
    params = SamplingParams(temperature=0.8, seed=11, frequency_penalty=0.3)
    decoding = Decoding(
        model, [prompt], structures=structure, max_new_tokens=6, logprobs=2, sampling=params,
        fast_forward="off", speculation=Speculation(PromptLookup(max_ngram=2), k=3),
    )  # fmt: skip
    row = decoding.run()[0]
    assert decoding.speculation_stats.rounds > 0
    assert len(row.logprobs) == len(row.tokens)
    for entry, (raw, z) in zip(row.logprobs, replay(model, structure, prompt, row.tokens, frequency=0.3)):
        structured = log_softmax(z)
        assert entry.model_logprob == pytest.approx(log_softmax(raw)[entry.token], abs=1e-6)
        assert entry.logprob == pytest.approx(structured[entry.token], abs=1e-6)
        assert entry.entropy == pytest.approx(hand_entropy(structured), abs=1e-6)
        tempered = np.exp(log_softmax(z / 0.8))
        assert entry.sampled_logprob == pytest.approx(math.log(tempered[entry.token]), abs=1e-5)


# -- beam search ------------------------------------------------------------------------------------------------------


def test_one_beam_reports_the_records_of_greedy_decoding(vocab):
    """A structure with no end before its last character: one beam is greedy decoding, plus the end token."""
    structure = compile_regex(r"[abc12]{4}", vocab)
    model = PairModel(vocab.size, seed=9)
    plain = Decoding(model, [[2]], structures=structure, max_new_tokens=8, logprobs=3, fast_forward="off").run()[0]
    (hyp,) = beam_search(
        model.next_logits, [2], num_beams=1, max_new_tokens=8, structure=structure, logprobs=3, length_penalty=0.0
    )
    assert hyp.finished and hyp.tokens[:-1] == tuple(plain.tokens) and hyp.tokens[-1] in vocab.eos_ids
    assert len(hyp.logprobs) == len(hyp.tokens)
    assert hyp.log_prob == pytest.approx(sum(entry.logprob for entry in hyp.logprobs), abs=1e-9)
    for mine, theirs in zip(hyp.logprobs, plain.logprobs):
        assert mine.sampled_logprob is None  # beam search draws nothing
        assert (mine.token, [t for t, _ in mine.top]) == (theirs.token, [t for t, _ in theirs.top])
        assert mine.logprob == pytest.approx(theirs.logprob, abs=1e-6)
        assert mine.model_logprob == pytest.approx(theirs.model_logprob, abs=1e-6)
        assert mine.entropy == pytest.approx(theirs.entropy, abs=1e-6)
    end = hyp.logprobs[-1]  # the end token: the only one allowed once the text is complete
    assert end.logprob == 0.0 and end.entropy == 0.0


def test_every_beam_hypothesis_carries_its_own_records(vocab, structure):
    model = PairModel(vocab.size, seed=6)
    hyps = beam_search(
        model.next_logits, [0], num_beams=4, num_return_sequences=4, max_new_tokens=7, structure=structure,
        logprobs=2,
    )  # fmt: skip
    assert len(hyps) == 4
    for hyp in hyps:
        assert [entry.token for entry in hyp.logprobs] == list(hyp.tokens)
        assert hyp.log_prob == pytest.approx(sum(entry.logprob for entry in hyp.logprobs), abs=1e-9)
        for entry, (raw, z) in zip(hyp.logprobs, replay(model, structure, [0], hyp.tokens)):
            assert entry.model_logprob == pytest.approx(log_softmax(raw)[entry.token], abs=1e-6)
            assert entry.entropy == pytest.approx(hand_entropy(log_softmax(z)), abs=1e-6)
    assert beam_search(model.next_logits, [0], num_beams=2, max_new_tokens=3)[0].logprobs is None
    for bad in (-1, 21, True, 1.5):
        with pytest.raises(BeamSearchError, match="logprobs"):
            beam_search(model.next_logits, [0], num_beams=2, max_new_tokens=3, logprobs=bad)
