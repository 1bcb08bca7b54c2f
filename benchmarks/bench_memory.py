"""Resident memory of the engine: what it adds at start (the Gemma vocabulary, the kernels) and how it grows as
one process compiles every MaskBench dev schema through ``constrain.compile`` (its cache of structures, their
mask caches, the automata caches and the store of lexical walks: everything a long-lived server keeps).

Run: .venv/bin/python benchmarks/bench_memory.py [--limit N] [--plot benchmarks/memory.png] [--every 25]

Start-up steps are measured in order: Python with numpy; the Gemma tokenizer (transformers); constrain's modules
(numba, the compilers); the ``Vocabulary`` (from the on-disk cache); ``constrain.warmup()`` (numba's kernels
loaded); ``constrain.warmup(vocab)`` (the vocabulary's store of lexical walks, as a server makes at start).
"Added at start" is the last minus the tokenizer's step: what constrain itself adds; beside the RSS, its anonymous
part (``RssAnon``: what the process allocated), since the rest, pages of the shared libraries it maps (numba's LLVM
is a 180 MB library), varies with what of those files the kernel maps at each fault, not with the engine. Then
each schema is compiled (``strict``, the default time limit), its first mask computed and its valid instances
forced (a mask and an advance per token), as requests would; the resident set size (``VmRSS``) is sampled every
``--every`` schemas. The plot draws it against schemas compiled, with the process's cache budget
(``constrain.set_cache_budget``) above the start-up memory as a line.
"""

from __future__ import annotations

import argparse
import gc
import gzip
import json
import os
import time
from pathlib import Path

import numpy as np

MASKBENCH = Path(__file__).resolve().parents[2] / "shared" / "data" / "maskbench-dev.jsonl.gz"


def rss_mib(field: str = "VmRSS") -> float:
    """This process's resident set size in MiB (``VmRSS`` of ``/proc/self/status``), or another of its fields
    (``RssAnon``: the memory it allocated, without the pages of files it maps)."""
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    raise OSError(f"no {field} in /proc/self/status")


def step(name: str) -> tuple[str, float, float]:
    """A start-up step: its name, the RSS and the anonymous part of it after it (MiB)."""
    return name, rss_mib(), rss_mib("RssAnon")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--limit", type=int, default=None, help="the first N schemas (default: all)")
    parser.add_argument("--every", type=int, default=25)
    parser.add_argument("--plot", type=Path, default=None)
    parser.add_argument("--json-out", type=Path, default=None)
    args = parser.parse_args()

    steps = [step("python + numpy")]
    with gzip.open(MASKBENCH, "rt", encoding="utf-8") as lines:  # the benchmark's own data, before constrain
        records = [json.loads(line) for line in lines if line.strip()][: args.limit]
    steps.append(step("MaskBench records (the benchmark's data)"))
    from constrain.models.tokenizers import load_gemma_tokenizer

    tokenizer = load_gemma_tokenizer()
    steps.append(step("Gemma tokenizer (transformers)"))
    import constrain
    from constrain.cache import PROCESS_BUDGET
    from constrain.compilers.api import compile as compile_spec
    from constrain.errors import ConstrainError
    from constrain.kernels.bitmask import allocate_token_bitmask
    from constrain.testing.maskbench import serialise

    steps.append(step("constrain's modules (numba included)"))
    vocab = constrain.Vocabulary.from_tokenizer(tokenizer)
    steps.append(step("Gemma vocabulary"))
    constrain.warmup()
    steps.append(step("warmup (kernels)"))
    constrain.warmup(vocab)
    steps.append(step("warmup(vocab) (the vocabulary's shared walks)"))
    gc.collect()

    bitmask = allocate_token_bitmask(1, vocab.size)
    points = [(0, rss_mib())]
    compiled = refused = 0
    begun = time.perf_counter()
    for i, record in enumerate(records, 1):
        try:
            structure = compile_spec(record["schema"], vocab, kind="json_schema")
        except (ConstrainError, RecursionError):
            refused += 1
        else:
            compiled += 1
            for test in record["tests"]:
                if not test["valid"]:
                    continue
                matcher = structure.matcher()
                tokens = tokenizer.encode(serialise(test["data"]), add_special_tokens=False)
                try:
                    for token in tokens:
                        matcher.fill_bitmask(bitmask, 0)
                        matcher.advance(token)
                except ConstrainError:
                    pass  # a valid instance in another key order: rejected, as MaskBench counts
        if i % args.every == 0 or i == len(records):
            points.append((i, rss_mib()))
    seconds = time.perf_counter() - begun

    bound_mib = PROCESS_BUDGET.max_bytes / 2**20
    held_mib = PROCESS_BUDGET.used_bytes / 2**20
    print(f"machine: {os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}; {len(records)} schemas in {seconds:.0f} s "
          f"({compiled} compiled, {refused} refused)")  # fmt: skip
    print("\n| step | RSS (MiB) | added (MiB) | of which anonymous (MiB) |\n|---|---:|---:|---:|")
    previous, previous_anon = steps[0][1], steps[0][2]
    for name, value, anon in steps:
        print(f"| {name} | {value:.0f} | {value - previous:+.0f} | {anon - previous_anon:+.0f} |")
        previous, previous_anon = value, anon
    start_added = steps[-1][1] - steps[2][1]
    start_anon = steps[-1][2] - steps[2][2]
    print(f"\nconstrain added at start (after the tokenizer): {start_added:.0f} MiB, {start_anon:.0f} MiB of it "
          "anonymous (the rest: pages of the shared libraries it maps, LLVM's above all)")  # fmt: skip
    rss = np.array([p[1] for p in points])
    print(f"RSS over the schemas: start {rss[0]:.0f}, p50 {np.median(rss):.0f}, max {rss.max():.0f} MiB; "
          f"growth {rss[-1] - rss[0]:+.0f} MiB; the caches hold {held_mib:.0f} MiB at the end, "
          f"their budget is {bound_mib:.0f} MiB")  # fmt: skip
    quarter = max(1, len(points) // 4)
    growth = [points[min(k + quarter, len(points) - 1)][1] - points[k][1] for k in range(0, len(points) - 1, quarter)]
    print("growth by quarter of the run (MiB): " + ", ".join(f"{g:+.0f}" for g in growth))
    if args.json_out:
        args.json_out.write_text(json.dumps({"steps": steps, "points": points, "bound_mib": bound_mib}))
    if args.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(7, 3.6))
        ax.plot([p[0] for p in points], rss, label="resident memory")
        ax.axhline(rss[0], color="grey", linestyle=":", label="after start-up")
        ax.axhline(rss[0] + bound_mib, color="tab:red", linestyle="--", label="start-up + cache budget")
        ax.set_xlabel("MaskBench schemas compiled (and their valid instances forced)")
        ax.set_ylabel("RSS (MiB)")
        ax.set_title("constrain in one process over the dev set (Gemma 3 vocabulary)")
        ax.legend(loc="lower right")
        fig.tight_layout()
        fig.savefig(args.plot, dpi=110)
        print(f"plot: {args.plot}")


if __name__ == "__main__":
    main()
