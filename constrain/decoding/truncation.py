"""Top-k, top-p and min-p: the support each row keeps, and its renormalised probabilities.

On numpy, a large row is cut first at a few logit thresholds below its maximum, so the nucleus is found without
sorting the whole vocabulary; torch rows use torch ops on their device.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from constrain.decoding.params import MIN_P_RTOL, TOP_P_RTOL, _Rows
from constrain.decoding.transforms import _torch
from constrain.errors import DeadEndError, LogitsError

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
        res = _row_support(
            z[r],
            float(m[r]),
            float(rows.temperature[r]),
            int(rows.top_k[r]),
            float(rows.top_p[r]),
            float(rows.min_p[r]),
        )
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
        raise DeadEndError(
            f"no token is allowed in row {int(np.flatnonzero(m_np == -np.inf)[0])}: every logit is "
            "-inf after the structure mask and the penalties"
        )
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
