"""Logits transforms that keep the shape: penalties, logit bias, the structure mask, softmax.

Each works in place on a private copy (or on the caller's array with ``inplace=True``), on numpy arrays and torch
tensors alike; the order in which a decoding step applies them is fixed in :mod:`constrain.decoding.sampling`.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

from constrain.decoding.params import SamplingParams, _is_int, _Rows
from constrain.errors import LogitsError, ShapeError, TokenError

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
            prefix = h[h.size - size + 1 :]
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
    logits: Any, history: Any, params: SamplingParams | Sequence[SamplingParams], *, inplace: bool = False
) -> Any:
    """Repetition, frequency, presence and no-repeat n-gram penalties, in that order, on raw logits.

    ``history``: per row, the token ids seen so far (a ``(batch, T)`` int array or tensor, or a list of sequences,
    or one sequence for 1-D logits). Returns the penalised logits (a new array unless ``inplace``).
    """
    z, squeeze = _prepare(logits, inplace, "apply_penalties")
    _apply_penalties_inplace(z, _Rows(params, z.shape[0]), history, squeeze)
    return _finish(z, squeeze, logits, inplace)


def apply_logit_bias(logits: Any, params: SamplingParams | Sequence[SamplingParams], *, inplace: bool = False) -> Any:
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


def entropy(logits: Any, axis: int = -1) -> np.ndarray:
    """Shannon entropy in nats of ``softmax(logits)``, float64 on numpy (a row's confidence: 0 when one token has
    all the mass, ``log n`` when ``n`` tokens share it equally). ``-inf`` entries hold no mass; a row of only
    ``-inf`` has entropy 0. Passing log-probabilities gives the same result, as log-softmax is idempotent."""
    lp = log_softmax(logits.detach().cpu().numpy() if _is_tensor(logits) else logits, axis=axis)
    with np.errstate(invalid="ignore"):
        terms = np.where(np.isfinite(lp), np.exp(lp) * lp, 0.0)
    return -np.sum(terms, axis=axis)
