"""Benchmark of constrain.kernels.bitmask.apply_token_bitmask against plain torch references.

Run: python benchmarks/bench_kernels.py [--vocab 262144] [--quick]

Prints, for batch 1 / 16 / 128 of float32 logits and three masks (random ~50%, sparse = a few allowed tokens,
dense = almost all allowed), the median and p99 in microseconds of:
  numba/numpy       apply_token_bitmask on a numpy array
  numba/torch       apply_token_bitmask on a CPU torch tensor (viewed as numpy, no copy)
  numba 1 thread    the same with CONSTRAIN_KERNEL_THREADS=1 (batches are otherwise split over threads)
  torch unpack      apply_token_bitmask_torch (shifts against arange(32) + masked_fill_), the GPU path, on CPU
  torch masked_fill logits.masked_fill_(disallowed, -inf) with a prebuilt bool mask (bit unpacking not timed)
and the ratios reference / ours (> 1 means the numba kernel is faster). Then the first-call cost (import, first
call: numba cache load or compile) measured in fresh subprocesses.
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile
import time

import numba
import numpy as np
import torch

from constrain.kernels.bitmask import apply_token_bitmask, apply_token_bitmask_torch, bitmask_to_bool, bool_to_bitmask


def timeit(fn, reps: int, warmup: int = 3) -> tuple[float, float]:
    for _ in range(warmup):
        fn()
    samples = np.empty(reps)
    for i in range(reps):
        t0 = time.perf_counter()
        fn()
        samples[i] = time.perf_counter() - t0
    return float(np.median(samples) * 1e6), float(np.percentile(samples, 99) * 1e6)


def make_mask(kind: str, batch: int, vocab: int, rng: np.random.Generator) -> np.ndarray:
    if kind == "random50":
        allowed = rng.random((batch, vocab)) < 0.5
    elif kind == "sparse":  # a JSON key or punctuation position: a handful of tokens
        allowed = np.zeros((batch, vocab), dtype=bool)
        for r in range(batch):
            allowed[r, rng.choice(vocab, size=20, replace=False)] = True
    elif kind == "dense":  # inside a JSON string: nearly everything but quotes, controls, specials
        allowed = rng.random((batch, vocab)) < 0.995
    else:
        raise ValueError(kind)
    return bool_to_bitmask(allowed)


FIRST_CALL = r"""
import time, sys
t0 = time.perf_counter()
import numpy as np
import constrain.kernels.bitmask as k
t1 = time.perf_counter()
logits = np.zeros((1, 262144), dtype=np.float32)
bm = k.allocate_token_bitmask(1, 262144); bm[0, ::3] = 0
t2 = time.perf_counter(); k.apply_token_bitmask(logits, bm); t3 = time.perf_counter()
k.apply_token_bitmask(logits, bm); t4 = time.perf_counter()
print(f"{(t1 - t0) * 1e3:.1f} {(t3 - t2) * 1e3:.1f} {(t4 - t3) * 1e6:.1f}")
"""


def first_call(cold: bool) -> str:
    env = dict(os.environ)
    with tempfile.TemporaryDirectory() as tmp:
        if cold:
            env["NUMBA_CACHE_DIR"] = tmp  # empty cache: numba compiles
        out = subprocess.run([sys.executable, "-c", FIRST_CALL], env=env, capture_output=True, text=True, check=True)
    imp, first, second = out.stdout.split()
    return f"import {imp} ms, first call {first} ms, second call {second} us"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--vocab", type=int, default=262144)
    ap.add_argument("--quick", action="store_true", help="fewer repetitions")
    ap.add_argument("--torch-threads", type=int, default=0, help="torch.set_num_threads for the references")
    args = ap.parse_args()
    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    vocab = args.vocab
    rng = np.random.default_rng(0)

    print(
        f"machine: {platform.platform()} | {platform.processor() or platform.machine()} | "
        f"cpus {os.cpu_count()} (affinity {len(os.sched_getaffinity(0))})"
    )
    print(
        f"python {platform.python_version()} | numpy {np.__version__} | numba {numba.__version__} "
        f"(threading layer n/a: kernels use a thread pool) | torch {torch.__version__} "
        f"(threads {torch.get_num_threads()})"
    )
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    print(f"vocab {vocab}, float32 logits; times in microseconds, median / p99; load average {load}\n")

    header = (
        f"{'batch':>5} {'mask':>9} | {'numba/numpy':>17} {'numba/torch':>17} {'numba 1 thread':>17} "
        f"{'torch unpack':>17} {'torch masked_fill':>17} | {'unpack/ours':>11} {'fill/ours':>9}"
    )
    print(header)
    print("-" * len(header))
    for batch in (1, 16, 128):
        reps = {1: 2000, 16: 200, 128: 50}[batch]
        if args.quick:
            reps = max(10, reps // 10)
        logits_np = rng.standard_normal((batch, vocab), dtype=np.float32)
        logits_t = torch.from_numpy(logits_np.copy())
        logits_ref = logits_t.clone()
        for kind in ("random50", "sparse", "dense"):
            bm = make_mask(kind, batch, vocab, rng)
            bm_t = torch.from_numpy(bm)
            disallowed = torch.from_numpy(~bitmask_to_bool(bm, vocab))
            # every path writes the same values whatever the logits are, so repeating in place is fair
            r_np = timeit(lambda: apply_token_bitmask(logits_np, bm), reps)
            r_t = timeit(lambda: apply_token_bitmask(logits_t, bm_t), reps)
            os.environ["CONSTRAIN_KERNEL_THREADS"] = "1"
            r_1 = timeit(lambda: apply_token_bitmask(logits_np, bm), reps)
            del os.environ["CONSTRAIN_KERNEL_THREADS"]
            reps_ref = max(10, reps // 4)  # the torch references are much slower
            r_unpack = timeit(lambda: apply_token_bitmask_torch(logits_ref, bm_t), reps_ref)
            r_fill = timeit(lambda: logits_ref.masked_fill_(disallowed, float("-inf")), reps_ref)
            assert torch.equal(logits_t, logits_ref) and np.array_equal(logits_np, logits_t.numpy())
            fmt = lambda r: f"{r[0]:8.1f} /{r[1]:8.1f}"  # noqa: E731
            print(
                f"{batch:>5} {kind:>9} | {fmt(r_np)} {fmt(r_t)} {fmt(r_1)} {fmt(r_unpack)} {fmt(r_fill)} | "
                f"{r_unpack[0] / r_np[0]:10.1f}x {r_fill[0] / r_np[0]:8.1f}x"
            )
            logits_np[:] = rng.standard_normal((batch, vocab), dtype=np.float32)
            logits_t.copy_(torch.from_numpy(logits_np))
            logits_ref.copy_(logits_t)

    # strided 1-D row as llama-cpp-python passes it
    store = rng.standard_normal((vocab, 2), dtype=np.float32)
    scores = store[:, 0]
    bm = make_mask("random50", 1, vocab, rng)[0]
    r = timeit(lambda: apply_token_bitmask(scores, bm), 500 if not args.quick else 50)
    print(f"\nstrided (V,) view (stride 8 bytes), random50: {r[0]:.1f} / {r[1]:.1f} us")
    bm = make_mask("sparse", 1, vocab, rng)[0]
    r = timeit(lambda: apply_token_bitmask(scores, bm), 500 if not args.quick else 50)
    print(f"strided (V,) view (stride 8 bytes), sparse: {r[0]:.1f} / {r[1]:.1f} us")
    for dtype in (torch.float16, torch.bfloat16, torch.float64):
        t = torch.randn(1, vocab).to(dtype)
        bm1 = torch.from_numpy(make_mask("random50", 1, vocab, rng))
        r = timeit(lambda: apply_token_bitmask(t, bm1), 500 if not args.quick else 50)
        print(f"torch {str(dtype).replace('torch.', ''):>8} batch 1, random50: {r[0]:.1f} / {r[1]:.1f} us")

    print("\nfirst-call cost in a fresh subprocess (262144 float32 logits, batch 1):")
    first_call(cold=False)  # make sure the on-disk cache holds this signature
    print(f"  warm numba cache: {first_call(cold=False)}")
    print(f"  empty numba cache (compile): {first_call(cold=True)}")


if __name__ == "__main__":
    main()
