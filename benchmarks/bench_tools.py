"""What offering tools costs when the model answers in text: tokens/s of free text against the same text under the
``tool_choice="auto"`` structure (free text until the trigger), with Gemma 3 270M in constrain's decoding loop.

Run: .venv/bin/python benchmarks/bench_tools.py [--prompts 8] [--tokens 64] [--rounds 3] [--threads 1]

Each prompt is a plain-text question; the tool set is the four functions below (weather, search, booking,
arithmetic), compiled once (its compile time is printed). Both modes decode exactly ``--tokens`` tokens greedily
with the end of sequence ignored (the structured mode's trigger never comes: the outputs are checked equal), in
turns prompt by prompt so that drift in the machine's speed hits both alike. Printed: aggregate tokens/s, median
and p10-p90 of per-prompt tokens/s, the ratio to free text, and the time the structure's masks take per token
(``Matcher.fill_bitmask`` measured apart on the same token sequences).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from datetime import date
from typing import Literal

import numpy as np
import torch

from constrain.compilers.tools import compile_tools
from constrain.decoding.loop import Decoding
from constrain.integrations.transformers_model import TransformersModel
from constrain.kernels.bitmask import allocate_token_bitmask
from constrain.models.gemma import load_default_model

PROMPTS = [
    "Q: Why is the sky blue?\nA:",
    "Q: Describe a walk in a forest in autumn.\nA:",
    "Q: What makes a good cup of tea?\nA:",
    "Q: Explain how a bicycle stays upright.\nA:",
    "Q: Tell a short story about a lighthouse keeper.\nA:",
    "Q: What is the difference between weather and climate?\nA:",
    "Q: Give advice to someone learning to cook.\nA:",
    "Q: Why do cats purr?\nA:",
]


def get_weather(city: str, unit: Literal["C", "F"] = "C") -> dict:
    """Current weather in a city."""
    return {}


def web_search(query: str, limit: int = 5) -> list:
    """Search the web."""
    return []


def book_table(restaurant: str, day: date, guests: int, notes: str = "") -> str:
    """Book a table at a restaurant."""
    return ""


def add(a: float, b: float) -> float:
    """Add two numbers."""
    return a + b


TOOLS = [get_weather, web_search, book_table, add]


def decode(model: TransformersModel, prompt: list[int], structure, tokens: int) -> tuple[list[int], float]:
    """``tokens`` greedy tokens (end of sequence ignored) and the wall time."""
    begun = time.perf_counter()
    rows = Decoding(model, [prompt], structures=structure, max_new_tokens=tokens, eos_ids=()).run()
    return rows[0].tokens, time.perf_counter() - begun


def mask_seconds(structure, tokens: list[int], width: int) -> float:
    """The time a matcher takes to fill the masks of ``tokens``' positions (each mask once, then the token read)."""
    matcher = structure.matcher()
    bitmask = allocate_token_bitmask(1, width)
    begun = time.perf_counter()
    for token in tokens:
        matcher.fill_bitmask(bitmask, 0)
        matcher.advance(token)
    return time.perf_counter() - begun


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(values, q))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model = TransformersModel(*load_default_model())
    begun = time.perf_counter()
    structure = compile_tools(TOOLS, model.vocab, tool_choice="auto", cache=False)
    compile_ms = (time.perf_counter() - begun) * 1e3
    prompts = [model.encode(p) for p in PROMPTS[: args.prompts]]
    decode(model, prompts[0], structure, 4)  # warm-up: first passes and masks
    rates: dict[str, list[float]] = {"free text": [], "tools offered": []}
    totals = {name: [0, 0.0] for name in rates}
    masks_us: list[float] = []
    for _ in range(args.rounds):
        for prompt in prompts:
            free, free_s = decode(model, prompt, None, args.tokens)
            offered, offered_s = decode(model, prompt, structure, args.tokens)
            if offered != free:
                raise SystemExit("the structured output differs from free text: the model wrote the trigger")
            for name, n, seconds in (("free text", len(free), free_s), ("tools offered", len(offered), offered_s)):
                rates[name].append(n / seconds)
                totals[name][0] += n
                totals[name][1] += seconds
            masks_us.append(mask_seconds(structure, offered, model.logits_width) / len(offered) * 1e6)
    cpu = platform.processor() or platform.machine()
    print(f"machine: {cpu}, {os.cpu_count()} cores, torch threads {args.threads}, load {os.getloadavg()[0]:.2f}")
    print(f"tool set: {len(TOOLS)} functions, auto choice, json format; compile {compile_ms:.0f} ms\n")
    print("| mode | tokens/s (all) | median | p10-p90 | ratio to free text |")
    print("|---|---|---|---|---|")
    base = totals["free text"][0] / totals["free text"][1]
    for name, values in rates.items():
        agg = totals[name][0] / totals[name][1]
        p10, p90 = percentile(values, 10), percentile(values, 90)
        print(f"| {name} | {agg:.1f} | {statistics.median(values):.1f} | {p10:.1f}-{p90:.1f} | {agg / base:.3f} |")
    print(f"\nmask per token (fill_bitmask + advance): median {statistics.median(masks_us):.1f} us, "
          f"p90 {percentile(masks_us, 90):.1f} us")  # fmt: skip


if __name__ == "__main__":
    main()
