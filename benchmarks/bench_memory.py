"""Resident memory of the engine: what it adds at start (the Gemma vocabulary, the kernels) and how it grows as
one process compiles every MaskBench dev schema through ``constrain.compile`` (its cache of structures, their
mask caches, the automata caches and the store of lexical walks: everything a long-lived server keeps).

Run: .venv/bin/python benchmarks/bench_memory.py [--limit N] [--plot benchmarks/memory.png] [--every 25]

Start-up steps are measured in order: Python with numpy; the Gemma tokenizer (transformers); constrain's modules
(numba, the compilers); the ``Vocabulary`` (from the on-disk cache); ``constrain.warmup()`` (numba's kernels
loaded); ``constrain.warmup(vocab)`` (the vocabulary's store of lexical walks, as a server makes at start).
"Added at start" is the last minus the tokenizer's step: what constrain itself adds. Then each schema is compiled
(``strict``, the default time limit), its first mask computed and its valid instances forced (a mask and an
advance per token), as requests would; the resident set size (``VmRSS``) is sampled every ``--every`` schemas. The
plot draws it against schemas compiled, with the process's cache budget (``constrain.set_cache_budget``) above
the start-up memory as a line.
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


def rss_mib() -> float:
    """This process's resident set size in MiB (``VmRSS`` of ``/proc/self/status``)."""
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise OSError("no VmRSS in /proc/self/status")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--limit", type=int, default=None, help="the first N schemas (default: all)")
    parser.add_argument("--every", type=int, default=25)
    parser.add_argument("--plot", type=Path, default=None)
    parser.add_argument("--json-out", type=Path, default=None)
    args = parser.parse_args()

    steps = [("python + numpy", rss_mib())]
    with gzip.open(MASKBENCH, "rt", encoding="utf-8") as lines:  # the benchmark's own data, before constrain
        records = [json.loads(line) for line in lines if line.strip()][: args.limit]
    steps.append(("MaskBench records (the benchmark's data)", rss_mib()))
    from constrain.models.tokenizers import load_gemma_tokenizer

    tokenizer = load_gemma_tokenizer()
    steps.append(("Gemma tokenizer (transformers)", rss_mib()))
    import constrain
    from constrain.cache import PROCESS_BUDGET
    from constrain.compilers.api import compile as compile_spec
    from constrain.errors import ConstrainError
    from constrain.kernels.bitmask import allocate_token_bitmask
    from constrain.testing.maskbench import serialise

    steps.append(("constrain's modules (numba included)", rss_mib()))
    vocab = constrain.Vocabulary.from_tokenizer(tokenizer)
    steps.append(("Gemma vocabulary", rss_mib()))
    constrain.warmup()
    steps.append(("warmup (kernels)", rss_mib()))
    constrain.warmup(vocab)
    steps.append(("warmup(vocab) (the vocabulary's shared walks)", rss_mib()))
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
    print("\n| step | RSS (MiB) | added (MiB) |\n|---|---:|---:|")
    previous = steps[0][1]
    for name, value in steps:
        print(f"| {name} | {value:.0f} | {value - previous:+.0f} |")
        previous = value
    start_added = steps[-1][1] - steps[2][1]
    print(f"\nconstrain added at start (after the tokenizer): {start_added:.0f} MiB")
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
