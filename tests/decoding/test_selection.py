"""Choosing among candidates: best-of-n, self-consistency and MBR against brute force over enumerated candidate
sets, the tie rule, each utility on hand-computed examples, and bad arguments."""

from __future__ import annotations

import itertools
import math
import random

import pytest

from constrain.decoding.selection import (
    MAX_MBR_CANDIDATES,
    MISSING,
    TIE_TOLERANCE,
    Candidate,
    best_of,
    canonical_json,
    edit_similarity,
    exact_match,
    field_agreement,
    mbr,
    row_seeds,
    self_consistency,
    token_f1,
)
from constrain.errors import ArgumentError, OutputValidationError


def cand(text: str, *logprobs: float, data=None, excluded: str | None = None) -> Candidate:
    """A candidate whose value is ``data`` (the text when None), with one token per log-probability."""
    value = text if data is None else data
    return Candidate(text, value, tuple(range(len(logprobs))), logprobs, excluded=excluded)


# -- best-of-n --------------------------------------------------------------------------------------------------


def test_sum_and_mean_rank_differently_and_each_picks_its_arg_max():
    long_likely = cand("aa", -1.0, -1.0)  # sum -2.0, mean -1.0
    short = cand("b", -1.5)  # sum -1.5, mean -1.5
    pool = [long_likely, short]
    assert best_of(pool, "sum").index == 1
    assert best_of(pool, "mean").index == 0
    assert best_of(pool, "sum").scores == [-2.0, -1.5]
    assert best_of(pool, "mean").scores == [-1.0, -1.5]
    assert best_of(pool, lambda c: len(c.text)).value == "aa"


def test_best_of_equals_brute_force_over_enumerated_sets():
    pool = [cand("a", -0.5), cand("bb", -0.2, -0.9), cand("ccc", -1.0, 0.0, 0.0), cand("d", -3.0)]
    scorers = {"sum": lambda c: sum(c.logprobs), "mean": lambda c: sum(c.logprobs) / len(c.logprobs)}
    for size in (1, 2, 3, 4):
        for chosen in itertools.product(pool, repeat=size):
            for name, brute_score in scorers.items():
                best = max(brute_score(c) for c in chosen)
                # the tie rule: the highest log-probability among the best, then the first of those
                tied = [i for i, c in enumerate(chosen) if brute_score(c) == best]
                top = max(sum(chosen[i].logprobs) for i in tied)
                expected = next(i for i in tied if sum(chosen[i].logprobs) == top)
                assert best_of(list(chosen), name).index == expected


def test_a_tie_goes_to_the_higher_log_probability_then_to_the_first():
    pool = [cand("x", -2.0), cand("y", -1.0), cand("z", -1.0)]
    assert best_of(pool, lambda c: 0.0).index == 1
    assert best_of([cand("x", -1.0), cand("y", -1.0)], lambda c: 1.0).index == 0


def test_excluded_candidates_get_no_score_and_never_win():
    pool = [cand("cut", 0.0, excluded="length"), cand("ok", -5.0), cand("bad", 0.0, excluded="invalid")]
    chosen = best_of(pool, "sum")
    assert chosen.index == 1 and chosen.scores == [None, -5.0, None]
    assert chosen.candidate is pool[1] and chosen.candidates == pool


# -- self-consistency -------------------------------------------------------------------------------------------


def brute_majority(chosen: list[Candidate]) -> int:
    """The candidate holding the most frequent value: sort by (-count, -log-probability, position)."""
    counted = []
    for i, c in enumerate(chosen):
        count = sum(1 for other in chosen if canonical_json(other.data) == canonical_json(c.data))
        counted.append((-count, -c.logprob, i))
    return sorted(counted)[0][2]


def test_whole_object_votes_equal_brute_force_over_enumerated_sets():
    pool = [
        cand('{"a":1}', -1.0, data={"a": 1}),
        cand('{"a": 1}', -2.0, data={"a": 1}),  # another text, the same value
        cand('{"a":2}', -0.5, data={"a": 2}),
        cand('{"a":3}', -0.7, data={"a": 3}),
    ]
    for chosen in itertools.product(pool, repeat=4):
        result = self_consistency(list(chosen))
        expected = brute_majority(list(chosen))
        assert result.index == expected
        winner = canonical_json(chosen[expected].data)
        votes = sum(1 for c in chosen if canonical_json(c.data) == winner)
        assert result.confidence == votes / 4 and result.votes[winner] == votes
        assert sum(result.votes.values()) == 4 and not result.combined


def test_field_wise_votes_equal_brute_force_per_field():
    names, ages = ["Ada", "Alan"], [36, 41]
    records = [
        cand(f"r{k}", -0.1 * (k + 1), data={"name": n, "age": a})
        for k, (n, a) in enumerate(itertools.product(names, ages))
    ]
    for chosen in itertools.product(records, repeat=3):
        result = self_consistency(list(chosen), by="field")
        for key in ("name", "age"):
            per_field = [cand("", *c.logprobs, data=c.data[key]) for c in chosen]
            expected = chosen[brute_majority(per_field)].data[key]
            assert result.fields[(key,)].value == expected
            assert result.fields[(key,)].votes == sum(1 for c in chosen if c.data[key] == expected)
        combined = {"name": result.fields[("name",)].value, "age": result.fields[("age",)].value}
        assert result.value == combined
        assert result.combined == (combined != chosen[result.index].data)


def test_field_wise_recurses_into_objects_and_a_missing_field_can_win():
    a = cand("a", -1.0, data={"who": {"first": "Ada", "last": "Byron"}, "note": "x"})
    b = cand("b", -2.0, data={"who": {"first": "Ada", "last": "King"}})
    c = cand("c", -3.0, data={"who": {"first": "Eve", "last": "King"}})
    result = self_consistency([a, b, c], by="field")
    assert result.value == {"who": {"first": "Ada", "last": "King"}}  # "note": MISSING 2 votes to 1
    assert result.combined and result.index == 0  # every whole value once: the most likely holds the vote
    assert result.fields[("who", "first")].votes == 2 and result.fields[("who", "last")].confidence == 2 / 3
    assert result.fields[("note",)].value is MISSING
    assert result.confidence == 1 / 3


def test_a_combination_the_type_refuses_falls_back_to_the_whole_value_winner():
    pool = [
        cand("a", -1.0, data={"x": 1, "y": 1}),
        cand("b", -2.0, data={"x": 2, "y": 2}),
        cand("c", -3.0, data={"x": 2, "y": 3}),
        cand("d", -4.0, data={"x": 9, "y": 1}),
    ]  # x: 2 wins (b, c); y: 1 wins (a, d); no candidate holds {"x": 2, "y": 1}
    seen = []

    def refuse(data):
        seen.append(data)
        raise OutputValidationError("x must equal y", canonical_json(data))

    refused = self_consistency(pool, by="field", validate=refuse)
    assert seen == [{"x": 2, "y": 1}]
    assert not refused.combined and refused.index == 0 and refused.value == {"x": 1, "y": 1}
    assert refused.fields[("x",)].value == 2 and refused.fields[("y",)].value == 1  # the votes are still reported
    accepted = self_consistency(pool, by="field", validate=lambda data: ("typed", data))
    assert accepted.combined and accepted.value == ("typed", {"x": 2, "y": 1}) and accepted.index == 0


def test_non_object_values_vote_whole_under_field():
    pool = [cand("1", -1.0, data=1), cand("2", -0.5, data=2), cand("2", -0.9, data=2)]
    result = self_consistency(pool, by="field")
    assert result.value == 2 and result.index == 1 and not result.combined and result.fields[()].votes == 2


# -- MBR --------------------------------------------------------------------------------------------------------


def brute_mbr(chosen: list[Candidate], utility, probability: bool) -> list[float]:
    """Each candidate's expected utility against the others, from the definition."""
    weight = [math.exp(c.logprob) if probability else 1.0 for c in chosen]
    expected = []
    for i, c in enumerate(chosen):
        others = [j for j in range(len(chosen)) if j != i]
        total = sum(weight[j] for j in others)
        expected.append(sum(weight[j] * utility(c, chosen[j]) for j in others) / total if others else 0.0)
    return expected


def asymmetric(a: Candidate, b: Candidate) -> float:
    """A user utility that is not symmetric: how much of b's text a covers."""
    return len(set(a.text) & set(b.text)) / len(set(b.text))


@pytest.mark.parametrize("weights", ["uniform", "probability"])
@pytest.mark.parametrize("utility", ["exact", "f1", "edit", asymmetric])
def test_mbr_equals_brute_force_over_enumerated_sets(utility, weights):
    pool = [cand("the cat", -0.4), cand("the cat sat", -1.1, -0.3), cand("a dog", -0.9), cand("cat", -2.0)]
    function = {"exact": exact_match, "f1": token_f1, "edit": edit_similarity}.get(utility, utility)
    for size in (1, 2, 3):
        for chosen in itertools.product(pool, repeat=size):
            result = mbr(list(chosen), utility, weights)
            expected = brute_mbr(list(chosen), function, weights == "probability")
            assert result.scores == pytest.approx(expected, abs=1e-12)
            best = max(expected)
            tied = [i for i, e in enumerate(expected) if e >= best - TIE_TOLERANCE * max(1.0, abs(best))]
            top = max(chosen[i].logprob for i in tied)
            assert result.index == next(i for i in tied if chosen[i].logprob == top)


def test_mbr_picks_the_consensus_and_probability_weights_favour_agreeing_with_the_likely():
    pool = [cand("Paris", -0.1), cand("Lyon", -2.0), cand("Lyon", -2.5), cand("Lyon.", -3.0)]
    assert mbr(pool, "exact").value == "Lyon" and mbr(pool, "exact").scores == [0.0, 1 / 3, 1 / 3, 0.0]
    # Y and Y agree with each other, X half agrees with the far likelier P
    pool = [cand("a b", -0.1), cand("a c", -3.0), cand("d e", -3.0), cand("d e", -3.0)]
    assert mbr(pool, "f1").index == 2
    weighted = mbr(pool, "f1", "probability")
    assert weighted.index == 1
    p, q = math.exp(-0.1), math.exp(-3.0)
    assert weighted.scores[1] == pytest.approx(0.5 * p / (p + 2 * q))
    assert mbr(pool[:1], "f1").scores == [0.0]


# -- utilities --------------------------------------------------------------------------------------------------


def test_utilities_on_hand_computed_examples():
    assert exact_match(cand('{"a": 1}', data={"a": 1}), cand('{"a":1}', data={"a": 1})) == 1.0
    assert exact_match(cand("a"), cand("b")) == 0.0
    # "the cat sat" vs "the cat": 2 words in common, precision 2/3, recall 1: F1 0.8
    assert token_f1(cand("the cat sat"), cand("the cat")) == pytest.approx(0.8)
    assert token_f1(cand("a a b"), cand("a b b")) == pytest.approx(2 / 3)  # multisets: a, b in common
    assert token_f1(cand('{"x":1}'), cand('{"x":1}')) == 1.0 and token_f1(cand("a"), cand("b")) == 0.0
    assert token_f1(cand(""), cand("")) == 1.0 and token_f1(cand(""), cand("a")) == 0.0
    assert edit_similarity(cand("kitten"), cand("sitting")) == pytest.approx(1 - 3 / 7)
    assert edit_similarity(cand("flaw"), cand("lawn")) == pytest.approx(1 - 2 / 4)
    assert edit_similarity(cand(""), cand("")) == 1.0 and edit_similarity(cand(""), cand("abc")) == 0.0
    left = cand("l", data={"a": 1, "b": {"c": 2, "d": 3}})
    right = cand("r", data={"a": 1, "b": {"c": 2, "d": 4}, "e": 5})
    assert field_agreement(left, right) == 0.5  # a and b.c agree, of a, b.c, b.d, e
    assert field_agreement(cand("x", data=[1, 2]), cand("y", data=[1, 2])) == 1.0
    assert field_agreement(cand("x", data={}), cand("y", data={"a": 1})) == 0.0


def levenshtein(s: str, t: str) -> int:
    """The textbook dynamic program, a cell at a time."""
    previous = list(range(len(t) + 1))
    for i, a in enumerate(s, 1):
        current = [i]
        for j, b in enumerate(t, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (a != b)))
        previous = current
    return previous[-1]


def test_edit_similarity_equals_the_textbook_distance_on_random_strings():
    rng = random.Random(0)
    for _ in range(300):
        s = "".join(rng.choice("abc") for _ in range(rng.randrange(0, 12)))
        t = "".join(rng.choice("abc") for _ in range(rng.randrange(0, 12)))
        expected = 1.0 - levenshtein(s, t) / max(len(s), len(t)) if s or t else 1.0
        assert edit_similarity(cand(s), cand(t)) == pytest.approx(expected)


# -- seeds and bad arguments ------------------------------------------------------------------------------------


def test_row_seeds_are_reproducible_distinct_and_prefix_stable():
    seeds = row_seeds(7, 8)
    assert seeds == row_seeds(7, 8) and len(set(seeds)) == 8 and all(0 <= s < 2**63 for s in seeds)
    assert row_seeds(7, 3) == seeds[:3] and row_seeds(8, 8) != seeds
    assert row_seeds(None, 2) != row_seeds(None, 2)


def test_bad_arguments_raise_argument_errors():
    pool = [cand("a", -1.0), cand("b", -2.0)]
    cases = [
        (lambda: best_of(pool, "max"), "score"),
        (lambda: best_of(pool, lambda c: "high"), "score"),
        (lambda: best_of(pool, lambda c: math.nan), "score"),
        (lambda: best_of([], "sum"), "candidates"),
        (lambda: best_of(["a"], "sum"), "candidates"),
        (lambda: best_of([cand("a", excluded="length")], "sum"), "candidates"),
        (lambda: self_consistency(pool, by="token"), "by"),
        (lambda: self_consistency(pool, validate="yes"), "validate"),
        (lambda: mbr(pool, "bleu"), "utility"),
        (lambda: mbr(pool, "f1", "softmax"), "weights"),
        (lambda: mbr(pool, lambda a, b: None), "utility"),
        (lambda: mbr([cand("a", -1.0)] * (MAX_MBR_CANDIDATES + 1)), "n"),
        (lambda: row_seeds(-1, 2), "seed"),
        (lambda: row_seeds(1, 0), "n"),
        (lambda: row_seeds(1, True), "n"),
    ]
    for call, parameter in cases:
        with pytest.raises(ArgumentError) as raised:
            call()
        assert raised.value.parameter == parameter
