"""Benchmark: the whole sampling pipeline against transformers' own logits processors, in the same run.

For each batch size (1, 16, 64 rows of 262,144 logits) and each setting, one decoding step from raw logits and a
history of token ids to one sampled token per row:

- ours, numpy: ``Sampler(params)(logits, history)`` on numpy arrays;
- ours, torch: the same call on torch tensors (CPU tensors take the numpy path on a zero-copy view; CUDA tensors
  take torch ops);
- transformers: ``LogitsProcessorList([RepetitionPenalty, Temperature, TopK, TopP, MinP])(input_ids, scores)``
  then ``softmax`` and ``torch.multinomial``, at the same settings (what ``generate(do_sample=True)`` does per step).

Prints the machine, then median and p90 milliseconds per step and the ratio ours / transformers (medians; <= 1.0
means ours is no slower). Logits: float32, ``normal(0, 2.5)`` with a peaked head (3 tokens raised by 8 to 12), a
rough stand-in for a language model's next-token logits; ``--shape flat`` drops the head. History: 256 random ids.

    python benchmarks/bench_sampling.py [--batches 1 16 64] [--shape peaked|flat] [--torch-ops] [--quick]
                                        [--torch-threads N]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time

import numpy as np


def machine() -> str:
    import torch
    import transformers

    cpu = platform.processor() or ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count()
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"
    return (
        f"machine: {platform.machine()} {platform.system()} {platform.release()}; CPU: {cpu}; {cores} usable cores; "
        f"GPU: {gpu}\n"
        f"python {platform.python_version()}, numpy {np.__version__}, torch {torch.__version__} "
        f"({torch.get_num_threads()} threads), transformers {transformers.__version__}"
    )


SETTINGS = {
    "full": dict(repetition_penalty=1.1, temperature=0.8, top_k=50, top_p=0.9, min_p=0.05),
    "nucleus": dict(repetition_penalty=1.1, temperature=0.8, top_p=0.9),
    "min-p": dict(repetition_penalty=1.1, temperature=1.0, min_p=0.05),
}


def make_logits(rng: np.random.Generator, batch: int, vocab: int, shape: str) -> np.ndarray:
    x = (rng.standard_normal((batch, vocab)) * 2.5).astype(np.float32)
    if shape == "peaked":
        for r in range(batch):
            head = rng.choice(vocab, 3, replace=False)
            x[r, head] += rng.uniform(8.0, 12.0, 3).astype(np.float32)
    return x


def timeit(fn, *, min_runs: int, max_runs: int, budget_s: float) -> list[float]:
    fn()  # warm-up (numba / allocator / first-call costs)
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < max_runs and (len(times) < min_runs or time.perf_counter() - start < budget_s):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return times


def stats(times: list[float]) -> tuple[float, float]:
    s = sorted(times)
    p90 = s[min(len(s) - 1, int(round(0.9 * (len(s) - 1))))]
    return statistics.median(s), p90


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 16, 64])
    ap.add_argument("--vocab", type=int, default=262_144)
    ap.add_argument("--shape", choices=["peaked", "flat"], default="peaked")
    ap.add_argument("--settings", nargs="+", choices=sorted(SETTINGS), default=["full", "nucleus", "min-p"])
    ap.add_argument("--torch-ops", action="store_true", help="also time the torch-ops path (the GPU path) on CPU")
    ap.add_argument("--quick", action="store_true", help="fewer repetitions")
    ap.add_argument(
        "--torch-threads",
        type=int,
        default=None,
        help="torch.set_num_threads for both sides (default: torch's own choice). On a loaded machine "
        "torch's thread pool can stall; 1 gives a steadier comparison (the numpy path is one thread)",
    )
    args = ap.parse_args(argv)

    import torch
    from transformers.generation.logits_process import (
        LogitsProcessorList,
        MinPLogitsWarper,
        RepetitionPenaltyLogitsProcessor,
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
    from constrain.decoding.params import SamplingParams
    from constrain.decoding.sampling import Sampler

    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    print(machine())
    try:
        print(f"load average: {os.getloadavg()[0]:.2f}")
    except OSError:
        pass
    print(f"vocab {args.vocab:,}, logits {args.shape}, history 256 ids per row, float32; times in ms per step")
    runs = dict(min_runs=3, max_runs=10, budget_s=4.0) if args.quick else dict(min_runs=5, max_runs=30, budget_s=15.0)
    rng = np.random.default_rng(0)
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    header = f"{'setting':8} {'batch':>5} {'device':6} {'impl':18} {'median':>9} {'p90':>9} {'ours/hf':>8}"
    print(header)
    print("-" * len(header))
    worst = 0.0
    for setting in args.settings:
        kw = SETTINGS[setting]
        params = SamplingParams(seed=0, **kw)
        procs = [RepetitionPenaltyLogitsProcessor(kw["repetition_penalty"]), TemperatureLogitsWarper(kw["temperature"])]
        if kw.get("top_k"):
            procs.append(TopKLogitsWarper(kw["top_k"]))
        if kw.get("top_p", 1.0) < 1.0:
            procs.append(TopPLogitsWarper(kw["top_p"]))
        if kw.get("min_p"):
            procs.append(MinPLogitsWarper(kw["min_p"]))
        hf_list = LogitsProcessorList(procs)
        for batch in args.batches:
            logits = make_logits(rng, batch, args.vocab, args.shape)
            history = rng.integers(0, args.vocab, (batch, 256))
            for device in devices:
                t_logits = torch.from_numpy(logits).to(device)
                t_hist = torch.from_numpy(history).to(device)
                gen = torch.Generator(device=device).manual_seed(0)
                sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)

                def hf():
                    scores = hf_list(t_hist, t_logits)
                    probs = torch.softmax(scores, dim=-1)
                    out = torch.multinomial(probs, 1, generator=gen)
                    sync()
                    return out

                ours_t = Sampler(params)

                def ours_torch():
                    out = ours_t(t_logits, t_hist)
                    sync()
                    return out

                rows = []
                if device == "cpu":
                    ours_np = Sampler(params)
                    rows.append(("ours numpy", timeit(lambda: ours_np(logits, history), **runs)))
                rows.append(("ours torch", timeit(ours_torch, **runs)))
                if args.torch_ops and device == "cpu":
                    ops = Sampler(params, backend="torch")
                    rows.append(("ours torch-ops", timeit(lambda: ops(t_logits, t_hist), **runs)))
                hf_times = timeit(hf, **runs)
                hf_med, hf_p90 = stats(hf_times)
                for name, times in rows:
                    med, p90 = stats(times)
                    ratio = med / hf_med
                    if not name.endswith("torch-ops"):
                        worst = max(worst, ratio)
                    print(f"{setting:8} {batch:>5} {device:6} {name:18} {med:9.2f} {p90:9.2f} {ratio:8.3f}")
                print(f"{setting:8} {batch:>5} {device:6} {'transformers':18} {hf_med:9.2f} {hf_p90:9.2f} {1.0:8.3f}")
                sys.stdout.flush()
    print(f"worst ratio ours/transformers (numpy and torch paths): {worst:.3f} (target <= 1.0)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
