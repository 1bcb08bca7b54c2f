"""constrain.kernels.bitmask: packing, unpacking and counting bitmasks, and applying them to logits (numpy, torch)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from constrain.errors import ShapeError
from constrain.kernels.bitmask import (
    allocate_token_bitmask,
    allowed_token_ids,
    apply_token_bitmask,
    apply_token_bitmask_torch,
    bitmask_to_bool,
    bitmask_width,
    bool_to_bitmask,
    count_allowed,
)

VOCABS = [1, 31, 32, 33, 1000, 262144]


# ---------------------------------------------------------------------------------------------------------------
# naive references
# ---------------------------------------------------------------------------------------------------------------


def ref_pack(allowed: np.ndarray) -> np.ndarray:
    """Bit i % 32 of word i // 32, computed one token at a time in Python integers."""
    allowed = np.atleast_2d(allowed)
    batch, vocab = allowed.shape
    width = (vocab + 31) // 32
    out = np.zeros((batch, width), dtype=np.int64)
    for r in range(batch):
        for i in np.flatnonzero(allowed[r]):
            out[r, i // 32] |= 1 << (int(i) % 32)
    out = np.where(out >= 2**31, out - 2**32, out)  # to signed int32
    return out.astype(np.int32)


def ref_unpack(bitmask: np.ndarray, vocab: int) -> np.ndarray:
    bitmask = np.atleast_2d(bitmask)
    out = np.zeros((bitmask.shape[0], vocab), dtype=bool)
    for r in range(bitmask.shape[0]):
        for i in range(vocab):
            out[r, i] = (int(bitmask[r, i // 32]) >> (i % 32)) & 1 == 1
    return out


def random_mask(rng: np.random.Generator, batch: int, vocab: int, p: float = 0.5) -> np.ndarray:
    return rng.random((batch, vocab)) < p


def random_bitmask(rng: np.random.Generator, batch: int, vocab: int) -> np.ndarray:
    """Random words (including the padding bits), some words all-allowed and some all-disallowed."""
    width = (vocab + 31) // 32
    bm = rng.integers(-(2**31), 2**31, size=(batch, width), dtype=np.int64).astype(np.int32)
    bm[rng.random((batch, width)) < 0.2] = -1
    bm[rng.random((batch, width)) < 0.2] = 0
    return bm


def expected(logits: np.ndarray, bitmask: np.ndarray, vocab: int) -> np.ndarray:
    allowed = ref_unpack(bitmask, vocab).reshape(logits.shape)
    return np.where(allowed, logits, -np.inf)


# ---------------------------------------------------------------------------------------------------------------
# allocation, width, pack / unpack / count
# ---------------------------------------------------------------------------------------------------------------


def test_bitmask_width_and_allocate():
    assert [bitmask_width(v) for v in (0, 1, 31, 32, 33, 262144)] == [0, 1, 1, 1, 2, 8192]
    bm = allocate_token_bitmask(3, 33)
    assert bm.shape == (3, 2) and bm.dtype == np.int32 and (bm == -1).all()
    assert bitmask_to_bool(bm, 33).all()
    with pytest.raises(ShapeError, match="vocab_size"):
        bitmask_width(-1)
    with pytest.raises(ShapeError, match="batch_size"):
        allocate_token_bitmask(-1, 10)


@pytest.mark.parametrize("vocab", VOCABS)
def test_pack_unpack_against_reference(vocab):
    rng = np.random.default_rng(vocab)
    allowed = random_mask(rng, 3, vocab, p=0.3)
    allowed[0, -1] = True  # the last id, and (for some vocab sizes) bit 31
    packed = bool_to_bitmask(allowed)
    assert packed.dtype == np.int32 and packed.shape == (3, bitmask_width(vocab))
    if vocab <= 1000:
        np.testing.assert_array_equal(packed, ref_pack(allowed))
    else:
        np.testing.assert_array_equal(packed, np.packbits(allowed, axis=1, bitorder="little").view("<i4"))
    unpacked = bitmask_to_bool(packed, vocab)
    assert unpacked.dtype == np.bool_ and unpacked.shape == (3, vocab)
    np.testing.assert_array_equal(unpacked, allowed)
    for r in range(3):
        assert count_allowed(packed[r], vocab) == int(allowed[r].sum())
        np.testing.assert_array_equal(allowed_token_ids(packed[r], vocab), np.flatnonzero(allowed[r]))


@pytest.mark.parametrize("vocab", [1, 31, 33, 1000])
def test_unpack_random_words_ignores_padding_bits(vocab):
    rng = np.random.default_rng(7)
    bm = random_bitmask(rng, 4, vocab)
    bm[:, -1] = -1  # padding bits set
    want = ref_unpack(bm, vocab)
    np.testing.assert_array_equal(bitmask_to_bool(bm, vocab), want)
    for r in range(4):
        assert count_allowed(bm[r], vocab) == int(want[r].sum())
    # a narrower vocabulary than the bitmask covers: the extra words are ignored as well
    np.testing.assert_array_equal(bitmask_to_bool(bm, vocab // 2), want[:, : vocab // 2])


def test_bit31_is_the_sign_bit():
    allowed = np.zeros(32, dtype=bool)
    allowed[31] = True
    assert bool_to_bitmask(allowed).tolist() == [-(2**31)]
    assert bitmask_to_bool(np.array([-(2**31)], dtype=np.int32), 32).tolist() == allowed.tolist()
    assert count_allowed(np.array([-1, -1], dtype=np.int32), 40) == 40
    assert count_allowed(np.array([0, 0], dtype=np.int32), 40) == 0


def test_one_dimensional_and_torch_inputs():
    rng = np.random.default_rng(1)
    allowed = rng.random(70) < 0.5
    packed = bool_to_bitmask(allowed)
    assert packed.shape == (3,)
    out = bitmask_to_bool(packed, 70)
    assert out.shape == (70,)
    np.testing.assert_array_equal(out, allowed)
    np.testing.assert_array_equal(bool_to_bitmask(torch.from_numpy(allowed)), packed)
    np.testing.assert_array_equal(bitmask_to_bool(torch.from_numpy(packed), 70), allowed)
    assert count_allowed(torch.from_numpy(packed), 70) == int(allowed.sum())
    assert count_allowed(packed[np.newaxis], 70) == int(allowed.sum())
    # non-contiguous boolean input
    big = rng.random((4, 140)) < 0.5
    np.testing.assert_array_equal(bool_to_bitmask(big[:, ::2]), ref_pack(big[:, ::2]))


def test_empty_shapes():
    assert bool_to_bitmask(np.zeros((2, 0), dtype=bool)).shape == (2, 0)
    assert bitmask_to_bool(np.zeros((2, 0), dtype=np.int32), 0).shape == (2, 0)
    assert count_allowed(np.zeros(0, dtype=np.int32), 0) == 0
    assert allowed_token_ids(np.zeros(0, dtype=np.int32), 0).shape == (0,)


def test_pack_unpack_errors():
    with pytest.raises(ShapeError, match="allowed.*bool"):
        bool_to_bitmask(np.zeros((2, 5), dtype=np.int32))
    with pytest.raises(ShapeError, match="allowed.*1-D.*2-D"):
        bool_to_bitmask(np.zeros((2, 2, 5), dtype=bool))
    with pytest.raises(ShapeError, match="bitmask.*int32"):
        bitmask_to_bool(np.zeros((2, 5), dtype=np.int64), 100)
    with pytest.raises(ShapeError, match=r"bitmask.*width >= 4.*got 3"):
        bitmask_to_bool(np.zeros((2, 3), dtype=np.int32), 100)
    with pytest.raises(ShapeError, match=r"bitmask_row.*width >= 4.*got 3"):
        count_allowed(np.zeros(3, dtype=np.int32), 100)
    with pytest.raises(ShapeError, match="bitmask_row"):
        count_allowed(np.zeros((2, 4), dtype=np.int32), 100)
    with pytest.raises(ShapeError, match="bitmask.*int32"):
        count_allowed(np.zeros(4, dtype=np.uint32), 100)


@settings(max_examples=200, deadline=None)
@given(hnp.arrays(np.bool_, hnp.array_shapes(min_dims=1, max_dims=2, min_side=0, max_side=300)))
def test_property_pack_unpack_round_trip(allowed):
    packed = bool_to_bitmask(allowed)
    vocab = allowed.shape[-1]
    assert packed.shape == allowed.shape[:-1] + (bitmask_width(vocab),)
    np.testing.assert_array_equal(bitmask_to_bool(packed, vocab), allowed)
    rows = allowed[np.newaxis] if allowed.ndim == 1 else allowed
    packed_rows = packed[np.newaxis] if packed.ndim == 1 else packed
    for r in range(rows.shape[0]):
        assert count_allowed(packed_rows[r], vocab) == int(rows[r].sum())


@settings(max_examples=200, deadline=None)
@given(
    st.integers(min_value=0, max_value=200).flatmap(
        lambda vocab: st.tuples(
            st.just(vocab),
            hnp.arrays(np.int32, (2, (vocab + 31) // 32)),
        )
    )
)
def test_property_unpack_pack_round_trip(case):
    vocab, bitmask = case
    allowed = bitmask_to_bool(bitmask, vocab)
    np.testing.assert_array_equal(allowed, ref_unpack(bitmask, vocab))
    repacked = bool_to_bitmask(allowed)
    # equal except the padding bits of the last word, which packing clears
    np.testing.assert_array_equal(bitmask_to_bool(repacked, vocab), allowed)
    if vocab % 32 == 0:
        np.testing.assert_array_equal(repacked, bitmask)


# ---------------------------------------------------------------------------------------------------------------
# apply: numpy
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("vocab", VOCABS)
def test_apply_numpy_dtypes(dtype, vocab):
    rng = np.random.default_rng(vocab)
    logits = rng.standard_normal((3, vocab)).astype(dtype)
    bm = random_bitmask(rng, 3, vocab)
    want = expected(logits, bm, vocab) if vocab <= 1000 else np.where(bitmask_to_bool(bm, vocab), logits, -np.inf)
    before = logits.__array_interface__["data"][0]
    assert apply_token_bitmask(logits, bm) is None
    assert logits.__array_interface__["data"][0] == before
    assert logits.dtype == dtype
    np.testing.assert_array_equal(logits, want.astype(dtype))


def test_apply_numpy_values_kept_exactly():
    """Allowed values are untouched bit for bit (NaN, -0.0, inf included); disallowed become -inf."""
    logits = np.array([[np.nan, -0.0, np.inf, -np.inf, 1e-45, 3.0, -7.5, 65504.0]], dtype=np.float32)
    bm = np.array([[0b01010101]], dtype=np.int32)
    original = logits.copy()
    apply_token_bitmask(logits, bm)
    for i in range(8):
        if (0b01010101 >> i) & 1:
            assert logits.view(np.uint32)[0, i] == original.view(np.uint32)[0, i]
        else:
            assert logits[0, i] == -np.inf


def test_apply_numpy_non_contiguous_views():
    rng = np.random.default_rng(3)
    vocab = 1000
    big = rng.standard_normal((4, 2 * vocab)).astype(np.float32)
    untouched = big[:, 1::2].copy()
    view = big[:, ::2]
    assert not view.flags.c_contiguous
    bm = random_bitmask(rng, 4, vocab)
    want = expected(view.copy(), bm, vocab)
    apply_token_bitmask(view, bm)
    np.testing.assert_array_equal(big[:, ::2], want)
    np.testing.assert_array_equal(big[:, 1::2], untouched)

    # a column slice (rows contiguous, row stride larger than the row)
    wide = rng.standard_normal((3, vocab + 50)).astype(np.float64)
    left, right = wide[:, :10].copy(), wide[:, 10 + vocab :].copy()
    col = wide[:, 10 : 10 + vocab]
    bm = random_bitmask(rng, 3, vocab)
    want = expected(col.copy(), bm, vocab)
    apply_token_bitmask(col, bm)
    np.testing.assert_array_equal(wide[:, 10 : 10 + vocab], want)
    np.testing.assert_array_equal(wide[:, :10], left)
    np.testing.assert_array_equal(wide[:, 10 + vocab :], right)

    # Fortran order and a reversed (negative-stride) view
    fort = np.asfortranarray(rng.standard_normal((3, 100)).astype(np.float32))
    bm = random_bitmask(rng, 3, 100)
    want = expected(fort.copy(), bm, 100)
    apply_token_bitmask(fort, bm)
    np.testing.assert_array_equal(fort, want)
    base = rng.standard_normal((2, 100)).astype(np.float16)
    rev = base[::-1, ::-1]
    want = expected(rev.copy(), bm[:2], 100)
    apply_token_bitmask(rev, bm[:2])
    np.testing.assert_array_equal(base[::-1, ::-1], want)


def test_apply_one_dimensional_like_llama_cpp():
    rng = np.random.default_rng(4)
    vocab = 1003
    storage = rng.standard_normal((vocab, 2)).astype(np.float32)
    scores = storage[:, 1]  # a strided (V,) view
    assert not scores.flags.c_contiguous
    other = storage
    bm = random_bitmask(rng, 1, vocab)
    want = expected(scores.copy(), bm, vocab)
    apply_token_bitmask(scores, bm[0])
    np.testing.assert_array_equal(scores, want)
    logits = other[:, 0].copy()
    want = expected(logits.copy(), bm, vocab)
    apply_token_bitmask(logits, bm)  # (1, W) bitmask for (V,) logits
    np.testing.assert_array_equal(logits, want)


def test_apply_bits_beyond_vocab_ignored():
    vocab = 40
    logits = np.zeros((2, vocab), dtype=np.float32)
    bm = np.zeros((2, 3), dtype=np.int32)  # one word wider than needed
    bm[:, 1] = -1  # ids 32..63: only 32..39 exist
    bm[:, 2] = -1
    apply_token_bitmask(logits, bm)
    assert (logits[:, :32] == -np.inf).all()
    assert (logits[:, 32:] == 0).all()
    # all-allowed leaves the logits exactly as they were
    logits = np.arange(70, dtype=np.float32).reshape(1, 70)
    apply_token_bitmask(logits, allocate_token_bitmask(1, 70))
    np.testing.assert_array_equal(logits, np.arange(70, dtype=np.float32).reshape(1, 70))


def test_apply_indices():
    rng = np.random.default_rng(5)
    vocab = 333
    logits = rng.standard_normal((5, vocab)).astype(np.float32)
    original = logits.copy()
    bm = random_bitmask(rng, 2, vocab)
    apply_token_bitmask(logits, bm, indices=[3, 1])
    np.testing.assert_array_equal(logits[3], expected(original[3:4], bm[0:1], vocab)[0])
    np.testing.assert_array_equal(logits[1], expected(original[1:2], bm[1:2], vocab)[0])
    for r in (0, 2, 4):
        np.testing.assert_array_equal(logits[r], original[r])
    # numpy / torch index arrays, and repeated rows (both masks apply)
    logits = original.copy()
    apply_token_bitmask(logits, bm, indices=np.array([2, 2]))
    both = expected(expected(original[2:3], bm[0:1], vocab), bm[1:2], vocab)[0]
    np.testing.assert_array_equal(logits[2], both)
    logits = original.copy()
    apply_token_bitmask(logits, bm, indices=torch.tensor([0, 4]))
    np.testing.assert_array_equal(logits[4], expected(original[4:5], bm[1:2], vocab)[0])
    # empty indices with an empty bitmask: nothing happens
    logits = original.copy()
    apply_token_bitmask(logits, np.zeros((0, 11), dtype=np.int32), indices=[])
    np.testing.assert_array_equal(logits, original)


def test_apply_large_batch_uses_threads_correctly():
    """Batches big enough to be split over threads give the same result as row-by-row application."""
    rng = np.random.default_rng(6)
    vocab = 262144
    logits = rng.standard_normal((8, vocab)).astype(np.float32)
    bm = random_bitmask(rng, 8, vocab)
    want = np.where(bitmask_to_bool(bm, vocab), logits, -np.inf)
    apply_token_bitmask(logits, bm)
    np.testing.assert_array_equal(logits, want)
    # with indices (a permutation) and duplicates
    logits = rng.standard_normal((8, vocab)).astype(np.float32)
    rows = np.array([7, 0, 3, 3, 5, 1, 2, 6])
    allowed = bitmask_to_bool(bm, vocab)
    want = logits.copy()
    for k, r in enumerate(rows):
        want[r] = np.where(allowed[k], want[r], -np.inf)
    apply_token_bitmask(logits, bm, indices=rows)
    np.testing.assert_array_equal(logits, want)


# ---------------------------------------------------------------------------------------------------------------
# apply: torch
# ---------------------------------------------------------------------------------------------------------------

TORCH_DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]


def torch_expected(logits: torch.Tensor, bm: np.ndarray, vocab: int) -> torch.Tensor:
    allowed = torch.from_numpy(ref_unpack(bm, vocab)).reshape(logits.shape)
    return torch.where(allowed, logits, torch.tensor(float("-inf"), dtype=logits.dtype))


@pytest.mark.parametrize("dtype", TORCH_DTYPES)
@pytest.mark.parametrize("vocab", [1, 33, 1000])
def test_apply_torch_dtypes(dtype, vocab):
    rng = np.random.default_rng(vocab)
    logits = torch.from_numpy(rng.standard_normal((3, vocab)).astype(np.float32)).to(dtype)
    bm = random_bitmask(rng, 3, vocab)
    want = torch_expected(logits.clone(), bm, vocab)
    ptr = logits.data_ptr()
    apply_token_bitmask(logits, bm)
    assert logits.data_ptr() == ptr and logits.dtype == dtype
    assert torch.equal(logits, want)
    # a torch bitmask works the same
    logits2 = torch.from_numpy(rng.standard_normal((3, vocab)).astype(np.float32)).to(dtype)
    want2 = torch_expected(logits2.clone(), bm, vocab)
    apply_token_bitmask(logits2, torch.from_numpy(bm))
    assert torch.equal(logits2, want2)


@pytest.mark.parametrize("dtype", TORCH_DTYPES)
def test_torch_path_equals_numba_path(dtype):
    rng = np.random.default_rng(8)
    vocab = 262144 + 17
    base = torch.from_numpy(rng.standard_normal((3, vocab)).astype(np.float32)).to(dtype)
    bm = torch.from_numpy(random_bitmask(rng, 3, vocab))
    a, b = base.clone(), base.clone()
    apply_token_bitmask(a, bm)
    apply_token_bitmask_torch(b, bm)
    assert torch.equal(a, b)
    assert torch.equal(torch.isneginf(a), ~torch.from_numpy(bitmask_to_bool(bm, vocab)))
    # with indices (and a repeated row), non-contiguous, 1-D
    a, b = base.clone(), base.clone()
    apply_token_bitmask(a, bm[:2], indices=[2, 2])
    apply_token_bitmask_torch(b, bm[:2], indices=[2, 2])
    assert torch.equal(a, b)
    assert torch.equal(a[:2], base[:2])
    big_a = torch.from_numpy(rng.standard_normal((3, 2 * 999)).astype(np.float32)).to(dtype)
    big_b = big_a.clone()
    bm2 = random_bitmask(rng, 3, 999)
    apply_token_bitmask(big_a[:, 1::2], bm2)
    apply_token_bitmask_torch(big_b[:, 1::2], bm2)
    assert torch.equal(big_a, big_b)
    one_a, one_b = base[0].clone(), base[0].clone()
    apply_token_bitmask(one_a, bm[0])
    apply_token_bitmask_torch(one_b, bm[0].numpy())
    assert torch.equal(one_a, one_b)


@pytest.mark.parametrize("dtype", TORCH_DTYPES)
def test_apply_torch_non_contiguous_and_1d(dtype):
    rng = np.random.default_rng(9)
    vocab = 500
    big = torch.from_numpy(rng.standard_normal((4, 2 * vocab)).astype(np.float32)).to(dtype)
    untouched = big[:, 1::2].clone()
    view = big[:, ::2]
    assert not view.is_contiguous()
    bm = random_bitmask(rng, 4, vocab)
    want = torch_expected(view.clone(), bm, vocab)
    ptr = big.data_ptr()
    apply_token_bitmask(view, bm)
    assert big.data_ptr() == ptr
    assert torch.equal(big[:, ::2], want)
    assert torch.equal(big[:, 1::2], untouched)
    # column slice
    wide = torch.from_numpy(rng.standard_normal((2, vocab + 9)).astype(np.float32)).to(dtype)
    keep = wide[:, vocab:].clone()
    col = wide[:, :vocab]
    want = torch_expected(col.clone(), bm[:2], vocab)
    apply_token_bitmask(col, bm[:2])
    assert torch.equal(wide[:, :vocab], want)
    assert torch.equal(wide[:, vocab:], keep)
    # 1-D, a strided row of a transposed matrix
    mat = torch.from_numpy(rng.standard_normal((vocab, 3)).astype(np.float32)).to(dtype)
    row = mat[:, 1]
    assert row.stride() == (3,)
    want = torch_expected(row.clone(), bm[0], vocab)
    apply_token_bitmask(row, bm[0])
    assert torch.equal(mat[:, 1], want)


def test_apply_torch_requires_grad_and_inference_mode():
    rng = np.random.default_rng(10)
    bm = random_bitmask(rng, 2, 64)
    leaf = torch.randn(2, 64, requires_grad=True)
    with torch.no_grad():
        want = torch_expected(leaf.detach().clone(), bm, 64)
        apply_token_bitmask(leaf, bm)
    assert torch.equal(leaf.detach(), want)
    with torch.inference_mode():
        t = torch.randn(2, 64)
        want = torch_expected(t.clone(), bm, 64)
        apply_token_bitmask(t, bm)
        assert torch.equal(t, want)


def test_apply_torch_indices():
    rng = np.random.default_rng(11)
    vocab = 100
    base = torch.randn(4, vocab, dtype=torch.bfloat16)
    bm = random_bitmask(rng, 2, vocab)
    for fn in (apply_token_bitmask, apply_token_bitmask_torch):
        t = base.clone()
        fn(t, bm, indices=[0, 3])
        assert torch.equal(t[0], torch_expected(base[0:1].clone(), bm[0:1], vocab)[0])
        assert torch.equal(t[3], torch_expected(base[3:4].clone(), bm[1:2], vocab)[0])
        assert torch.equal(t[1:3], base[1:3])


# ---------------------------------------------------------------------------------------------------------------
# apply: errors
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("fn", [apply_token_bitmask, apply_token_bitmask_torch])
def test_apply_errors(fn):
    def logits(shape, dtype=torch.float32):
        return torch.zeros(shape, dtype=dtype)

    bm = allocate_token_bitmask(2, 64)
    with pytest.raises(ShapeError, match=r"bitmask must have dtype int32, got int64 \(shape \(2, 2\)\)"):
        fn(logits((2, 64)), bm.astype(np.int64))
    with pytest.raises(ShapeError, match="bitmask must have dtype int32, got float32"):
        fn(logits((2, 64)), torch.zeros((2, 2), dtype=torch.float32))
    with pytest.raises(ShapeError, match=r"logits of shape \(2, 65\).*bitmask of shape \(2, 2\).*width >= 3.*got 2"):
        fn(logits((2, 65)), bm)
    with pytest.raises(ShapeError, match=r"bitmask has 2 rows.*logits have 3.*expected bitmask shape \(3, 2\)"):
        fn(logits((3, 64)), bm)
    with pytest.raises(ShapeError, match=r"logits must be a float16, bfloat16, float32 or float64 tensor, got int32"):
        fn(logits((2, 64), torch.int32), bm)
    with pytest.raises(ShapeError, match=r"logits must be 2-D \(batch, vocab\) or 1-D.*got 3-D shape \(1, 2, 64\)"):
        fn(logits((1, 2, 64)), bm)
    with pytest.raises(ShapeError, match=r"bitmask must be 2-D.*got 3-D shape \(1, 2, 2\)"):
        fn(logits((2, 64)), bm.reshape(1, 2, 2))
    with pytest.raises(ShapeError, match="indices has 3 entries but bitmask has 2 rows"):
        fn(logits((4, 64)), bm, indices=[0, 1, 2])
    with pytest.raises(ShapeError, match=r"indices entry 4 is out of range.*0 <= index < 4"):
        fn(logits((4, 64)), bm, indices=[0, 4])
    with pytest.raises(ShapeError, match=r"indices entry -1 is out of range"):
        fn(logits((4, 64)), bm, indices=[-1, 0])
    with pytest.raises(ShapeError, match="indices must be integers"):
        fn(logits((4, 64)), bm, indices=[0.0, 1.0])
    with pytest.raises(ShapeError, match="indices must be 1-D"):
        fn(logits((4, 64)), bm, indices=[[0, 1]])
    with pytest.raises(ShapeError, match="bitmask must be a numpy array or torch tensor"):
        fn(logits((2, 64)), [[-1, -1], [-1, -1]])


def test_apply_numpy_errors():
    bm = allocate_token_bitmask(2, 64)
    with pytest.raises(ShapeError, match=r"logits must be a float16, float32 or float64 array, got int64"):
        apply_token_bitmask(np.zeros((2, 64), dtype=np.int64), bm)
    with pytest.raises(ShapeError, match="logits must be a float16, float32 or float64 array, got bool"):
        apply_token_bitmask(np.zeros((2, 64), dtype=bool), bm)
    with pytest.raises(ShapeError, match=r"logits must be a float16, float32 or float64 array, got >f4"):
        apply_token_bitmask(np.zeros((2, 64), dtype=">f4"), bm)
    with pytest.raises(ShapeError, match=r"bitmask must have dtype int32, got uint32"):
        apply_token_bitmask(np.zeros((2, 64), dtype=np.float32), bm.view(np.uint32))
    with pytest.raises(ShapeError, match=r"logits of shape \(2, 100\).*width >= 4 \(ceil\(100/32\)\), got 2"):
        apply_token_bitmask(np.zeros((2, 100), dtype=np.float32), bm)
    with pytest.raises(ShapeError, match=r"logits must be 2-D.*got 0-D"):
        apply_token_bitmask(np.ones((), dtype=np.float32), bm)
    with pytest.raises(ShapeError, match="logits must be a numpy array or torch tensor, got list"):
        apply_token_bitmask([[0.0] * 64] * 2, bm)
    ro = np.zeros((2, 64), dtype=np.float32)
    ro.flags.writeable = False
    with pytest.raises(ShapeError, match="read-only"):
        apply_token_bitmask(ro, bm)
    with pytest.raises(ShapeError, match="logits must be a torch tensor"):
        apply_token_bitmask_torch(np.zeros((2, 64), dtype=np.float32), bm)


def test_import_does_not_import_torch():
    """The module itself imports no torch (the package __init__ is bypassed: other modules are not under test)."""
    code = (
        "import sys, types, pathlib, constrain.errors as e\n"
        "pkg = types.ModuleType('constrain'); pkg.__path__ = [str(pathlib.Path(e.__file__).parent)]\n"
        "sys.modules['constrain'] = pkg\n"
        "for name in [m for m in sys.modules if m.startswith('torch')]: del sys.modules[name]\n"
        "import importlib; importlib.import_module('constrain.kernels.bitmask')\n"
        "assert 'torch' not in sys.modules, 'torch imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


# ---------------------------------------------------------------------------------------------------------------
# apply: unusual layouts, threads, fork
# ---------------------------------------------------------------------------------------------------------------


def test_apply_unaligned_strides_fall_back_correctly():
    """A field of a packed structured array has a 5-byte stride: not whole elements; still masked in place."""
    rng = np.random.default_rng(12)
    rec = np.zeros((3, 70), dtype=[("pad", "u1"), ("x", "<f4")])
    rec["x"] = rng.standard_normal((3, 70))
    rec["pad"] = 7
    view = rec["x"]
    assert view.strides[1] == 5
    bm = random_bitmask(rng, 3, 70)
    want = expected(np.array(view), bm, 70)
    apply_token_bitmask(view, bm)
    np.testing.assert_array_equal(rec["x"], want.astype(np.float32))
    assert (rec["pad"] == 7).all()


@pytest.mark.parametrize("layout", ["c", "fortran", "column_slice", "step2", "reversed"])
def test_apply_big_batches_all_layouts(layout, monkeypatch):
    """Big batches (split over threads) in every layout equal the single-thread result and the reference."""
    rng = np.random.default_rng(13)
    vocab, batch = 70_001, 24
    if layout == "c":
        make = lambda a: a  # noqa: E731
    elif layout == "fortran":
        make = np.asfortranarray
    elif layout == "column_slice":
        make = lambda a: np.pad(a, ((0, 0), (5, 3)))[:, 5:-3]  # noqa: E731
    elif layout == "step2":
        make = lambda a: np.repeat(a, 2, axis=1)[:, ::2]  # noqa: E731
    else:
        make = lambda a: np.ascontiguousarray(a[::-1, ::-1])[::-1, ::-1]  # noqa: E731
    data = rng.standard_normal((batch, vocab)).astype(np.float32)
    bm = random_bitmask(rng, batch, vocab)
    want = np.where(bitmask_to_bool(bm, vocab), data, -np.inf)
    a, b = make(data.copy()), make(data.copy())
    apply_token_bitmask(a, bm)
    monkeypatch.setenv("CONSTRAIN_KERNEL_THREADS", "1")
    apply_token_bitmask(b, bm)
    np.testing.assert_array_equal(a, want)
    np.testing.assert_array_equal(b, want)


def test_apply_concurrent_callers():
    """Several Python threads applying masks at once (each to its own logits) all get the right answer."""
    import threading

    rng = np.random.default_rng(14)
    vocab, batch = 65_536, 16
    jobs = []
    for _ in range(6):
        data = rng.standard_normal((batch, vocab)).astype(np.float32)
        bm = random_bitmask(rng, batch, vocab)
        jobs.append((data, bm, np.where(bitmask_to_bool(bm, vocab), data, -np.inf)))
    errors = []

    def work(data, bm, want):
        try:
            for _ in range(5):
                apply_token_bitmask(data, bm)
            np.testing.assert_array_equal(data, want)
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=job) for job in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors and not any(t.is_alive() for t in threads)


def test_apply_after_fork():
    """The helper threads do not survive fork(): a forked child must still apply big batches (no hang)."""
    code = (
        "import os, numpy as np, constrain.kernels.bitmask as k\n"
        "x = np.zeros((8, 262144), np.float32); bm = k.allocate_token_bitmask(8, 262144); bm[:, ::2] = 0\n"
        "k.apply_token_bitmask(x, bm)\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    y = np.zeros((8, 262144), np.float32); k.apply_token_bitmask(y, bm)\n"
        "    ok = np.isneginf(y[:, :32]).all() and (y[:, 32:64] == 0).all()\n"
        "    os._exit(0 if ok else 3)\n"
        "_, status = os.waitpid(pid, 0)\n"
        "raise SystemExit(os.waitstatus_to_exitcode(status))\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
