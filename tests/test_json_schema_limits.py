"""Hostile schemas: each compiles within the time limit or is refused with a typed error naming the place;
nothing runs unbounded. (Speed itself is measured in benchmarks/, not here: the bounds are generous.)"""

from __future__ import annotations

import time

import pytest

from constrain.compilers.json_schema import DEFAULT_TIME_LIMIT, JsonSchemaError, compile_json_schema, schema_to_grammar


def nested(depth: int) -> dict:
    schema: dict = {"type": "integer"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"a": schema}, "required": ["a"]}
    return schema


HOSTILE = {
    "huge enum": {"enum": [f"value-{i}" for i in range(50_000)]},
    "deep nesting": nested(400),
    "repetition of repetitions": {"type": "string", "pattern": "^(a{1,100}){1,100}$"},
    "long pattern strings": {"type": "string", "pattern": "^[a-z]{2,8}@[a-z]+\\.(com|org)$", "maxLength": 2000},
    "many patterned properties": {
        "type": "object",
        "properties": {f"p{i}": {"type": "string", "pattern": f"^x{{{i}}}[0-9]+$", "maxLength": 60} for i in range(400)},
    },
    "exponential oneOf": {"oneOf": [{"type": "object", "properties": {f"k{i}": {"type": "integer"}}} for i in range(24)]},
    "allOf of ranges": {"allOf": [{"type": "integer", "multipleOf": m} for m in (7, 11, 13, 17, 19, 23, 29)]},
    "wide number range": {"type": "number", "minimum": -1e300, "exclusiveMaximum": 1e300, "multipleOf": 0.001},
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_schemas_compile_in_time_or_are_refused_with_a_pointer(name, gemma_vocab):
    started = time.monotonic()
    try:
        compile_json_schema(HOSTILE[name], gemma_vocab)
    except JsonSchemaError as exc:
        assert exc.pointer == "" or exc.pointer.startswith("/"), exc
    except Exception as exc:  # noqa: BLE001 - the point: no other kind of failure
        pytest.fail(f"{name}: {type(exc).__name__}: {exc}")
    # A guard against a hang, not a speed test: the limit is checked between steps of any size, and this
    # machine may be loaded.
    assert time.monotonic() - started < 12 * DEFAULT_TIME_LIMIT, name


def test_the_time_limit_refuses_with_a_pointer_and_can_be_lifted():
    schema = {
        "type": "object",
        "properties": {f"p{i}": {"type": "string", "pattern": f"^[a-z]{{2,{5 + i % 7}}}@x\\.org$"} for i in range(200)},
    }
    with pytest.raises(JsonSchemaError, match="time_limit") as info:
        schema_to_grammar(schema, time_limit=0.0)
    assert info.value.pointer == "" or info.value.pointer.startswith("/")
    grammar, _ = schema_to_grammar({"type": "integer"}, time_limit=None)
    assert grammar.rules


@pytest.mark.parametrize(
    "schema",
    [
        {"enum": ["a", "bb", 3], "minLength": 2},
        {"type": "object", "properties": {"a": {}}, "propertyNames": {"minLength": 1}},
        {"type": "string", "pattern": "^[a-z]+$"},
    ],
    ids=["enum values", "property names", "pattern text"],
)
def test_the_time_limit_running_out_inside_a_guarded_call_is_reported_as_the_time_limit(schema, monkeypatch):
    """The deadline passing while jsonschema evaluates enum values or property names, or while a pattern's own
    text is compared with its automaton, used to come out as "cannot evaluate ..." or a silent fallback: the
    handlers there caught every Exception (or every StructureError, which CompileTimeout is). A pattern's search
    automaton is built where regex errors become refusals: the time limit must not become one."""
    from constrain.automaton import deadline
    from constrain.compilers import json_schema

    def expired(call):
        def late(*args, **kwargs):
            with deadline(0.0):  # CPU time is past 0 s: the limit has run out
                return call(*args, **kwargs)

        return late

    monkeypatch.setattr(json_schema._Document, "is_valid", expired(json_schema._Document.is_valid))
    monkeypatch.setattr(json_schema._Compiler, "search", expired(json_schema._Compiler.search))
    with pytest.raises(JsonSchemaError, match=r"takes longer than time_limit=60 s"):
        schema_to_grammar(schema, time_limit=60)
