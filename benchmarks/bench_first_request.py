"""The first request after a fresh start: how long the first schema a new process sees takes to compile, its first
mask, and the slowest mask while its first valid instance is forced, in a process that called
``constrain.warmup(vocab)`` (numba's kernels loaded from their on-disk cache, the vocabulary's shared walks made)
and ``constrain.collector.freeze()``, as ``constrain serve`` starts, with an empty constrain cache folder (no
vocabulary file, no stored lexical walks).

Run: .venv/bin/python benchmarks/bench_first_request.py [--trials 20] [--seed 0]

Each trial is a new Python process: it loads the Gemma tokenizer, points ``CONSTRAIN_CACHE_DIR`` at an empty
folder, builds the vocabulary and calls ``warmup(vocab)`` (both timed apart, as start-up), then takes one MaskBench dev
schema (a seeded draw among those that compile) as its first request, and a second schema after it for
comparison. Printed: p50 / p90 / p99 / max over the trials of the first request's TTFM (compile and first mask)
and of its slowest forcing mask, against the second request's.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

MASKBENCH = Path(__file__).resolve().parents[2] / "shared" / "data" / "maskbench-dev.jsonl.gz"


def trial(first: int, second: int) -> None:
    """In a fresh process: start-up, then the two schemas' timings as one JSON line."""
    from constrain.models.tokenizers import load_gemma_tokenizer

    tokenizer = load_gemma_tokenizer()  # converted once into the usual cache folder, before the empty one is used
    with tempfile.TemporaryDirectory() as empty:
        os.environ["CONSTRAIN_CACHE_DIR"] = empty
        import constrain
        from constrain import collector
        from constrain.kernels.bitmask import allocate_token_bitmask
        from constrain.testing.maskbench import load_records, serialise

        begun = time.perf_counter()
        vocab = constrain.Vocabulary.from_tokenizer(tokenizer)
        vocab_s = time.perf_counter() - begun
        warmup_s = constrain.warmup(vocab)
        records = load_records(MASKBENCH)  # frozen too: a server holds no such objects for a collection to walk
        collector.freeze()  # as `constrain serve` does once it is ready
        out = {"vocabulary_s": vocab_s, "warmup_s": warmup_s}
        bitmask = allocate_token_bitmask(1, vocab.size)
        for name, index in (("first", first), ("second", second)):
            record = records[index]
            begun = time.perf_counter()
            structure = constrain.compile(record["schema"], vocab, kind="json_schema")
            matcher = structure.matcher()
            matcher.fill_bitmask(bitmask, 0)
            ttfm = time.perf_counter() - begun
            slowest = 0.0
            valid = next(t for t in record["tests"] if t["valid"])
            for token in tokenizer.encode(serialise(valid["data"]), add_special_tokens=False):
                try:
                    matcher.advance(token)
                except constrain.ConstrainError:
                    break  # a valid instance in another key order
                begun = time.perf_counter()
                matcher.fill_bitmask(bitmask, 0)
                slowest = max(slowest, time.perf_counter() - begun)
            out[name] = {"schema": record.get("name"), "ttfm_s": ttfm, "slowest_mask_s": slowest}
        print(json.dumps(out))


def candidates(seed: int, count: int) -> list[int]:
    """Seeded indices of dev schemas that compile strictly and have a valid instance."""
    from constrain.compilers.json_schema import compile_json_schema
    from constrain.errors import ConstrainError
    from constrain.testing.maskbench import load_records
    from constrain.testing.vocabularies import byte_vocabulary

    records = load_records(MASKBENCH)
    order = list(range(len(records)))
    random.Random(seed).shuffle(order)
    vocab = byte_vocabulary()
    chosen = []
    for i in order:
        if not any(t["valid"] for t in records[i]["tests"]):
            continue
        try:
            compile_json_schema(records[i]["schema"], vocab, time_limit=2.0)
        except (ConstrainError, RecursionError):
            continue
        chosen.append(i)
        if len(chosen) == count:
            break
    return chosen


def percentiles(values: list[float]) -> str:
    ms = np.asarray(values) * 1e3
    return " / ".join(f"{np.percentile(ms, q):.1f}" for q in (50, 90, 99)) + f" / {ms.max():.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--trial", nargs=2, type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.trial:
        trial(*args.trial)
        return
    chosen = candidates(args.seed, 2 * args.trials)
    results = []
    for k in range(args.trials):
        done = subprocess.run(
            [sys.executable, __file__, "--trial", str(chosen[2 * k]), str(chosen[2 * k + 1])],
            capture_output=True, text=True, check=True, env={**os.environ, "OMP_NUM_THREADS": "1"},
        )  # fmt: skip
        results.append(json.loads(done.stdout.strip().splitlines()[-1]))
        print(f"trial {k + 1}: first {results[-1]['first']['ttfm_s'] * 1e3:.1f} ms", file=sys.stderr)
    print(f"{args.trials} fresh processes (empty cache folder, warmup(vocab) called), load {os.getloadavg()[0]:.2f}\n")
    print("| | p50 / p90 / p99 / max (ms) |\n|---|---|")
    print(f"| start-up: vocabulary built | {percentiles([r['vocabulary_s'] for r in results])} |")
    print(f"| start-up: warmup(vocab) | {percentiles([r['warmup_s'] for r in results])} |")
    for name in ("first", "second"):
        print(f"| {name} request: compile + first mask | {percentiles([r[name]['ttfm_s'] for r in results])} |")
        print(f"| {name} request: slowest forcing mask | {percentiles([r[name]['slowest_mask_s'] for r in results])} |")


if __name__ == "__main__":
    main()
