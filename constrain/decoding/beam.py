"""Beam search, with or without a structure.

:func:`beam_search` keeps the ``num_beams`` best prefixes. At each step every live beam is extended by every
token; a candidate's score is the beam's sum of log-probabilities plus the token's log-probability. An
end-of-sequence token finishes a beam: it becomes a hypothesis, ranked by ``log_prob / len(tokens) **
length_penalty`` (``len`` counts the generated tokens, the end token included). The ``num_beams`` best candidates
that do not end go on.

With a structure each beam carries its own matcher (copied from its parent, O(1)). A step's logits are masked by
the beam's allowed tokens before the log-softmax, so a beam's log-probability is the sum of the model's
*constrained* log-probabilities (the model's distribution conditioned on the allowed set, as in sampling). A beam
whose allowed set is empty, a dead end, is dropped. The end token is only allowed where the structure accepts,
so a finished hypothesis is always a complete match.

The model is either a callable ``next_logits(prefixes) -> logits`` (``prefixes``: a list of token-id lists,
prompt included; ``logits``: ``(len(prefixes), V)``, numpy or torch) or a transformers causal language model.

Search stops when ``max_new_tokens`` is reached, when no beam is left, or (``early_stopping=True``) as soon as
``num_beams`` hypotheses are finished and no live beam can still beat the worst of them (an exact bound: log-
probabilities only decrease, so the search returns the same hypotheses as without early stopping).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from constrain.decoding.transforms import log_softmax
from constrain.errors import BeamSearchError, DeadEndError, ShapeError, TokenError

__all__ = ["BeamHypothesis", "BeamSearchError", "beam_search", "model_next_logits"]


@dataclass(frozen=True)
class BeamHypothesis:
    """One result of :func:`beam_search`.

    ``tokens``: the generated tokens (the prompt excluded, the end token included when ``finished``).
    ``log_prob``: the sum of their log-probabilities. ``score``: ``log_prob / len(tokens) ** length_penalty``.
    ``finished``: whether it ended with an end-of-sequence token.
    """

    tokens: tuple[int, ...]
    log_prob: float
    score: float
    finished: bool


class _Beam:
    __slots__ = ("tokens", "log_prob", "matcher")

    def __init__(self, tokens: tuple[int, ...], log_prob: float, matcher: Any):
        self.tokens = tokens
        self.log_prob = log_prob
        self.matcher = matcher


def _is_torch_module(obj: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.nn.Module)


def model_next_logits(model: Any, *, batch_size: int = 64) -> Callable[[list[list[int]]], np.ndarray]:
    """Wrap a transformers causal LM (anything whose ``model(input_ids=...)`` returns ``.logits``) as a
    ``next_logits(prefixes)`` callable: runs the prefixes (equal lengths, as beam search gives them; ragged ones are
    left-padded, with an attention mask and position ids) in chunks of ``batch_size`` and returns the last
    position's logits (float32 numpy). No KV cache: each step re-reads the prefixes, which suits small models
    and tests."""
    import torch

    try:
        device = next(model.parameters()).device
    except (StopIteration, AttributeError):
        device = torch.device("cpu")
    pad_id = getattr(getattr(model, "config", None), "pad_token_id", None)
    pad_id = 0 if pad_id is None else int(pad_id)

    def next_logits(prefixes: list[list[int]]) -> np.ndarray:
        outs = []
        for start in range(0, len(prefixes), batch_size):
            chunk = prefixes[start : start + batch_size]
            lengths = [len(p) for p in chunk]
            if min(lengths) == 0:
                raise ShapeError("a transformers model needs a non-empty prompt (a BOS token at least)")
            L = max(lengths)
            ids = torch.full((len(chunk), L), pad_id, dtype=torch.long)
            attn = torch.zeros((len(chunk), L), dtype=torch.long)
            for i, p in enumerate(chunk):
                ids[i, L - len(p) :] = torch.as_tensor(p, dtype=torch.long)
                attn[i, L - len(p) :] = 1
            kwargs = {"input_ids": ids.to(device)}
            if min(lengths) != L:  # left padding: mask it, and count positions from each row's first token
                kwargs["attention_mask"] = attn.to(device)
                kwargs["position_ids"] = (attn.cumsum(dim=1) - 1).clamp(min=0).to(device)
            with torch.no_grad():
                out = model(**kwargs)
            logits = out.logits if hasattr(out, "logits") else out[0]
            outs.append(logits[:, -1, :].float().cpu().numpy())
        return np.concatenate(outs, axis=0)

    return next_logits


def _matcher_factory(structure: Any) -> Callable[[], Any] | None:
    """A zero-argument callable giving a fresh matcher, from a Matcher (copied), a compiled structure (its
    ``matcher()``) or a factory."""
    if structure is None:
        return None
    if hasattr(structure, "advance") and hasattr(structure, "copy"):
        return structure.copy
    if hasattr(structure, "matcher") and callable(structure.matcher):
        return structure.matcher
    if callable(structure):
        return structure
    raise BeamSearchError("structure", structure, "a Matcher, a compiled structure or a callable returning a matcher")


def _eos_set(eos_token_id: int | Iterable[int] | None, matcher: Any) -> frozenset[int]:
    if eos_token_id is None:
        structure = getattr(matcher, "structure", None)
        ids = getattr(structure, "eos_ids", None)
        return frozenset(int(t) for t in ids) if ids is not None else frozenset()
    if isinstance(eos_token_id, (int, np.integer)):
        return frozenset([int(eos_token_id)])
    return frozenset(int(t) for t in eos_token_id)


def _length_score(log_prob: float, length: int, length_penalty: float) -> float:
    return log_prob / (length**length_penalty) if length > 0 else log_prob


def _best_future(log_prob: float, length: int, max_length: int, length_penalty: float) -> float:
    """An upper bound on the score any continuation of a live beam (``length`` tokens so far) can reach."""
    if log_prob == 0.0:
        return 0.0
    if length_penalty > 0:  # log_prob <= 0: the longest possible length divides the most
        return log_prob / (max_length**length_penalty)
    return log_prob / ((length + 1) ** length_penalty)  # the next length is the best


def beam_search(
    model: Any,
    prompt: Sequence[int] = (),
    *,
    num_beams: int,
    max_new_tokens: int,
    eos_token_id: int | Iterable[int] | None = None,
    length_penalty: float = 1.0,
    num_return_sequences: int = 1,
    structure: Any = None,
    early_stopping: bool = True,
    return_unfinished: bool | None = None,
) -> list[BeamHypothesis]:
    """Beam search over ``model``: a ``next_logits(prefixes) -> (n, V) logits`` callable or a transformers
    causal LM.

    ``prompt``: token ids before the generated ones (passed to the model, not returned). ``eos_token_id``: one id
    or several; defaults to the structure's end tokens. ``length_penalty``: the exponent ``lambda`` in
    ``score = log_prob / len ** lambda`` (0: plain sum of log-probabilities). ``structure``: a
    :class:`~constrain.Matcher` (the search starts from a copy of its state), a compiled structure, or a callable
    returning a fresh matcher; each beam carries its own. ``return_unfinished``: whether beams still alive at
    ``max_new_tokens`` are returned too (``finished=False``); by default yes without a structure, and with a
    structure only those whose text is already a complete match.

    Returns up to ``num_return_sequences`` :class:`BeamHypothesis`, best score first (ties: lower token ids first).
    Raises :class:`~constrain.errors.DeadEndError` if every beam dies before any hypothesis is complete.
    """
    if isinstance(num_beams, bool) or not isinstance(num_beams, (int, np.integer)) or num_beams < 1:
        raise BeamSearchError("num_beams", num_beams, "must be an int >= 1")
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, (int, np.integer)) or max_new_tokens < 1:
        raise BeamSearchError("max_new_tokens", max_new_tokens, "must be an int >= 1")
    if (
        isinstance(num_return_sequences, bool)
        or not isinstance(num_return_sequences, (int, np.integer))
        or not 1 <= num_return_sequences <= num_beams
    ):
        raise BeamSearchError("num_return_sequences", num_return_sequences, f"must be an int in [1, {num_beams}]")
    if not isinstance(length_penalty, (int, float)) or not math.isfinite(length_penalty):
        raise BeamSearchError("length_penalty", length_penalty, "must be a finite number")
    num_beams, max_new_tokens = int(num_beams), int(max_new_tokens)

    next_logits = model_next_logits(model) if _is_torch_module(model) else model
    if not callable(next_logits):
        raise BeamSearchError("model", model, "a next_logits(prefixes) callable or a torch module")
    factory = _matcher_factory(structure)
    root = factory() if factory is not None else None
    eos = _eos_set(eos_token_id, root)
    if return_unfinished is None:
        return_unfinished = True if root is None else "accepting"
    prompt = [int(t) for t in prompt]

    beams = [_Beam((), 0.0, root)]
    hyps: list[tuple[float, tuple[int, ...], float, bool]] = []  # (score, tokens, log_prob, finished)

    def add_hyp(tokens: tuple[int, ...], log_prob: float, finished: bool) -> None:
        hyps.append((_length_score(log_prob, len(tokens), length_penalty), tokens, log_prob, finished))

    finished_scores: list[float] = []
    for step in range(max_new_tokens):
        logits = next_logits([prompt + list(b.tokens) for b in beams])
        if hasattr(logits, "detach"):  # torch
            torch = sys.modules["torch"]
            logits = logits.detach()
            if logits.dtype not in (torch.float32, torch.float64):
                logits = logits.float()
            logits = logits.cpu().numpy()
        logits = np.array(logits, dtype=np.float64)
        if logits.ndim != 2 or logits.shape[0] != len(beams):
            raise ShapeError(
                f"next_logits returned shape {logits.shape} for {len(beams)} prefixes; expected ({len(beams)}, V)"
            )
        if np.isnan(logits).any():
            raise ShapeError("next_logits returned NaN logits")
        V = logits.shape[1]
        if root is not None:
            _mask_rows(logits, [b.matcher for b in beams])
        logp = log_softmax(logits, axis=1)
        cand = logp + np.array([b.log_prob for b in beams])[:, None]
        flat = cand.ravel()
        n_finite = int(np.count_nonzero(flat > -np.inf))
        if n_finite == 0:
            beams = []
            break
        # enough candidates to fill num_beams live beams even if each beam's end tokens rank first
        need = min(n_finite, num_beams * (1 + len(eos)))
        if need < flat.size:
            top = np.argpartition(-flat, need - 1)[:need]
        else:
            top = np.arange(flat.size)
        top = top[np.lexsort((top, -flat[top]))]  # best first; ties by (beam, token)
        new_beams: list[_Beam] = []
        for idx in top:
            score = float(flat[idx])
            if score == -np.inf:
                break
            b, t = divmod(int(idx), V)
            parent = beams[b]
            if t in eos:
                add_hyp(parent.tokens + (t,), score, True)
                finished_scores.append(hyps[-1][0])
                continue
            matcher = None
            if parent.matcher is not None:
                matcher = parent.matcher.copy()
                try:
                    matcher.advance(t)
                except TokenError:  # the mask allowed it, so this does not happen with a consistent matcher
                    continue
            new_beams.append(_Beam(parent.tokens + (t,), score, matcher))
            if len(new_beams) == num_beams:
                break
        beams = new_beams
        if not beams:
            break
        if early_stopping and len(finished_scores) >= num_beams:
            worst_kept = sorted(finished_scores, reverse=True)[num_beams - 1]
            length = step + 1
            bound = max(_best_future(b.log_prob, length, max_new_tokens, length_penalty) for b in beams)
            if bound < worst_kept:
                beams = []
                break
    for b in beams:  # alive at max_new_tokens
        if return_unfinished is True or (return_unfinished == "accepting" and b.matcher.is_accepting()):
            add_hyp(b.tokens, b.log_prob, False)
    if not hyps:
        raise DeadEndError("beam search: every beam reached a dead end before any hypothesis was complete")
    hyps.sort(key=lambda h: (-h[0], h[1]))
    return [BeamHypothesis(tokens=h[1], log_prob=h[2], score=h[0], finished=h[3]) for h in hyps[:num_return_sequences]]


def _mask_rows(logits: np.ndarray, matchers: list[Any]) -> None:
    """-inf on each row's disallowed tokens (ids past the matcher's vocabulary are disallowed too)."""
    from constrain.kernels.bitmask import apply_token_bitmask

    V = logits.shape[1]
    width = (V + 31) // 32
    m_width = getattr(getattr(matchers[0], "structure", None), "bitmask_width", width)
    bitmask = np.full((len(matchers), max(width, m_width)), -1, dtype=np.int32)
    for i, m in enumerate(matchers):
        m.fill_bitmask(bitmask, i)  # words past the matcher's vocabulary are zeroed by the matcher
    apply_token_bitmask(logits, bitmask)
