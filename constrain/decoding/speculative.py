"""Speculative decoding under a structure: drafts, the exact acceptance rule, statistics and the speed-up model.

A round of :class:`~constrain.decoding.loop.Decoding` with a :class:`Speculation`:

1. a :class:`DraftSource` proposes up to ``k`` tokens (:class:`Draft`, with the draft distribution ``q`` of each
   when it sampled them, or none when it proposed them outright: ``q = 1`` on the token);
2. the drafts are walked through the matcher and cut at the first one the structure rejects (a draft rejected at
   its first token costs that one mask check, no target pass);
3. one target pass reads the new tokens and the drafts and gives the target's logits at every draft position and
   after the last one;
4. :func:`accept` keeps draft ``x`` with probability ``min(1, p(x) / q(x))``, ``p`` and ``q`` both under the same
   mask and the same sampling transforms; on a rejection it draws from ``normalise(max(0, p - q))`` and stops; when
   every draft is kept it draws a bonus token from ``p`` after the last. The tokens come out distributed exactly as
   constrained sampling from the target alone; under greedy decoding they are the same tokens;
5. the model's cache and the matcher keep the accepted prefix only.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np

from constrain.decoding.params import SamplingParams
from constrain.decoding.sampling import next_token_probs, sample_from_probs
from constrain.errors import ArgumentError, DeadEndError
from constrain.kernels.bitmask import allocate_token_bitmask
from constrain.runtime.matcher import Matcher


@dataclass
class Draft:
    """Tokens a source proposes, and, for a source that sampled them, each one's draft distribution ``q``.

    ``probs``: ``(len(tokens), width)``, row ``j`` the distribution token ``j`` was drawn from (under the mask and
    the sampling transforms: :meth:`DraftContext.probs` gives it); None when the tokens were proposed outright.
    """

    tokens: list[int]
    probs: np.ndarray | None = None


class DraftContext:
    """What a :class:`DraftSource` sees when asked for drafts: the sequence so far, the structure there, and the
    target's sampling pipeline (so that a sampling source draws from ``q`` under the same mask and transforms)."""

    def __init__(
        self,
        tokens: Sequence[int],
        prompt_length: int,
        matcher: Matcher | None,
        k: int,
        params: SamplingParams,
        width: int,
        rng: np.random.Generator,
    ):
        #: Prompt and generated tokens, in order: what the target will have read before the first draft.
        self.tokens = tokens
        self.prompt_length = prompt_length
        #: A copy of the row's matcher at the first draft position (None for free text); the source may move it.
        self.matcher = matcher
        #: Most drafts wanted.
        self.k = k
        self.params = params
        self.width = width
        self.rng = rng
        self._bitmask = allocate_token_bitmask(1, width) if matcher is not None else None

    @property
    def generated(self) -> Sequence[int]:
        return self.tokens[self.prompt_length :]

    def probs(self, logits: Any, matcher: Matcher | None = None, drafted: Sequence[int] = ()) -> np.ndarray:
        """The sampling distribution of one row of draft ``logits`` (``(width,)``) under ``matcher``'s mask (default:
        this context's matcher) and the target's transforms; ``drafted``: the drafts before this position (the
        penalties count them)."""
        mask = None
        matcher = matcher if matcher is not None else self.matcher
        if matcher is not None:
            matcher.fill_bitmask(self._bitmask, 0)
            mask = self._bitmask
        history = [np.asarray([*self.generated, *drafted], dtype=np.int64)]
        row = logits.reshape(1, -1) if hasattr(logits, "reshape") else np.asarray(logits).reshape(1, -1)
        out = next_token_probs(row, self.params, history=history, mask=mask)
        out = out.detach().cpu().numpy() if hasattr(out, "detach") else np.asarray(out)
        return out[0].astype(np.float64)

    def draw(self, probs: np.ndarray) -> int:
        """One token from ``probs`` with this context's random numbers."""
        return int(sample_from_probs(probs, self.rng))


@runtime_checkable
class DraftSource(Protocol):
    """Proposes draft tokens for one sequence. Sources may keep state between rounds (a draft model's cache);
    one that wants the target's verdict defines ``observe(drafts, accepted, logits)``, called after each round
    with the target's logits at every verified position."""

    def propose(self, context: DraftContext) -> Draft: ...


@dataclass(frozen=True)
class Speculation:
    """Speculative decoding for :class:`~constrain.decoding.loop.Decoding`: ``source`` proposes up to ``k`` tokens
    a round."""

    source: DraftSource
    k: int = 4

    def __post_init__(self) -> None:
        if isinstance(self.k, bool) or not isinstance(self.k, int) or self.k < 1:
            raise ArgumentError("k", self.k, "an int >= 1: the most draft tokens a round")
        if not callable(getattr(self.source, "propose", None)):
            raise ArgumentError("source", self.source, "a draft source (an object with propose(context))")


@dataclass
class SpeculationStats:
    """What speculation did over a decoding: rounds (target passes that verified drafts), drafts proposed,
    kept by the structure and accepted by the target, per draft position, and the seconds spent drafting and
    verifying."""

    k: int
    rounds: int = 0
    proposed: int = 0
    valid: int = 0
    accepted: int = 0
    tokens: int = 0
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0
    #: Per draft position ``j``: how many rounds verified a draft there, and how many of those were accepted.
    verified_at: list[int] = field(default_factory=list)
    accepted_at: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.verified_at = [0] * self.k
        self.accepted_at = [0] * self.k

    def record(self, proposed: int, valid: int, accepted: int, emitted: int) -> None:
        self.rounds += valid > 0  # drafts the structure rejected at their first token cost no pass: not a round
        self.proposed += proposed
        self.valid += valid
        self.accepted += accepted
        self.tokens += emitted
        for j in range(valid):
            self.verified_at[j] += 1
            self.accepted_at[j] += j < accepted

    @property
    def acceptance_at(self) -> list[float]:
        """Per draft position, the share of verified drafts the target accepted (nan where none was verified)."""
        return [a / v if v else math.nan for a, v in zip(self.accepted_at, self.verified_at)]

    @property
    def tokens_per_round(self) -> float:
        """Tokens appended per verifying target pass (accepted drafts plus the token drawn after them)."""
        return self.tokens / self.rounds if self.rounds else math.nan


class Timer:
    """Adds the seconds of a ``with`` block to an attribute of ``stats``."""

    def __init__(self, stats: SpeculationStats, name: str):
        self.stats, self.name = stats, name

    def __enter__(self) -> None:
        self.began = time.perf_counter()

    def __exit__(self, *exc: Any) -> None:
        setattr(self.stats, self.name, getattr(self.stats, self.name) + time.perf_counter() - self.began)


def accept(
    target: np.ndarray,
    drafts: Sequence[int],
    draft_probs: Sequence[np.ndarray | None] | np.ndarray | None,
    rng: np.random.Generator,
    *,
    forced: Sequence[bool] | None = None,
) -> tuple[int, int]:
    """The speculative acceptance rule. ``target``: ``(len(drafts) + 1, width)`` target distributions under the mask
    and the sampling transforms (row ``j`` for the token after ``j`` drafts); ``draft_probs``: per draft its own
    distribution (a row of width ``width``), or None for a draft proposed outright (``q = 1`` on it); None for all.
    ``forced``: drafts the structure forces (fast-forward), kept without a test and without a random number.

    Returns ``(accepted, token)``: how many leading drafts are kept, and the token drawn after them (from the
    residual ``max(0, p - q)`` at the first rejection, or from ``p`` after the last draft)."""
    for j, token in enumerate(drafts):
        if forced is not None and forced[j]:
            continue
        p = target[j]
        q = draft_probs[j] if draft_probs is not None else None
        q_token = 1.0 if q is None else float(q[token])
        if q_token > 0 and rng.random() * q_token < p[token]:
            continue
        if q is None:
            residual = p.copy()
            residual[token] = max(0.0, residual[token] - 1.0)
        else:
            residual = np.maximum(p - q, 0.0)
        if residual.sum() <= 0:  # p == q up to rounding: any draw from p is exact
            residual = p
        return j, _draw(residual, rng)
    return len(drafts), _draw(target[len(drafts)], rng)


def _draw(weights: np.ndarray, rng: np.random.Generator) -> int:
    if not weights.sum() > 0:
        raise DeadEndError("speculative decoding: no token has positive probability at a verified position")
    return int(sample_from_probs(weights, rng))


# -- what to expect ------------------------------------------------------------------------------------------------


def expected_accepted(alphas: Sequence[float]) -> float:
    """Expected accepted drafts a round when draft ``i`` is accepted with probability ``alphas[i]`` given that all
    before it were: ``sum_i prod_{j <= i} alpha_j``."""
    total, running = 0.0, 1.0
    for alpha in alphas:
        _check_probability(alpha)
        running *= alpha
        total += running
    return total


def expected_tokens_geometric(alpha: float, k: int) -> float:
    """Expected tokens a round (accepted drafts plus the one drawn after them) when every draft is accepted with the
    same probability ``alpha``: ``(1 - alpha^(k+1)) / (1 - alpha)``."""
    _check_probability(alpha)
    if isinstance(k, bool) or not isinstance(k, int) or k < 0:
        raise ArgumentError("k", k, "an int >= 0")
    return float(k + 1) if alpha == 1.0 else (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def speedup(tokens_per_round: float, cost_ratio: float, k: int) -> float:
    """Speed-up over plain decoding when a round yields ``tokens_per_round`` tokens (``E[accepted + 1]``) for ``k``
    draft steps each costing ``cost_ratio`` of a target pass: ``S = E[accepted + 1] / (c * k + 1)``."""
    if not tokens_per_round >= 0:
        raise ArgumentError("tokens_per_round", tokens_per_round, "the expected tokens a round, >= 0")
    if not cost_ratio >= 0:
        raise ArgumentError("cost_ratio", cost_ratio, "a draft step's cost over a target pass's, >= 0")
    if isinstance(k, bool) or not isinstance(k, int) or k < 0:
        raise ArgumentError("k", k, "an int >= 0: the draft steps a round")
    return tokens_per_round / (cost_ratio * k + 1.0)


def _check_probability(alpha: float) -> None:
    if not 0.0 <= alpha <= 1.0:
        raise ArgumentError("alpha", alpha, "a probability in [0, 1]")


#: A draft model: token ids read so far -> logits of the next token.
NextLogits = Callable[[Sequence[int]], Any]
