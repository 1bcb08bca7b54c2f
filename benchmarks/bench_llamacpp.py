"""Generation speed in llama-cpp-python with Gemma 3 270M (Q4_K_M): no structure, constrain's logits processor, and
llama.cpp's own grammar (``LlamaGrammar``, GBNF) for the same language, in one run.

Run: python benchmarks/bench_llamacpp.py [--runs 7] [--threads N] [--free-tokens 32] [--structures LIST] [--quick]
     [--markdown FILE]

Structures (``--structures``, comma-separated; default all):

  json-schema   a JSON Schema (a user record: name maxLength 30, age integer 0..120, an email-like pattern, a role
                enum, up to 3 short tags; all required, no other properties), compiled by constrain's
                ``compile_json_schema`` for the model's vocabulary; llama.cpp gets the GBNF that llama-cpp-python's
                own converter (``llama_cpp.llama_grammar.json_schema_to_gbnf``) writes for the same schema.
                Outputs are checked with ``jsonschema``. The two languages differ a little, which is reported:
                constrain's JSON is compact (no whitespace outside strings; ``whitespace="flexible"`` would allow
                it) while the converter allows one optional space around punctuation, and the converter drops
                ``minimum``/``maximum`` of integers (any integer, negative or huge, passes its grammar).
  json-like     a JSON-like object regex, with a hand-written equivalent GBNF
  date-time     an ISO 8601 date-time regex, with a hand-written equivalent GBNF

For each it decodes greedily with ``Llama.generate`` (the loop ``create_completion`` runs) in these modes:

  unconstrained   no processor, no grammar (``--free-tokens`` tokens, or up to the model's own end of sequence)
  no-op processor a Python processor that returns the scores unchanged: llama-cpp-python's own cost of calling one
  constrain       constrain's LlamaCppLogitsProcessor (the structure compiled for the model's vocabulary)
  llama grammar   LlamaGrammar.from_string(GBNF)

A run's speed is (tokens sampled - 1) / (time from the first sampled token to the last): the prompt is excluded and
every later token costs one evaluation plus one sampling. The modes take turns within each run, so drift in the
machine's speed hits all of them alike. Printed per mode: the median tok/s over the runs (and their range), and
1 / (median time per token over all tokens of all runs), which shrugs off the stalls other processes on a shared
machine cause; the ratios constrain / unconstrained (target >= 0.95) and constrain / llama grammar (target >= 4) by
both measures; the time spent inside constrain's processor per token during generation, as a share of an
unconstrained step (a figure machine noise does not blur), and in a tight loop; the machine and its load average;
the outputs (each constrained output is checked: re.fullmatch for a regex, jsonschema for a schema; the grammar's
too). At the end, a markdown table of all structures (also written to ``--markdown FILE``).

Note on the second target: constrain cannot run faster than unconstrained decoding, so constrain / llama grammar
is at most unconstrained / llama grammar; where llama.cpp's grammar costs less than 4x an unconstrained step, the
4x target is out of reach by construction, and the table shows that bound (column "unconstrained / grammar").

``--quick``: 2 runs, 24 free tokens, the JSON Schema only (a few minutes on a loaded 2-core machine).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import sys
import time

import numpy as np

try:
    import llama_cpp
    from llama_cpp import Llama, LlamaGrammar, LogitsProcessorList
    from llama_cpp.llama_grammar import json_schema_to_gbnf
except ImportError:  # pragma: no cover
    sys.exit("llama-cpp-python is not installed: pip install -e '.[llamacpp]' (or bash scripts/setup.sh)")

import jsonschema

from constrain.compilers.json_schema import compile_json_schema
from constrain.compilers.regex import compile_regex
from constrain.integrations.llamacpp import LlamaCppLogitsProcessor, vocabulary_from_llama
from constrain.models.gemma import gguf_model_path

USER_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 30},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        # "[.]" rather than "\\.": llama-cpp-python's converter copies "\\." into GBNF, where llama.cpp refuses the
        # escape ("unknown escape") and the process crashes when sampling
        "email": {"type": "string", "pattern": "^[a-z0-9._]{1,20}@[a-z0-9]{1,15}[.](com|org|net)$"},
        "role": {"type": "string", "enum": ["admin", "editor", "viewer"]},
        "tags": {"type": "array", "items": {"type": "string", "minLength": 1, "maxLength": 12}, "maxItems": 3},
    },
    "required": ["name", "age", "email", "role", "tags"],
    "additionalProperties": False,
}

STRUCTURES = [
    {
        "key": "json-schema",
        "name": "JSON Schema (user record)",
        "prompt": "Alice Smith is 34, her email is alice.smith@example.com, she is an editor and likes hiking, "
        "chess and jazz. Her user record as JSON: ",
        "schema": USER_SCHEMA,
    },
    {
        "key": "json-like",
        "name": "json-like object",
        "prompt": "Here is a person as JSON: ",
        "regex": r'\{"name": "[a-zA-Z ]{1,20}", "age": \d{1,3}\}',
        "gbnf": r"""
root ::= "{\"name\": \"" [a-zA-Z ]{1,20} "\", \"age\": " [0-9]{1,3} "}"
""",
    },
    {
        "key": "date-time",
        "name": "ISO 8601 date-time",
        "prompt": "The meeting starts at (ISO 8601 timestamp): ",
        "regex": r"\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])T([01]\d|2[0-3]):[0-5]\d:[0-5]\d(\.\d{1,6})?"
        r"(Z|[+-]([01]\d|2[0-3]):[0-5]\d)",
        "gbnf": r"""
root  ::= [0-9]{4} "-" month "-" day "T" hour ":" [0-5] [0-9] ":" [0-5] [0-9] frac? tz
month ::= "0" [1-9] | "1" [0-2]
day   ::= "0" [1-9] | [12] [0-9] | "3" [01]
hour  ::= [01] [0-9] | "2" [0-3]
frac  ::= "." [0-9]{1,6}
tz    ::= "Z" | [+-] hour ":" [0-5] [0-9]
""",
    },
]


def noop_processor(input_ids: np.ndarray, scores: np.ndarray) -> np.ndarray:
    return scores


def decode(llm: Llama, prompt_tokens: list[int], max_tokens: int, *, processors=None, grammar=None):
    """Greedy decoding with Llama.generate; returns (sampled tokens, their arrival times, text)."""
    is_eog = llama_cpp.llama_vocab_is_eog
    vocab_p = llama_cpp.llama_model_get_vocab(llm.model)
    tokens: list[int] = []
    times: list[float] = []
    for token in llm.generate(prompt_tokens, temp=0.0, logits_processor=processors, grammar=grammar):
        times.append(time.perf_counter())
        if is_eog(vocab_p, token):
            break
        tokens.append(token)
        if len(tokens) >= max_tokens:
            break
    text = b"".join(llm.detokenize([t]) for t in tokens).decode("utf-8", errors="replace")
    return tokens, times, text


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def load() -> str:
    try:
        return " ".join(open("/proc/loadavg").read().split()[:3])
    except OSError:
        return "?"


def tok_per_s(times: list[float]) -> float:
    return (len(times) - 1) / (times[-1] - times[0]) if len(times) > 1 else float("nan")


def processor_call_time(processor: LlamaCppLogitsProcessor, prompt_tokens: list[int], tokens: list[int], n_vocab: int):
    """Median microseconds per call of ``processor`` along ``tokens``, on a llama-cpp-python style strided view."""
    rec = np.zeros(n_vocab, dtype=np.dtype([("id", np.intc), ("logit", np.single), ("p", np.single)], align=True))
    seqs = [np.asarray(prompt_tokens + tokens[:i], np.int32) for i in range(len(tokens) + 1)]
    samples = []
    for _ in range(5):
        processor.reset()
        for seq in seqs:
            rec["logit"] = 0.0
            t0 = time.perf_counter()
            rec["logit"][:] = processor(seq, rec["logit"])  # what llama-cpp-python does with the result
            samples.append(time.perf_counter() - t0)
    return float(np.median(samples) * 1e6)


def whitespace_outside_strings(text: str) -> int:
    """How many whitespace characters a JSON text has outside its strings."""
    n, in_string, escaped = 0, False, False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in " \t\r\n":
            n += 1
    return n


def check_output(spec: dict, text: str) -> tuple[bool, str]:
    """Whether ``text`` is in the structure's language (re.fullmatch, or json.loads + jsonschema), and a remark."""
    if "regex" in spec:
        ok = re.fullmatch(spec["regex"], text) is not None
        return ok, "matches the regex" if ok else "does not match the regex"
    try:
        value = json.loads(text)
    except ValueError as exc:
        return False, f"not JSON ({exc})"
    ws = whitespace_outside_strings(text)
    layout = "compact" if ws == 0 else f"{ws} whitespace char(s) outside strings"
    try:
        jsonschema.validate(value, spec["schema"])
    except jsonschema.ValidationError as exc:
        return False, f"JSON, {layout}, INVALID under the schema: {exc.message[:80]}"
    return True, f"valid under the schema (jsonschema), {layout}"


def build(spec: dict, vocab):
    """(constrain's structure, compile seconds, the GBNF for llama.cpp, a one-line description)."""
    t0 = time.perf_counter()
    if "schema" in spec:
        structure = compile_json_schema(spec["schema"], vocab)
        gbnf = json_schema_to_gbnf(json.dumps(spec["schema"]))
        described = f"{json.dumps(spec['schema'], separators=(',', ':'))}"
    else:
        structure = compile_regex(spec["regex"], vocab)
        gbnf = spec["gbnf"]
        described = spec["regex"]
    return structure, time.perf_counter() - t0, gbnf, described


def markdown_table(rows: list[dict]) -> str:
    head = (
        "| structure | tokens | unconstrained | no-op processor | constrain | llama grammar | constrain / "
        "unconstrained (target >= 0.95) | constrain / grammar (target >= 4) | unconstrained / grammar (bound) | "
        "constrain's processor per token | output valid: constrain / grammar |"
    )
    lines = [head, "|" + "---|" * head.count(" | ") + "---|"]
    for r in rows:
        med, rob = r["med"], r["robust"]

        def ratio(a, b, fmt):
            return f"{fmt.format(med[a] / med[b])} ({fmt.format(rob[a] / rob[b])})"

        lines.append(
            f"| {r['name']} | {r['tokens']} | {med['unconstrained']:.1f} | {med['no-op processor']:.1f} | "
            f"{med['constrain']:.1f} | {med['llama grammar']:.1f} | "
            f"{ratio('constrain', 'unconstrained', '{:.3f}')} | {ratio('constrain', 'llama grammar', '{:.2f}')} | "
            f"{ratio('unconstrained', 'llama grammar', '{:.2f}')} | "
            f"{r['in_us']:.0f} µs = {r['in_share']:.1f}% of a step | "
            f"{'yes' if r['ok']['constrain'] else 'NO'} / {'yes' if r['ok']['llama grammar'] else 'NO'} |"
        )
    lines.append("")
    lines.append(
        "tok/s: median over the runs of (tokens - 1) / (first to last sampled token); ratios: by those medians "
        "(in parentheses: by 1 / the median time per token over all runs). tokens: sampled by constrain, "
        "end of sequence included. constrain / grammar can be at most unconstrained / grammar."
    )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument(
        "--threads", type=int, default=None, help="llama.cpp threads (default: llama-cpp-python's, half the CPUs)"
    )
    ap.add_argument("--free-tokens", type=int, default=32, help="tokens per unconstrained run")
    keys = [spec["key"] for spec in STRUCTURES]
    ap.add_argument(
        "--structures", default=",".join(keys), help=f"comma-separated, from {', '.join(keys)} (default: all)"
    )
    ap.add_argument("--quick", action="store_true", help="2 runs, 24 free tokens, the JSON Schema only")
    ap.add_argument("--markdown", default=None, help="also write the summary table to this file")
    args = ap.parse_args()
    wanted = [k.strip() for k in args.structures.split(",") if k.strip()]
    unknown = sorted(set(wanted) - set(keys))
    if unknown:
        ap.error(f"unknown structure(s) {', '.join(unknown)}; choose from {', '.join(keys)}")
    runs, free_tokens = args.runs, args.free_tokens
    if args.quick:
        runs, free_tokens, wanted = 2, 24, ["json-schema"]
    structures = [spec for spec in STRUCTURES if spec["key"] in wanted]

    machine = (
        f"{cpu_name()}, {os.cpu_count()} CPUs, {platform.system()} {platform.release()}; "
        f"Python {platform.python_version()}, numpy {np.__version__}, llama-cpp-python {llama_cpp.__version__}"
    )
    load_start = load()
    print(f"machine: {machine}")
    print(f"load average at start: {load_start}")
    t0 = time.perf_counter()
    llm = Llama(model_path=str(gguf_model_path()), n_ctx=1024, n_threads=args.threads, seed=0, verbose=False)
    print(
        f"model: {gguf_model_path().name}, n_vocab {llm.n_vocab():,}, n_threads {llm.n_threads} "
        f"(loaded in {time.perf_counter() - t0:.1f} s)"
    )
    t0 = time.perf_counter()
    vocab = vocabulary_from_llama(llm)
    print(f"vocabulary from llama.cpp: {time.perf_counter() - t0:.2f} s ({vocab!r})")
    print(f"runs: {runs}, greedy decoding; medians over the runs\n")

    rows: list[dict] = []
    for spec in structures:
        structure, compile_s, gbnf, described = build(spec, vocab)
        t0 = time.perf_counter()
        grammar = LlamaGrammar.from_string(gbnf, verbose=False)
        grammar_s = time.perf_counter() - t0
        processor = LlamaCppLogitsProcessor(structure)
        inside: list[float] = []  # seconds spent in constrain's processor per call, during the timed runs

        def timed_processor(input_ids, scores, processor=processor, inside=inside):
            t = time.perf_counter()
            out = processor(input_ids, scores)
            inside.append(time.perf_counter() - t)
            return out

        prompt_tokens = llm.tokenize(spec["prompt"].encode(), add_bos=True, special=False)
        modes = {
            "unconstrained": dict(max_tokens=free_tokens),
            "no-op processor": dict(max_tokens=free_tokens, processors=LogitsProcessorList([noop_processor])),
            "constrain": dict(max_tokens=256, processors=LogitsProcessorList([timed_processor])),
            "llama grammar": dict(max_tokens=256, grammar=grammar),
        }
        rates: dict[str, list[float]] = {m: [] for m in modes}
        steps: dict[str, list[float]] = {m: [] for m in modes}
        counts: dict[str, list[int]] = {m: [] for m in modes}
        texts: dict[str, str] = {}
        sampled: dict[str, list[int]] = {}
        decode(llm, prompt_tokens, 4)  # warm-up: first evaluation, numba caches, the mask cache of the structure
        decode(llm, prompt_tokens, 256, processors=LogitsProcessorList([processor]))
        decode(llm, prompt_tokens, 4, grammar=grammar)
        inside.clear()
        for _ in range(runs):
            for mode, kw in modes.items():
                if mode == "constrain":
                    processor.reset()
                tokens, times, text = decode(llm, prompt_tokens, **kw)
                rates[mode].append(tok_per_s(times))
                steps[mode].extend(np.diff(times).tolist())
                counts[mode].append(len(times))
                texts[mode], sampled[mode] = text, tokens
        med = {m: statistics.median(r) for m, r in rates.items()}
        robust = {m: 1.0 / statistics.median(d) for m, d in steps.items()}
        print(f"== {spec['name']}: {described}")
        print(
            f"   compile: constrain {compile_s * 1e3:.0f} ms, LlamaGrammar {grammar_s * 1e3:.0f} ms "
            f"(GBNF of {len(gbnf.splitlines())} lines)"
        )
        for mode in modes:
            spread = f"{min(rates[mode]):6.1f}-{max(rates[mode]):6.1f}"
            print(
                f"   {mode:16s} {med[mode]:7.1f} tok/s  (runs {spread}; per-token median {robust[mode]:6.1f} tok/s; "
                f"{int(np.median(counts[mode]))} tokens sampled)  {texts[mode][:48]!r}"
            )
        ok = {}
        for mode in ("constrain", "llama grammar"):
            ok[mode], remark = check_output(spec, texts[mode])
            print(f"   {mode} output: {texts[mode]!r}\n      {remark}")
        call_us = processor_call_time(processor, prompt_tokens, sampled["constrain"], llm.n_vocab())
        in_us = statistics.median(inside) * 1e6
        step_us = 1e6 / robust["unconstrained"]
        print(
            f"   constrain's processor: {in_us:.0f} us per call inside generation (median; {call_us:.0f} us in a "
            f"tight loop, caches warm) = {100 * in_us / step_us:.1f}% of an unconstrained step ({step_us / 1e3:.1f} ms)"
        )
        for label, sp in (("median of runs", med), ("per-token median", robust)):
            print(
                f"   ratios ({label}): constrain / unconstrained = {sp['constrain'] / sp['unconstrained']:.3f}x "
                f"(target >= 0.95), constrain / llama grammar = {sp['constrain'] / sp['llama grammar']:.2f}x "
                f"(target >= 4; at most unconstrained / llama grammar = "
                f"{sp['unconstrained'] / sp['llama grammar']:.2f}x), no-op processor / unconstrained = "
                f"{sp['no-op processor'] / sp['unconstrained']:.3f}x"
            )
        print(f"   load average now: {load()}\n")
        rows.append(
            dict(
                name=spec["name"],
                tokens=int(np.median(counts["constrain"])),
                med=med,
                robust=robust,
                in_us=in_us,
                in_share=100 * in_us / step_us,
                ok=ok,
            )
        )

    table = markdown_table(rows)
    command = "python benchmarks/bench_llamacpp.py " + " ".join(sys.argv[1:])
    footer = (
        f"\nmachine: {machine}; llama.cpp threads {llm.n_threads}; load average {load_start} at start, "
        f"{load()} at the end; {runs} runs; command: `{command.strip()}`"
    )
    print(table + footer)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(table + footer + "\n")
        print(f"(written to {args.markdown})")


if __name__ == "__main__":
    main()
