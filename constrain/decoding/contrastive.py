"""Contrastive decoding: prefer the tokens where a strong model (the expert) beats a weak one (the amateur).

At each step, with ``p_e`` and ``p_a`` the expert's and the amateur's distributions *under the structure* (each
model's logits masked to the allowed tokens, then softmax), a token's score is

    score(x) = log p_e(x) - log p_a(x)   for x in V_head = {x allowed : p_e(x) >= alpha * max_y p_e(y)}
    score(x) = -inf                      otherwise.

The plausibility set ``V_head`` keeps the amateur from promoting tokens the expert finds unlikely (an implausible
token that the amateur finds even less likely would otherwise score high). It is taken *after* the structure mask:
the maximum runs over the allowed tokens, so the set always holds the expert's most likely allowed token and is
never empty while the structure allows anything; no token the structure rules out ever gets a finite score, and a
structure that rules out the expert's favourite leaves the cutoff relative to the best token it does allow (a
cutoff relative to the unconstrained maximum could leave no allowed token plausible).

Renormalising under the structure shifts both log-probabilities by a constant per step, so the choice of a step
is the one the unconstrained ``log p_e - log p_a`` makes among the plausible allowed tokens.

The amateur is one of:

- another model: a :class:`~constrain.decoding.loop.LogitsModel` for :class:`~constrain.decoding.loop.Decoding`
  (it reads every token the expert reads, forced ones included, so its cache stays in step), or a
  ``next_logits(prefixes)`` callable or transformers model for :func:`~constrain.decoding.beam.beam_search`;
- the expert with layers skipped: :func:`~constrain.decoding.drafts.early_exit_model` (wrapped as a loop model
  for :class:`Decoding`, as it is for a draft model), sharing the expert's weights;
- the expert at a high temperature (``amateur_temperature=T``: amateur logits = expert logits / T), which costs no
  forward pass. Then ``score = (1 - 1/T) log p_e + c`` on the plausible set: a monotone function of ``p_e`` for
  ``T > 1``, so greedy decoding picks the expert's own arg-max; it changes sampling (``softmax(score)`` is ``p_e``
  at temperature ``T / (T - 1)`` over the plausible set) and the ranking of beams.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from constrain.decoding.transforms import _is_tensor, apply_structure_mask, log_softmax
from constrain.errors import ArgumentError, LogitsError, ShapeError

__all__ = ["Contrastive", "contrastive_scores"]


@dataclass(frozen=True)
class Contrastive:
    """Contrastive decoding's settings: the ``amateur`` model, or ``amateur_temperature`` for the expert at that
    temperature (exactly one of them), and ``alpha`` in [0, 1], the plausibility cutoff relative to the expert's most
    likely allowed token (0: every allowed token is plausible; 1: only the expert's arg-max and its ties).

    ``amateur`` is a :class:`~constrain.decoding.loop.LogitsModel` (with its own cache) for
    :class:`~constrain.decoding.loop.Decoding`, and a ``next_logits(prefixes)`` callable or a transformers model for
    :func:`~constrain.decoding.beam.beam_search`."""

    amateur: Any = None
    alpha: float = 0.1
    amateur_temperature: float | None = None

    def __post_init__(self) -> None:
        if (self.amateur is None) == (self.amateur_temperature is None):
            raise ArgumentError(
                "amateur", self.amateur, "either an amateur model or amateur_temperature (the expert at T), not both"
            )
        if isinstance(self.alpha, bool) or not isinstance(self.alpha, (int, float)) or not 0.0 <= self.alpha <= 1.0:
            raise ArgumentError("alpha", self.alpha, "a number in [0, 1]: the plausibility cutoff")
        t = self.amateur_temperature
        if t is not None and (isinstance(t, bool) or not isinstance(t, (int, float)) or not 0.0 < t < math.inf):
            raise ArgumentError("amateur_temperature", t, "a finite number > 0 (above 1 for a flatter amateur)")

    def amateur_logits(self, expert_logits: Any) -> Any:
        """The expert's logits at ``amateur_temperature`` (only for a temperature amateur)."""
        if self.amateur_temperature is None:
            raise ArgumentError("amateur_temperature", None, "a temperature: this amateur is a model")
        return _float64(expert_logits) / self.amateur_temperature


def contrastive_scores(expert: Any, amateur: Any, *, alpha: float, mask: Any = None) -> np.ndarray:
    """Per row, ``log p_e - log p_a`` on the plausible allowed tokens and ``-inf`` elsewhere (float64 numpy, the
    shape of ``expert``). ``expert``, ``amateur``: logits ``(batch, V)`` or ``(V,)``, numpy or torch, the same
    shape. ``mask``: the structure's packed int32 bitmask or boolean mask (see
    :func:`~constrain.decoding.transforms.apply_structure_mask`), or None for free text. A row with no allowed
    token scores ``-inf`` everywhere."""
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0.0 <= alpha <= 1.0:
        raise ArgumentError("alpha", alpha, "a number in [0, 1]: the plausibility cutoff")
    e, a = _float64(expert), _float64(amateur)
    if e.shape != a.shape:
        raise ShapeError(f"expert logits of shape {e.shape} and amateur logits of shape {a.shape} differ")
    if np.isnan(e).any() or np.isnan(a).any():
        raise LogitsError("contrastive decoding: the logits contain NaN")
    if mask is not None:
        apply_structure_mask(e, mask, inplace=True)
        apply_structure_mask(a, mask, inplace=True)
    le, la = log_softmax(e), log_softmax(a)
    best = le.max(axis=-1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        plausible = np.isfinite(le) & (le >= best + math.log(alpha) if alpha > 0 else True)
        return np.where(plausible, le - la, -np.inf)


def _float64(logits: Any) -> np.ndarray:
    """A float64 numpy copy of logits (a torch tensor comes to the host)."""
    if _is_tensor(logits):
        logits = logits.detach().float().cpu().numpy()
    return np.array(logits, dtype=np.float64)
