"""Time of ``advance`` per token while MaskBench schemas' valid instances are forced token by token: constrain (this
checkout, and optionally another build, interleaved schema by schema) and llguidance in the same run.

    .venv/bin/python benchmarks/bench_advance.py --sample 200 --seed 0
    git worktree add /tmp/base <commit>          # the build to compare against
    .venv/bin/python benchmarks/bench_advance.py --sample 200 --seed 0 --base /tmp/base

``--head`` times another checkout than this one (a worktree holding only the change under test, when this
checkout holds other work in progress).

A seeded sample of the dev set (``../shared/data/maskbench-dev.jsonl.gz``); each schema is compiled (JSON Schema,
Gemma 3 tokenizer), and each valid instance is serialised compactly (``json.dumps(x, separators=(",", ":"),
ensure_ascii=False)``), tokenised without BOS (in the schema's declared key order where that differs, the order
constrain's compiler writes) and read one token at a time by a fresh matcher, ``perf_counter_ns`` around each
``advance`` (llguidance: ``LLMatcher.consume_token``). An instance an engine refuses stops at the refused token
(its time is not counted). With ``--masks`` a mask is filled before each token, untimed, as a decoding loop does
(the CPU's caches then hold what the mask walked, not what advance last read).

One worker process per engine or build (``PYTHONPATH`` set to its checkout, one thread each) takes each schema in
turn, the order rotating from schema to schema so the machine's drift hits all alike. Each worker forces a small
schema first (numba's kernels loaded, llguidance's lazy set-up done). ``--rounds 2`` runs the whole sample twice
(a second pass over a schema in a new worker process: the same compiled-once, first-visit situation). Prints a
markdown table of p50 / p90 / p99 / mean (µs): the builds of constrain over the schemas all of them compiled,
each engine over the schemas it compiled, and every engine over the schemas all engines compiled.
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
ENV = {
    "NUMBA_NUM_THREADS": "1",
    "OMP_NUM_THREADS": "1",
    "RAYON_NUM_THREADS": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "HF_HUB_OFFLINE": "1",
}


def worker(engine: str, sample: int, seed: int, masks: bool) -> None:
    """Answer schema indices from stdin with the advance times (ns) of their valid instances, one JSON line each."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import maskbench as mb

    from constrain import Vocabulary
    from constrain.models.tokenizers import load_gemma_tokenizer

    tokenizer = load_gemma_tokenizer()
    vocab = Vocabulary.from_tokenizer(tokenizer)
    entries = mb.load_entries(mb.DEFAULT_DATA, sample=sample, seed=seed)
    bitmask = np.zeros((1, (vocab.size + 31) // 32), dtype=np.int32)
    clock = time.perf_counter_ns

    if engine == "llguidance":
        import llguidance
        import llguidance.hf

        llg_tokenizer = llguidance.hf.from_tokenizer(tokenizer, eos_token=list(mb.EOS_IDS))

        def compile_schema(schema):
            matcher = llguidance.LLMatcher(
                llg_tokenizer, llguidance.LLMatcher.grammar_from_json_schema(schema), log_level=0
            )
            if matcher.is_error():
                raise ValueError(matcher.get_error())
            return matcher

        def new_matcher(compiled):
            return compiled.deep_copy()

        def fill(matcher):
            matcher.unsafe_compute_mask_ptr(bitmask.ctypes.data, bitmask.nbytes)

        def force(matcher, tokens, times):
            consume = matcher.consume_token
            for token in tokens:
                if masks:
                    fill(matcher)
                start = clock()
                ok = consume(token)
                end = clock()
                if not ok:
                    return False
                times.append(end - start)
            return True

        label = f"llguidance {mb._version('llguidance')}"
    else:
        from constrain import compile_json_schema
        from constrain.automata.nfa import compile_kernels
        from constrain.errors import TokenError

        compile_kernels()

        def compile_schema(schema):
            return compile_json_schema(schema, vocab)

        def new_matcher(compiled):
            return compiled.matcher()

        def force(matcher, tokens, times):
            advance = matcher.advance
            for token in tokens:
                if masks:
                    matcher.fill_bitmask(bitmask, 0)
                start = clock()
                try:
                    advance(token)
                except TokenError:
                    return False
                times.append(clock() - start)
            return True

        import constrain

        label = str(Path(constrain.__file__).resolve().parent.parent)

    def measure(entry: dict, tests: list[dict]) -> dict:
        try:
            compiled = compile_schema(entry["schema"])
        except Exception as e:  # a refusal
            return {"compiled": False, "times": [], "refused": 0, "error": f"{type(e).__name__}: {e}"[:200]}
        times: list[int] = []
        refused = 0
        for test in tests:
            tokens = test.get("declared_tokens", test.get("tokens"))
            if not test["valid"] or tokens is None:
                continue
            if not force(new_matcher(compiled), tokens, times):
                refused += 1
        return {"compiled": True, "times": times, "refused": refused}

    warm = mb.WARM_UP_SCHEMA
    warm_tokens = tokenizer.encode(mb.serialise({"a": "xy", "b": 12}), add_special_tokens=False)
    measure({"schema": warm}, [{"valid": True, "tokens": [int(t) for t in warm_tokens]}])
    print(json.dumps({"ready": label}), flush=True)
    for line in sys.stdin:
        entry = entries[int(line)]
        print(json.dumps(measure(entry, mb.tokenise_tests(entry, tokenizer, vocab))), flush=True)


def start(name: str, engine: str, root: Path, args: argparse.Namespace) -> subprocess.Popen:
    env = {**os.environ, **ENV, "PYTHONPATH": str(root)}
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", engine]
    cmd += ["--sample", str(args.sample), "--seed", str(args.seed)] + (["--masks"] if args.masks else [])
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env, cwd=root)
    ready = json.loads(proc.stdout.readline())["ready"]
    if engine == "constrain" and Path(ready).resolve() != root.resolve():
        raise SystemExit(f"the worker for {root} imported constrain from {ready}")
    print(f"worker {name}: {ready}", file=sys.stderr, flush=True)
    return proc


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sample", type=int, default=200, help="schemas drawn from MaskBench's dev set (default 200)")
    p.add_argument("--seed", type=int, default=0, help="seed of the sample (default 0)")
    p.add_argument("--base", type=Path, help="a checkout of another build of constrain to time too (a git worktree)")
    p.add_argument("--head", type=Path, help="the checkout to time instead of this one (a git worktree)")
    p.add_argument("--no-llguidance", action="store_true", help="leave llguidance out even where it is installed")
    p.add_argument("--masks", action="store_true", help="fill a mask (untimed) before each token")
    p.add_argument("--rounds", type=int, default=1, help="passes over the sample, each in new workers (default 1)")
    p.add_argument("--verbose", action="store_true", help="print each refusal's error")
    p.add_argument("--json-out", type=Path, help="write every engine's times (ns) here")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        worker(args.worker, args.sample, args.seed, args.masks)
        return 0
    head = (args.head or REPO).resolve()
    engines = [("head" if args.head else "this checkout", "constrain", head)]
    if args.base is not None:
        engines.insert(0, ("base", "constrain", args.base.resolve()))
    if not args.no_llguidance:
        try:
            import llguidance  # noqa: F401
        except ImportError:
            print("llguidance is not importable: left out", file=sys.stderr)
        else:
            engines.append(("llguidance", "llguidance", REPO))
    # Per engine, per (round, schema): the advance times (ns), or None when the engine refused the schema.
    results: dict[str, dict[tuple[int, int], list[int] | None]] = {name: {} for name, _, _ in engines}
    refused = {name: 0 for name, _, _ in engines}
    begun = time.perf_counter()
    for round_ in range(args.rounds):
        procs = [(name, start(name, engine, root, args)) for name, engine, root in engines]
        try:
            for i in range(args.sample):
                shift = (i + round_) % len(procs)
                for name, proc in procs[shift:] + procs[:shift]:
                    proc.stdin.write(f"{i}\n")
                    proc.stdin.flush()
                    result = json.loads(proc.stdout.readline())
                    results[name][round_, i] = result["times"] if result["compiled"] else None
                    refused[name] += result["refused"]
                    if args.verbose and "error" in result:
                        print(f"{name}: schema {i} refused: {result['error']}", file=sys.stderr)
                if (i + 1) % 50 == 0:
                    print(f"round {round_ + 1}: {i + 1} schemas, {time.perf_counter() - begun:.0f} s", file=sys.stderr)
        finally:
            for _, proc in procs:
                proc.stdin.close()
                proc.wait()
    command = "benchmarks/bench_advance.py " + " ".join(sys.argv[1:] if argv is None else argv)
    print(f"`.venv/bin/python {command.strip()}`\n")
    masks = "a mask filled before each token (untimed)" if args.masks else "no masks in between"
    print(f"advance per token, µs ({args.sample} schemas, seed {args.seed}, {args.rounds} round(s), {masks})\n")
    builds = [name for name, engine, _ in engines if engine == "constrain"]
    # The builds of constrain over the schemas every one of them compiled (a compile near its time limit may be
    # refused in one worker and not another), each engine over all it compiled, and every engine over the
    # schemas all of them compiled.
    common = [key for key in results[builds[0]] if all(results[name][key] is not None for name in builds)]
    everyone = [key for key in common if all(results[name][key] is not None for name, _, _ in engines)]
    rows = [(f"{name}, schemas all builds compiled", name, common) for name in builds if len(builds) > 1]
    rows += [(f"{name}, schemas it compiled", name, list(results[name])) for name, _, _ in engines]
    if len(engines) > 1:
        rows += [(f"{name}, schemas every engine compiled", name, everyone) for name, _, _ in engines]
    print("| engine | schemas | instances refused | tokens | p50 | p90 | p99 | mean |")
    print("|---|---|---|---|---|---|---|---|")
    for label, name, keys in rows:
        kept = [results[name][key] for key in keys if results[name][key] is not None]
        ns = [t for times in kept for t in times]
        us = np.array(ns, dtype=np.float64) / 1e3 if ns else np.array([np.nan])
        q = np.percentile(us, (50, 90, 99))
        print(
            f"| {label} | {len(kept)} | {refused[name]} | {len(ns):,} | {q[0]:.2f} | {q[1]:.2f} | {q[2]:.2f} | "
            f"{us.mean():.2f} |"
        )
    if args.json_out is not None:
        out = {name: {f"{r}:{i}": times for (r, i), times in per.items()} for name, per in results.items()}
        args.json_out.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "times": out}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
