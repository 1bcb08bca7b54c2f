"""Contrastive decoding: the scores against a hand computation (the plausibility cutoff included), the loop's and
beam search's choices, the three kinds of amateur, the amateur's cache kept in step, and the real model under a
JSON schema."""

from __future__ import annotations

import itertools
import json
import math
import re

import numpy as np
import pytest

from constrain.compilers.regex import compile_regex
from constrain.decoding import Contrastive, beam_search, contrastive_scores
from constrain.decoding.loop import Decoding
from constrain.decoding.params import SamplingParams
from constrain.errors import ArgumentError, BeamSearchError, VocabularyError
from constrain.kernels.bitmask import allocate_token_bitmask
from constrain.testing import tiny_vocabulary

TOKENS = ["a", "b", "c", "ab", "1", "2", "-", " "]
PATTERN = r"[ab12]{2,4}-c[12 ]{1,3}"


class TableModel:
    """Logits of the next token = row ``last token read`` of a seeded random table (``scale=0``: all zeros, a
    uniform model). Keeps every row it read, so a test can compare what two models read."""

    max_batch = None
    context_length = None
    sparse_limit = 0

    def __init__(self, width: int, *, seed: int = 0, scale: float = 2.0):
        self.table = np.random.default_rng(seed).normal(scale=scale, size=(width, width)).astype(np.float32)
        self.logits_width = width
        self.rows: list[list[int]] = []

    def prefill(self, prompts):
        self.rows = [list(p) for p in prompts]
        return self.table[[r[-1] for r in self.rows]].copy()

    def extend(self, tokens):
        for row, new in zip(self.rows, tokens):
            row += new
        return self.table[[r[-1] for r in self.rows]].copy()

    def next_logits(self, prefixes):
        return self.table[[p[-1] for p in prefixes]].astype(np.float64)


@pytest.fixture(scope="module")
def vocab():
    return tiny_vocabulary(TOKENS)


@pytest.fixture(scope="module")
def structure(vocab):
    return compile_regex(PATTERN, vocab)


def hand_scores(expert: np.ndarray, amateur: np.ndarray, allowed: np.ndarray, alpha: float) -> np.ndarray:
    """The definition, directly: both distributions renormalised over the allowed tokens; the score on the allowed
    tokens the expert gives at least alpha times its largest allowed probability; -inf elsewhere."""
    pe = np.where(allowed, np.exp(expert - expert.max()), 0.0)
    pa = np.where(allowed, np.exp(amateur - amateur.max()), 0.0)
    pe, pa = pe / pe.sum(), pa / pa.sum()
    out = np.full(expert.shape, -np.inf)
    keep = allowed & (pe >= alpha * pe.max())
    out[keep] = np.log(pe[keep]) - np.log(pa[keep])
    return out


def allowed_at(structure, tokens) -> np.ndarray:
    matcher = structure.matcher()
    matcher.advance(list(tokens))
    allowed = np.zeros(structure.vocab.size, dtype=bool)
    allowed[matcher.allowed_tokens()] = True
    return allowed


# -- the scores -------------------------------------------------------------------------------------------------------


def test_scores_by_hand_with_the_cutoff():
    expert = np.log([0.5, 0.3, 0.15, 0.05])
    amateur = np.log([0.4, 0.1, 0.25, 0.25])
    # alpha = 0.25: the cutoff is 0.125, token 3 (0.05) is implausible
    scores = contrastive_scores(expert, amateur, alpha=0.25)
    assert scores[:3] == pytest.approx([math.log(0.5 / 0.4), math.log(0.3 / 0.1), math.log(0.15 / 0.25)])
    assert scores[3] == -np.inf
    # alpha = 0: every token; alpha = 1: the arg-max alone
    assert np.isfinite(contrastive_scores(expert, amateur, alpha=0.0)).all()
    assert np.isfinite(contrastive_scores(expert, amateur, alpha=1.0)).tolist() == [True, False, False, False]
    # a mask that rules out token 1: both renormalised over {0, 2, 3}; the cutoff is 0.25 * 0.5/0.7 of the new mass
    mask = np.array([True, False, True, True])
    masked = contrastive_scores(expert, amateur, alpha=0.25, mask=mask)
    pe, pa = np.array([0.5, 0.15, 0.05]) / 0.7, np.array([0.4, 0.25, 0.25]) / 0.9
    assert masked[[0, 2]] == pytest.approx(np.log(pe[:2] / pa[:2]))
    assert masked[1] == -np.inf and masked[3] == -np.inf  # ruled out; implausible (0.05/0.7 < 0.25 * 0.5/0.7)
    # the packed bitmask gives the same scores as the boolean mask
    bitmask = allocate_token_bitmask(1, 4)
    bitmask[0, 0] = 0b1101
    assert contrastive_scores(expert[None], amateur[None], alpha=0.25, mask=bitmask)[0].tolist() == masked.tolist()


def test_the_plausible_set_is_taken_among_the_allowed_tokens():
    """A structure that rules out the expert's favourite leaves its best allowed token plausible, never none."""
    expert = np.log([0.97, 0.02, 0.01])
    amateur = np.log([0.2, 0.3, 0.5])
    # against the unconstrained maximum (0.97) nothing allowed would pass alpha = 0.1; among {1, 2} token 1 leads
    scores = contrastive_scores(expert, amateur, alpha=0.1, mask=np.array([False, True, True]))
    assert scores.tolist() == pytest.approx([-np.inf, math.log((2 / 3) / (0.3 / 0.8)), math.log((1 / 3) / (0.5 / 0.8))])
    assert contrastive_scores(expert, amateur, alpha=0.6, mask=np.array([False, True, True]))[2] == -np.inf
    # nothing allowed: no finite score (the sampler then reports the dead end)
    assert (contrastive_scores(expert, amateur, alpha=0.1, mask=np.zeros(3, dtype=bool)) == -np.inf).all()


@pytest.mark.parametrize("seed", range(5))
def test_scores_on_random_logits_match_the_definition(seed):
    rng = np.random.default_rng(seed)
    expert, amateur = rng.normal(scale=2.0, size=(2, 12))
    allowed = rng.random(12) < 0.6
    allowed[seed] = True
    alpha = float(rng.choice([0.0, 0.05, 0.2, 0.5]))
    got = contrastive_scores(expert, amateur, alpha=alpha, mask=allowed)
    want = hand_scores(expert, amateur, allowed, alpha)
    assert np.isfinite(got).tolist() == np.isfinite(want).tolist()
    assert got[np.isfinite(want)] == pytest.approx(want[np.isfinite(want)], abs=1e-9)


# -- the loop ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("alpha", [0.0, 0.1, 0.5])
def test_greedy_picks_the_arg_max_of_the_score_among_allowed_tokens(vocab, structure, alpha):
    expert, amateur = TableModel(vocab.size, seed=1), TableModel(vocab.size, seed=2)
    contrastive = Contrastive(amateur=amateur, alpha=alpha)
    row = Decoding(
        expert, [[0]], structures=structure, max_new_tokens=12, fast_forward="off", contrastive=contrastive
    ).run()[0]
    assert re.fullmatch(PATTERN, vocab.decode(row.tokens).decode()) and row.finish_reason == "stop"
    plain = Decoding(expert, [[0]], structures=structure, max_new_tokens=12, fast_forward="off").run()[0]
    last, differs = 0, False
    for j, token in enumerate(row.tokens):
        allowed = allowed_at(structure, row.tokens[:j])
        scores = hand_scores(expert.table[last].astype(np.float64), amateur.table[last], allowed, alpha)
        assert token == int(np.argmax(scores))
        differs |= j < len(plain.tokens) and token != plain.tokens[j]
        last = token
    if alpha < 0.5:  # the amateur changes the output where the cutoff leaves it room
        assert differs


@pytest.mark.parametrize("seed", range(6))
def test_sampled_contrastive_text_is_always_valid(vocab, structure, seed):
    expert, amateur = TableModel(vocab.size, seed=3), TableModel(vocab.size, seed=4, scale=4.0)
    row = Decoding(
        expert, [[seed]], structures=structure, max_new_tokens=12, sampling=SamplingParams(temperature=1.5, seed=seed),
        contrastive=Contrastive(amateur=amateur, alpha=0.0),
    ).run()[0]  # fmt: skip
    assert re.fullmatch(PATTERN, vocab.decode(row.tokens).decode()) and row.complete


def test_the_amateur_reads_every_token_the_expert_reads_forced_ones_included(vocab, structure):
    expert, amateur = TableModel(vocab.size, seed=5), TableModel(vocab.size, seed=6)
    decoding = Decoding(
        expert, [[0], [1, 2]], structures=structure, max_new_tokens=12, contrastive=Contrastive(amateur=amateur),
        eos_ids=vocab.eos_ids.tolist(),
    )  # fmt: skip
    rows = decoding.run()
    assert sum(row.forced for row in rows) >= 2  # "c" after "-" in each row
    assert amateur.rows == expert.rows
    for prompt, row, read in zip([[0], [1, 2]], rows, amateur.rows):
        # every token but the last, which ended the row without another pass (a finished row then reads padding)
        written = prompt + row.tokens
        assert read[: len(written) - 1] == written[:-1]


def test_a_uniform_amateur_is_greedy_and_min_p_sampling(vocab, structure):
    """log p_a is constant over the allowed tokens: the score is log p_e plus a constant on the plausible set, so
    greedy is plain greedy and sampling at temperature 1 is plain sampling with min_p = alpha."""
    expert = TableModel(vocab.size, seed=7)
    uniform = Contrastive(amateur=TableModel(vocab.size, scale=0.0), alpha=0.2)
    for prompt in ([0], [3], [5]):
        got = Decoding(expert, [prompt], structures=structure, max_new_tokens=12, contrastive=uniform).run()[0]
        assert got.tokens == Decoding(expert, [prompt], structures=structure, max_new_tokens=12).run()[0].tokens
    for seed in range(8):
        got = Decoding(
            expert, [[0]], structures=structure, max_new_tokens=12, contrastive=uniform,
            sampling=SamplingParams(temperature=1.0, seed=seed),
        ).run()[0]  # fmt: skip
        want = Decoding(
            expert, [[0]], structures=structure, max_new_tokens=12,
            sampling=SamplingParams(temperature=1.0, min_p=0.2, seed=seed),
        ).run()[0]  # fmt: skip
        assert got.tokens == want.tokens


def test_a_temperature_amateur_tempers_the_expert_and_costs_no_pass(vocab, structure):
    """Amateur = expert / T: score = (1 - 1/T) log p_e + c, so greedy is the expert's own arg-max, and sampling draws
    from p_e at temperature T / (T - 1) over the plausible set (min-p on that tempered distribution: alpha^(1/tau))."""
    expert = TableModel(vocab.size, seed=8)
    hot = Contrastive(amateur_temperature=3.0, alpha=0.1)
    tau = 3.0 / 2.0
    greedy = Decoding(expert, [[2]], structures=structure, max_new_tokens=12, contrastive=hot)
    assert greedy.run()[0].tokens == Decoding(expert, [[2]], structures=structure, max_new_tokens=12).run()[0].tokens
    for seed in range(8):
        got = Decoding(
            expert, [[2]], structures=structure, max_new_tokens=12, contrastive=hot,
            sampling=SamplingParams(temperature=1.0, seed=seed),
        ).run()[0]  # fmt: skip
        want = Decoding(
            expert, [[2]], structures=structure, max_new_tokens=12,
            sampling=SamplingParams(temperature=tau, min_p=0.1 ** (1 / tau), seed=seed),
        ).run()[0]  # fmt: skip
        assert got.tokens == want.tokens


# -- beam search ------------------------------------------------------------------------------------------------------


def test_beam_search_ranks_by_the_summed_contrastive_score():
    """With beams enough to hold every prefix, beam search returns the sequences with the best sums of contrastive
    scores, found here by enumerating every sequence."""
    V, eos, t, alpha = 4, 3, 3, 0.15
    expert, amateur = TableModel(V, seed=9), TableModel(V, seed=10)

    def scores(prefix):
        e, a = expert.next_logits([prefix])[0], amateur.next_logits([prefix])[0]
        return contrastive_scores(e, a, alpha=alpha), np.log(np.exp(e) / np.exp(e).sum())

    ranked = []
    for n in range(1, t + 1):
        for seq in itertools.product(range(V), repeat=n):
            if eos in seq[:-1] or (n < t and seq[-1] != eos):
                continue
            total, logp, prefix = 0.0, 0.0, [0]
            for token in seq:
                s, lp = scores(prefix)
                total, logp = total + s[token], logp + lp[token]
                prefix = prefix + [token]
            if np.isfinite(total):
                ranked.append((total, seq, logp))
    ranked.sort(key=lambda h: (-h[0], h[1]))
    hyps = beam_search(
        expert.next_logits, [0], num_beams=16, max_new_tokens=t, eos_token_id=eos, length_penalty=0.0,
        num_return_sequences=5, contrastive=Contrastive(amateur=amateur.next_logits, alpha=alpha),
    )  # fmt: skip
    assert [h.tokens for h in hyps] == [r[1] for r in ranked[:5]]
    for h, r in zip(hyps, ranked):
        assert h.score == pytest.approx(r[0], abs=1e-9) and h.log_prob == pytest.approx(r[2], abs=1e-9)


def test_contrastive_beams_stay_valid_under_a_structure(vocab, structure):
    expert = TableModel(vocab.size, seed=11)
    for contrastive in (
        Contrastive(amateur=TableModel(vocab.size, seed=12).next_logits),
        Contrastive(amateur_temperature=2.0),
    ):
        hyps = beam_search(
            expert.next_logits, [0], num_beams=4, num_return_sequences=4, max_new_tokens=12, structure=structure,
            contrastive=contrastive,
        )  # fmt: skip
        assert hyps
        for h in hyps:
            assert re.fullmatch(PATTERN, vocab.decode(list(h.tokens[:-1]) if h.finished else list(h.tokens)).decode())


# -- bad input --------------------------------------------------------------------------------------------------------


def test_bad_settings_are_refused(vocab):
    model = TableModel(vocab.size)
    with pytest.raises(ArgumentError, match="amateur"):
        Contrastive()
    with pytest.raises(ArgumentError, match="amateur"):
        Contrastive(amateur=model, amateur_temperature=2.0)
    for alpha in (-0.1, 1.5, True, "0.1"):
        with pytest.raises(ArgumentError, match="alpha"):
            Contrastive(amateur=model, alpha=alpha)
    for temperature in (0.0, -1.0, math.inf):
        with pytest.raises(ArgumentError, match="amateur_temperature"):
            Contrastive(amateur_temperature=temperature)
    with pytest.raises(VocabularyError, match="amateur"):
        Decoding(model, [[0]], contrastive=Contrastive(amateur=TableModel(vocab.size + 1)))
    with pytest.raises(ArgumentError, match="LogitsModel"):
        Decoding(model, [[0]], contrastive=Contrastive(amateur=model.next_logits))
    with pytest.raises(ArgumentError, match="contrastive"):
        Decoding(model, [[0]], contrastive="yes")
    with pytest.raises(BeamSearchError, match="contrastive"):
        beam_search(model.next_logits, [0], num_beams=2, max_new_tokens=2, contrastive=Contrastive(amateur=3))


# -- the real model ---------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def gemma():
    """The embedded model and an 8-layer early exit of it (the amateur), on one torch thread (restored after)."""
    torch = pytest.importorskip("torch")
    from constrain.decoding import early_exit_model
    from constrain.integrations.transformers_model import TransformersModel
    from constrain.models.gemma import load_default_model

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    model, tokenizer = load_default_model()
    yield TransformersModel(model, tokenizer), TransformersModel(early_exit_model(model, 8), tokenizer)
    torch.set_num_threads(threads)


@pytest.mark.slow
def test_gemma_contrastive_json_validates(gemma):
    jsonschema = pytest.importorskip("jsonschema")
    from constrain.compilers.json_schema import compile_json_schema

    expert, amateur = gemma
    schema = {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 12},
            "age": {"type": "integer", "minimum": 0, "maximum": 99},
        },
        "required": ["name", "age"],
        "additionalProperties": False,
    }
    structure = compile_json_schema(schema, expert.vocab)
    prompt = 'Text: Ada, 36.\nJSON: {"name":"Ada","age":36}\nText: Alan, 41.\nJSON: '
    decoding = Decoding(
        expert, [expert.encode(prompt)], structures=structure, max_new_tokens=30, logprobs=1,
        eos_ids=[int(t) for t in expert.vocab.eos_ids], contrastive=Contrastive(amateur=amateur, alpha=0.1),
    )  # fmt: skip
    row = decoding.run()[0]
    assert row.finish_reason == "stop" and row.complete
    value = json.loads(expert.vocab.decode(row.tokens).decode())
    jsonschema.validate(value, schema)
    assert all(entry.sampled_logprob == 0.0 for entry in row.logprobs)  # greedy over the contrastive scores
