"""The hostile-input suite as a table: each case of :mod:`constrain.testing.hostile` run ``--repeat`` times, each
time in a fresh process, with its outcome, the median wall time of its compile calls and its peak resident memory;
then the suite's JSON Schema cases on each engine of ``--engines`` (constrain with its default time limit among
them), each once in a fresh process set up as the MaskBench harness sets it up (Gemma's tokenizer, one warm-up
schema), timed from the compile to the first mask (TTFM: an engine may defer work to the first mask), and
stopped after ``--engine-timeout`` seconds.

    .venv/bin/python benchmarks/hostile.py --time-limit 1 --repeat 3 --engines constrain,llguidance,xgrammar

Prints the Markdown tables of BENCHMARKS.md, section "Hostile input".
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from tqdm import tqdm

from constrain.testing.hostile import MEMORY_BOUND_MB, cases, json_schema_of, run_case


def engine_child(engine_name: str, case: str) -> None:
    """In a fresh process: set ``engine_name`` up as the MaskBench harness does, compile the case's schema and
    fill its first mask, print one JSON line."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import maskbench as mb

    from constrain.models.tokenizers import load_gemma_tokenizer
    from constrain.vocab.vocabulary import Vocabulary

    tokenizer = load_gemma_tokenizer()
    vocab = Vocabulary.from_tokenizer(tokenizer)
    engine = mb.ENGINE_CLASSES[engine_name]()
    engine.vocab_size = vocab.size
    engine.setup(tokenizer, vocab, {})
    mb.warm_up(engine, tokenizer)
    schema, _ = json_schema_of(case)
    bitmask = np.zeros((1, (vocab.size + 31) // 32), dtype=np.int32)
    started = time.perf_counter()
    try:
        engine.fill(engine.matcher(engine.compile(schema)), bitmask)
    except Exception as exc:  # each engine words its refusals its own way
        outcome, error = "refused", type(exc).__name__
    else:
        outcome, error = "compiled", ""
    seconds = time.perf_counter() - started
    peak = mb._proc_status().get("VmHWM", 0.0)
    print(json.dumps({"outcome": outcome, "error": error, "seconds": seconds, "peak_mb": peak, "v": engine.version}))


def run_engine(engine_name: str, case: str, timeout: float) -> dict:
    command = [sys.executable, __file__, "--engine-child", engine_name, case]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"outcome": f"no answer in {timeout:g} s", "error": "", "seconds": None, "peak_mb": None}
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        return {"outcome": f"crashed (exit {done.returncode})", "error": "", "seconds": None, "peak_mb": None}
    return json.loads(lines[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--time-limit", type=float, default=1.0, help="CPU seconds per compile (default 1)")
    parser.add_argument("--repeat", type=int, default=3, help="fresh processes per case (default 3)")
    parser.add_argument("--engines", default="", help="engines for the JSON Schema cases: constrain,llguidance,...")
    parser.add_argument("--engine-timeout", type=float, default=60.0, help="seconds before an engine is stopped")
    parser.add_argument("--engine-child", nargs=2, metavar=("ENGINE", "CASE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.engine_child:
        engine_child(*args.engine_child)
        return
    rows = []
    for name, description in tqdm(cases().items(), desc="cases"):
        runs = [run_case(name, args.time_limit) for _ in range(args.repeat)]
        outcome = "/".join(sorted({r.outcome for r in runs}))
        error = runs[-1].error.split(":", 1)[0] if runs[-1].error else ""
        seconds = statistics.median(r.seconds for r in runs)
        peak = max(r.peak_mb for r in runs)
        baseline = statistics.median(r.baseline_mb for r in runs)
        passed = all(r.passed(args.time_limit) for r in runs)
        rows.append((name, description, runs[0].compiles, outcome, error, seconds, baseline, peak, passed))
    print(f"time_limit = {args.time_limit:g} s, {args.repeat} fresh processes per case, {platform.machine()}")
    print(f"memory bound {MEMORY_BOUND_MB} MB; wall bound {2 * args.time_limit:g} s per compile call\n")
    print("| case | input | calls | outcome | error | wall p50 (s) | RSS before (MB) | peak RSS (MB) | within bounds |")
    print("|---|---|---:|---|---|---:|---:|---:|---|")
    for name, description, calls, outcome, error, seconds, baseline, peak, passed in rows:
        numbers = (f"{seconds:.2f}", f"{baseline:.0f}", f"{peak:.0f}")
        cells = (name, description, calls, outcome, error, *numbers, "yes" if passed else "NO")
        print("| " + " | ".join(str(c) for c in cells) + " |")
    engines = [e for e in args.engines.split(",") if e]
    if not engines:
        return
    schema_cases = [name for name in cases() if json_schema_of(name) is not None]
    jobs = [(e, n) for e in engines for n in schema_cases]
    results = {(e, n): run_engine(e, n, args.engine_timeout) for e, n in tqdm(jobs, desc="engines")}
    versions = {e: next((r["v"] for (k, _), r in results.items() if k == e and "v" in r), "?") for e in engines}
    print(f"\nJSON Schema cases, compile + first mask, Gemma's tokenizer; stopped after {args.engine_timeout:g} s\n")
    print("| case | " + " | ".join(f"{e} {versions[e]}" for e in engines) + " |")
    print("|---|" + "---|" * len(engines))
    for name in schema_cases:
        cells = []
        for engine in engines:
            r = results[engine, name]
            if r["seconds"] is None:
                cells.append(r["outcome"])
            else:
                cells.append(f"{r['outcome']} {r['seconds']:.2f} s, {r['peak_mb']:.0f} MB")
        print(f"| {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
