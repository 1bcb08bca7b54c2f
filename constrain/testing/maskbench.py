"""A MaskBench harness for constrain alone, in-process: ``constrain bench FILE`` runs it.

MaskBench files hold one JSON Schema a line (``.jsonl`` or ``.jsonl.gz``): ``{"name", "schema", "tests": [{"data",
"valid", "description"}]}``. For each schema, as ``benchmarks/maskbench.py`` measures every engine:

1. compile it (:func:`~constrain.compilers.json_schema.compile_json_schema`, default options), make a matcher and
   compute its first mask: TTFM, time to first mask;
2. write each test instance as compact JSON (non-ASCII characters kept), tokenise it without special tokens (a test
   whose tokens do not spell its bytes is skipped), and force the tokens one by one: compute the mask (timed: TBM,
   for the valid instances, the final mask included), check that the token is allowed, advance; after the last
   token an end-of-sequence token must be allowed. A valid instance rejected, or an invalid one accepted, fails
   the schema; a schema passes when it compiles and none fails.

Call :func:`~constrain.compilers.warmup.warmup` first, as the benchmark warms each engine up: otherwise the
first schemas pay for loading numba's kernels. The benchmark runs each engine in a worker process with a timeout
and a memory bound; this harness runs in the caller's process (a schema's compile is bounded by the compiler's
``time_limit``), so its figures are comparable with the benchmark's constrain row, not a replacement for the
cross-engine run. ``--sample N --seed S`` draws the same schemas as the benchmark's.
"""

from __future__ import annotations

import gzip
import json
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from constrain.compilers.json_schema import compile_json_schema
from constrain.errors import ConstrainError, TokenError
from constrain.kernels.bitmask import allocate_token_bitmask
from constrain.runtime.matcher import CompiledStructure, Matcher
from constrain.vocab.vocabulary import Vocabulary

#: Text -> token ids without special tokens (no BOS).
Encode = Callable[[str], list[int]]


@dataclass
class SchemaResult:
    """One schema's outcome. ``error`` is the compiler's refusal (None when it compiled)."""

    name: str
    error: str | None = None
    compile_s: float = 0.0
    ttfm_s: float = 0.0
    valid: int = 0
    invalid: int = 0
    skipped: int = 0
    #: Valid instances rejected, each as (test index, where: the text read before the refused token).
    valid_rejected: list[tuple[int, str]] = field(default_factory=list)
    #: Invalid instances accepted (test indices).
    invalid_accepted: list[int] = field(default_factory=list)
    #: Seconds of each mask computed while forcing the valid instances.
    tbm_s: list[float] = field(default_factory=list)

    @property
    def compiled(self) -> bool:
        return self.error is None

    @property
    def passing(self) -> bool:
        return self.compiled and not self.valid_rejected and not self.invalid_accepted


@dataclass(frozen=True)
class Summary:
    """What a run measured: schemas passing, TTFM and TBM percentiles (seconds; NaN when there is none)."""

    schemas: int
    compiled: int
    passing: int
    schemas_valid_rejected: int
    schemas_invalid_accepted: int
    masks: int
    ttfm_p50: float
    ttfm_p90: float
    ttfm_p99: float
    tbm_p50: float
    tbm_p99: float

    def __str__(self) -> str:
        share = 100.0 * self.passing / self.schemas if self.schemas else float("nan")
        return "\n".join(
            [
                f"passing  {self.passing} / {self.schemas} schemas ({share:.1f}%): {self.compiled} compiled, "
                f"{self.schemas_valid_rejected} with a valid instance rejected, "
                f"{self.schemas_invalid_accepted} with an invalid instance accepted",
                f"TTFM     p50 {_ms(self.ttfm_p50)}   p90 {_ms(self.ttfm_p90)}   p99 {_ms(self.ttfm_p99)}",
                f"TBM      p50 {_us(self.tbm_p50)}   p99 {_us(self.tbm_p99)}   ({self.masks:,} masks)",
            ]
        )


def load_records(
    path: str | Path, *, limit: int | None = None, sample: int | None = None, seed: int = 0
) -> list[dict[str, Any]]:
    """The records of a MaskBench file (``.jsonl``, or ``.jsonl.gz``), in file order. ``sample`` draws that many
    lines at random with ``seed`` (the benchmark's draw), then ``limit`` keeps the first ``limit``. ValueError for
    a line that is not a MaskBench record."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        lines = [line for line in f if line.strip()]
    indices = list(range(len(lines)))
    if sample is not None:
        indices = sorted(random.Random(seed).sample(indices, min(sample, len(indices))))
    if limit is not None:
        indices = indices[:limit]
    records = []
    for i in indices:
        try:
            record = json.loads(lines[i])
        except ValueError as exc:
            raise ValueError(f"{path}: record {i + 1} is not JSON ({exc})") from None
        if not isinstance(record, dict) or "schema" not in record or not isinstance(record.get("tests"), list):
            raise ValueError(f"{path}: record {i + 1} is not a MaskBench record (a schema and a list of tests)")
        records.append(record)
    return records


def serialise(data: Any) -> str:
    """The text of an instance: compact JSON, non-ASCII characters as they are (the benchmark's)."""
    return json.dumps(data, separators=(",", ":"), ensure_ascii=False)


def run_schema(record: dict[str, Any], vocab: Vocabulary, encode: Encode) -> SchemaResult:
    """Compile ``record``'s schema for ``vocab`` and force its tests (the module docstring says how)."""
    result = SchemaResult(str(record.get("name", "")))
    clock = time.perf_counter
    begun = clock()
    try:
        structure = compile_json_schema(record["schema"], vocab)
    except ConstrainError as exc:
        result.error = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        return result
    compiled = clock()
    bitmask = allocate_token_bitmask(1, vocab.size)
    structure.matcher().fill_bitmask(bitmask, 0)
    result.compile_s, result.ttfm_s = compiled - begun, clock() - begun
    for index, test in enumerate(record["tests"]):
        tokens = _tokens(serialise(test["data"]), vocab, encode)
        if tokens is None:
            result.skipped += 1
            continue
        valid = bool(test["valid"])
        rejected_at = force(structure, tokens, bitmask, result.tbm_s if valid else None)
        if valid:
            result.valid += 1
            if rejected_at is not None:
                result.valid_rejected.append((index, _context(vocab, tokens, rejected_at)))
        else:
            result.invalid += 1
            if rejected_at is None:
                result.invalid_accepted.append(index)
    return result


def force(structure: CompiledStructure, tokens: list[int], bitmask: np.ndarray, tbm: list[float] | None) -> int | None:
    """Force ``tokens`` through a new matcher, a mask before each and one after the last (their seconds appended to
    ``tbm``); the index of the first token refused (``len(tokens)``: the end of sequence), or None when all are
    accepted and the structure may end there."""
    matcher = structure.matcher()
    for at, token in enumerate(tokens):
        _fill(matcher, bitmask, tbm)
        if not _allowed(bitmask, token):
            return at
        try:
            matcher.advance(token)
        except TokenError:  # in the mask but refused: a rejection, as the benchmark counts it
            return at
    _fill(matcher, bitmask, tbm)
    return None if any(_allowed(bitmask, int(t)) for t in structure.vocab.eos_ids) else len(tokens)


def summarise(results: list[SchemaResult]) -> Summary:
    """The figures of a run: TTFM over the schemas that compiled, TBM over every mask of a valid instance."""
    ttfm = [r.ttfm_s for r in results if r.compiled]
    tbm = [t for r in results for t in r.tbm_s]
    return Summary(
        schemas=len(results),
        compiled=sum(r.compiled for r in results),
        passing=sum(r.passing for r in results),
        schemas_valid_rejected=sum(bool(r.valid_rejected) for r in results),
        schemas_invalid_accepted=sum(bool(r.invalid_accepted) for r in results),
        masks=len(tbm),
        ttfm_p50=_pct(ttfm, 50),
        ttfm_p90=_pct(ttfm, 90),
        ttfm_p99=_pct(ttfm, 99),
        tbm_p50=_pct(tbm, 50),
        tbm_p99=_pct(tbm, 99),
    )


def _fill(matcher: Matcher, bitmask: np.ndarray, tbm: list[float] | None) -> None:
    begun = time.perf_counter()
    matcher.fill_bitmask(bitmask, 0)
    if tbm is not None:
        tbm.append(time.perf_counter() - begun)


def _allowed(bitmask: np.ndarray, token: int) -> bool:
    return bool(bitmask[0, token >> 5] >> (token & 31) & 1)


def _tokens(text: str, vocab: Vocabulary, encode: Encode) -> list[int] | None:
    """The tokens of ``text``, or None when it has no UTF-8 form or its tokens do not spell its bytes."""
    try:
        raw = text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate
        return None
    tokens = [int(t) for t in encode(text)]
    return tokens if vocab.decode(tokens) == raw else None


def _context(vocab: Vocabulary, tokens: list[int], at: int) -> str:
    """The last 40 characters read before the refused token, then that token in brackets."""
    before = vocab.decode(tokens[:at]).decode("utf-8", "replace")[-40:]
    token = vocab.decode(tokens[at : at + 1]).decode("utf-8", "replace") if at < len(tokens) else "<eos>"
    return f"{before}⟦{token}⟧"


def _pct(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values, dtype=np.float64), q)) if values else float("nan")


def _ms(seconds: float) -> str:
    return f"{1e3 * seconds:.2f} ms"


def _us(seconds: float) -> str:
    return f"{1e6 * seconds:.1f} µs"
