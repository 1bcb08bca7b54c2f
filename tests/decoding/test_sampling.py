"""Sampling: parameters, the transform pipeline, exact supports, distributions, penalties and bad input.

The expected values below are computed by hand or by `reference_probs`, a deliberately naive float64
implementation of the documented definitions (sorted lists, Python loops), independent of constrain.decoding.sampling.
"""

from __future__ import annotations

import math
import pickle

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import chisquare

import constrain.decoding.sampling as S
import constrain.decoding.truncation as truncation
from constrain.decoding.params import PRESETS, SamplingParams
from constrain.decoding.sampling import Sampler, next_token_probs, sample, sample_from_probs
from constrain.decoding.transforms import apply_logit_bias, apply_penalties, apply_structure_mask, log_softmax, softmax
from constrain.errors import ConstrainError, DeadEndError, LogitsError, SamplingParamsError, ShapeError, TokenError
from constrain.kernels.bitmask import bool_to_bitmask

N_DRAWS = 200_000
P_MIN = 0.001

PROBS4 = np.array([0.50, 0.25, 0.15, 0.10])
PROBS6 = np.array([0.35, 0.25, 0.15, 0.12, 0.08, 0.05])


# ----------------------------------------------------------------------------------------------------------------
# an independent reference
# ----------------------------------------------------------------------------------------------------------------


def reference_probs(logits, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0):
    """The documented semantics, written as plainly as possible (float64, Python loops)."""
    z = [float(v) for v in logits]
    V = len(z)
    if any(v == math.inf for v in z):
        z = [0.0 if v == math.inf else -math.inf for v in z]
    if temperature == 0:
        best = max(range(V), key=lambda i: (z[i], -i))
        return np.array([1.0 if i == best else 0.0 for i in range(V)])
    mx = max(z)
    w = [math.exp((v - mx) / temperature) if v > -math.inf else 0.0 for v in z]
    keep = [wi > 0 for wi in w]
    if 0 < top_k < V:
        kth = sorted(w, reverse=True)[top_k - 1]
        keep = [keep[i] and w[i] >= kth for i in range(V)]
    if top_p < 1:
        total = sum(w[i] for i in range(V) if keep[i])
        order = sorted((i for i in range(V) if keep[i]), key=lambda i: -w[i])
        cum, last = 0.0, None
        for i in order:
            cum += w[i]
            if cum >= top_p * total * (1 - 1e-6):
                last = w[i]
                break
        keep = [keep[i] and w[i] >= last for i in range(V)]
    if min_p > 0:
        top = max(w)
        keep = [keep[i] and w[i] >= min_p * top * (1 - 1e-5) for i in range(V)]
    kept = np.array([w[i] if keep[i] else 0.0 for i in range(V)])
    return kept / kept.sum()


BACKENDS = ["numpy", "numpy-wide", "torch-ops", "torch-ops-wide", "torch-auto"]


@pytest.fixture(params=BACKENDS)
def probs_fn(request, monkeypatch):
    """next_token_probs through each implementation: numpy dense, numpy row-wise (the wide-vocabulary path, forced
    on small inputs), torch ops (and their wide-vocabulary nucleus probing, forced), torch tensors through the
    numpy path."""
    kind = request.param
    if kind.endswith("-wide"):
        monkeypatch.setattr(S, "_SPARSE_MIN_V", 1)
        monkeypatch.setattr(truncation, "_SPARSE_MIN_V", 1)

    def run(logits, params=None, **kw):
        logits = np.asarray(logits)
        if kind.startswith("numpy"):
            return next_token_probs(logits, params, **kw)
        kw = {k: (torch.from_numpy(v) if isinstance(v, np.ndarray) else v) for k, v in kw.items()}
        backend = "auto" if kind == "torch-auto" else "torch"
        out = next_token_probs(torch.from_numpy(logits), params, backend=backend, **kw)
        assert isinstance(out, torch.Tensor)
        return out.numpy()

    run.kind = kind
    return run


def assert_dist(got, expected, atol=1e-6):
    got = np.asarray(got, dtype=np.float64)
    np.testing.assert_array_equal(got > 0, np.asarray(expected) > 0)
    np.testing.assert_allclose(got, expected, atol=atol, rtol=0)


# ----------------------------------------------------------------------------------------------------------------
# parameters
# ----------------------------------------------------------------------------------------------------------------

INVALID = [
    ("temperature", -0.1),
    ("temperature", float("nan")),
    ("temperature", float("inf")),
    ("temperature", "hot"),
    ("top_p", 0.0),
    ("top_p", 1.5),
    ("top_p", -0.2),
    ("top_p", float("nan")),
    ("top_k", -1),
    ("top_k", 2.5),
    ("top_k", True),
    ("min_p", -0.01),
    ("min_p", 1.01),
    ("min_p", float("nan")),
    ("repetition_penalty", 0.0),
    ("repetition_penalty", -1.2),
    ("repetition_penalty", float("inf")),
    ("frequency_penalty", float("nan")),
    ("frequency_penalty", float("-inf")),
    ("presence_penalty", float("inf")),
    ("no_repeat_ngram_size", -1),
    ("no_repeat_ngram_size", 2.0),
    ("logit_bias", {-1: 1.0}),
    ("logit_bias", {"a": 1.0}),
    ("logit_bias", {3: float("nan")}),
    ("logit_bias", {3: float("inf")}),
    ("logit_bias", [(1, 2.0)]),
    ("seed", -5),
    ("seed", 1.5),
]


@pytest.mark.parametrize("name,value", INVALID)
def test_invalid_parameter_names_it(name, value):
    with pytest.raises(SamplingParamsError) as info:
        SamplingParams(**{name: value})
    err = info.value
    assert err.parameter == name
    assert name in str(err)
    assert isinstance(err, ValueError) and isinstance(err, ConstrainError)


def test_valid_extremes_and_normalisation():
    p = SamplingParams(
        temperature=0,
        top_p=1,
        top_k=0,
        min_p=1,
        repetition_penalty=0.5,
        frequency_penalty=-2,
        presence_penalty=2,
        no_repeat_ngram_size=3,
        logit_bias={np.int64(4): -math.inf, 2: 1},
        seed=np.int64(7),
    )
    assert p.greedy and p.temperature == 0.0 and isinstance(p.temperature, float)
    assert dict(p.logit_bias) == {4: -math.inf, 2: 1.0}
    assert isinstance(p.seed, int)
    with pytest.raises(TypeError):
        p.logit_bias[5] = 1.0  # read-only
    assert p == SamplingParams(
        **{
            f: getattr(p, f)
            for f in (
                "temperature",
                "top_p",
                "top_k",
                "min_p",
                "repetition_penalty",
                "frequency_penalty",
                "presence_penalty",
                "no_repeat_ngram_size",
                "logit_bias",
                "seed",
            )
        }
    )
    assert hash(p) == hash(pickle.loads(pickle.dumps(p)))
    assert pickle.loads(pickle.dumps(p)) == p
    with pytest.raises(SamplingParamsError) as info:
        p.replace(top_p=2.0)
    assert info.value.parameter == "top_p"


def test_presets():
    assert set(PRESETS) == {"extraction", "code", "chat", "creative"}
    assert PRESETS["extraction"].greedy
    assert SamplingParams.preset("code").temperature == pytest.approx(0.2)
    chat = SamplingParams.preset("chat", seed=3)
    assert chat.seed == 3 and chat.top_p == pytest.approx(0.9)
    assert SamplingParams.preset("creative").min_p > 0
    with pytest.raises(SamplingParamsError) as info:
        SamplingParams.preset("poetry")
    assert info.value.parameter == "preset"
    for p in PRESETS.values():  # every preset runs
        probs = next_token_probs(np.log(PROBS6), p)
        assert probs.sum() == pytest.approx(1.0)


# ----------------------------------------------------------------------------------------------------------------
# worked examples: exact supports and probabilities
# ----------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_worked_examples_four_tokens(probs_fn, dtype):
    logits = np.log(PROBS4).astype(dtype)
    # top-k 2: {0.50, 0.25} -> 2/3, 1/3
    assert_dist(probs_fn(logits, SamplingParams(top_k=2)), [2 / 3, 1 / 3, 0, 0])
    # top-p 0.70: 0.50 < 0.70, 0.50 + 0.25 = 0.75 >= 0.70 (the crossing token is kept)
    assert_dist(probs_fn(logits, SamplingParams(top_p=0.70)), [2 / 3, 1 / 3, 0, 0])
    # min-p 0.30: keep p >= 0.30 * 0.50 = 0.15 -> {0.50, 0.25, 0.15} / 0.90
    assert_dist(probs_fn(logits, SamplingParams(min_p=0.30)), [0.5 / 0.9, 0.25 / 0.9, 0.15 / 0.9, 0])
    # top-p exactly on a boundary: 0.50 + 0.25 reaches 0.75, the third token is not needed
    assert_dist(probs_fn(logits, SamplingParams(top_p=0.75)), [2 / 3, 1 / 3, 0, 0])
    # no filter, and greedy
    assert_dist(probs_fn(logits, SamplingParams()), PROBS4)
    assert_dist(probs_fn(logits, SamplingParams(temperature=0)), [1, 0, 0, 0])


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_worked_examples_nucleus(probs_fn, dtype):
    logits = np.log(PROBS6).astype(dtype)
    # p = 0.8: cumulative 0.35, 0.60, 0.75, 0.87 -> four tokens, mass 0.87
    assert_dist(probs_fn(logits, SamplingParams(top_p=0.8)), np.r_[PROBS6[:4] / 0.87, 0, 0])
    # p = 0.5: cumulative 0.35, 0.60 -> two tokens, mass 0.60
    assert_dist(probs_fn(logits, SamplingParams(top_p=0.5)), np.r_[PROBS6[:2] / 0.60, 0, 0, 0, 0])
    # a tiny p keeps the top token only: never empty
    assert_dist(probs_fn(logits, SamplingParams(top_p=1e-9)), [1, 0, 0, 0, 0, 0])


def test_composition_order(probs_fn):
    logits = np.log(PROBS6)
    # top-p works on what top-k left, renormalised: top-3 = (.35,.25,.15)/.75 = (.467,.333,.2); p=0.8 is reached
    # by the first two (0.8 exactly)
    assert_dist(probs_fn(logits, SamplingParams(top_k=3, top_p=0.8)), [0.35 / 0.6, 0.25 / 0.6, 0, 0, 0, 0])
    # min-p after top-p: 0.5 * 0.35 = 0.175 keeps two of the nucleus' four
    assert_dist(probs_fn(logits, SamplingParams(top_p=0.8, min_p=0.5)), [0.35 / 0.6, 0.25 / 0.6, 0, 0, 0, 0])
    # temperature before the filters: T=0.5 squares the probabilities
    sq = PROBS6**2 / (PROBS6**2).sum()
    assert_dist(probs_fn(logits, SamplingParams(temperature=0.5)), sq)
    assert_dist(probs_fn(logits, SamplingParams(temperature=0.5, top_k=2)), np.r_[sq[:2] / sq[:2].sum(), 0, 0, 0, 0])
    # top-p on the tempered distribution: sq = (.455,.232,.084,.054,.024,.009): 0.455+0.232 = 0.687 >= 0.6
    assert_dist(probs_fn(logits, SamplingParams(temperature=0.5, top_p=0.6)), np.r_[sq[:2] / sq[:2].sum(), 0, 0, 0, 0])


def test_ties_are_kept_together(probs_fn):
    logits = np.log([0.3, 0.2, 0.2, 0.2, 0.1])
    # top-k 2: the 2nd largest is tied three ways: all three are kept
    assert_dist(probs_fn(logits, SamplingParams(top_k=2)), [0.3 / 0.9, 0.2 / 0.9, 0.2 / 0.9, 0.2 / 0.9, 0])
    # top-p 0.4: 0.3 + 0.2 crosses at a tied token: its ties come along
    assert_dist(probs_fn(logits, SamplingParams(top_p=0.4)), [0.3 / 0.9, 0.2 / 0.9, 0.2 / 0.9, 0.2 / 0.9, 0])
    # greedy on a tie: the first index
    assert_dist(probs_fn(np.array([1.0, 3.0, 3.0]), SamplingParams(temperature=0)), [0, 1, 0])


@pytest.mark.parametrize("seed", range(40))
def test_matches_reference_random(probs_fn, seed):
    rng = np.random.default_rng(seed)
    V = int(rng.integers(2, 40))
    logits = rng.standard_normal(V) * rng.uniform(0.2, 4.0)
    if seed % 3 == 0:
        logits = np.round(logits)  # ties
    if seed % 4 == 1:
        logits[rng.random(V) < 0.4] = -np.inf
        logits[int(rng.integers(V))] = 0.5
    params = SamplingParams(
        temperature=float(rng.choice([0.0, 0.3, 1.0, 1.7])),
        top_k=int(rng.choice([0, 1, 2, 3, 10, 100])),
        top_p=float(rng.choice([1.0, 0.95, 0.6, 0.2])),
        min_p=float(rng.choice([0.0, 0.02, 0.2, 0.9])),
    )
    expected = reference_probs(logits, params.temperature, params.top_k, params.top_p, params.min_p)
    assert_dist(probs_fn(logits, params), expected, atol=1e-9)


def test_per_row_parameters(probs_fn):
    logits = np.log(np.stack([PROBS6, PROBS6[::-1], PROBS6, PROBS6]))
    params = [
        SamplingParams(top_k=2),
        SamplingParams(top_p=0.5),
        SamplingParams(temperature=0),
        SamplingParams(min_p=0.4, temperature=2.0),
    ]
    got = probs_fn(logits, params)
    for r, p in enumerate(params):
        assert_dist(got[r], reference_probs(logits[r], p.temperature, p.top_k, p.top_p, p.min_p))
    with pytest.raises(ShapeError):
        probs_fn(logits, params[:3])


def test_wide_vocabulary_paths_agree():
    """The row-wise path for wide vocabularies (candidate sets, no full sort) against the dense reference."""
    rng = np.random.default_rng(0)
    V = 20_000
    cases = [
        SamplingParams(top_p=0.9),
        SamplingParams(top_p=0.9, temperature=0.7),
        SamplingParams(top_p=0.999),
        SamplingParams(top_k=50),
        SamplingParams(top_k=50, top_p=0.8, min_p=0.05, temperature=0.8),
        SamplingParams(min_p=0.1),
        SamplingParams(min_p=0.01, top_p=0.5),
        SamplingParams(top_k=3000, min_p=0.02),
        SamplingParams(top_k=10, top_p=0.95),
        SamplingParams(temperature=1.3),
    ]
    for scale in (0.5, 2.5, 6.0):
        logits = (rng.standard_normal((len(cases), V)) * scale).astype(np.float32)
        logits[:, :3] += 8.0  # a peaked head
        got = next_token_probs(logits, cases)
        torch_ops = next_token_probs(torch.from_numpy(logits), cases, backend="torch").numpy()
        for r, p in enumerate(cases):
            exp_ = reference_probs(logits[r].astype(np.float64), p.temperature, p.top_k, p.top_p, p.min_p)
            assert_dist(got[r], exp_, atol=1e-6)
            assert_dist(torch_ops[r], exp_, atol=1e-6)


# ----------------------------------------------------------------------------------------------------------------
# distributions: seeded draws against the exact filtered distribution
# ----------------------------------------------------------------------------------------------------------------


def chi_square_p(draws, expected, V):
    counts = np.bincount(np.asarray(draws), minlength=V)
    support = np.asarray(expected) > 0
    assert counts[~support].sum() == 0, f"drew outside the support: {counts}"
    exp_counts = np.asarray(expected)[support] * len(draws)
    obs = counts[support]
    if support.sum() == 1:
        return 1.0
    return chisquare(obs, exp_counts * obs.sum() / exp_counts.sum()).pvalue


DIST_CASES = [
    ("plain", PROBS6, SamplingParams()),
    ("temperature 0.5", PROBS6, SamplingParams(temperature=0.5)),
    ("temperature 2", PROBS6, SamplingParams(temperature=2.0)),
    ("top-k 2", PROBS4, SamplingParams(top_k=2)),
    ("top-p 0.70", PROBS4, SamplingParams(top_p=0.70)),
    ("min-p 0.30", PROBS4, SamplingParams(min_p=0.30)),
    ("nucleus 0.8", PROBS6, SamplingParams(top_p=0.8)),
    ("nucleus 0.5", PROBS6, SamplingParams(top_p=0.5)),
    ("all filters", PROBS6, SamplingParams(temperature=0.8, top_k=5, top_p=0.9, min_p=0.1)),
]


@pytest.mark.parametrize("name,probs,params", DIST_CASES, ids=[c[0] for c in DIST_CASES])
@pytest.mark.parametrize("kind", ["numpy", "torch"])
def test_distribution_chi_square(name, probs, params, kind):
    logits = np.tile(np.log(probs), (N_DRAWS, 1))
    sampler = Sampler(params.replace(seed=1234))
    if kind == "numpy":
        draws = sampler(logits)
    else:
        draws = Sampler(params.replace(seed=1234), backend="torch")(torch.from_numpy(logits)).numpy()
    expected = reference_probs(np.log(probs), params.temperature, params.top_k, params.top_p, params.min_p)
    assert chi_square_p(draws, expected, len(probs)) > P_MIN


def test_distribution_with_penalties_bias_and_mask():
    """Everything at once: the draws follow the exact distribution computed by hand from the documented order."""
    logits = np.array([2.0, 1.5, -0.5, 1.0, 0.2, 3.0, 0.0])
    history = [0, 0, 2, 4]
    params = SamplingParams(
        repetition_penalty=1.5,
        frequency_penalty=0.2,
        presence_penalty=0.1,
        logit_bias={3: 0.4, 6: -math.inf},
        temperature=0.9,
        top_k=4,
        seed=99,
    )
    allowed = np.array([True, True, True, True, True, False, True])
    z = logits.copy()
    z[0] = 2.0 / 1.5 - 0.2 * 2 - 0.1
    z[2] = -0.5 * 1.5 - 0.2 - 0.1
    z[4] = 0.2 / 1.5 - 0.2 - 0.1
    z[3] += 0.4
    z[6] = -math.inf
    z[5] = -math.inf
    expected = reference_probs(z, 0.9, 4)
    n = N_DRAWS
    tiled = np.tile(logits, (n, 1))
    draws = Sampler(params)(tiled, history=np.tile(history, (n, 1)), mask=bool_to_bitmask(np.tile(allowed, (n, 1))))
    assert_dist(next_token_probs(logits, params, history=history, mask=allowed), expected)
    assert chi_square_p(draws, expected, len(logits)) > P_MIN


def test_wide_draws_chi_square():
    """The draw on wide rows: from a candidate support, and from a dense row (block sums), against exact probs."""
    rng = np.random.default_rng(5)
    V = 10_000
    probs = np.zeros(V)
    hot = rng.choice(V, 6, replace=False)
    probs[hot] = PROBS6
    cdf = np.cumsum(PROBS6)
    u = np.random.default_rng(11).random(N_DRAWS)
    P = np.broadcast_to(probs.astype(np.float32), (N_DRAWS, V))
    draws = S._draw_numpy(P, u, [(hot, cdf)] * N_DRAWS)
    assert chi_square_p(draws, probs, V) > P_MIN
    # dense wide rows, spread over several blocks and with zero blocks in between (fewer draws: one row each)
    dense = np.zeros(V, dtype=np.float32)
    spots = np.array([3, 1500, 1501, 4096, 9000, 9999])
    dense[spots] = PROBS6
    u2 = u[:10_000]
    draws2 = np.array([S._draw_row(dense, float(x)) for x in u2])
    assert chi_square_p(draws2, dense.astype(np.float64), V) > P_MIN
    # and end to end on a wide vocabulary: temperature only (dense row) and top-k (candidate support)
    logits = np.full(V, -np.inf, dtype=np.float32)
    logits[spots] = np.log(PROBS6)
    for params in (SamplingParams(seed=3), SamplingParams(top_k=3, seed=3)):
        sampler = Sampler(params)
        d = np.array([sampler(logits) for _ in range(2_000)])
        exp_ = reference_probs(logits, 1.0, params.top_k)
        assert chi_square_p(d, exp_, V) > P_MIN


def test_masked_token_never_sampled():
    rng = np.random.default_rng(0)
    V = 64
    logits = rng.standard_normal(V) * 3
    allowed = rng.random(V) < 0.3
    allowed[np.argmax(logits)] = False  # the model's favourite is forbidden
    n = 50_000
    draws = Sampler(SamplingParams(seed=1))(np.tile(logits, (n, 1)), mask=np.tile(allowed, (n, 1)))
    assert allowed[draws].all()
    expected = np.where(allowed, np.exp(logits - logits.max()), 0)
    expected /= expected.sum()
    assert chi_square_p(draws, expected, V) > P_MIN
    # a masked token with a huge logit (and even +inf) is never drawn
    big = logits.copy()
    big[~allowed] = np.inf
    d2 = Sampler(SamplingParams(seed=2))(np.tile(big, (n, 1)), mask=bool_to_bitmask(np.tile(allowed, (n, 1))))
    assert allowed[d2].all()


def test_seeded_reproducible_and_backends_agree():
    rng = np.random.default_rng(3)
    logits = rng.standard_normal((8, 50)).astype(np.float32)
    p = SamplingParams(temperature=0.8, top_p=0.9, seed=42)
    a = [Sampler(p)(logits) for _ in range(2)]
    np.testing.assert_array_equal(a[0], a[1])
    t = Sampler(p, backend="torch")(torch.from_numpy(logits)).numpy()
    np.testing.assert_array_equal(a[0], t)
    s = sample(logits, p)
    np.testing.assert_array_equal(a[0], s)
    # a stream: successive calls differ, and a fresh sampler repeats the stream
    s1 = Sampler(p)
    first = [s1(logits) for _ in range(5)]
    s2 = Sampler(p)
    again = [s2(logits) for _ in range(5)]
    np.testing.assert_array_equal(np.array(first), np.array(again))
    assert len({tuple(x) for x in first}) > 1


def test_per_row_seeds_are_independent_of_other_rows():
    rng = np.random.default_rng(4)
    logits = rng.standard_normal((3, 30))
    p0 = SamplingParams(seed=7, temperature=1.2)
    alone = [Sampler([p0])(logits[:1])[0] for _ in range(1)]
    mixed = Sampler([p0, SamplingParams(seed=8), SamplingParams()], seed=5)(logits)
    assert mixed[0] == alone[0]
    # the same seed in two rows with the same logits gives the same token
    same = Sampler([p0, p0])(np.stack([logits[0], logits[0]]))
    assert same[0] == same[1]


def test_one_dimensional_input_and_scalars():
    logits = np.log(PROBS4)
    t = sample(logits, SamplingParams(temperature=0))
    assert int(t) == 0 and np.ndim(t) == 0
    tt = sample(torch.tensor(logits), SamplingParams(temperature=0))
    assert isinstance(tt, torch.Tensor) and tt.ndim == 0 and int(tt) == 0
    assert next_token_probs(logits).shape == (4,)
    assert int(sample_from_probs(np.array([0.0, 0.0, 1.0]), 0)) == 2
    assert sample_from_probs(torch.tensor([[0.0, 1.0], [1.0, 0.0]]), 0).tolist() == [1, 0]
    with pytest.raises(DeadEndError):
        sample_from_probs(np.zeros(3))


def test_half_precision_inputs():
    logits = np.log(PROBS4)
    for dt in (torch.float16, torch.bfloat16):
        got = next_token_probs(torch.tensor(logits, dtype=dt), SamplingParams(top_k=2))
        assert got.dtype == torch.float32
        assert_dist(got.numpy(), [2 / 3, 1 / 3, 0, 0], atol=5e-3)
    got = next_token_probs(logits.astype(np.float16), SamplingParams(top_k=2))
    assert_dist(got, [2 / 3, 1 / 3, 0, 0], atol=5e-3)


# ----------------------------------------------------------------------------------------------------------------
# penalties against logits computed by hand
# ----------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["numpy", "torch"])
def test_repetition_penalty_by_hand(kind):
    logits = np.array([[2.0, -1.0, 0.5, 3.0, 0.0]])
    history = [[0, 1, 1, 4]]
    # seen: 0 (positive: divided), 1 (negative: multiplied), 4 (zero: stays 0); 2 and 3 unseen
    expected = np.array([[1.0, -2.0, 0.5, 3.0, 0.0]])
    x = logits if kind == "numpy" else torch.from_numpy(logits)
    got = apply_penalties(x, history, SamplingParams(repetition_penalty=2.0))
    np.testing.assert_allclose(np.asarray(got), expected)
    np.testing.assert_array_equal(np.asarray(x), logits)  # input untouched


@pytest.mark.parametrize("kind", ["numpy", "torch"])
def test_frequency_presence_by_hand(kind):
    logits = np.array([1.0, 1.0, 1.0, 1.0])
    history = [0, 1, 1, 1, 3]
    params = SamplingParams(frequency_penalty=0.5, presence_penalty=0.25)
    # token 0: 1 - 0.5*1 - 0.25; token 1: 1 - 0.5*3 - 0.25; token 2 unseen; token 3: 1 - 0.5 - 0.25
    expected = np.array([0.25, -0.75, 1.0, 0.25])
    x = logits if kind == "numpy" else torch.from_numpy(logits)
    np.testing.assert_allclose(np.asarray(apply_penalties(x, history, params)), expected)
    # negative values encourage repetition
    enc = apply_penalties(logits, history, SamplingParams(frequency_penalty=-1.0))
    np.testing.assert_allclose(enc, [2.0, 4.0, 1.0, 2.0])


def test_penalties_compose_in_order():
    logits = np.array([4.0, -2.0, 1.0])
    history = [0, 0, 1]
    p = SamplingParams(repetition_penalty=2.0, frequency_penalty=1.0, presence_penalty=0.5)
    # repetition first (on raw logits), then frequency and presence
    expected = [4.0 / 2 - 2 * 1.0 - 0.5, -2.0 * 2 - 1.0 - 0.5, 1.0]
    np.testing.assert_allclose(apply_penalties(logits, history, p), expected)
    # ... which is what the probabilities use
    assert_dist(next_token_probs(logits, p, history=history), reference_probs(expected))


@pytest.mark.parametrize("kind", ["numpy", "torch"])
def test_no_repeat_ngram_by_hand(kind):
    logits = np.zeros((4, 6))
    history = np.array([[1, 2, 3, 1, 2], [1, 2, 3, 1, 2], [1, 2, 3, 1, 2], [5, 5, 5, 5, 5]])
    params = [
        SamplingParams(no_repeat_ngram_size=3),  # prefix (1, 2) was followed by 3: ban 3
        SamplingParams(no_repeat_ngram_size=2),  # prefix (2,) was followed by 3: ban 3
        SamplingParams(no_repeat_ngram_size=1),  # every seen token: ban 1, 2, 3
        SamplingParams(no_repeat_ngram_size=2),
    ]  # (5,) -> 5: ban 5
    x = logits if kind == "numpy" else torch.from_numpy(logits)
    got = np.asarray(apply_penalties(x, history, params))
    ninf = -np.inf
    expected = np.array(
        [[0, 0, 0, ninf, 0, 0], [0, 0, 0, ninf, 0, 0], [0, ninf, ninf, ninf, 0, 0], [0, 0, 0, 0, 0, ninf]]
    )
    np.testing.assert_array_equal(got, expected)
    # a history shorter than n - 1 bans nothing
    np.testing.assert_array_equal(
        apply_penalties(np.zeros(4), [1], SamplingParams(no_repeat_ngram_size=3)), np.zeros(4)
    )
    # ... and a banned token is never drawn
    d = Sampler(SamplingParams(no_repeat_ngram_size=1, seed=0))(np.zeros((1000, 4)), history=np.tile([0, 2], (1000, 1)))
    assert set(d.tolist()) == {1, 3}


def test_penalties_per_row_and_ragged_history():
    logits = np.array([[1.0, 2.0, 3.0], [1.0, 2.0, 3.0], [1.0, 2.0, 3.0]])
    history = [[0], [], [2, 2]]
    params = [
        SamplingParams(repetition_penalty=2.0),
        SamplingParams(frequency_penalty=1.0),
        SamplingParams(frequency_penalty=1.0),
    ]
    got = apply_penalties(logits, history, params)
    np.testing.assert_allclose(got, [[0.5, 2.0, 3.0], [1.0, 2.0, 3.0], [1.0, 2.0, 1.0]])
    tg = apply_penalties(torch.from_numpy(logits), history, params).numpy()
    np.testing.assert_allclose(tg, got)


def test_logit_bias_by_hand():
    logits = np.array([[0.0, 1.0, np.inf, 2.0], [0.0, 1.0, 2.0, 3.0]])
    params = [SamplingParams(logit_bias={0: 5.0, 2: -math.inf}), SamplingParams(logit_bias={3: -1.5})]
    got = apply_logit_bias(logits, params)
    # -inf bans even a +inf logit (no NaN)
    np.testing.assert_array_equal(got, [[5.0, 1.0, -np.inf, 2.0], [0.0, 1.0, 2.0, 1.5]])
    np.testing.assert_array_equal(apply_logit_bias(torch.from_numpy(logits), params).numpy(), got)
    with pytest.raises(TokenError):
        apply_logit_bias(logits, SamplingParams(logit_bias={4: 1.0}))
    with pytest.raises(TokenError):
        apply_penalties(logits, [[9], [0]], SamplingParams(repetition_penalty=1.1))


def test_inplace_transforms():
    logits = np.array([[1.0, 2.0, 3.0]])
    out = apply_penalties(logits, [[2]], SamplingParams(repetition_penalty=3.0), inplace=True)
    assert out is logits and logits[0, 2] == 1.0
    t = torch.tensor([[1.0, 2.0, 3.0]])
    apply_structure_mask(t, np.array([[True, False, True]]), inplace=True)
    assert t.tolist() == [[1.0, float("-inf"), 3.0]]


# ----------------------------------------------------------------------------------------------------------------
# structure masks and bad input
# ----------------------------------------------------------------------------------------------------------------


def test_packed_and_boolean_masks_agree(probs_fn):
    rng = np.random.default_rng(9)
    V = 70  # not a multiple of 32
    logits = rng.standard_normal((3, V))
    allowed = rng.random((3, V)) < 0.5
    allowed[:, 0] = True
    a = probs_fn(logits, SamplingParams(top_p=0.9), mask=allowed)
    b = probs_fn(logits, SamplingParams(top_p=0.9), mask=bool_to_bitmask(allowed))
    np.testing.assert_allclose(a, b)
    assert (a[~allowed] == 0).all()
    # masked softmax: the model's distribution conditioned on the allowed set
    plain = probs_fn(logits, SamplingParams(), mask=allowed)
    cond = np.where(allowed, np.exp(logits - logits.max(1, keepdims=True)), 0)
    np.testing.assert_allclose(plain, cond / cond.sum(1, keepdims=True), atol=1e-6)


def test_structure_mask_transform():
    logits = np.arange(40, dtype=np.float32)
    allowed = np.zeros(40, dtype=bool)
    allowed[[1, 33, 39]] = True
    got = apply_structure_mask(logits, bool_to_bitmask(allowed))
    assert np.isfinite(got).nonzero()[0].tolist() == [1, 33, 39]
    with pytest.raises(ShapeError):
        apply_structure_mask(logits, np.ones(39, dtype=bool))
    with pytest.raises(ShapeError):
        apply_structure_mask(logits, np.ones(2, dtype=np.float32))


def test_nan_logits_raise(probs_fn):
    logits = np.array([0.1, np.nan, 0.3])
    with pytest.raises(LogitsError, match="NaN"):
        probs_fn(logits)
    # even under a masked entry
    with pytest.raises(LogitsError):
        probs_fn(logits, mask=np.array([True, False, True]))
    with pytest.raises(ValueError):
        sample(logits)


def test_positive_infinity_dominates(probs_fn):
    logits = np.array([1.0, np.inf, 50.0, np.inf, -np.inf])
    assert_dist(probs_fn(logits, SamplingParams()), [0, 0.5, 0, 0.5, 0])
    assert_dist(probs_fn(logits, SamplingParams(temperature=0.3, top_k=1)), [0, 0.5, 0, 0.5, 0])
    assert_dist(probs_fn(logits, SamplingParams(temperature=0)), [0, 1, 0, 0, 0])
    # a masked +inf is out; the remaining +inf takes everything
    assert_dist(probs_fn(logits, mask=np.array([True, False, True, True, True])), [0, 0, 0, 1, 0])
    # penalties do not turn +inf into NaN
    assert_dist(
        probs_fn(logits, SamplingParams(repetition_penalty=1.3, frequency_penalty=1.0), history=[1, 1]),
        [0, 0.5, 0, 0.5, 0],
    )
    n = 20_000
    d = Sampler(SamplingParams(seed=0))(np.tile(logits, (n, 1)))
    assert set(d.tolist()) == {1, 3}
    assert abs((d == 1).mean() - 0.5) < 0.02


def test_dead_end_raises(probs_fn):
    logits = np.array([[0.5, 1.0, 2.0], [0.0, 0.0, 0.0]])
    mask = np.array([[False, False, False], [True, True, False]])
    with pytest.raises(DeadEndError, match="row 0"):
        probs_fn(logits, mask=mask)
    with pytest.raises(DeadEndError):
        probs_fn(logits, mask=bool_to_bitmask(mask))
    with pytest.raises(DeadEndError):
        Sampler()(logits, mask=mask)
    with pytest.raises(DeadEndError):  # banned by bias and penalties only: also a dead end
        probs_fn(np.array([1.0, 2.0]), SamplingParams(logit_bias={0: -math.inf}, no_repeat_ngram_size=1), history=[1])


def test_bad_shapes_and_types():
    with pytest.raises(ShapeError):
        next_token_probs(np.zeros((2, 3, 4)))
    with pytest.raises(LogitsError):
        next_token_probs(np.array([1, 2, 3]))
    with pytest.raises(ShapeError):
        next_token_probs(np.zeros((2, 0)))
    with pytest.raises(ShapeError):
        apply_penalties(np.zeros((2, 3)), np.zeros((3, 2), dtype=np.int64), SamplingParams(repetition_penalty=2.0))
    with pytest.raises(ValueError):
        next_token_probs(np.zeros(3), backend="jax")


def test_softmax_helpers_are_stable():
    x = np.array([1000.0, 1000.0, -np.inf])
    np.testing.assert_allclose(softmax(x), [0.5, 0.5, 0.0])
    np.testing.assert_allclose(softmax(torch.tensor(x)).numpy(), [0.5, 0.5, 0.0])
    np.testing.assert_allclose(softmax(np.array([np.inf, 1.0, np.inf])), [0.5, 0, 0.5])
    np.testing.assert_allclose(log_softmax(np.array([[1000.0, 1000.0]])), [[-math.log(2)] * 2])
    assert np.all(log_softmax(np.array([-np.inf, -np.inf])) == -np.inf)


# ----------------------------------------------------------------------------------------------------------------
# properties
# ----------------------------------------------------------------------------------------------------------------


@settings(max_examples=150, deadline=None)
@given(
    # logits on a grid of 1/4 (many exact ties, no ties that only float rounding decides)
    logits=st.lists(st.integers(-120, 120).map(lambda i: i / 4) | st.just(-math.inf), min_size=1, max_size=20),
    temperature=st.sampled_from([0.0, 0.1, 0.7, 1.0, 3.0]),
    top_k=st.integers(0, 25),
    top_p=st.floats(0.01, 1.0),
    min_p=st.floats(0.0, 1.0),
    seed=st.integers(0, 2**32 - 1),
)
def test_property_support(logits, temperature, top_k, top_p, min_p, seed):
    x = np.array(logits)
    params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, seed=seed)
    if np.all(x == -np.inf):
        with pytest.raises(DeadEndError):
            next_token_probs(x, params)
        return
    probs = next_token_probs(x, params)
    assert probs.sum() == pytest.approx(1.0)
    assert (probs[x == -np.inf] == 0).all()
    assert probs[np.argmax(x)] > 0  # the top token always survives
    if temperature > 0 and top_k > 0 and top_p == 1.0 and min_p == 0.0:
        assert (probs > 0).sum() >= min(top_k, np.isfinite(x).sum())
    t = int(Sampler(params)(x))
    assert probs[t] > 0
    expected = reference_probs(x, temperature, top_k, top_p, min_p)
    np.testing.assert_allclose(probs, expected, atol=1e-6)
