"""Speculative decoding (:mod:`constrain.decoding.speculative`, :mod:`constrain.decoding.drafts`): sampled output
is distributed exactly as constrained sampling from the target alone, greedy output is the same tokens, the
statistics add up, and bad input is refused.

Exactness is checked with chi-square goodness-of-fit tests at significance ``ALPHA`` (1e-6: a correct
implementation fails once in a million runs of the suite, a wrong one is caught when its error exceeds the noise)
against distributions computed exactly:

- :func:`accept` alone, 100,000 rounds per case over a tree of target and draft distributions (drafts sampled from
  ``q != p``, and drafts proposed outright), each round completed by sampling from the target: the completed
  sequences must follow the target's own distribution.
- The whole loop, per draft source, on a synthetic model: the first 4 tokens of 1,500 seeded runs against the
  product of the target's constrained next-token probabilities over every prefix. One run of the loop takes about
  2 ms (the sampling pipeline costs ~0.5 ms a call on this small machine), so 100,000 runs per source would take
  minutes: the loop gets fewer runs, which catch gross errors of plumbing, and :func:`accept` gets the many draws
  that catch subtle ones. (Checked by breaking the code on purpose: drawing from ``p`` instead of the residual after
  a rejection, penalties that miss the last draft, or each draft's ``q`` taken from the position before, fail
  here.)

The real Gemma 3 270M checks that greedy output does not change with any source (slow).
"""

from __future__ import annotations

import bisect
import itertools
import json
import math
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import replace

import jsonschema
import numpy as np
import pytest
from scipy.stats import chi2

from constrain.compilers.json_schema import compile_json_schema
from constrain.compilers.regex import compile_regex
from constrain.decoding.drafts import ChainedDrafts, ForcedDrafts, ModelDraft, PromptLookup, early_exit_model
from constrain.decoding.forcing import forced_continuation
from constrain.decoding.loop import Decoding
from constrain.decoding.params import SamplingParams
from constrain.decoding.sampling import next_token_probs
from constrain.decoding.speculative import (
    Draft,
    DraftContext,
    Speculation,
    accept,
    expected_accepted,
    expected_tokens_geometric,
    speedup,
)
from constrain.errors import ArgumentError, VocabularyError
from constrain.kernels.bitmask import allocate_token_bitmask
from constrain.testing import tiny_vocabulary
from tests.decoding.test_loop import TableModel

#: Significance of every chi-square test here.
ALPHA = 1e-6

TOKENS = ["a", "b", "ab", "c", "-", "1", "-1", "2"]
#: Up to three of ``a``, ``b``, ``1``, ``2`` (repeats allowed: the penalties matter), then the structure forces
#: ``c-1``: one forced token (``c``), then a choice between ``-`` and ``-1``, which the tokenizer splits as ``-1``
#: (a draft the target may reject).
PATTERN = r"[ab12]{1,3}c-1[12c]{1,3}"
#: Repeats, so that prompt lookup finds the last tokens earlier and proposes what followed them (some of it
#: rejected by the structure).
PROMPT_TEXT = ["a", "c", "-1", "2", "ab", "c", "-", "1", "c", "b", "a", "c", "-1", "c", "2", "a"]


class VerifyingTableModel:
    """A model of the loop that can verify drafts and roll back: the logits of the next token are the entry
    (second-to-last, last token read) of a seeded random table, so a model left holding a token it should have
    forgotten gives other logits. Keeps the tokens it read and counts its calls."""

    max_batch = None
    context_length = None
    sparse_limit = 0

    def __init__(self, vocab, *, seed: int = 0, scale: float = 1.5, table: np.ndarray | None = None):
        width = vocab.size
        self.vocab = vocab
        self.logits_width = width
        rng = np.random.default_rng(seed)
        self.table = table if table is not None else rng.normal(scale=scale, size=(width, width, width))
        self.table = self.table.astype(np.float32)
        self.read: list[int] = []
        self.calls: Counter[str] = Counter()

    def logits_after(self, sequence: Sequence[int]) -> np.ndarray:
        return self.table[sequence[-2] if len(sequence) > 1 else 0, sequence[-1]]

    def _last(self, keep: int) -> np.ndarray:
        n = len(self.read)
        return np.stack([self.logits_after(self.read[: n - i]) for i in range(keep - 1, -1, -1)])

    def prefill(self, prompts, allowed=None):
        self.calls["prefill"] += 1
        self.read = [int(t) for t in prompts[0]]
        return self._last(1)

    def extend(self, tokens, allowed=None):
        self.calls["extend"] += 1
        self.read += [int(t) for t in tokens[0]]
        return self._last(1)

    def verify(self, tokens, keep, allowed=None):
        self.calls["verify"] += 1
        self.read += [int(t) for t in tokens]
        return self._last(keep)

    def rollback(self, num_tokens: int) -> None:
        assert 0 <= num_tokens <= len(self.read)
        del self.read[len(self.read) - num_tokens :]


class FixedDrafts:
    """Proposes the same tokens every round, outright (a bad source: the structure often rejects them)."""

    def __init__(self, tokens: Sequence[int]):
        self.tokens = list(tokens)

    def propose(self, context: DraftContext) -> Draft:
        return Draft(self.tokens[: context.k])


@pytest.fixture(scope="module")
def vocab():
    return tiny_vocabulary(TOKENS)


@pytest.fixture(scope="module")
def structure(vocab):
    return compile_regex(PATTERN, vocab)


def ids(*texts: str) -> list[int]:
    return [TOKENS.index(t) for t in texts]


def tokenize(text: str) -> list[int]:
    """The tiny vocabulary's tokenizer: longest match first."""
    out, i = [], 0
    while i < len(text):
        token = max((t for t in range(len(TOKENS)) if text.startswith(TOKENS[t], i)), key=lambda t: len(TOKENS[t]))
        out.append(token)
        i += len(TOKENS[token])
    return out


PROMPT = ids(*PROMPT_TEXT)


# -- exact distributions and the goodness of fit -----------------------------------------------------------------------


def chi_square_pvalue(observed: Counter, expected: dict[tuple, float]) -> float:
    """The chi-square p-value of ``observed`` counts against ``expected`` probabilities; cells expected fewer than 5
    times are pooled. An outcome of probability 0 fails at once."""
    impossible = [cell for cell in observed if expected.get(cell, 0.0) <= 0]
    assert not impossible, f"outcomes of probability 0 were drawn: {impossible[:5]}"
    total = sum(observed.values())
    obs, exp, pooled_obs, pooled_exp = [], [], 0, 0.0
    for cell, prob in expected.items():
        if prob * total >= 5:
            obs.append(observed.get(cell, 0))
            exp.append(prob * total)
        else:
            pooled_obs += observed.get(cell, 0)
            pooled_exp += prob * total
    if pooled_exp > 0:
        obs.append(pooled_obs)
        exp.append(pooled_exp)
    assert len(obs) >= 2
    statistic = sum((o - e) ** 2 / e for o, e in zip(obs, exp))
    return float(chi2.sf(statistic, len(obs) - 1))


def exact_first_tokens(
    model: VerifyingTableModel,
    structure,
    params: SamplingParams,
    n: int,
    fast_forward: str = "tokens",
) -> dict[tuple[int, ...], float]:
    """The distribution of the first ``n`` generated tokens of constrained sampling from ``model`` alone: the
    product of the target's constrained next-token probabilities along every prefix (forced tokens, appended by
    fast-forward, with probability 1). The structure may not end within ``n`` tokens (checked)."""
    eos = set(structure.vocab.eos_ids.tolist())
    mask = allocate_token_bitmask(1, model.logits_width)
    out: dict[tuple[int, ...], float] = {}

    def forced(matcher) -> list[int]:
        extra = forced_continuation(matcher, fast_forward, tokenize=tokenize)
        matcher.advance(extra)
        return extra

    def walk(prefix: list[int], matcher, prob: float) -> None:
        if len(prefix) >= n:
            key = tuple(prefix[:n])
            out[key] = out.get(key, 0.0) + prob
            return
        matcher.fill_bitmask(mask, 0)
        logits = model.logits_after(PROMPT + prefix)[None]
        history = [np.asarray(prefix, dtype=np.int64)]
        p = next_token_probs(logits, params, history=history, mask=mask)[0].astype(np.float64)
        for token in np.flatnonzero(p > 0).tolist():
            assert token not in eos, "the structure must not end within the tokens compared"
            child = matcher.copy()
            child.advance(token)
            walk([*prefix, token, *forced(child)], child, prob * p[token])

    start = structure.matcher()
    walk(forced(start), start, 1.0)
    assert math.isclose(sum(out.values()), 1.0, rel_tol=1e-5)
    return out


def draw(cdf: list[float], rng: np.random.Generator) -> int:
    """Inverse CDF over a cumulative list (tokens of weight 0 are never drawn)."""
    return min(bisect.bisect_right(cdf, rng.random() * cdf[-1]), len(cdf) - 1)


# -- accept() alone, 100,000 rounds ------------------------------------------------------------------------------------


def random_distribution(rng: np.random.Generator, width: int) -> np.ndarray:
    """Uneven, and a third of the time with a token of probability 0 (what a mask or top-k leaves)."""
    w = rng.dirichlet(np.full(width, 0.7))
    if rng.random() < 1 / 3:
        w[rng.integers(width)] = 0.0
    return w / w.sum()


@pytest.mark.parametrize("sampled", [True, False], ids=["drafts-sampled-from-q", "drafts-proposed-outright"])
def test_accept_keeps_the_target_distribution_over_100k_rounds(sampled):
    """A tree of target distributions ``p`` and draft distributions ``q`` over every prefix of up to ``K`` tokens.
    Each round draws ``K`` drafts from ``q`` and gives them to :func:`accept` with ``q``, or as proposed outright
    (random drafts are exact too, as each fixed draft is; a skewed ``q`` catches a rule that draws from ``p`` after
    a rejection, which uniform drafts would not), then completes the sequence to ``K + 1`` tokens from ``p``: the
    completed sequences must follow ``p`` exactly. The acceptance rate of the first draft must be the optimal
    ``sum(min(p, q))`` (``sum(q * p)`` outright): an exact rule that rejected everything would pass the first
    check."""
    width, k, runs = 4, 3, 100_000
    rng = np.random.default_rng(2024)
    prefixes = [s for n in range(k + 1) for s in itertools.product(range(width), repeat=n)]
    p = {s: random_distribution(rng, width) for s in prefixes}
    q = {s: random_distribution(rng, width) for s in prefixes if len(s) < k}
    p_cdf = {s: np.cumsum(d).tolist() for s, d in p.items()}
    q_cdf = {s: np.cumsum(d).tolist() for s, d in q.items()}
    target_rows = {s: np.stack([p[s[:j]] for j in range(k + 1)]) for s in prefixes if len(s) == k}
    draft_rows = {s: np.stack([q[s[:j]] for j in range(k)]) for s in prefixes if len(s) == k}

    counts: Counter = Counter()
    first_accepted = 0
    for _ in range(runs):
        drafts: list[int] = []
        for _ in range(k):
            drafts.append(draw(q_cdf[tuple(drafts)], rng))
        key = tuple(drafts)
        accepted, token = accept(target_rows[key], drafts, draft_rows[key] if sampled else None, rng)
        first_accepted += accepted > 0
        sequence = [*drafts[:accepted], token]
        while len(sequence) < k + 1:
            sequence.append(draw(p_cdf[tuple(sequence)], rng))
        counts[tuple(sequence)] += 1

    expected = {
        s: math.prod(p[s[:j]][s[j]] for j in range(k + 1)) for s in itertools.product(range(width), repeat=k + 1)
    }
    assert chi_square_pvalue(counts, expected) > ALPHA
    rate = np.minimum(p[()], q[()]).sum() if sampled else (p[()] * q[()]).sum()
    assert abs(first_accepted / runs - rate) < 5 * math.sqrt(rate * (1 - rate) / runs)


def test_accept_on_equal_zero_and_one_hot_distributions():
    rng = np.random.default_rng(0)
    p = np.array([[0.2, 0.5, 0.3, 0.0]] * 3)
    for _ in range(200):
        drafts = [int(rng.choice(3, p=[0.2, 0.5, 0.3])) for _ in range(2)]
        accepted, token = accept(p, drafts, p[:2], rng)
        assert accepted == 2 and token != 3
    # a draft the target gives 0 is always rejected, and the token drawn instead is never it
    accepted, token = accept(p, [3, 0], None, rng)
    assert accepted == 0 and token in (0, 1, 2)
    # a one-hot target (greedy) keeps its arg-max draft and replaces any other by the arg-max
    greedy = np.eye(4)[[1, 2, 0]]
    assert accept(greedy, [1, 2], None, rng) == (2, 0)
    assert accept(greedy, [1, 3], None, rng) == (1, 2)


# -- the whole loop, per draft source ----------------------------------------------------------------------------------

#: Temperature 1 with top-k and a presence penalty: the target's rows depend on the drafts before them (the penalty
#: counts them) and leave tokens out (top-k), so a wrong history or mask row shows.
SAMPLED = SamplingParams(temperature=1.0, top_k=3, presence_penalty=2.0)
FIRST = 4
LOOP_RUNS = 1500


def anti_model(vocab, target: VerifyingTableModel) -> VerifyingTableModel:
    """A draft model that prefers what the target does not: q is large where p is small."""
    return VerifyingTableModel(vocab, table=-2.0 * target.table)


SOURCES = {
    # name: (source factory (vocab, target) -> source, fast_forward, sampling)
    "prompt-lookup": (lambda v, t: PromptLookup(max_ngram=2), "tokens", SAMPLED),
    "forced-text": (lambda v, t: ForcedDrafts(tokenize), "tokens", SamplingParams(temperature=1.0)),
    "draft-model": (lambda v, t: ModelDraft(VerifyingTableModel(v, seed=7)), "tokens", SAMPLED),
    "draft-model-against-the-target": (lambda v, t: ModelDraft(anti_model(v, t)), "off", SAMPLED),
    "chained": (
        lambda v, t: ChainedDrafts(ForcedDrafts(tokenize), ModelDraft(VerifyingTableModel(v, seed=7))),
        "tokens",
        SAMPLED,
    ),
    "rejected-by-the-structure": (lambda v, t: FixedDrafts(ids("c", "-", "2")), "off", SamplingParams(temperature=1.0)),
}
#: Sources whose exactness is plain (p = 1 on what the structure forces), or covered by a sampled case above:
#: checked by the greedy and statistics tests only.
MORE_SOURCES = {
    "prompt-lookup-3": (lambda v, t: PromptLookup(), "off", SAMPLED),
    "forced-tokens": (lambda v, t: ForcedDrafts(), "off", SAMPLED),
}


@pytest.mark.parametrize("name", list(SOURCES))
def test_sampled_tokens_follow_the_target_with_every_source(vocab, structure, name):
    """The first ``FIRST`` tokens of ``LOOP_RUNS`` seeded runs with speculation against their exact distribution
    under constrained sampling from the target alone; the source must have proposed, and the target accepted
    and rejected, drafts (else the test would only check plain sampling)."""
    make, fast_forward, sampling = SOURCES[name]
    target = VerifyingTableModel(vocab, seed=1)
    source = make(vocab, target)  # one for every run: a draft model's cache rolls back to each new sequence
    counts: Counter = Counter()
    totals: Counter = Counter()
    for seed in range(LOOP_RUNS):
        decoding = Decoding(
            target, [PROMPT], structures=structure, sampling=replace(sampling, seed=seed), max_new_tokens=8,
            fast_forward=fast_forward, tokenize=tokenize, speculation=Speculation(source, k=3),
        )  # fmt: skip
        row = decoding.rows[0]
        for _ in decoding:
            if len(row.tokens) >= FIRST:
                break
        counts[tuple(row.tokens[:FIRST])] += 1
        stats = decoding.speculation_stats
        totals.update(proposed=stats.proposed, valid=stats.valid, accepted=stats.accepted)
    expected = exact_first_tokens(target, structure, sampling, FIRST, fast_forward)
    assert chi_square_pvalue(counts, expected) > ALPHA
    assert totals["accepted"] > 0
    assert totals["accepted"] < totals["valid"]
    if name == "rejected-by-the-structure":
        assert totals["valid"] < totals["proposed"]


@pytest.mark.parametrize("seed", range(4))
def test_greedy_tokens_are_the_same_with_every_source(vocab, seed):
    """Greedy decoding of a longer structure on the synthetic model, plain and with each source; the model ends
    having read exactly the output (its rollbacks dropped every rejected draft)."""
    pattern = r"[ab]{1,4}c-1[12c]{2,6}(-[ab]{1,3}c-1[12c]{1,4}){1,2}"
    structure = compile_regex(pattern, vocab)
    eos = vocab.eos_ids.tolist()

    def run(source, fast_forward: str) -> list[int]:
        target = VerifyingTableModel(vocab, seed=seed)
        speculation = Speculation(source(vocab, target), k=4) if source is not None else None
        decoding = Decoding(
            target, [PROMPT], structures=structure, max_new_tokens=40, eos_ids=eos, fast_forward=fast_forward,
            tokenize=tokenize, speculation=speculation,
        )  # fmt: skip
        row = decoding.run()[0]
        assert row.finish_reason == "stop" and row.complete
        read = target.read[:-1] if target.read[-1] in eos else target.read  # an accepted end-of-sequence draft
        assert read == (PROMPT + row.tokens)[: len(read)]
        return row.tokens

    for fast_forward in ("off", "tokens"):
        plain = run(None, fast_forward)
        assert re.fullmatch(pattern, vocab.decode(plain).decode())
        for name, (make, _, _) in {**SOURCES, **MORE_SOURCES}.items():
            assert run(make, fast_forward) == plain, (name, fast_forward)


# -- statistics --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["prompt-lookup-3", "draft-model", "rejected-by-the-structure"])
def test_statistics_add_up(vocab, name):
    """Without fast-forward every token comes from a plain step (one per prefill or extend) or from a round (the
    accepted drafts and the token drawn after them), and every round is one verifying pass."""
    make = {**SOURCES, **MORE_SOURCES}[name][0]
    structure = compile_regex(r"[abc1-]{60}", vocab)  # rejects 2; may not end before max_new_tokens
    for seed in range(5):
        target = VerifyingTableModel(vocab, seed=seed)
        decoding = Decoding(
            target, [PROMPT], structures=structure, sampling=SamplingParams(temperature=1.0, seed=seed),
            max_new_tokens=24, fast_forward="off", speculation=Speculation(make(vocab, target), k=3),
        )  # fmt: skip
        row = decoding.run()[0]
        stats = decoding.speculation_stats
        calls = target.calls
        assert len(row.tokens) == 24 and row.finish_reason == "length"
        assert stats.rounds == calls["verify"]
        assert decoding.forward_passes == calls["prefill"] + calls["extend"] + calls["verify"]
        assert len(row.tokens) == calls["prefill"] + calls["extend"] + stats.tokens
        assert stats.tokens == stats.accepted + stats.rounds
        assert 0 <= stats.accepted <= stats.valid <= stats.proposed
        assert sum(stats.verified_at) == stats.valid and sum(stats.accepted_at) == stats.accepted
        assert all(0 <= a <= 1 for a in stats.acceptance_at if not math.isnan(a))
        assert len(stats.acceptance_at) == 3
        if stats.rounds:
            assert stats.tokens_per_round == stats.tokens / stats.rounds
        assert stats.draft_seconds >= 0 and stats.verify_seconds >= 0
        if name == "rejected-by-the-structure":  # "c", "-" kept, "2" cut
            assert stats.verified_at[2] == 0 and stats.valid < stats.proposed
        assert target.read == (PROMPT + row.tokens)[: len(target.read)]


def test_forced_drafts_are_always_accepted(vocab, structure):
    """What the structure forces has p = 1 under any sampling: every forced draft is kept."""
    proposed = 0
    for seed in range(30):
        target = VerifyingTableModel(vocab, seed=seed)
        decoding = Decoding(
            target, [PROMPT], structures=structure, sampling=replace(SAMPLED, seed=seed), max_new_tokens=12,
            fast_forward="off", speculation=Speculation(ForcedDrafts(), k=3),
        )  # fmt: skip
        row = decoding.run()[0]
        assert re.fullmatch(PATTERN, vocab.decode(row.tokens).decode())
        stats = decoding.speculation_stats
        assert stats.accepted == stats.valid == stats.proposed
        proposed += stats.proposed
    assert proposed > 0


def test_a_draft_the_structure_rejects_at_once_costs_no_target_pass(vocab):
    """Drafts of a token the structure never allows are cut before the target sees them: no verifying pass, no
    random number, so the output and the passes are those of plain decoding with the same seed."""
    structure = compile_regex(r"[ab12]{10}", vocab)

    def run(speculation):
        target = VerifyingTableModel(vocab, seed=3)
        decoding = Decoding(
            target, [PROMPT], structures=structure, sampling=SamplingParams(temperature=1.0, seed=5),
            max_new_tokens=10, fast_forward="off", speculation=speculation,
        )  # fmt: skip
        return decoding.run()[0].tokens, decoding, target.calls

    plain, plain_decoding, plain_calls = run(None)
    tokens, decoding, calls = run(Speculation(FixedDrafts(ids("c", "a")), k=2))
    assert tokens == plain
    assert decoding.forward_passes == plain_decoding.forward_passes == len(plain)
    assert calls["verify"] == 0 and calls == plain_calls
    stats = decoding.speculation_stats
    assert stats.proposed > 0 and stats.valid == stats.accepted == stats.tokens == 0
    assert stats.rounds == 0 and math.isnan(stats.tokens_per_round)


# -- the math helpers --------------------------------------------------------------------------------------------------


def simulate_accepted(alphas: Sequence[float], rounds: int, rng: np.random.Generator) -> np.ndarray:
    """Per simulated round, how many drafts are accepted when draft ``i`` passes with probability ``alphas[i]``
    (Bernoulli draws), stopping at the first failure."""
    passed = rng.random((rounds, len(alphas))) < np.asarray(alphas)
    return np.cumprod(passed, axis=1).sum(axis=1)


def test_expected_accepted_and_tokens_against_a_simulation():
    rng = np.random.default_rng(11)
    rounds = 400_000
    for alphas in ([0.9, 0.7, 0.5, 0.8], [0.3], [1.0, 0.0, 1.0], [0.95] * 8):
        accepted = simulate_accepted(alphas, rounds, rng)
        sigma = max(accepted.std(), 1e-9) / math.sqrt(rounds)
        assert abs(accepted.mean() - expected_accepted(alphas)) < 5 * sigma + 1e-12
    for alpha, k in ((0.6, 5), (0.9, 3), (0.2, 1), (0.0, 4), (1.0, 4)):
        tokens = simulate_accepted([alpha] * k, rounds, rng) + 1
        sigma = max(tokens.std(), 1e-9) / math.sqrt(rounds)
        assert abs(tokens.mean() - expected_tokens_geometric(alpha, k)) < 5 * sigma + 1e-12


def test_speedup_against_a_simulated_timeline():
    """Decode 200,000 tokens speculatively (a round costs one target pass and ``k`` draft steps of ``cost`` each,
    and yields its accepted drafts plus one token) and plainly (one pass a token): the ratio of the times is the
    predicted speed-up."""
    rng = np.random.default_rng(12)
    for alpha, k, cost in ((0.8, 4, 0.1), (0.5, 2, 0.0), (0.3, 6, 0.5)):
        wanted = 200_000
        per_round = simulate_accepted([alpha] * k, wanted, rng) + 1
        rounds = int(np.searchsorted(np.cumsum(per_round), wanted)) + 1
        simulated = wanted / (rounds * (1 + cost * k))
        predicted = speedup(expected_tokens_geometric(alpha, k), cost, k)
        assert simulated == pytest.approx(predicted, rel=0.01)


def test_math_helpers_exact_cases():
    assert expected_accepted([]) == 0.0
    assert expected_accepted([1.0, 1.0, 1.0]) == 3.0
    assert expected_accepted([0.5, 0.5]) == 0.75
    assert expected_accepted([0.0, 1.0]) == 0.0
    assert expected_tokens_geometric(0.0, 4) == 1.0
    assert expected_tokens_geometric(1.0, 4) == 5.0
    assert expected_tokens_geometric(0.5, 2) == pytest.approx(1.75)
    assert expected_tokens_geometric(0.5, 0) == 1.0
    for alpha, k in ((0.7, 3), (0.25, 5)):  # the geometric sum is expected_accepted of equal alphas, plus one
        assert expected_tokens_geometric(alpha, k) == pytest.approx(expected_accepted([alpha] * k) + 1)
    assert speedup(3.0, 0.0, 4) == 3.0
    assert speedup(2.0, 0.25, 4) == 1.0
    assert speedup(1.0, 0.5, 0) == 1.0


def test_math_helpers_refuse_bad_input():
    for alpha in (-0.1, 1.5, math.nan):
        with pytest.raises(ArgumentError, match="alpha"):
            expected_accepted([0.5, alpha])
        with pytest.raises(ArgumentError, match="alpha"):
            expected_tokens_geometric(alpha, 3)
    for k in (-1, 1.5, True, None):
        with pytest.raises(ArgumentError, match="k"):
            expected_tokens_geometric(0.5, k)
    for cost in (-0.1, math.nan):
        with pytest.raises(ArgumentError, match="cost_ratio"):
            speedup(2.0, cost, 4)
    for k in (-1, -2, 1.5, True):
        with pytest.raises(ArgumentError, match="k"):
            speedup(2.0, 0.5, k)
    for tokens in (-1.0, math.nan):
        with pytest.raises(ArgumentError, match="tokens_per_round"):
            speedup(tokens, 0.5, 2)


# -- bad input ---------------------------------------------------------------------------------------------------------


def test_bad_input(vocab, structure):
    for k in (0, -1, 1.5, True):
        with pytest.raises(ArgumentError, match="k"):
            Speculation(PromptLookup(), k=k)
    with pytest.raises(ArgumentError, match="source"):
        Speculation(object())
    target = VerifyingTableModel(vocab)
    with pytest.raises(ArgumentError, match="speculation"):
        Decoding(target, [PROMPT], structures=structure, speculation=PromptLookup())
    with pytest.raises(ArgumentError, match="one row"):
        Decoding(target, [PROMPT, PROMPT], structures=structure, speculation=Speculation(PromptLookup()))
    with pytest.raises(ArgumentError, match=r"verify\(\) and rollback\(\)"):
        Decoding(TableModel(vocab.size), [PROMPT], structures=structure, speculation=Speculation(PromptLookup()))
    other = tiny_vocabulary([t.upper() for t in TOKENS])  # as many tokens, other bytes
    for source in (
        ModelDraft(VerifyingTableModel(other)),
        ChainedDrafts(PromptLookup(), ModelDraft(VerifyingTableModel(other))),
    ):
        with pytest.raises(VocabularyError, match="not the target model's"):
            Decoding(target, [PROMPT], structures=structure, speculation=Speculation(source))
    wider = VerifyingTableModel(tiny_vocabulary([*TOKENS, "z"]))
    wider.vocab = vocab
    with pytest.raises(VocabularyError, match="columns"):
        Decoding(target, [PROMPT], structures=structure, speculation=Speculation(ModelDraft(wider)))
    with pytest.raises(ArgumentError, match="model"):
        ModelDraft(object())
    with pytest.raises(ArgumentError, match="sources"):
        ChainedDrafts()
    with pytest.raises(ArgumentError, match="min_ngram"):
        PromptLookup(max_ngram=2, min_ngram=3)
    with pytest.raises(ArgumentError, match="max_ngram"):
        PromptLookup(max_ngram=0)


# -- the real Gemma 3 270M (slow) --------------------------------------------------------------------------------------


GEMMA_CASES = {
    "person": (
        "json",
        {
            "type": "object",
            "properties": {
                "name": {"type": "string", "maxLength": 12},
                "age": {"type": "integer", "minimum": 0, "maximum": 150},
            },
            "required": ["name", "age"],
            "additionalProperties": False,
        },
        'Example: {"name":"Ada","age":36}\nBob is 41 years old.\nJSON: ',
    ),
    "shirt": (
        "json",
        {
            "type": "object",
            "properties": {
                "colour": {"enum": ["red", "green", "blue"]},
                "sizes": {"type": "array", "items": {"type": "integer", "maximum": 99}, "maxItems": 3},
            },
            "required": ["colour", "sizes"],
            "additionalProperties": False,
        },
        'Example: {"colour":"red","sizes":[1,2]}\nA blue shirt in sizes 3 and 5.\nJSON: ',
    ),
    "date": (
        "regex",
        r"(Mon|Tue|Wed|Thu|Fri), [0-9]{1,2} (Jan|Feb|Mar|Apr) 20[0-9]{2}",
        "Dates: Mon, 3 Jan 2022; Tue, 14 Feb 2023; Wed, 21 Mar 2024; Thu, ",
    ),
    "email": (
        "regex",
        r"[a-z]{2,10}@mail\.(com|org|net)",
        "Emails: ada@maths.org, bob@mail.com, carol@mail.com, ",
    ),
}


@pytest.fixture(scope="module")
def gemma():
    """The model and a 12-layer early exit of it as a draft model, on one torch thread (restored afterwards)."""
    torch = pytest.importorskip("torch")
    from constrain.integrations.transformers_model import TransformersModel
    from constrain.models.gemma import load_default_model

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    model, tokenizer = load_default_model()
    yield model, TransformersModel(model, tokenizer), TransformersModel(early_exit_model(model, 12), tokenizer)
    torch.set_num_threads(threads)


@pytest.mark.slow
@pytest.mark.parametrize("case", list(GEMMA_CASES))
def test_gemma_greedy_output_is_the_same_with_every_source(gemma, case):
    _, target, draft = gemma
    kind, spec, prompt = GEMMA_CASES[case]
    structure = compile_json_schema(spec, target.vocab) if kind == "json" else compile_regex(spec, target.vocab)
    sources = {
        "prompt-lookup": PromptLookup(),
        "forced-text": ForcedDrafts(target.tokenize),
        "chained": ChainedDrafts(ForcedDrafts(target.tokenize), PromptLookup()),
        "early-exit-model": ModelDraft(draft),
    }

    def run(source):
        decoding = Decoding(
            target, [target.encode(prompt)], structures=structure, max_new_tokens=40,
            eos_ids=[int(t) for t in target.vocab.eos_ids], tokenize=target.tokenize,
            speculation=Speculation(source, k=4) if source is not None else None,
        )  # fmt: skip
        row = decoding.run()[0]
        assert row.finish_reason == "stop" and row.complete
        return row.tokens, decoding

    plain, plain_decoding = run(None)
    text = target.vocab.decode(plain).decode()
    if kind == "json":
        jsonschema.validate(json.loads(text), spec)
    else:
        assert re.fullmatch(spec, text), text
    for name, source in sources.items():
        tokens, decoding = run(source)
        assert tokens == plain, (name, target.vocab.decode(tokens))
        stats = decoding.speculation_stats
        assert stats.accepted <= stats.valid <= stats.proposed, name
        assert stats.proposed > 0, name
        if name in ("prompt-lookup", "chained"):  # the prompts repeat what the output says
            assert stats.accepted > 0 and decoding.forward_passes < plain_decoding.forward_passes, name


@pytest.mark.slow
def test_early_exit_model_refuses_a_bad_layer_count(gemma):
    model, _, _ = gemma
    for layers in (0, len(model.get_decoder().layers), True):
        with pytest.raises(ArgumentError, match="layers"):
            early_exit_model(model, layers)
