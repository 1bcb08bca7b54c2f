"""What the slowest masks do: which masks lie above a percentile of time between masks (TBM), and where the time of
a mask that writes a put-off value goes.

    .venv/bin/python benchmarks/tbm_profile.py --sample 600 --seed 5

The process starts as MaskBench's constrain worker does (``warmup(vocab)``, then ``collector.freeze()``), on one
CPU (``--cpu``). Each schema is compiled with the Gemma tokenizer's vocabulary and its valid instances are forced
token by token, each mask timed as ``benchmarks/maskbench.py`` times it (``fill_bitmask`` alone); before each
schema the run touches ``--flush-mb`` of memory, as the whole-set run's other engines do between two schemas.

Each mask is filed by the most costly thing it did: it *writes a put-off value* (lazy lowering's rule written
when a matcher first reaches it, ``Pushdown.extend``), it *determinises a rule* (a rule lowered with the compile,
its DFA built when first called: ``Machine._append``), it *walks a new lexical state* (a string's or a number's
state no structure over the vocabulary had walked: ``LexicalMasks.walk``), it *walks a new pushdown state*
(``Machine.walk``), or none of these (a cached walk, a union of cached masks). The report gives TBM's p50 / p95 /
p99, the kinds of the masks above ``--quantile``, and the time of the masks that write a value split by phase:
the value's lowering (``_Compiler.body``), its grammar's clean-up, the checks of its rules, their NFAs (built in
Python), subset construction and minimisation, the machine's append and the walk.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from ttfm_profile import Timers, add_cpu_option  # noqa: E402

#: The kinds of mask, most costly first: a mask is filed under the first it did.
KINDS = ("writes a put-off value", "determinises a rule", "walks a new lexical state", "walks a new pushdown state")
#: The phases of a mask that writes a put-off value.
PHASES = ("lowering", "clean-up", "checks", "nfa", "determinize", "machine", "walk")


def install(timers: Timers, kinds: set[str]) -> None:
    """Wrap the phases' functions where their callers look them up, and note in ``kinds`` what a mask did."""
    import constrain.compilers.json_schema.compiler as compiler
    import constrain.grammar.rules as rules
    import constrain.runtime.lexical as lexical
    import constrain.runtime.pushdown as pushdown
    from constrain.automata.nfa import ByteNFA
    from constrain.grammar.ir import Pushdown

    def noted(kind: str, fn):
        def wrapped(*args, **kwargs):
            kinds.add(kind)
            return fn(*args, **kwargs)

        return wrapped

    Pushdown.extend = noted(KINDS[0], Pushdown.extend)
    lexical.LexicalMasks.walk = noted(KINDS[2], lexical.LexicalMasks.walk)
    compiler._Compiler.body = timers.wrap("lowering", compiler._Compiler.body)
    compiler._Compiler.grammar = timers.wrap("clean-up", compiler._Compiler.grammar)
    rules.check_rules = timers.wrap("checks", rules.check_rules)
    rules._build_rule_dfa = timers.wrap("nfa", rules._build_rule_dfa)
    ByteNFA.determinize = timers.wrap(
        "determinize", ByteNFA.determinize, {"nfa": "determinize", "lowering": "lowering"}
    )
    pushdown.Machine._append = noted(KINDS[1], timers.wrap("machine", pushdown.Machine._append))
    pushdown.Machine.walk = noted(KINDS[3], timers.wrap("walk", pushdown.Machine.walk))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sample", type=int, default=600, help="schemas drawn at random from the dev set (default 600)")
    p.add_argument("--seed", type=int, default=5, help="seed of the sample (default 5)")
    p.add_argument("--quantile", type=float, default=99.0, help="the percentile of TBM whose masks are filed (99)")
    p.add_argument("--flush-mb", type=int, default=64, help="MiB of memory touched before each schema (default 64)")
    add_cpu_option(p)
    args = p.parse_args(argv)

    import maskbench as mb

    mb.pin_to_cpu(mb.measurement_cpu(args.cpu))

    from constrain import Vocabulary, collector
    from constrain.compilers.json_schema import compile_json_schema
    from constrain.compilers.warmup import warmup
    from constrain.errors import ConstrainError
    from constrain.models import load_gemma_tokenizer

    tokenizer = load_gemma_tokenizer()
    vocab = Vocabulary.from_tokenizer(tokenizer)
    warmup(vocab)
    entries = mb.load_entries(mb.DEFAULT_DATA, sample=args.sample, seed=args.seed)
    collector.freeze()
    timers, kinds = Timers(), set()
    install(timers, kinds)
    bitmask = np.zeros((1, (vocab.size + 31) // 32), dtype=np.int32)
    ballast = np.zeros(args.flush_mb << 17)  # float64: flush_mb MiB
    masks: list[tuple[float, str]] = []  # (seconds, kind)
    writes: list[tuple[float, dict[str, float]]] = []  # the masks that write a value: (seconds, phases)
    for entry in entries:
        ballast += 1.0
        try:
            structure = compile_json_schema(entry["schema"], vocab)
        except ConstrainError:
            continue
        for test in mb.tokenise_tests(entry, tokenizer, vocab):
            if not test["valid"] or "tokens" not in test:
                continue
            matcher = structure.matcher()
            for token in [*test["tokens"], None]:
                bitmask.fill(0)
                kinds.clear()
                timers.current = defaultdict(float)
                start = time.perf_counter()
                matcher.fill_bitmask(bitmask, 0)
                seconds = time.perf_counter() - start
                kind = next((k for k in KINDS if k in kinds), "none of these")
                masks.append((seconds, kind))
                if kind == KINDS[0]:
                    writes.append((seconds, dict(timers.current)))
                if token is None:
                    break
                try:
                    matcher.advance(token)
                except ConstrainError:
                    break
    us = 1e6 * np.array([m[0] for m in masks])
    print(
        f"{len(masks):,} masks over {len(entries)} schemas: TBM p50 / p95 / p99 (µs) "
        + " / ".join(f"{np.percentile(us, q):.1f}" for q in (50, 95, 99))
    )
    bound = np.percentile(us, args.quantile)
    tail = Counter(kind for (seconds, kind) in masks if 1e6 * seconds >= bound)
    print(f"the {sum(tail.values()):,} masks at or above the p{args.quantile:g} ({bound:.0f} µs):")
    for kind, count in tail.most_common():
        print(f"  {kind:<28}{count:>7,}{count / sum(tail.values()):>8.0%}")
    if writes:
        ms = 1e3 * np.array([w[0] for w in writes])
        total = ms.sum()
        print(
            f"the {len(writes):,} masks that write a put-off value: p50 / p90 {np.percentile(ms, 50):.2f} / "
            f"{np.percentile(ms, 90):.2f} ms"
        )
        for phase in PHASES:
            share = 1e3 * sum(w[1].get(phase, 0.0) for w in writes) / total
            print(f"  {phase:<16}{share:>8.0%}")
        print(f"  {'the rest':<16}{1 - 1e3 * sum(sum(w[1].values()) for w in writes) / total:>8.0%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
