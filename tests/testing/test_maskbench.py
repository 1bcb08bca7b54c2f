"""constrain.testing.maskbench: the constrain-only MaskBench harness, on a byte vocabulary (every byte a token)."""

from __future__ import annotations

import gzip
import json
import math

import numpy as np
import pytest

import constrain
from constrain.testing import byte_vocabulary
from constrain.testing import maskbench as mb

INT = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"], "additionalProperties": False}


def encode(text: str) -> list[int]:
    return list(text.encode())


@pytest.fixture(scope="module")
def vocab():
    return byte_vocabulary()


def test_a_schema_that_passes(vocab):
    record = {
        "name": "ok",
        "schema": INT,
        "tests": [{"data": {"a": 12}, "valid": True}, {"data": {"a": "x"}, "valid": False}],
    }
    result = mb.run_schema(record, vocab, encode)
    assert result.passing and (result.valid, result.invalid, result.skipped) == (1, 1, 0)
    assert len(result.tbm_s) == len('{"a":12}') + 1  # a mask per token and one for the end of sequence
    assert result.ttfm_s >= result.compile_s > 0


def test_rejections_acceptances_refusals_and_skips(vocab):
    wrong_labels = {
        "name": "labels",
        "schema": INT,
        "tests": [
            {"data": {"a": 1.5}, "valid": True},  # rejected at the '.'
            {"data": {"a": 1}, "valid": False},  # accepted
            {"data": "\ud800", "valid": False},  # no UTF-8 form: skipped
        ],
    }
    result = mb.run_schema(wrong_labels, vocab, encode)
    assert not result.passing and result.skipped == 1
    assert result.valid_rejected == [(0, '{"a":1⟦.⟧')] and result.invalid_accepted == [1]
    refused = mb.run_schema({"name": "no", "schema": {"type": "nope"}, "tests": []}, vocab, encode)
    assert not refused.compiled and refused.error.startswith("JsonSchemaError")
    s = mb.summarise([mb.run_schema({"name": "ok", "schema": INT, "tests": []}, vocab, encode), result, refused])
    assert (s.schemas, s.compiled, s.passing, s.schemas_valid_rejected, s.schemas_invalid_accepted) == (3, 2, 1, 1, 1)
    assert s.masks == len('{"a":1.') and not math.isnan(s.ttfm_p99)  # masks up to the refused token
    assert "passing  1 / 3 schemas (33.3%)" in str(s)


def test_force_says_where(vocab):
    structure = constrain.compile(INT, vocab)
    bitmask = np.zeros((1, structure.bitmask_width), dtype=np.int32)
    assert mb.force(structure, encode('{"a":1}'), bitmask, None) is None
    assert mb.force(structure, encode('{"a":1'), bitmask, None) == len('{"a":1')  # no end of sequence yet
    assert mb.force(structure, encode('{"b":1}'), bitmask, None) == 2


def test_load_records_plain_or_gzip_sample_and_limit(tmp_path):
    lines = [json.dumps({"name": f"s{i}", "schema": {}, "tests": []}) + "\n" for i in range(10)]
    plain, packed = tmp_path / "d.jsonl", tmp_path / "d.jsonl.gz"
    plain.write_text("".join(lines))
    with gzip.open(packed, "wt") as f:
        f.write("".join(lines))
    assert [r["name"] for r in mb.load_records(plain, limit=2)] == ["s0", "s1"]
    sample = [r["name"] for r in mb.load_records(packed, sample=4, seed=3)]
    assert sample == [r["name"] for r in mb.load_records(plain, sample=4, seed=3)] and len(sample) == 4
    (tmp_path / "bad.jsonl").write_text('{"name": "x"}\n')
    with pytest.raises(ValueError, match="record 1 is not a MaskBench record"):
        mb.load_records(tmp_path / "bad.jsonl")
