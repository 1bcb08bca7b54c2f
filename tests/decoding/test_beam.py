"""Beam search: exhaustive equality with B = V^t, end of sequence, length penalty, structures and dead ends."""

from __future__ import annotations

import hashlib
import math
import re

import numpy as np
import pytest
import torch
import transformers

from constrain import Vocabulary, compile_regex
from constrain.decoding.beam import BeamHypothesis, beam_search, model_next_logits
from constrain.decoding.transforms import log_softmax
from constrain.errors import BeamSearchError, DeadEndError, ShapeError

# ----------------------------------------------------------------------------------------------------------------
# toy models
# ----------------------------------------------------------------------------------------------------------------


class TableModel:
    """Deterministic pseudo-random logits for every prefix (a hash of the prefix seeds them)."""

    def __init__(self, vocab_size: int, seed: int = 0, scale: float = 2.0):
        self.V = vocab_size
        self.seed = seed
        self.scale = scale
        self.calls = 0

    def logits(self, prefix) -> np.ndarray:
        h = hashlib.sha256(repr((self.seed, tuple(prefix))).encode()).digest()
        rng = np.random.default_rng(int.from_bytes(h[:8], "little"))
        return rng.standard_normal(self.V) * self.scale

    def __call__(self, prefixes):
        self.calls += 1
        return np.stack([self.logits(p) for p in prefixes])


def exhaustive(model_logits, prompt, V, t, eos, length_penalty, allowed_fn=None):
    """Every sequence of at most t tokens (end tokens only last), scored as beam search scores it.

    ``allowed_fn(tokens) -> bool mask or None``: a structure; the log-probabilities are then the masked softmax.
    Returns [(score, tokens, log_prob, finished)] best first, unfinished length-t sequences included.
    """
    out = []

    def rec(tokens, lp):
        logits = np.asarray(model_logits(list(prompt) + list(tokens)), dtype=np.float64)
        if allowed_fn is not None:
            allowed = allowed_fn(tokens)
            logits = np.where(allowed, logits, -np.inf)
        logp = log_softmax(logits)
        for tok in range(V):
            if logp[tok] == -np.inf:
                continue
            seq = tokens + (tok,)
            s = lp + logp[tok]
            if tok in eos:
                out.append((s / len(seq) ** length_penalty, seq, s, True))
            elif len(seq) == t:
                out.append((s / len(seq) ** length_penalty, seq, s, False))
            else:
                rec(seq, s)

    rec((), 0.0)
    out.sort(key=lambda h: (-h[0], h[1]))
    return out


def assert_same(hyps, expected):
    assert len(hyps) == len(expected)
    for h, e in zip(hyps, expected):
        assert isinstance(h, BeamHypothesis)
        assert h.tokens == e[1]
        assert h.finished == e[3]
        assert h.score == pytest.approx(e[0], abs=1e-9)
        assert h.log_prob == pytest.approx(e[2], abs=1e-9)


# ----------------------------------------------------------------------------------------------------------------
# exhaustive equality
# ----------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("length_penalty", [0.0, 1.0, 2.0, -0.5])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_full_beam_equals_exhaustive_search(length_penalty, seed):
    V, t, eos = 4, 3, {3}
    model = TableModel(V, seed)
    B = V**t
    expected = exhaustive(model.logits, [7], V, t, eos, length_penalty)
    n = min(B, len(expected), 20)
    hyps = beam_search(
        model,
        [7],
        num_beams=B,
        max_new_tokens=t,
        eos_token_id=3,
        length_penalty=length_penalty,
        num_return_sequences=n,
        early_stopping=False,
    )
    assert_same(hyps, expected[:n])
    # early stopping changes nothing (the bound is exact)
    hyps2 = beam_search(
        model,
        [7],
        num_beams=B,
        max_new_tokens=t,
        eos_token_id=3,
        length_penalty=length_penalty,
        num_return_sequences=n,
        early_stopping=True,
    )
    assert_same(hyps2, expected[:n])


def test_full_beam_without_end_token_is_the_argmax_over_all_sequences():
    V, t = 3, 4
    model = TableModel(V, seed=5)
    expected = exhaustive(model.logits, [], V, t, set(), 0.0)
    assert len(expected) == V**t
    hyps = beam_search(model, num_beams=V**t, max_new_tokens=t, num_return_sequences=V**t, length_penalty=0.0)
    assert_same(hyps, expected)
    assert not any(h.finished for h in hyps)
    # the scores are sums of log-probabilities of the generated tokens
    best = hyps[0]
    lp = sum(log_softmax(model.logits(list(best.tokens[:i])))[best.tokens[i]] for i in range(t))
    assert best.log_prob == pytest.approx(lp)


def test_small_beam_is_a_lower_bound_and_greedy_when_one():
    V, t = 5, 4
    model = TableModel(V, seed=9)
    expected = exhaustive(model.logits, [], V, t, {4}, 1.0)
    best = beam_search(model, num_beams=3, max_new_tokens=t, eos_token_id=4)[0]
    assert best.score <= expected[0][0] + 1e-12
    # num_beams = 1 is greedy decoding
    g = beam_search(model, num_beams=1, max_new_tokens=t, eos_token_id=4, length_penalty=0.0)[0]
    toks = []
    for _ in range(t):
        nxt = int(np.argmax(model.logits(toks)))
        toks.append(nxt)
        if nxt == 4:
            break
    assert list(g.tokens) == toks


def test_end_of_sequence_finishes_a_beam():
    # a model that puts almost all mass on EOS (id 2) after one token
    def model(prefixes):
        out = []
        for p in prefixes:
            out.append([0.0, 5.0, -5.0] if len(p) == 0 else [-5.0, -5.0, 8.0])
        return np.array(out)

    hyps = beam_search(model, num_beams=2, max_new_tokens=6, eos_token_id=2, num_return_sequences=2)
    assert hyps[0].tokens == (1, 2) and hyps[0].finished
    assert all(h.finished and h.tokens[-1] == 2 for h in hyps)
    assert all(2 not in h.tokens[:-1] for h in hyps)
    # several end tokens
    hyps = beam_search(model, num_beams=2, max_new_tokens=6, eos_token_id=[2, 0], num_return_sequences=2)
    assert hyps[0].tokens == (1, 2)


def test_length_penalty_changes_the_ranking():
    # EOS (2) now costs log(0.5); going on costs less per token but accumulates
    def model(prefixes):
        rows = []
        for p in prefixes:
            if len(p) == 0:
                rows.append(np.log([0.5, 1e-9, 0.5]))
            else:
                rows.append(np.log([0.8, 1e-9, 0.2]))
        return np.array(rows)

    short = beam_search(model, num_beams=4, max_new_tokens=5, eos_token_id=2, length_penalty=0.0)[0]
    assert short.tokens == (2,)  # log 0.5 beats anything longer
    long = beam_search(model, num_beams=4, max_new_tokens=5, eos_token_id=2, length_penalty=3.0)[0]
    assert len(long.tokens) > 1
    # score = log_prob / len ** lambda
    assert long.score == pytest.approx(long.log_prob / len(long.tokens) ** 3.0)


def test_num_return_sequences_and_order():
    model = TableModel(6, seed=3)
    hyps = beam_search(model, num_beams=5, max_new_tokens=4, eos_token_id=5, num_return_sequences=5)
    assert len(hyps) == 5
    scores = [h.score for h in hyps]
    assert scores == sorted(scores, reverse=True)
    assert len({h.tokens for h in hyps}) == 5


def test_bad_arguments_name_the_parameter():
    model = TableModel(3)
    for kw, name in [
        (dict(num_beams=0, max_new_tokens=2), "num_beams"),
        (dict(num_beams=2, max_new_tokens=0), "max_new_tokens"),
        (dict(num_beams=2, max_new_tokens=2, num_return_sequences=3), "num_return_sequences"),
        (dict(num_beams=2, max_new_tokens=2, length_penalty=float("nan")), "length_penalty"),
    ]:
        with pytest.raises(BeamSearchError) as info:
            beam_search(model, **kw)
        assert info.value.parameter == name and name in str(info.value)
    with pytest.raises(ShapeError):
        beam_search(lambda p: np.zeros((len(p) + 1, 3)), num_beams=1, max_new_tokens=1)
    with pytest.raises(ShapeError):
        beam_search(lambda p: np.full((len(p), 3), np.nan), num_beams=1, max_new_tokens=1)


def test_torch_logits_are_accepted():
    model = TableModel(4, seed=1)
    a = beam_search(model, num_beams=3, max_new_tokens=3, eos_token_id=3)
    b = beam_search(lambda p: torch.from_numpy(model(p)), num_beams=3, max_new_tokens=3, eos_token_id=3)
    assert a == b


# ----------------------------------------------------------------------------------------------------------------
# a tiny transformers model
# ----------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_lm():
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        vocab_size=5, n_positions=16, n_embd=16, n_layer=1, n_head=2, bos_token_id=0, eos_token_id=4
    )
    model = transformers.GPT2LMHeadModel(config).eval()
    with torch.no_grad():  # spread the logits so the ranking is clear
        model.lm_head.weight.mul_(20.0)
    return model


def test_tiny_transformers_model_full_beam_equals_exhaustive(tiny_lm):
    V, t = 5, 3
    fn = model_next_logits(tiny_lm)

    def one(prefix):
        with torch.no_grad():
            return tiny_lm(input_ids=torch.tensor([prefix])).logits[0, -1].double().numpy()

    expected = exhaustive(one, [0], V, t, {4}, 1.0)
    hyps = beam_search(tiny_lm, [0], num_beams=V**t, max_new_tokens=t, eos_token_id=4, num_return_sequences=10)
    assert len(hyps) == 10
    for h, e in zip(hyps, expected):
        assert h.tokens == e[1]
        assert h.score == pytest.approx(e[0], abs=1e-4)  # float32 model
    # the wrapper pads ragged prefixes on the left
    ragged = fn([[0, 1, 2], [0]])
    np.testing.assert_allclose(ragged[1], one([0]), atol=1e-4)
    np.testing.assert_allclose(ragged[0], one([0, 1, 2]), atol=1e-4)
    with pytest.raises(ShapeError):
        beam_search(tiny_lm, [], num_beams=2, max_new_tokens=2)


# ----------------------------------------------------------------------------------------------------------------
# structures
# ----------------------------------------------------------------------------------------------------------------


TOKENS = [b"a", b"b", b"ab", b"ba", b"0", b"1", b"01", b"x", b"aa", b"-"]
EOS = len(TOKENS)


@pytest.mark.parametrize("pattern", [r"(ab|ba)+0", r"a*b?[01]{2}", r"(a|b)(0|1)-(ab)?", r"x|aab|ba01"])
@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_constrained_beam_never_leaves_the_structure(pattern, seed):
    vocab = Vocabulary.from_token_bytes(TOKENS, eos_ids=[EOS])
    structure = compile_regex(pattern, vocab)
    model = TableModel(EOS + 1, seed, scale=4.0)  # the model ignores the structure entirely
    hyps = beam_search(model, num_beams=6, max_new_tokens=8, structure=structure, num_return_sequences=6)
    assert hyps
    for h in hyps:
        m = structure.matcher()
        m.advance(list(h.tokens))  # raises if any token left the structure
        body = h.tokens[:-1] if h.finished else h.tokens
        text = b"".join(TOKENS[t] for t in body).decode()
        assert re.fullmatch(pattern, text), (pattern, text)
        assert m.is_accepting()
        if h.finished:
            assert h.tokens[-1] == EOS and m.is_finished()


@pytest.mark.parametrize("seed", [0, 1])
def test_constrained_full_beam_equals_exhaustive_masked_search(seed):
    vocab = Vocabulary.from_token_bytes(TOKENS, eos_ids=[EOS])
    pattern = r"(a|ab|b)(0|1)?"
    structure = compile_regex(pattern, vocab)
    V, t = EOS + 1, 3
    model = TableModel(V, seed, scale=3.0)

    def allowed_fn(tokens):
        m = structure.matcher()
        m.advance(list(tokens))
        mask = np.zeros(V, dtype=bool)
        mask[m.allowed_tokens()] = True
        return mask

    def accepting(tokens):
        m = structure.matcher()
        m.advance(list(tokens))
        return m.is_accepting()

    # finished hypotheses, and (as beam_search returns by default with a structure) sequences alive at the length
    # limit whose text is already a complete match
    expected = [e for e in exhaustive(model.logits, [], V, t, {EOS}, 1.0, allowed_fn) if e[3] or accepting(e[1])]
    assert any(not e[3] for e in expected[:10]) and any(e[3] for e in expected[:10])
    hyps = beam_search(
        model, num_beams=V**t, max_new_tokens=t, structure=structure, num_return_sequences=min(len(expected), 10)
    )
    assert_same(hyps, expected[: len(hyps)])


def test_dead_end_beam_is_dropped():
    # "a" is a valid start of "ab" but no token reads a lone "b": after "a" the beam is at a dead end
    vocab = Vocabulary.from_token_bytes([b"a", b"ab", b"x"], eos_ids=[3])
    structure = compile_regex("ab", vocab)

    def model(prefixes):  # strongly prefers "a"
        return np.array([[5.0, 0.0, 9.0, 0.0]] * len(prefixes))

    hyps = beam_search(model, num_beams=2, max_new_tokens=4, structure=structure, num_return_sequences=1)
    assert hyps[0].tokens == (1, 3) and hyps[0].finished
    with pytest.raises(DeadEndError):  # a single beam takes "a" and dies
        beam_search(model, num_beams=1, max_new_tokens=4, structure=structure)


def test_each_beam_carries_its_own_matcher_and_the_start_state_is_respected():
    vocab = Vocabulary.from_token_bytes(TOKENS, eos_ids=[EOS])
    structure = compile_regex(r"(ab|ba)+0", vocab)
    start = structure.matcher()
    start.advance(2)  # "ab" already read
    model = TableModel(EOS + 1, 4, scale=4.0)
    hyps = beam_search(model, num_beams=4, max_new_tokens=6, structure=start, num_return_sequences=4)
    assert start.num_tokens == 1  # the caller's matcher is untouched
    for h in hyps:
        m = start.copy()
        m.advance(list(h.tokens))
        assert m.is_accepting()
    # a factory works too
    hyps2 = beam_search(model, num_beams=4, max_new_tokens=6, structure=structure.matcher, num_return_sequences=4)
    assert all(structure.matcher().validate_tokens(list(h.tokens)) == len(h.tokens) for h in hyps2)


# ----------------------------------------------------------------------------------------------------------------
# diverse beam search
# ----------------------------------------------------------------------------------------------------------------

#: Logits of the next token by the last token read (None: the first step); no end token. Token 0 leads token 1 by
#: 1.0 at the first step; after 0, token 1 leads token 2 by 0.5.
DIVERSE = {None: [3.0, 2.0, 0.0], 0: [0.0, 3.0, 2.5], 1: [3.0, 0.0, 1.0], 2: [1.0, 1.0, 3.0]}


def diverse_model(prefixes):
    return np.array([DIVERSE[p[-1] if p else None] for p in prefixes])


def diverse_log_prob(tokens) -> float:
    last, total = None, 0.0
    for t in tokens:
        total += log_softmax(np.array(DIVERSE[last]))[t]
        last = t
    return float(total)


@pytest.mark.parametrize(
    ("groups", "penalty", "expected"),
    [
        # one beam a group. lambda 0.3: group 1 follows group 0 (the gaps, 1.0 then 0.5, exceed it): one distinct
        (2, 0.3, [(0, 1)]),
        # lambda 0.7: the same first token (gap 1.0), then token 1 (chosen by group 0) drops below token 2
        (2, 0.7, [(0, 1), (0, 2)]),
        # lambda 1.5: token 0 drops below token 1 at once; then group 0's token 1 is penalised, token 0 leads anyway
        (2, 1.5, [(0, 1), (1, 0)]),
        # three groups at 0.7: group 2 sees token 0 chosen twice (1.4 > 1.0) and takes 1; then 1 and 2 were chosen
        (3, 0.7, [(0, 1), (1, 0), (0, 2)]),
    ],
)
def test_diverse_groups_by_hand(groups, penalty, expected):
    hyps = beam_search(
        diverse_model, num_beams=groups, num_beam_groups=groups, diversity_penalty=penalty, max_new_tokens=2,
        length_penalty=0.0, num_return_sequences=groups,
    )  # fmt: skip
    expected = sorted(expected, key=lambda t: (-diverse_log_prob(t), t))
    assert [h.tokens for h in hyps] == expected
    for h in hyps:  # the penalty steers the choice; the scores stay the model's log-probabilities
        assert h.log_prob == pytest.approx(diverse_log_prob(h.tokens), abs=1e-12) and h.score == h.log_prob


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_one_group_is_beam_search_whatever_the_penalty(seed):
    model = TableModel(6, seed, scale=3.0)
    plain = beam_search(model, num_beams=4, max_new_tokens=5, eos_token_id=5, num_return_sequences=4)
    grouped = beam_search(
        model, num_beams=4, max_new_tokens=5, eos_token_id=5, num_return_sequences=4, num_beam_groups=1,
        diversity_penalty=3.0,
    )  # fmt: skip
    assert grouped == plain


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("groups", [2, 3])
def test_no_penalty_makes_each_group_a_beam_search_of_its_size(seed, groups):
    """With lambda = 0 every group is the same independent search of num_beams / G beams: the distinct
    hypotheses are that search's."""
    vocab = Vocabulary.from_token_bytes(TOKENS, eos_ids=[EOS])
    structure = compile_regex(r"(ab|ba|a)+[01]{1,2}", vocab)
    model = TableModel(EOS + 1, seed, scale=3.0)
    small = beam_search(model, num_beams=2, max_new_tokens=6, structure=structure, num_return_sequences=2)
    grouped = beam_search(
        model, num_beams=2 * groups, num_beam_groups=groups, max_new_tokens=6, structure=structure,
        num_return_sequences=2,
    )  # fmt: skip
    assert grouped == small


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_diverse_hypotheses_stay_in_the_structure_and_are_distinct(seed):
    pattern = r"(ab|ba)+[01]|a*b?[01]{2}"
    vocab = Vocabulary.from_token_bytes(TOKENS, eos_ids=[EOS])
    structure = compile_regex(pattern, vocab)
    model = TableModel(EOS + 1, seed, scale=4.0)
    hyps = beam_search(
        model, num_beams=6, num_beam_groups=3, diversity_penalty=2.0, max_new_tokens=8, structure=structure,
        num_return_sequences=6,
    )  # fmt: skip
    assert hyps and len({h.tokens for h in hyps}) == len(hyps)
    for h in hyps:
        body = h.tokens[:-1] if h.finished else h.tokens
        assert re.fullmatch(pattern, b"".join(TOKENS[t] for t in body).decode())
        assert structure.matcher().validate_tokens(list(h.tokens)) == len(h.tokens)


def test_bad_group_arguments_name_the_parameter():
    model = TableModel(4)
    for groups in (0, 3, True, 2.0):
        with pytest.raises(BeamSearchError, match="num_beam_groups"):
            beam_search(model, num_beams=4, max_new_tokens=2, num_beam_groups=groups)
    for penalty in (-1.0, math.inf, math.nan, True, "1"):
        with pytest.raises(BeamSearchError, match="diversity_penalty"):
            beam_search(model, num_beams=4, max_new_tokens=2, num_beam_groups=2, diversity_penalty=penalty)
