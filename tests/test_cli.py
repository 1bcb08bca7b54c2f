"""The ``constrain`` command line, each subcommand run as a real subprocess on real files.

The commands that need a vocabulary load the Gemma 3 tokenizer (a few seconds each); ``generate`` runs the embedded
Gemma 3 270M on one thread with a few tokens.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

from tests.shared_data import MASKBENCH_DEV as MASKBENCH

ROOT = Path(__file__).resolve().parent.parent

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}


def run(*args: str, cwd: Path | None = None, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    return subprocess.run(
        [sys.executable, "-m", "constrain.cli", *args],
        cwd=cwd or ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture()
def person(tmp_path: Path) -> Path:
    path = tmp_path / "person.json"
    path.write_text(json.dumps(PERSON))
    return path


def assert_one_line_error(result: subprocess.CompletedProcess[str], *words: str, alone: bool = True) -> None:
    """Exit code 2, no traceback, the error in one line: the only line on stderr (``alone``), or the last one
    after the log's progress lines."""
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 if alone else [line for line in lines if "error:" in line] == lines[-1:], lines
    assert "error:" in lines[-1]
    for word in words:
        assert word in lines[-1]


# -- compile ---------------------------------------------------------------------------------------------------


def test_compile_a_schema(person):
    result = run("compile", "--schema", str(person))
    assert result.returncode == 0, result.stderr
    assert re.search(r"pushdown automaton of \d+ rules, [\d,]+ states", result.stdout)
    assert re.search(r"compiled: +[\d.]+ ms, first mask [\d.]+ ms", result.stdout)
    assert "relaxed:    nothing" in result.stdout


def test_compile_names_the_pointer_of_a_refused_keyword_and_lenient_relaxes_it(tmp_path):
    schema = tmp_path / "tags.json"
    schema.write_text(json.dumps({"properties": {"tags": {"type": "array", "uniqueItems": True}}}))
    refused = run("compile", "--schema", str(schema))
    assert_one_line_error(refused, "/properties/tags/uniqueItems", "--lenient", alone=False)
    relaxed = run("compile", "--schema", str(schema), "--lenient")
    assert relaxed.returncode == 0, relaxed.stderr
    assert "relaxed:    1 (lenient mode)" in relaxed.stdout
    assert "/properties/tags/uniqueItems: uniqueItems: dropped" in relaxed.stdout


# -- check -----------------------------------------------------------------------------------------------------


def test_check_accepts_a_valid_text(person, tmp_path):
    text = tmp_path / "ok.json"
    text.write_text('{"name":"Ada Lovelace","age":36}')
    result = run("check", "--schema", str(person), "--text", str(text))
    assert (result.returncode, result.stdout.strip()) == (0, "accepted: 32 bytes")


def test_check_says_where_a_text_is_rejected(person, tmp_path):
    text = tmp_path / "bad.json"
    text.write_text('{"name":"Adé","age":"36"}')
    result = run("check", "--schema", str(person), "--text", str(text))
    assert result.returncode == 1, result.stderr
    assert "rejected at byte 21 (character 20, line 1, column 21)" in result.stdout
    assert '{"name":"Adé","age":⟦"⟧36"}' in result.stdout


def test_where_a_multi_line_text_stops():
    from constrain.cli import _around, _where, first_refusal
    from constrain.compilers.api import compile as compile_structure
    from constrain.testing import byte_vocabulary

    structure = compile_structure(r"[a-zé]+\n[a-z]+", byte_vocabulary())
    data = "abé\nde1".encode()
    assert first_refusal(structure, data) == 7
    assert _where(data, 7) == "at byte 7 (character 6, line 2, column 3): the structure cannot read it"
    assert _around(data, 7) == "abé\\nde⟦1⟧"
    assert first_refusal(structure, "abé\n".encode()) == 5
    assert _where(b"ab\n", 3).startswith("at the end (byte 3, character 3)")
    assert first_refusal(structure, b"ab\ncd") is None


# -- generate --------------------------------------------------------------------------------------------------


def test_generate_a_regex():
    result = run(
        "generate", "The Berlin Wall fell on 9 November 1989, in ISO format:", "--regex", r" \d{4}-\d{2}-\d{2}"
    )
    assert result.returncode == 0, result.stderr
    assert re.fullmatch(r" \d{4}-\d{2}-\d{2}\n", result.stdout)
    assert re.search(r"\d+ tokens \(\d+ forced\) in [\d.]+ s \([\d.]+ tokens/s\)", result.stderr)


def test_generate_a_schema(person):
    result = run("generate", "Text: Ada Lovelace was 36.\nJSON: ", "--schema", str(person), "--max-new-tokens", "40")
    assert result.returncode == 0, result.stderr
    jsonschema.validate(json.loads(result.stdout), PERSON)
    forced = int(re.search(r"\((\d+) forced\)", result.stderr).group(1))
    assert forced > 0  # JSON forces its keys' text by default
    plain = run("generate", "Text: Ada Lovelace was 36.\nJSON: ", "--schema", str(person), "--fast-forward", "off")
    assert plain.returncode == 0, plain.stderr
    jsonschema.validate(json.loads(plain.stdout), PERSON)
    assert "(0 forced)" in plain.stderr


def test_generate_out_of_tokens_exits_1(person):
    result = run("generate", "JSON: ", "--schema", str(person), "--max-new-tokens", "2")
    assert result.returncode == 1
    assert "incomplete after 2 tokens" in result.stderr and "Traceback" not in result.stderr


# -- warmup and bench ------------------------------------------------------------------------------------------


def test_warmup():
    result = run("warmup")
    assert result.returncode == 0, result.stderr
    assert re.fullmatch(r"numba kernels ready in [\d.]+ s\n", result.stdout)


@pytest.mark.skipif(not MASKBENCH.is_file(), reason="MaskBench data not found")
def test_bench_three_schemas(tmp_path):
    with gzip.open(MASKBENCH, "rt", encoding="utf-8") as f:
        lines = [next(f) for _ in range(3)]
    data = tmp_path / "three.jsonl"
    data.write_text("".join(lines))
    result = run("bench", str(data))
    assert result.returncode == 0, result.stderr
    assert re.search(r"passing +\d / 3 schemas \([\d.]+%\)", result.stdout)
    assert re.search(r"TTFM +p50 [\d.]+ ms +p90 [\d.]+ ms +p99 [\d.]+ ms", result.stdout)
    assert re.search(r"TBM +p50 [\d.]+ µs +p99 [\d.]+ µs", result.stdout)


# -- bad input: one line on stderr, exit code 2 ----------------------------------------------------------------


def test_a_missing_schema_file(tmp_path):
    assert_one_line_error(run("compile", "--schema", str(tmp_path / "nope.json")), "nope.json", "No such file")


def test_a_schema_that_is_not_json(tmp_path):
    path = tmp_path / "broken.json"
    path.write_text("{not json")
    assert_one_line_error(run("check", "--schema", str(path), "--text", str(path)), "broken.json is not JSON")


def test_a_bad_pydantic_path(tmp_path):
    assert_one_line_error(run("compile", "--pydantic", "no_such_module:Person", cwd=tmp_path), "no_such_module")
    (tmp_path / "models.py").write_text("X = 1\n")
    assert_one_line_error(run("compile", "--pydantic", "models:Person", cwd=tmp_path), "models has no Person")
    assert_one_line_error(run("compile", "--pydantic", "models", cwd=tmp_path), "MODULE:TYPE")


def test_two_spec_flags(person):
    result = run("generate", "hi", "--schema", str(person), "--regex", "a+")
    assert_one_line_error(result, "--regex", "not allowed with", "--schema")
