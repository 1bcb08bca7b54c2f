"""The metaschema check of a JSON Schema compile: jsonschema's check against the fast pre-check, on MaskBench.

    .venv/bin/python benchmarks/bench_metaschema.py               # the 200-schema sample and the whole dev set
    .venv/bin/python benchmarks/bench_metaschema.py --no-full     # the sample only (a few seconds)

Reads ``../shared/data/maskbench-dev.jsonl.gz`` in place. The sample is the one of
``benchmarks/maskbench.py --sample 200 --seed 1``. For every schema, three timings (wall clock, the best of
``--repeat`` runs; the whole set runs each once):

- jsonschema: what ``_Document`` did before the pre-check: ``best_match`` over the errors of the schema's dialect
  (validator_for, 2020-12 without ``$schema``) and, when that fails without ``$schema``, of draft-07;
- fast: ``certainly_valid`` alone, for the same dialects;
- new path: what ``_Document`` does now: for each of those dialects the fast check, and jsonschema's where it is
  not sure.

Printed: median and p90 of each in milliseconds, and how many schemas the fast check settled.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import sys
import time
from collections.abc import Callable
from importlib.metadata import version
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT.parent / "shared" / "data" / "maskbench-dev.jsonl.gz"
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import jsonschema  # noqa: E402
from jsonschema import validators  # noqa: E402

from constrain.compilers.metaschema import certainly_valid  # noqa: E402

DRAFT7 = validators.Draft7Validator


def dialects(schema: Any) -> list[type]:
    """The validator classes ``_Document`` tries, in order: the schema's dialect, then draft-07 without ``$schema``."""
    cls = validators.validator_for(schema, default=validators.Draft202012Validator)
    return [cls] if isinstance(schema, dict) and "$schema" in schema else [cls, DRAFT7]


def slow(schema: Any, cls: type) -> bool:
    return jsonschema.exceptions.best_match(cls(cls.META_SCHEMA).iter_errors(schema)) is None


def fast(schema: Any, cls: type) -> bool:
    return certainly_valid(schema, cls.__name__.replace("Validator", ""))


def jsonschema_check(schema: Any) -> bool:
    return any(slow(schema, cls) for cls in dialects(schema))


def fast_check(schema: Any) -> bool:
    return any(fast(schema, cls) for cls in dialects(schema))


def new_path(schema: Any) -> bool:
    return any(fast(schema, cls) or slow(schema, cls) for cls in dialects(schema))


def best_of(check: Callable[[Any], bool], schema: Any, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        check(schema)
        best = min(best, time.perf_counter() - start)
    return best * 1000


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def report(title: str, schemas: list[Any], repeat: int) -> None:
    rows = {name: [best_of(check, s, repeat) for s in schemas] for name, check in
            (("jsonschema", jsonschema_check), ("fast", fast_check), ("new path", new_path))}  # fmt: skip
    settled = sum(fast_check(s) for s in schemas)
    print(f"\n{title}: {len(schemas)} schemas, best of {repeat}; the fast check settles {settled}")
    print(f"{'check':<12} {'p50 ms':>9} {'p90 ms':>9} {'total s':>9}")
    for name, times in rows.items():
        print(f"{name:<12} {quantile(times, 0.5):>9.4f} {quantile(times, 0.9):>9.4f} {sum(times) / 1000:>9.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sample", type=int, default=200, help="sample size (default 200)")
    parser.add_argument("--seed", type=int, default=1, help="sample seed (default 1, as in BENCHMARKS.md)")
    parser.add_argument("--repeat", type=int, default=3, help="runs per schema in the sample (default 3)")
    parser.add_argument("--no-full", action="store_true", help="skip the whole dev set")
    args = parser.parse_args()
    if not DATA.is_file():
        sys.exit(f"MaskBench data not found at {DATA}")
    with gzip.open(DATA, "rt", encoding="utf-8") as lines:
        schemas = [json.loads(line)["schema"] for line in lines]
    print(f"python {sys.version.split()[0]}, jsonschema {version('jsonschema')}, load average {os.getloadavg()[0]:.2f}")
    picked = sorted(random.Random(args.seed).sample(range(len(schemas)), min(args.sample, len(schemas))))
    report(f"sample (--sample {args.sample} --seed {args.seed})", [schemas[i] for i in picked], args.repeat)
    if not args.no_full:
        report("whole dev set", schemas, 1)


if __name__ == "__main__":
    main()
