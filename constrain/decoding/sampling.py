"""Logits transforms and samplers, batched, on numpy arrays and torch tensors.

One decoding step turns a row of logits into a probability distribution and draws a token from it. The order is
fixed (see ``DESIGN.md``, "Semantics the tests must pin"):

1. repetition penalty (transformers convention: a seen token's positive logit is divided by ``rho``, a negative
   one multiplied by it);
2. frequency and presence penalties (OpenAI convention: subtract ``alpha_f * count`` and, once if seen,
   ``alpha_p``);
3. no-repeat n-gram: a token that would repeat an n-gram already in the history gets ``-inf``;
4. logit bias (added; a bias of ``-inf`` bans a token);
5. structure mask: disallowed tokens get ``-inf`` (a packed int32 bitmask or a boolean mask);
6. temperature: logits are divided by it; temperature 0 is greedy (the arg-max, first index on ties);
7. top-k, top-p, min-p choose a support from the tempered softmax, each on what the previous one kept;
8. renormalise over the support, then sample with a seeded generator.

Exact definitions, pinned by ``tests/decoding/test_sampling.py``:

- Softmax is computed stably: the row maximum is subtracted before ``exp``.
- Top-k keeps the ``k`` largest probabilities; a token tied with the k-th largest is kept too (so the result does
  not depend on the order of equal logits). ``top_k = 0`` (or ``>= V``) disables it.
- Top-p keeps the shortest prefix of the distribution sorted by decreasing probability whose mass reaches ``p``;
  the token that crosses ``p`` is included, so the support is never empty; tokens tied with the last kept one are
  kept too. "Reaches" allows a relative rounding slack of ``1e-6`` on the mass. ``top_p = 1`` disables it.
  Top-p is applied to the distribution that top-k left (renormalised), as in transformers and vLLM.
- Min-p keeps ``p_i >= min_p * max_j p_j`` (relative rounding slack ``1e-5``). ``min_p = 0`` disables it.
- ``+inf`` logits dominate: a row holding ``+inf`` entries (after penalties, bias and mask) is uniform over them.
- NaN logits raise :class:`LogitsError`. A row where every token is ``-inf`` after the mask (and the penalties)
  raises :class:`~constrain.errors.DeadEndError`; a token with ``-inf`` is never sampled.
- Every parameter may differ per row: pass one :class:`SamplingParams` per row.

The penalties look at ``history``, the token ids the caller counts as "already seen" for each row (transformers
passes the prompt plus the generated tokens for the repetition penalty; OpenAI counts generated tokens only for
the frequency and presence penalties: pass what your convention needs).

numpy arrays are processed with numpy. torch tensors are processed with torch ops on their device, except that CPU
tensors go through the numpy implementation on a zero-copy view (it is faster on CPU: no full-vocabulary sort);
``backend="torch"`` forces torch ops. Random numbers always come from numpy ``Generator`` objects (one uniform per
row and step), so a seed gives the same tokens on numpy, CPU and GPU.

Importing this module does not import torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from constrain.decoding.params import SamplingParams, _Rows
from constrain.decoding.transforms import (
    _apply_bias_inplace,
    _apply_mask_inplace,
    _apply_penalties_inplace,
    _as_2d,
    _is_tensor,
    _torch,
    _work_copy,
)
from constrain.decoding.truncation import _SPARSE_MIN_V, _probs_numpy, _probs_torch
from constrain.errors import DeadEndError, LogitsError, SamplingParamsError, ShapeError


def _use_torch_ops(logits: Any, backend: str) -> bool:
    if backend not in ("auto", "numpy", "torch"):
        raise SamplingParamsError("backend", backend, "'auto', 'numpy' or 'torch'")
    if not _is_tensor(logits):
        if backend == "torch":
            raise ShapeError("backend='torch' needs torch tensors")
        return False
    if backend == "torch":
        return True
    if backend == "numpy":
        return False
    return logits.device.type != "cpu"


def _pipeline(logits: Any, params: Any, history: Any, mask: Any, backend: str, fn: str):
    """Steps 1-8 without the draw. Returns (probs 2-D in the working backend, supports, squeeze, to_output)."""
    if _is_tensor(logits) and not _use_torch_ops(logits, backend):
        torch = _torch()
        src = logits.detach()
        if src.dtype in (torch.float16, torch.bfloat16):
            src = src.float()
        z = _work_copy(src.numpy() if src.device.type == "cpu" else src.cpu().numpy(), fn)
        if _is_tensor(mask):
            mask = mask.detach().cpu().numpy()
        dev = logits.device

        def to_out(a: np.ndarray) -> Any:
            t = torch.from_numpy(a)
            return t if dev.type == "cpu" else t.to(dev)
    else:
        _use_torch_ops(logits, backend)
        z = _work_copy(logits, fn)

        def to_out(a: Any) -> Any:
            return a

    z, squeeze = _as_2d(z, fn)
    if z.shape[1] == 0:
        raise ShapeError(f"{fn}: logits have no columns")
    rows = _Rows(params, z.shape[0])
    _apply_penalties_inplace(z, rows, history, squeeze)
    _apply_bias_inplace(z, rows)
    if mask is not None:
        # a NaN under a masked entry would hide behind -inf: check before masking
        if bool(z.isnan().any()) if _is_tensor(z) else np.isnan(z.max()):
            raise LogitsError(f"{fn}: logits contain NaN")
        _apply_mask_inplace(z, mask, squeeze)
    if _is_tensor(z):
        return _probs_torch(z, rows), None, squeeze, to_out
    probs, supports = _probs_numpy(z, rows)
    return probs, supports, squeeze, to_out


def next_token_probs(
    logits: Any,
    params: SamplingParams | Sequence[SamplingParams] | None = None,
    *,
    history: Any = None,
    mask: Any = None,
    backend: str = "auto",
) -> Any:
    """The distribution the next token is drawn from: every step of the pipeline but the draw.

    ``logits``: ``(batch, V)`` or ``(V,)``, numpy or torch (float16/bfloat16/float32/float64). ``params``: one
    :class:`SamplingParams` for every row or one per row. ``history``: see :func:`apply_penalties`. ``mask``: see
    :func:`apply_structure_mask`. Returns probabilities of the same shape and kind (float32, or float64 for
    float64 input); a greedy row is one-hot on its arg-max. ``backend``: ``"auto"`` (numpy for numpy arrays and CPU
    tensors, torch ops on other devices), ``"numpy"`` or ``"torch"``.
    """
    probs, _, squeeze, to_out = _pipeline(logits, params, history, mask, backend, "next_token_probs")
    out = to_out(probs)
    return out[0] if squeeze else out


_DRAW_BLOCK = 1024


def _draw_row(w: np.ndarray, u: float) -> int:
    """Inverse CDF on one wide row without a full-length cumulative sum: block sums, then one block."""
    V = w.shape[0]
    nb = -(-V // _DRAW_BLOCK)
    pad = nb * _DRAW_BLOCK - V
    blocks = (np.concatenate([w, np.zeros(pad, dtype=w.dtype)]) if pad else w).reshape(nb, _DRAW_BLOCK)
    bs = blocks.sum(axis=1, dtype=np.float64)
    cb = np.cumsum(bs)
    x = u * cb[-1]
    b = int(np.searchsorted(cb, x, side="right"))
    last = int(np.flatnonzero(bs > 0)[-1])
    if b > last:
        b = last
    if b > 0:
        x -= cb[b - 1]
    c = np.cumsum(blocks[b], dtype=np.float64)
    j = int(np.searchsorted(c, x, side="right"))
    if j >= _DRAW_BLOCK or blocks[b, j] <= 0:  # rounding at the block's end: its last token with mass
        j = int(np.flatnonzero(blocks[b] > 0)[-1])
    return b * _DRAW_BLOCK + j


def _draw_numpy(P: np.ndarray, u: np.ndarray, supports: list | None = None) -> np.ndarray:
    """Inverse-CDF draw per row: the first token whose cumulative mass exceeds ``u * total``. A token with zero
    mass is never returned."""
    n, V = P.shape
    if V < _SPARSE_MIN_V and supports is None:
        cdf = np.cumsum(P, axis=1, dtype=np.float64)
        x = u * cdf[:, -1]
        idx = (cdf <= x[:, None]).sum(axis=1)
        bad = idx >= V
        if bad.any():
            idx[bad] = V - 1
        zero = P[np.arange(n), idx] <= 0
        if zero.any():  # only when u * total rounded to total: take the last token with mass
            zr = np.flatnonzero(zero)
            idx[zr] = V - 1 - np.argmax(P[zr][:, ::-1] > 0, axis=1)
        return idx.astype(np.int64)
    out = np.empty(n, dtype=np.int64)
    for r in range(n):
        sup = supports[r] if supports is not None else None
        if sup is None:
            out[r] = _draw_row(P[r], float(u[r]))
            continue
        ids, cdf = sup
        j = int(np.searchsorted(cdf, u[r] * cdf[-1], side="right"))
        if j >= ids.size or (cdf[j] - (cdf[j - 1] if j else 0.0)) <= 0:
            j = int(np.flatnonzero(np.diff(cdf, prepend=0.0) > 0)[-1])
        out[r] = ids[j]
    return out


def _draw_torch(P: Any, u: np.ndarray) -> Any:
    torch = _torch()
    cdf = torch.cumsum(P, dim=1, dtype=torch.float64)
    x = torch.as_tensor(u, dtype=torch.float64, device=P.device) * cdf[:, -1]
    idx = torch.searchsorted(cdf, x[:, None].contiguous(), right=True)[:, 0].clamp_(max=P.shape[1] - 1)
    zero = P.gather(1, idx[:, None])[:, 0] <= 0
    if bool(zero.any()):
        last = P.shape[1] - 1 - torch.argmax((P.flip(1) > 0).to(torch.int8), dim=1)
        idx = torch.where(zero, last, idx)
    return idx


def _draw(P: Any, supports: list | None, u: np.ndarray) -> Any:
    return _draw_torch(P, u) if _is_tensor(P) else _draw_numpy(P, u, supports)


def sample_from_probs(probs: Any, rng: np.random.Generator | int | None = None) -> Any:
    """Draw one token per row from non-negative weights (need not sum to 1), by inverse CDF.

    ``rng``: a numpy ``Generator``, a seed, or None. Returns int64 ids ``(batch,)`` (a scalar for 1-D input), numpy
    or torch like the input. A zero-weight token is never drawn.
    """
    gen = rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)
    squeeze = probs.ndim == 1
    P = probs.reshape(1, -1) if squeeze else probs
    if not _is_tensor(P):
        P = np.asarray(P)
    if bool((P.sum(1) <= 0).any()):
        raise DeadEndError("sample_from_probs: a row has no token with positive weight")
    ids = _draw(P, None, gen.random(P.shape[0]))
    return ids[0] if squeeze else ids


class Sampler:
    """A seeded sampler: applies the whole pipeline and draws one token per row.

    ``params``: one :class:`SamplingParams` for every row, or a sequence with one per row (then the batch size is
    fixed). Random numbers: with one ``SamplingParams``, one numpy ``Generator`` seeded with ``params.seed`` (or
    ``seed`` when given) draws one uniform per row at each call; with one per row, a row whose params carry a seed
    has its own generator (reproducible whatever the other rows do), and the other rows share one seeded with
    ``seed``. The draw is by inverse CDF, so one uniform per row and step, on every backend.
    """

    def __init__(
        self,
        params: SamplingParams | Sequence[SamplingParams] | None = None,
        *,
        seed: int | None = None,
        backend: str = "auto",
    ):
        if params is None:
            params = SamplingParams()
        self.params = params if isinstance(params, SamplingParams) else tuple(params)
        self.backend = backend
        if isinstance(self.params, SamplingParams):
            self._rng = np.random.default_rng(seed if seed is not None else self.params.seed)
            self._row_rngs: dict[int, np.random.Generator] = {}
        else:
            self._rng = np.random.default_rng(seed)
            self._row_rngs = {i: np.random.default_rng(p.seed) for i, p in enumerate(self.params) if p.seed is not None}

    def _uniforms(self, n: int) -> np.ndarray:
        if not self._row_rngs:
            return self._rng.random(n)
        u = np.empty(n)
        shared = [i for i in range(n) if i not in self._row_rngs]
        if shared:
            u[shared] = self._rng.random(len(shared))
        for i, g in self._row_rngs.items():
            if i < n:
                u[i] = g.random()
        return u

    def generator(self, row: int = 0) -> np.random.Generator:
        """The random-number generator that draws for ``row`` (speculative decoding draws its acceptances from it,
        so a seed still fixes every token)."""
        return self._row_rngs.get(row, self._rng)

    def row_params(self, row: int = 0) -> SamplingParams:
        """The sampling parameters of ``row``."""
        return self.params if isinstance(self.params, SamplingParams) else self.params[row]

    def probs(self, logits: Any, history: Any = None, mask: Any = None) -> Any:
        """The filtered, renormalised distribution of each row (see :func:`next_token_probs`)."""
        return next_token_probs(logits, self.params, history=history, mask=mask, backend=self.backend)

    def sample(self, logits: Any, history: Any = None, mask: Any = None) -> Any:
        """One token id per row: int64 array / tensor ``(batch,)``, or a scalar for 1-D logits."""
        P, supports, squeeze, to_out = _pipeline(logits, self.params, history, mask, self.backend, "Sampler.sample")
        ids = to_out(_draw(P, supports, self._uniforms(P.shape[0])))
        return ids[0] if squeeze else ids

    def sample_with_probs(self, logits: Any, history: Any = None, mask: Any = None) -> tuple[Any, Any]:
        """:meth:`sample`, and the distribution each row's token was drawn from (as :func:`next_token_probs` gives
        it, from the same computation: log-probabilities read from it are those of the draw)."""
        P, supports, squeeze, to_out = _pipeline(
            logits, self.params, history, mask, self.backend, "Sampler.sample_with_probs"
        )
        ids = to_out(_draw(P, supports, self._uniforms(P.shape[0])))
        probs = to_out(P)
        return (ids[0], probs[0]) if squeeze else (ids, probs)

    __call__ = sample


def sample(
    logits: Any,
    params: SamplingParams | Sequence[SamplingParams] | None = None,
    *,
    history: Any = None,
    mask: Any = None,
    rng: np.random.Generator | int | None = None,
    backend: str = "auto",
) -> Any:
    """One-shot: the whole pipeline and one draw per row. ``rng``: a numpy ``Generator`` or a seed used for every
    row; None seeds as :class:`Sampler` does (``params.seed``, or each row's own seed)."""
    if rng is None:
        return Sampler(params, backend=backend).sample(logits, history=history, mask=mask)
    P, supports, squeeze, to_out = _pipeline(logits, params, history, mask, backend, "sample")
    gen = rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)
    ids = to_out(_draw(P, supports, gen.random(P.shape[0])))
    return ids[0] if squeeze else ids
