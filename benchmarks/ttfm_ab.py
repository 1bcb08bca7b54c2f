"""TTFM and TBM of two builds of constrain, interleaved: how a change moves compile + first mask, schema by schema,
and the time of each mask while the schema's valid instances are forced token by token.

    git worktree add /tmp/base <commit>          # the build to compare against
    .venv/bin/python benchmarks/ttfm_ab.py --base /tmp/base --sample 300 --seed 1

Two worker processes, one per build (``PYTHONPATH`` set to its checkout, the same virtual environment), take each
MaskBench schema in turn, the order alternating from schema to schema, so the machine's drift hits both alike,
both on one CPU (``--cpu``; why: ``maskbench.measurement_cpu``).
Before each schema a worker touches ``--flush-mb`` of memory, as the benchmark's other engine does between two
of its schemas: a compile's TTFM depends on what is still in the CPU's caches. Each worker starts as a server does,
with ``constrain.warmup(vocab)`` (numba's kernels loaded or compiled; a build without it loads the determinisation
kernels alone), and compiles and forces one small schema; the first run of a fresh checkout also JIT-compiles its
kernels into its own cache, so run it twice and read the second.

Prints both builds' TTFM p50 / p90 / p99 over the schemas both compiled, and the per-schema ratio (this checkout
over ``--base``): quartiles, and the ratio of sums in bands of the base's TTFM; then both builds' TBM p50 / p95 /
p99 (``fill_bitmask`` per token of the valid instances, in the schema's declared key order where that differs).
``--json-out`` writes each schema's TTFM and mask times under both builds, to find the schemas behind a percentile;
``--names`` takes a file of schema names (one per line) and runs those, in the dev set's order, instead of a
sample: a band of the TTFM distribution, measured on its own.
The worker imports only names that both the present layout and the one before ``constrain.compile`` have, so a
build from before the redesign can be the base.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent


def worker(sample: int, seed: int, flush_mb: int, names: Path | None, cpu: str) -> None:
    """Answer schema indices from stdin with the TTFM in seconds (null when refused), one JSON line each."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import maskbench as mb

    mb.pin_to_cpu(mb.measurement_cpu(cpu))

    from constrain import Vocabulary, compile_json_schema

    try:
        from constrain.automata import compile_kernels
        from constrain.models import load_gemma_tokenizer
    except ImportError:  # the layout before the redesign
        from constrain.automaton import compile_kernels
        from constrain.tokenizers import load_gemma_tokenizer

    tokenizer = load_gemma_tokenizer()
    vocab = Vocabulary.from_tokenizer(tokenizer)
    try:  # as a server starts: every kernel a compile or a mask reaches, loaded before the first schema
        from constrain import warmup
    except ImportError:  # a build without it
        compile_kernels()
    else:
        warmup(vocab)
    if names is None:
        entries = mb.load_entries(mb.DEFAULT_DATA, sample=sample, seed=seed)
    else:
        wanted = names.read_text().split()
        entries = mb.load_entries(mb.DEFAULT_DATA, names=wanted)
        missing = sorted(set(wanted) - {entry["name"] for entry in entries})
        if missing:
            raise SystemExit(f"{names}: not in the dev set: {', '.join(missing)}")
    try:  # as the MaskBench worker does: start-up's objects out of every later full collection
        from constrain.collector import freeze
    except ImportError:  # a build without it
        pass
    else:
        freeze()
    bitmask = np.zeros((1, (vocab.size + 31) // 32), dtype=np.int32)
    ballast = np.zeros(flush_mb << 17)  # float64: flush_mb MiB

    def measure(entry: dict) -> dict:
        start = time.perf_counter()
        try:
            structure = compile_json_schema(entry["schema"], vocab)
        except Exception:  # a refusal: no TTFM
            return {"ttfm": None, "tbm": []}
        structure.matcher().fill_bitmask(bitmask, 0)
        ttfm = time.perf_counter() - start
        tbm = []
        for test in mb.tokenise_tests(entry, tokenizer, vocab):
            tokens = test.get("declared_tokens", test.get("tokens")) if test["valid"] else None
            matcher = structure.matcher()
            for token in tokens or ():
                start = time.perf_counter()
                matcher.fill_bitmask(bitmask, 0)
                tbm.append(time.perf_counter() - start)
                try:
                    matcher.advance(token)
                except Exception:  # not in the declared order after all: stop this instance
                    break
        return {"ttfm": ttfm, "tbm": tbm}

    measure({"schema": mb.WARM_UP_SCHEMA, "tests": []})
    import constrain

    print(json.dumps({"ready": constrain.__file__, "schemas": len(entries)}), flush=True)
    for line in sys.stdin:
        ballast += 1.0
        entry = entries[int(line)]
        print(json.dumps({"name": entry["name"], **measure(entry)}), flush=True)


def start(root: Path, args: argparse.Namespace) -> tuple[subprocess.Popen, int]:
    """A worker for the build at ``root``, and how many schemas it will answer."""
    env = {**os.environ, "PYTHONPATH": str(root), "NUMBA_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--worker",
        "--sample",
        str(args.sample),
        "--seed",
        str(args.seed),
        "--flush-mb",
        str(args.flush_mb),
        *(["--names", str(args.names.resolve())] if args.names else []),
        "--cpu",
        args.cpu,
    ]
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env, cwd=root)
    line = proc.stdout.readline()
    if not line:  # the worker stopped and said why on stderr
        raise SystemExit(f"the worker for {root} stopped before it was ready")
    hello = json.loads(line)
    ready = hello["ready"]
    if not Path(ready).resolve().is_relative_to(root.resolve()):
        raise SystemExit(f"the worker for {root} imported constrain from {ready}")
    return proc, hello["schemas"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--base", type=Path, help="a checkout of the build to compare against (e.g. a git worktree)")
    p.add_argument("--sample", type=int, default=300, help="schemas drawn from MaskBench's dev set (default 300)")
    p.add_argument("--seed", type=int, default=1, help="seed of the sample (default 1)")
    p.add_argument("--names", type=Path, help="a file of MaskBench schema names, one per line: these, not a sample")
    p.add_argument("--flush-mb", type=int, default=64, help="MiB touched before each schema (default 64)")
    p.add_argument("--json-out", type=Path, help="write each schema's TTFM and mask times (s) under both builds here")
    p.add_argument(
        "--cpu",
        default="auto",
        help="the CPU both workers run on: 'auto' (default) the first this process may use, a CPU number, or "
        "'none' to leave them to the scheduler (see maskbench.measurement_cpu)",
    )
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        worker(args.sample, args.seed, args.flush_mb, args.names, args.cpu)
        return 0
    import maskbench as mb

    cpu = mb.measurement_cpu(args.cpu)
    args.cpu = "none" if cpu is None else str(cpu)  # what the workers are told
    if args.base is None:
        p.error("--base is required")
    (base, count), (new, _) = start(args.base, args), start(REPO, args)
    times: dict[str, list] = {"base": [], "new": []}
    names: list[str] = []
    masks: dict[str, list] = {"base": [], "new": []}
    tbm: dict[str, list] = {"base": [], "new": []}  # each schema's masks
    try:
        for i in range(count):
            order = (("base", base), ("new", new)) if i % 2 == 0 else (("new", new), ("base", base))
            for name, proc in order:
                proc.stdin.write(f"{i}\n")
                proc.stdin.flush()
                result = json.loads(proc.stdout.readline())
                times[name].append(result["ttfm"])
                if name == "new":
                    names.append(result["name"])
                masks[name].extend(result["tbm"])
                tbm[name].append(result["tbm"])
    finally:
        for proc in (base, new):
            proc.stdin.close()
            proc.wait()
    if args.json_out is not None:
        per_schema = {
            n: {"base": times["base"][i], "new": times["new"][i], "tbm_base": tbm["base"][i], "tbm_new": tbm["new"][i]}
            for i, n in enumerate(names)
        }
        args.json_out.write_text(json.dumps(per_schema, indent=1))
    both = [i for i in range(len(times["base"])) if times["base"][i] is not None and times["new"][i] is not None]
    a = 1e3 * np.array([times["base"][i] for i in both])
    b = 1e3 * np.array([times["new"][i] for i in both])
    q = (50, 90, 99)
    print(f"{len(both)} schemas both builds compiled")
    print(
        "TTFM p50 / p90 / p99 (ms): base "
        + " / ".join(f"{np.percentile(a, x):.2f}" for x in q)
        + "; this checkout "
        + " / ".join(f"{np.percentile(b, x):.2f}" for x in q)
    )
    ratio = b / a
    print(
        "per-schema ratio (this checkout / base), quartiles: "
        + " / ".join(f"{np.percentile(ratio, x):.3f}" for x in (25, 50, 75))
    )
    order = np.argsort(a)
    bands = []
    for lo, hi in ((0, 0.25), (0.25, 0.5), (0.5, 0.75), (0.75, 0.9), (0.9, 1.0)):
        idx = order[int(lo * len(a)) : int(hi * len(a))]
        if len(idx):  # a short list of names leaves some bands empty
            bands.append(f"{lo:.2f}-{hi:.2f} {b[idx].sum() / a[idx].sum():.3f}")
    print("ratio of sums by band of the base's TTFM: " + "; ".join(bands))
    q = (50, 95, 99)
    for name in ("base", "new"):
        us = 1e6 * np.array(masks[name])
        label = "base" if name == "base" else "this checkout"
        figures = " / ".join(f"{np.percentile(us, x):.1f}" for x in q) if len(us) else "none"  # no valid instance
        print(f"TBM p50 / p95 / p99 (us), {label}, {len(us)} masks: {figures}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
