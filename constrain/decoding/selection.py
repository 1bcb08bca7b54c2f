"""Choosing one output among n sampled candidates: best-of-n, self-consistency and minimum Bayes risk (MBR).

Sampling n outputs under a structure and choosing among them trades n times the tokens for a better answer than a
single sample (and often than greedy decoding). The functions here are the choice alone, on :class:`Candidate`
objects (text, value, tokens, per-token log-probabilities), so they apply to candidates from any source;
:meth:`constrain.LLM.best_of`, :meth:`~constrain.LLM.self_consistency` and :meth:`~constrain.LLM.mbr` sample the
candidates (one batch, per-row seeds from :func:`row_seeds`) and call them.

- :func:`best_of`: the candidate with the highest score: the sum of its tokens' log-probabilities, their mean
  (length-normalised), or a function of the candidate.
- :func:`self_consistency`: the most frequent value, compared as canonical JSON (keys sorted); or, for JSON
  objects, each field's most frequent value, nested objects field by field at every depth. A combination that the
  type refuses falls back to the most frequent whole value.
- :func:`mbr`: the candidate with the highest expected utility against the others, ``sum_j w_j U(c, c_j) / sum_j
  w_j`` over the other candidates ``j``; ``n (n - 1)`` utility calls (half of that for the symmetric built-ins),
  so at most :data:`MAX_MBR_CANDIDATES` candidates.

Every method breaks a tie the same way (scores within :data:`TIE_TOLERANCE`): the candidate with the higher
log-probability wins, then the earlier one.
Candidates with ``excluded`` set (cut by ``max_new_tokens``, or refused by a validator the structure cannot
express) take no part: they get no score and no vote.
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal

import numpy as np
import pydantic_core

from constrain.errors import ArgumentError

__all__ = [
    "MAX_MBR_CANDIDATES",
    "MISSING",
    "TIE_TOLERANCE",
    "UTILITIES",
    "Candidate",
    "FieldVote",
    "Selection",
    "best_of",
    "canonical_json",
    "edit_similarity",
    "exact_match",
    "field_agreement",
    "mbr",
    "row_seeds",
    "self_consistency",
    "token_f1",
]

#: Scores this close to the best (relative to it, or absolute below 1) tie: the same expected utility summed in
#: another order differs in its last bits.
TIE_TOLERANCE = 1e-9
#: Most candidates :func:`mbr` takes: its pairwise utility matrix grows as n squared.
MAX_MBR_CANDIDATES = 64

Score = Literal["sum", "mean"] | Callable[["Candidate"], float]
Utility = Literal["exact", "f1", "edit", "fields"] | Callable[["Candidate", "Candidate"], float]
Weights = Literal["uniform", "probability"]


class _Missing:
    """The value of a field a candidate does not have (it can win a field's vote: the field is then left out)."""

    def __repr__(self) -> str:
        return "MISSING"


MISSING: Any = _Missing()
_PLAIN: Any = _Missing()  # the default of Candidate.data: the value as plain JSON data


@dataclass(frozen=True)
class Candidate:
    """One sampled output. ``data``: the value as plain JSON data, what votes and utilities compare (by default
    the value through :func:`pydantic_core.to_jsonable_python`; :class:`constrain.LLM` reads it from the JSON
    text, so field aliases stay as written). ``logprobs``: one per token, under the structure (a forced token's is
    0.0). ``excluded``: why the candidate takes no part, or None: ``"length"`` (``max_new_tokens`` ran out before
    the structure was complete), ``"invalid"`` (a validator the structure cannot express refused the value)."""

    text: str
    value: Any
    tokens: tuple[int, ...] = ()
    logprobs: tuple[float, ...] = ()
    data: Any = _PLAIN
    excluded: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "tokens", tuple(self.tokens))
        object.__setattr__(self, "logprobs", tuple(float(x) for x in self.logprobs))
        if self.data is _PLAIN:
            object.__setattr__(self, "data", pydantic_core.to_jsonable_python(self.value))

    @property
    def logprob(self) -> float:
        """The sum of the tokens' log-probabilities: the output's log-probability under the structure."""
        return math.fsum(self.logprobs)

    @property
    def mean_logprob(self) -> float:
        """The log-probability per token (every generated token counts, forced ones included); 0.0 when empty."""
        return self.logprob / len(self.logprobs) if self.logprobs else 0.0


@dataclass(frozen=True)
class FieldVote:
    """The vote on one field of a field-wise :func:`self_consistency`: the winning value (:data:`MISSING` when
    most candidates lack the field), its votes and the candidates that voted."""

    value: Any
    votes: int
    total: int

    @property
    def confidence(self) -> float:
        return self.votes / self.total


@dataclass(frozen=True)
class Selection:
    """What a method chose among ``candidates``.

    ``index``: the chosen candidate (for :func:`self_consistency`, the one holding the most frequent whole value);
    ``value``: the chosen value (field-wise, possibly a combination no candidate holds: ``combined``).
    ``scores``: per candidate what the method ranks by (best-of score, votes for its whole value, expected
    utility), None for an excluded one. ``confidence``: self-consistency's share of votes of the winning whole
    value; ``votes``: its counts per canonical JSON value, most first; ``fields``: the vote on each field (a
    path of keys), field-wise only."""

    method: str
    index: int
    value: Any
    candidates: list[Candidate] = field(repr=False)
    scores: list[float | None]
    confidence: float | None = None
    votes: dict[str, int] | None = None
    fields: dict[tuple[str, ...], FieldVote] | None = None
    combined: bool = False

    @property
    def candidate(self) -> Candidate:
        return self.candidates[self.index]


# -- seeds ------------------------------------------------------------------------------------------------------


def row_seeds(seed: int | None, n: int) -> list[int]:
    """``n`` independent seeds derived from ``seed`` (numpy's ``SeedSequence.spawn``), one per sampled row, so
    that candidate ``i`` is what one generation with seed ``row_seeds(seed, n)[i]`` gives; fresh ones for None.
    The first ``k`` seeds do not depend on ``n``."""
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0):
        raise ArgumentError("seed", seed, "None or an int >= 0")
    _check_count(n)
    return [int(child.generate_state(1, np.uint64)[0] >> 1) for child in np.random.SeedSequence(seed).spawn(n)]


# -- best-of-n --------------------------------------------------------------------------------------------------


def scorer(score: Score) -> Callable[[Candidate], float]:
    """The scoring function that ``score`` names (``"sum"``, ``"mean"``) or is; ArgumentError otherwise."""
    if score == "sum":
        return lambda c: c.logprob
    if score == "mean":
        return lambda c: c.mean_logprob
    if callable(score) and not isinstance(score, str):
        return score
    raise ArgumentError("score", score, "'sum', 'mean' or a function of a Candidate returning a float")


def best_of(candidates: Sequence[Candidate], score: Score = "mean") -> Selection:
    """The candidate with the highest score: ``"sum"`` of its log-probabilities (favours short outputs),
    ``"mean"`` per token (length-normalised), or ``score(candidate)`` (higher is better)."""
    score_of = scorer(score)
    pool = _pool(candidates)
    scores: list[float | None] = [None] * len(pool)
    for i in _included(pool):
        scores[i] = _number(score_of(pool[i]), "score")
    index = _arg_max(pool, scores)
    return Selection("best_of", index, pool[index].value, pool, scores)


# -- self-consistency -------------------------------------------------------------------------------------------


def canonical_json(data: Any) -> str:
    """``data`` as JSON with sorted keys and no spaces: equal values, equal texts (the key of a vote)."""
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def self_consistency(
    candidates: Sequence[Candidate],
    by: Literal["object", "field"] = "object",
    validate: Callable[[Any], Any] | None = None,
) -> Selection:
    """Majority vote over the candidates' values, ties to the higher log-probability.

    ``by="object"``: the most frequent whole value (compared as :func:`canonical_json` of ``data``).
    ``by="field"``: where every candidate's data is a JSON object, each key takes its most frequent value (a key
    some candidates lack votes :data:`MISSING` for them, and is left out when that wins); a key whose values are
    all objects is voted on field by field in turn, at any depth; arrays and scalars are voted on whole. The
    combination goes through ``validate`` (plain data -> the typed value, raising a ValueError such as
    :class:`~constrain.errors.OutputValidationError` or pydantic's ``ValidationError`` when refused; None: kept as
    plain data); a refused combination falls back to the most frequent whole value (``combined`` is then False).
    """
    if by not in ("object", "field"):
        raise ArgumentError("by", by, "'object' (whole values) or 'field' (each field of a JSON object)")
    if validate is not None and not callable(validate):
        raise ArgumentError("validate", validate, "None or a function from plain data to the typed value")
    pool = _pool(candidates)
    included = _included(pool)
    keys = {i: canonical_json(pool[i].data) for i in included}
    counts = Counter(keys.values())
    scores: list[float | None] = [float(counts[keys[i]]) if i in keys else None for i in range(len(pool))]
    index = _arg_max(pool, scores)
    votes = dict(sorted(counts.items(), key=lambda kv: -kv[1]))
    confidence = counts[keys[index]] / len(included)
    value, fields, combined = pool[index].value, None, False
    if by == "field":
        fields = {}
        data = _vote_fields([pool[i].data for i in included], [pool[i] for i in included], (), fields)
        if data != pool[index].data:
            try:
                value, combined = (validate(data) if validate is not None else data), True
            except ValueError:  # OutputValidationError, pydantic's ValidationError
                pass
    return Selection("self_consistency", index, value, pool, scores, confidence, votes, fields, combined)


def _vote_fields(
    values: list[Any], voters: list[Candidate], path: tuple[str, ...], fields: dict[tuple[str, ...], FieldVote]
) -> Any:
    """The field-wise majority of ``values`` (one per voter; :data:`MISSING` where a voter lacks the field)."""
    if all(isinstance(v, dict) for v in values):
        keys = list(dict.fromkeys(k for v in values for k in v))
        combined = {}
        for key in keys:
            winner = _vote_fields([v.get(key, MISSING) for v in values], voters, (*path, key), fields)
            if winner is not MISSING:
                combined[key] = winner
        return combined
    keys = ["\0missing" if v is MISSING else canonical_json(v) for v in values]
    counts = Counter(keys)
    best = max(range(len(values)), key=lambda i: (counts[keys[i]], voters[i].logprob, -i))
    fields[path] = FieldVote(values[best], counts[keys[best]], len(values))
    return values[best]


# -- minimum Bayes risk -----------------------------------------------------------------------------------------


def exact_match(a: Candidate, b: Candidate) -> float:
    """1.0 when the two values are equal (as canonical JSON), else 0.0."""
    return float(canonical_json(a.data) == canonical_json(b.data))


_WORD = re.compile(r"\w+|[^\w\s]")


def token_f1(a: Candidate, b: Candidate) -> float:
    """F1 of the two texts' words and punctuation marks as multisets (SQuAD's token F1): 1.0 for the same bag,
    0.0 for no overlap; 1.0 for two empty texts."""
    left, right = Counter(_WORD.findall(a.text)), Counter(_WORD.findall(b.text))
    if not left and not right:
        return 1.0
    common = sum((left & right).values())
    if common == 0:
        return 0.0
    precision, recall = common / sum(left.values()), common / sum(right.values())
    return 2 * precision * recall / (precision + recall)


def edit_similarity(a: Candidate, b: Candidate) -> float:
    """``1 - levenshtein(a.text, b.text) / max(len)`` over characters: 1.0 for equal texts, 0.0 for nothing in
    common at any position. O(len(a) len(b)), a numpy row at a time."""
    s, t = a.text, b.text
    longest = max(len(s), len(t))
    if longest == 0:
        return 1.0
    return 1.0 - _levenshtein(s, t) / longest


def _levenshtein(s: str, t: str) -> int:
    """The edit distance (insertions, deletions, substitutions of one character each)."""
    if len(s) < len(t):
        s, t = t, s
    if not t:
        return len(s)
    target = np.array([ord(ch) for ch in t])
    offsets = np.arange(len(t) + 1)
    row = offsets.copy()
    for k, ch in enumerate(s, 1):
        best = np.empty_like(row)
        best[0] = k
        best[1:] = np.minimum(row[1:] + 1, row[:-1] + (target != ord(ch)))  # deletion, substitution
        row = np.minimum.accumulate(best - offsets) + offsets  # insertion: min over k' <= j of best[k'] + j - k'
    return int(row[-1])


def field_agreement(a: Candidate, b: Candidate) -> float:
    """The share of leaf fields (paths through nested objects; arrays and scalars are leaves) that both values
    hold with equal values, over the leaves either holds. Values that are not objects: 1.0 when equal, else 0.0.
    """
    left, right = _leaves(a.data, ()), _leaves(b.data, ())
    paths = left.keys() | right.keys()
    same = sum(1 for p in paths if p in left and p in right and left[p] == right[p])
    return same / len(paths)


def _leaves(data: Any, path: tuple[str, ...]) -> dict[tuple[str, ...], str]:
    """Each leaf of ``data`` by path, as canonical JSON (an empty object is a leaf)."""
    if isinstance(data, dict) and data:
        leaves: dict[tuple[str, ...], str] = {}
        for key, value in data.items():
            leaves.update(_leaves(value, (*path, key)))
        return leaves
    return {path: canonical_json(data)}


#: The built-in utilities by name (each symmetric, so computed once per pair).
UTILITIES: Mapping[str, Callable[[Candidate, Candidate], float]] = MappingProxyType(
    {"exact": exact_match, "f1": token_f1, "edit": edit_similarity, "fields": field_agreement}
)


def utility_function(utility: Utility) -> Callable[[Candidate, Candidate], float]:
    """The utility that ``utility`` names (a key of :data:`UTILITIES`) or is; ArgumentError otherwise."""
    if isinstance(utility, str) and utility in UTILITIES:
        return UTILITIES[utility]
    if callable(utility) and not isinstance(utility, str):
        return utility
    names = ", ".join(repr(name) for name in UTILITIES)
    raise ArgumentError("utility", utility, f"one of {names}, or a function (a, b) -> float of two Candidates")


def check_mbr_size(n: int) -> None:
    """ArgumentError unless ``1 <= n <=`` :data:`MAX_MBR_CANDIDATES`."""
    _check_count(n)
    if n > MAX_MBR_CANDIDATES:
        raise ArgumentError(
            "n", n, f"at most {MAX_MBR_CANDIDATES} candidates for MBR (its utility matrix is n x n); sample fewer"
        )


def mbr(candidates: Sequence[Candidate], utility: Utility = "f1", weights: Weights = "uniform") -> Selection:
    """The candidate with the highest expected utility against the other candidates.

    ``utility(a, b)``: how good ``a`` is if ``b`` is right (higher is better): a name of :data:`UTILITIES` or a
    function of two :class:`Candidate`. ``weights``: ``"uniform"`` (each other candidate counts once: the Monte
    Carlo estimate when the candidates are samples, whose frequency already follows the model's probability) or
    ``"probability"`` (each weighs its sequence probability, renormalised over the others: for a set of distinct
    candidates, such as beams). A lone candidate has expected utility 0.0.
    """
    utility_of = utility_function(utility)
    if weights not in ("uniform", "probability"):
        raise ArgumentError("weights", weights, "'uniform' or 'probability'")
    pool = _pool(candidates)
    check_mbr_size(len(pool))
    included = _included(pool)
    symmetric = utility_of in UTILITIES.values()
    matrix = np.zeros((len(pool), len(pool)))
    for a, i in enumerate(included):
        for j in included[a + 1 :] if symmetric else included:
            if j != i:
                matrix[i, j] = _number(utility_of(pool[i], pool[j]), "utility")
                if symmetric:
                    matrix[j, i] = matrix[i, j]
    if weights == "uniform":
        w = np.ones(len(pool))
    else:
        top = max(pool[i].logprob for i in included)
        w = np.array([math.exp(c.logprob - top) if c.excluded is None else 0.0 for c in pool])
    scores: list[float | None] = [None] * len(pool)
    for i in included:
        others = [j for j in included if j != i]
        total = math.fsum(w[j] for j in others)
        scores[i] = math.fsum(w[j] * matrix[i, j] for j in others) / total if total > 0 else 0.0
    index = _arg_max(pool, scores)
    return Selection("mbr", index, pool[index].value, pool, scores)


# -- shared -----------------------------------------------------------------------------------------------------


def _check_count(n: Any) -> None:
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise ArgumentError("n", n, "an int >= 1: how many candidates to sample")


def _pool(candidates: Sequence[Candidate]) -> list[Candidate]:
    """The candidates as a list, checked: Candidates, at least one not excluded."""
    pool = list(candidates) if isinstance(candidates, Sequence) and not isinstance(candidates, str) else None
    if not pool or not all(isinstance(c, Candidate) for c in pool):
        raise ArgumentError("candidates", candidates, "a non-empty sequence of Candidate")
    if all(c.excluded is not None for c in pool):
        raise ArgumentError("candidates", f"{len(pool)} excluded", "at least one candidate that is not excluded")
    return pool


def _included(pool: list[Candidate]) -> list[int]:
    return [i for i, c in enumerate(pool) if c.excluded is None]


def _number(x: Any, what: str) -> float:
    """``x`` as a float; ArgumentError for what is not a real number, or NaN."""
    if isinstance(x, bool) or not isinstance(x, (int, float, np.integer, np.floating)) or math.isnan(x):
        raise ArgumentError(what, x, f"the {what} function must return a real number (not NaN)")
    return float(x)


def _arg_max(pool: list[Candidate], scores: list[float | None]) -> int:
    """The highest score; a tie (within :data:`TIE_TOLERANCE`) to the higher log-probability, then the earlier
    candidate."""
    included = [i for i, s in enumerate(scores) if s is not None]
    best = max(scores[i] for i in included)
    tied = [i for i in included if scores[i] >= best - TIE_TOLERANCE * max(1.0, abs(best))]
    return max(tied, key=lambda i: (pool[i].logprob, -i))
