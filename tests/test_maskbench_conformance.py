"""MaskBench conformance: a fixed sample of real schemas, compared with the golden file.

The golden file ``tests/data/maskbench_golden.json.gz`` records, for every one of the 5,545 schemas of
``../shared/data/maskbench-dev.jsonl.gz``, whether it compiled (strict mode, compact whitespace, the Gemma
vocabulary) or was refused and why (error class, keyword, JSON pointer), and, when it compiled, the outcome of
every test instance. It is written by ``tests/maskbench_golden.py`` (that module's docstring says how instances are
serialised: keys in the compiler's canonical order, compact JSON, Gemma tokens without BOS). After a deliberate
change of the compiler, regenerate it (about half an hour on 2 cores) and commit it with the change:

    .venv/bin/python -m tests.maskbench_golden --update

Here, for a fixed sample of ``SAMPLE_SIZE`` (500) schemas (the first by ``sha256(seed + name)``, hostile schemas
left out: those the compiler's time limit refused or that timed out in the golden run), each schema is compiled
again (without the compiler's time limit, so the machine's speed cannot change the answer; a 60 s alarm guards
against a hang) and

- its status must equal the golden record: a new refusal, a newly compiled schema or a refusal that now names
  another keyword or pointer fails, with the command above in the message;
- every invalid instance must be rejected at some token or be unable to end (strictly: no exception list);
- every valid instance must be accepted token by token and may end there, except the validation errors the golden
  file lists for that schema (their number over the whole set may only go down: ``MAX_VALID_REJECTED``);
- the matcher must not raise anything but ``TokenError``, except where the golden file lists it
  (``matcher_errors``, also bounded: ``MAX_MATCHER_ERRORS``).

The whole set runs in the generator (above) and in ``benchmarks/maskbench.py``. Without ``../shared/data`` the
tests are skipped with the reason.
"""

from __future__ import annotations

import hashlib
import importlib.util
import sys
import warnings
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location("maskbench_golden", Path(__file__).with_name("maskbench_golden.py"))
mg = sys.modules.get("maskbench_golden") or importlib.util.module_from_spec(_spec)
if "maskbench_golden" not in sys.modules:
    sys.modules["maskbench_golden"] = mg
    _spec.loader.exec_module(mg)

#: Validation errors (valid instances not accepted) over the whole golden file: may go down, never up. Now 0,
#: the target: a valid instance in the compiler's canonical key order is always accepted.
MAX_VALID_REJECTED = 0
#: Matcher failures (an exception other than TokenError while reading an instance) in the golden file: the same
#: ratchet. The target is 0.
MAX_MATCHER_ERRORS = 0
#: Compiles that raised something other than JsonSchemaError in the golden file: the same ratchet, target 0.
MAX_CRASHED = 0
#: Per-schema alarm in this test (a guard against a hang; the sample holds no schema the time limit refused).
COMPILE_TIMEOUT_S = 60.0

REGENERATE = f"if the change is intended, regenerate the golden file: {mg.COMMAND}"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not mg.DATA.is_file(), reason=f"MaskBench data not found at {mg.DATA}"),
]


def _golden_records() -> list[dict]:
    if not (mg.DATA.is_file() and mg.GOLDEN.is_file()):
        return []
    return mg.load_golden()["schemas"]


_RECORDS = _golden_records()
GOLDEN = {r["name"]: r for r in _RECORDS}
SAMPLE = mg.sample_names(_RECORDS) if _RECORDS else ["(no golden file)"]


@pytest.fixture(scope="module")
def entries() -> dict[str, dict]:
    if not mg.GOLDEN.is_file():
        pytest.fail(f"the golden file {mg.GOLDEN} is missing: generate it with {mg.COMMAND}")
    return {e["name"]: e for e in mg.load_entries(mg.DATA, set(SAMPLE))}


def test_golden_file_matches_the_data_set():
    assert mg.GOLDEN.is_file(), f"the golden file {mg.GOLDEN} is missing: generate it with {mg.COMMAND}"
    golden = mg.load_golden()
    import gzip

    with gzip.open(mg.DATA, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    assert golden["data_sha256"] == digest, f"the data set changed since the golden file was written; {REGENERATE}"
    assert golden["format"] == mg.FORMAT_VERSION, REGENERATE
    names = [r["name"] for r in golden["schemas"]]
    assert len(names) == len(set(names)) == 5545
    assert len(SAMPLE) >= 500


def test_golden_file_has_no_invalidation_errors_and_validation_errors_do_not_grow():
    records = _golden_records()
    if not records:
        pytest.fail(f"the golden file {mg.GOLDEN} is missing: generate it with {mg.COMMAND}")
    accepted = [(r["name"], a) for r in records for a in r.get("invalid_accepted", [])]
    assert not accepted, f"invalid instances accepted (must be none): {accepted[:20]}"
    rejected = [(r["name"], v) for r in records for v in r.get("valid_rejected", [])]
    assert len(rejected) <= MAX_VALID_REJECTED, (
        f"{len(rejected)} valid instances rejected in the golden file, more than MAX_VALID_REJECTED = "
        f"{MAX_VALID_REJECTED}: {rejected[:20]}"
    )
    if len(rejected) < MAX_VALID_REJECTED:
        warnings.warn(f"only {len(rejected)} validation errors now: lower MAX_VALID_REJECTED", stacklevel=1)
    errors = [(r["name"], v) for r in records for v in r.get("matcher_errors", [])]
    assert len(errors) <= MAX_MATCHER_ERRORS, (
        f"{len(errors)} matcher failures in the golden file, more than MAX_MATCHER_ERRORS = {MAX_MATCHER_ERRORS}: "
        f"{errors[:20]}"
    )
    crashed = [r["name"] for r in records if r["status"] == "crashed"]
    assert len(crashed) <= MAX_CRASHED, f"{len(crashed)} compiles crashed (not a JsonSchemaError): {crashed}"


@pytest.mark.parametrize("name", SAMPLE)
def test_sample_schema_conforms(name, entries, gemma_tokenizer, gemma_vocab):
    golden = GOLDEN[name]
    entry = entries[name]
    # The compiler's own time limit is lifted here (``time_limit=None``) so a slow or loaded machine cannot turn
    # a compile into a refusal; the alarm still stops a hang.
    structure, status = mg.compile_status(entry["schema"], gemma_vocab, timeout=COMPILE_TIMEOUT_S, time_limit=None)
    if status["status"] == "timeout":
        pytest.fail(f"{name}: the compile took more than {COMPILE_TIMEOUT_S:.0f} s (golden: {golden['status']})")
    now = (status["status"], mg._error_key(status))
    before = (golden["status"], mg._error_key(golden))
    assert now == before, (
        f"{name}: was {before[0]} {before[1] or ''}, now {now[0]} {now[1] or ''}"
        + (f" ({status['error']['reason']})" if "error" in status else "")
        + f"; {REGENERATE}"
    )
    if structure is None:
        return
    known = {v["test"] for v in golden.get("valid_rejected", [])}
    known_errors = {v["test"] for v in golden.get("matcher_errors", [])}
    problems = []
    for i, test in enumerate(entry["tests"]):
        text = mg.instance_text(entry["schema"], test["data"])
        tokens = mg.tokenise(text, gemma_tokenizer, gemma_vocab)
        if isinstance(tokens, str):
            continue  # no UTF-8 form, or the tokenizer does not spell it byte for byte (as the harness)
        outcome = mg.run_tokens(structure, tokens)
        if outcome[0] == "X" and i not in known_errors:
            problems.append(f"the matcher raised {outcome} on instance {i} (valid: {test['valid']}): {text[:300]}")
        elif not test["valid"] and outcome == "A":
            problems.append(f"invalid instance {i} accepted: {text[:300]} ({test.get('description', '')})")
        elif test["valid"] and outcome != "A" and i not in known:
            where = mg._near(tokens, outcome, gemma_vocab)
            problems.append(f"valid instance {i} not accepted ({outcome}, near {where!r}): {text[:300]}")
        elif test["valid"] and outcome == "A" and i in known:
            warnings.warn(f"{name}: valid instance {i} is accepted now; {REGENERATE}", stacklevel=1)
    assert not problems, f"{name}:\n  " + "\n  ".join(problems) + f"\n(a valid instance rejected: {REGENERATE})"
