"""constrain.compilers.warmup: after warmup(), a new structure compiles and masks without numba compiling anything."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from constrain.compilers.warmup import warmup
from tests.shared_data import MASKBENCH_DEV

#: What a probe starts with: each numba dispatcher of constrain's modules, with the signatures it has compiled or
#: loaded so far.
_SIGNATURES = textwrap.dedent(
    """
    import json, sys
    from numba.core.dispatcher import Dispatcher

    def signatures():
        found = {}
        for name, module in list(sys.modules.items()):
            if name.startswith("constrain") and module is not None:
                for attr, value in vars(module).items():
                    if isinstance(value, Dispatcher):
                        found[f"{value.py_func.__module__}.{value.py_func.__name__}"] = set(map(str, value.signatures))
        return found
    """
)

# Run in a fresh process (nothing loaded yet) with an empty constrain cache (no walk read back from disk, so every
# kernel a new walk needs is called): after warmup(), a JSON Schema warmup never saw, on a vocabulary it never saw,
# is compiled and walked under masks; every numba dispatcher of constrain then lists the signatures it had before.
_PROBE = _SIGNATURES + textwrap.dedent(
    """
    from constrain.compilers.warmup import warmup
    print("warmup", warmup(), "again", warmup(), file=sys.stderr)
    before = signatures()

    import constrain
    from constrain.testing import random_vocabulary, random_walk, token_length_weights

    units = ['{"', '":', '","', '"}', "[", "]", ",", "true", "null", "id", "name", "é", "ab", "12", " ", "-", ".5"]
    vocab = random_vocabulary(units, count=2000, seed=7, all_bytes=True)
    schema = {
        "type": "object",
        "properties": {
            "id": {"type": "string", "format": "uuid"},
            "when": {"type": "string", "format": "date-time"},
            "size": {"type": "number", "minimum": -5, "exclusiveMaximum": 1e6},
            "count": {"type": "integer", "minimum": 3, "maximum": 4000},
            "state": {"enum": ["open", "closed", 7, None]},
            "levels": {"type": "array", "items": {"enum": ["low", "high"]}},  # an enum as a rule of its own
            "code": {"type": "string", "pattern": "^[A-Z]{2}[0-9]+$", "maxLength": 9},
            "items": {"type": "array", "items": {"$ref": "#/$defs/item"}, "minItems": 1, "maxItems": 4},
            "meta": {"type": "object", "properties": {"k": {"type": "boolean"}}},
            "either": {"oneOf": [{"type": "string", "maxLength": 3}, {"type": "array", "items": {"type": "number"}}]},
            "mail": {"type": "string", "format": "email", "pattern": "^[a-z]", "maxLength": 90},
            "other": {"type": "string", "not": {"pattern": "^x"}},
            "look": {"type": "string", "pattern": "^(?!ab)[a-z]+$"},
            "cents": {"type": "number", "multipleOf": 0.01, "maximum": 1e9},
        },
        "required": ["id", "items"],
        "$defs": {"item": {"type": "object", "properties": {"name": {"type": "string"}, "tags": {"type": "array"}},
                           "required": ["name"], "additionalProperties": False}},
    }
    structure = constrain.compile(schema, vocab)
    weights = token_length_weights(vocab)
    for seed in range(8):
        random_walk(structure, seed, max_tokens=300, stop=0.3, weights=weights)
    after = signatures()
    new = {k: sorted(v - before.get(k, set())) for k, v in after.items() if v - before.get(k, set())}
    print(json.dumps(new))
    """
)


def _run_probe(probe: str, cache_dir, *args: str, timeout: float) -> object:
    """Run ``probe`` in a fresh process whose constrain cache is ``cache_dir``; the JSON its last line prints."""
    env = {**os.environ, "CONSTRAIN_CACHE_DIR": str(cache_dir), "OMP_NUM_THREADS": "1"}
    out = subprocess.run(
        [sys.executable, "-c", probe, *args], env=env, capture_output=True, text=True, timeout=timeout, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_after_warmup_a_new_schema_compiles_no_kernel(tmp_path):
    new = _run_probe(_PROBE, tmp_path, timeout=600)
    assert new == {}, f"kernels compiled or loaded after warmup(): {new}"


# The same check over real schemas: every twelfth of the dev set (about 460), each compiled and walked at random
# under masks (late writes and lazily built rules included) on a vocabulary warmup never saw. The probe schema
# above reaches the kernels its author thought of; these reach the ones real schemas do.
_DEV_SET_PROBE = _SIGNATURES + textwrap.dedent(
    """
    import gzip
    from constrain.compilers.json_schema import compile_json_schema
    from constrain.compilers.warmup import warmup
    from constrain.errors import ConstrainError
    from constrain.testing import random_vocabulary, random_walk, token_length_weights

    warmup()
    units = ['{"', '":', '","', '"}', "[", "]", ",", "true", "null", "id", "name", "é", "ab", "12", " ", "-", ".5"]
    vocab = random_vocabulary(units, count=2000, seed=5, all_bytes=True)
    weights = token_length_weights(vocab)
    before = signatures()
    new, compiled = {}, 0
    with gzip.open(sys.argv[1], "rt") as lines:
        for n, line in enumerate(lines):
            if n % 12:
                continue
            entry = json.loads(line)
            try:
                structure = compile_json_schema(entry["schema"], vocab)
            except ConstrainError:
                continue
            compiled += 1
            for seed in range(2):
                random_walk(structure, seed, max_tokens=60, stop=0.2, weights=weights)
            after = signatures()
            for k, v in after.items():
                if v - before.get(k, set()):
                    new.setdefault(k, {"first": entry["name"], "signatures": sorted(v - before.get(k, set()))})
            before = after
    print(json.dumps({"compiled": compiled, "new": new}))
    """
)


@pytest.mark.slow
@pytest.mark.skipif(not MASKBENCH_DEV.is_file(), reason=f"MaskBench data not found at {MASKBENCH_DEV}")
def test_after_warmup_dev_set_schemas_load_no_kernel(tmp_path):
    report = _run_probe(_DEV_SET_PROBE, tmp_path, str(MASKBENCH_DEV), timeout=900)
    assert report["compiled"] > 400
    assert report["new"] == {}, f"kernels compiled or loaded after warmup(): {report['new']}"


def test_warmup_is_idempotent_and_fast_the_second_time():
    warmup()
    assert warmup() < 0.5


def test_warmup_with_a_vocabulary_prepares_its_walks_once():
    """warmup(vocab) makes the vocabulary's store of lexical walks and the walks JSON schemas share (a string's
    body, a number), which the first request for that vocabulary would otherwise make; a second call does nothing
    for it."""
    import pytest

    from constrain.errors import ArgumentError
    from constrain.runtime.lexical import LexicalMasks
    from constrain.testing import random_vocabulary

    units = ['{"', '":', '","', '"}', "[", "]", ",", "true", "null", "name", "age", "ab", "12", "-", ".5", "e3"]
    vocab = random_vocabulary(units, count=1500, seed=11, all_bytes=True)
    assert vocab.fingerprint not in LexicalMasks._stores
    warmup(vocab)
    store = LexicalMasks._stores[vocab.fingerprint]
    walks = len(store._entries)
    assert walks > 0
    warmup(vocab)
    assert LexicalMasks._stores[vocab.fingerprint] is store and len(store._entries) == walks
    with pytest.raises(ArgumentError, match="vocab"):
        warmup("gemma")


def test_after_warmup_every_format_compiles_without_building_its_automaton(monkeypatch):
    """A format's regex automaton takes up to tens of milliseconds the first time a process meets it: warmup()
    builds them all, so a first request that uses one finds it ready."""
    import constrain.grammar.rules as rules
    from constrain import Vocabulary
    from constrain.compilers.json_schema import compile_json_schema
    from constrain.compilers.json_schema.formats import _FORMATS, FORMAT_EXAMPLES

    assert set(FORMAT_EXAMPLES) == set(_FORMATS)
    warmup()

    def no_new_automaton(*args, **kwargs):
        raise AssertionError(f"a regex automaton was built after warmup(): {args[2]!r}")

    monkeypatch.setattr(rules, "add_regex", no_new_automaton)
    vocab = Vocabulary.from_token_bytes([bytes([b]) for b in range(256)], eos_ids=[256])
    for name, example in FORMAT_EXAMPLES.items():
        structure = compile_json_schema({"type": "string", "format": name}, vocab)
        text = list(json.dumps(example).encode())
        assert structure.matcher().validate_tokens(text) == len(text), name


def test_after_warmup_a_format_beside_a_length_reads_its_language_ready(monkeypatch):
    """A format beside a length bound (or a pattern) is read through its language over code points, built from
    the format's regex: warmup() builds those too."""
    from constrain import Vocabulary
    from constrain.compilers.json_schema import compile_json_schema
    from constrain.compilers.json_schema.cdfa import _CDFA
    from constrain.compilers.json_schema.formats import FORMAT_EXAMPLES

    warmup()

    def no_new_language(pattern, *args, **kwargs):
        raise AssertionError(f"a code-point automaton was built after warmup(): {pattern!r}")

    monkeypatch.setattr(_CDFA, "from_regex", staticmethod(no_new_language))
    vocab = Vocabulary.from_token_bytes([bytes([b]) for b in range(256)], eos_ids=[256])
    for name, example in FORMAT_EXAMPLES.items():
        structure = compile_json_schema({"type": "string", "format": name, "maxLength": 97}, vocab)
        text = list(json.dumps(example).encode())
        assert structure.matcher().validate_tokens(text) == len(text), name
        too_long = list(json.dumps(example + "x" * 97).encode())
        assert structure.matcher().validate_tokens(too_long) < len(too_long), name


def test_format_examples_are_valid_values_of_their_formats():
    import jsonschema

    from constrain.compilers.json_schema.formats import FORMAT_EXAMPLES

    checker = jsonschema.Draft202012Validator.FORMAT_CHECKER
    for name, example in FORMAT_EXAMPLES.items():
        assert checker.conforms(example, name), (name, example)
    assert not checker.conforms("2024-13-45", "date")  # the checker does check
