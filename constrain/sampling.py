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

Exact definitions, pinned by ``tests/test_sampling.py``:

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

import math
import sys
from dataclasses import dataclass, field, fields, replace
from types import MappingProxyType
from typing import Any, Mapping, Sequence

import numpy as np

from constrain.errors import ConstrainError, DeadEndError, ShapeError, TokenError

__all__ = [
    "SamplingParams",
    "SamplingParamsError",
    "LogitsError",
    "PRESETS",
    "Sampler",
    "apply_penalties",
    "apply_logit_bias",
    "apply_structure_mask",
    "next_token_probs",
    "sample",
    "sample_from_probs",
    "softmax",
    "log_softmax",
]

# Relative slack when deciding whether a cumulative mass "reaches" top_p.
TOP_P_RTOL = 1e-6
# Relative slack on p_i >= min_p * max p (applied in log space: log p_i - log max p >= log min_p - MIN_P_RTOL).
MIN_P_RTOL = 1e-5


class SamplingParamsError(ConstrainError, ValueError):
    """A sampling parameter is out of range. ``parameter`` names it, ``value`` holds what was given."""

    def __init__(self, parameter: str, value: Any, requirement: str):
        self.parameter = parameter
        self.value = value
        super().__init__(f"invalid sampling parameter {parameter}={value!r}: {requirement}")


class LogitsError(ConstrainError, ValueError):
    """The logits cannot be sampled from (NaN entries, wrong dtype)."""


# ----------------------------------------------------------------------------------------------------------------
# parameters
# ----------------------------------------------------------------------------------------------------------------


def _is_real(x: Any) -> bool:
    return isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, (bool, np.bool_))


def _is_int(x: Any) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))


@dataclass(frozen=True)
class SamplingParams:
    """Settings of one decoding step, validated on construction.

    ``temperature`` >= 0 (0 = greedy); ``top_k`` >= 0 (0 = off); 0 < ``top_p`` <= 1 (1 = off);
    0 <= ``min_p`` <= 1 (0 = off); ``repetition_penalty`` > 0 (1 = off); ``frequency_penalty`` and
    ``presence_penalty`` finite (0 = off; negative values encourage repetition); ``no_repeat_ngram_size`` >= 0
    (0 = off); ``logit_bias`` maps token id (>= 0) to a bias added to its logit (finite, or ``-inf`` to ban it);
    ``seed`` None (fresh entropy) or an int >= 0.

    An out-of-range value raises :class:`SamplingParamsError` naming the parameter.
    """

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    no_repeat_ngram_size: int = 0
    logit_bias: Mapping[int, float] = field(default_factory=dict)
    seed: int | None = None

    def __post_init__(self) -> None:
        def real(name: str, lo: float | None, hi: float | None, lo_open: bool, requirement: str) -> None:
            v = getattr(self, name)
            if not _is_real(v) or math.isnan(v) or math.isinf(v):
                raise SamplingParamsError(name, v, requirement)
            if lo is not None and (v < lo or (lo_open and v == lo)):
                raise SamplingParamsError(name, v, requirement)
            if hi is not None and v > hi:
                raise SamplingParamsError(name, v, requirement)
            object.__setattr__(self, name, float(v))

        real("temperature", 0.0, None, False, "must be a finite number >= 0 (0 means greedy)")
        real("top_p", 0.0, 1.0, True, "must be a number with 0 < top_p <= 1 (1 disables top-p)")
        real("min_p", 0.0, 1.0, False, "must be a number with 0 <= min_p <= 1 (0 disables min-p)")
        real("repetition_penalty", 0.0, None, True, "must be a finite number > 0 (1 disables it)")
        real("frequency_penalty", None, None, False, "must be a finite number")
        real("presence_penalty", None, None, False, "must be a finite number")
        for name in ("top_k", "no_repeat_ngram_size"):
            v = getattr(self, name)
            if not _is_int(v) or v < 0:
                raise SamplingParamsError(name, v, "must be an int >= 0 (0 disables it)")
            object.__setattr__(self, name, int(v))
        if self.seed is not None:
            if not _is_int(self.seed) or self.seed < 0:
                raise SamplingParamsError("seed", self.seed, "must be None or an int >= 0")
            object.__setattr__(self, "seed", int(self.seed))
        bias = self.logit_bias
        if bias is None:
            bias = {}
        if not isinstance(bias, Mapping):
            raise SamplingParamsError("logit_bias", bias, "must be a mapping token id -> float")
        clean: dict[int, float] = {}
        for k, v in bias.items():
            if not _is_int(k) or k < 0:
                raise SamplingParamsError("logit_bias", bias, f"keys must be token ids (ints >= 0), got {k!r}")
            if not _is_real(v) or math.isnan(v) or v == math.inf:
                raise SamplingParamsError(
                    "logit_bias", bias, f"values must be finite floats or -inf, got {v!r} for token {k}"
                )
            clean[int(k)] = float(v)
        object.__setattr__(self, "logit_bias", MappingProxyType(clean))

    @property
    def greedy(self) -> bool:
        """True when this step takes the arg-max (temperature 0)."""
        return self.temperature == 0.0

    def replace(self, **changes: Any) -> "SamplingParams":
        """A copy with some fields changed (validated again)."""
        return replace(self, **changes)

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> "SamplingParams":
        """One of :data:`PRESETS` (``extraction``, ``code``, ``chat``, ``creative``), with optional overrides."""
        try:
            base = PRESETS[name]
        except KeyError:
            raise SamplingParamsError("preset", name, f"must be one of {sorted(PRESETS)}") from None
        return base.replace(**overrides) if overrides else base

    def __hash__(self) -> int:
        values = tuple(getattr(self, f.name) for f in fields(self) if f.name != "logit_bias")
        return hash((values, frozenset(self.logit_bias.items())))

    def __reduce__(self):  # MappingProxyType does not pickle
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        values["logit_bias"] = dict(values["logit_bias"])
        return (_rebuild_params, (values,))


def _rebuild_params(values: dict) -> SamplingParams:
    return SamplingParams(**values)


#: Presets for common tasks. Start from one and override what you need: ``SamplingParams.preset("chat", seed=0)``.
#:
#: - ``extraction``: greedy (temperature 0). Filling a schema or pulling fields out of a document wants the most
#:   likely value, reproducibly; the structure already guarantees the shape.
#: - ``code``: temperature 0.2, top-p 0.95. Close to greedy, with a little room among near-equivalent spellings.
#: - ``chat``: temperature 0.7, top-p 0.9, repetition penalty 1.05. Natural variety without drifting.
#: - ``creative``: temperature 1.0, min-p 0.05, frequency and presence penalties 0.2. Min-p cuts the implausible
#:   tail relative to the model's confidence, so a full temperature stays coherent; the penalties discourage loops.
PRESETS: Mapping[str, SamplingParams] = MappingProxyType(
    {
        "extraction": SamplingParams(temperature=0.0),
        "code": SamplingParams(temperature=0.2, top_p=0.95),
        "chat": SamplingParams(temperature=0.7, top_p=0.9, repetition_penalty=1.05),
        "creative": SamplingParams(temperature=1.0, min_p=0.05, frequency_penalty=0.2, presence_penalty=0.2),
    }
)


class _Rows:
    """Per-row parameter arrays for a batch."""

    __slots__ = (
        "n", "temperature", "top_k", "top_p", "min_p", "rep", "freq", "pres", "ngram", "bias", "any_penalty",
    )

    def __init__(self, params: "SamplingParams | Sequence[SamplingParams] | None", n: int):
        if params is None:
            params = SamplingParams()
        if isinstance(params, SamplingParams):
            plist = [params]
        else:
            plist = list(params)
            for i, p in enumerate(plist):
                if not isinstance(p, SamplingParams):
                    raise TypeError(f"params[{i}] must be a SamplingParams, got {type(p).__name__}")
            if len(plist) != n:
                raise ShapeError(f"got {len(plist)} SamplingParams for a batch of {n} rows; expected one per row")
        self.n = n

        def col(name: str, dtype: Any) -> np.ndarray:
            a = np.array([getattr(p, name) for p in plist], dtype=dtype)
            return np.broadcast_to(a, (n,)) if len(plist) == 1 else a

        self.temperature = col("temperature", np.float64)
        self.top_k = col("top_k", np.int64)
        self.top_p = col("top_p", np.float64)
        self.min_p = col("min_p", np.float64)
        self.rep = col("repetition_penalty", np.float64)
        self.freq = col("frequency_penalty", np.float64)
        self.pres = col("presence_penalty", np.float64)
        self.ngram = col("no_repeat_ngram_size", np.int64)
        self.bias = [p.logit_bias for p in plist] if len(plist) > 1 else [plist[0].logit_bias] * n
        self.any_penalty = bool(
            np.any(self.rep != 1.0) or np.any(self.freq != 0.0) or np.any(self.pres != 0.0) or np.any(self.ngram > 0)
        )


# ----------------------------------------------------------------------------------------------------------------
# arrays: backend detection and shape handling
# ----------------------------------------------------------------------------------------------------------------


def _torch():
    return sys.modules.get("torch")


def _is_tensor(x: Any) -> bool:
    t = _torch()
    return t is not None and isinstance(x, t.Tensor)


def _as_2d(logits: Any, fn: str) -> tuple[Any, bool]:
    if logits.ndim == 1:
        return logits.reshape(1, -1), True
    if logits.ndim != 2:
        raise ShapeError(f"{fn}: logits must be 1-D (V,) or 2-D (batch, V), got shape {tuple(logits.shape)}")
    return logits, False


def _work_copy(logits: Any, fn: str) -> Any:
    """A float32/float64 2-D working copy of the logits (numpy or torch, same device)."""
    if _is_tensor(logits):
        torch = _torch()
        if not logits.is_floating_point():
            raise LogitsError(f"{fn}: logits must be floating point, got {logits.dtype}")
        dt = torch.float64 if logits.dtype == torch.float64 else torch.float32
        return logits.detach().to(dtype=dt, copy=True)
    a = np.asarray(logits)
    if a.dtype.kind != "f":
        raise LogitsError(f"{fn}: logits must be floating point, got {a.dtype}")
    return a.astype(np.float64 if a.dtype == np.float64 else np.float32, copy=True)


# ----------------------------------------------------------------------------------------------------------------
# history -> (row, token, count)
# ----------------------------------------------------------------------------------------------------------------


def _history_rows(history: Any, n: int, squeeze: bool) -> list[np.ndarray]:
    """History as one int64 array per row."""
    if history is None:
        return [np.zeros(0, dtype=np.int64)] * n
    if _is_tensor(history):
        history = history.detach().cpu().numpy()
    if isinstance(history, np.ndarray):
        if history.ndim == 1 and (squeeze or n == 1):
            history = history[None, :]
        if history.ndim != 2 or history.shape[0] != n:
            raise ShapeError(f"history of shape {history.shape} does not match a batch of {n} rows")
        if history.size and history.dtype.kind not in "iu":
            raise TokenError(f"history must hold integer token ids, got dtype {history.dtype}")
        return [np.asarray(r, dtype=np.int64) for r in history]
    seq = list(history)
    if (squeeze or n == 1) and (len(seq) == 0 or _is_int(seq[0])):
        seq = [seq]
    if len(seq) != n:
        raise ShapeError(f"history has {len(seq)} rows but the batch has {n}")
    out = []
    for r in seq:
        if _is_tensor(r):
            r = r.detach().cpu().numpy()
        a = np.asarray(r)
        if a.size and a.dtype.kind not in "iu":
            raise TokenError(f"history must hold integer token ids, got {a.dtype}")
        out.append(a.astype(np.int64).reshape(-1))
    return out


def _check_ids(ids: np.ndarray, vocab: int, what: str) -> None:
    if ids.size and (ids.min() < 0 or ids.max() >= vocab):
        bad = ids[(ids < 0) | (ids >= vocab)][0]
        raise TokenError(f"{what} holds token id {int(bad)}, out of range for {vocab} logits")


def _penalty_plan(rows: _Rows, history: Any, squeeze: bool, vocab: int):
    """Index arrays for the penalties: unique seen (row, token) pairs with their counts, and the (row, token)
    pairs a no-repeat n-gram bans."""
    n = rows.n
    active = np.flatnonzero((rows.rep != 1.0) | (rows.freq != 0.0) | (rows.pres != 0.0))
    ngram_rows = np.flatnonzero(rows.ngram > 0)
    if history is None:
        return None, None, None, None
    if _is_tensor(history):
        history = history.detach().cpu().numpy()
    rect = isinstance(history, np.ndarray) and (history.ndim == 2 or (history.ndim == 1 and (squeeze or n == 1)))
    if rect:
        h2 = history.reshape(1, -1) if history.ndim == 1 else history
        if h2.shape[0] != n:
            raise ShapeError(f"history of shape {history.shape} does not match a batch of {n} rows")
        if h2.size and h2.dtype.kind not in "iu":
            raise TokenError(f"history must hold integer token ids, got dtype {h2.dtype}")
        h2 = h2.astype(np.int64, copy=False)
        hist = None
    else:
        hist = _history_rows(history, n, squeeze)
    r_idx = t_idx = counts = None
    if active.size:
        if rect:
            sub = h2[active]
            _check_ids(sub, vocab, "history")
            keys = (sub + active[:, None] * np.int64(vocab)).ravel()
        else:
            parts = []
            for r in active:
                h = hist[r]
                if h.size:
                    _check_ids(h, vocab, "history")
                    parts.append(h + np.int64(r) * vocab)
            keys = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
        if keys.size:
            uniq, counts = np.unique(keys, return_counts=True)
            r_idx, t_idx = np.divmod(uniq, vocab)
    banned_r: list[np.ndarray] = []
    banned_t: list[np.ndarray] = []
    for r in ngram_rows:
        size = int(rows.ngram[r])
        h = h2[r] if rect else hist[r]
        if h.size < size:  # no complete n-gram yet: nothing to repeat
            continue
        _check_ids(h, vocab, "history")
        if size > 1:
            windows = np.lib.stride_tricks.sliding_window_view(h, size)
            prefix = h[h.size - size + 1:]
            hit = np.all(windows[:, :-1] == prefix, axis=1)
            toks = np.unique(windows[hit, -1])
        else:
            toks = np.unique(h)
        banned_r.append(np.full(toks.size, r, dtype=np.int64))
        banned_t.append(toks)
    ban = (np.concatenate(banned_r), np.concatenate(banned_t)) if banned_r else None
    return r_idx, t_idx, counts, ban


def _apply_penalties_inplace(z: Any, rows: _Rows, history: Any, squeeze: bool) -> None:
    if not rows.any_penalty:
        return
    r_idx, t_idx, counts, ban = _penalty_plan(rows, history, squeeze, z.shape[1])
    if r_idx is not None:
        rho = rows.rep[r_idx]
        sub = rows.freq[r_idx] * counts + rows.pres[r_idx]
        if _is_tensor(z):
            torch = _torch()
            dev = z.device
            ri = torch.as_tensor(r_idx, device=dev)
            ti = torch.as_tensor(t_idx, device=dev)
            v = z[ri, ti]
            rho_t = torch.as_tensor(rho, dtype=z.dtype, device=dev)
            v = torch.where(v > 0, v / rho_t, v * rho_t)
            z[ri, ti] = v - torch.as_tensor(sub, dtype=z.dtype, device=dev)
        else:
            v = z[r_idx, t_idx]
            with np.errstate(invalid="ignore", over="ignore"):
                v = np.where(v > 0, v / rho, v * rho) - sub
            z[r_idx, t_idx] = v
    if ban is not None:
        if _is_tensor(z):
            torch = _torch()
            z[torch.as_tensor(ban[0], device=z.device), torch.as_tensor(ban[1], device=z.device)] = float("-inf")
        else:
            z[ban[0], ban[1]] = -np.inf


def _apply_bias_inplace(z: Any, rows: _Rows) -> None:
    rr, tt, vv = [], [], []
    seen: dict[int, tuple] = {}
    for r, b in enumerate(rows.bias):
        if not b:
            continue
        key = id(b)
        if key not in seen:
            seen[key] = (np.fromiter(b.keys(), np.int64, len(b)), np.fromiter(b.values(), np.float64, len(b)))
        t, v = seen[key]
        rr.append(np.full(t.size, r, dtype=np.int64))
        tt.append(t)
        vv.append(v)
    if not rr:
        return
    r_idx, t_idx, vals = np.concatenate(rr), np.concatenate(tt), np.concatenate(vv)
    _check_ids(t_idx, z.shape[1], "logit_bias")
    ban = vals == -np.inf  # -inf bans even a +inf logit (adding would give NaN)
    if _is_tensor(z):
        torch = _torch()
        dev = z.device
        ri, ti = torch.as_tensor(r_idx, device=dev), torch.as_tensor(t_idx, device=dev)
        new = z[ri, ti] + torch.as_tensor(np.where(ban, 0.0, vals), dtype=z.dtype, device=dev)
        new = torch.where(torch.as_tensor(ban, device=dev), torch.full_like(new, float("-inf")), new)
        z[ri, ti] = new
    else:
        new = z[r_idx, t_idx] + np.where(ban, 0.0, vals)
        new[ban] = -np.inf
        z[r_idx, t_idx] = new


def _apply_mask_inplace(z: Any, mask: Any, squeeze: bool) -> None:
    if mask is None:
        return
    from constrain.kernels import bitmask as kernels

    if not (_is_tensor(mask) or isinstance(mask, np.ndarray)):
        mask = np.asarray(mask)
    dt = str(mask.dtype)
    if dt.endswith("int32"):
        bm = mask
        if bm.ndim == 1 and squeeze:
            bm = bm.reshape(1, -1)
        kernels.apply_token_bitmask(z, bm)
        return
    if not dt.endswith("bool"):
        raise ShapeError(f"mask must be an int32 packed bitmask or a boolean (batch, V) array, got dtype {dt}")
    if mask.ndim == 1 and squeeze:
        mask = mask.reshape(1, -1)
    if tuple(mask.shape) != tuple(z.shape):
        raise ShapeError(f"boolean mask of shape {tuple(mask.shape)} does not match logits of shape {tuple(z.shape)}")
    if _is_tensor(z):
        torch = _torch()
        m = mask if _is_tensor(mask) else torch.from_numpy(np.asarray(mask))
        z.masked_fill_(~m.to(z.device), float("-inf"))
    else:
        m = mask.detach().cpu().numpy() if _is_tensor(mask) else np.asarray(mask)
        np.copyto(z, -np.inf, where=~m)


# ----------------------------------------------------------------------------------------------------------------
# public transforms (each returns a new array unless inplace=True)
# ----------------------------------------------------------------------------------------------------------------


def apply_penalties(
    logits: Any, history: Any, params: "SamplingParams | Sequence[SamplingParams]", *, inplace: bool = False
) -> Any:
    """Repetition, frequency, presence and no-repeat n-gram penalties, in that order, on raw logits.

    ``history``: per row, the token ids seen so far (a ``(batch, T)`` int array or tensor, or a list of sequences,
    or one sequence for 1-D logits). Returns the penalised logits (a new array unless ``inplace``).
    """
    z, squeeze = _prepare(logits, inplace, "apply_penalties")
    _apply_penalties_inplace(z, _Rows(params, z.shape[0]), history, squeeze)
    return _finish(z, squeeze, logits, inplace)


def apply_logit_bias(logits: Any, params: "SamplingParams | Sequence[SamplingParams]", *, inplace: bool = False) -> Any:
    """Add each row's ``logit_bias`` (a bias of ``-inf`` bans the token)."""
    z, squeeze = _prepare(logits, inplace, "apply_logit_bias")
    _apply_bias_inplace(z, _Rows(params, z.shape[0]))
    return _finish(z, squeeze, logits, inplace)


def apply_structure_mask(logits: Any, mask: Any, *, inplace: bool = False) -> Any:
    """Set disallowed logits to ``-inf``. ``mask``: packed int32 bitmask ``(batch, ceil(V/32))`` (bit ``i % 32`` of
    word ``i // 32`` set = token ``i`` allowed) or boolean ``(batch, V)`` (True = allowed)."""
    z, squeeze = _prepare(logits, inplace, "apply_structure_mask")
    _apply_mask_inplace(z, mask, squeeze)
    return _finish(z, squeeze, logits, inplace)


def _prepare(logits: Any, inplace: bool, fn: str) -> tuple[Any, bool]:
    if inplace:
        z = logits
        if not _is_tensor(z) and not isinstance(z, np.ndarray):
            raise ShapeError(f"{fn}: inplace=True needs a numpy array or torch tensor")
    else:
        z = _work_copy(logits, fn)
    return _as_2d(z, fn)


def _finish(z: Any, squeeze: bool, original: Any, inplace: bool) -> Any:
    if inplace:
        return original
    return z[0] if squeeze else z


def softmax(logits: Any, axis: int = -1) -> Any:
    """Stable softmax (subtracts the maximum); ``+inf`` entries share the mass equally. numpy or torch."""
    if _is_tensor(logits):
        torch = _torch()
        x = logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits
        m = x.amax(dim=axis, keepdim=True)
        x = torch.where(torch.isposinf(m), torch.where(torch.isposinf(x), 0.0, float("-inf")).to(x.dtype), x - m)
        e = torch.exp(x)
        return e / e.sum(dim=axis, keepdim=True)
    x = np.asarray(logits, dtype=np.result_type(logits, np.float32))
    m = np.max(x, axis=axis, keepdims=True)
    with np.errstate(invalid="ignore"):
        x = np.where(np.isposinf(m), np.where(np.isposinf(x), 0.0, -np.inf), x - m)
    e = np.exp(x)
    return e / e.sum(axis=axis, keepdims=True)


def log_softmax(logits: Any, axis: int = -1) -> np.ndarray:
    """Stable log-softmax on numpy, float64. ``-inf`` stays ``-inf`` (a row of only ``-inf`` stays so); ``+inf``
    entries share the mass equally, as in :func:`softmax`."""
    x = np.array(logits, dtype=np.float64)
    m = np.max(x, axis=axis, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        x = np.where(np.isposinf(m), np.where(np.isposinf(x), 0.0, -np.inf), x)
        m = np.where(np.isfinite(m), m, 0.0)
        lse = np.log(np.sum(np.exp(x - m), axis=axis, keepdims=True))
        out = x - m - np.where(np.isfinite(lse), lse, 0.0)
    return np.where(np.isfinite(lse), out, -np.inf)


# ----------------------------------------------------------------------------------------------------------------
# the distribution: temperature, top-k, top-p, min-p, renormalise
# ----------------------------------------------------------------------------------------------------------------


def _row_checks(m: np.ndarray) -> None:
    bad = np.isnan(m)
    if bad.any():
        raise LogitsError(f"logits row {int(np.flatnonzero(bad)[0])} contains NaN")
    dead = m == -np.inf
    if dead.any():
        raise DeadEndError(
            f"no token is allowed in row {int(np.flatnonzero(dead)[0])}: every logit is -inf after the structure "
            "mask and the penalties"
        )


def _thresholds(rows: _Rows, z: Any, V: int, xp: str):
    """Dense, batched support thresholds on tempered, max-subtracted logits ``z`` (keep ``z >= thr``).

    Returns (thr, e) with e = exp(z). numpy (float64) for small vocabularies, torch ops on any device.
    """
    n = z.shape[0]
    k = np.where((rows.top_k > 0) & (rows.top_k < V), rows.top_k, 0)
    need_k = k > 0
    need_p = rows.top_p < 1.0
    with np.errstate(divide="ignore"):
        thr_m = np.where(rows.min_p > 0.0, np.log(np.maximum(rows.min_p, 1e-300)) - MIN_P_RTOL, -np.inf)
    thr_k = np.full(n, -np.inf)
    thr_p = np.full(n, -np.inf)
    torch = _torch() if xp == "torch" else None
    e = torch.exp(z) if xp == "torch" else np.exp(z)
    if not (need_k.any() or need_p.any()):
        return thr_m, e
    # How many of the largest entries each row needs, sorted: k for top-k; for top-p the candidates (all that top-k
    # left, or fewer when min-p is stricter: then either the nucleus crosses p inside the min-p set, or min-p
    # decides and top-p has nothing to add). A row with only top-k that min-p already cuts below k needs none.
    cnt_m = np.full(n, V, dtype=np.int64)
    rows_m = (need_k | need_p) & (rows.min_p > 0.0)
    if rows_m.any():
        if xp == "torch":
            tm = torch.as_tensor(thr_m, dtype=z.dtype, device=z.device)[:, None]
            cnt = (z >= tm).sum(dim=1).cpu().numpy()
        else:
            cnt = (z >= thr_m[:, None]).sum(axis=1)
        cnt_m = np.where(rows_m, cnt, V)
    m_rows = np.where(need_k, k, np.where(need_p, cnt_m, 0))
    m_rows = np.where(need_k & ~need_p & (cnt_m <= k), 0, m_rows)
    free = np.flatnonzero(need_p & (m_rows == V))  # top-p with nothing to bound its candidates
    if xp == "torch" and free.size and V >= _SPARSE_MIN_V:
        m_rows[free] = _torch_nucleus_counts(z, e, free, rows.top_p[free])
    M = int(m_rows.max())
    if M == 0:
        return thr_m, e
    if xp == "torch":
        if M * 8 >= V:
            s = torch.sort(z, dim=1, descending=True).values[:, :M]
        else:
            s = torch.topk(z, M, dim=1, largest=True, sorted=True).values
    else:
        s = -np.sort(-z, axis=1)[:, :M]
    rk = np.flatnonzero(need_k & (m_rows > 0))
    if rk.size:
        if xp == "torch":
            vals = s[torch.as_tensor(rk, device=z.device), torch.as_tensor(k[rk] - 1, device=z.device)]
            thr_k[rk] = vals.double().cpu().numpy()
        else:
            thr_k[rk] = s[rk, k[rk] - 1]
    rp = np.flatnonzero(need_p)
    if rp.size:
        if xp == "torch":
            dev = z.device
            rpt = torch.as_tensor(rp, device=dev)
            tk = torch.as_tensor(thr_k[rp], dtype=z.dtype, device=dev)[:, None]
            total = torch.where(z[rpt] >= tk, e[rpt], 0.0).sum(dim=1, dtype=torch.float64)
            sp = s[rpt]
            es = torch.where(sp >= tk, torch.exp(sp.double()), 0.0)
            cum = torch.cumsum(es, dim=1)
            target = torch.as_tensor(rows.top_p[rp], dtype=torch.float64, device=dev) * total * (1.0 - TOP_P_RTOL)
            hit = cum >= target[:, None]
            found = hit.any(dim=1)
            j = hit.to(torch.int8).argmax(dim=1)
            val = sp.gather(1, j[:, None])[:, 0].double()
            thr_p[rp] = torch.where(found, val, float("-inf")).cpu().numpy()
            lost = rp[~found.cpu().numpy() & (m_rows[rp] < V) & ~need_k[rp] & (rows.min_p[rp] <= 0.0)]
            for r in lost:  # probing fell short by rounding (not expected): the full sort for that row
                sr = torch.sort(z[r], descending=True).values
                c = torch.cumsum(torch.exp(sr.double()), 0)
                j = int(torch.searchsorted(c, c[-1] * float(rows.top_p[r]) * (1.0 - TOP_P_RTOL)))
                thr_p[r] = float(sr[min(j, V - 1)])
        else:
            tk = thr_k[rp][:, None]
            total = np.where(z[rp] >= tk, e[rp], 0.0).sum(axis=1)
            sp = s[rp]
            cum = np.cumsum(np.where(sp >= tk, np.exp(sp), 0.0), axis=1)
            target = rows.top_p[rp] * total * (1.0 - TOP_P_RTOL)
            hit = cum >= target[:, None]
            found = hit.any(axis=1)
            j = hit.argmax(axis=1)
            thr_p[rp] = np.where(found, sp[np.arange(rp.size), j], -np.inf)
    return np.maximum(np.maximum(thr_m, thr_k), thr_p), e


def _torch_nucleus_counts(z: Any, e: Any, rows_idx: np.ndarray, top_p: np.ndarray) -> np.ndarray:
    """For top-p rows with no other bound (torch ops): how many of the largest entries hold the nucleus crossing.

    Probes cuts on the tempered log-weights, largest first; a row's count is the number of entries above the first
    cut whose mass reaches ``top_p`` of the row (with a small margin). Only these entries need sorting
    (``torch.topk``) instead of the whole row.
    """
    torch = _torch()
    V = z.shape[1]
    idx = torch.as_tensor(rows_idx, device=z.device)
    zf, ef = z[idx], e[idx]
    need = torch.as_tensor(top_p, dtype=torch.float64, device=z.device) * ef.sum(dim=1, dtype=torch.float64)
    need *= 1.0 + 1e-5
    chosen = np.full(rows_idx.size, V, dtype=np.int64)
    open_rows = np.arange(rows_idx.size)
    for c in _NUCLEUS_CUTS:
        o = torch.as_tensor(open_rows, device=z.device)
        zo, eo = zf[o], ef[o]
        sel = zo >= (c - 1e-3)
        mass = torch.where(sel, eo, 0.0).sum(dim=1, dtype=torch.float64)
        ok = (mass >= need[o]).cpu().numpy()
        if ok.any():
            chosen[open_rows[ok]] = sel[torch.as_tensor(np.flatnonzero(ok), device=z.device)].sum(dim=1).cpu().numpy()
            open_rows = open_rows[~ok]
            if open_rows.size == 0:
                break
    return chosen


def _probs_dense_numpy(z: np.ndarray, rows: _Rows) -> np.ndarray:
    """Small vocabularies: every row at once, in float64. ``z``: penalised, masked logits (2-D)."""
    z = z.astype(np.float64)
    n, V = z.shape
    m = z.max(axis=1)
    _row_checks(m)
    for r in np.flatnonzero(m == np.inf):
        z[r] = np.where(z[r] == np.inf, 0.0, -np.inf)
        m[r] = 0.0
    greedy = rows.temperature == 0.0
    greedy_ids = z[greedy].argmax(axis=1) if greedy.any() else None
    z -= m[:, None]
    z /= np.where(greedy, 1.0, rows.temperature)[:, None]
    thr, e = _thresholds(rows, z, V, "numpy")
    act = thr > -np.inf
    if act.all():
        e *= z >= thr[:, None]
    elif act.any():
        ra = np.flatnonzero(act)
        e[ra] *= z[ra] >= thr[ra, None]
    e /= e.sum(axis=1, keepdims=True)
    if greedy_ids is not None:
        g = np.flatnonzero(greedy)
        e[g] = 0.0
        e[g, greedy_ids] = 1.0
    return e


# Vocabularies at least this wide are processed row by row on candidate sets (no full sort).
_SPARSE_MIN_V = 4096
# Candidate cuts (tempered log-weight relative to the maximum) probed, by bisection, for a top-p-only row.
_NUCLEUS_CUTS = (-1.0, -2.0, -3.0, -4.0, -6.0, -8.0, -10.0, -12.0, -16.0, -20.0, -24.0, -32.0, -48.0, -64.0)


def _nucleus_candidates(z: np.ndarray, y: np.ndarray, e: np.ndarray, target: float, y_of: Any):
    """Tokens ``y >= c`` for the largest probed cut ``c`` whose mass reaches ``target`` (so the nucleus crossing is
    among them), with their float64 ``y``. Probing uses a float32 copy of ``y``; the cut is loosened a little so
    float32 rounding cannot drop a token. ``y``, ``e``: the row's float32 tempered log-weights and weights."""
    need = target * (1.0 + 1e-5)
    cuts = _NUCLEUS_CUTS
    lo, hi = 0, len(cuts)  # cuts[hi] stands for "everything"
    while lo < hi:
        mid = (lo + hi) // 2
        # a dot product with the boolean selection: much faster than boolean indexing on scattered hits
        if float(np.dot(e, (y >= np.float32(cuts[mid] - 1e-3)).view(np.uint8).astype(np.float32))) >= need:
            hi = mid
        else:
            lo = mid + 1
    if hi == len(cuts):
        D = np.flatnonzero(z > -np.inf)
    else:
        D = np.flatnonzero(y >= np.float32(cuts[hi] - 1e-3))
    return D, y_of(D)


def _z_cut(z: np.ndarray, value: float) -> Any:
    """A scalar of z's dtype <= value (so ``z >= cut`` selects a superset of ``z >= value``)."""
    c = z.dtype.type(value)
    if c > value:
        c = np.nextafter(c, z.dtype.type(-np.inf))
    return c


def _row_support(z: np.ndarray, m: float, T: float, k: int, p: float, a: float):
    """Support of one row of a wide vocabulary, on candidate sets.

    ``z``: penalised, masked logits (1-D, float32/64), not modified; ``m`` its maximum. Returns ``(ids, weights)``
    (weights float64, unnormalised, > 0 unless they underflow) or ``None`` when the support is every finite token
    (no filter).
    The tempered log-weights are ``y = (z - max) / T``, computed in float64 on candidates; the thresholds are the
    same as in the dense path.
    """
    V = z.shape[0]
    if m == np.inf:
        ids = np.flatnonzero(z == np.inf)
        if T == 0.0:
            ids = ids[:1]
        return ids, np.ones(ids.size)
    if T == 0.0:
        return np.array([int(z.argmax())]), np.ones(1)
    k = k if 0 < k < V else 0
    if not k and p >= 1.0 and a <= 0.0:
        return None
    slack = 1e-9 * (abs(m) + 1.0)

    def y_of(ids: np.ndarray) -> np.ndarray:
        return (z[ids].astype(np.float64) - m) / T

    def select(y_min: float) -> np.ndarray:
        return np.flatnonzero(z >= _z_cut(z, m + y_min * T - slack))

    thr_m = math.log(a) - MIN_P_RTOL if a > 0.0 else -np.inf
    D = yD = None  # candidates, their y
    if a > 0.0:
        D = select(thr_m)
        yD = y_of(D)
        keep = yD >= thr_m
        D, yD = D[keep], yD[keep]
    total = None
    if k:
        if D is not None and D.size > k:
            kth = np.partition(yD, D.size - k)[D.size - k]
            keep = yD >= kth
            D, yD = D[keep], yD[keep]
            total = np.exp(yD).sum()
        elif D is None or p < 1.0:
            kth_z = np.partition(z, V - k)[V - k]
            K = np.flatnonzero(z >= kth_z)
            yK = y_of(K)
            total = np.exp(yK).sum()
            if D is None:
                D, yD = K, yK
    if p < 1.0:
        target = p * (1.0 - TOP_P_RTOL)
        y32 = e32 = None
        if total is None:  # top-k is off: the mass of the whole row (float32 exp, float64 sum)
            y32 = ((z - z.dtype.type(m)) / z.dtype.type(T)).astype(np.float32, copy=False)
            e32 = np.exp(y32)
            total = float(e32.sum(dtype=np.float64))
        target *= total
        if D is None:
            D, yD = _nucleus_candidates(z, y32, e32, target, y_of)
        ys = -np.sort(-yD)
        cum = np.cumsum(np.exp(ys))
        j = int(np.searchsorted(cum, target, side="left"))
        if j >= ys.size and a <= 0.0 and not k:  # float32 probing fell short by rounding: use every token
            D = np.flatnonzero(z > -np.inf)
            yD = y_of(D)
            ys = -np.sort(-yD)
            j = min(int(np.searchsorted(np.cumsum(np.exp(ys)), target, side="left")), ys.size - 1)
        if j < ys.size:  # else min-p is stricter than the nucleus: it decides
            keep = yD >= ys[j]
            D, yD = D[keep], yD[keep]
    return D, np.exp(yD)


def _probs_numpy(z: np.ndarray, rows: _Rows) -> tuple[np.ndarray, list | None]:
    """Probabilities from penalised, masked logits (``z`` may be overwritten).

    Returns ``(probs, supports)``: ``supports[r]`` is ``(ids, cdf)`` for a row whose support was found on a
    candidate set (to draw without scanning the row), else None; ``supports`` is None for the dense path.
    """
    n, V = z.shape
    if V < _SPARSE_MIN_V:
        return _probs_dense_numpy(z, rows).astype(z.dtype, copy=False), None
    m = z.max(axis=1)
    _row_checks(m)
    out = np.zeros((n, V), dtype=z.dtype)
    supports: list = [None] * n
    for r in range(n):
        res = _row_support(z[r], float(m[r]), float(rows.temperature[r]), int(rows.top_k[r]), float(rows.top_p[r]),
                           float(rows.min_p[r]))
        if res is None:
            row = z[r]
            row -= m[r]
            if rows.temperature[r] != 1.0:
                row /= row.dtype.type(rows.temperature[r])
            np.exp(row, out=out[r])
            out[r] /= out[r].sum(dtype=np.float64)
            continue
        ids, w = res
        cdf = np.cumsum(w)
        out[r, ids] = w / cdf[-1]
        supports[r] = (ids, cdf)
    return out, supports


def _probs_torch(z: Any, rows: _Rows) -> Any:
    torch = _torch()
    n, V = z.shape
    m = z.amax(dim=1)
    m_np = m.double().cpu().numpy()
    if np.isnan(m_np).any():
        raise LogitsError(f"logits row {int(np.flatnonzero(np.isnan(m_np))[0])} contains NaN")
    if (m_np == -np.inf).any():
        raise DeadEndError(f"no token is allowed in row {int(np.flatnonzero(m_np == -np.inf)[0])}: every logit is "
                           "-inf after the structure mask and the penalties")
    posinf = m_np == np.inf
    if posinf.any():
        pr = torch.as_tensor(np.flatnonzero(posinf), device=z.device)
        zz = z[pr]
        z[pr] = torch.where(torch.isposinf(zz), 0.0, float("-inf")).to(z.dtype)
        m = torch.where(torch.isposinf(m), torch.zeros_like(m), m)
    greedy = rows.temperature == 0.0
    greedy_ids = z[torch.as_tensor(np.flatnonzero(greedy), device=z.device)].argmax(dim=1) if greedy.any() else None
    temps = np.where(greedy, 1.0, rows.temperature)
    z -= m[:, None]
    if np.any(temps != 1.0):
        z /= torch.as_tensor(temps, dtype=z.dtype, device=z.device)[:, None]
    thr, e = _thresholds(rows, z, V, "torch")
    if np.any(thr > -np.inf):
        thr_t = torch.as_tensor(thr, dtype=z.dtype, device=z.device)[:, None]
        e = torch.where(z >= thr_t, e, 0.0)
    e /= e.sum(dim=1, keepdim=True)
    if greedy_ids is not None:
        g = torch.as_tensor(np.flatnonzero(greedy), device=z.device)
        e[g] = 0.0
        e[g, greedy_ids] = 1.0
    return e


def _use_torch_ops(logits: Any, backend: str) -> bool:
    if backend not in ("auto", "numpy", "torch"):
        raise ValueError(f"backend must be 'auto', 'numpy' or 'torch', got {backend!r}")
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
        if (bool(z.isnan().any()) if _is_tensor(z) else np.isnan(z.max())):
            raise LogitsError(f"{fn}: logits contain NaN")
        _apply_mask_inplace(z, mask, squeeze)
    if _is_tensor(z):
        return _probs_torch(z, rows), None, squeeze, to_out
    probs, supports = _probs_numpy(z, rows)
    return probs, supports, squeeze, to_out


def next_token_probs(
    logits: Any,
    params: "SamplingParams | Sequence[SamplingParams] | None" = None,
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


def sample_from_probs(probs: Any, rng: "np.random.Generator | int | None" = None) -> Any:
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
        params: "SamplingParams | Sequence[SamplingParams] | None" = None,
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
            self._row_rngs = {
                i: np.random.default_rng(p.seed) for i, p in enumerate(self.params) if p.seed is not None
            }

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

    def probs(self, logits: Any, history: Any = None, mask: Any = None) -> Any:
        """The filtered, renormalised distribution of each row (see :func:`next_token_probs`)."""
        return next_token_probs(logits, self.params, history=history, mask=mask, backend=self.backend)

    def sample(self, logits: Any, history: Any = None, mask: Any = None) -> Any:
        """One token id per row: int64 array / tensor ``(batch,)``, or a scalar for 1-D logits."""
        P, supports, squeeze, to_out = _pipeline(logits, self.params, history, mask, self.backend, "Sampler.sample")
        ids = to_out(_draw(P, supports, self._uniforms(P.shape[0])))
        return ids[0] if squeeze else ids

    __call__ = sample


def sample(
    logits: Any,
    params: "SamplingParams | Sequence[SamplingParams] | None" = None,
    *,
    history: Any = None,
    mask: Any = None,
    rng: "np.random.Generator | int | None" = None,
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
