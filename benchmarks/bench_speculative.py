"""Speculative decoding under a structure with Gemma 3 270M on the CPU: tokens/s, target passes per token and
acceptance for each draft source and k, against the same constrained greedy decoding without speculation.

Run: .venv/bin/python benchmarks/bench_speculative.py [--prompts 20] [--ks 2,4,8] [--max-new-tokens 96]
     [--threads 2] [--sources lookup,forced,both,self] [--self-layers 12] [--markdown FILE]

Prompts: ``--prompts`` JSON extraction prompts from MaskBench dev schemas (``bench_structured_speed.py``'s: two valid
instances as lines of a records file, the model writing the next line, so outputs copy spans of the prompt), plus
five free-form prompts under regexes and grammars (dates, e-mail addresses, a CSV row, arithmetic, a key=value
list), each with text to copy. Greedy, batch 1, transformers in float32 with the sparse output layer, fast-forward
off (so the forced-token source has something to do); every mode decodes each prompt in turn.

Sources (``--sources``), each at every k of ``--ks``:

  lookup   PromptLookup(): the tokens after the latest earlier occurrence of the last 1-3 tokens
  forced   ForcedDrafts(tokenize): the tokenizer's split of the text the structure forces
  both     ChainedDrafts(ForcedDrafts(tokenize), PromptLookup())
  self     ModelDraft over early_exit_model(target, --self-layers): the target's first layers, sharing weights
  lookahead LookaheadDrafts(): an n-gram pool from the text and the target's own Jacobi guesses

Printed per source and k: tokens/s (all tokens / all time), the ratio to no speculation, target passes per token,
tokens per verifying pass, the acceptance rate at draft positions 1-4, the draft cost per drafted token over a
target pass (c), and how many outputs equal the ones without speculation (they must all be equal: greedy).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from constrain.compilers.api import compile as compile_structure
from constrain.compilers.specs import GBNF, Lark, Regex
from constrain.decoding.drafts import ChainedDrafts, ForcedDrafts, ModelDraft, PromptLookup, early_exit_model
from constrain.decoding.lookahead import LookaheadDrafts
from constrain.decoding.loop import Decoding
from constrain.decoding.speculative import Speculation
from constrain.integrations.transformers_model import TransformersModel
from constrain.models.gemma import load_default_model

FREE_FORM = [
    ("dates", "Dates: 2021-03-04, 2022-05-06, 2023-07-08.\nThe same dates, in order: ",
     Regex(r"(\d{4}-\d{2}-\d{2}, ){2}\d{4}-\d{2}-\d{2}\.")),
    ("emails", "Contacts: ada@example.com; alan@example.org; grace@example.net.\nTheir addresses: ",
     Regex(r"([a-z]+@[a-z]+\.(com|org|net); ){2}[a-z]+@[a-z]+\.(com|org|net)\.")),
    ("csv", "name,city,year\nAda,London,1815\nAlan,Wilmslow,1912\nGrace,New York,1906\nname,city,year\nAda,",
     GBNF('root ::= tail row row\ntail ::= [A-Za-z ]+ "," [0-9]{4} "\\n"\nrow ::= [A-Za-z]+ "," tail')),
    ("arithmetic", "1 + 2 * 3 = 7\n4 * 5 + 6 = 26\n1 + 2 * 3 = ",
     Lark('start: NUMBER "\\n" expr " = " NUMBER\nexpr: NUMBER (OP NUMBER)*\nOP: " + " | " * "\nNUMBER: /[0-9]+/')),
    ("settings", "Settings: width=640 height=480 depth=24 rate=60\nRepeat the settings: ",
     Regex(r"([a-z]+=[0-9]+ ){3}[a-z]+=[0-9]+")),
]  # fmt: skip


def _load_sibling(name: str) -> Any:
    spec = importlib.util.spec_from_file_location(name, Path(__file__).resolve().with_name(f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def tasks_for(model: TransformersModel, count: int, seed: int) -> list[dict[str, Any]]:
    tasks = _load_sibling("bench_structured_speed").pick_tasks(model.vocab, count, seed)
    for name, prompt, spec in FREE_FORM:
        tasks.append({"name": name, "prompt": prompt, "structure": compile_structure(spec, model.vocab)})
    return tasks


def make_source(name: str, target: TransformersModel, draft: TransformersModel | None) -> Any:
    if name == "lookup":
        return PromptLookup()
    if name == "forced":
        return ForcedDrafts(target.tokenize)
    if name == "both":
        return ChainedDrafts(ForcedDrafts(target.tokenize), PromptLookup())
    if name == "lookahead":
        return LookaheadDrafts()
    return ModelDraft(draft)


def decode(model: TransformersModel, task: dict[str, Any], speculation: Speculation | None, max_new: int) -> dict:
    decoding = Decoding(
        model, [model.encode(task["prompt"])], structures=task["structure"], max_new_tokens=max_new,
        eos_ids=[int(t) for t in model.vocab.eos_ids], fast_forward="off", tokenize=model.tokenize,
        speculation=speculation,
    )  # fmt: skip
    began = time.perf_counter()
    row = decoding.run()[0]
    seconds = time.perf_counter() - began
    return {"tokens": row.tokens, "seconds": seconds, "passes": decoding.forward_passes,
            "stats": decoding.speculation_stats}  # fmt: skip


def summary(label: str, runs: list[dict], base: list[dict], base_pass_seconds: float) -> str:
    tokens = sum(len(r["tokens"]) for r in runs)
    seconds = sum(r["seconds"] for r in runs)
    rate = tokens / seconds
    base_rate = sum(len(r["tokens"]) for r in base) / sum(r["seconds"] for r in base)
    passes = sum(r["passes"] for r in runs) / tokens
    same = sum(r["tokens"] == b["tokens"] for r, b in zip(runs, base))
    stats = [r["stats"] for r in runs if r["stats"] is not None]
    if not stats:
        return f"| {label} | {rate:.1f} | 1.00x | {passes:.2f} | - | - | - | {same}/{len(runs)} |"
    rounds = sum(s.rounds for s in stats)
    per_round = sum(s.tokens for s in stats) / rounds if rounds else float("nan")
    verified = np.sum([s.verified_at for s in stats], axis=0)
    accepted = np.sum([s.accepted_at for s in stats], axis=0)
    acceptance = " / ".join(f"{a / v:.2f}" if v else "-" for a, v in zip(accepted[:4], verified[:4]))
    drafted = sum(s.valid for s in stats)
    cost = (sum(s.draft_seconds for s in stats) / drafted) / base_pass_seconds if drafted else float("nan")
    return (
        f"| {label} | {rate:.1f} | {rate / base_rate:.2f}x | {passes:.2f} | {per_round:.2f} | {acceptance} | "
        f"{cost:.3f} | {same}/{len(runs)} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=20)
    parser.add_argument("--ks", default="2,4,8")
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sources", default="lookup,forced,both,self")
    parser.add_argument("--self-layers", type=int, default=12)
    parser.add_argument("--markdown", default=None, metavar="FILE")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    hf, tokenizer = load_default_model()
    target = TransformersModel(hf, tokenizer)
    sources = args.sources.split(",")
    draft = TransformersModel(early_exit_model(hf, args.self_layers), tokenizer) if "self" in sources else None
    tasks = tasks_for(target, args.prompts, args.seed)
    ks = [int(k) for k in args.ks.split(",")]
    configs = [("none", None)] + [(f"{s} k={k}", (s, k)) for s in sources for k in ks]
    results: dict[str, list[dict]] = {label: [] for label, _ in configs}
    decode(target, tasks[0], None, 8)  # warm-up
    for i, task in enumerate(tasks):
        for label, config in configs:
            speculation = None
            if config is not None:
                speculation = Speculation(make_source(config[0], target, draft), k=config[1])
            results[label].append(decode(target, task, speculation, args.max_new_tokens))
        print(f"{i + 1}/{len(tasks)} {task['name'][:50]}: {len(results['none'][-1]['tokens'])} tokens",
              file=sys.stderr, flush=True)  # fmt: skip

    base = results["none"]
    base_pass_seconds = sum(r["seconds"] for r in base) / sum(r["passes"] for r in base)
    lines = [
        f"Gemma 3 270M (transformers, float32, sparse output layer), {len(tasks) - len(FREE_FORM)} JSON + "
        f"{len(FREE_FORM)} regex/grammar prompts, greedy, batch 1, fast-forward off, max {args.max_new_tokens} new "
        f"tokens, {args.threads} threads; {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
        f"load average {os.getloadavg()[0]:.1f} at the end; a target pass without speculation "
        f"{base_pass_seconds * 1e3:.0f} ms",
        "",
        "| source | tok/s | vs none | passes/token | tokens/pass | acceptance at 1 / 2 / 3 / 4 | draft cost c | "
        "same output |",
        "|---|---|---|---|---|---|---|---|",
    ]
    lines += [summary(label, results[label], base, base_pass_seconds) for label, _ in configs]
    json_only = {label: runs[: len(tasks) - len(FREE_FORM)] for label, runs in results.items()}
    best = max(
        (label for label, _ in configs if label != "none"),
        key=lambda label: sum(len(r["tokens"]) for r in json_only[label]) / sum(r["seconds"] for r in json_only[label]),
    )
    lines += ["", "JSON extraction prompts only:", "", *lines[2:4]]
    lines += [summary(label, json_only[label], json_only["none"], base_pass_seconds) for label in ("none", best)]
    text = "\n".join(lines)
    print(text)
    if args.markdown:
        Path(args.markdown).write_text(text + "\n")


if __name__ == "__main__":
    main()
