"""Vocabulary build and cached-load times for the real tokenizers (Gemma 3, 262,144 tokens; cl100k_base).

    python benchmarks/bench_vocab.py [--reps 5] [--fresh-reps 3]

Rows:
- build: ``Vocabulary.from_tokenizer(tok, cache=False)`` (token bytes + trie), numba already started in the process;
- build, fresh process: the same as the first thing a new process does, numba's start-up (~0.4-0.9 s) included;
- cached load: ``Vocabulary.from_tokenizer(tok)`` with the entry on disk (cache key + np.load + fingerprint check).
The tokenizers' own loading is excluded everywhere. Times in seconds.
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile
import time

import numpy as np

_FRESH = r"""
import sys, time
from constrain.models import load_gemma_tokenizer, load_cl100k
from constrain.vocab import Vocabulary
tok = load_gemma_tokenizer() if sys.argv[1] == "gemma" else load_cl100k()
t = time.perf_counter()
Vocabulary.from_tokenizer(tok, cache=False)
print(time.perf_counter() - t)
"""


def _stats(xs: list[float]) -> tuple[float, float]:
    a = np.asarray(xs)
    return float(np.median(a)), float(np.percentile(a, 90))


def _time(fn, reps: int) -> list[float]:
    out = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--fresh-reps", type=int, default=3, help="fresh-process builds per tokenizer (0: skip)")
    args = ap.parse_args()

    from constrain.models.tokenizers import load_cl100k, load_gemma_tokenizer
    from constrain.vocab.vocabulary import Vocabulary

    load = os.getloadavg() if hasattr(os, "getloadavg") else (float("nan"),) * 3
    print(
        f"machine: {platform.platform()} | {platform.processor() or platform.machine()} | "
        f"{os.cpu_count()} CPUs | load avg {load[0]:.1f} | Python {platform.python_version()}"
    )
    toks = {"gemma3 (262,144)": ("gemma", load_gemma_tokenizer()), "cl100k (100,277)": ("cl100k", load_cl100k())}
    Vocabulary.from_token_bytes([b"a", b"ab"], eos_ids=[])  # start numba once

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        saved = os.environ.get("CONSTRAIN_CACHE_DIR")
        os.environ["CONSTRAIN_CACHE_DIR"] = tmp  # after the tokenizers are loaded: their own caches stay put
        try:
            for label, (short, tok) in toks.items():
                rows.append(
                    (label, "build (cache off)", _time(lambda: Vocabulary.from_tokenizer(tok, cache=False), args.reps))
                )
                if args.fresh_reps:
                    fresh = []
                    for _ in range(args.fresh_reps):
                        env = dict(os.environ)
                        if saved is None:
                            env.pop("CONSTRAIN_CACHE_DIR", None)
                        else:
                            env["CONSTRAIN_CACHE_DIR"] = saved
                        r = subprocess.run(
                            [sys.executable, "-c", _FRESH, short], capture_output=True, text=True, env=env, check=True
                        )
                        fresh.append(float(r.stdout.strip().splitlines()[-1]))
                    rows.append((label, "build, fresh process", fresh))
                v = Vocabulary.from_tokenizer(tok)  # writes the cache entry
                rows.append((label, "cached load", _time(lambda: Vocabulary.from_tokenizer(tok), args.reps)))
                rows.append(
                    (
                        label,
                        f"  -> {v.size:,} ids, {int(v.matchable.sum()):,} matchable, {v.trie.num_nodes:,} trie nodes",
                        None,
                    )
                )
        finally:
            if saved is None:
                os.environ.pop("CONSTRAIN_CACHE_DIR", None)
            else:
                os.environ["CONSTRAIN_CACHE_DIR"] = saved

    print(f"{'tokenizer':<18} {'what':<22} {'n':>3} {'median s':>9} {'p90 s':>7}")
    for label, what, xs in rows:
        if xs is None:
            print(f"{'':<18} {what}")
            continue
        med, p90 = _stats(xs)
        print(f"{label:<18} {what:<22} {len(xs):>3} {med:>9.3f} {p90:>7.3f}")


if __name__ == "__main__":
    main()
