"""The enum-value check that skips jsonschema for schemas of ``type``/``enum``/``const``/``not``, string lengths
and numeric bounds alone (``document._plain_verdict``) against jsonschema itself: random schemas of those keywords,
random JSON values, three dialects. Wherever it answers, it must answer as jsonschema does; it must answer for
every such schema (but draft 4's bounds, whose exclusive flags it leaves to jsonschema), and leave any other schema
(a ``format``, a ``pattern``) to jsonschema."""

from __future__ import annotations

import json

import jsonschema
import pytest
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

from constrain.compilers.json_schema import schema_to_grammar
from constrain.compilers.json_schema.document import _plain_verdict
from constrain.compilers.json_schema.values import _dumps
from constrain.errors import JsonSchemaError
from constrain.grammar import build_pushdown
from constrain.runtime.pushdown import Machine

DIALECTS = {
    "draft4": jsonschema.Draft4Validator,
    "draft7": jsonschema.Draft7Validator,
    "2020-12": jsonschema.Draft202012Validator,
}

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 3),
    st.sampled_from([0.0, 1.0, -2.0, 1.5, 2.25]),
    st.sampled_from(["", "a", "b", "1", "true"]),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.sampled_from(["a", "b"]), inner, max_size=2)
    ),
    max_leaves=6,
)
bounds = st.sampled_from([-1, 0, 1, 1.5, 2])
type_names = st.sampled_from(["null", "boolean", "integer", "number", "string", "array", "object"])


def plain_schemas(depth: int = 2):
    keywords = {
        "type": st.one_of(type_names, st.lists(type_names, min_size=1, max_size=3, unique=True)),
        "enum": st.lists(values, min_size=1, max_size=4),
        "const": values,
        "minLength": st.integers(0, 2),
        "maxLength": st.integers(0, 2),
        "minimum": bounds,
        "maximum": bounds,
        "exclusiveMinimum": bounds,
        "exclusiveMaximum": bounds,
        "title": st.just("ignored"),
        "x-unknown": values,  # not a keyword: ignored by jsonschema, and so here
    }
    if depth:
        keywords["not"] = st.one_of(st.booleans(), st.deferred(lambda: plain_schemas(depth - 1)))
    return st.fixed_dictionaries({}, optional=keywords)


@pytest.mark.parametrize("dialect", list(DIALECTS))
@settings(max_examples=400, deadline=None)
@given(schema=plain_schemas(), value=values)
def test_plain_verdict_is_jsonschemas(dialect, schema, value):
    cls = DIALECTS[dialect]
    verdict = _plain_verdict(schema, value, cls.VALIDATORS, draft4=dialect == "draft4")
    if dialect == "draft4" and _has_bound(schema):
        if verdict is None:
            return  # left to jsonschema (an earlier keyword may have answered already)
    else:
        assert verdict is not None, schema
    assert verdict == cls(schema).is_valid(value), (schema, value)


def _has_bound(schema) -> bool:
    """Whether ``schema`` or a schema under its ``not`` has a draft 4 numeric bound (``minimum``, ``maximum``)."""
    if not isinstance(schema, dict):
        return False
    return "minimum" in schema or "maximum" in schema or _has_bound(schema.get("not"))


@pytest.mark.parametrize(
    "schema",
    [
        {"enum": ["a"], "format": "date"},
        {"type": "string", "pattern": "^a"},
        {"multipleOf": 2, "type": "number"},
        {"not": {"pattern": "^a"}},
        {"type": ["string", {"type": "null"}]},
    ],
)
def test_other_keywords_are_left_to_jsonschema(schema):
    assert _plain_verdict(schema, "a", jsonschema.Draft202012Validator.VALIDATORS, draft4=False) is None


def test_draft4_integer_is_not_a_float():
    """Draft 4's ``integer`` excludes ``1.0``, later drafts include it: the enum keeps the values each allows."""
    known = jsonschema.Draft4Validator.VALIDATORS
    assert _plain_verdict({"type": "integer"}, 1.0, known, draft4=True) is False
    assert _plain_verdict({"type": "integer"}, 1.0, jsonschema.Draft7Validator.VALIDATORS, draft4=False) is True


def test_enum_values_filtered_by_negated_branches():
    """An exclusive ``oneOf`` checks each enum value against the negation of the other branches: the values both
    branches allow are produced by neither, the rest by their own branch."""
    schema = {
        "oneOf": [
            {"type": "string", "enum": ["a", "b", "c"]},
            {"type": "string", "enum": ["b", "c", "d"], "not": {"const": "c"}},
        ]
    }
    grammar, _ = schema_to_grammar(schema)
    machine = Machine(build_pushdown(grammar))
    for value in "abcde":
        configs = machine.read(machine.start, f'"{value}"'.encode())
        accepted = bool(configs) and machine.can_end(configs)
        assert accepted == jsonschema.Draft202012Validator(schema).is_valid(value), value


@pytest.mark.parametrize("dialect", ["draft4", "2020-12"])
@settings(max_examples=300, deadline=None)
@given(schema=plain_schemas(depth=1), value=values)
@example(schema={"type": "integer", "enum": [2.0, 1.5]}, value=None)  # draft 4's integer is 2, not 2.0
@example(schema={"enum": [1, 2], "const": 3}, value=None)
@example(schema={"type": "string", "maxLength": 1, "enum": ["a", "bc", 1]}, value=None)
def test_an_enum_or_const_allows_exactly_its_valid_values(dialect, schema, value):
    """A schema with an ``enum`` or a ``const`` (both, at times) beside plain keywords: the compiled grammar
    accepts the text of a candidate value (one of them, or any value; written canonically and as Python writes
    it, ``0.0`` for an integral float) exactly when jsonschema finds the value that text reads as valid, and a
    schema none of whose values is valid is refused as unsatisfiable."""
    if dialect == "draft4":
        schema.pop("const", None)  # not a draft 4 keyword (see the test below)
    if "enum" not in schema and "const" not in schema:
        schema = {**schema, "enum": [value]}
    schema = {"$schema": _DIALECT_URIS[dialect], **schema}
    assume(not list(DIALECTS[dialect](DIALECTS[dialect].META_SCHEMA).iter_errors(schema)))  # draft 4's bounds
    validator = DIALECTS[dialect](schema)
    candidates = [*schema.get("enum", ()), *([schema["const"]] if "const" in schema else ()), value]
    texts = {text for v in candidates for text in (_dumps(v), json.dumps(v, separators=(",", ":")))}
    try:
        grammar, _ = schema_to_grammar(schema)
    except JsonSchemaError as exc:
        assert "unsatisfiable" in str(exc), exc
        assert not any(validator.is_valid(v) for v in candidates), schema
        return
    machine = Machine(build_pushdown(grammar))
    for text in texts:
        configs = machine.read(machine.start, text.encode())
        if bool(configs) and machine.can_end(configs):
            assert validator.is_valid(json.loads(text)), (schema, text)  # never an invalid value
        elif text == _dumps(json.loads(text)):
            assert not validator.is_valid(json.loads(text)), (schema, text)  # every valid value, written canonically


def test_draft4_has_no_const():
    """``const`` is not a draft 4 keyword: a draft 4 schema that uses it is refused in strict mode, as one that
    uses any other draft's keyword is, rather than read as a constraint its validators would ignore."""
    with pytest.raises(JsonSchemaError, match="'const' is not a keyword of Draft4"):
        schema_to_grammar({"$schema": _DIALECT_URIS["draft4"], "type": "integer", "const": 3})


_DIALECT_URIS = {
    "draft4": "http://json-schema.org/draft-04/schema#",
    "2020-12": "https://json-schema.org/draft/2020-12/schema",
}


def test_an_enum_beside_a_const_allows_only_the_values_of_both():
    """``const`` is checked against the ``enum`` beside it, and the other way round: one value of both, or none."""
    grammar, _ = schema_to_grammar({"enum": [1, 2, 3], "const": 3})
    machine = Machine(build_pushdown(grammar))
    assert [v for v in (1, 2, 3) if machine.can_end(machine.read(machine.start, str(v).encode()) or ())] == [3]
    with pytest.raises(JsonSchemaError, match="unsatisfiable"):
        schema_to_grammar({"enum": [1, 2], "const": 3})
