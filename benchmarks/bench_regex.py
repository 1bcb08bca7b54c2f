"""Regex structures on the Gemma 3 vocabulary: compile time and mask time, constrain against outlines-core.

    .venv/bin/python benchmarks/bench_regex.py [--repeats 5]

Both engines get the same token bytes (the matchable tokens of constrain's Gemma vocabulary, EOS 1) and the
same regexes, single-threaded, in one process. Figures are medians / percentiles over repeats, in milliseconds
or microseconds as labelled.

- compile: regex -> ready structure. constrain: DFA plus the masks of small automata (all their states);
  outlines-core: its full token index (``Index``).
- first mask: computing one state's mask from nothing (constrain: a trie walk, ``StateMasks.compute``; every
  state of the DFA). outlines-core has no such step (everything is computed at compile), so its column shows
  the mask it writes from its index (``Guide.write_mask_into``) as its cheapest comparable figure.
- cached mask: ``Matcher.fill_bitmask`` at a state whose mask is cached, into a caller-owned bitmask row;
  outlines-core: ``Guide.write_mask_into`` into a preallocated bitmask. ``Matcher.mask()`` (the cached array
  itself, no copy, which ``apply_token_bitmask`` takes directly) is timed in its own column.
- per token: a random valid text of each regex, tokenised by Gemma, forced token by token.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import re
import statistics
import sys
import time

import numpy as np

from constrain.automata.regex import regex_to_dfa
from constrain.compilers.regex import compile_regex
from constrain.kernels.bitmask import allocate_token_bitmask
from constrain.models.tokenizers import load_gemma_tokenizer
from constrain.vocab.vocabulary import Vocabulary


def benchmark_regexes() -> dict[str, str]:
    rng = random.Random(0)
    words = sorted(
        {"".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(3, 10))) for _ in range(400)}
    )[:200]
    literal = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz ,.") for _ in range(2000))
    classes = "".join(rng.choice([r"[a-z]", r"\d", r"[A-Z0-9]", r"[^\n]", r"\w", r"[aeiou]"]) for _ in range(30))
    return {
        "email": r"[a-zA-Z0-9._%+-]+@[a-zA-Z0-9.-]+\.[a-zA-Z]{2,}",
        "ISO date-time": r"\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])T([01]\d|2[0-3]):[0-5]\d:[0-5]\d(\.\d+)?(Z|[+-]([01]\d|2[0-3]):[0-5]\d)",  # noqa: E501
        "200 words": "(" + "|".join(words) + ")",
        "JSON number": r"-?(0|[1-9]\d*)(\.\d+)?([eE][+-]?\d+)?",
        "2000-char literal": re.escape(literal),
        "30 classes": classes,
    }


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q))


def time_call(fn, repeats: int) -> list[float]:
    out = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


def bench_constrain(pattern: str, vocab: Vocabulary, repeats: int) -> dict[str, float]:
    def compile_once():
        regex_to_dfa.cache_clear()
        return compile_regex(pattern, vocab)

    compile_times = time_call(compile_once, repeats)
    structure = compile_once()
    masks = structure.masks
    states = range(structure.dfa.num_states)
    first = []
    for state in states:
        t = time.perf_counter()
        masks.compute(state)
        first.append(time.perf_counter() - t)
    matcher = structure.matcher()
    bitmask = allocate_token_bitmask(1, vocab.size)
    matcher.fill_bitmask(bitmask, 0)
    cached = time_call(lambda: matcher.fill_bitmask(bitmask, 0), 2000)
    lookup = time_call(matcher.mask, 2000)
    return {
        "states": structure.dfa.num_states,
        "compile_ms": 1e3 * statistics.median(compile_times),
        "first_p50_us": 1e6 * pct(first, 50),
        "first_p99_us": 1e6 * pct(first, 99),
        "cached_us": 1e6 * statistics.median(cached),
        "lookup_us": 1e6 * statistics.median(lookup),
    }


def sample_text(structure, rng: random.Random) -> bytes:
    """A random full match of the structure's DFA over printable ASCII (a valid instance to force)."""
    trans, accepting = structure.dfa.trans, structure.dfa.accepting
    state, out = 0, bytearray()
    while True:
        choices = [b for b in range(32, 127) if trans[state, b] >= 0]
        if accepting[state] and (not choices or rng.random() < 0.1 or len(out) > 60):
            return bytes(out)
        byte = rng.choice(choices)
        out.append(byte)
        state = int(trans[state, byte])


def bench_per_token(pattern: str, vocab: Vocabulary, tokenizer) -> dict[str, float]:
    """Mask + advance per token while a valid text's tokens are forced, on a fresh structure (first pass:
    masks computed on first use) and again (second pass: cached)."""
    regex_to_dfa.cache_clear()
    structure = compile_regex(pattern, vocab)
    text = sample_text(structure, random.Random(1)).decode()
    tokens = tokenizer.encode(text, add_special_tokens=False) + [int(vocab.eos_ids[0])]
    bitmask = allocate_token_bitmask(1, vocab.size)
    passes = []
    for _ in range(2):
        matcher = structure.matcher()
        times = []
        for token in tokens:
            t = time.perf_counter()
            matcher.fill_bitmask(bitmask, 0)
            matcher.advance(token)
            times.append(time.perf_counter() - t)
        passes.append(times)
    return {
        "tokens": len(tokens),
        "cold_p50_us": 1e6 * pct(passes[0], 50),
        "cold_p99_us": 1e6 * pct(passes[0], 99),
        "warm_p50_us": 1e6 * pct(passes[1], 50),
        "warm_p99_us": 1e6 * pct(passes[1], 99),
    }


def outlines_vocabulary(vocab: Vocabulary):
    import outlines_core

    by_bytes: dict[bytes, list[int]] = {}
    eos = int(vocab.eos_ids[0])
    for token in np.flatnonzero(vocab.matchable):
        by_bytes.setdefault(vocab.token_bytes(int(token)), []).append(int(token))
    return outlines_core.Vocabulary(eos, by_bytes)


def bench_outlines(pattern: str, ovocab, vocab_size: int, repeats: int, budget_s: float) -> dict[str, float] | None:
    import outlines_core
    import torch

    times = []
    index = None
    for _ in range(repeats):
        t = time.perf_counter()
        index = outlines_core.Index(pattern, ovocab)
        times.append(time.perf_counter() - t)
        if sum(times) > budget_s:
            break
    guide = outlines_core.Guide(index)
    words = (vocab_size + 31) // 32
    bitmask = torch.zeros(words, dtype=torch.int32)
    ptr, numel, size = bitmask.data_ptr(), bitmask.numel(), bitmask.element_size()
    writes = time_call(lambda: guide.write_mask_into(ptr, numel, size), 2000)
    return {"compile_ms": 1e3 * statistics.median(times), "cached_us": 1e6 * statistics.median(writes)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--outlines-budget", type=float, default=120.0, help="seconds per regex for outlines-core")
    args = parser.parse_args()

    print(f"machine: {platform.platform()}, {os.cpu_count()} CPUs, Python {sys.version.split()[0]}")
    tokenizer = load_gemma_tokenizer()
    vocab = Vocabulary.from_tokenizer(tokenizer)
    print(f"vocabulary: Gemma 3, {vocab.size:,} ids, trie of {vocab.trie.num_nodes:,} nodes")
    regex_to_dfa("(warm|up)[0-9]+")  # load the numba kernels once, outside the timings
    compile_regex("(warm|up)[0-9]+", vocab)
    ovocab = outlines_vocabulary(vocab)

    header = (
        f"{'regex':18s} {'states':>6s} | {'compile ms':>10s} {'outlines':>9s} {'ratio':>6s} | "
        f"{'1st mask p50 µs':>15s} {'p99 µs':>8s} | {'mask() µs':>9s} {'fill µs':>8s} {'outlines':>9s} {'ratio':>6s}"
    )
    print(header)
    print("-" * len(header))
    for name, pattern in benchmark_regexes().items():
        ours = bench_constrain(pattern, vocab, args.repeats)
        theirs = bench_outlines(pattern, ovocab, vocab.size, args.repeats, args.outlines_budget)
        print(
            f"{name:18s} {ours['states']:6d} | {ours['compile_ms']:10.2f} {theirs['compile_ms']:9.1f} "
            f"{ours['compile_ms'] / theirs['compile_ms']:6.3f} | {ours['first_p50_us']:15.1f} "
            f"{ours['first_p99_us']:8.1f} | {ours['lookup_us']:9.2f} {ours['cached_us']:8.2f} "
            f"{theirs['cached_us']:9.2f} "
            f"{ours['cached_us'] / theirs['cached_us']:6.2f}",
            flush=True,
        )
    print("\nper token while a valid text's tokens are forced (fill_bitmask + advance, µs):")
    header = f"{'regex':18s} {'tokens':>6s} | {'1st pass p50':>12s} {'p99':>8s} | {'2nd pass p50':>12s} {'p99':>8s}"
    print(header)
    print("-" * len(header))
    for name, pattern in benchmark_regexes().items():
        r = bench_per_token(pattern, vocab, tokenizer)
        print(
            f"{name:18s} {r['tokens']:6d} | {r['cold_p50_us']:12.1f} {r['cold_p99_us']:8.1f} | "
            f"{r['warm_p50_us']:12.1f} {r['warm_p99_us']:8.1f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
