"""What reading the disk cache costs: the cl100k vocabulary and N lexical walks, loaded from their files.

    python benchmarks/cache_load.py [--reps 30] [--walks 8]

Rows (milliseconds of wall time, median and p90 over ``--reps`` repeats, the files in the OS page cache; and the
median of the process's CPU time, which other work on a shared machine moves less):
- vocabulary from_tokenizer: ``Vocabulary.from_tokenizer(cl100k)`` with its entry on disk (the tokenizer's cache key,
  then the file);
- vocabulary file: the file alone, as ``from_tokenizer`` reads it (header, checksum and array checks where the
  build has them);
- lexical walk file: one walk file read back by the per-vocabulary store, each of the ``--walks`` files in turn;
- lexical walks, all: the ``--walks`` files one after the other.

It runs against whichever constrain is first on the path, so two builds compare with ``git worktree add /tmp/before
<commit>`` and ``PYTHONPATH=/tmp/before``; the script reads each build's own file layout.
"""

from __future__ import annotations

import argparse
import inspect
import os
import platform
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

#: JSON Schemas whose masks inside a string walk large parts of the vocabulary: each saves one walk file or more.
SCHEMAS = [
    {"type": "string"},
    {"type": "string", "pattern": "^[a-z ]*$"},
    {"type": "string", "pattern": "^[A-Z0-9 ]+$"},
    {"type": "string", "pattern": "^[a-z0-9_]+$"},
    {"type": "string", "pattern": "^[^0-9]*$"},
    {"type": "string", "pattern": "^[ -~]*$"},
    {"type": "string", "pattern": "^[a-zA-Z ,.]*$"},
    {"type": "string", "pattern": "^[^aeiou]*$"},
    {"type": "string", "pattern": '^[^"]*x$'},
    {"type": "string", "maxLength": 3},
]


def _stats_ms(xs: list[tuple[float, float]]) -> tuple[float, float, float]:
    """Median and p90 of the wall times, median of the CPU times, in ms."""
    wall, cpu = (np.asarray(x) * 1e3 for x in zip(*xs))
    return float(np.median(wall)), float(np.percentile(wall, 90)), float(np.median(cpu))


def _time(fn: Callable[[], object], reps: int) -> list[tuple[float, float]]:
    """(wall, CPU) seconds of each of ``reps`` calls, after one to warm up (first-call imports, numba's dispatch)."""
    fn()
    out = []
    for _ in range(reps):
        t, c = time.perf_counter(), time.process_time()
        fn()
        out.append((time.perf_counter() - t, time.process_time() - c))
    return out


def _build() -> str:
    import constrain

    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=Path(constrain.__file__).parent,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        head = "?"
    return f"{Path(constrain.__file__).parent.parent} at {head}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--walks", type=int, default=8, help="walk files to read (at most those the schemas write)")
    args = ap.parse_args()

    load = os.getloadavg() if hasattr(os, "getloadavg") else (float("nan"),) * 3
    print(
        f"machine: {platform.platform()} | {platform.processor() or platform.machine()} | "
        f"{os.cpu_count()} CPUs | load avg {load[0]:.1f} | Python {platform.python_version()}"
    )
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["CONSTRAIN_CACHE_DIR"] = tmp  # before constrain is imported: its files go there
        import constrain
        from constrain.models.tokenizers import load_cl100k
        from constrain.runtime.lexical import LexicalMasks
        from constrain.vocab import vocabulary
        from constrain.vocab.readers import _read_tokenizer

        print(f"build: {_build()}")
        tok = load_cl100k()
        vocab = vocabulary.Vocabulary.from_tokenizer(tok)  # writes the vocabulary's file
        for schema in SCHEMAS:
            matcher = constrain.compile(schema, vocab, cache=False).matcher()
            for token in tok.encode('"'):
                matcher.advance(token)
            matcher.mask()  # the walk of the string's first state: large walks are written

        key = _read_tokenizer(tok, None).key()
        (path,) = [p for p in (Path(tmp) / "vocab").iterdir() if p.name.startswith(key)]
        if hasattr(vocabulary, "read_cached"):
            read_file = lambda: vocabulary.read_cached(path, key)  # noqa: E731
        else:
            read_file = lambda: vocabulary.Vocabulary.load(path)  # noqa: E731
        assert read_file().fingerprint == vocab.fingerprint

        walks = sorted(Path(tmp).glob("masks/*/*/*.walk"))[: args.walks]
        if len(walks) < args.walks:
            print(f"(only {len(walks)} walk files written)")
        store = LexicalMasks.of(vocab)
        keyed = "key" in inspect.signature(LexicalMasks._load).parameters
        loaders = [
            (lambda p=p: store._load(p, int(p.stem, 16))) if keyed else (lambda p=p: store._load(p)) for p in walks
        ]
        assert all(load() is not None for load in loaders), "a walk file was not read back"

        rows = [
            ("vocabulary from_tokenizer", _time(lambda: vocabulary.Vocabulary.from_tokenizer(tok), args.reps)),
            (f"vocabulary file ({path.stat().st_size / 1e6:.1f} MB)", _time(read_file, args.reps)),
        ]
        per_file: list[tuple[float, float]] = []
        for load_one in loaders:
            per_file += _time(load_one, args.reps)
        sizes = [p.stat().st_size for p in walks]
        rows.append((f"lexical walk file ({min(sizes) / 1e3:.0f}-{max(sizes) / 1e3:.0f} kB)", per_file))
        rows.append(
            (f"lexical walks, all {len(walks)}", _time(lambda: [load_one() for load_one in loaders], args.reps))
        )

    print(f"{'what':<34} {'n':>5} {'median ms':>10} {'p90 ms':>8} {'CPU median ms':>14}")
    for what, xs in rows:
        med, p90, cpu = _stats_ms(xs)
        print(f"{what:<34} {len(xs):>5} {med:>10.3f} {p90:>8.3f} {cpu:>14.3f}")


if __name__ == "__main__":
    main()
