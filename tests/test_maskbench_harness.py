"""The MaskBench harness's own logic (benchmarks/maskbench.py): selection, forcing, counting, timeouts, output.

Engines' correctness is not tested here; an in-process fake engine and the harness's ``debug`` worker engine
stand in for them, and one small end-to-end run uses llguidance on 3 schemas.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("maskbench", ROOT / "benchmarks" / "maskbench.py")
mb = importlib.util.module_from_spec(_spec)
sys.modules["maskbench"] = mb
_spec.loader.exec_module(mb)

needs_data = pytest.mark.skipif(not mb.DEFAULT_DATA.is_file(), reason="MaskBench data not found")


# -- data ----------------------------------------------------------------------------------------------------------


def test_serialise_is_compact_and_keeps_unicode():
    assert mb.serialise({"a": [1, 2.5, None], "é": "x\ny"}) == '{"a":[1,2.5,null],"é":"x\\ny"}'


@pytest.fixture()
def tiny_data(tmp_path):
    import gzip

    path = tmp_path / "tiny.jsonl.gz"
    with gzip.open(path, "wt", encoding="utf-8") as f:
        for i in range(10):
            f.write(
                json.dumps(
                    {
                        "name": f"s{i}.json",
                        "meta": {},
                        "schema": {"type": "integer"},
                        "tests": [{"description": "d", "valid": True, "data": i}],
                    }
                )
                + "\n"
            )
    return path


def test_load_entries_limit_sample_names(tiny_data):
    assert [e["name"] for e in mb.load_entries(tiny_data, limit=3)] == ["s0.json", "s1.json", "s2.json"]
    a = mb.load_entries(tiny_data, sample=4, seed=7)
    b = mb.load_entries(tiny_data, sample=4, seed=7)
    assert [e["index"] for e in a] == [e["index"] for e in b]  # a fixed sample
    assert [e["index"] for e in a] == sorted(e["index"] for e in a) and len(a) == 4
    assert [e["index"] for e in mb.load_entries(tiny_data, sample=4, seed=7, limit=2)] == [e["index"] for e in a][:2]
    assert [e["name"] for e in mb.load_entries(tiny_data, names=["s5.json", "s1.json"])] == ["s1.json", "s5.json"]


def test_tokenise_tests_skips_what_cannot_round_trip():
    class Tok:
        def encode(self, text, add_special_tokens):
            assert add_special_tokens is False
            return list(text.encode())

    class Vocab:
        def decode(self, ids):
            return bytes(ids)

    entry = {
        "tests": [
            {"description": "ok", "valid": True, "data": {"a": 1}},
            {"description": "surrogate", "valid": False, "data": "\ud800"},
        ]
    }
    tests = mb.tokenise_tests(entry, Tok(), Vocab())
    assert tests[0]["tokens"] == list(b'{"a":1}') and tests[0]["valid"] is True
    assert "tokens" not in tests[1] and "surrogate" in tests[1]["skip"]


# -- forcing tokens (an in-process fake engine) ----------------------------------------------------------------------


class DigitsEngine(mb.Engine):
    """Token t (0 <= t < 10) is the digit t; accepts one or more digits, then end of sequence (id 1)."""

    name = "digits"

    def compile(self, schema):
        if schema == "bad":
            raise ValueError("no")
        return schema

    def matcher(self, compiled):
        return {"n": 0, "lie": compiled == "lie"}

    def fill(self, m, bitmask):
        bitmask.fill(0)
        bitmask[0, 0] = 0b1111111100 if m["n"] == 0 else 0b1111111110  # digits 2-9 (+ EOS=1 after one)

    def advance(self, m, token):
        if m["lie"] and m["n"] == 1:
            return False
        m["n"] += 1
        return True


def _bitmask():
    return np.zeros((1, 8), dtype=np.int32)


def test_run_test_outcomes_and_timings():
    e = DigitsEngine()
    tbm: list[float] = []
    assert mb.run_test(e, "ok", [3, 4], _bitmask(), tbm) == {"outcome": "accepted"}
    assert len(tbm) == 3  # a mask before each token and one for the end of sequence
    r = mb.run_test(e, "ok", [3, 0], _bitmask(), tbm)
    assert (r["outcome"], r["at"], r["reason"]) == ("rejected", 1, "token not in the mask")
    r = mb.run_test(e, "ok", [], _bitmask(), None)
    assert (r["outcome"], r["at"], r["reason"]) == ("rejected", 0, "end of sequence not allowed")
    r = mb.run_test(e, "lie", [3, 4], _bitmask(), None)
    assert r["outcome"] == "rejected" and r["inconsistent"] and r["at"] == 1


def test_run_schema_record():
    e = DigitsEngine()
    tests = [{"valid": True, "tokens": [5]}, {"valid": False, "tokens": [0]}, {"valid": False, "skip": "why"}]
    rec = mb.run_schema(e, {"schema": "ok", "tests": tests}, _bitmask(), on_compiled=lambda s: None)
    assert rec["status"] == "ok" and rec["ttfm_s"] >= rec["compile_s"] >= 0
    assert [t["outcome"] for t in rec["tests"]] == ["accepted", "rejected", "skipped"]
    assert len(rec["tbm"]) == 2  # only the valid instance's masks
    counts = mb.classify(rec, tests)
    assert counts["validation_errors"] == 0 and counts["invalidation_errors"] == 0 and counts["skipped"] == 1
    refused = mb.run_schema(e, {"schema": "bad", "tests": tests}, _bitmask())
    assert refused["status"] == "refused" and "ValueError: no" in refused["error"]


def test_add_context_shows_the_refused_token():
    class Vocab:
        def decode(self, ids):
            return bytes(ids)

    tests = [{"valid": True, "tokens": list(b'{"a":1}')}, {"valid": True, "tokens": list(b"12")}]
    rec = {"tests": [{"outcome": "rejected", "at": 5}, {"outcome": "rejected", "at": 2}]}
    mb.add_context(rec, tests, Vocab())
    assert rec["tests"][0]["context"] == '{"a":⟦1⟧'
    assert rec["tests"][1]["context"] == "12⟦<eos>⟧"
    assert rec["tests"][0]["at_key"] is False and rec["tests"][1]["at_key"] is False
    rec = {"tests": [{"outcome": "rejected", "at": 6}]}
    mb.add_context(rec, [{"valid": True, "tokens": list(b'{"a":1,"b":2}')}], Vocab())
    assert rec["tests"][0]["context"] == '{"a":1⟦,⟧'
    rec = {"tests": [{"outcome": "rejected", "at": 8}]}
    mb.add_context(rec, [{"valid": True, "tokens": list(b'{"a":1,"b":2}')}], Vocab())
    assert rec["tests"][0]["at_key"] is True


def test_classify_counts_both_kinds_of_error():
    tests = [{"valid": True}, {"valid": True}, {"valid": False}, {"valid": False}]
    rec = {
        "tests": [{"outcome": "rejected"}, {"outcome": "accepted"}, {"outcome": "accepted"}, {"outcome": "rejected"}]
    }
    c = mb.classify(rec, tests)
    assert (c["valid_run"], c["validation_errors"], c["invalid_run"], c["invalidation_errors"]) == (2, 1, 2, 1)


def test_classify_counts_validation_errors_in_declared_order():
    # 0: rejected in its own order, accepted in the declared one; 1: the same text both ways, rejected;
    # 2: has a declared-order text but its pass did not finish (counted as in its own order); 3: declared order
    # rejected too; 4: invalid (never re-checked)
    tests = [
        {"valid": True, "declared_tokens": 5},
        {"valid": True},
        {"valid": True, "declared_tokens": 5},
        {"valid": True, "declared_tokens": 5},
        {"valid": False},
    ]
    rec = {
        "tests": [
            {"outcome": "rejected", "declared_order": {"outcome": "accepted"}},
            {"outcome": "rejected"},
            {"outcome": "accepted"},
            {"outcome": "rejected", "declared_order": {"outcome": "rejected"}},
            {"outcome": "rejected"},
        ]
    }
    c = mb.classify(rec, tests)
    assert (c["validation_errors"], c["validation_errors_declared_order"]) == (3, 2)
    assert (c["declared_checked"], c["declared_unchecked"], c["invalidation_errors"]) == (2, 1, 0)


def test_tokenise_tests_declared_order_with_gemma(gemma_tokenizer, gemma_vocab):
    schema = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}
    entry = {
        "schema": schema,
        "tests": [
            {"description": "own order", "valid": True, "data": {"b": 1, "a": 2}},
            {"description": "declared", "valid": True, "data": {"a": 2, "b": 1}},
            {"description": "invalid", "valid": False, "data": {"b": "x", "a": 2}},
        ],
    }
    tests = mb.tokenise_tests(entry, gemma_tokenizer, gemma_vocab)
    assert gemma_vocab.decode(tests[0]["tokens"]) == b'{"b":1,"a":2}'
    assert gemma_vocab.decode(tests[0]["declared_tokens"]) == b'{"a":2,"b":1}'
    assert "declared_tokens" not in tests[1] and "declared_tokens" not in tests[2]
    assert mb.has_declared(tests) and not mb.has_declared(tests[1:])


def test_summary_markdown_and_label_disagreements():
    tests = [
        [{"valid": True, "description": "a"}, {"valid": False, "description": "b"}],
        [{"valid": True, "description": "c"}],
    ]
    ok = {
        "status": "ok",
        "compile_s": 0.001,
        "ttfm_s": 0.002,
        "tests": [{"outcome": "accepted"}, {"outcome": "accepted"}],
    }
    records = {"x": [ok, {"status": "timeout"}], "y": [dict(ok), {"status": "refused", "error": "E"}]}
    w = mb.Worker("x", {}, Path("."), 1.0)
    w.version, w.peak_mb, w.base_rss_mb, w.setup_s = "1", 100.0, [50.0], [1.0]
    s = mb.summarise("x", records["x"], tests, [1e-6, 2e-6], w)
    assert (s["compiled"], s["timeout"], s["compile_errors"], s["passing"]) == (1, 1, 1, 0)
    assert s["invalidation_errors"] == 1 and s["schemas_with_invalidation_errors"] == 1 and s["masks"] == 2
    assert s["tbm_us"]["max"] == pytest.approx(2.0)
    entries = [{"name": "s0"}, {"name": "s1"}]
    dis = mb.label_disagreements(entries, tests, records)
    assert dis == [{"schema": "s0", "test": 1, "description": "b", "label_valid": False, "engines": ["x", "y"]}]
    text = mb.markdown([s], {"z": "missing"}, None, ["# head"], ["- note"])
    assert "| x 1 | 2 | 1 (50%) | 1 (0 / 0 / 1 / 0) | 0 (0%) |" in text
    assert "not available: missing" in text and text.endswith("- note")
    assert "| 50 / 100 | – |" in text  # records without a per-schema peak (older runs): shown as "–"
    # records without the declared-order pass (written before it existed): no second count, shown as "–"
    assert s["validation_errors_declared_order"] is None and "| 0 / 1 | – | 1 / 1 |" in text
    declared = [
        dict(
            ok,
            declared="ok",
            tests=[{"outcome": "rejected", "declared_order": {"outcome": "accepted"}}, {"outcome": "accepted"}],
        ),
        {"status": "timeout"},
    ]
    tests[0][0]["declared_tokens"] = 3
    s = mb.summarise("x", declared, tests, [1e-6], w)
    assert (s["validation_errors"], s["validation_errors_declared_order"], s["declared_checked"]) == (1, 0, 1)
    assert s["schemas_with_validation_errors_declared_order"] == 0 and s["declared_incomplete"] == 0
    assert "| 1 / 1 | 0 / 1 | 1 / 1 |" in mb.markdown([s], {}, None, [], [])
    assert "1 of the 2 valid instances" in mb.declared_note([s], tests)


# -- worker processes: timeouts, crashes, memory, restarts -----------------------------------------------------------


def test_worker_timeout_crash_memory_and_restart(tmp_path):
    w = mb.Worker("debug", {}, tmp_path, max_rss_mb=400)

    def job(schema, tests=()):
        return {"type": "job", "schema": schema, "tests": list(tests)}

    try:
        r = w.run(job({"x-debug": "sleep", "seconds": 60}), timeout=1.0)
        assert r["status"] == "timeout" and r["phase"] == "compile" and r["wall_s"] < 10
        r = w.run(job({}, [{"valid": True, "tokens": [5, 6]}, {"valid": False, "tokens": [7]}]), timeout=30)
        assert r["status"] == "ok" and [t["outcome"] for t in r["tests"]] == ["accepted", "accepted"]
        assert len(r["tbm"]) == 3 and w.starts == 2  # restarted after the timeout
        r = w.run(job({"x-debug": "abort"}), timeout=30)
        assert r["status"] == "crashed"
        assert w.run(job({"x-debug": "refuse"}), timeout=30)["status"] == "refused"
        r = w.run(job({"x-debug": "grow", "mb": 600}), timeout=30)
        assert r["status"] == "memory" and w.peak_mb > 400
        assert w.run(job({}), timeout=30)["status"] == "ok"
    finally:
        w.stop()
    assert w.proc is None


def test_worker_declared_order_pass_after_the_timed_record(tmp_path):
    w = mb.Worker("debug", {}, tmp_path, max_rss_mb=400)
    tests = [
        {"valid": True, "tokens": [5], "declared_tokens": [6, 7, 8]},
        {"valid": True, "tokens": [5, 6]},
        {"valid": False, "tokens": [7]},
    ]
    try:
        for _ in range(2):  # the second job gets its own answer (the declared-order message was read, not left over)
            r = w.run({"type": "job", "schema": {}, "tests": tests}, timeout=30)
            assert r["status"] == "ok" and r["declared"] == "ok"
            assert r["tests"][0]["declared_order"] == {"outcome": "accepted", "tokens": 3}
            assert "declared_order" not in r["tests"][1] and "declared_order" not in r["tests"][2]
            assert len(r["tbm"]) == 2 + 3  # the timed pass only: the declared-order masks are not timed
        r = w.run({"type": "job", "schema": {"x-debug": "refuse"}, "tests": tests}, timeout=30)
        assert r["status"] == "refused" and "declared" not in r
        r = w.run({"type": "job", "schema": {}, "tests": tests[1:]}, timeout=30)
        assert r["status"] == "ok" and r["declared"] == "ok" and w.starts == 1
    finally:
        w.stop()


def test_worker_reports_what_each_schema_adds_to_the_resident_peak(tmp_path):
    w = mb.Worker("debug", {}, tmp_path, max_rss_mb=2000)
    try:
        grown = w.run({"type": "job", "schema": {"x-debug": "grow", "mb": 200, "seconds": 0}, "tests": []}, 30)
        after = w.run({"type": "job", "schema": {}, "tests": []}, timeout=30)
    finally:
        w.stop()
    assert grown["status"] == after["status"] == "ok"
    assert 190 <= grown["schema_peak_mb"] < 260
    # the 200 MiB it keeps are in the next schema's starting point: the mark was reset, so that one adds ~nothing
    assert after["schema_peak_mb"] < 20 and after["rss_mb"] > 190
    assert w.peak_mb >= grown["hwm_mb"] > 190  # the run-wide peak survives the resets
    s = mb.summarise("debug", [grown, after], [[], []], [], w)
    assert s["schema_peak_mb"]["max"] == grown["schema_peak_mb"] and s["schemas_over_1gib"] == 0
    assert "(0 over 1 GiB) |" in mb.markdown([s], {}, None, [], [])


def test_measurement_cpu_is_one_allowed_cpu_per_shard():
    allowed = sorted(os.sched_getaffinity(0))
    assert mb.measurement_cpu("auto") == allowed[0]
    assert mb.measurement_cpu("auto", shard=1) == allowed[1 % len(allowed)]
    assert mb.measurement_cpu(str(allowed[-1])) == allowed[-1]
    assert mb.measurement_cpu("none") is None
    with pytest.raises(SystemExit, match="CPUs"):
        mb.measurement_cpu(str(max(allowed) + 1))
    with pytest.raises(SystemExit, match="'auto', 'none' or a CPU number"):
        mb.measurement_cpu("first")


def test_a_worker_runs_on_the_cpu_it_is_given(tmp_path):
    cpu = sorted(os.sched_getaffinity(0))[-1]
    pinned = mb.Worker("debug", {"cpu": cpu}, tmp_path, max_rss_mb=2000)
    free = mb.Worker("debug", {}, tmp_path, max_rss_mb=2000)
    try:
        assert pinned.start() and free.start()
        assert os.sched_getaffinity(pinned.proc.pid) == {cpu}
        assert os.sched_getaffinity(free.proc.pid) == os.sched_getaffinity(0)
    finally:
        pinned.stop()
        free.stop()


# -- end to end ------------------------------------------------------------------------------------------------------


@pytest.mark.slow
@needs_data
def test_end_to_end_llguidance_three_schemas(tmp_path, capsys):
    pytest.importorskip("llguidance")
    out = tmp_path / "mb.json"
    assert (
        mb.main(["--limit", "3", "--engines", "llguidance", "--timeout", "120", "--json-out", str(out), "--quiet"]) == 0
    )
    table = capsys.readouterr().out
    assert "| llguidance " in table and "TTFM p50" in table and "--limit 3" in table
    data = json.loads(out.read_text())
    assert [s["index"] for s in data["schemas"]] == [0, 1, 2]
    assert data["engines"] == {"llguidance": data["summary"][0]["version"]}
    for schema in data["schemas"]:
        rec = schema["engines"]["llguidance"]
        assert rec["status"] in ("ok", "refused")
        if rec["status"] == "ok":
            assert len(rec["tests"]) == len(schema["tests"]) and rec["ttfm_s"] > 0
    s = data["summary"][0]
    assert s["schemas"] == 3 and s["compiled"] + s["compile_errors"] == 3 and s["peak_rss_mb"] > 0


@pytest.mark.slow
@needs_data
def test_end_to_end_constrain_declared_order(tmp_path, capsys):
    # valid instances whose keys come in another order than the schema's: constrain rejects them as written (its
    # documented property order), and accepts every one of them in the declared order
    out = tmp_path / "mb.json"
    assert (
        mb.main(
            [
                "--names",
                "Github_easy---o90953.json",
                "--engines",
                "constrain",
                "--timeout",
                "120",
                "--json-out",
                str(out),
                "--quiet",
            ]
        )
        == 0
    )
    table = capsys.readouterr().out
    s = json.loads(out.read_text())["summary"][0]
    assert s["compiled"] == 1 and s["valid_run"] == 2
    assert s["validation_errors"] == 2 and s["declared_checked"] == 2
    assert s["validation_errors_declared_order"] == 0 and s["declared_incomplete"] == 0
    assert "| 2 / 2 | 0 / 2 |" in table and "2 of the 2 valid instances" in table
    # TBM is the timed pass's only: a mask per token read up to each rejection (and none of the declared order's)
    rec = json.loads(out.read_text())["schemas"][0]["engines"]["constrain"]
    valid = [t for t, d in zip(rec["tests"], json.loads(out.read_text())["schemas"][0]["tests"]) if d["valid"]]
    assert s["masks"] == sum(t["at"] + 1 for t in valid) == len(rec["tbm_us"])
