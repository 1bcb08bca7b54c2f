"""MaskBench: JSON schemas from real applications, compiled and forced token by token, in several engines.

    .venv/bin/python benchmarks/maskbench.py --sample 60 --seed 0 --engines llguidance,xgrammar,outlines --timeout 30
    .venv/bin/python benchmarks/maskbench.py --limit 20 --json-out /tmp/maskbench.json
    .venv/bin/python benchmarks/maskbench.py --sample 60 --engines constrain,llguidance --plot benchmarks/mask_time.png
    .venv/bin/python benchmarks/maskbench.py --names BFCL_java_0.json,BFCL_java_10.json

Data: ``../shared/data/maskbench-dev.jsonl.gz`` next to the repository (read in place, never copied), one schema a
line with valid and invalid instances. Tokenizer: Gemma 3 (262,144 ids, end of sequence 1 and 106).

For every schema and every engine (constrain, llguidance, xgrammar, outlines-core):

1. compile the schema and make a matcher; TTFM (time to first mask) = compile + matcher + the first mask;
2. for every test instance: serialise it compactly (``json.dumps(data, separators=(",", ":"),
   ensure_ascii=False)``), tokenise it with Gemma without BOS (the same tokens for every engine), then force the
   tokens one by one: compute the mask into a caller-owned int32 bitmask (timed: TBM), check that the token's bit
   is set, advance; after the last token check that an end-of-sequence token is allowed.
   A valid instance rejected is a validation error; an invalid instance accepted to the end is an invalidation
   error. TBM statistics are over the masks computed while forcing valid instances (the final mask, which must
   allow end of sequence, included).
3. after that timed pass, in the same worker and untimed, a second validation count: each valid instance is also
   written with its objects' keys in the declared order, the order constrain's compiler writes them (its
   documented semantics: "property order follows ``properties``"; ``canonical_order`` from
   ``benchmarks/maskbench_keyorder.py``, the helper the conformance golden test ``tests/maskbench_golden.py`` uses
   too), and where that text differs from the instance-order one it is tokenised and forced again. The valid
   instances rejected that way (the others counted as in step 2) are ``validation_errors_declared_order`` in the
   summary and the "valid rejected in declared order" column. An engine with a fixed member order rejects a valid
   instance written in another order by design; this count tells those rejections from the others. It does not
   change the headline figures (TTFM, TBM, compile errors, validation errors, passing): the worker sends the
   timed record first, and the parent then waits up to ``--timeout`` seconds more for this pass (should it run
   out, or the worker die, the record stays as it came and those instances count in their own order).

Every engine runs single-threaded in its own worker subprocess (one per engine, kept across schemas). The parent
sends one schema at a time and waits at most ``--timeout`` seconds for compile + tests; on a timeout (or when
the worker's resident memory passes ``--max-rss-mb``) it kills the worker, records the schema as a compile error
("timeout" / "memory"), and starts a fresh worker for the next schema. Native code (Rust, C++) cannot be
interrupted by signals, hence processes. A worker that dies on its own is recorded as "crashed". Every worker
runs on the same CPU (``--cpu``, :func:`measurement_cpu`): engines are timed one at a time, so they lose nothing
by it, and none of them is timed on a slower CPU or just after the scheduler moved it away from its caches.

Peak memory is the worker's ``VmHWM`` (resident-set high-water mark since its ``exec``, from
``/proc/<pid>/status``; the worker reports it after each schema, and the parent reads it just before killing a
worker). That is what ``getrusage(RUSAGE_SELF).ru_maxrss`` measures, except that on Linux ``ru_maxrss`` also
inherits the parent's RSS at ``fork``/``exec`` time, which here would count the parent's tokenizer and data. It
includes the Python runtime, the tokenizer and the engine's own set-up, so the RSS right after set-up (before
any schema) is shown beside it. Each schema's own figure: the worker resets its ``VmHWM`` to its current RSS
before the schema (writing 5 to ``/proc/self/clear_refs``), and what the compile and the timed tests raise it by
is the schema's "added" peak (the ≤ 1 GB per schema bound is read from it). Every reset comes after the previous
mark was reported, so the run-wide peak is still the largest mark the parent saw.

Engine settings (the same compact text for everyone; see the notes printed with the table):

- constrain: ``constrain.warmup(vocab)`` then ``constrain.collector.freeze()`` once at set-up, as a server starts;
  ``constrain.compilers.json_schema.compile_json_schema(schema, vocab)``; ``Matcher.fill_bitmask``. Reported as
  "not available" while that module does not exist.
- llguidance: ``LLMatcher.grammar_from_json_schema`` + ``LLMatcher(LLTokenizer, grammar)`` (default options:
  flexible whitespace, no lenient mode); a matcher per test is a ``deep_copy`` of the compiled one;
  ``unsafe_compute_mask_ptr``.
- xgrammar: ``GrammarCompiler(max_threads=1).compile_json_schema(any_whitespace=True, strict_mode=False)``
  (strict mode would forbid properties the schema does not name, which JSON Schema allows; ``--xgrammar-strict``
  turns it on), ``GrammarMatcher.fill_next_token_bitmask``. Its compiler cache is on, as by default in a server:
  it shares rule masks across schemas (e.g. the "any JSON value" of open objects, which costs seconds on a
  262k vocabulary) and returns a schema seen before at once; ``--xgrammar-cache off`` gives a cold compile for
  every schema. The number of schemas in the sample that repeat an earlier one is printed with the table.
- outlines-core: ``build_regex_from_schema`` + ``Index(regex, Vocabulary(1, {bytes: ids}))`` (the matchable
  tokens; outlines-core takes a single EOS id) + ``Guide``; ``Guide.write_mask_into``.
"""

from __future__ import annotations

import argparse
import gc
import gzip
import importlib.util
import json
import os
import platform
import random
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parent.parent
DEFAULT_DATA = REPO.parent / "shared" / "data" / "maskbench-dev.jsonl.gz"
ENGINES = ("constrain", "constrain-any-order", "llguidance", "xgrammar", "outlines")
ENGINE_ALIASES = {"outlines-core": "outlines", "outlines_core": "outlines", "llg": "llguidance", "xgr": "xgrammar"}
EOS_IDS = (1, 106)
SETUP_TIMEOUT_S = 600.0
#: Environment of the workers: every thread pool the engines or their dependencies might start, set to one.
SINGLE_THREAD_ENV = {
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "NUMBA_NUM_THREADS": "1",
    "RAYON_NUM_THREADS": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "TRANSFORMERS_VERBOSITY": "error",
    "HF_HUB_OFFLINE": "1",
}


def measurement_cpu(choice: str, shard: int = 0) -> int | None:
    """The CPU every worker of a run is pinned to (``--cpu``): ``"auto"`` the ``shard``-th of those this process
    may run on (the first, without ``--shard``; shards running side by side then take one CPU each), a number that
    CPU, ``"none"`` none (the scheduler moves each worker as it likes).

    Engines are timed one at a time, so one CPU for all of them costs nothing, and it is fair: the CPUs of a
    machine differ (the one that takes a device's interrupts is slower), and a worker the scheduler moves finds
    its code and data in the other CPU's private caches, not its own. Over 1,000 dev-set schemas, two workers of
    one build timed against each other (``benchmarks/ttfm_ab.py``) differed by 3 to 8% at the median when left
    to the scheduler, and by 0 to 2.4% on one CPU."""
    if choice == "none":
        return None
    allowed = sorted(os.sched_getaffinity(0))
    if choice == "auto":
        return allowed[shard % len(allowed)]
    try:
        cpu = int(choice)
    except ValueError:
        raise SystemExit(f"--cpu {choice!r}: 'auto', 'none' or a CPU number") from None
    if cpu not in allowed:
        raise SystemExit(f"--cpu {cpu}: this process may run on CPUs {allowed} only")
    return cpu


def pin_to_cpu(cpu: int | None) -> None:
    """Run this process (and the threads it starts from now on) on ``cpu`` alone; None leaves it as it is."""
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})


# ---------------------------------------------------------------------------------------------------------------
# Data


def _load_sibling(name: str) -> Any:
    """``benchmarks/<name>.py``, loaded by its path (``benchmarks/`` is not a package; this file is run as a
    script, and loaded by path by the tests)."""
    mod = sys.modules.get(name)
    if mod is None:
        spec = importlib.util.spec_from_file_location(name, Path(__file__).resolve().with_name(f"{name}.py"))
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        try:
            spec.loader.exec_module(mod)
        except BaseException:
            del sys.modules[name]
            raise
    return mod


#: ``canonical_order(schema, instance)``: the instance with each object's keys in the order constrain's JSON Schema
#: compiler writes them (the schema's declared order; see ``benchmarks/maskbench_keyorder.py``).
canonical_order = _load_sibling("maskbench_keyorder").canonical_order


def serialise(data: Any) -> str:
    """The one text every engine is given for an instance: compact JSON, non-ASCII characters kept as they are."""
    return json.dumps(data, separators=(",", ":"), ensure_ascii=False)


def load_entries(
    path: Path, *, limit: int | None = None, sample: int | None = None, seed: int = 0, names: list[str] | None = None
) -> list[dict[str, Any]]:
    """The schemas to run, in file order, each with its ``index`` (line number) added.

    ``names`` keeps those names; ``sample`` draws that many lines at random with ``seed`` (a fixed sample);
    ``limit`` keeps the first ``limit`` of what is left.
    """
    with gzip.open(path, "rt", encoding="utf-8") as f:
        lines = f.readlines()
    indices = list(range(len(lines)))
    if names is not None:
        wanted = set(names)
        picked = []
        for i in indices:
            # the name is the first key of each line; parse only the lines that can match
            if any(f'"{n}"' in lines[i][:400] for n in wanted):
                if json.loads(lines[i])["name"] in wanted:
                    picked.append(i)
        indices = picked
    if sample is not None:
        indices = sorted(random.Random(seed).sample(indices, min(sample, len(indices))))
    if limit is not None:
        indices = indices[:limit]
    entries = []
    for i in indices:
        entry = json.loads(lines[i])
        entry["index"] = i
        entries.append(entry)
    return entries


def tokenise_text(text: str, tokenizer: Any, vocab: Any) -> list[int] | str:
    """The Gemma tokens of ``text`` without BOS, or why it is skipped: its tokens do not spell its UTF-8 bytes
    exactly, or it has no UTF-8 form (e.g. a lone surrogate)."""
    try:
        raw = text.encode("utf-8")
    except UnicodeEncodeError:
        return "no UTF-8 form (lone surrogate)"
    tokens = [int(t) for t in tokenizer.encode(text, add_special_tokens=False)]
    if vocab.decode(tokens) != raw:
        return "the tokens do not spell the text's bytes"
    return tokens


def tokenise_tests(entry: dict[str, Any], tokenizer: Any, vocab: Any) -> list[dict[str, Any]]:
    """Each test of ``entry`` as ``{"valid", "description", "tokens"}`` (or with ``skip`` and no tokens).

    The tokens are the Gemma encoding of the compact serialisation, without BOS (:func:`tokenise_text`). A valid
    instance whose text in the declared key order (:func:`canonical_order` for ``entry["schema"]``) differs from
    its own also gets ``declared_tokens``, the tokens of that text (or ``declared_skip``, why there are none).
    """
    out = []
    for test in entry["tests"]:
        item: dict[str, Any] = {"valid": bool(test["valid"]), "description": str(test.get("description", ""))}
        text = serialise(test["data"])
        tokens = tokenise_text(text, tokenizer, vocab)
        if isinstance(tokens, str):
            item["skip"] = tokens
        else:
            item["tokens"] = tokens
            if item["valid"] and "schema" in entry:
                declared = serialise(canonical_order(entry["schema"], test["data"]))
                if declared != text:
                    tokens = tokenise_text(declared, tokenizer, vocab)
                    item["declared_skip" if isinstance(tokens, str) else "declared_tokens"] = tokens
        out.append(item)
    return out


def has_declared(tests: list[dict[str, Any]]) -> bool:
    """Whether any test has a declared-order text to force after the timed pass."""
    return any("declared_tokens" in t for t in tests)


# ---------------------------------------------------------------------------------------------------------------
# Engines (inside a worker)


class EngineUnavailable(Exception):
    """The engine cannot run here (not installed, or its compiler does not exist yet)."""


def _version(dist: str) -> str:
    import importlib.metadata

    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "?"


class Engine:
    """One engine's calls. ``compile`` returns a compiled structure, ``matcher`` a fresh matcher for it, ``fill``
    writes the allowed tokens into ``bitmask`` (int32, one row), ``advance`` reads a token and says whether that
    worked, ``error`` says why a matcher stopped (or None)."""

    name = ""
    version = ""
    #: False for an engine that needs neither the Gemma tokenizer nor the vocabulary (the harness's own tests).
    needs_tokenizer = True
    vocab_size = 262_144

    def setup(self, tokenizer: Any, vocab: Any, args: dict[str, Any]) -> None:
        raise NotImplementedError

    def compile(self, schema: Any) -> Any:
        raise NotImplementedError

    def matcher(self, compiled: Any) -> Any:
        raise NotImplementedError

    def fill(self, matcher: Any, bitmask: np.ndarray) -> None:
        raise NotImplementedError

    def advance(self, matcher: Any, token: int) -> bool:
        raise NotImplementedError

    def error(self, matcher: Any) -> str | None:
        return None


class ConstrainEngine(Engine):
    name = "constrain"

    def setup(self, tokenizer, vocab, args):
        try:
            from constrain.compilers.json_schema import compile_json_schema
        except ImportError as e:
            raise EngineUnavailable(f"constrain.compilers.json_schema is not available ({e})") from e
        from constrain import collector
        from constrain.compilers.warmup import warmup
        from constrain.errors import TokenError

        warmup(vocab)  # as a server starts: every kernel, the formats' automata, the vocabulary's shared walks
        collector.freeze()  # as `constrain serve` does: start-up's objects out of every later full collection
        self._compile = compile_json_schema
        self._token_error = TokenError
        self.vocab = vocab
        self.version = _version("constrain")

    #: ``compile_json_schema`` options this engine passes.
    options: dict[str, Any] = {}

    def compile(self, schema):
        return self._compile(schema, self.vocab, **self.options)

    def matcher(self, compiled):
        return compiled.matcher()

    def fill(self, matcher, bitmask):
        matcher.fill_bitmask(bitmask, 0)

    def advance(self, matcher, token):
        try:
            matcher.advance(token)
        except self._token_error:
            return False
        return True


class ConstrainAnyOrderEngine(ConstrainEngine):
    """constrain with ``property_order="any"``: an object's properties in any order."""

    name = "constrain-any-order"
    options = {"property_order": "any"}


class LLGuidanceEngine(Engine):
    name = "llguidance"

    def setup(self, tokenizer, vocab, args):
        try:
            import llguidance
            import llguidance.hf
        except ImportError as e:
            raise EngineUnavailable(f"llguidance is not installed ({e})") from e
        self.llg = llguidance
        self.tokenizer = llguidance.hf.from_tokenizer(tokenizer, eos_token=list(EOS_IDS))
        self.version = _version("llguidance")

    def compile(self, schema):
        grammar = self.llg.LLMatcher.grammar_from_json_schema(schema)
        matcher = self.llg.LLMatcher(self.tokenizer, grammar, log_level=0)
        if matcher.is_error():
            raise ValueError(matcher.get_error())
        return matcher

    def matcher(self, compiled):
        return compiled.deep_copy()

    def fill(self, matcher, bitmask):
        matcher.unsafe_compute_mask_ptr(bitmask.ctypes.data, bitmask.nbytes)

    def advance(self, matcher, token):
        return bool(matcher.consume_token(token))

    def error(self, matcher):
        return _first_line(matcher.get_error()) if matcher.is_error() else None


class XGrammarEngine(Engine):
    name = "xgrammar"

    def setup(self, tokenizer, vocab, args):
        try:
            import xgrammar
        except ImportError as e:
            raise EngineUnavailable(f"xgrammar is not installed ({e})") from e
        self.xgr = xgrammar
        info = xgrammar.TokenizerInfo.from_huggingface(tokenizer, stop_token_ids=list(EOS_IDS), vocab_size=vocab.size)
        cache = bool(args.get("xgrammar_cache", True))
        self.compiler = xgrammar.GrammarCompiler(info, max_threads=1, cache_enabled=cache)
        self.strict = bool(args.get("xgrammar_strict"))
        self.version = _version("xgrammar")

    def compile(self, schema):
        return self.compiler.compile_json_schema(json.dumps(schema), any_whitespace=True, strict_mode=self.strict)

    def matcher(self, compiled):
        return self.xgr.GrammarMatcher(compiled)

    def fill(self, matcher, bitmask):
        matcher.fill_next_token_bitmask(bitmask, 0)

    def advance(self, matcher, token):
        return bool(matcher.accept_token(token))


class OutlinesEngine(Engine):
    name = "outlines"

    def setup(self, tokenizer, vocab, args):
        try:
            import outlines_core
            from outlines_core.json_schema import build_regex_from_schema
        except ImportError as e:
            raise EngineUnavailable(f"outlines-core is not installed ({e})") from e
        self.oc = outlines_core
        self.build_regex = build_regex_from_schema
        by_bytes: dict[bytes, list[int]] = {}
        for token in np.flatnonzero(vocab.matchable):  # special tokens (EOS included) stay out of the map
            by_bytes.setdefault(vocab.token_bytes(int(token)), []).append(int(token))
        self.vocabulary = outlines_core.Vocabulary(EOS_IDS[0], by_bytes)
        self.version = _version("outlines-core")

    def compile(self, schema):
        regex = self.build_regex(json.dumps(schema))
        return self.oc.Index(regex, self.vocabulary)

    def matcher(self, compiled):
        return self.oc.Guide(compiled)

    def fill(self, matcher, bitmask):
        matcher.write_mask_into(bitmask.ctypes.data, bitmask.size, 4)

    def advance(self, matcher, token):
        try:
            matcher.advance(token, return_tokens=False)
        except ValueError:
            return False
        return True


class DebugEngine(Engine):
    """Not an engine: the harness's own tests use it to make a worker sleep, crash, refuse or grow (the schema says
    which, with ``x-debug``); otherwise it allows every token."""

    name = "debug"
    needs_tokenizer = False

    def setup(self, tokenizer, vocab, args):
        self.version = "0"

    def compile(self, schema):
        action = schema.get("x-debug") if isinstance(schema, dict) else None
        if action == "sleep":
            time.sleep(float(schema.get("seconds", 3600)))
        elif action == "abort":
            os.abort()
        elif action == "refuse":
            raise ValueError("refused on purpose")
        elif action == "grow":
            self._ballast = np.ones(int(schema["mb"]) << 20, dtype=np.uint8)
            time.sleep(float(schema.get("seconds", 3600)))
        return schema

    def matcher(self, compiled):
        return [compiled]

    def fill(self, matcher, bitmask):
        bitmask.fill(-1)

    def advance(self, matcher, token):
        return True


ENGINE_CLASSES: dict[str, type[Engine]] = {
    "constrain": ConstrainEngine,
    "constrain-any-order": ConstrainAnyOrderEngine,
    "llguidance": LLGuidanceEngine,
    "xgrammar": XGrammarEngine,
    "outlines": OutlinesEngine,
    "debug": DebugEngine,
}


def _first_line(text: str, limit: int = 300) -> str:
    line = str(text).strip().splitlines()[0] if str(text).strip() else ""
    return line[:limit]


def _bit(bitmask: np.ndarray, token: int) -> bool:
    return bool((int(bitmask[0, token >> 5]) >> (token & 31)) & 1)


def run_test(engine: Engine, compiled: Any, tokens: list[int], bitmask: np.ndarray, tbm: list[float] | None) -> dict:
    """Force ``tokens`` through a fresh matcher; the outcome, and each mask's seconds appended to ``tbm``."""
    matcher = engine.matcher(compiled)
    clock = time.perf_counter
    for i, token in enumerate(tokens):
        bitmask.fill(0)
        t0 = clock()
        engine.fill(matcher, bitmask)
        t1 = clock()
        if tbm is not None:
            tbm.append(t1 - t0)
        if not _bit(bitmask, token):
            return {"outcome": "rejected", "at": i, "reason": "token not in the mask", "error": engine.error(matcher)}
        if not engine.advance(matcher, token):
            return {
                "outcome": "rejected",
                "at": i,
                "reason": "in the mask, but advance failed",
                "error": engine.error(matcher),
                "inconsistent": True,
            }
    bitmask.fill(0)
    t0 = clock()
    engine.fill(matcher, bitmask)
    t1 = clock()
    if tbm is not None:
        tbm.append(t1 - t0)
    if not any(_bit(bitmask, e) for e in EOS_IDS):
        return {
            "outcome": "rejected",
            "at": len(tokens),
            "reason": "end of sequence not allowed",
            "error": engine.error(matcher),
        }
    return {"outcome": "accepted"}


def run_declared(engine: Engine, compiled: Any, tests: list[dict[str, Any]], bitmask: np.ndarray) -> dict[int, dict]:
    """The outcome of each test that has ``declared_tokens`` (a valid instance whose declared-order text differs
    from its own), forced in that order; by test index. Untimed."""
    out = {}
    for i, test in enumerate(tests):
        if "declared_tokens" not in test:
            continue
        try:
            result = run_test(engine, compiled, test["declared_tokens"], bitmask, None)
        except Exception as e:
            result = {
                "outcome": "rejected",
                "at": None,
                "reason": "exception",
                "error": f"{type(e).__name__}: {_first_line(str(e))}",
            }
        result["tokens"] = len(test["declared_tokens"])
        out[i] = result
    return out


def run_schema(
    engine: Engine, job: dict[str, Any], bitmask: np.ndarray, on_compiled=None, on_timed=None
) -> dict[str, Any]:
    """Compile one schema and run its tests. The record, plus ``tbm`` (seconds of each valid-instance mask).

    ``on_compiled(seconds)`` is called once the schema compiled (the parent then knows, should the tests run past
    the timeout, that the compile itself finished). After the timed pass, ``on_timed(record)`` is called with the
    record so far; then the tests with ``declared_tokens`` are forced again in the declared key order
    (:func:`run_declared`, untimed), each outcome going to its test's ``declared_order``, and ``declared`` is set
    to ``"ok"``."""
    clock = time.perf_counter
    rec: dict[str, Any] = {"status": "ok"}
    t0 = clock()
    try:
        compiled = engine.compile(job["schema"])
    except Exception as e:  # an engine's refusal: its own exception type and message
        rec.update(status="refused", error=f"{type(e).__name__}: {_first_line(str(e))}", compile_s=clock() - t0)
        return rec
    t1 = clock()
    matcher = engine.matcher(compiled)
    t2 = clock()
    bitmask.fill(0)
    engine.fill(matcher, bitmask)
    t3 = clock()
    rec.update(compile_s=t1 - t0, matcher_s=t2 - t1, first_mask_s=t3 - t2, ttfm_s=t3 - t0)
    if on_compiled is not None:
        on_compiled(t1 - t0)
    del matcher
    tbm: list[float] = []
    tests = []
    for test in job["tests"]:
        if "tokens" not in test:
            tests.append({"outcome": "skipped", "reason": test.get("skip", "")})
            continue
        try:
            result = run_test(engine, compiled, test["tokens"], bitmask, tbm if test["valid"] else None)
        except Exception as e:
            result = {
                "outcome": "rejected",
                "at": None,
                "reason": "exception",
                "error": f"{type(e).__name__}: {_first_line(str(e))}",
            }
        result["tokens"] = len(test["tokens"])
        tests.append(result)
    rec["tests"] = tests
    rec["tbm"] = tbm
    if on_timed is not None:
        on_timed(rec)
    for i, result in run_declared(engine, compiled, job["tests"], bitmask).items():
        tests[i]["declared_order"] = result
    rec["declared"] = "ok"
    del compiled
    return rec


WARM_UP_SCHEMA = {
    "type": "object",
    "properties": {"a": {"type": "string"}, "b": {"type": "integer"}},
    "required": ["a", "b"],
    "additionalProperties": False,
}


def warm_up(engine: Engine, tokenizer: Any) -> None:
    """One small schema compiled and forced during set-up, the same for every engine, so that one-time costs of
    a process (numba's JIT or its cache load, lazy imports) are not charged to the first schema measured."""
    tokens = [int(t) for t in tokenizer.encode(serialise({"a": "xy", "b": 12}), add_special_tokens=False)]
    bitmask = np.zeros((1, (engine.vocab_size + 31) // 32), dtype=np.int32)
    run_schema(engine, {"schema": WARM_UP_SCHEMA, "tests": [{"valid": True, "tokens": tokens}]}, bitmask)


def _proc_status(pid: int | str = "self") -> dict[str, float]:
    """VmRSS and VmHWM of a process, in MiB (empty if it is gone)."""
    out = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(("VmRSS:", "VmHWM:")):
                    key, value = line.split(":", 1)
                    out[key] = int(value.split()[0]) / 1024.0
    except OSError:
        pass
    return out


def _reset_peak() -> float | None:
    """Reset this process's resident high-water mark (VmHWM) to its current RSS, which it returns in MiB; None
    where the kernel does not allow it (``clear_refs`` needs Linux 4.0). What a schema adds to the peak is then
    the VmHWM after it less this."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return None
    return _proc_status().get("VmHWM")


def worker_main(engine_name: str, fd_in: int, fd_out: int, args: dict[str, Any]) -> None:
    """A worker: set the engine up, then answer one job (a schema) at a time until told to quit."""
    pin_to_cpu(args.get("cpu"))  # before any thread pool starts: its threads keep the CPUs they started with
    conn_in = Connection(fd_in, readable=True, writable=False)
    conn_out = Connection(fd_out, readable=False, writable=True)
    t0 = time.perf_counter()
    try:
        engine = ENGINE_CLASSES[engine_name]()
        tokenizer = vocab = None
        if engine.needs_tokenizer:
            from constrain.models.tokenizers import load_gemma_tokenizer
            from constrain.vocab.vocabulary import Vocabulary

            tokenizer = load_gemma_tokenizer()
            vocab = Vocabulary.from_tokenizer(tokenizer)
            engine.vocab_size = vocab.size
        engine.setup(tokenizer, vocab, args)
        if engine.needs_tokenizer:
            warm_up(engine, tokenizer)
        if "torch" in sys.modules:  # imported by an engine (xgrammar): its pool at one thread as well
            sys.modules["torch"].set_num_threads(1)
    except EngineUnavailable as e:
        conn_out.send({"type": "unavailable", "reason": str(e)})
        return
    except Exception as e:
        conn_out.send({"type": "unavailable", "reason": f"set-up failed: {type(e).__name__}: {e}"})
        return
    gc.collect()
    mem = _proc_status()
    conn_out.send(
        {
            "type": "ready",
            "version": engine.version,
            "setup_s": time.perf_counter() - t0,
            "rss_mb": mem.get("VmRSS"),
            "hwm_mb": mem.get("VmHWM"),
        }
    )
    bitmask = np.zeros((1, (engine.vocab_size + 31) // 32), dtype=np.int32)
    while True:
        try:
            msg = conn_in.recv()
        except EOFError:
            return
        if msg["type"] == "quit":
            mem = _proc_status()
            conn_out.send({"type": "bye", "rss_mb": mem.get("VmRSS"), "hwm_mb": mem.get("VmHWM")})
            return
        timed_sent = []
        # The parent keeps the largest VmHWM it is told of, and every reset comes after the previous schema's
        # VmHWM went to it, so its run-wide peak is unchanged by the resets.
        rss_at_start = _reset_peak()

        def memory(mem: dict[str, float]) -> dict[str, float | None]:
            added = None if rss_at_start is None or "VmHWM" not in mem else mem["VmHWM"] - rss_at_start
            return {"rss_mb": mem.get("VmRSS"), "hwm_mb": mem.get("VmHWM"), "schema_peak_mb": added}

        def send_timed(rec: dict[str, Any]) -> None:
            # the timed pass is over: its record goes now, the declared-order pass follows in a message of its own
            gc.collect()
            conn_out.send({"type": "result", "record": {**rec, **memory(_proc_status())}})
            timed_sent.append(True)

        try:
            rec = run_schema(
                engine,
                msg,
                bitmask,
                lambda sec: conn_out.send({"type": "compiled", "compile_s": sec}),
                send_timed if has_declared(msg["tests"]) else None,
            )
        except Exception as e:  # a bug here or in an engine's Python layer: report it, keep going
            rec = {"status": "error", "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}
        gc.collect()
        mem = _proc_status()
        if timed_sent:
            results = {i: t["declared_order"] for i, t in enumerate(rec.get("tests", [])) if "declared_order" in t}
            conn_out.send(
                {
                    "type": "declared",
                    "status": rec.get("declared", "error"),
                    "error": rec.get("error"),
                    "results": results,
                    "hwm_mb": mem.get("VmHWM"),
                }
            )
            continue
        rec.update(memory(mem))
        conn_out.send({"type": "result", "record": rec})


# ---------------------------------------------------------------------------------------------------------------
# The parent: one worker per engine, a timeout per schema


class Worker:
    """One engine's worker subprocess, restarted after a timeout or a crash."""

    def __init__(self, engine: str, worker_args: dict[str, Any], log_dir: Path, max_rss_mb: float):
        self.engine = engine
        self.worker_args = worker_args
        self.log_path = log_dir / f"{engine}.stderr.log"
        self.max_rss_mb = max_rss_mb
        self.proc: subprocess.Popen | None = None
        self.unavailable: str | None = None
        self.version = ""
        self.setup_s: list[float] = []
        self.base_rss_mb: list[float] = []
        self.peak_mb = 0.0
        self.starts = 0

    def start(self) -> bool:
        """Start a worker and wait for its set-up; False (and ``unavailable`` set) if the engine cannot run."""
        if self.unavailable is not None:
            return False
        parent_in, child_out = os.pipe()
        child_in, parent_out = os.pipe()
        cmd = [
            sys.executable,
            str(Path(__file__).resolve()),
            "--worker",
            self.engine,
            "--worker-fds",
            f"{child_in},{child_out}",
            "--worker-args",
            json.dumps(self.worker_args),
        ]
        env = {**os.environ, **SINGLE_THREAD_ENV}
        try:
            with open(self.log_path, "ab") as log:
                self.proc = subprocess.Popen(
                    cmd,
                    pass_fds=(child_in, child_out),
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=log,
                    env=env,
                    cwd=str(REPO),
                )
        finally:
            os.close(child_in)
            os.close(child_out)
        self.conn_in = Connection(parent_in, readable=True, writable=False)
        self.conn_out = Connection(parent_out, readable=False, writable=True)
        self.starts += 1
        msg = self._wait(SETUP_TIMEOUT_S)
        if msg is None or msg.get("type") != "ready":
            reason = msg.get("reason") if isinstance(msg, dict) else f"set-up did not finish ({self._tail()})"
            self.unavailable = reason or "set-up failed"
            self.stop(kill=True)
            return False
        self.version = msg["version"]
        self.setup_s.append(msg["setup_s"])
        if msg.get("rss_mb") is not None:
            self.base_rss_mb.append(msg["rss_mb"])
        self._note_peak(msg.get("hwm_mb"))
        return True

    def _note_peak(self, hwm: float | None) -> None:
        if hwm is not None:
            self.peak_mb = max(self.peak_mb, float(hwm))

    def _tail(self, n: int = 400) -> str:
        try:
            text = self.log_path.read_bytes()[-n:].decode("utf-8", "replace")
        except OSError:
            return ""
        return " ".join(text.split())

    def _wait(self, timeout: float) -> dict | None | str:
        """The worker's next message; "timeout", "memory", or None if it died."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return "timeout"
            try:
                if self.conn_in.poll(min(left, 0.25)):
                    return self.conn_in.recv()
            except (EOFError, OSError):
                return None
            if self.proc.poll() is not None:
                try:  # it may have answered just before it exited
                    if self.conn_in.poll(0):
                        return self.conn_in.recv()
                except (EOFError, OSError):
                    pass
                return None
            mem = _proc_status(self.proc.pid)
            self._note_peak(mem.get("VmHWM"))
            if mem.get("VmRSS", 0.0) > self.max_rss_mb:
                return "memory"

    def run(self, job: dict[str, Any], timeout: float) -> dict[str, Any]:
        if self.proc is None and not self.start():
            return {"status": "crashed", "error": f"the worker did not restart: {self.unavailable}"}
        wall0 = time.perf_counter()
        try:
            self.conn_out.send(job)
        except (BrokenPipeError, OSError):
            self.stop(kill=True)
            return {"status": "crashed", "error": "the worker was gone"}
        deadline = time.monotonic() + timeout
        compiled: dict[str, Any] = {"phase": "compile"}
        while True:
            msg = self._wait(max(deadline - time.monotonic(), 0.0))
            if isinstance(msg, dict) and msg.get("type") == "compiled":
                compiled = {"phase": "tests", "compile_s": msg["compile_s"]}
                continue
            break
        wall = time.perf_counter() - wall0
        if isinstance(msg, dict) and msg.get("type") == "result":
            rec = msg["record"]
            self._note_peak(rec.get("hwm_mb"))
            rec["wall_s"] = wall
            if rec.get("status") == "ok" and has_declared(job["tests"]):
                self._declared(rec, timeout)
            return rec
        if msg in ("timeout", "memory"):
            self._note_peak(_proc_status(self.proc.pid).get("VmHWM"))
            self.stop(kill=True)
            what = f"no answer within {timeout:g} s" if msg == "timeout" else f"RSS over {self.max_rss_mb:g} MiB"
            return {"status": msg, "error": f"{what}, during the {compiled['phase']}", **compiled, "wall_s": wall}
        code = self.stop(kill=True)
        return {
            "status": "crashed",
            "error": f"the worker died (exit {code}) during the {compiled['phase']}: {self._tail()}",
            **compiled,
            "wall_s": wall,
        }

    def _declared(self, rec: dict[str, Any], timeout: float) -> None:
        """Wait (up to ``timeout`` seconds more) for the untimed declared-order pass that follows a record with
        declared-order tests; its outcomes go to the record's tests (``declared_order``), its status to
        ``declared``: ``ok``, ``error``, or ``timeout`` / ``memory`` / ``crashed`` (the worker is then stopped,
        and the record itself is kept as it came)."""
        msg = self._wait(timeout)
        if isinstance(msg, dict) and msg.get("type") == "declared":
            self._note_peak(msg.get("hwm_mb"))
            for i, result in msg["results"].items():
                rec["tests"][int(i)]["declared_order"] = result
            rec["declared"] = msg["status"]
            if msg["status"] != "ok":
                rec["declared_error"] = msg.get("error")
            return
        if msg in ("timeout", "memory"):
            self._note_peak(_proc_status(self.proc.pid).get("VmHWM"))
            self.stop(kill=True)
            rec["declared"] = msg
            return
        code = self.stop(kill=True)
        rec["declared"] = "crashed"
        rec["declared_error"] = f"the worker died (exit {code}): {self._tail()}"

    def stop(self, kill: bool = False) -> int | None:
        """End the worker (politely unless ``kill``); its exit code."""
        proc, self.proc = self.proc, None
        if proc is None:
            return None
        if not kill and proc.poll() is None:
            try:
                self.conn_out.send({"type": "quit"})
                msg = self._wait_bye(proc)
                if isinstance(msg, dict):
                    self._note_peak(msg.get("hwm_mb"))
            except (BrokenPipeError, OSError):
                pass
        if proc.poll() is None:
            if not kill:
                try:
                    return proc.wait(10)
                except subprocess.TimeoutExpired:
                    pass
            proc.kill()
        code = proc.wait()
        for conn in (self.conn_in, self.conn_out):
            conn.close()
        return code

    def _wait_bye(self, proc: subprocess.Popen) -> dict | None:
        try:
            if self.conn_in.poll(30):
                return self.conn_in.recv()
        except (EOFError, OSError):
            pass
        return None


# ---------------------------------------------------------------------------------------------------------------
# Summary


def add_context(rec: dict[str, Any], tests: list[dict[str, Any]], vocab: Any) -> None:
    """Give each rejection the text around it: the last 40 characters read, then the refused token in brackets
    (a rejection in the declared order too, from its own tokens)."""

    def context(res: dict[str, Any], tokens: list[int] | None) -> None:
        at = res.get("at")
        if res.get("outcome") != "rejected" or at is None or tokens is None:
            return
        before = vocab.decode(tokens[:at]).decode("utf-8", "replace")[-40:]
        token = vocab.decode(tokens[at : at + 1]).decode("utf-8", "replace") if at < len(tokens) else "<eos>"
        res["context"] = f"{before}⟦{token}⟧"
        # a rejection where a property name starts: usually the engine's own property order (or a key it forbids)
        res["at_key"] = at < len(tokens) and vocab.decode(tokens[:at]).rstrip(b'"').endswith((b"{", b","))

    for test, res in zip(tests, rec.get("tests", [])):
        context(res, test.get("tokens"))
        if "declared_order" in res:
            context(res["declared_order"], test.get("declared_tokens"))


def pct(values: list[float] | np.ndarray, q: float) -> float:
    return float(np.percentile(np.asarray(values, dtype=np.float64), q)) if len(values) else float("nan")


def classify(rec: dict[str, Any], tests: list[dict[str, Any]]) -> dict[str, int]:
    """Counts of one engine's result on one schema: validation / invalidation errors, tests run.

    ``validation_errors_declared_order``: the valid instances rejected when written in the declared key order:
    the declared-order outcome of those forced again in that order (``declared_checked`` of them), the instance's
    own outcome for the others (their text is the same in both orders; or, counted in ``declared_unchecked``, the
    declared-order pass did not finish or their declared-order text could not be tokenised)."""
    c = {
        "valid_run": 0,
        "invalid_run": 0,
        "validation_errors": 0,
        "invalidation_errors": 0,
        "skipped": 0,
        "inconsistent": 0,
        "validation_errors_declared_order": 0,
        "declared_checked": 0,
        "declared_unchecked": 0,
    }
    for test, res in zip(tests, rec.get("tests", [])):
        if res["outcome"] == "skipped":
            c["skipped"] += 1
            continue
        c["inconsistent"] += bool(res.get("inconsistent"))
        if test["valid"]:
            c["valid_run"] += 1
            c["validation_errors"] += res["outcome"] != "accepted"
            declared = res.get("declared_order")
            if declared is not None:
                c["declared_checked"] += 1
                c["validation_errors_declared_order"] += declared["outcome"] != "accepted"
            else:
                c["declared_unchecked"] += "declared_tokens" in test or "declared_skip" in test
                c["validation_errors_declared_order"] += res["outcome"] != "accepted"
        else:
            c["invalid_run"] += 1
            c["invalidation_errors"] += res["outcome"] == "accepted"
    return c


COMPILE_ERRORS = ("refused", "crashed", "timeout", "memory", "error")


def summarise(
    engine: str, records: list[dict[str, Any]], tests_by_schema: list[list[dict]], tbm: list[float], worker: Worker
) -> dict[str, Any]:
    s: dict[str, Any] = {"engine": engine, "version": worker.version, "schemas": len(records)}
    status = [r["status"] for r in records]
    s["compiled"] = sum(st == "ok" for st in status)
    for st in COMPILE_ERRORS:
        s[st] = sum(x == st for x in status)
    s["compile_errors"] = sum(s[st] for st in COMPILE_ERRORS)
    totals = {
        "valid_run": 0,
        "invalid_run": 0,
        "validation_errors": 0,
        "invalidation_errors": 0,
        "skipped": 0,
        "inconsistent": 0,
    }
    declared = {"validation_errors_declared_order": 0, "declared_checked": 0, "declared_unchecked": 0}
    passing = schemas_val = schemas_inval = schemas_val_declared = 0
    for rec, tests in zip(records, tests_by_schema):
        if rec["status"] != "ok":
            continue
        c = classify(rec, tests)
        for k in totals:
            totals[k] += c[k]
        for k in declared:
            declared[k] += c[k]
        schemas_val += c["validation_errors"] > 0
        schemas_inval += c["invalidation_errors"] > 0
        schemas_val_declared += c["validation_errors_declared_order"] > 0
        passing += c["validation_errors"] == 0 and c["invalidation_errors"] == 0
    s.update(totals)
    s["passing"] = passing
    s["schemas_with_validation_errors"] = schemas_val
    s["schemas_with_invalidation_errors"] = schemas_inval
    # the second count, in the declared key order (None when a compiled schema's record has no ``declared``: records
    # written before the count existed, e.g. a --merge with older shards)
    if all("declared" in r for r in records if r["status"] == "ok"):
        s.update(declared)
        s["schemas_with_validation_errors_declared_order"] = schemas_val_declared
        s["declared_incomplete"] = sum(r.get("declared", "ok") != "ok" for r in records if r["status"] == "ok")
    else:
        s.update(
            {k: None for k in declared}, schemas_with_validation_errors_declared_order=None, declared_incomplete=None
        )
    ttfm = [r["ttfm_s"] for r in records if r["status"] == "ok"]
    comp = [r["compile_s"] for r in records if r["status"] == "ok"]
    s["ttfm_ms"] = {q: 1e3 * pct(ttfm, q) for q in (50, 90, 99)}
    s["compile_ms"] = {q: 1e3 * pct(comp, q) for q in (50, 90, 99)}
    s["tbm_us"] = {q: 1e6 * pct(tbm, q) for q in (50, 95, 99)}
    s["tbm_us"]["max"] = 1e6 * max(tbm) if tbm else float("nan")
    s["masks"] = len(tbm)
    s["peak_rss_mb"] = worker.peak_mb
    # what one schema (its compile and its timed tests) added to the worker's resident peak
    added = [r["schema_peak_mb"] for r in records if r.get("schema_peak_mb") is not None]
    s["schema_peak_mb"] = {q: pct(added, q) for q in (50, 99)}
    s["schema_peak_mb"]["max"] = max(added) if added else float("nan")
    s["schemas_over_1gib"] = sum(a > 1024 for a in added) if added else None
    s["base_rss_mb"] = max(worker.base_rss_mb) if worker.base_rss_mb else float("nan")
    s["setup_s"] = float(np.median(worker.setup_s)) if worker.setup_s else float("nan")
    s["worker_starts"] = worker.starts
    return s


def fmt(x: float, digits: int = 1) -> str:
    if x != x:  # nan
        return "–"
    if abs(x) >= 100:
        return f"{x:,.0f}"
    return f"{x:.{digits}f}"


def machine_info(versions: dict[str, str]) -> list[str]:
    import importlib.metadata

    lines = [
        f"- machine: {platform.platform()}, {platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} CPUs, Python {platform.python_version()} ({os.path.realpath(sys.executable)})"
    ]
    deps = []
    for dist in ("numpy", "numba", "transformers", "tokenizers", "torch"):
        try:
            deps.append(f"{dist} {importlib.metadata.version(dist)}")
        except importlib.metadata.PackageNotFoundError:
            pass
    lines.append("- engines: " + ", ".join(f"{k} {v}" for k, v in versions.items()) + "; " + ", ".join(deps))
    try:
        with open("/proc/cpuinfo") as f:
            model = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), "")
        if model:
            lines[0] = lines[0].replace(f"{os.cpu_count()} CPUs", f"{os.cpu_count()} × {model}")
    except OSError:
        pass
    return lines


def _loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


def _declared_cell(s: dict[str, Any]) -> str:
    """The validation errors in the declared key order ("–" for records written before that count existed)."""
    if s.get("validation_errors_declared_order") is None:
        return "–"
    return f"{s['validation_errors_declared_order']} / {s['valid_run']}"


def _schema_peak_cell(s: dict[str, Any]) -> str:
    """What one schema added to the resident peak, and how many added over 1 GiB ("–" where not measured)."""
    m = s.get("schema_peak_mb")
    if not m or m["max"] != m["max"]:
        return "–"
    return f"{fmt(m[50])} / {fmt(m[99])} / {fmt(m['max'], 0)} ({s['schemas_over_1gib']} over 1 GiB)"


def markdown(
    summaries: list[dict[str, Any]],
    unavailable: dict[str, str],
    common: dict[str, Any] | None,
    header: list[str],
    notes: list[str],
) -> str:
    out = list(header) + [""]
    out.append(
        "| engine | schemas | compiled | compile errors (refused / crashed / timeout / memory) | passing "
        "| schemas with validation / invalidation errors | valid rejected / run "
        "| valid rejected in declared order / run | invalid accepted / run "
        "| TTFM p50 / p90 / p99 (ms) | TBM p50 / p95 / p99 / max (µs) | masks "
        "| RSS after set-up / peak (MiB) | added per schema p50 / p99 / max (MiB) |"
    )
    out.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for s in summaries:
        n = max(s["schemas"], 1)
        crashed = s["crashed"] + s["error"]
        errs = f"{s['compile_errors']} ({s['refused']} / {crashed} / {s['timeout']} / {s['memory']})"
        t, b = s["ttfm_ms"], s["tbm_us"]
        out.append(
            f"| {s['engine']} {s['version']} | {s['schemas']} | {s['compiled']} ({100 * s['compiled'] / n:.0f}%) "
            f"| {errs} | {s['passing']} ({100 * s['passing'] / n:.0f}%) "
            f"| {s['schemas_with_validation_errors']} / {s['schemas_with_invalidation_errors']} "
            f"| {s['validation_errors']} / {s['valid_run']} | {_declared_cell(s)} "
            f"| {s['invalidation_errors']} / {s['invalid_run']} "
            f"| {fmt(t[50])} / {fmt(t[90])} / {fmt(t[99])} "
            f"| {fmt(b[50])} / {fmt(b[95])} / {fmt(b[99])} / {fmt(b['max'])} | {s['masks']:,} "
            f"| {fmt(s['base_rss_mb'], 0)} / {fmt(s['peak_rss_mb'], 0)} | {_schema_peak_cell(s)} |"
        )
    for engine, reason in unavailable.items():
        out.append(f"| {engine} | – | not available: {reason} | | | | | | | | | | | |")
    if common and common["schemas"]:
        out += [
            "",
            f"On the {common['schemas']} schemas every engine above compiled (same schemas for all):",
            "",
            "| engine | passing | TTFM p50 / p90 / p99 (ms) | TBM p50 / p99 (µs) |",
            "|---|---:|---:|---:|",
        ]
        for row in common["rows"]:
            t, b = row["ttfm_ms"], row["tbm_us"]
            out.append(
                f"| {row['engine']} | {row['passing']} | {fmt(t[50])} / {fmt(t[90])} / {fmt(t[99])} "
                f"| {fmt(b[50])} / {fmt(b[99])} |"
            )
    out += [""] + notes
    return "\n".join(out)


NOTES = [
    '- Every engine is given the same text for an instance: `json.dumps(data, separators=(",", ":"), '
    "ensure_ascii=False)`, tokenised by Gemma 3 without BOS. Engines that impose their own canonical form (the "
    "schema's property order, a fixed whitespace, a number format) can reject a valid instance written in another "
    "order or form; that counts as a validation error here, for every engine alike.",
    "- TTFM = compile + a fresh matcher + its first mask (compiled schemas only). TBM = each mask computed while a "
    "valid instance's tokens are forced, the final one (which must allow end of sequence) included; each engine "
    "writes into a caller-owned int32 bitmask of 8,192 words. Single-threaded, one worker process per engine, "
    "{cpu}, schemas interleaved across engines so load changes hit all of them alike.",
    "- Passing = compiled, and no validation or invalidation error on any of its tests. Compile errors: refused "
    "(the engine raised), crashed (the worker died, or the harness hit an unexpected exception), timeout (no "
    "answer for compile + tests within the limit: the worker is killed), memory (the worker's RSS passed the limit).",
    "- Memory: the largest VmHWM from /proc (resident high-water mark; since exec it is "
    "`getrusage(RUSAGE_SELF).ru_maxrss` without the RSS inherited at fork) reported by any of that engine's worker "
    "processes; it includes Python, the Gemma tokenizer (every worker loads it) and the engine's set-up, so the RSS "
    "right after set-up is shown first. Per schema: the worker resets its VmHWM (`/proc/self/clear_refs`) before "
    "each schema, and what the schema's compile and timed tests add to it above the RSS at that moment is the "
    "'added per schema' figure (the bound a server needs per compile on top of what it already holds).",
    "- Each worker compiles and forces one small warm-up schema (an object of a string and an integer) during "
    "set-up, so that one-time costs of a process (numba's JIT, lazy imports) are not charged to the first schema.",
    "- xgrammar runs with `any_whitespace=True`, `strict_mode={strict}`, `max_threads=1` and its compiler cache "
    "{cache} (when on, it shares rule masks across schemas and returns a repeated schema at once); llguidance with "
    "its default JSON options (it refuses what it cannot enforce, e.g. `oneOf` without `coerce_one_of`, unknown "
    "formats); outlines-core with its default whitespace pattern and recursion depth; constrain with its defaults "
    "(compact whitespace: the language is exactly the compact text, where the others also allow whitespace), "
    'constrain-any-order with `property_order="any"` besides (an object\'s properties in any order).',
]


def label_disagreements(
    entries: list[dict], tests_by_schema: list[list[dict]], records: dict[str, list[dict]]
) -> list[dict[str, Any]]:
    """Tests where every engine that ran them (at least two) disagrees with the data's label."""
    out = []
    engines = list(records)
    for si, (entry, tests) in enumerate(zip(entries, tests_by_schema)):
        for ti, test in enumerate(tests):
            verdicts = {}
            for e in engines:
                rec = records[e][si]
                if rec["status"] != "ok":
                    continue
                res = rec["tests"][ti]
                if res["outcome"] == "skipped":
                    continue
                verdicts[e] = res["outcome"] == "accepted"
            if len(verdicts) >= 2 and all(v != test["valid"] for v in verdicts.values()):
                out.append(
                    {
                        "schema": entry["name"],
                        "test": ti,
                        "description": test["description"],
                        "label_valid": test["valid"],
                        "engines": sorted(verdicts),
                    }
                )
    return out


def declared_note(summaries: list[dict[str, Any]], tests_by_schema: list[list[dict]]) -> str:
    """The note on the second validation count, in the declared key order, with its figures."""
    differ = sum("declared_tokens" in t or "declared_skip" in t for tests in tests_by_schema for t in tests)
    valid = sum(t["valid"] and "skip" not in t for tests in tests_by_schema for t in tests)
    untokenised = sum("declared_skip" in t for tests in tests_by_schema for t in tests)
    old = any(s["validation_errors_declared_order"] is None for s in summaries)
    which = (
        "only the instances that read differently that way"
        if old
        else f"{differ} of the {valid} valid instances (not skipped) read differently that way, and only those"
    )
    note = (
        "- Valid rejected in declared order: a second count, not a headline. The valid instances are written "
        "again with each object's keys in the order constrain's compiler writes them (its documented semantics: "
        "the schema's `properties` order, then names only `required`, then the rest in the instance's order; "
        "`canonical_order` in benchmarks/maskbench_keyorder.py, shared with the conformance golden test); "
        f"{which} are forced again (in the same worker, after the timed pass, untimed: TTFM, TBM and the "
        "figures before it are those of the instance's own order); the others count as in the headline. An "
        "engine that imposes the declared order rejects a valid instance written in another order by design; "
        "this count shows what it rejects besides."
    )
    if untokenised:
        note += (
            f" {untokenised} declared-order text(s) did not round-trip through the tokenizer: "
            "counted as in the instance's own order."
        )
    by_engine = [f"{s['engine']} {s['declared_incomplete']} schema(s)" for s in summaries if s["declared_incomplete"]]
    if by_engine:
        note += (
            " The declared-order pass did not finish (timeout, memory, crash or error; those instances count "
            "as in their own order) for: " + ", ".join(by_engine) + "."
        )
    if old:
        note += " –: records written before this count existed (e.g. older shards in a --merge)."
    return note


def unavailable_any(workers: dict[str, Worker]) -> bool:
    return any(w.unavailable is not None for w in workers.values())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--data", type=Path, default=DEFAULT_DATA, help=f"the MaskBench file (default {DEFAULT_DATA})")
    p.add_argument("--limit", type=int, help="the first N schemas (after --sample / --names)")
    p.add_argument("--sample", type=int, help="a fixed random sample of N schemas (see --seed)")
    p.add_argument("--seed", type=int, default=0, help="seed of --sample (default 0)")
    p.add_argument("--names", help="comma-separated schema names to run")
    p.add_argument(
        "--shard",
        help="K/N: every N-th of the selected schemas, starting at the K-th (0-based), so N "
        "processes can share a run; merge their --json-out files with --merge",
    )
    p.add_argument("--merge", nargs="+", type=Path, help="print the table of these --json-out files together")
    p.add_argument("--engines", default=",".join(ENGINES), help=f"comma-separated, from {','.join(ENGINES)}")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds per schema and engine, compile + tests")
    p.add_argument("--max-rss-mb", type=float, default=8192.0, help="kill a worker whose RSS passes this (MiB)")
    p.add_argument("--xgrammar-strict", action="store_true", help="xgrammar's strict_mode=True")
    p.add_argument(
        "--xgrammar-cache",
        choices=("on", "off"),
        default="on",
        help="xgrammar's compiler cache, shared across schemas (default on, as in a server)",
    )
    p.add_argument("--json-out", type=Path, help="write per-schema records and the summary here")
    p.add_argument(
        "--plot",
        type=Path,
        help="write a PNG of each engine's distribution of time per mask here "
        "(benchmarks/plots.py; needs matplotlib, in the bench extra)",
    )
    p.add_argument(
        "--cpu",
        default="auto",
        help="the CPU every worker runs on: 'auto' (default) the first this process may use (the K-th with "
        "--shard K/N), a CPU number, or 'none' to leave the workers to the scheduler",
    )
    p.add_argument("--quiet", action="store_true", help="no progress line per schema")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--worker-fds", help=argparse.SUPPRESS)
    p.add_argument("--worker-args", default="{}", help=argparse.SUPPRESS)
    args = p.parse_args(argv)

    if args.worker:
        fd_in, fd_out = (int(x) for x in args.worker_fds.split(","))
        worker_main(args.worker, fd_in, fd_out, json.loads(args.worker_args))
        return 0

    engines = []
    for name in args.engines.split(","):
        name = ENGINE_ALIASES.get(name.strip(), name.strip())
        if name not in ENGINES:
            p.error(f"unknown engine {name!r}; choose from {', '.join(ENGINES)}")
        if name not in engines:
            engines.append(name)
    given = sys.argv[1:] if argv is None else argv
    command = "python benchmarks/maskbench.py " + " ".join(shlex.quote(a) for a in given)
    started = time.strftime("%Y-%m-%d %H:%M")
    load_at_start = _loadavg()
    t_start = time.perf_counter()

    if args.merge:
        return merge(args, args.merge)
    names = [n.strip() for n in args.names.split(",")] if args.names else None
    entries = load_entries(args.data, limit=args.limit, sample=args.sample, seed=args.seed, names=names)
    shard = 0
    if args.shard:
        k, n = (int(x) for x in args.shard.split("/"))
        if not 0 <= k < n:
            p.error("--shard K/N needs 0 <= K < N")
        entries = entries[k::n]
        shard = k
    cpu = measurement_cpu(args.cpu, shard)
    args.cpu = "none" if cpu is None else str(cpu)  # what the run's record says
    if not entries:
        p.error("no schema selected")

    from constrain.models.tokenizers import load_gemma_tokenizer
    from constrain.vocab.vocabulary import Vocabulary

    tokenizer = load_gemma_tokenizer()
    vocab = Vocabulary.from_tokenizer(tokenizer)
    tests_by_schema = [tokenise_tests(e, tokenizer, vocab) for e in entries]
    del tokenizer
    gc.collect()

    log_dir = Path(tempfile.mkdtemp(prefix="maskbench-"))
    worker_args = {"xgrammar_strict": args.xgrammar_strict, "xgrammar_cache": args.xgrammar_cache == "on", "cpu": cpu}
    workers = {e: Worker(e, worker_args, log_dir, args.max_rss_mb) for e in engines}
    for w in workers.values():
        if not w.start() and not args.quiet:
            print(f"{w.engine}: not available: {w.unavailable}", file=sys.stderr)
    live = [e for e in engines if workers[e].unavailable is None]
    records: dict[str, list[dict]] = {e: [] for e in live}
    tbm: dict[str, list[float]] = {e: [] for e in live}
    tbm_by_schema: dict[str, list[list[float]]] = {e: [] for e in live}

    try:
        for k, (entry, tests) in enumerate(zip(entries, tests_by_schema)):
            job = {"type": "job", "schema": entry["schema"], "tests": tests}
            line = []
            for e in live:
                rec = workers[e].run(job, args.timeout)
                add_context(rec, tests, vocab)
                times = rec.pop("tbm", [])
                tbm[e].extend(times)
                tbm_by_schema[e].append(times)
                if times:
                    rec["tbm_p50_us"] = 1e6 * pct(times, 50)
                    rec["tbm_max_us"] = 1e6 * max(times)
                    rec["tbm_us"] = [round(1e6 * t, 2) for t in times]
                records[e].append(rec)
                if rec["status"] == "ok":
                    c = classify(rec, tests)
                    bad = c["validation_errors"] + c["invalidation_errors"]
                    declared = c["validation_errors_declared_order"] + c["invalidation_errors"]
                    line.append(
                        f"{e} {1e3 * rec['ttfm_s']:.0f}ms"
                        + (f" {bad} wrong" if bad else "")
                        + (f" ({declared} in declared order)" if declared != bad else "")
                    )
                else:
                    line.append(f"{e} {rec['status']}")
            if not args.quiet:
                print(f"[{k + 1}/{len(entries)}] {entry['name']}: " + " | ".join(line), file=sys.stderr, flush=True)
    finally:
        for w in workers.values():
            w.stop()
    if any(r["status"] in ("crashed", "error") for recs in records.values() for r in recs) or unavailable_any(workers):
        print(f"worker logs (stdout and stderr): {log_dir}", file=sys.stderr)
    else:
        shutil.rmtree(log_dir, ignore_errors=True)

    elapsed = time.perf_counter() - t_start
    unavailable = {e: workers[e].unavailable for e in engines if workers[e].unavailable is not None}
    report(
        args,
        command,
        started,
        elapsed,
        load_at_start,
        entries,
        tests_by_schema,
        records,
        tbm_by_schema,
        {e: workers[e] for e in live},
        unavailable,
    )
    return 0


def merge(args: argparse.Namespace, files: list[Path]) -> int:
    """One table for the --json-out files of the shards of a run (--shard)."""
    runs = [json.loads(f.read_text()) for f in files]
    wanted = {s["index"] for run in runs for s in run["schemas"]}
    by_index = {}
    with gzip.open(args.data, "rt", encoding="utf-8") as f:
        for i, line in enumerate(f):
            if i in wanted:
                by_index[i] = json.loads(line)
    live = [e for e in runs[0]["engines"] if all(e in run["engines"] for run in runs)]
    entries, tests_by_schema = [], []
    records: dict[str, list[dict]] = {e: [] for e in live}
    tbm_by_schema: dict[str, list[list[float]]] = {e: [] for e in live}
    for run in runs:
        for sch in run["schemas"]:
            entries.append({"index": sch["index"], "name": sch["name"], "schema": by_index[sch["index"]]["schema"]})
            tests_by_schema.append(sch["tests"])
            for e in live:
                rec = sch["engines"][e]
                records[e].append(rec)
                tbm_by_schema[e].append([t / 1e6 for t in rec.get("tbm_us", [])])
    workers = {}
    for e in live:
        parts = [next(s for s in run["summary"] if s["engine"] == e) for run in runs]
        workers[e] = argparse.Namespace(
            version=runs[0]["engines"][e],
            peak_mb=max(p["peak_rss_mb"] for p in parts),
            base_rss_mb=[p["base_rss_mb"] for p in parts],
            setup_s=[p["setup_s"] for p in parts],
            starts=sum(p["worker_starts"] for p in parts),
        )
    for option in ("timeout", "max_rss_mb", "xgrammar_strict", "xgrammar_cache"):
        setattr(args, option, runs[0]["args"].get(option, getattr(args, option)))
    args.cpu = ", ".join(sorted({str(run["args"].get("cpu", "none")) for run in runs}))
    command = " ; ".join(run["command"] for run in runs)
    elapsed = max(run["wall_s"] for run in runs)
    load = f"{len(runs)} shards in parallel"
    report(
        args,
        command,
        runs[0]["started"],
        elapsed,
        load,
        entries,
        tests_by_schema,
        records,
        tbm_by_schema,
        workers,
        runs[0]["unavailable"],
    )
    return 0


def _count(tokens: list[int] | int) -> int:
    """A token count (the JSON records keep counts, not the tokens)."""
    return tokens if isinstance(tokens, int) else len(tokens)


def report(
    args,
    command,
    started,
    elapsed,
    load_at_start,
    entries,
    tests_by_schema,
    records,
    tbm_by_schema,
    workers,
    unavailable,
) -> None:
    """Print the table (and write --json-out) for the records of a run."""
    live = list(workers)
    tbm = {e: [t for times in tbm_by_schema[e] for t in times] for e in live}
    summaries = [summarise(e, records[e], tests_by_schema, tbm[e], workers[e]) for e in live]

    common = None
    if len(live) > 1:
        idx = [i for i in range(len(entries)) if all(records[e][i]["status"] == "ok" for e in live)]
        rows = []
        for e in live:
            ttfm = [records[e][i]["ttfm_s"] for i in idx]
            times = [t for i in idx for t in tbm_by_schema[e][i]]
            passing = 0
            for i in idx:
                c = classify(records[e][i], tests_by_schema[i])
                passing += c["validation_errors"] == 0 and c["invalidation_errors"] == 0
            rows.append(
                {
                    "engine": e,
                    "passing": passing,
                    "ttfm_ms": {q: 1e3 * pct(ttfm, q) for q in (50, 90, 99)},
                    "tbm_us": {q: 1e6 * pct(times, q) for q in (50, 99)},
                }
            )
        common = {"schemas": len(idx), "rows": rows}

    versions = {e: workers[e].version for e in live}
    header = [
        f"MaskBench ({args.data.name}): {len(entries)} schemas, "
        f"{sum(len(t) for t in tests_by_schema)} tests "
        f"({sum(x['valid'] for t in tests_by_schema for x in t)} valid), Gemma 3 tokenizer, {started}; "
        f"wall time {elapsed:.0f} s",
        "",
        f"`{command}`",
        "",
        *machine_info(versions),
        f"- timeout {args.timeout:g} s per schema and engine (compile + tests), RSS limit {args.max_rss_mb:g} MiB; "
        f"load average at start {load_at_start}, at end {_loadavg()}",
    ]
    skipped = sum("skip" in x for t in tests_by_schema for x in t)
    if args.cpu == "none":
        placement = "each left to the scheduler"
    elif "," in args.cpu:  # merged shards
        placement = f"the workers of each shard on one CPU ({args.cpu})"
    else:
        placement = f"all on CPU {args.cpu}"
    notes = [
        n.replace("{strict}", str(args.xgrammar_strict))
        .replace("{cache}", args.xgrammar_cache)
        .replace("{cpu}", placement)
        for n in NOTES
    ]
    seen: set[str] = set()
    repeats = 0
    for entry in entries:
        key = json.dumps(entry["schema"], sort_keys=True)
        repeats += key in seen
        seen.add(key)
    if repeats:
        notes.append(
            f"- {repeats} schema(s) of the sample repeat an earlier one exactly (an engine's compile cache "
            "can answer them at once)."
        )
    if skipped:
        notes.append(
            f"- {skipped} test(s) skipped for every engine: their compact text has no UTF-8 form or does "
            "not round-trip through the tokenizer."
        )
    disagreements = label_disagreements(entries, tests_by_schema, records) if len(live) > 1 else []
    if disagreements:
        notes.append(
            f"- {len(disagreements)} test(s) where every engine that ran them (at least two) disagrees "
            "with the data's label (before doubting the label, see each rejection's `context` and `at_key` "
            "in the JSON records: often it is a property order the engines impose): "
            + "; ".join(
                f"{d['schema']} #{d['test']} (labelled {'valid' if d['label_valid'] else 'invalid'})"
                for d in disagreements[:10]
            )
            + (" ..." if len(disagreements) > 10 else "")
        )
    for e in live:
        at_key = sum(
            bool(res.get("at_key"))
            for rec, tests in zip(records[e], tests_by_schema)
            if rec["status"] == "ok"
            for t, res in zip(tests, rec["tests"])
            if t["valid"] and res["outcome"] == "rejected"
        )
        if at_key:
            notes.append(
                f"- {e}: {at_key} of its validation errors happen where a property name starts (its "
                "property order, or a key it does not allow there)."
            )
    notes.append(declared_note(summaries, tests_by_schema))
    for s in summaries:
        if s["inconsistent"]:
            notes.append(f"- {s['engine']}: {s['inconsistent']} token(s) allowed by the mask but refused by advance.")
        if s["worker_starts"] > 1:
            notes.append(
                f"- {s['engine']}: its worker was started {s['worker_starts']} times (after timeouts / "
                f"crashes); set-up took {s['setup_s']:.1f} s (median), outside every figure."
            )
    table = markdown(summaries, unavailable, common, header, notes)
    print(table)

    if args.json_out or args.plot:
        out = {
            "command": command,
            "started": started,
            "wall_s": elapsed,
            "data": str(args.data),
            "args": {
                k: (str(v) if isinstance(v, Path) else [str(x) for x in v] if k == "merge" and v else v)
                for k, v in vars(args).items()
                if not k.startswith("worker")
            },
            "engines": versions,
            "unavailable": unavailable,
            "summary": summaries,
            "common": common,
            "label_disagreements": disagreements,
            "schemas": [
                {
                    "index": entry["index"],
                    "name": entry["name"],
                    "tests": [
                        {
                            "valid": t["valid"],
                            "description": t["description"],
                            "tokens": _count(t.get("tokens", [])),
                            **({"skip": t["skip"]} if "skip" in t else {}),
                            **({"declared_tokens": _count(t["declared_tokens"])} if "declared_tokens" in t else {}),
                            **({"declared_skip": t["declared_skip"]} if "declared_skip" in t else {}),
                        }
                        for t in tests
                    ],
                    "engines": {e: records[e][k] for e in live},
                }
                for k, (entry, tests) in enumerate(zip(entries, tests_by_schema))
            ],
        }
    if args.json_out:
        args.json_out.parent.mkdir(parents=True, exist_ok=True)
        args.json_out.write_text(json.dumps(out, indent=1, ensure_ascii=False, default=float))
        print(f"\nper-schema records: {args.json_out}", file=sys.stderr)
    if args.plot:
        print(f"mask-time plot: {_load_sibling('plots').plot_mask_times(out, args.plot)}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
