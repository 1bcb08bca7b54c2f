"""What the whole-set run does between two schemas costs the next compile: the schema's tests, and gc.collect().

    .venv/bin/python benchmarks/ttfm_aftermath.py --sample 2500

MaskBench's worker forces each schema's instances after its TTFM and then runs ``gc.collect()``, outside the
timings; the next schema's compile then starts in a process that has just freed that structure and its caches and
collected its garbage. Here one process sets constrain's MaskBench engine up as the worker does and runs each
schema through the harness's own ``run_schema`` (compile, first mask, then the instances), with ``--flush-mb`` of
memory touched before it; a coin decides whether the schema's instances are forced (given to ``run_schema``), and
another whether ``gc.collect()`` runs after it. Each TTFM is then filed under what was done after the compile
before it, and divided by the same schema's TTFM in a ``ttfm_profile.py --out`` run (nothing between schemas)
when one is given, so that the four groups compare alike whatever schemas chance puts in them.
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sample", type=int, default=2500, help="schemas drawn from the dev set (default 2500)")
    p.add_argument("--seed", type=int, default=9, help="seed of the sample and of the coins (default 9)")
    p.add_argument("--flush-mb", type=int, default=64, help="MiB touched before each schema (default 64)")
    p.add_argument("--reference", nargs="*", type=Path, default=[], help="ttfm_profile.py --out files to divide by")
    args = p.parse_args(argv)

    import maskbench as mb

    from constrain.models import load_gemma_tokenizer
    from constrain.vocab.vocabulary import Vocabulary

    tokenizer = load_gemma_tokenizer()
    vocab = Vocabulary.from_tokenizer(tokenizer)
    engine = mb.ConstrainEngine()
    engine.vocab_size = vocab.size
    engine.setup(tokenizer, vocab, {})  # warmup(vocab), collector.freeze(): as the worker
    mb.warm_up(engine, tokenizer)
    entries = mb.load_entries(mb.DEFAULT_DATA, sample=args.sample, seed=args.seed)
    tests = [mb.tokenise_tests(entry, tokenizer, vocab) for entry in entries]
    gc.freeze()  # the worker holds one schema at a time: its collections do not walk the whole sample
    bitmask = np.zeros((1, (vocab.size + 31) // 32), dtype=np.int32)
    ballast = np.zeros(max(1, args.flush_mb) << 17)  # float64: flush_mb MiB
    coins = random.Random(args.seed)
    before: tuple[bool, bool] | None = None  # (instances forced, collected) after the previous compile
    rows: list[tuple[str, tuple[bool, bool], float]] = []
    for entry, schema_tests in zip(entries, tests):
        forced, collected = coins.random() < 0.5, coins.random() < 0.5
        ballast += 1.0
        record = mb.run_schema(engine, {"schema": entry["schema"], "tests": schema_tests if forced else []}, bitmask)
        if record["status"] != "ok":  # a refusal: what follows it is not what follows a compile
            before = None
            continue
        if before is not None:
            rows.append((entry["name"], before, record["ttfm_s"]))
        if collected:
            gc.collect()
        before = (forced, collected)

    references = [
        {r["name"]: r["ttfm"] for r in json.loads(path.read_text()) if r["ttfm"] is not None} for path in args.reference
    ]
    print(f"{len(rows)} compiles, each filed under what followed the compile before it")
    for group in sorted({g for _, g, _ in rows}):
        ms = 1e3 * np.array([t for _, g, t in rows if g == group])
        line = f"tests forced {group[0]!s:5}, gc.collect() {group[1]!s:5}: {len(ms)} schemas, TTFM p50 / p90 (ms) "
        line += f"{np.percentile(ms, 50):.2f} / {np.percentile(ms, 90):.2f}"
        if references:
            ratios = [
                t / min(ref[name] for ref in references)
                for name, g, t in rows
                if g == group and all(name in ref for ref in references)
            ]
            line += f", median ratio to the reference {np.median(ratios):.3f}"
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
