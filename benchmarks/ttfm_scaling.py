"""How TTFM grows with an object's properties, constrain against llguidance in the same run.

    .venv/bin/python benchmarks/ttfm_scaling.py                      # 1..40 properties of mixed kinds
    .venv/bin/python benchmarks/ttfm_scaling.py --kinds enum         # every property an enum of three strings
    .venv/bin/python benchmarks/ttfm_scaling.py --phases             # constrain alone, its TTFM split by phase

MaskBench's schemas differ in many ways at once; here one thing changes: the number of properties of one object.
Each trial draws an object of N properties with names not seen before (so no cache holds its rules), half of them
required. ``--kinds`` picks the properties' values among those real schemas use most (:data:`KINDS`: a string with
a description, an integer with one, a boolean, a number with a minimum, an enum of three strings, an array of
strings, a string or null, an object of two properties); ``mixed`` (the default) takes them in turn. Both engines
compile the same object, one after the other, each after ``--flush-mb`` MiB of memory is touched (as in the
whole-set run, where the other engine and the timed tests run between two compiles), on one CPU (``--cpu``). Printed
per N: the median TTFM of each engine (compile, a matcher and its first mask, as ``benchmarks/maskbench.py``
measures it) and their ratio; then the cost of a property (the least-squares slope of the medians over N) and of the
object around it (the intercept).

``--phases`` times constrain alone with ``benchmarks/ttfm_profile.py``'s phases (which adds the cost of its
timers), to show which phases grow with the properties.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import ttfm_profile  # noqa: E402  (a sibling script: the path above finds it)

#: The kinds of property values, as their subschemas: ``mixed`` cycles through them, any other choice is one of them.
KINDS = {
    "string": lambda word: {"type": "string", "description": f"The {word()}"},
    "integer": lambda word: {"type": "integer", "description": word()},
    "boolean": lambda word: {"type": "boolean"},
    "number": lambda word: {"type": "number", "minimum": 0},
    "enum": lambda word: {"type": "string", "enum": [word(), word(), word()]},
    "array": lambda word: {"type": "array", "items": {"type": "string"}},
    "nullable": lambda word: {"type": ["string", "null"]},
    "object": lambda word: {"type": "object", "properties": {word(): {"type": "string"}, word(): {"type": "integer"}}},
}


def object_schema(rng: random.Random, size: int, kinds: str) -> dict:
    """An object of ``size`` properties of ``kinds`` (``mixed`` or one of :data:`KINDS`) with fresh names, the
    first half required."""

    def word() -> str:
        return "".join(rng.choice("abcdefghijklmnopqrstuvwxyz_") for _ in range(rng.randint(4, 14)))

    makers = list(KINDS.values()) if kinds == "mixed" else [KINDS[kinds]]
    properties = {f"{word()}{i}": makers[i % len(makers)](word) for i in range(size)}
    return {"type": "object", "properties": properties, "required": list(properties)[: size // 2]}


def fit(sizes: list[int], medians: list[float]) -> tuple[float, float]:
    """Least-squares ``(slope, intercept)`` of ``medians`` over ``sizes``."""
    slope, intercept = np.polyfit(np.asarray(sizes, dtype=float), np.asarray(medians, dtype=float), 1)
    return float(slope), float(intercept)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="1,5,10,20,40", help="properties per object (default 1,5,10,20,40)")
    p.add_argument("--trials", type=int, default=30, help="objects per size (default 30)")
    p.add_argument(
        "--kinds", choices=["mixed", *KINDS], default="mixed", help="the properties' kinds (default mixed: all in turn)"
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the names and kinds (default 0)")
    p.add_argument("--engines", default="constrain,llguidance", help="engines compared (default constrain,llguidance)")
    p.add_argument("--phases", action="store_true", help="constrain alone, its TTFM split by phase")
    p.add_argument("--flush-mb", type=int, default=64, help="MiB touched before each compile (default 64)")
    ttfm_profile.add_cpu_option(p)
    args = p.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]

    import maskbench as mb

    cpu = mb.measurement_cpu(args.cpu)
    mb.pin_to_cpu(cpu)
    from constrain import Vocabulary
    from constrain.models import load_gemma_tokenizer

    tokenizer = load_gemma_tokenizer()
    vocab = Vocabulary.from_tokenizer(tokenizer)
    names = ["constrain"] if args.phases else [mb.ENGINE_ALIASES.get(n, n) for n in args.engines.split(",")]
    engines = {}
    for name in names:
        engine = mb.ENGINE_CLASSES[name]()
        engine.setup(tokenizer, vocab, {})  # constrain's: warmup(vocab) and collector.freeze(), as a server starts
        engines[name] = engine
    timers = None
    if args.phases:
        timers = ttfm_profile.Timers()
        ttfm_profile.install(timers)
    bitmask = np.zeros((1, (vocab.size + 31) // 32), dtype=np.int32)
    ballast = np.zeros(args.flush_mb << 17)  # float64: flush_mb MiB
    rng = random.Random(args.seed)
    medians: dict[str, list[float]] = {name: [] for name in engines}
    where = "the scheduler's CPUs" if cpu is None else f"CPU {cpu}"
    print(f"{args.kinds} properties, {args.trials} objects per size, {args.flush_mb} MiB touched before each, {where}")
    if args.phases:
        print("| properties | TTFM | " + " | ".join(ttfm_profile.PHASES) + " |")
        print("|---:" * (len(ttfm_profile.PHASES) + 2) + "|")
    else:
        print("| properties | " + " | ".join(f"{n} (ms)" for n in engines) + " | ratio |")
        print("|---:" * (len(engines) + 2) + "|")
    for size in sizes:
        times: dict[str, list[float]] = defaultdict(list)
        phases: dict[str, list[float]] = defaultdict(list)
        for _ in range(args.trials):
            schema = object_schema(rng, size, args.kinds)
            for name, engine in engines.items():
                ballast += 1.0
                if timers is not None:
                    timers.current = defaultdict(float)
                start = time.perf_counter()
                compiled = engine.compile(schema)
                matcher = engine.matcher(compiled)
                mask_start = time.perf_counter()
                engine.fill(matcher, bitmask)
                end = time.perf_counter()
                times[name].append(end - start)
                if timers is not None:
                    for phase in ttfm_profile.PHASES:
                        phases[phase].append(timers.current.get(phase, 0.0))
                    phases["first mask"][-1] = end - mask_start
                del compiled, matcher
        for name in engines:
            medians[name].append(1e3 * float(np.median(times[name])))
        if args.phases:
            cells = [f"{1e3 * np.median(phases[phase]):.2f}" for phase in ttfm_profile.PHASES]
            print(f"| {size} | {medians['constrain'][-1]:.2f} | " + " | ".join(cells) + " |")
        else:
            ratio = medians[names[0]][-1] / medians[names[-1]][-1] if len(names) > 1 else 1.0
            print(f"| {size} | " + " | ".join(f"{medians[n][-1]:.2f}" for n in engines) + f" | {ratio:.2f} |")
    if len(sizes) > 1:
        for name in engines:
            slope, intercept = fit(sizes, medians[name])
            print(f"{name}: {1e3 * slope:.0f} us a property, {intercept:.2f} ms for the object around them")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
