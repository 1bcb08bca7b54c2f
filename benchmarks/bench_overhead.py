"""constrain's share of a decoding step in transformers ``generate()`` with Gemma 3 270M on the CPU.

Run: python benchmarks/bench_overhead.py [--runs 3] [--tokens 48] [--batches 1,8] [--dtype float32] [--threads N]
     [--quick]

For each batch size, greedy decoding with the embedded model (float32, the default) under a JSON Schema (an array
of person objects, long enough that no row can finish within ``--tokens`` tokens, so every run is ``--tokens``
steps of the whole batch), and without a structure (the same number of steps: end of sequence switched off). The
modes take turns within each run, so drift in the machine's speed hits both alike.

Inside each constrained run, every decoding step is timed three ways:

  step        from the start of one model forward to the start of the next: the whole iteration of generate()'s
              loop (forward, logits processors, sampling, stopping criteria, bookkeeping)
  forward     the model's forward call
  constrain   the StructureLogitsProcessor call: syncing each row's matcher with input_ids (advance / rollback),
              fill_bitmask per row, and applying the bitmask to the logits in place

The first step (the prompt's prefill) is left out. Printed: a markdown table with the median and p90 of
constrain / step and constrain / forward over all steps of all runs, constrain's own median / p90 time per step,
and the unconstrained and constrained tokens per second (batch x steps / wall time of the generate call, median
over runs) with their ratio. Target: constrain at most 5% of the step.

The first constrained run after compiling ("cold") also walks the structure's new states' masks; it is reported on
its own line, the later runs ("warm") reuse them, as a server reusing a compiled schema would.

A second table times the processor alone (no model: random logits, random allowed tokens of ``[a-z ]*``) at batch 8
as the generated length grows (``--lengths``), to show that a step's cost does not grow with the sequence.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time

import numpy as np
import torch

from constrain.compilers.json_schema import compile_json_schema
from constrain.integrations import transformers as ct
from constrain.models.gemma import default_eos_ids, load_default_model
from constrain.vocab.vocabulary import Vocabulary

SCHEMA = {
    "type": "array",
    "minItems": 8,
    "maxItems": 16,
    "items": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "minLength": 1, "maxLength": 24},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "email": {"type": "string", "format": "email"},
            "city": {"type": "string", "maxLength": 20},
            "role": {"enum": ["admin", "editor", "viewer"]},
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 10}, "maxItems": 3},
        },
        "required": ["name", "age", "email", "city", "role", "tags"],
        "additionalProperties": False,
    },
}

PROMPTS = [
    "A list of the people in our team, as JSON: ",
    "Users of the site (JSON): ",
    "Here are the employees as a JSON array: ",
    "JSON export of the contacts: ",
    "The club's members in JSON: ",
    "People who signed up today, JSON: ",
    "Staff directory as JSON: ",
    "Customer records (JSON array): ",
]


class StepTimer:
    """Times each model forward and each structure-processor call during generate(); one record per step."""

    def __init__(self, model):
        self.model = model
        self.forward_starts: list[float] = []
        self.forward_times: list[float] = []
        self.processor_times: list[float] = []
        self._orig_forward = model.forward
        self._orig_call = ct.StructureLogitsProcessor.__call__

    def __enter__(self):
        timer = self
        orig_forward, orig_call = self._orig_forward, self._orig_call

        def forward(*args, **kwargs):
            t = time.perf_counter()
            timer.forward_starts.append(t)
            out = orig_forward(*args, **kwargs)
            timer.forward_times.append(time.perf_counter() - t)
            return out

        def call(processor, input_ids, scores):
            t = time.perf_counter()
            out = orig_call(processor, input_ids, scores)
            timer.processor_times.append(time.perf_counter() - t)
            return out

        self.model.forward = forward
        ct.StructureLogitsProcessor.__call__ = call
        return self

    def __exit__(self, *exc):
        del self.model.forward  # back to the class's method
        ct.StructureLogitsProcessor.__call__ = self._orig_call

    def steps(self, end: float) -> list[tuple[float, float, float]]:
        """(step, forward, constrain) seconds per step, the prefill step left out."""
        starts = self.forward_starts + [end]
        out = []
        for i in range(1, len(self.forward_times)):
            proc = self.processor_times[i] if i < len(self.processor_times) else 0.0
            out.append((starts[i + 1] - starts[i], self.forward_times[i], proc))
        return out


def run(model, tokenizer, prompts, structure, tokens, eos):
    """One greedy generate(); returns (wall seconds, per-step records, generated ids)."""
    from transformers import LogitsProcessorList

    tokenizer.padding_side = "left"
    inputs = tokenizer(prompts, return_tensors="pt", padding=True)
    kwargs = dict(max_new_tokens=tokens, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    if structure is None:
        kwargs.update(eos_token_id=None, min_new_tokens=tokens)  # exactly `tokens` steps
    else:
        kwargs.update(eos_token_id=eos, logits_processor=LogitsProcessorList([ct.StructureLogitsProcessor(structure)]))
    with StepTimer(model) as timer, torch.inference_mode():
        t0 = time.perf_counter()
        out = model.generate(**inputs, **kwargs)
        t1 = time.perf_counter()
    return t1 - t0, timer.steps(t1), out[:, inputs["input_ids"].shape[1] :]


def processor_vs_length(vocab, lengths: list[int], batch: int = 8, window: int = 50) -> list[tuple[int, float, float]]:
    """(generated length, median ms, p90 ms) of StructureLogitsProcessor calls at batch ``batch``, no model."""
    from constrain.compilers.regex import compile_regex

    structure = compile_regex(r"[a-z ]*", vocab)
    allowed = structure.matcher().allowed_tokens()
    allowed = allowed[~np.isin(allowed, vocab.eos_ids)]
    rng = np.random.default_rng(0)
    processor = ct.StructureLogitsProcessor(structure)
    scores = torch.randn(batch, vocab.size)
    work = scores.clone()
    ids = torch.full((batch, 16), 2, dtype=torch.long)
    out = []
    times: list[float] = []
    targets = sorted(lengths)
    for generated in range(max(targets) + window + 1):
        work.copy_(scores)
        t = time.perf_counter()
        processor(ids, work)
        dt = time.perf_counter() - t
        if any(g <= generated < g + window for g in targets):
            times.append(dt)
        if generated in [g + window - 1 for g in targets]:
            out.append((generated - window + 1, 1e3 * pct(times, 50), 1e3 * pct(times, 90)))
            times = []
        ids = torch.cat([ids, torch.as_tensor(rng.choice(allowed, size=(batch, 1)))], dim=1)
    return out


def pct(values, q):
    return float(np.percentile(np.asarray(values), q))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3, help="warm runs per batch size (after one cold run)")
    ap.add_argument("--tokens", type=int, default=48, help="decoding steps per run")
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--lengths", default="0,1000,4000", help="generated lengths for the processor-only table")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's own choice)")
    ap.add_argument("--quick", action="store_true", help="1 warm run of 16 tokens")
    args = ap.parse_args()
    if args.quick:
        args.runs, args.tokens = 1, 16
    batches = [int(b) for b in args.batches.split(",")]
    if args.threads:
        torch.set_num_threads(args.threads)

    t = time.perf_counter()
    model, tokenizer = load_default_model(dtype=getattr(torch, args.dtype))
    vocab = Vocabulary.from_tokenizer(tokenizer)
    eos = default_eos_ids(tokenizer)
    print(f"model loaded in {time.perf_counter() - t:.1f} s", file=sys.stderr)

    rows = []
    for batch in batches:
        prompts = (PROMPTS * ((batch + len(PROMPTS) - 1) // len(PROMPTS)))[:batch]
        t = time.perf_counter()
        structure = compile_json_schema(SCHEMA, vocab)
        compile_s = time.perf_counter() - t
        run(model, tokenizer, prompts, None, 4, eos)  # warm-up of the model itself
        results = {"cold": [], "warm": [], "free": []}
        walls = {"cold": [], "warm": [], "free": []}
        for r in range(args.runs + 1):
            mode = "cold" if r == 0 else "warm"
            wall, steps, out = run(model, tokenizer, prompts, structure, args.tokens, eos)
            assert out.shape[1] == args.tokens, f"a constrained run stopped after {out.shape[1]} steps"
            results[mode].extend(steps)
            walls[mode].append(wall)
            if r == 0:
                sample = vocab.decode([t for t in out[0].tolist() if t not in eos]).decode("utf-8", "replace")
                print(f"batch {batch}: first row's output: {sample!r}", file=sys.stderr)
            wall, steps, _ = run(model, tokenizer, prompts, None, args.tokens, eos)
            results["free"].extend(steps)
            walls["free"].append(wall)
        free_tps = batch * args.tokens / statistics.median(walls["free"])
        free_step = statistics.median([s for s, _, _ in results["free"]])
        for mode in ("cold", "warm"):
            steps = results[mode]
            share = [p / s for s, _, p in steps]
            share_fwd = [p / f for _, f, p in steps]
            proc_ms = [p * 1e3 for _, _, p in steps]
            tps = batch * args.tokens / statistics.median(walls[mode])
            rows.append(
                dict(
                    batch=batch,
                    mode=mode,
                    runs=len(walls[mode]),
                    steps=len(steps),
                    step_ms=statistics.median([s * 1e3 for s, _, _ in steps]),
                    fwd_ms=statistics.median([f * 1e3 for _, f, _ in steps]),
                    proc_p50=pct(proc_ms, 50),
                    proc_p90=pct(proc_ms, 90),
                    share_p50=pct(share, 50),
                    share_p90=pct(share, 90),
                    fwd_p50=pct(share_fwd, 50),
                    fwd_p90=pct(share_fwd, 90),
                    free_step_ms=free_step * 1e3,
                    tps=tps,
                    free_tps=free_tps,
                    compile_s=compile_s,
                )
            )

    load = os.getloadavg()
    print(
        f"\n{platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__} "
        f"({torch.get_num_threads()} threads), {args.dtype}, load average {load[0]:.2f} / {load[1]:.2f}; "
        f"{args.tokens} greedy steps per run, prefill left out\n"
    )
    print(
        "| batch | masks | runs x steps | step p50 (ms) | forward p50 (ms) | constrain p50 / p90 (ms) "
        "| constrain / step p50 / p90 | constrain / forward p50 / p90 | unconstrained step p50 (ms) "
        "| tok/s constrained / unconstrained | ratio |"
    )
    print("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['batch']} | {r['mode']} | {r['runs']} x {r['steps'] // r['runs']} | {r['step_ms']:.1f} "
            f"| {r['fwd_ms']:.1f} | {r['proc_p50']:.2f} / {r['proc_p90']:.2f} "
            f"| {100 * r['share_p50']:.2f}% / {100 * r['share_p90']:.2f}% "
            f"| {100 * r['fwd_p50']:.2f}% / {100 * r['fwd_p90']:.2f}% | {r['free_step_ms']:.1f} "
            f"| {r['tps']:.1f} / {r['free_tps']:.1f} | {r['tps'] / r['free_tps']:.3f} |"
        )
    print(f"\nschema compile: {rows[0]['compile_s'] * 1e3:.0f} ms (first batch size; later ones hit warm caches)")
    lengths = [int(x) for x in args.lengths.split(",") if x]
    if lengths:
        print("\nthe processor alone, batch 8, random logits (ms per call):\n")
        print("| generated tokens per row | p50 | p90 |")
        print("|---:|---:|---:|")
        for generated, p50, p90 in processor_vs_length(vocab, lengths):
            print(f"| {generated:,} | {p50:.2f} | {p90:.2f} |")
    worst = max(r["share_p90"] for r in rows if r["mode"] == "warm")
    print(f"worst warm p90 share: {100 * worst:.2f}% (target: at most 5%)")


if __name__ == "__main__":
    main()
