"""Bitmask <-> logits kernels (numba), batched.

A token bitmask is an int32 array of shape ``(batch, ceil(V / 32))``: bit ``i % 32`` of word ``i // 32`` set means
token ``i`` is allowed (so a word with bit 31 set is negative, and a word of ``-1`` allows all 32 of its tokens).
The caller owns the bitmask, as in vLLM and xgrammar; :func:`allocate_token_bitmask` makes one.

:func:`apply_token_bitmask` writes ``-inf`` into the disallowed logits, in place:

- numpy arrays and CPU torch tensors go through a numba kernel on an unsigned-integer view of the logits (it
  writes the bit pattern of ``-inf``, so float16 / bfloat16 / float32 / float64 share one kernel and no float
  arithmetic is done). CPU tensors are viewed as numpy without a copy.
- tensors on another device (CUDA) go through :func:`apply_token_bitmask_torch`, pure torch ops on that device.

Every shape, dtype and index is checked in Python before a kernel runs, so a bad argument raises
:class:`~constrain.errors.ShapeError` and never reaches compiled code. Importing this module does not import torch.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Sequence
from typing import Any

import numba
import numpy as np

from constrain.errors import ShapeError

# Bit patterns of -inf, by element size in bytes (IEEE half / single / double) and for bfloat16.
_NEG_INF_BITS = {
    "float16": np.uint16(0xFC00),
    "bfloat16": np.uint16(0xFF80),
    "float32": np.uint32(0xFF800000),
    "float64": np.uint64(0xFFF0000000000000),
}
_UINT_OF = {"float16": np.uint16, "bfloat16": np.uint16, "float32": np.uint32, "float64": np.uint64}
_NUMPY_FLOATS = {np.dtype(np.float16): "float16", np.dtype(np.float32): "float32", np.dtype(np.float64): "float64"}
_INT32 = np.dtype(np.int32)

# Batches with at least this many logits (and 2+ rows) are split over a few threads (the kernels release the GIL).
_PARALLEL_MIN_ELEMENTS = 1 << 20


# ----------------------------------------------------------------------------------------------------------------
# numba kernels. Callers guarantee every index is in bounds (checked in Python first).
# ----------------------------------------------------------------------------------------------------------------


@numba.njit(cache=True, nogil=True)
def _apply_kernel(buf, offsets, bitmask, lo, hi, neg, n_full, tail, col_stride):  # pragma: no cover - compiled
    """For k in [lo, hi): element i of logits row k is buf[offsets[k] + i * col_stride]; set it to ``neg`` where
    bit i of bitmask[k] is clear, for i < 32 * n_full + tail.

    ``buf`` is a flat, contiguous unsigned-integer view of the logits' memory and ``neg`` the -inf bit pattern of
    that width. Words of -1 (all allowed) are skipped.
    """
    n = n_full * 32 + tail
    for k in range(lo, hi):
        o = offsets[k]
        bm = bitmask[k]
        if col_stride == 1:
            row = buf[o : o + n]
            for w in range(n_full):
                word = bm[w]
                if word == -1:
                    continue
                base = w * 32
                # branch-free select over a whole word: vectorises
                for b in range(32):
                    row[base + b] = row[base + b] if (word >> b) & 1 else neg
            if tail > 0:
                word = bm[n_full]
                base = n_full * 32
                for b in range(tail):
                    if not (word >> b) & 1:
                        row[base + b] = neg
        else:
            # strided rows: write only the disallowed entries (compiles to masked scatters)
            for w in range(n_full + (1 if tail > 0 else 0)):
                word = bm[w]
                if word == -1:
                    continue
                nb = 32 if w < n_full else tail
                base = o + w * 32 * col_stride
                for b in range(nb):
                    if not (word >> b) & 1:
                        buf[base + b * col_stride] = neg


@numba.njit(cache=True, nogil=True)
def _unpack_kernel(bitmask, out, n_full, tail):  # pragma: no cover - compiled
    """out[r, i] = bit i of bitmask[r] (out: uint8, (batch, 32 * n_full + tail))."""
    for r in range(out.shape[0]):
        bm = bitmask[r]
        row = out[r]
        for w in range(n_full + (1 if tail > 0 else 0)):
            word = bm[w]
            base = w * 32
            for b in range(32 if w < n_full else tail):
                row[base + b] = (word >> b) & 1


@numba.njit(cache=True, nogil=True)
def _pack_kernel(allowed, out, n_full, tail):  # pragma: no cover - compiled
    """out[r, w] = 32 bits of allowed[r, 32w : 32w + 32] (allowed: uint8 0/1); padding bits stay 0."""
    for r in range(allowed.shape[0]):
        src = allowed[r]
        dst = out[r]
        for w in range(n_full + (1 if tail > 0 else 0)):
            base = w * 32
            acc = np.int64(0)
            for b in range(32 if w < n_full else tail):
                acc |= np.int64(src[base + b] != 0) << b
            dst[w] = np.int32(acc - ((acc >> 31) << 32))  # to signed 32-bit (a tail word has bit 31 clear)


@numba.njit(cache=True, nogil=True)
def _popcount_kernel(row, n_full, tail):  # pragma: no cover - compiled
    total = 0
    for w in range(n_full + (1 if tail > 0 else 0)):
        x = np.int64(row[w]) & 0xFFFFFFFF
        if w == n_full:
            x &= (np.int64(1) << tail) - 1
        x = x - ((x >> 1) & 0x55555555)
        x = (x & 0x33333333) + ((x >> 2) & 0x33333333)
        x = (x + (x >> 4)) & 0x0F0F0F0F
        total += ((x * 0x01010101) & 0xFFFFFFFF) >> 24
    return total


@numba.njit(cache=True, nogil=True)
def _ids_kernel(row, n_full, tail, out):  # pragma: no cover - compiled
    n = 0
    for w in range(n_full + (1 if tail > 0 else 0)):
        word = row[w]
        if word == 0:
            continue
        nb = 32 if w < n_full else tail
        base = w * 32
        for b in range(nb):
            if (word >> b) & 1:
                out[n] = base + b
                n += 1
    return n


# ----------------------------------------------------------------------------------------------------------------
# helpers
# ----------------------------------------------------------------------------------------------------------------


def _is_tensor(x: Any) -> bool:
    torch = sys.modules.get("torch")  # if torch is not imported, x cannot be a tensor
    return torch is not None and isinstance(x, torch.Tensor)


def _shape(x: Any) -> tuple[int, ...]:
    return tuple(x.shape)


def _dtype_name(x: Any) -> str:
    return str(x.dtype).replace("torch.", "")


_torch_float_names: dict[Any, str] = {}


def _torch_float_name(torch: Any, dtype: Any) -> str | None:
    """ "float16" / "bfloat16" / "float32" / "float64" for a torch float dtype, else None."""
    if not _torch_float_names:
        _torch_float_names.update(
            {torch.float16: "float16", torch.bfloat16: "bfloat16", torch.float32: "float32", torch.float64: "float64"}
        )
    return _torch_float_names.get(dtype)


def _check_vocab_size(vocab_size: Any, fn: str) -> int:
    if isinstance(vocab_size, (bool, np.bool_)) or not isinstance(vocab_size, (int, np.integer)):
        raise ShapeError(f"{fn}: vocab_size must be an int, got {type(vocab_size).__name__} {vocab_size!r}")
    if vocab_size < 0:
        raise ShapeError(f"{fn}: vocab_size must be >= 0, got {vocab_size}")
    return int(vocab_size)


def bitmask_width(vocab_size: int) -> int:
    """Number of int32 words for ``vocab_size`` tokens: ``ceil(vocab_size / 32)``."""
    return (_check_vocab_size(vocab_size, "bitmask_width") + 31) // 32


def allocate_token_bitmask(batch_size: int, vocab_size: int) -> np.ndarray:
    """A fresh ``(batch_size, ceil(vocab_size / 32))`` int32 bitmask with every token allowed (all words -1)."""
    if isinstance(batch_size, (bool, np.bool_)) or not isinstance(batch_size, (int, np.integer)) or batch_size < 0:
        raise ShapeError(f"allocate_token_bitmask: batch_size must be an int >= 0, got {batch_size!r}")
    width = (_check_vocab_size(vocab_size, "allocate_token_bitmask") + 31) // 32
    return np.full((int(batch_size), width), -1, dtype=np.int32)


def _bitmask_to_numpy(bitmask: Any, fn: str) -> np.ndarray:
    """The bitmask as a numpy int32 array (1-D or 2-D, as given); torch tensors are viewed (CPU) or copied."""
    if isinstance(bitmask, np.ndarray):
        if bitmask.dtype != _INT32:
            raise ShapeError(f"{fn}: bitmask must have dtype int32, got {bitmask.dtype} (shape {_shape(bitmask)})")
        return bitmask
    torch = sys.modules.get("torch")
    if torch is None or not isinstance(bitmask, torch.Tensor):
        raise ShapeError(f"{fn}: bitmask must be a numpy array or torch tensor of int32, got {type(bitmask).__name__}")
    if bitmask.dtype != torch.int32:
        raise ShapeError(f"{fn}: bitmask must have dtype int32, got {_dtype_name(bitmask)} (shape {_shape(bitmask)})")
    arr = bitmask.detach() if bitmask.requires_grad else bitmask
    if arr.device.type != "cpu":
        arr = arr.cpu()
    return arr.numpy()


def _check_apply(
    logits_shape: tuple[int, ...],
    bitmask_shape: tuple[int, ...],
    indices: Any,
    fn: str,
) -> tuple[int, int, int, np.ndarray | None]:
    """Validate shapes for an apply; return (logit rows, V, bitmask rows, rows or None).

    ``rows`` (int64) maps bitmask row k to logits row rows[k]; None means row k -> row k.
    """
    if len(logits_shape) not in (1, 2):
        raise ShapeError(
            f"{fn}: logits must be 2-D (batch, vocab) or 1-D (vocab,), got {len(logits_shape)}-D shape {logits_shape}"
        )
    if len(bitmask_shape) not in (1, 2):
        raise ShapeError(
            f"{fn}: bitmask must be 2-D (batch, ceil(vocab/32)) or 1-D (ceil(vocab/32),), "
            f"got {len(bitmask_shape)}-D shape {bitmask_shape}"
        )
    n_rows = 1 if len(logits_shape) == 1 else logits_shape[0]
    vocab = logits_shape[-1]
    bm_rows = 1 if len(bitmask_shape) == 1 else bitmask_shape[0]
    width = bitmask_shape[-1]
    need = (vocab + 31) // 32
    if width < need:
        raise ShapeError(
            f"{fn}: logits of shape {logits_shape} have {vocab} columns but bitmask of shape {bitmask_shape} "
            f"covers only {32 * width} token ids; expected bitmask width >= {need} (ceil({vocab}/32)), got {width}"
        )
    if indices is None:
        if bm_rows != n_rows:
            raise ShapeError(
                f"{fn}: bitmask has {bm_rows} rows (shape {bitmask_shape}) but logits have {n_rows} "
                f"(shape {logits_shape}); expected bitmask shape ({n_rows}, {width}), or pass indices"
            )
        return n_rows, vocab, bm_rows, None
    rows = _indices_to_numpy(indices, fn)
    if rows.shape[0] != bm_rows:
        raise ShapeError(
            f"{fn}: indices has {rows.shape[0]} entries but bitmask has {bm_rows} rows (shape {bitmask_shape}); "
            f"expected one logits row index per bitmask row"
        )
    if rows.shape[0] and (rows.min() < 0 or rows.max() >= n_rows):
        bad = rows[(rows < 0) | (rows >= n_rows)][0]
        raise ShapeError(
            f"{fn}: indices entry {int(bad)} is out of range for logits of shape {logits_shape}; "
            f"expected 0 <= index < {n_rows}"
        )
    return n_rows, vocab, bm_rows, rows


def _indices_to_numpy(indices: Any, fn: str) -> np.ndarray:
    if _is_tensor(indices):
        indices = indices.detach().cpu().numpy()
    try:
        arr = np.asarray(indices)
    except Exception as exc:  # ragged lists and the like
        raise ShapeError(f"{fn}: indices must be a 1-D sequence of ints, got {type(indices).__name__}") from exc
    if arr.ndim != 1:
        raise ShapeError(f"{fn}: indices must be 1-D, got shape {arr.shape}")
    if arr.size == 0:
        return np.zeros(0, dtype=np.int64)
    if arr.dtype == np.bool_ or not np.issubdtype(arr.dtype, np.integer):
        raise ShapeError(f"{fn}: indices must be integers, got dtype {arr.dtype}")
    return arr.astype(np.int64, copy=False)


def _has_duplicates(rows: np.ndarray | None) -> bool:
    return rows is not None and rows.shape[0] > 1 and np.unique(rows).shape[0] != rows.shape[0]


# --- a small persistent pool for big batches (numba kernels release the GIL) -------------------------------------

_pool_lock = threading.Lock()
_pool = None


def _n_threads() -> int:
    env = os.environ.get("CONSTRAIN_KERNEL_THREADS")
    if env:
        try:
            return max(1, int(env))
        except ValueError:
            pass
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        n = os.cpu_count() or 1
    return max(1, min(n, 8))


def _get_pool(n_workers: int):
    global _pool
    with _pool_lock:
        if _pool is None or _pool._max_workers < n_workers:
            from concurrent.futures import ThreadPoolExecutor

            old, _pool = _pool, ThreadPoolExecutor(max_workers=n_workers, thread_name_prefix="constrain-kernels")
            if old is not None:
                old.shutdown(wait=False)
        return _pool


def _forget_pool_in_child() -> None:  # the pool's threads do not survive a fork
    global _pool, _pool_lock
    _pool = None
    _pool_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool_in_child)


def _flat_layout(u: np.ndarray) -> tuple[np.ndarray, int, int, int] | None:
    """(flat, origin, row_stride, col_stride) with u[r, i] == flat[origin + r * row_stride + i * col_stride] and
    ``flat`` a contiguous 1-D view of the memory ``u`` spans; None if the strides are not whole elements."""
    n_rows, vocab = u.shape
    if u.flags.c_contiguous:
        return u.reshape(-1), 0, vocab, 1
    size = u.itemsize
    s0, s1 = u.strides
    if s0 % size or s1 % size or not u.flags.aligned:
        return None
    rs = s0 // size if n_rows > 1 else 0
    cs = s1 // size if vocab > 1 else 1
    low = min(0, (n_rows - 1) * rs) + min(0, (vocab - 1) * cs)
    high = max(0, (n_rows - 1) * rs) + max(0, (vocab - 1) * cs)
    r0 = n_rows - 1 if rs < 0 else 0
    c0 = vocab - 1 if cs < 0 else 0
    first = u[r0 : r0 + 1, c0 : c0 + 1]  # the element at the lowest address
    flat = np.lib.stride_tricks.as_strided(first, shape=(high - low + 1,), strides=(size,))
    return flat, -low, rs, cs


def _run_apply(u: np.ndarray, bm: np.ndarray, rows: np.ndarray | None, neg: Any, vocab: int) -> None:
    """Mask logits row ``rows[k]`` (``k`` if rows is None) of the 2-D unsigned view ``u`` with bitmask row ``k``.

    Everything is checked already; ``bm`` is 2-D C-contiguous int32 and ``rows`` has no repeats.
    """
    layout = _flat_layout(u)
    if layout is None:  # strides that are not whole elements (hand-made views): work on a copy, write back
        tmp = np.ascontiguousarray(u)
        _run_apply(tmp, bm, rows, neg, vocab)
        u[...] = tmp
        return
    flat, origin, rs, cs = layout
    count = bm.shape[0]
    if rows is None:
        offsets = np.arange(origin, origin + count * rs, rs, dtype=np.int64) if rs else np.full(count, origin)
    else:
        offsets = origin + rows * rs
    n_full, tail = divmod(vocab, 32)
    n_threads = 1
    if count >= 2 and count * vocab >= _PARALLEL_MIN_ELEMENTS:
        # rows must not share elements across threads: only the usual row-major / column-major layouts
        if rs != 0 and (abs(rs) >= vocab * abs(cs) or abs(cs) >= u.shape[0] * abs(rs)):
            n_threads = min(_n_threads(), count)
    if n_threads <= 1:
        _apply_kernel(flat, offsets, bm, 0, count, neg, n_full, tail, cs)
        return
    cuts = [count * i // n_threads for i in range(n_threads + 1)]
    pool = _get_pool(n_threads - 1)
    futures = [
        pool.submit(_apply_kernel, flat, offsets, bm, cuts[i], cuts[i + 1], neg, n_full, tail, cs)
        for i in range(1, n_threads)
    ]
    try:
        _apply_kernel(flat, offsets, bm, cuts[0], cuts[1], neg, n_full, tail, cs)
    finally:
        for f in futures:
            f.result()


# ----------------------------------------------------------------------------------------------------------------
# public API
# ----------------------------------------------------------------------------------------------------------------


def _uint_view_of_tensor(torch: Any, logits: Any, name: str) -> np.ndarray | None:
    """A numpy unsigned-int view of a CPU tensor's memory (no copy), or None if torch will not hand one out."""
    t = logits.detach() if logits.requires_grad else logits
    try:
        arr = t.view(torch.int16).numpy() if name == "bfloat16" else t.numpy()
    except (RuntimeError, TypeError, ValueError):
        return None  # e.g. tensor subclasses without storage: use torch ops instead
    return arr.view(_UINT_OF[name])


def apply_token_bitmask(logits: Any, bitmask: Any, *, indices: Sequence[int] | None = None) -> None:
    """Set every disallowed logit to ``-inf``, in place.

    ``logits``: numpy float16/float32/float64 array or torch float16/bfloat16/float32/float64 tensor, shape
    ``(batch, V)`` or ``(V,)``, any strides. ``bitmask``: int32 (numpy or torch), shape ``(rows, W)`` or ``(W,)``
    with ``32 * W >= V``; bits for ids ``>= V`` are ignored. Without ``indices`` the bitmask has one row per logits
    row; with ``indices``, bitmask row ``k`` applies to logits row ``indices[k]`` (repeats allowed: all apply).

    CPU data is masked by a numba kernel without a copy; tensors on another device use
    :func:`apply_token_bitmask_torch`. Raises :class:`ShapeError` for a wrong type, dtype or shape.
    """
    fn = "apply_token_bitmask"
    if isinstance(logits, np.ndarray):
        name = _NUMPY_FLOATS.get(logits.dtype)
        if name is None:
            raise ShapeError(
                f"{fn}: logits must be a float16, float32 or float64 array, got {logits.dtype} (shape {_shape(logits)})"
            )
        if not logits.flags.writeable:
            raise ShapeError(f"{fn}: logits (shape {_shape(logits)}) is read-only; the mask is applied in place")
        u = logits.view(_UINT_OF[name])
    else:
        torch = sys.modules.get("torch")
        if torch is None or not isinstance(logits, torch.Tensor):
            raise ShapeError(f"{fn}: logits must be a numpy array or torch tensor, got {type(logits).__name__}")
        name = _torch_float_name(torch, logits.dtype)
        if name is None:
            raise ShapeError(
                f"{fn}: logits must be a float16, bfloat16, float32 or float64 tensor, got {_dtype_name(logits)} "
                f"(shape {_shape(logits)})"
            )
        u = _uint_view_of_tensor(torch, logits, name) if logits.device.type == "cpu" else None
        if u is None:
            apply_token_bitmask_torch(logits, bitmask, indices=indices)
            return

    bm = _bitmask_to_numpy(bitmask, fn)
    n_rows, vocab, bm_rows, rows = _check_apply(u.shape, bm.shape, indices, fn)
    if vocab == 0 or bm_rows == 0:
        return
    if u.ndim == 1:
        u = u[np.newaxis, :]
    if bm.ndim == 1:
        bm = bm[np.newaxis, :]
    if not bm.flags.c_contiguous:
        bm = np.ascontiguousarray(bm)
    if rows is not None and _has_duplicates(rows):
        # several bitmask rows for one logits row: AND them, so each logits row is written by one thread only
        uniq, inverse = np.unique(rows, return_inverse=True)
        merged = np.full((uniq.shape[0], bm.shape[1]), -1, dtype=np.int32)
        np.bitwise_and.at(merged, inverse, bm)
        rows, bm = uniq.astype(np.int64), merged
    _run_apply(u, bm, rows, _NEG_INF_BITS[name], vocab)


def apply_token_bitmask_torch(logits: Any, bitmask: Any, *, indices: Sequence[int] | None = None) -> None:
    """Same contract as :func:`apply_token_bitmask`, in pure torch ops on ``logits.device`` (any device).

    Bits are unpacked with shifts against ``arange(32)`` and the logits are masked with ``masked_fill_``. This is
    the path for CUDA tensors; on CPU it gives the same result as the numba kernel (slower).
    """
    import torch

    fn = "apply_token_bitmask_torch"
    if not isinstance(logits, torch.Tensor):
        raise ShapeError(f"{fn}: logits must be a torch tensor, got {type(logits).__name__}")
    if logits.dtype not in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        raise ShapeError(
            f"{fn}: logits must be a float16, bfloat16, float32 or float64 tensor, got {_dtype_name(logits)} "
            f"(shape {_shape(logits)})"
        )
    if isinstance(bitmask, torch.Tensor):
        if bitmask.dtype != torch.int32:
            raise ShapeError(
                f"{fn}: bitmask must have dtype int32, got {_dtype_name(bitmask)} (shape {_shape(bitmask)})"
            )
        bm = bitmask.detach()
    elif isinstance(bitmask, np.ndarray):
        if bitmask.dtype != _INT32:
            raise ShapeError(f"{fn}: bitmask must have dtype int32, got {bitmask.dtype} (shape {_shape(bitmask)})")
        bm = torch.from_numpy(np.ascontiguousarray(bitmask))
    else:
        raise ShapeError(f"{fn}: bitmask must be a numpy array or torch tensor of int32, got {type(bitmask).__name__}")
    n_rows, vocab, bm_rows, rows = _check_apply(_shape(logits), _shape(bm), indices, fn)
    if vocab == 0 or bm_rows == 0:
        return
    device = logits.device
    need = (vocab + 31) // 32
    # a blocking copy: the caller may refill a pinned bitmask as soon as this returns
    bm = (bm.unsqueeze(0) if bm.dim() == 1 else bm)[:, :need].to(device)
    shifts = torch.arange(32, dtype=torch.int32, device=device)
    disallowed = ((bm.unsqueeze(-1) >> shifts) & 1).eq(0).reshape(bm_rows, need * 32)[:, :vocab]
    target = logits if logits.dim() == 2 else logits.unsqueeze(0)
    if rows is None:
        target.masked_fill_(disallowed, float("-inf"))
        return
    if _has_duplicates(rows):
        uniq, inverse = np.unique(rows, return_inverse=True)
        hits = torch.zeros((uniq.shape[0], vocab), dtype=torch.int32, device=device)
        hits.index_add_(0, torch.as_tensor(inverse, device=device), disallowed.to(torch.int32))
        disallowed, rows = hits > 0, uniq
    idx = torch.as_tensor(rows, dtype=torch.long, device=device)
    target.index_put_((idx,), target.index_select(0, idx).masked_fill_(disallowed, float("-inf")))


def bitmask_to_bool(bitmask: Any, vocab_size: int) -> np.ndarray:
    """Unpack a bitmask to booleans: ``(batch, W) -> (batch, V)``, or ``(W,) -> (V,)``. Bits past V are dropped."""
    fn = "bitmask_to_bool"
    vocab = _check_vocab_size(vocab_size, fn)
    bm = _bitmask_to_numpy(bitmask, fn)
    if bm.ndim not in (1, 2):
        raise ShapeError(f"{fn}: bitmask must be 1-D or 2-D, got shape {_shape(bm)}")
    need = (vocab + 31) // 32
    if bm.shape[-1] < need:
        raise ShapeError(
            f"{fn}: bitmask of shape {_shape(bm)} covers {32 * bm.shape[-1]} token ids; "
            f"expected width >= {need} for vocab_size {vocab}, got {bm.shape[-1]}"
        )
    bm2 = np.ascontiguousarray(bm[np.newaxis] if bm.ndim == 1 else bm)
    out = np.empty((bm2.shape[0], vocab), dtype=np.uint8)
    if out.size:
        _unpack_kernel(bm2, out, vocab // 32, vocab % 32)
    out = out.view(np.bool_)
    return out[0] if bm.ndim == 1 else out


def bool_to_bitmask(allowed: Any) -> np.ndarray:
    """Pack booleans to a bitmask: ``(batch, V) -> (batch, ceil(V/32))`` int32, or ``(V,) -> (W,)``.

    Padding bits (ids >= V in the last word) are 0. Accepts numpy or torch bool arrays.
    """
    fn = "bool_to_bitmask"
    if _is_tensor(allowed):
        allowed = allowed.detach().cpu().numpy()
    elif not isinstance(allowed, np.ndarray):
        allowed = np.asarray(allowed)
    if allowed.dtype != np.bool_:
        raise ShapeError(f"{fn}: allowed must have dtype bool, got {allowed.dtype} (shape {_shape(allowed)})")
    if allowed.ndim not in (1, 2):
        raise ShapeError(f"{fn}: allowed must be 1-D (V,) or 2-D (batch, V), got shape {_shape(allowed)}")
    a2 = np.ascontiguousarray(allowed[np.newaxis] if allowed.ndim == 1 else allowed)
    vocab = a2.shape[1]
    out = np.zeros((a2.shape[0], (vocab + 31) // 32), dtype=np.int32)
    if a2.size:
        _pack_kernel(a2.view(np.uint8), out, vocab // 32, vocab % 32)
    return out[0] if allowed.ndim == 1 else out


def _bitmask_row(bitmask_row: Any, vocab_size: int, fn: str) -> tuple[np.ndarray, int]:
    vocab = _check_vocab_size(vocab_size, fn)
    row = _bitmask_to_numpy(bitmask_row, fn)
    if row.ndim == 2 and row.shape[0] == 1:
        row = row[0]
    if row.ndim != 1:
        raise ShapeError(f"{fn}: bitmask_row must be 1-D (W,) or (1, W), got shape {_shape(row)}")
    need = (vocab + 31) // 32
    if row.shape[0] < need:
        raise ShapeError(
            f"{fn}: bitmask_row of shape {_shape(row)} covers {32 * row.shape[0]} token ids; "
            f"expected width >= {need} for vocab_size {vocab}, got {row.shape[0]}"
        )
    return np.ascontiguousarray(row), vocab


def count_allowed(bitmask_row: Any, vocab_size: int) -> int:
    """How many of the first ``vocab_size`` tokens a bitmask row allows (popcount; padding bits ignored)."""
    row, vocab = _bitmask_row(bitmask_row, vocab_size, "count_allowed")
    if vocab == 0:
        return 0
    return int(_popcount_kernel(row, vocab // 32, vocab % 32))


def allowed_token_ids(bitmask_row: Any, vocab_size: int) -> np.ndarray:
    """The ids (< ``vocab_size``) a bitmask row allows, ascending, as int64."""
    ids = few_allowed_ids(bitmask_row, vocab_size, None)
    assert ids is not None  # no limit
    return ids


def few_allowed_ids(bitmask_row: Any, vocab_size: int, limit: int | None) -> np.ndarray | None:
    """:func:`allowed_token_ids` when the row allows at most ``limit`` tokens (any number for None), else None:
    one popcount decides and sizes the result (a sparse output layer asks this of every row)."""
    row, vocab = _bitmask_row(bitmask_row, vocab_size, "allowed_token_ids")
    if vocab == 0:
        return np.zeros(0, dtype=np.int64)
    n_full, tail = divmod(vocab, 32)
    count = int(_popcount_kernel(row, n_full, tail))
    if limit is not None and count > limit:
        return None
    out = np.empty(count, dtype=np.int64)
    n = _ids_kernel(row, n_full, tail, out)
    return out[:n]
