"""The MaskBench conformance golden file: what the JSON Schema compiler does with every dev schema.

    .venv/bin/python -m tests.maskbench_golden --update              # regenerate tests/data/maskbench_golden.json.gz
    .venv/bin/python -m tests.maskbench_golden                       # run everything, print the differences only
    .venv/bin/python -m tests.maskbench_golden --names A.json,B.json # a few schemas, compared with the golden
    .venv/bin/python -m tests.maskbench_golden --names A.json --update  # rerun these, replace their records
    options: --workers N (processes, default 2), --timeout S (per schema, default 120), --max-rss-mb M (default 4000)

Data: ``../shared/data/maskbench-dev.jsonl.gz`` (5,545 schemas with valid and invalid instances), read in place.
For every schema, :func:`run_entry` compiles it with
``constrain.compilers.json_schema.compile_json_schema(schema, gemma_vocab)`` (strict, compact whitespace) and, when
it compiles, runs each test instance through a :class:`~constrain.runtime.matcher.Matcher` token by token:

- the instance is put in the compiler's canonical key order (:func:`canonical_order`), serialised compactly
  (``benchmarks/maskbench.py``'s ``serialise``: ``json.dumps(separators=(",", ":"), ensure_ascii=False)``) and
  tokenised with the Gemma tokenizer without BOS, as the MaskBench harness does;
- the outcome is ``"A"`` (every token accepted and the matcher may end there), ``"R<i>"`` (token ``i`` rejected),
  ``"E"`` (every token accepted but the structure is not complete), ``"X<i>:<class>"`` (the matcher raised an
  exception other than ``TokenError`` at token ``i``: a bug, never an acceptance) or ``"S:<why>"`` (skipped: no
  UTF-8 form, or the tokens do not spell the text's bytes).

A valid instance that is not ``"A"`` is a *validation error*, an invalid instance that is ``"A"`` an *invalidation
error*. For each validation error the golden file keeps a diagnosis (``why``, see :func:`diagnose`): whether the
instance's own key order, or numbers written the way the compiler writes them, would have been accepted, or what
``jsonschema`` (formats asserted) says about the instance.

The golden file (gzip JSON, deterministic: keys sorted, gzip mtime 0, no timings) holds one record per schema, in
data-file order::

    {"name", "index", "status": "compiled" | "refused" | "time_limit" | "timeout" | "memory" | "crashed",
     "error": {"class", "keyword", "pointer", "reason"},          # refused / time_limit / crashed only
     "tests": ["A", "R3", ...],                                     # compiled only, one per instance
     "valid_rejected": [{"test", "outcome", "why", "near"}, ...],   # compiled only, when any
     "invalid_accepted": [{"test", "jsonschema"}, ...],             # compiled only, when any
     "matcher_errors": [{"test", "outcome", "valid"}, ...]}         # compiled only, when any (``X`` outcomes)

``reason`` is the error message with quoted names and numbers blanked (``'…'``, ``N``), for reading and counting;
the test compares only ``class``, ``keyword`` and ``pointer``. Hostile schemas: ``time_limit`` is a refusal by the
compiler's own time limit (``time_limit``, 5 s by default; the compile runs with the default options, so which
schemas land here depends on the machine), ``timeout`` / ``memory`` mean the compile (or its tests) ran past
``--timeout`` seconds or the worker's resident memory passed ``--max-rss-mb``. ``crashed``: an exception other than
``JsonSchemaError`` (a compiler bug).

Canonical key order (:func:`canonical_order`): the compiler writes an object's members in a fixed order, so a
valid instance whose keys come in another order is never produced; the helper that puts an instance in that order
lives in ``benchmarks/maskbench_keyorder.py`` (its docstring says how the order is worked out), shared with the
MaskBench harness, which reports the validation errors of every engine in that order as a second count.
"""

from __future__ import annotations

import argparse
import gc
import gzip
import hashlib
import importlib.util
import json
import os
import re
import signal
import sys
import time
import traceback
from collections import Counter, deque
from decimal import Decimal
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT.parent / "shared" / "data" / "maskbench-dev.jsonl.gz"
GOLDEN = ROOT / "tests" / "data" / "maskbench_golden.json.gz"
COMMAND = ".venv/bin/python -m tests.maskbench_golden --update"
FORMAT_VERSION = 1

#: The CI sample: this many schemas, the first by ``sha256(SAMPLE_SEED + name)`` among those not hostile.
SAMPLE_SIZE = 500
SAMPLE_SEED = "maskbench-conformance-v1:"
#: Golden statuses of hostile schemas, left out of the sample: the compiler's own time limit refused them, or the
#: generator's timeout / memory bound stopped them. Which schemas land here depends on the machine's speed.
HOSTILE = ("time_limit", "timeout", "memory")


def _harness():
    """``benchmarks/maskbench.py`` (for ``serialise``, the text every engine is given, and ``canonical_order``)."""
    mod = sys.modules.get("maskbench")
    if mod is None:
        spec = importlib.util.spec_from_file_location("maskbench", ROOT / "benchmarks" / "maskbench.py")
        mod = importlib.util.module_from_spec(spec)
        sys.modules["maskbench"] = mod
        try:
            spec.loader.exec_module(mod)
        except BaseException:
            del sys.modules["maskbench"]
            raise
    return mod


def serialise(value: Any) -> str:
    return _harness().serialise(value)


def canonical_order(schema: Any, instance: Any) -> Any:
    """``instance`` with each object's keys in the order the compiler writes them for ``schema``: the harness's
    ``canonical_order`` (``benchmarks/maskbench_keyorder.py``, whose docstring says how it is worked out)."""
    return _harness().canonical_order(schema, instance)


# ---------------------------------------------------------------------------------------------------------------
# Data, golden file, sample


def load_entries(path: Path = DATA, names: set[str] | None = None) -> list[dict[str, Any]]:
    """The data file's entries in order, each with its ``index``; only ``names`` when given."""
    out = []
    with gzip.open(path, "rt", encoding="utf-8") as f:
        for i, line in enumerate(f):
            if names is not None and not any(f'"{n}"' in line[:400] for n in names):
                continue
            entry = json.loads(line)
            if names is not None and entry["name"] not in names:
                continue
            entry["index"] = i
            out.append(entry)
    return out


def load_golden(path: Path = GOLDEN) -> dict[str, Any]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return json.load(f)


def write_golden(golden: dict[str, Any], path: Path = GOLDEN) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(golden, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    # one record a line inside the JSON, so a decompressed diff stays readable
    text = text.replace(',{"error"', ',\n{"error"').replace(',{"index"', ',\n{"index"')
    with open(path, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0, filename="") as f:
        f.write(text.encode("utf-8"))


def sample_names(records: list[dict[str, Any]], size: int = SAMPLE_SIZE) -> list[str]:
    """The fixed CI sample: schemas ordered by ``sha256(SAMPLE_SEED + name)``, hostile ones (:data:`HOSTILE` in
    the golden file) left out, the first ``size``; returned in data-file order."""
    ok = [r for r in records if r["status"] not in HOSTILE]
    ok.sort(key=lambda r: hashlib.sha256((SAMPLE_SEED + r["name"]).encode()).hexdigest())
    picked = {r["name"] for r in ok[:size]}
    return [r["name"] for r in records if r["name"] in picked]


# ---------------------------------------------------------------------------------------------------------------
# One schema


def canonical_numbers(value: Any) -> Any:
    """``value`` with numbers as the compiler writes them: integral floats as integers, other floats in plain
    decimal notation (as ``Decimal`` text, wrapped so json.dumps writes them raw)."""
    if isinstance(value, bool) or value is None or isinstance(value, (str, int)):
        return value
    if isinstance(value, float):
        if value.is_integer():
            return int(value)
        return _RawNumber(format(Decimal(repr(value)), "f"))
    if isinstance(value, dict):
        return {k: canonical_numbers(v) for k, v in value.items()}
    return [canonical_numbers(v) for v in value]


class _RawNumber(float):
    def __new__(cls, text: str):
        obj = super().__new__(cls, text)
        obj.text = text
        return obj

    def __repr__(self) -> str:
        return self.text


def _dumps_raw(value: Any) -> str:
    """Compact JSON where :class:`_RawNumber` keeps its text."""
    if isinstance(value, _RawNumber):
        return value.text
    if isinstance(value, dict):
        return "{" + ",".join(serialise(k) + ":" + _dumps_raw(v) for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ",".join(_dumps_raw(v) for v in value) + "]"
    return serialise(value)


def tokenise(text: str, tokenizer: Any, vocab: Any) -> list[int] | str:
    """Gemma tokens of ``text`` without BOS, or the reason it is skipped (the benchmark harness's rule)."""
    return _harness().tokenise_text(text, tokenizer, vocab)


def run_tokens(structure: Any, tokens: list[int]) -> str:
    """``"A"``, ``"R<i>"``, ``"E"`` or ``"X<i>:<exception class>"`` for these tokens (see the module docstring)."""
    from constrain.errors import TokenError

    matcher = structure.matcher()
    for i, token in enumerate(tokens):
        try:
            matcher.advance(token)
        except TokenError:
            return f"R{i}"
        except Exception as exc:  # the matcher failed (not a rejection): a bug, kept in the record
            return f"X{i}:{type(exc).__name__}"
    return "A" if matcher.is_accepting() else "E"


def run_text(structure: Any, text: str, tokenizer: Any, vocab: Any) -> str:
    tokens = tokenise(text, tokenizer, vocab)
    return f"S:{tokens}" if isinstance(tokens, str) else run_tokens(structure, tokens)


def instance_text(schema: Any, data: Any) -> str:
    """The text an instance is tested with: canonical key order, compact."""
    return serialise(canonical_order(schema, data))


def jsonschema_verdict(schema: Any, data: Any) -> str:
    """``valid``, ``invalid: <first error>`` (formats asserted), or ``valid without formats`` when only a format
    assertion fails."""
    from jsonschema import validators

    try:
        cls = validators.validator_for(schema, default=validators.Draft202012Validator)
        error = next(iter(cls(schema, format_checker=cls.FORMAT_CHECKER).iter_errors(data)), None)
        if error is None:
            return "valid"
        if error.validator == "format" or cls(schema).is_valid(data):
            return f"valid without formats (format {error.validator_value!r})"
        where = "/" + "/".join(str(p) for p in error.absolute_path)
        return f"invalid at {where}: {error.validator}"
    except Exception as exc:
        return f"jsonschema failed: {type(exc).__name__}"


def diagnose(structure: Any, schema: Any, data: Any, tokenizer: Any, vocab: Any) -> str:
    """Why a valid instance was not accepted, as far as cheap checks tell."""
    reasons = []
    verdict = jsonschema_verdict(schema, data)
    if verdict != "valid":
        reasons.append(f"jsonschema: {verdict}")
    if run_text(structure, serialise(data), tokenizer, vocab) == "A":
        reasons.append("key order: accepted in the instance's own order")
    numbers = _dumps_raw(canonical_numbers(canonical_order(schema, data)))
    if numbers != instance_text(schema, data) and run_text(structure, numbers, tokenizer, vocab) == "A":
        reasons.append("number form: accepted with numbers written canonically")
    return "; ".join(reasons) or "unexplained"


def _near(tokens: list[int], outcome: str, vocab: Any) -> str:
    """The text around where the matcher stopped: up to 40 characters before and the rejected token."""
    if outcome[0] in "RX":
        i = int(outcome[1:].split(":")[0])
        before = vocab.decode(tokens[:i]).decode("utf-8", "replace")[-40:]
        return before + " >>" + vocab.decode(tokens[i : i + 1]).decode("utf-8", "replace") + "<<"
    return vocab.decode(tokens).decode("utf-8", "replace")[-40:] + " >>(end)<<"


def normalise_reason(message: str) -> str:
    reason = re.sub(r"'[^']*'", "'…'", message)
    reason = re.sub(r"(?<![\w/])-?\d+(\.\d+)?(?![\w/])", "N", reason)
    return reason[:120]


def error_record(exc: BaseException) -> dict[str, Any]:
    from constrain.errors import JsonSchemaError

    if isinstance(exc, JsonSchemaError):
        return {
            "class": type(exc).__name__,
            "keyword": exc.keyword,
            "pointer": exc.pointer,
            "reason": normalise_reason(exc.reason),
        }
    tb = traceback.extract_tb(exc.__traceback__)
    frame = tb[-1] if tb else None
    where = f"{Path(frame.filename).name}:{frame.name}" if frame else "?"
    return {"class": type(exc).__name__, "keyword": None, "pointer": where, "reason": normalise_reason(str(exc))}


class _Timeout(BaseException):
    pass


_FIRED = [False]


def _alarm(signum, frame):  # pragma: no cover - only on a timeout
    _FIRED[0] = True
    raise _Timeout()


def _arm(seconds: float | None):
    """Start the per-schema alarm (main thread only); returns what :func:`_disarm` needs."""
    if not seconds:
        return None
    _FIRED[0] = False
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    return old


def _disarm(old) -> None:
    if old is not None:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def compile_status(schema: Any, vocab: Any, timeout: float | None = None, **options: Any) -> tuple[Any, dict[str, Any]]:
    """Compile ``schema`` (``options`` go to ``compile_json_schema``): (structure or None, ``{"status",
    "error"?}``). A JsonSchemaError is a refusal (``"time_limit"`` when it is the compiler's own time limit), any
    other exception a crash; with ``timeout`` (seconds, main thread only) a compile that runs longer is a
    ``"timeout"`` (an alarm that lands inside native code can surface as another exception: still a timeout)."""
    from constrain.compilers.json_schema import compile_json_schema
    from constrain.errors import JsonSchemaError

    old = _arm(timeout)
    try:
        structure = compile_json_schema(schema, vocab, **options)
        return structure, {"status": "compiled"}
    except _Timeout:
        return None, {"status": "timeout"}
    except JsonSchemaError as exc:
        if _FIRED[0]:
            return None, {"status": "timeout"}
        status = "time_limit" if "time_limit=" in str(exc) else "refused"
        return None, {"status": status, "error": error_record(exc)}
    except Exception as exc:
        if _FIRED[0]:
            return None, {"status": "timeout"}
        return None, {"status": "crashed", "error": error_record(exc)}
    finally:
        _disarm(old)


def run_entry(entry: dict[str, Any], tokenizer: Any, vocab: Any, timeout: float | None = None) -> dict[str, Any]:
    """The golden record of one data-file entry (see the module docstring)."""
    record: dict[str, Any] = {"name": entry["name"], "index": entry["index"]}
    started = time.monotonic()
    structure, status = compile_status(entry["schema"], vocab, timeout)
    record.update(status)
    if structure is None:
        return record
    old = _arm(timeout and max(1.0, timeout - (time.monotonic() - started)))
    try:
        outcomes, valid_rejected, invalid_accepted, matcher_errors = [], [], [], []
        for i, test in enumerate(entry["tests"]):
            tokens = tokenise(instance_text(entry["schema"], test["data"]), tokenizer, vocab)
            if isinstance(tokens, str):
                outcomes.append(f"S:{tokens}")
                continue
            outcome = run_tokens(structure, tokens)
            outcomes.append(outcome)
            if outcome[0] == "X":
                matcher_errors.append({"test": i, "outcome": outcome, "valid": bool(test["valid"])})
            if test["valid"] and outcome != "A":
                why = diagnose(structure, entry["schema"], test["data"], tokenizer, vocab)
                near = _near(tokens, outcome, vocab)
                valid_rejected.append({"test": i, "outcome": outcome, "why": why, "near": near})
            elif not test["valid"] and outcome == "A":
                invalid_accepted.append({"test": i, "jsonschema": jsonschema_verdict(entry["schema"], test["data"])})
    except _Timeout:
        return {"name": entry["name"], "index": entry["index"], "status": "timeout"}
    finally:
        _disarm(old)
    record["tests"] = outcomes
    if valid_rejected:
        record["valid_rejected"] = valid_rejected
    if invalid_accepted:
        record["invalid_accepted"] = invalid_accepted
    if matcher_errors:
        record["matcher_errors"] = matcher_errors
    return record


# ---------------------------------------------------------------------------------------------------------------
# The whole set, in worker processes


def load_gemma() -> tuple[Any, Any]:
    from constrain.models.tokenizers import load_gemma_tokenizer
    from constrain.vocab.vocabulary import Vocabulary

    tokenizer = load_gemma_tokenizer()
    return tokenizer, Vocabulary.from_tokenizer(tokenizer)


def _worker(conn, timeout: float) -> None:  # pragma: no cover - subprocess
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    tokenizer, vocab = load_gemma()
    conn.send(("ready", None))
    while True:
        entry = conn.recv()
        if entry is None:
            return
        started = time.monotonic()
        try:
            record = run_entry(entry, tokenizer, vocab, timeout)
        except BaseException as exc:  # a crash outside the compile
            record = {"name": entry["name"], "index": entry["index"], "status": "crashed", "error": error_record(exc)}
        gc.collect()
        conn.send(("done", (record, time.monotonic() - started)))


def _rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def run_all(
    data_path: Path, *, names: list[str] | None, workers: int, timeout: float, max_rss_mb: float, progress: bool = True
) -> tuple[list[dict[str, Any]], dict[str, float]]:
    """Records for the selected entries (all by default), in data-file order, and the seconds each took."""
    import multiprocessing as mp
    from multiprocessing.connection import wait

    ctx = mp.get_context("spawn")
    entries = {e["index"]: e for e in load_entries(data_path, set(names) if names else None)}
    todo = list(entries)
    name_of = {i: e["name"] for i, e in entries.items()}
    records: dict[int, dict[str, Any]] = {}
    seconds: dict[str, float] = {}
    queue = deque(todo)
    slots: list[dict[str, Any]] = []

    def start() -> dict[str, Any]:
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=_worker, args=(child, timeout), daemon=True)
        proc.start()
        child.close()
        return {"proc": proc, "conn": parent, "task": None, "since": time.monotonic(), "ready": False}

    slots = [start() for _ in range(max(1, min(workers, len(todo))))]
    begun = time.monotonic()
    while len(records) < len(todo):
        for slot in slots:
            if slot["ready"] and slot["task"] is None and queue:
                slot["task"] = queue.popleft()
                slot["since"] = time.monotonic()
                slot["conn"].send(entries[slot["task"]])
        ready = wait([s["conn"] for s in slots], timeout=1.0)
        for slot in list(slots):
            conn = slot["conn"]
            if conn in ready:
                try:
                    kind, payload = conn.recv()
                except (EOFError, OSError):
                    kind, payload = "died", None
                if kind == "ready":
                    slot["ready"] = True
                elif kind == "done":
                    record, secs = payload
                    records[slot["task"]] = record
                    seconds[record["name"]] = round(secs, 3)
                    slot["task"] = None
                    if progress and len(records) % 100 == 0:
                        rate = len(records) / (time.monotonic() - begun)
                        print(f"  {len(records)}/{len(todo)} schemas ({rate:.1f}/s)", file=sys.stderr, flush=True)
                    continue
                else:
                    task = slot["task"]
                    if task is not None:
                        records[task] = {"name": name_of[task], "index": task, "status": "crashed",
                                         "error": {"class": "WorkerDied", "keyword": None, "pointer": "",
                                                   "reason": "the worker process died"}}  # fmt: skip
                    _replace(slots, slot, start)
                    continue
            task = slot["task"]
            if task is None:
                continue
            elapsed = time.monotonic() - slot["since"]
            status = None
            if elapsed > timeout + 30:  # the alarm did not fire (native code): kill
                status = "timeout"
            elif _rss_mb(slot["proc"].pid) > max_rss_mb:
                status = "memory"
            if status:
                records[task] = {"name": name_of[task], "index": task, "status": status}
                seconds[name_of[task]] = round(elapsed, 3)
                _replace(slots, slot, start)
    for slot in slots:
        try:
            slot["conn"].send(None)
        except OSError:
            pass
        slot["proc"].join(timeout=5)
        if slot["proc"].is_alive():
            slot["proc"].kill()
    return [records[i] for i in sorted(records)], seconds


def _replace(slots: list, slot: dict, start) -> None:
    slot["proc"].kill()
    slot["proc"].join()
    slots[slots.index(slot)] = start()


# ---------------------------------------------------------------------------------------------------------------
# Reports


def summary(records: list[dict[str, Any]]) -> dict[str, Any]:
    status = Counter(r["status"] for r in records)
    reasons = Counter(
        f"{r['error']['class']} [{r['error']['keyword']}] {r['error']['reason'][:70]}"
        for r in records
        if r["status"] in ("refused", "crashed")
    )
    keywords = Counter(
        f"{r['error']['class']} [{r['error']['keyword']}]" for r in records if r["status"] in ("refused", "crashed")
    )
    tests = Counter()
    for r in records:
        for t in r.get("tests", []):
            tests[t[0]] += 1
    vr = [v for r in records for v in r.get("valid_rejected", [])]
    why = Counter(v["why"] for v in vr)
    return {
        "schemas": len(records),
        "status": dict(sorted(status.items())),
        "refusals_by_keyword": dict(keywords.most_common()),
        "refusals_by_reason": dict(reasons.most_common()),
        "instances": dict(sorted(tests.items())),
        "valid_rejected": len(vr),
        "valid_rejected_why": dict(why.most_common()),
        "invalid_accepted": sum(len(r.get("invalid_accepted", [])) for r in records),
        "matcher_errors": sum(len(r.get("matcher_errors", [])) for r in records),
    }


def compare(golden: dict[str, dict[str, Any]], records: list[dict[str, Any]]) -> list[str]:
    """Differences of ``records`` from the golden records (by name), one line each."""
    out = []
    for r in records:
        g = golden.get(r["name"])
        if g is None:
            out.append(f"{r['name']}: not in the golden file")
            continue
        if r["status"] != g["status"] or _error_key(r) != _error_key(g):
            out.append(f"{r['name']}: {g['status']} {_error_key(g)} -> {r['status']} {_error_key(r)}")
            continue
        for i, (a, b) in enumerate(zip(g.get("tests", []), r.get("tests", []))):
            if (a == "A") != (b == "A"):
                out.append(f"{r['name']}: test {i} {a} -> {b}")
    return out


def _error_key(record: dict[str, Any]) -> tuple | None:
    e = record.get("error")
    return None if e is None else (e["class"], e["keyword"], e["pointer"])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--update", action="store_true", help=f"write {GOLDEN.relative_to(ROOT)} (with --names: replace those records)"
    )
    p.add_argument("--data", type=Path, default=DATA)
    p.add_argument("--names", help="comma-separated schema names (compared with the golden file)")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--timeout", type=float, default=120.0, help="seconds per schema (compile + its instances)")
    p.add_argument("--max-rss-mb", type=float, default=4000.0)
    p.add_argument("--timings-out", type=Path, help="write the seconds each schema took (JSON) here")
    args = p.parse_args(argv)
    if not args.data.is_file():
        print(f"MaskBench data not found at {args.data}", file=sys.stderr)
        return 2
    names = args.names.split(",") if args.names else None
    if args.update and names and not GOLDEN.is_file():
        p.error("--update with --names replaces records of an existing golden file; generate it whole first")
    started = time.monotonic()
    records, seconds = run_all(
        args.data, names=names, workers=args.workers, timeout=args.timeout, max_rss_mb=args.max_rss_mb
    )
    wall = time.monotonic() - started
    stats = summary(records)
    print(json.dumps(stats, indent=1, ensure_ascii=False))
    slow = sorted(seconds.items(), key=lambda kv: -kv[1])[:15]
    print(f"wall {wall:.0f} s; slowest: " + ", ".join(f"{n} {s:.1f}s" for n, s in slow))
    if args.timings_out:
        args.timings_out.write_text(json.dumps(seconds, indent=0, sort_keys=True))
    if GOLDEN.is_file():
        old = {r["name"]: r for r in load_golden()["schemas"]}
        diff = compare(old, records)
        print(f"{len(diff)} differences from {GOLDEN.relative_to(ROOT)}")
        for line in diff[:200]:
            print("  " + line)
    if args.update:
        with gzip.open(args.data, "rb") as f:
            digest = hashlib.sha256(f.read()).hexdigest()
        if names:
            new = {r["name"]: r for r in records}
            records = [new.get(r["name"], r) for r in load_golden()["schemas"]]
            stats = summary(records)
        write_golden(
            {
                "format": FORMAT_VERSION,
                "command": COMMAND,
                "data": args.data.name,
                "data_sha256": digest,
                "timeout_s": args.timeout,
                "summary": stats,
                "schemas": records,
            }
        )
        print(f"wrote {GOLDEN.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
