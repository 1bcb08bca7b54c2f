"""The hostile-input suite as a table: each case of :mod:`constrain.testing.hostile` run ``--repeat`` times, each
time in a fresh process, with its outcome, the median wall time of its compile calls and its peak resident memory.

    .venv/bin/python benchmarks/hostile.py --time-limit 1 --repeat 3

Prints a Markdown table (the one in BENCHMARKS.md, section "Hostile input").
"""

from __future__ import annotations

import argparse
import platform
import statistics

from tqdm import tqdm

from constrain.testing.hostile import MEMORY_BOUND_MB, cases, run_case


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--time-limit", type=float, default=1.0, help="CPU seconds per compile (default 1)")
    parser.add_argument("--repeat", type=int, default=3, help="fresh processes per case (default 3)")
    args = parser.parse_args()
    rows = []
    for name, description in tqdm(cases().items(), desc="cases"):
        runs = [run_case(name, args.time_limit) for _ in range(args.repeat)]
        outcomes = {r.outcome for r in runs}
        error = runs[-1].error.split(":", 1)[0] if runs[-1].error else ""
        seconds = statistics.median(r.seconds for r in runs)
        peak = max(r.peak_mb for r in runs)
        baseline = statistics.median(r.baseline_mb for r in runs)
        passed = all(r.passed(args.time_limit) for r in runs)
        outcome = "/".join(sorted(outcomes))
        rows.append((name, description, runs[0].compiles, outcome, error, seconds, baseline, peak, passed))
    print(f"time_limit = {args.time_limit:g} s, {args.repeat} fresh processes per case, {platform.processor() or ''}")
    print(f"memory bound {MEMORY_BOUND_MB} MB; wall bound {2 * args.time_limit:g} s per compile call\n")
    print("| case | input | calls | outcome | error | wall p50 (s) | RSS before (MB) | peak RSS (MB) | within bounds |")
    print("|---|---|---:|---|---|---:|---:|---:|---|")
    for name, description, calls, outcome, error, seconds, baseline, peak, passed in rows:
        numbers = (f"{seconds:.2f}", f"{baseline:.0f}", f"{peak:.0f}")
        cells = (name, description, calls, outcome, error, *numbers, "yes" if passed else "NO")
        print("| " + " | ".join(str(c) for c in cells) + " |")


if __name__ == "__main__":
    main()
