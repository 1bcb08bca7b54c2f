"""Choosing among candidates on an extraction task with known answers: field accuracy and speed of greedy decoding,
beam search, best-of-n, self-consistency, MBR and contrastive decoding with Gemma 3 270M (base) on the CPU.

Run: .venv/bin/python benchmarks/bench_search.py [--prompts 50] [--n 8] [--beams 4] [--temperature 0.7]
     [--max-new-tokens 64] [--threads 2] [--mbr-utility fields] [--amateur-layers 6] [--markdown FILE]

Task: ``--prompts`` short texts that each state a person's name, age, city and e-mail address, made from four
sentence templates and fixed value lists by a seeded generator (the same texts on every run), each asked for as a
``Record`` (a Pydantic model with bounded fields) after two worked examples (few-shot: a base model of 270M
parameters needs them). The answer is the values the text was made from, so every field is checked exactly.

Methods, in one run on the same prompts:

  greedy              LLM.complete, temperature 0
  beam-B              constrain.beam_search, B beams under the structure, length penalty 1, over the
                      transformers model with the prompt's key-value cache computed once (each step copies it
                      for the beams and re-reads only the generated tokens)
  best-of-n           LLM.best_of, n samples in one batch, the highest mean log-probability per token
  self-consistency-n  LLM.self_consistency(by="field"): each field's most frequent value among n samples
  mbr-n               LLM.mbr(utility=--mbr-utility): the sample of highest expected utility against the others
  contrastive         greedy on log p_expert - log p_amateur (constrain.decoding.contrastive), the amateur the
                      expert's first --amateur-layers layers (early_exit_model, shared weights); the row is left
                      out, with a note, where constrain.decoding.contrastive is not there

Sampled methods draw at --temperature with the seed of the prompt's index, so a run repeats. Printed per method:
field accuracy (fields equal to the answer, over all fields of all prompts), record accuracy (all four fields
right), seconds per prompt, output tokens/s (the chosen output's tokens over the method's time) and decoded
tokens/s (every token decoded: n outputs for the sampled methods, one per beam and step for beam search).
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import inspect
import platform
import random
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from pydantic import BaseModel, Field

import constrain
from constrain.compilers.output_types import output_type
from constrain.decoding.beam import beam_search
from constrain.decoding.loop import Decoding
from constrain.errors import IncompleteOutputError

FIRST = ["Maria", "Tomas", "Aisha", "Kenji", "Olga", "Pedro", "Lena", "Samuel", "Ingrid", "Ravi", "Chloe", "Omar"]
LAST = ["Keller", "Novak", "Haddad", "Tanaka", "Petrova", "Silva", "Berg", "Okafor", "Lund", "Mehta", "Dubois"]
CITIES = ["Lisbon", "Oslo", "Nairobi", "Osaka", "Krakow", "Lima", "Dublin", "Hamburg", "Porto", "Quebec", "Austin"]
DOMAINS = ["example.com", "mail.org", "post.net"]
TEMPLATES = [
    "{name} is {age} years old and lives in {city}. Contact: {email}.",
    "Contact {name} ({email}), aged {age}, based in {city}.",
    "From {city}: {name}, {age}, reachable at {email}.",
    "{name}, a {age}-year-old from {city}, wrote from {email}.",
]
SHOTS = [
    ("Greta Holm is 52 years old and lives in Vienna. Contact: greta.holm@web.de.",
     '{"name":"Greta Holm","age":52,"city":"Vienna","email":"greta.holm@web.de"}'),
    ("From Madrid: Luis Ortega, 29, reachable at lortega@correo.es.",
     '{"name":"Luis Ortega","age":29,"city":"Madrid","email":"lortega@correo.es"}'),
]  # fmt: skip
FIELDS = ("name", "age", "city", "email")


class Record(BaseModel):
    name: str = Field(max_length=30)
    age: int = Field(ge=0, le=120)
    city: str = Field(max_length=20)
    email: str = Field(max_length=40)


@dataclass
class Outcome:
    """One method on one prompt: the value chosen (None when it did not finish), tokens of the chosen output, and
    all tokens decoded."""

    value: Record | None
    tokens: int
    decoded: int


def make_tasks(count: int, seed: int = 0) -> list[tuple[str, dict[str, Any]]]:
    """``count`` (prompt, answer) pairs, the same for the same seed."""
    rng = random.Random(seed)
    tasks = []
    for k in range(count):
        first, last = rng.choice(FIRST), rng.choice(LAST)
        answer = {
            "name": f"{first} {last}",
            "age": rng.randrange(18, 90),
            "city": rng.choice(CITIES),
            "email": f"{first.lower()}.{last.lower()}@{rng.choice(DOMAINS)}",
        }
        text = TEMPLATES[k % len(TEMPLATES)].format(**answer)
        shots = "".join(f"Text: {t}\nJSON: {j}\n\n" for t, j in SHOTS)
        tasks.append((f"{shots}Text: {text}\nJSON: ", answer))
    return tasks


def prompt_cached(model: Any, prompt: list[int]) -> Callable[[list[list[int]]], np.ndarray]:
    """A ``next_logits(prefixes)`` for beam search over ``prompt``: the prompt is read once, and each call copies its
    key-value cache for the prefixes (of equal length, as beam search gives them) and reads only what follows it.
    Without it every step would re-read the whole few-shot prompt for every beam."""
    name = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    with torch.no_grad():
        out = model(input_ids=torch.tensor([prompt]), use_cache=True)
    cache, first = getattr(out, name), out.logits[:, -1].float().numpy()

    def next_logits(prefixes: list[list[int]]) -> np.ndarray:
        suffixes = [p[len(prompt) :] for p in prefixes]
        if not suffixes[0]:
            return np.repeat(first, len(prefixes), axis=0)
        copied = copy.deepcopy(cache)
        copied.batch_repeat_interleave(len(prefixes))
        with torch.no_grad():
            out = model(input_ids=torch.tensor(suffixes), use_cache=True, **{name: copied})
        return out.logits[:, -1].float().numpy()

    return next_logits


def contrastive_method(llm: constrain.LLM, layers: int, max_new_tokens: int) -> Callable[[str, int], Outcome] | None:
    """Greedy contrastive decoding against the expert's first ``layers`` layers, or None where the loop has no
    contrastive decoding."""
    if importlib.util.find_spec("constrain.decoding.contrastive") is None:
        return None
    if "contrastive" not in inspect.signature(Decoding).parameters:
        return None
    from constrain.decoding.contrastive import Contrastive
    from constrain.decoding.drafts import early_exit_model
    from constrain.integrations.transformers_model import TransformersModel

    backend = llm.backend
    amateur = TransformersModel(early_exit_model(backend.model, layers), backend.tokenizer)
    structure = llm.structure(Record)
    reader = output_type(Record)

    def run(prompt: str, index: int) -> Outcome:
        decoding = Decoding(
            backend, [backend.encode(prompt)], structures=structure, max_new_tokens=max_new_tokens,
            eos_ids=[int(t) for t in llm.vocab.eos_ids], fast_forward="text", tokenize=backend.tokenize,
            contrastive=Contrastive(amateur=amateur, alpha=0.1),
        )  # fmt: skip
        row = decoding.run()[0]
        text = llm.vocab.decode(row.tokens).decode("utf-8", errors="replace")
        value = reader.parse(text) if row.complete else None
        return Outcome(value, len(row.tokens), len(row.tokens))

    return run


def methods(llm: constrain.LLM, args: argparse.Namespace) -> dict[str, Callable[[str, int], Outcome] | None]:
    n, temperature, budget = args.n, args.temperature, args.max_new_tokens
    structure = llm.structure(Record)
    reader = output_type(Record)

    def greedy(prompt: str, index: int) -> Outcome:
        done = llm.complete(prompt, Record, max_new_tokens=budget)
        return Outcome(done.value, len(done.tokens), len(done.tokens))

    def beam(prompt: str, index: int) -> Outcome:
        ids = llm.backend.encode(prompt)
        found = beam_search(
            prompt_cached(llm.backend.model, ids), ids, num_beams=args.beams, max_new_tokens=budget,
            structure=structure,
        )  # fmt: skip
        best = found[0]
        tokens = [t for t in best.tokens if t not in llm.vocab.eos_ids]
        value = reader.parse(llm.vocab.decode(tokens).decode("utf-8", errors="replace")) if best.finished else None
        return Outcome(value, len(tokens), len(best.tokens) * args.beams)

    def chosen(select: Callable[..., constrain.Selection]) -> Callable[[str, int], Outcome]:
        def run(prompt: str, index: int) -> Outcome:
            picked = select(prompt, Record, n=n, temperature=temperature, seed=index, max_new_tokens=budget)
            decoded = sum(len(c.tokens) for c in picked.candidates)
            return Outcome(picked.value, len(picked.candidate.tokens), decoded)

        return run

    return {
        "greedy": greedy,
        f"beam-{args.beams}": beam,
        f"best-of-{n}": chosen(llm.best_of),
        f"self-consistency-{n}": chosen(lambda *a, **k: llm.self_consistency(*a, by="field", **k)),
        f"mbr-{n} ({args.mbr_utility})": chosen(lambda *a, **k: llm.mbr(*a, utility=args.mbr_utility, **k)),
        "contrastive": contrastive_method(llm, args.amateur_layers, budget),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=50)
    parser.add_argument("--n", type=int, default=8, help="candidates of best-of-n, self-consistency and MBR")
    parser.add_argument("--beams", type=int, default=4)
    parser.add_argument("--temperature", type=float, default=0.7, help="of the sampled candidates")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--mbr-utility", default="fields", choices=["exact", "f1", "edit", "fields"])
    parser.add_argument("--amateur-layers", type=int, default=6, help="layers of contrastive decoding's amateur")
    parser.add_argument("--markdown", type=Path, help="also write the table to this file")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    llm = constrain.LLM()
    tasks = make_tasks(args.prompts)
    rows, notes = [], []
    llm.complete(tasks[0][0], Record, max_new_tokens=args.max_new_tokens)  # warm-up: compile, touch the weights
    for name, run in methods(llm, args).items():
        if run is None:
            notes.append(f"{name}: left out (constrain.decoding.contrastive is not in this tree)")
            continue
        right = records = tokens = decoded = unfinished = 0
        begun = time.perf_counter()
        for index, (prompt, answer) in enumerate(tasks):
            try:
                outcome = run(prompt, index)
            except IncompleteOutputError:
                outcome = Outcome(None, 0, 0)
            if outcome.value is None:
                unfinished += 1
                continue
            got = outcome.value.model_dump()
            hits = sum(got[f] == answer[f] for f in FIELDS)
            right += hits
            records += hits == len(FIELDS)
            tokens += outcome.tokens
            decoded += outcome.decoded
        seconds = time.perf_counter() - begun
        rows.append((name, right / (len(FIELDS) * len(tasks)), records / len(tasks), seconds / len(tasks),
                     tokens / seconds, decoded / seconds, unfinished))  # fmt: skip
        print(f"{name}: done in {seconds:.1f} s", file=sys.stderr)

    lines = [
        f"{len(tasks)} prompts, {platform.processor() or platform.machine()}, {args.threads} torch threads, "
        f"n={args.n}, temperature {args.temperature}, max_new_tokens {args.max_new_tokens}",
        "",
        "| method | field accuracy | record accuracy | s / prompt | output tok/s | decoded tok/s | unfinished |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, field_acc, record_acc, per_prompt, out_rate, decoded_rate, unfinished in rows:
        lines.append(
            f"| {name} | {field_acc:.1%} | {record_acc:.1%} | {per_prompt:.2f} | {out_rate:.1f} | "
            f"{decoded_rate:.1f} | {unfinished} |"
        )
    lines += [f"\n{note}" for note in notes]
    table = "\n".join(lines)
    print(table)
    if args.markdown:
        args.markdown.write_text(table + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
