"""Where the data the tests read in place lies: ``../shared/data``, next to the repository (never copied into it)."""

from pathlib import Path

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
#: MaskBench's dev set: real schemas, one a line, with valid and invalid instances.
MASKBENCH_DEV = SHARED_DATA / "maskbench-dev.jsonl.gz"
#: The JSON Schema Test Suite's tests, a folder per draft.
JSON_SCHEMA_TEST_SUITE = SHARED_DATA / "json-schema-test-suite" / "tests"
