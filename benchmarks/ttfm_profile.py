"""Where a JSON Schema's TTFM goes, phase by phase, over MaskBench schemas (one process, as the whole-set run).

    .venv/bin/python benchmarks/ttfm_profile.py --out /tmp/profile.json     # every dev-set schema
    .venv/bin/python benchmarks/ttfm_profile.py --sample 300 --cprofile 40  # a sample, cProfile of its p90-p99
    .venv/bin/python benchmarks/ttfm_profile.py --sample 300 --cprofile 40 --band 0.25,0.75

The process starts as MaskBench's constrain worker does (``warmup(vocab)``, then ``collector.freeze()``), on one
CPU (``--cpu``). Each
schema is compiled with the Gemma tokenizer's vocabulary, a matcher made and its first mask computed (TTFM, as
``benchmarks/maskbench.py`` measures it), with the time split by ``time.perf_counter`` around each phase. Before
each schema the run touches ``--flush-mb`` of memory (64 MiB by default), as the whole-set run's other engines and
timed tests do between two compiles: a compile right after another finds more of its code and data in the CPU's
caches and takes about two thirds of the time at the median.

- ``lowering``: the schema to a grammar (``schema_to_grammar``), less what the next three name;
- ``document``: reading the document (its metaschema check, references) and validating enum values and
  property names against subschemas (jsonschema);
- ``string automata``: patterns' text automata, automata over code points (formats, excluded names, patterns
  combined with other constraints, ``patternProperties``), the counted strings and their walks, and the keys
  other than an object's names, with the byte DFAs they are written as;
- ``finalize``: the grammar's clean-up (unproductive and unreachable rules, alias cycles);
- ``nfa``: the rule NFAs (Thompson construction, in Python);
- ``determinize``: subset construction and minimisation of each rule NFA (one numba kernel call per rule);
- ``rules other``: the rest of ``build_pushdown`` (hoisting terminals, aliases, the rule DFA cache, the checks);
- ``machine``: the rule DFAs appended to one global state space (``Machine._append``; a lazily built pushdown
  appends a rule when the first mask reaches it);
- ``masks setup``: the structure's mask cache and its hash arrays;
- ``first mask``: a matcher and its first ``fill_bitmask``.

Beside the phases, each report gives the time Python's cyclic garbage collector ran inside the TTFMs (it runs in
whichever phase allocated last) and how many of its runs were full collections.

The phases are reported over all schemas compiled and over bands of their TTFM (p0-p50, p50-p90, p90-p99,
p99-p100), all from the one run: the process-wide caches (string automata, rule DFAs, lexical walks) warm as the
run goes, as they do in the whole-set benchmark, so a band profiled alone would be slower than in context.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

PHASES = (
    "lowering",
    "document",
    "string automata",
    "finalize",
    "nfa",
    "determinize",
    "rules other",
    "machine",
    "masks setup",
    "first mask",
)


class Timers:
    """Seconds per phase for the schema being measured; nested phases are subtracted from their parent."""

    def __init__(self) -> None:
        self.current: dict[str, float] = defaultdict(float)
        self.stack: list[list] = []

    def wrap(self, name: str, fn, inside: dict[str, str] | None = None):
        """``fn`` timed as phase ``name``, or as ``inside[outer]`` when called within phase ``outer``."""

        def timed(*args, **kwargs):
            phase = name
            if inside:
                for frame in reversed(self.stack):
                    if frame[0] in inside:
                        phase = inside[frame[0]]
                        break
            frame = [phase, time.perf_counter(), 0.0]
            self.stack.append(frame)
            try:
                return fn(*args, **kwargs)
            finally:
                self.stack.pop()
                spent = time.perf_counter() - frame[1]
                self.current[frame[0]] += spent - frame[2]
                if self.stack:
                    self.stack[-1][2] += spent

        return timed


def install(timers: Timers) -> None:
    """Wrap the phases' functions where their callers look them up."""
    import constrain.compilers.json_schema.cdfa as cdfa
    import constrain.compilers.json_schema.compiler as compiler
    import constrain.compilers.json_schema.document as document
    import constrain.compilers.json_schema.rules as schema_rules
    import constrain.compilers.json_schema.strings as strings
    import constrain.grammar.rules as rules
    import constrain.runtime.pushdown as pushdown
    from constrain.automata.nfa import ByteNFA

    compiler.schema_to_grammar = timers.wrap("lowering", compiler.schema_to_grammar)
    compiler._finalize = timers.wrap("finalize", schema_rules._finalize)
    document._Document.__init__ = timers.wrap("document", document._Document.__init__)
    document._Document.is_valid = timers.wrap("document", document._Document.is_valid)
    for name in ("intersect", "minus", "minimized", "encode_json", "to_byte_dfa"):
        setattr(cdfa._CDFA, name, timers.wrap("string automata", getattr(cdfa._CDFA, name)))
    cdfa._CDFA.from_regex = staticmethod(timers.wrap("string automata", cdfa._CDFA.from_regex))
    for name in ("_counted_dfa", "_counted_walk", "_key_except_dfa", "_string_automaton", "_search_text"):
        setattr(strings, name, timers.wrap("string automata", getattr(strings, name)))
    pushdown.build_pushdown = timers.wrap("rules other", pushdown.build_pushdown)
    rules._build_rule_dfa = timers.wrap("nfa", rules._build_rule_dfa)
    # a rule's NFA is determinised inside build_pushdown; a string automaton's, inside the lowering
    ByteNFA.determinize = timers.wrap(
        "determinize", ByteNFA.determinize, {"nfa": "determinize", "string automata": "string automata"}
    )
    pushdown.Machine._append = timers.wrap("machine", pushdown.Machine._append)
    pushdown.PushdownMasks.__init__ = timers.wrap("masks setup", pushdown.PushdownMasks.__init__)


def add_cpu_option(parser: argparse.ArgumentParser) -> None:
    """``--cpu``, the CPU a one-process benchmark stays on (:func:`maskbench.measurement_cpu` reads it)."""
    parser.add_argument(
        "--cpu",
        default="auto",
        help="the CPU the run stays on: 'auto' (default) the first this process may use, a CPU number, or 'none' "
        "(see maskbench.measurement_cpu)",
    )


def report(records: list[dict], title: str) -> None:
    """The phases' sums, shares and percentiles over ``records``."""
    ms = 1e3 * np.array([r["ttfm"] for r in records])
    print(
        f"{title}: {len(records)} schemas, TTFM p50 / p90 / p99 (ms) "
        + " / ".join(f"{np.percentile(ms, q):.2f}" for q in (50, 90, 99))
        + f", sum {ms.sum() / 1e3:.2f} s"
    )
    total = ms.sum()
    print(f"  {'phase':<16}{'sum (ms)':>10}{'share':>8}{'p50 (ms)':>10}{'p90 (ms)':>10}")
    for phase in PHASES:
        values = np.array([r["phases"].get(phase, 0.0) for r in records]) * 1e3
        print(
            f"  {phase:<16}{values.sum():>10.1f}{values.sum() / total:>8.1%}"
            f"{np.percentile(values, 50):>10.3f}{np.percentile(values, 90):>10.3f}"
        )
    rest = total - 1e3 * sum(sum(r["phases"].values()) for r in records)
    print(f"  {'unaccounted':<16}{rest:>10.1f}{rest / total:>8.1%}")
    collected = 1e3 * sum(r["collections"] for r in records)
    full = sum(r["full collections"] for r in records)
    print(f"  of all phases, the garbage collector's: {collected:.1f} ms ({collected / total:.1%}), {full} full")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, help="write each schema's TTFM and phases here (JSON)")
    p.add_argument("--sample", type=int, help="schemas drawn at random from the dev set (default: all of them)")
    p.add_argument("--seed", type=int, default=7, help="seed of the sample (default 7)")
    p.add_argument("--limit", type=int, help="the first N schemas only")
    p.add_argument("--names", help="only these schemas (comma-separated names)")
    p.add_argument("--cprofile", type=int, default=0, help="print cProfile's N top functions over one band")
    p.add_argument(
        "--band", default="0.9,0.99", help="the band --cprofile reads, as quantiles of TTFM (default 0.9,0.99)"
    )
    p.add_argument("--sort", default="tottime", help="the order of --cprofile's functions (default tottime)")
    p.add_argument(
        "--flush-mb",
        type=int,
        default=64,
        help="MiB of memory touched before each schema, as the whole-set run's other engine and tests do (default 64)",
    )
    add_cpu_option(p)
    args = p.parse_args(argv)

    import maskbench as mb

    mb.pin_to_cpu(mb.measurement_cpu(args.cpu))

    from constrain import Vocabulary, collector
    from constrain.compilers.json_schema import compile_json_schema
    from constrain.compilers.warmup import warmup
    from constrain.models import load_gemma_tokenizer
    from constrain.testing.collector_time import CollectorTime

    vocab = Vocabulary.from_tokenizer(load_gemma_tokenizer())
    warmup(vocab)
    names = args.names.split(",") if args.names else None
    entries = mb.load_entries(mb.DEFAULT_DATA, limit=args.limit, sample=args.sample, seed=args.seed, names=names)
    collector.freeze()  # as the MaskBench worker does: start-up's objects out of every later full collection
    timers = Timers()
    install(timers)
    collections = CollectorTime().install()
    bitmask = np.zeros((1, (vocab.size + 31) // 32), dtype=np.int32)
    compile_json_schema(mb.WARM_UP_SCHEMA, vocab).matcher().fill_bitmask(bitmask, 0)
    ballast = np.zeros(args.flush_mb << 17)  # float64: flush_mb MiB
    records = []
    for entry in entries:
        ballast += 1.0
        timers.current = defaultdict(float)
        collections.reset()
        profiler = cProfile.Profile() if args.cprofile else None
        if profiler:
            profiler.enable()
        start = time.perf_counter()
        try:
            structure = compile_json_schema(entry["schema"], vocab)
        except Exception:
            records.append({"name": entry["name"], "ttfm": None})
            continue
        finally:
            if profiler:
                profiler.disable()
        mask_start = time.perf_counter()
        if profiler:
            profiler.enable()
        structure.matcher().fill_bitmask(bitmask, 0)
        if profiler:
            profiler.disable()
        end = time.perf_counter()
        phases = dict(timers.current)
        phases["first mask"] = end - mask_start
        pushdown = structure.pushdown
        record = {
            "name": entry["name"],
            "ttfm": end - start,
            "phases": phases,
            "rules": len(pushdown.names),
            "rules built": sum(pushdown.is_built(i) for i in range(len(pushdown.names))),
            "states": structure.machine.num_states,
            "collections": collections.seconds,
            "full collections": collections.full,
        }
        if profiler:
            record["profile"] = profiler
        records.append(record)
        del structure, pushdown  # freed here, not inside the next schema's TTFM (as MaskBench's worker frees it)
    done = [r for r in records if r["ttfm"] is not None]
    print(f"{len(done)} of {len(records)} schemas compiled")
    report(done, "all")
    times = np.array([r["ttfm"] for r in done])
    for lo, hi in ((0.0, 0.5), (0.5, 0.9), (0.9, 0.99), (0.99, 1.0)):
        a, b = np.quantile(times, lo), np.quantile(times, hi)
        band = [r for r in done if a <= r["ttfm"] <= b]
        if band:
            report(band, f"p{100 * lo:g}-p{100 * hi:g} band")
    if args.cprofile:
        a, b = np.quantile(times, [float(q) for q in args.band.split(",")])
        stats = None
        for r in done:
            if a <= r["ttfm"] <= b:
                stats = pstats.Stats(r["profile"]) if stats is None else stats.add(r["profile"])
        out = io.StringIO()
        stats.stream = out
        stats.sort_stats(args.sort).print_stats(args.cprofile)
        print(out.getvalue())
    if args.out:
        args.out.write_text(json.dumps([{k: v for k, v in r.items() if k != "profile"} for r in records]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
