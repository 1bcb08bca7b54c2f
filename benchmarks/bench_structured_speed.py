"""End-to-end tokens/s of JSON generation with Gemma 3 270M in constrain's decoding loop: does the structure make
decoding faster than free text?

Run: .venv/bin/python benchmarks/bench_structured_speed.py [--prompts 20] [--max-new-tokens 128] [--threads 2]
     [--engines transformers,llamacpp] [--markdown FILE]

Prompts: ``--prompts`` MaskBench dev schemas (``../shared/data/maskbench-dev.jsonl.gz``, a seeded draw) that
compile strictly in under 5 s and have two valid instances of 40-300 characters; each prompt shows those two
instances (keys in the compiler's order, ``benchmarks/maskbench_keyorder.py``) as lines of a file of records and
lets the model write the next line under the schema. Greedy decoding, batch 1, ``--max-new-tokens`` per output.

Modes, taking turns prompt by prompt so that drift in the machine's speed hits all of them alike:

  unconstrained   free text of the same length: as many tokens as the plain constrained output of that prompt,
                  with no end of sequence (the loop, sampling and model are the same; only the structure is off)
  hf generate     the same free text through transformers' ``generate()`` (transformers only), as a reference
                  for the loop itself
  plain           the structure's mask on every step, one token per forward pass, the full output layer
  sparse          plus the mask-aware output layer (rows with at most ``sparse_limit`` allowed tokens)
  forced          plus fast-forward: the forced text in the tokenizer's own split, fed in one pass (the JSON default)
  sparse+forced   both (constrain.LLM's default for JSON)
  +lookup         plus speculative decoding with prompt-lookup drafts (``PromptLookup()``, k = 8)

llama.cpp runs the modes without the sparse output layer: it computes every logit inside its graph, so there is
no sparse path there (``LlamaCppModel.sparse_limit == 0``).

Tokens/s is generated tokens (forced ones included) over the wall time of the whole decoding, prompt included.
Printed per engine and mode: the aggregate tokens/s (all tokens / all time), the median and p10-p90 of the
per-prompt tokens/s, the ratio of the aggregate to unconstrained, forward passes per token, the share of rows of
logits (one per step, one per verified position under speculation) on the sparse path, the share of tokens that
were forced, and how many complete outputs validate (``jsonschema``; an output cut at ``--max-new-tokens`` is
counted apart). Then how often the forced-text output differs from the plain one under greedy decoding, and where
the time of the fastest mode goes (forward passes against the loop's own work: masks, sampling, forcing).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import jsonschema
import numpy as np

from constrain.compilers.json_schema import compile_json_schema
from constrain.decoding.drafts import PromptLookup
from constrain.decoding.loop import Decoding
from constrain.decoding.speculative import Speculation
from constrain.errors import ConstrainError
from constrain.testing.maskbench import load_records

MASKBENCH = Path(__file__).resolve().parents[2] / "shared" / "data" / "maskbench-dev.jsonl.gz"
MODES = {
    # mode: (structured, sparse output layer, fast-forward, speculation with prompt lookup)
    "unconstrained": (False, False, "off", False),
    "plain": (True, False, "off", False),
    "sparse": (True, True, "off", False),
    "forced": (True, False, "text", False),
    "sparse+forced": (True, True, "text", False),
    "forced+lookup": (True, False, "text", True),
    "sparse+forced+lookup": (True, True, "text", True),
}
#: Draft tokens a round when a mode speculates.
LOOKUP_K = 8


def _load_sibling(name: str) -> Any:
    spec = importlib.util.spec_from_file_location(name, Path(__file__).resolve().with_name(f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


canonical_order = _load_sibling("maskbench_keyorder").canonical_order


class Timed:
    """A model of the loop whose forward passes are timed."""

    def __init__(self, model: Any):
        self.model = model
        self.seconds = 0.0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.model, name)

    def prefill(self, *args: Any) -> Any:
        return self._timed(self.model.prefill, args)

    def extend(self, *args: Any) -> Any:
        return self._timed(self.model.extend, args)

    def verify(self, *args: Any) -> Any:
        return self._timed(self.model.verify, args)

    def _timed(self, call: Any, args: tuple[Any, ...]) -> Any:
        began = time.perf_counter()
        try:
            return call(*args)
        finally:
            self.seconds += time.perf_counter() - began


def pick_tasks(vocab: Any, count: int, seed: int) -> list[dict[str, Any]]:
    """``count`` schemas with a prompt each, compiled for ``vocab``."""
    tasks = []
    for record in load_records(MASKBENCH, sample=400, seed=seed):
        examples = []
        for test in record["tests"]:
            if test.get("valid"):
                text = json.dumps(canonical_order(record["schema"], test["data"]), separators=(",", ":"))
                if 40 <= len(text) <= 300 and text not in examples:
                    examples.append(text)
        if len(examples) < 2:
            continue
        try:
            structure = compile_json_schema(record["schema"], vocab, time_limit=5.0)
        except ConstrainError:
            continue
        title = record["name"].split("---")[-1]
        prompt = f"Records of {title}, one JSON object per line:\n{examples[0]}\n{examples[1]}\n"
        tasks.append({"name": record["name"], "schema": record["schema"], "structure": structure, "prompt": prompt})
        if len(tasks) == count:
            break
    return tasks


def decode(model: Timed, task: dict[str, Any], mode: str, max_new_tokens: int, length: int | None) -> dict[str, Any]:
    structured, sparse, fast_forward, lookup = MODES[mode]
    model.model.sparse_limit = model.default_sparse_limit if sparse else 0
    model.seconds = 0.0
    if hasattr(model.model, "llm"):
        model.model.llm.reset()  # every mode reads the whole prompt: no prefix kept from the mode before
    ids = model.encode(task["prompt"])
    decoding = Decoding(
        model,
        [ids],
        structures=task["structure"] if structured else None,
        max_new_tokens=length if not structured else max_new_tokens,
        eos_ids=[int(t) for t in model.vocab.eos_ids] if structured else (),
        fast_forward=fast_forward,
        tokenize=model.tokenize,
        speculation=Speculation(PromptLookup(), k=LOOKUP_K) if lookup else None,
    )
    began = time.perf_counter()
    row = decoding.run()[0]
    seconds = time.perf_counter() - began
    text = model.vocab.decode(row.tokens).decode("utf-8", errors="replace")
    valid = None  # free text, or an output cut at max_new_tokens
    if structured and row.complete:
        try:
            jsonschema.validate(json.loads(text), task["schema"])
            valid = True
        except (ValueError, jsonschema.ValidationError):
            valid = False
    return {
        "tokens": len(row.tokens),
        "seconds": seconds,
        "forward_seconds": model.seconds,
        "passes": decoding.forward_passes,
        "rows": decoding.logit_rows,
        "sparse_steps": decoding.sparse_row_steps,
        "forced": row.forced,
        "text": text,
        "valid": valid,
    }


def hf_generate(model: Timed, task: dict[str, Any], length: int) -> dict[str, Any]:
    import torch

    hf = model.model.model
    ids = torch.tensor([model.encode(task["prompt"])])
    began = time.perf_counter()
    with torch.inference_mode():
        out = hf.generate(ids, max_new_tokens=length, min_new_tokens=length, do_sample=False)
    seconds = time.perf_counter() - began
    tokens = out.shape[1] - ids.shape[1]
    return {"tokens": tokens, "seconds": seconds, "forward_seconds": 0.0, "passes": tokens, "rows": tokens,
            "sparse_steps": 0, "forced": 0, "text": "", "valid": None}  # fmt: skip


def open_engine(engine: str, threads: int) -> Timed:
    if engine == "transformers":
        import torch

        from constrain.integrations.transformers_model import TransformersModel
        from constrain.models.gemma import load_default_model

        torch.set_num_threads(threads)
        model = TransformersModel(*load_default_model())
    else:
        from llama_cpp import Llama

        from constrain.integrations.llamacpp_model import LlamaCppModel
        from constrain.models.gemma import gguf_model_path

        llama = Llama(str(gguf_model_path()), n_ctx=2048, n_threads=threads, n_batch=512, verbose=False)
        model = LlamaCppModel(llama)
    timed = Timed(model)
    timed.default_sparse_limit = model.sparse_limit
    return timed


def run_engine(engine: str, tasks: list[dict[str, Any]], args: argparse.Namespace) -> dict[str, list[dict[str, Any]]]:
    model = open_engine(engine, args.threads)
    modes = [m for m in MODES if engine == "transformers" or not MODES[m][1]]
    if engine == "transformers" and args.hf_reference:
        modes.insert(1, "hf generate")
    results: dict[str, list[dict[str, Any]]] = {m: [] for m in modes}
    warm = tasks[0]
    for mode in modes:  # warm-up: first forward passes, first masks of the first structure
        if mode != "hf generate":
            decode(model, warm, mode, args.max_new_tokens, 8)
    for k, task in enumerate(tasks):
        plain = decode(model, task, "plain", args.max_new_tokens, None)
        length = max(1, plain["tokens"])
        for mode in modes:
            if mode == "plain":
                result = plain
            elif mode == "hf generate":
                result = hf_generate(model, task, length)
            else:
                result = decode(model, task, mode, args.max_new_tokens, length)
            results[mode].append(result)
        print(f"[{engine}] {k + 1}/{len(tasks)} {task['name'][:60]}: {length} tokens", file=sys.stderr, flush=True)
    return results


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def table(engine: str, results: dict[str, list[dict[str, Any]]]) -> list[str]:
    base = results["unconstrained"]
    base_rate = sum(r["tokens"] for r in base) / sum(r["seconds"] for r in base)
    lines = []
    for mode, rows in results.items():
        tokens = sum(r["tokens"] for r in rows)
        rate = tokens / sum(r["seconds"] for r in rows)
        per_prompt = [r["tokens"] / r["seconds"] for r in rows]
        passes = sum(r["passes"] for r in rows) / tokens
        sparse = sum(r["sparse_steps"] for r in rows) / max(1, sum(r["rows"] for r in rows))
        forced = sum(r["forced"] for r in rows) / tokens
        valid = [r["valid"] for r in rows if r["valid"] is not None]
        cut = sum(r["valid"] is None for r in rows) if mode not in ("unconstrained", "hf generate") else 0
        lines.append(
            f"| {engine} | {mode} | {rate:.1f} | {statistics.median(per_prompt):.1f} | "
            f"{pct(per_prompt, 10):.1f}-{pct(per_prompt, 90):.1f} | {rate / base_rate:.2f}x | {passes:.2f} | "
            f"{sparse:.0%} | {forced:.0%} | {f'{sum(valid)}/{len(valid)} ({cut} cut)' if valid else '-'} |"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=20)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--engines", default="transformers,llamacpp")
    parser.add_argument("--no-hf-reference", dest="hf_reference", action="store_false")
    parser.add_argument("--markdown", default=None, metavar="FILE")
    args = parser.parse_args()

    engines = args.engines.split(",")
    first = open_engine(engines[0], args.threads)
    tasks = pick_tasks(first.vocab, args.prompts, args.seed)
    del first
    out = [
        f"Gemma 3 270M, {len(tasks)} MaskBench dev prompts, greedy, batch 1, max {args.max_new_tokens} new tokens, "
        f"{args.threads} threads; {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
        f"load average {os.getloadavg()[0]:.1f} at the start",
        "",
        "| engine | mode | tok/s | per prompt median | p10-p90 | vs unconstrained | passes/token | sparse steps | "
        "forced tokens | valid / complete |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    notes = []
    for engine in engines:
        results = run_engine(engine, tasks, args)
        out.extend(table(engine, results))
        plain, forced = results["plain"], results["forced"]
        differ = sum(p["text"] != f["text"] for p, f in zip(plain, forced))
        same = sum(f["text"] == s["text"] for f, s in zip(forced, results["forced+lookup"]))
        notes.append(
            f"- {engine}: the forced-text output differs from the plain one for {differ} of {len(plain)} prompts "
            f"(greedy); speculation leaves {same} of {len(plain)} forced-text outputs unchanged."
        )
        fastest = ("sparse+forced", "sparse+forced+lookup") if engine == "transformers" else ("forced", "forced+lookup")
        for mode in fastest:
            spent = sum(r["seconds"] for r in results[mode])
            model_share = sum(r["forward_seconds"] for r in results[mode]) / spent
            notes.append(
                f"- {engine}, {mode}: forward passes take {model_share:.0%} of the time, the loop (masks, "
                f"sampling, forcing, drafting) {1 - model_share:.0%}."
            )
    out += ["", *notes, "", f"load average {os.getloadavg()[0]:.1f} at the end"]
    text = "\n".join(out)
    print(text)
    if args.markdown:
        Path(args.markdown).write_text(text + "\n")


if __name__ == "__main__":
    main()
