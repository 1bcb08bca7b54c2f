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

**Diverse beam search** (``num_beam_groups=G``, ``diversity_penalty=lambda``): the beams form ``G`` groups of
``num_beams / G``, each a beam search with its own hypotheses and its own early stop. At each step the groups
choose in order; in group ``g`` a candidate's score is lowered by ``lambda`` times the number of beams of groups
``0..g-1`` that went on with the same token at this step (Hamming diversity). The penalty only steers the choice:
beams and hypotheses keep the model's log-probabilities. With ``G = 1`` this is plain beam search; with
``lambda = 0`` each group is the same independent search of ``num_beams / G`` beams. The result lists each token
sequence once, whichever groups found it. A group that stops early no longer penalises the later groups, so with
``lambda > 0`` early stopping may change what they find.

**Contrastive beams** (``contrastive=``): a candidate's step gain is its contrastive score
(:mod:`constrain.decoding.contrastive`) instead of its log-probability, and beams are ranked by the sum; the
amateur reads the same prefixes (a second ``next_logits``) or is the expert at a temperature. Contrastive scores
can be positive, so the early-stopping bound does not hold: the search runs to ``max_new_tokens`` or until no beam
is left.

With ``logprobs=k`` every hypothesis carries one :class:`~constrain.decoding.loop.TokenLogprob` per token: its
log-probability under the structure (the masked log-softmax the beam's log-probability sums) with ``k``
alternatives, under the raw model, and the entropy under the structure (``sampled_logprob`` is None: nothing is
drawn). A record is built only for the candidates kept.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from constrain.decoding.contrastive import Contrastive, contrastive_scores
from constrain.decoding.loop import MAX_TOP_LOGPROBS, TokenLogprob, _token_logprob
from constrain.decoding.transforms import entropy, log_softmax
from constrain.errors import BeamSearchError, DeadEndError, ShapeError, TokenError

__all__ = ["BeamHypothesis", "BeamSearchError", "beam_search", "model_next_logits"]


@dataclass(frozen=True)
class BeamHypothesis:
    """One result of :func:`beam_search`.

    ``tokens``: the generated tokens (the prompt excluded, the end token included when ``finished``).
    ``log_prob``: the sum of their log-probabilities under the structure. ``score``: the ranked objective,
    ``log_prob / len(tokens) ** length_penalty`` (under contrastive decoding the sum of contrastive scores takes
    the place of ``log_prob``). ``finished``: whether it ended with an end-of-sequence token. ``logprobs``: one
    :class:`TokenLogprob` per token when asked for (``sampled_logprob`` None: beam search draws nothing), else
    None.
    """

    tokens: tuple[int, ...]
    log_prob: float
    score: float
    finished: bool
    logprobs: list[TokenLogprob] | None = None


class _Beam:
    __slots__ = ("tokens", "log_prob", "objective", "matcher", "records")

    def __init__(self, tokens: tuple[int, ...], log_prob: float, objective: float, matcher: Any, records: tuple):
        self.tokens = tokens
        self.log_prob = log_prob
        self.objective = objective  # what ranks the beam: log_prob, or the sum of contrastive scores
        self.matcher = matcher
        self.records = records


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
    num_beam_groups: int = 1,
    diversity_penalty: float = 0.0,
    contrastive: Contrastive | None = None,
    logprobs: int | None = None,
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

    ``num_beam_groups``: diverse beam search, ``num_beams / num_beam_groups`` beams per group (it must divide);
    ``diversity_penalty``: how much a token's candidate score in a group drops for each beam of an earlier group
    that went on with that token at the same step (Hamming diversity, >= 0). ``contrastive``: rank beams by the sum
    of contrastive scores instead of log-probabilities (:class:`Contrastive`; its amateur is a ``next_logits``
    callable, a transformers model, or a temperature). ``logprobs``: None, or how many alternatives (0 to 20) each
    token's :class:`TokenLogprob` lists in ``BeamHypothesis.logprobs``.

    Returns up to ``num_return_sequences`` :class:`BeamHypothesis`, best score first (ties: lower token ids first),
    no two with the same tokens. Raises :class:`~constrain.errors.DeadEndError` if every beam dies before any
    hypothesis is complete.
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
    if not _is_int(num_beam_groups) or num_beam_groups < 1 or num_beams % num_beam_groups:
        raise BeamSearchError("num_beam_groups", num_beam_groups, f"must be an int >= 1 dividing {num_beams}")
    if (
        isinstance(diversity_penalty, bool)
        or not isinstance(diversity_penalty, (int, float))
        or not 0.0 <= diversity_penalty < math.inf
    ):
        raise BeamSearchError("diversity_penalty", diversity_penalty, "must be a finite number >= 0")
    if logprobs is not None and (not _is_int(logprobs) or not 0 <= logprobs <= MAX_TOP_LOGPROBS):
        raise BeamSearchError("logprobs", logprobs, f"must be None or an int in [0, {MAX_TOP_LOGPROBS}]")
    if contrastive is not None and not isinstance(contrastive, Contrastive):
        raise BeamSearchError("contrastive", contrastive, "must be a Contrastive(amateur=..., alpha=...)")
    num_beams, max_new_tokens, group_size = int(num_beams), int(max_new_tokens), int(num_beams // num_beam_groups)

    next_logits = _next_logits(model, "model")
    amateur = None
    if contrastive is not None and contrastive.amateur is not None:
        amateur = _next_logits(contrastive.amateur, "contrastive")
    factory = _matcher_factory(structure)
    root = factory() if factory is not None else None
    eos = _eos_set(eos_token_id, root)
    if return_unfinished is None:
        return_unfinished = True if root is None else "accepting"
    # contrastive scores can be positive: the bound of early stopping needs scores that only decrease
    early_stopping = early_stopping and contrastive is None
    prompt = [int(t) for t in prompt]
    groups = [_Group([_Beam((), 0.0, 0.0, root, ())]) for _ in range(int(num_beam_groups))]

    for step in range(max_new_tokens):
        live = [g for g in groups if g.beams]
        if not live:
            break
        prefixes = [prompt + list(b.tokens) for g in live for b in g.beams]
        logits = _float_logits(next_logits(prefixes), len(prefixes), "next_logits")
        raw = logits.copy() if logprobs is not None else None
        if root is not None:
            _mask_rows(logits, [b.matcher for g in live for b in g.beams])
        logp = log_softmax(logits, axis=1)
        gains = logp
        if contrastive is not None:
            if amateur is not None:
                weak = _float_logits(amateur(prefixes), len(prefixes), "the amateur")
            else:
                weak = contrastive.amateur_logits(logits)
            if weak.shape != logits.shape:
                raise ShapeError(f"the amateur returned shape {weak.shape}, the model {logits.shape}")
            gains = contrastive_scores(logits, weak, alpha=contrastive.alpha)  # logits are masked already
        chosen = np.zeros(logits.shape[1])  # per token, beams of earlier groups that went on with it this step
        offset = 0
        for g in live:
            rows = slice(offset, offset + len(g.beams))
            offset += len(g.beams)
            records = _Records(raw[rows], logp[rows], logprobs) if raw is not None else None
            g.step(logp[rows], gains[rows], diversity_penalty * chosen, eos, group_size, length_penalty, records)
            for b in g.beams:
                chosen[b.tokens[-1]] += 1
            if early_stopping:
                g.stop_if_settled(group_size, step + 1, max_new_tokens, length_penalty)
    hyps: list[tuple[float, tuple[int, ...], float, bool, tuple]] = []
    for g in groups:
        for b in g.beams:  # alive at max_new_tokens
            if return_unfinished is True or (return_unfinished == "accepting" and b.matcher.is_accepting()):
                g.add_hyp(b, False, length_penalty)
        hyps += g.hyps
    if not hyps:
        raise DeadEndError("beam search: every beam reached a dead end before any hypothesis was complete")
    hyps.sort(key=lambda h: (-h[0], h[1]))
    out: list[BeamHypothesis] = []
    seen: set[tuple[int, ...]] = set()
    for score, tokens, log_prob, finished, records in hyps:
        if tokens not in seen and len(out) < num_return_sequences:
            seen.add(tokens)
            listed = list(records) if logprobs is not None else None
            out.append(BeamHypothesis(tokens, log_prob, score, finished, listed))
    return out


class _Records:
    """Builds the :class:`TokenLogprob` of a chosen candidate from its step's raw logits and masked
    log-probabilities (only for the candidates kept: a record costs a pass over the row)."""

    def __init__(self, raw: np.ndarray, logp: np.ndarray, top: int):
        self.raw, self.logp, self.top = raw, logp, top
        self._rows: dict[int, tuple[np.ndarray, float]] = {}  # per beam: raw log-probabilities, entropy

    def record(self, row: int, token: int) -> TokenLogprob:
        if row not in self._rows:
            self._rows[row] = (log_softmax(self.raw[row]), float(entropy(self.logp[row])))
        model, spread = self._rows[row]
        return _token_logprob(self.logp[row], token, self.top, float(model[token]), None, spread)


class _Group:
    """One group of beams of (diverse) beam search, with its own finished hypotheses."""

    def __init__(self, beams: list[_Beam]):
        self.beams = beams
        self.hyps: list[tuple[float, tuple[int, ...], float, bool, tuple]] = []  # score, tokens, log_prob, ...
        self.finished_scores: list[float] = []

    def add_hyp(self, beam: _Beam, finished: bool, length_penalty: float) -> None:
        score = _length_score(beam.objective, len(beam.tokens), length_penalty)
        self.hyps.append((score, beam.tokens, beam.log_prob, finished, beam.records))
        if finished:
            self.finished_scores.append(score)

    def step(
        self,
        logp: np.ndarray,
        gains: np.ndarray,
        penalty: np.ndarray,
        eos: frozenset[int],
        size: int,
        length_penalty: float,
        records: _Records | None,
    ) -> None:
        """Extend every beam by every token; keep the ``size`` best that go on (ranked by objective minus the
        diversity ``penalty``), and make a hypothesis of each end token ranked above the last kept."""
        V = logp.shape[1]
        objective = gains + np.array([b.objective for b in self.beams])[:, None]
        flat = (objective - penalty[None, :]).ravel()
        n_finite = int(np.count_nonzero(flat > -np.inf))
        new_beams: list[_Beam] = []
        # enough candidates to fill the group even if each beam's end tokens rank first
        need = min(n_finite, size * (1 + len(eos)))
        top = np.argpartition(-flat, need - 1)[:need] if 0 < need < flat.size else np.arange(flat.size)
        top = top[np.lexsort((top, -flat[top]))]  # best first; ties by (beam, token)
        for idx in top if n_finite else ():
            if flat[idx] == -np.inf:
                break
            b, t = divmod(int(idx), V)
            parent = self.beams[b]
            child_records = parent.records + ((records.record(b, t),) if records is not None else ())
            child = (parent.tokens + (t,), float(parent.log_prob + logp[b, t]), float(objective[b, t]))
            if t in eos:
                self.add_hyp(_Beam(*child, None, child_records), True, length_penalty)
                continue
            matcher = None
            if parent.matcher is not None:
                matcher = parent.matcher.copy()
                try:
                    matcher.advance(t)
                except TokenError:  # the mask allowed it, so this does not happen with a consistent matcher
                    continue
            new_beams.append(_Beam(*child, matcher, child_records))
            if len(new_beams) == size:
                break
        self.beams = new_beams

    def stop_if_settled(self, size: int, length: int, max_length: int, length_penalty: float) -> None:
        """End the group when ``size`` hypotheses are finished and no live beam can beat the worst of them."""
        if not self.beams or len(self.finished_scores) < size:
            return
        worst_kept = sorted(self.finished_scores, reverse=True)[size - 1]
        bound = max(_best_future(b.objective, length, max_length, length_penalty) for b in self.beams)
        if bound < worst_kept:
            self.beams = []


def _is_int(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def _next_logits(model: Any, name: str) -> Callable[[list[list[int]]], Any]:
    """A ``next_logits(prefixes)`` callable from one, or from a transformers model."""
    next_logits = model_next_logits(model) if _is_torch_module(model) else model
    if not callable(next_logits):
        raise BeamSearchError(name, model, "a next_logits(prefixes) callable or a torch module")
    return next_logits


def _float_logits(logits: Any, rows: int, what: str) -> np.ndarray:
    """The logits of ``rows`` prefixes as float64 numpy, checked."""
    if hasattr(logits, "detach"):  # torch
        torch = sys.modules["torch"]
        logits = logits.detach()
        if logits.dtype not in (torch.float32, torch.float64):
            logits = logits.float()
        logits = logits.cpu().numpy()
    logits = np.array(logits, dtype=np.float64)
    if logits.ndim != 2 or logits.shape[0] != rows:
        raise ShapeError(f"{what} returned shape {logits.shape} for {rows} prefixes; expected ({rows}, V)")
    if np.isnan(logits).any():
        raise ShapeError(f"{what} returned NaN logits")
    return logits


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
