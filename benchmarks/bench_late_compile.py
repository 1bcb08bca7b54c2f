"""One schema compiled late in a long-lived process: the compile time of a MaskBench schema after the schemas
before it in the dev set were compiled in the same process, and the time its compile spends in Python's
garbage collector.

    .venv/bin/python benchmarks/bench_late_compile.py --name JsonSchemaStore---cityjson.min.schema.json --before 1200
    .venv/bin/python benchmarks/bench_late_compile.py --name JsonSchemaStore---cityjson.min.schema.json \
        --before 1200 --no-pause

``--no-pause`` turns off the collector pause of long compiles (:mod:`constrain.collector`), for comparison. The
process is machine-noisy like any single measurement here: run the two interleaved, several times.
"""

from __future__ import annotations

import argparse
import gzip
import json
import time
from pathlib import Path

DEFAULT_DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "maskbench-dev.jsonl.gz"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--name", required=True, help="the schema measured")
    parser.add_argument("--before", type=int, default=1200, help="schemas compiled before it (default 1200)")
    parser.add_argument("--no-pause", action="store_true", help="turn the collector pause of long compiles off")
    args = parser.parse_args()

    from constrain import collector
    from constrain.compilers.json_schema import compile_json_schema
    from constrain.models.tokenizers import load_gemma_tokenizer
    from constrain.testing.collector_time import CollectorTime
    from constrain.vocab.vocabulary import Vocabulary

    if args.no_pause:
        collector.pause = collector.resume = lambda: None
    vocab = Vocabulary.from_tokenizer(load_gemma_tokenizer())
    with gzip.open(args.data, "rt") as lines:
        entries = [json.loads(line) for line in lines]
    at = next(i for i, e in enumerate(entries) if e["name"] == args.name)
    schemas = [e["schema"] for e in entries[max(0, at - args.before) : at + 1]]
    del entries

    collections = CollectorTime().install()
    started = time.perf_counter()
    for schema in schemas[:-1]:
        try:
            compile_json_schema(schema, vocab)
        except Exception:  # a refusal is a compile too here
            pass
    before = time.perf_counter() - started
    collections.reset()
    t0 = time.perf_counter()
    structure = compile_json_schema(schemas[-1], vocab)
    t1 = time.perf_counter()
    structure.matcher().mask()
    t2 = time.perf_counter()
    pause = "off" if args.no_pause else "on"
    print(
        f"pause {pause}: {len(schemas) - 1} schemas before in {before:.1f} s; {args.name}: compile {t1 - t0:.2f} s, "
        f"first mask {1e3 * (t2 - t1):.1f} ms, garbage collection during both {collections.seconds:.2f} s"
    )


if __name__ == "__main__":
    main()
