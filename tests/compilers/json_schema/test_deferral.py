"""Lazy lowering: the rules of certified values are written when a matcher first reaches them.

The contract is that putting a rule off changes nothing a caller can see: the same schemas are refused (same
keyword and pointer), the same texts accepted, and writing any rule put off never fails. The oracles are the
eager compile of the same schema and ``jsonschema``; the data are the JSON Schema Test Suite and MaskBench's dev
schemas, each rule of a lazy grammar written to the end.
"""

from __future__ import annotations

import glob
import gzip
import json
import operator
import random
from pathlib import Path

import pytest

from constrain.compilers.json_schema import compile_json_schema, deferral, schema_to_grammar, strings
from constrain.compilers.json_schema import compiler as compiler_module
from constrain.compilers.json_schema.compiler import _Compiler
from constrain.compilers.json_schema.deferral import (
    MAX_DEFERRING_NODES,
    MIN_DEFERRED_SUBSCHEMAS,
    MIN_DEFERRING_NODES,
    _on_cycles,
)
from constrain.compilers.json_schema.keywords import _Part
from constrain.compilers.json_schema.rules import _finalize
from constrain.errors import JsonSchemaError, StructureError
from constrain.grammar.rules import build_pushdown
from constrain.runtime.pushdown import Machine
from tests.shared_data import JSON_SCHEMA_TEST_SUITE as SUITE
from tests.shared_data import MASKBENCH_DEV as DEV

from .test_json_schema import _key_orders, accepts, cyclic_garbage, dumps, valid


@pytest.fixture
def put_off_all(monkeypatch):
    """Every certified value put off, however small (the thresholds only weigh cost against benefit)."""
    monkeypatch.setattr(compiler_module, "MIN_DEFERRING_NODES", 0)
    monkeypatch.setattr(deferral, "MIN_DEFERRED_SUBSCHEMAS", 1)


def compiler(schema, **options) -> _Compiler:
    c = _Compiler(schema, True, "compact", True, 20, "declared", True)
    for name, value in options.items():
        setattr(c, name, value)
    return c


def certified(schema, ptr: str) -> bool:
    """The certificate of the subschema at ``ptr``, leaving out the question of whether it is worth putting off:
    lowering it succeeds and some finite value satisfies it."""
    c = compiler(schema)
    c._certify(ptr)
    return c._certified[ptr] and c._productive[ptr]


def write_all(pushdown) -> int:
    """Write every rule of ``pushdown`` put off, and those they put off in turn; returns how many rules it has."""
    return len(pushdown.rules)


def outcome(schema, lazy: bool, **options):
    """(error class, keyword, pointer) of a refusal, or a machine with every rule written."""
    try:
        grammar, _ = schema_to_grammar(schema, lazy=lazy, **options)
        pushdown = build_pushdown(grammar, lazy=True)
    except StructureError as exc:
        return type(exc).__name__, getattr(exc, "keyword", None), getattr(exc, "pointer", None)
    return Machine(pushdown)


NESTED = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "pattern": "^[a-z]+$"},
        "tags": {"type": "array", "items": {"enum": ["x", "y"]}, "maxItems": 3},
        "owner": {"$ref": "#/$defs/person"},
        "kind": {"oneOf": [{"type": "integer", "minimum": 0}, {"type": "string", "format": "date"}]},
    },
    "required": ["name", "owner"],
    "$defs": {
        "person": {
            "type": "object",
            "properties": {
                "age": {"type": "integer", "maximum": 150},
                "friends": {"items": {"$ref": "#/$defs/person"}},
            },
            "required": ["age"],
            "additionalProperties": False,
        }
    },
}
NESTED_VALUES = [
    {"name": "ab", "owner": {"age": 3}},
    {"name": "ab", "tags": ["x", "y"], "owner": {"age": 150, "friends": [{"age": 1, "friends": []}]}, "kind": 3},
    {"name": "ab", "owner": {"age": 3}, "kind": "2024-02-29"},
    {"name": "Ab", "owner": {"age": 3}},
    {"name": "ab", "owner": {"age": 151}},
    {"name": "ab", "owner": {"age": 3, "x": 1}},
    {"name": "ab", "owner": {"age": 3, "friends": [{}]}},
    {"name": "ab", "tags": ["x", "x", "y", "y"], "owner": {"age": 3}},
    {"name": "ab", "owner": {"age": 3}, "kind": -1},
    {"name": "ab", "owner": {"age": 3}, "kind": "2023-02-29"},
    {"name": "ab"},
]


def test_certified_values_are_written_when_a_matcher_reaches_them(put_off_all):
    grammar, _ = schema_to_grammar(NESTED, lazy=True)
    assert {"schema:/properties/tags", "schema:/$defs/person", "schema:/properties/kind"} <= grammar.deferred
    assert grammar.write_later is not None
    m = Machine(build_pushdown(grammar, lazy=True))
    rules = len(m.pushdown.names)
    assert accepts(m, '{"name":"ab","owner":{"age":3}}')
    reached = len(m.pushdown.names)
    assert reached > rules  # the owner's rules were written, and joined the pushdown
    for value in NESTED_VALUES:
        assert accepts(m, dumps(value)) == valid(NESTED, value), value
    write_all(m.pushdown)  # nothing left that could fail later
    assert len(m.pushdown.names) > reached


def test_a_lazy_structure_masks_like_the_eager_one_on_the_gemma_vocabulary(gemma_tokenizer, gemma_vocab, put_off_all):
    lazy = compile_json_schema(NESTED, gemma_vocab)
    eager = compile_json_schema(NESTED, gemma_vocab, lazy=False)
    for value in NESTED_VALUES[:3]:
        a, b = lazy.matcher(), eager.matcher()
        for token in gemma_tokenizer.encode(dumps(value), add_special_tokens=False):
            assert (a.mask() == b.mask()).all()
            a.advance(token)
            b.advance(token)
        assert a.is_accepting() and b.is_accepting()


@pytest.mark.parametrize(
    "value",
    [
        {"type": "string", "minLength": 5, "maxLength": 2},  # unsatisfiable
        {"type": "string", "pattern": "^[a-z]{5}$", "maxLength": 3},  # lengths no text of the pattern has
        {"type": "string", "format": "regex", "maxLength": 5},  # a format refused, with lengths
        {"type": "string", "pattern": "[^\\s\\S]"},  # a pattern nothing matches
        {"type": "string", "pattern": "(?<=a)b"},  # a pattern refused
        {"type": "string", "format": "regex"},  # a format refused
        {"type": "integer", "minimum": 1.2, "maximum": 1.8},  # no integer between
        {"type": "integer", "multipleOf": 3},  # not in the certified set
        {"oneOf": [{"type": "integer"}, {"type": "number"}]},  # overlapping branches
        {"allOf": [{"type": "string", "pattern": "^a"}, {"pattern": "b$"}]},  # two parts constrain strings
        {"allOf": [{"type": "integer", "minimum": 1}, {"maximum": 9}]},  # two parts constrain numbers
        {"allOf": [{"$ref": "#/properties/v"}]},  # a conjunction with itself
        {"allOf": [{"type": "object"}, {"maxProperties": 1}]},  # a part not certified
        {"not": {"type": "string"}},
        {"type": "object", "dependencies": {"a": ["b"], "b": ["c"], "c": ["d"], "d": ["e"], "e": ["f"]}},  # five
        {"type": "object", "minProperties": 2},  # met by repeating an additional key: refused
        {"type": "object", "properties": {"a": {}}, "minProperties": 2, "additionalProperties": False},  # at most 1
        {"type": "object", "required": ["a"], "additionalProperties": False},  # a required name never allowed
        {"type": "object", "required": ["a"], "properties": {"a": {"$ref": "#/properties/v"}}},  # never completes
        {"enum": ["a"], "type": "integer"},  # no value of the type
        {"type": "array", "minItems": 3, "maxItems": 1},
        {"type": "array", "items": {"type": "string"}, "uniqueItems": True},
        {"$schema": "http://json-schema.org/draft-07/schema#", "type": "string"},
        {"type": "string", "maxLength": 100_000_000},
        {"type": "array", "items": {"type": "string"}, "maxItems": 10_000},  # more than MAX_CERTIFIED_ITEMS
        {"type": "number", "maximum": 1e21},  # past MAX_CERTIFIED_MAGNITUDE
        {"$ref": "#/properties/v"},  # a reference to itself
        {"anyOf": [{"$ref": "#/properties/v"}, {"type": "null"}]},  # a cycle without descending
        {"type": "object", "properties": {"\ud800": {"type": "string"}}},  # a name no UTF-8 text spells
        {"type": "object", "patternProperties": {"^a": {"type": "string"}, "b$": {"type": "integer"}}},  # two
        {"type": "object", "required": ["ab"], "patternProperties": {"^a": {"type": "integer"}}},  # a required match
        {"type": "object", "patternProperties": {"(?<=a)b": {}}},  # a pattern refused
        {"type": "object", "patternProperties": {"^a": {"not": {"type": "string"}}}},  # its value not certified
    ],
)
def test_what_lowering_could_refuse_or_find_empty_is_not_put_off(value, put_off_all):
    schema = {"type": "object", "properties": {"v": value}}
    assert not certified(schema, "/properties/v")
    assert _same_outcomes(schema, [{}, {"v": "abc"}, {"v": 1}, {"v": None}, {"v": {}}, {"v": {"a": None}}])


@pytest.mark.parametrize(
    "value",
    [
        {"type": "string"},
        {"type": "object"},
        {"type": ["array", "null"]},
        {"type": ["string", "null"], "maxLength": 4},
        {"type": "string", "pattern": "^[a-z]{2,5}$"},
        {"type": "string", "format": "date-time"},
        {"type": "string", "pattern": "^[a-z]+$", "maxLength": 3},  # the counted automaton's states walked now
        {"type": "string", "format": "date", "minLength": 10},
        {"type": "string", "format": "email", "minLength": 3, "pattern": "^x"},  # a format, a pattern and lengths
        {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
        {"type": "integer", "minimum": 1, "maximum": 1},
        {"type": "integer", "minimum": 0, "maximum": 18446744073709551615},  # 64-bit, 20 digits
        {"type": "array", "items": {"type": "string"}, "maxItems": 1000},
        {"enum": [1, "a", None]},
        {"const": {"k": [1, 2]}},
        {"anyOf": [{"type": "string"}, {"type": "null"}]},
        {"oneOf": [{"type": "string"}, {"type": "integer"}]},
        {"type": "array", "items": {"$ref": "#/properties/v"}},  # a recursion that descends
        {"type": "object", "properties": {"next": {"$ref": "#/properties/v"}}, "required": []},
        {"type": "object", "additionalProperties": {"type": "integer"}, "required": ["a"]},
        {"type": "object", "properties": {"id": {"type": "integer"}}, "minProperties": 1},
        {
            "type": "object",
            "properties": {"id": {}, "k": {}},
            "required": ["id"],
            "additionalProperties": False,
            "minProperties": 2,
        },
        {"type": "object", "properties": {"id": {"type": "integer"}}, "patternProperties": {"^x-": {"type": "string"}}},
        {"type": "object", "patternProperties": {"^[a-z]+$": {"type": "integer"}}, "additionalProperties": False},
        {"patternProperties": {"^k": {"type": "array", "items": {"type": "integer"}}}},
    ],
)
def test_certified_values_are_put_off(value, put_off_all):
    schema = {"type": "object", "properties": {"v": value}}
    assert certified(schema, "/properties/v")
    grammar, _ = schema_to_grammar(schema, lazy=True)
    # put off when it reaches another subschema; a leaf is cheaper to lower than to write later
    assert ("schema:/properties/v" in grammar.deferred) == (not value.keys().isdisjoint(deferral._REACHING))
    values = [{}, {"v": "abc"}, {"v": 1}, {"v": None}, {"v": {"k": [1, 2]}}, {"v": [[]]}, {"v": {"id": 1, "x-a": "s"}}]
    assert _same_outcomes(schema, [*values, {"v": {"x-a": 1}}, {"v": {"abc": 1}}, {"v": {"abc": "s", "A": 1}}])


def test_a_walk_that_meets_a_refused_subschema_stops_and_leaves_the_rest_to_later_walks():
    """The walk from ``v`` stops at the array of unique items: ``v`` and the property it passed through are refused
    at once; what it met besides is decided by a walk of its own, as a compile that asked for it first decides."""
    leaf = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    inner = {"type": "object", "properties": {"x": leaf, "y": {"type": "array", "uniqueItems": True}}}
    schema = {"type": "object", "properties": {"v": {"type": "object", "properties": {"a": leaf, "b": inner}}}}
    c = compiler(schema)
    c._certify("/properties/v")
    assert c._certified["/properties/v"] is False
    assert c._certified["/properties/v/properties/b"] is False
    assert c._certified["/properties/v/properties/b/properties/y"] is False
    for ptr in ("/properties/v/properties/a", "/properties/v/properties/b/properties/x"):
        assert ptr not in c._certified  # met, left undecided
        c._certify(ptr)
        assert c._certified[ptr] and c._productive[ptr] and certified(schema, ptr)


@pytest.mark.parametrize(
    ("root", "own", "put_off"),
    [
        ("http://json-schema.org/draft-04/schema", "http://json-schema.org/draft-04/schema#", True),  # same dialect
        ("http://json-schema.org/draft-07/schema#", "http://json-schema.org/draft-07/schema#", True),
        ("http://json-schema.org/draft-07/schema#", "http://json-schema.org/draft-04/schema#", False),  # another
        (None, "https://json-schema.org/draft/2020-12/schema", False),  # the root names none
    ],
)
def test_a_subschema_naming_the_roots_dialect_is_certified(root, own, put_off, put_off_all):
    """A bundled schema repeats its ``$schema`` in every definition: such a subschema is read in the root's
    dialect by jsonschema too, so it is certified as if the keyword were not there; another dialect is not."""
    person = {"$schema": own, "type": "object", "properties": {"age": {"type": "integer", "maximum": 150}}}
    schema = {"type": "object", "properties": {"v": person}, "required": ["v"]}
    if root is not None:
        schema["$schema"] = root
    assert certified(schema, "/properties/v") == put_off
    assert ("schema:/properties/v" in schema_to_grammar(schema, lazy=True)[0].deferred) == put_off
    assert _same_outcomes(schema, [{"v": {"age": 3}}, {"v": {"age": 151}}, {"v": {"age": "x"}}, {}])


TYPED = {"$defs": {"loop": {"type": "object", "properties": {"x": {"$ref": "#/$defs/loop"}}, "required": ["x"]}}}


@pytest.mark.parametrize(
    ("value", "put_off"),
    [
        ({"type": "object", "anyOf": [{"required": ["a"]}, {"required": ["b"]}]}, True),
        ({"type": "object", "oneOf": [{"type": "string"}, {"type": "object", "required": ["a"]}]}, True),
        ({"type": ["string", "null"], "anyOf": [{"enum": ["x"]}, {"minLength": 2}]}, True),
        ({"type": "number", "anyOf": [{"type": "integer", "minimum": 3}, {"$ref": "#/$defs/loop"}]}, True),
        ({"type": "object", "anyOf": [{"anyOf": [{"$ref": "#/$defs/loop"}, {"maxProperties": 1}]}]}, False),
        ({"type": "integer", "anyOf": [{"type": "string"}, {"type": "object"}]}, False),  # no branch of the type
        ({"type": "object", "anyOf": [{"$ref": "#/$defs/loop"}]}, False),  # the only branch never completes
        ({"type": "integer", "anyOf": [{"minimum": 1.2, "maximum": 1.8}]}, False),  # no integer shown to fit
        ({"type": "string", "anyOf": [{"enum": [1, 2]}]}, False),
    ],
)
def test_branches_beside_a_type_are_certified_as_that_types_values(value, put_off, put_off_all):
    """``{"type": T, "anyOf": [...]}`` holds when some branch holds for a value of type T: a branch that declares
    types among T, or declares none (its object or array keywords then decide); others are not counted on."""
    schema = {**TYPED, "type": "object", "properties": {"v": value}}
    assert certified(schema, "/properties/v") == put_off
    assert ("schema:/properties/v" in schema_to_grammar(schema, lazy=True)[0].deferred) == put_off
    values = [{}, {"v": {"a": 1}}, {"v": {"b": None}}, {"v": {}}, {"v": "x"}, {"v": "xy"}, {"v": None}, {"v": 3}]
    assert _same_outcomes(schema, [*values, {"v": 2}, {"v": 1.5}, {"v": {"a": "s"}}, {"v": {"x": {"x": 1}}}])


def test_the_keys_of_a_pattern_are_built_once_per_process(monkeypatch, put_off_all):
    """The certificate builds the keys of an object's patternProperties pattern beside its names; the lowering,
    a later compile of the same schema and another schema with the same object find them built."""
    strings._pattern_key.cache_clear()
    built = []
    build = strings._build_key
    monkeypatch.setattr(strings, "_build_key", lambda *args: built.append(args[:3]) or build(*args))
    value = {"type": "object", "properties": {"id": {"type": "integer"}}, "patternProperties": {"^x-": {}}}
    first = {"type": "object", "properties": {"v": value}}
    second = {"type": "object", "properties": {"w": value, "n": {"type": "integer"}}}
    for schema in (first, first, second):
        assert schema_to_grammar(schema, lazy=True)[0].deferred
        assert _same_outcomes(schema, [{"v": {"id": 1, "x-a": [2]}}, {"w": {"x-": None}}, {"v": {"y": 1}}])
    names = frozenset({"id"})
    assert sorted(built, key=repr) == [(("^x-",), frozenset(), names), (("^x-",), frozenset({"^x-"}), names)]


CONJUNCTIONS = {
    "$defs": {
        "ref": {
            "type": "object",
            "properties": {"id": {"type": "string"}, "kind": {"type": "string"}, "site": {"type": "string"}},
            "required": ["id"],
            "additionalProperties": False,
            "dependencies": {"site": {"properties": {"kind": {"enum": ["section"]}}}},
        },
        "tags": {"type": "array", "items": {"enum": ["x", "y", "z"]}, "maxItems": 2},
    }
}


@pytest.mark.parametrize(
    ("value", "productive"),
    [
        ({"allOf": [{"$ref": "#/$defs/ref"}, {"properties": {"kind": {"enum": ["site", "section"]}}}]}, True),
        ({"allOf": [{"$ref": "#/$defs/ref"}, {"required": ["kind", "site"]}]}, True),
        ({"allOf": [{"$ref": "#/$defs/tags"}, {"minItems": 1, "items": {"enum": ["y", "w"]}}]}, True),
        ({"allOf": [{"$ref": "#/$defs/ref"}, {"properties": {"id": {"enum": [1]}}}]}, False),  # no id left
        ({"allOf": [{"type": "string"}, {"type": "integer"}]}, False),  # no type left
        ({"allOf": [{"$ref": "#/$defs/ref"}, {"required": ["other"]}]}, False),  # a name never allowed
        ({"type": "object", "properties": {"a": {"type": "string"}, "b": {}}, "dependencies": {"a": ["b"]}}, True),
        ({"type": "object", "properties": {"a": {"not": {}}, "b": {"type": "integer"}}}, True),
        ({"type": "object", "properties": {"a": {"not": {}}}, "required": ["a"]}, False),
        ({"allOf": [{"$ref": "#/$defs/ref"}, {"minProperties": 2}]}, True),  # id and one more
        (
            {"type": "object", "properties": {"a": {"not": {}}}, "additionalProperties": False, "minProperties": 1},
            False,
        ),
        ({"properties": {"ab": {"type": "string"}}, "patternProperties": {"^a": {"minLength": 2}}}, True),
        ({"properties": {"ab": {"type": "string"}}, "patternProperties": {"^a": {"type": "integer"}}}, True),
        (
            {
                "type": "object",
                "oneOf": [
                    {"properties": {"m": {"enum": ["c"]}, "n": {"type": "string"}}, "additionalProperties": False},
                    {"properties": {"m": {"enum": ["r"]}, "id": {}}, "required": ["id"], "additionalProperties": False},
                ],
            },
            True,
        ),  # exclusive among objects only: lowered kind by kind
    ],
)
def test_conjunctions_are_certified_as_their_lowering_reads_them(value, productive, put_off_all):
    """``allOf``, dependencies, ``not`` of nothing, a property a pattern also matches and a ``oneOf`` exclusive
    kind by kind: their parts are merged as the lowering merges them, members and items as conjunctions of their
    own; one that holds for no value is certified as such (the lowering finds it empty, and drops the property)."""
    schema = {**CONJUNCTIONS, "type": "object", "properties": {"v": value}}
    c = compiler(schema)
    c._certify("/properties/v")
    assert c._certified["/properties/v"]
    assert c._productive["/properties/v"] == productive
    deferred = schema_to_grammar(schema, lazy=True)[0].deferred  # a rule named by the parts of v's conjunction
    assert any(name.startswith("schema:/properties/v") for name in deferred) == productive
    values = [{}, {"v": {"id": "a"}}, {"v": {"id": "a", "kind": "section", "site": "s"}}, {"v": {"id": "a", "w": 1}}]
    values += [{"v": {"id": "a", "kind": "site", "site": "s"}}, {"v": ["x"]}, {"v": []}, {"v": ["y"]}, {"v": "s"}]
    values += [{"v": {"a": "s", "b": 1}}, {"v": {"a": "s"}}, {"v": {"b": 1}}, {"v": {"ab": "s"}}, {"v": {"ab": "st"}}]
    values += [{"v": {"m": "c", "n": "s"}}, {"v": {"m": "r", "id": 1}}, {"v": {"id": 1}}, {"v": {"m": "c", "id": 1}}]
    assert _same_outcomes(schema, values)


@pytest.mark.parametrize(
    ("value", "productive"),
    [
        ({"type": "array", "items": [{"type": "string"}, {"type": "integer"}], "additionalItems": False}, True),
        ({"type": "array", "items": [{"type": "string"}], "additionalItems": {"type": "integer"}, "minItems": 3}, True),
        ({"type": "array", "items": [{"not": {}}, {"type": "string"}]}, True),  # the empty array
        ({"type": "array", "items": [{"type": "string"}, {"not": {}}], "minItems": 2}, False),  # no second item
        ({"type": "array", "items": [{"type": "string"}], "additionalItems": False, "minItems": 2}, False),
        ({"allOf": [{"items": [{"type": "string"}]}, {"type": "array", "items": {"minLength": 2}}]}, True),
        (
            {
                "allOf": [
                    {"type": "array", "items": [{"type": "string"}], "minItems": 1},
                    {"items": {"type": "integer"}},
                ]
            },
            False,
        ),
    ],
)
def test_item_lists_are_certified_position_by_position(value, productive, put_off_all):
    """A draft-07 ``items`` list (with ``additionalItems``): each position is the conjunction of what every part
    says of it, and the array holds when the positions ``minItems`` needs do."""
    schema = {"$schema": "http://json-schema.org/draft-07/schema#", "type": "object", "properties": {"v": value}}
    c = compiler(schema)
    c._certify("/properties/v")
    assert c._certified["/properties/v"]
    assert c._productive["/properties/v"] == productive
    deferred = schema_to_grammar(schema, lazy=True)[0].deferred
    assert any(name.startswith("schema:/properties/v") for name in deferred) == productive
    values = [{}, {"v": []}, {"v": ["a"]}, {"v": ["a", 1]}, {"v": ["a", 1, 2]}, {"v": ["a", "b"]}, {"v": [1]}]
    assert _same_outcomes(schema, [*values, {"v": ["ab"]}, {"v": ["ab", 3]}, {"v": ["ab", "cd", 3]}])


@pytest.mark.parametrize(
    ("value", "productive"),
    [
        ({"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}, True),
        ({"type": "object", "properties": {}, "required": ["a"]}, True),  # no properties named: open
        (
            {"type": "object", "allOf": [{"properties": {"a": {}}}, {"properties": {"b": {}}, "required": ["b"]}]},
            False,
        ),  # the first part allows no b
        (
            {
                "type": "object",
                "allOf": [{"properties": {"a": {}, "b": {}}}, {"properties": {"b": {"type": "integer"}}}],
            },
            True,
        ),
    ],
)
def test_objects_closed_by_default_are_certified_as_their_lowering_closes_them(value, productive, put_off_all):
    """With ``additional_properties_default=False``, a part that names properties and nothing about other keys
    allows no other name: a name another part requires has no value there."""
    schema = {"type": "object", "properties": {"v": value}}
    c = compiler(schema, ap_default=False)
    c._certify("/properties/v")
    assert c._certified["/properties/v"]
    assert c._productive["/properties/v"] == productive
    deferred = schema_to_grammar(schema, lazy=True, additional_properties_default=False)[0].deferred
    assert any(name.startswith("schema:/properties/v") for name in deferred) == productive
    values = [{}, {"v": {}}, {"v": {"a": "s"}}, {"v": {"b": 1}}, {"v": {"a": "s", "b": 1}}, {"v": {"c": 1}}]
    assert _same_outcomes(schema, [*values, {"v": {"b": "s"}}], additional_properties_default=False)


def test_a_property_a_pattern_matches_with_the_same_subschema_is_one_part():
    """A bundled schema often declares a property that its ``patternProperties`` pattern matches with the same
    subschema: the conjunction of the two is one part (the pattern's branches are not multiplied by the
    property's), so the value is put off whole. Equal texts at different base URIs are different subschemas."""
    branches = {"oneOf": [{"type": "integer"}, {"type": "string", "pattern": "^[a-z]+$"}]}
    value = {
        "type": "object",
        "properties": {"basic": {**branches, "title": "Basic"}},
        "patternProperties": {".*": branches},
    }
    c = compiler({"type": "object", "properties": {"v": value}})
    at = "/properties/v"
    assert c.normalise([_Part(f"{at}/properties/basic"), _Part(f"{at}/patternProperties/.*")]) == (
        _Part(f"{at}/properties/basic"),
    )
    assert _same_outcomes(
        {"type": "object", "properties": {"v": value}},
        [{"v": {"basic": 1}}, {"v": {"basic": "ab"}}, {"v": {"basic": "A"}}, {"v": {"other": 2}}, {"v": {"x": []}}],
    )
    listed = {"type": "array", "items": {"$ref": "n"}}  # the same text, whose reference each base resolves
    near = {"$id": "http://example.com/a/", "$defs": {"n": {"type": "integer"}}, "properties": {"x": listed}}
    far = {"$id": "http://example.com/b/", "$defs": {"n": {"type": "string"}}, "properties": {"x": listed}}
    c = compiler({"allOf": [near, far]})
    assert len(c.normalise([_Part("/allOf/0/properties/x"), _Part("/allOf/1/properties/x")])) == 2
    c = compiler({"allOf": [near, near]})
    assert len(c.normalise([_Part("/allOf/0/properties/x"), _Part("/allOf/1/properties/x")])) == 1


def _same_outcomes(schema, values, **options) -> bool:
    lazy, eager = outcome(schema, True, **options), outcome(schema, False, **options)
    if isinstance(eager, tuple) or isinstance(lazy, tuple):
        return lazy == eager
    for value in values:
        text = dumps(value)
        assert accepts(lazy, text) == accepts(eager, text), value
    write_all(lazy.pushdown)
    return True


def test_the_json_schema_test_suite_compiles_alike_lazy_and_eager(put_off_all):
    """Every group of the suite (draft 2020-12, optional tests included): the same refusal, or the same verdict
    on every test with every rule of the lazy grammar written afterwards. The oracle for a verdict is the eager
    compile (whose agreement with ``jsonschema`` the suite test pins)."""
    if not SUITE.is_dir():
        pytest.skip(f"the JSON Schema Test Suite is not at {SUITE}")
    groups = put_off = 0
    for path in sorted(glob.glob(str(SUITE / "**" / "*.json"), recursive=True)):
        for group in json.loads(Path(path).read_text()):
            schema = group["schema"]
            lazy, eager = outcome(schema, True), outcome(schema, False)
            assert isinstance(lazy, tuple) == isinstance(eager, tuple), (path, group["description"], lazy, eager)
            groups += 1
            if isinstance(eager, tuple):
                assert lazy == eager, (path, group["description"])
                continue
            for test in group["tests"]:
                for variant in _key_orders(test["data"]):
                    try:
                        text = dumps(variant)
                    except ValueError:
                        continue
                    assert accepts(lazy, text) == accepts(eager, text), (path, group["description"], text)
            write_all(lazy.pushdown)
            put_off += bool(schema_to_grammar(schema, lazy=True)[0].deferred)
    print(f"{groups} groups, {put_off} with rules put off")
    assert groups > 400 and put_off >= 5


def subschema_pointers(node, ptr=""):
    """The pointer of every object in ``node`` (some are not subschemas: a certificate must hold for those too)."""
    if isinstance(node, dict):
        yield ptr
        for key, value in node.items():
            yield from subschema_pointers(value, f"{ptr}/{key.replace('~', '~0').replace('/', '~1')}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from subschema_pointers(value, f"{ptr}/{i}")


def certified_lower_alone(schema, limit: int | None = None) -> int:
    """Lower every certified subschema of ``schema`` on its own, eagerly, in a compiler of its own: it must be
    neither refused nor unsatisfiable, and its rule must complete. Returns how many were certified."""
    try:
        c = compiler(schema)
    except JsonSchemaError:
        return 0
    pointers = list(subschema_pointers(schema))[1:]
    if limit is not None:
        pointers = random.Random(0).sample(pointers, min(limit, len(pointers)))
    certified = 0
    for ptr in pointers:
        try:
            if not c.deferrable(ptr):
                continue
        except JsonSchemaError:
            continue
        certified += 1
        alone = compiler(schema, lazy=False)
        alone.rules["root"] = alone.conj((_Part(ptr),), None)
        _finalize(alone.rules, "root", alone.library, alone.origins)
    return certified


def test_a_certified_subschema_lowers_alone_and_can_complete(put_off_all):
    """The certificate itself, on every object of every suite schema and of a sample of MaskBench's."""
    certified = 0
    for path in sorted(glob.glob(str(SUITE / "**" / "*.json"), recursive=True)):
        for group in json.loads(Path(path).read_text()):
            certified += certified_lower_alone(group["schema"])
    if DEV.exists():
        with gzip.open(DEV, "rt", encoding="utf-8") as f:
            lines = f.readlines()
        for line in random.Random(11).sample(lines, 300):
            certified += certified_lower_alone(json.loads(line)["schema"], limit=40)
    assert certified > 1000


def test_maskbench_schemas_compile_alike_and_write_every_rule_put_off(put_off_all):
    """A fixed sample of the dev set: the same refusals, and every rule put off written without an error (the
    certificate holds on real schemas); instances are compared in the golden test, which compiles lazily."""
    if not DEV.exists():
        pytest.skip(f"MaskBench is not at {DEV}")
    with gzip.open(DEV, "rt", encoding="utf-8") as f:
        lines = f.readlines()
    put_off = 0
    for line in random.Random(7).sample(lines, 500):
        schema = json.loads(line)["schema"]
        lazy, eager = outcome(schema, True), outcome(schema, False)
        if isinstance(eager, tuple) or isinstance(lazy, tuple):
            assert lazy == eager
            continue
        before = len(lazy.pushdown.names)
        write_all(lazy.pushdown)
        put_off += len(lazy.pushdown.names) > before
    print(f"{put_off} schemas with rules put off")
    assert put_off > 100


def _object(depth: int, width: int) -> dict:
    """An object schema ``depth`` levels deep, ``width`` properties a level."""
    if depth == 0:
        return {"type": "integer"}
    return {"type": "object", "properties": {f"p{i}": _object(depth - 1, width) for i in range(width)}}


def _containers(value) -> int:
    """The objects and arrays of a JSON value, as the compiler counts a schema's (``_Document.containers``)."""
    if isinstance(value, dict):
        return 1 + sum(_containers(v) for v in value.values())
    if isinstance(value, list):
        return 1 + sum(_containers(v) for v in value)
    return 0


def test_what_is_put_off_by_default_is_worth_it():
    """A value is put off when the schema has at least MIN_DEFERRING_NODES objects and arrays, at most
    MAX_DEFERRING_NODES, and its subschema reaches MIN_DEFERRED_SUBSCHEMAS subschemas."""
    big_value, small_value = _object(2, 3), {"type": "object", "properties": {"a": {"enum": [1]}}}
    assert 3 < MIN_DEFERRED_SUBSCHEMAS <= 13  # the big value reaches 13 subschemas, the small one 3
    filler = {f"f{i}": {"type": "array", "items": {"enum": [i]}} for i in range(MIN_DEFERRING_NODES)}
    schema = {"type": "object", "properties": {"big": big_value, "small": small_value, **filler}}
    deferred = schema_to_grammar(schema, lazy=True)[0].deferred
    assert deferred == {"schema:/properties/big"}
    few = {"type": "object", "properties": {"big": _object(2, 2)}}  # the value reaches 7 subschemas
    assert MIN_DEFERRED_SUBSCHEMAS <= 7
    assert _containers(few) < MIN_DEFERRING_NODES
    assert not schema_to_grammar(few, lazy=True)[0].deferred
    many = {"type": "object", "properties": {f"p{i}": big_value for i in range(MAX_DEFERRING_NODES // 10)}}
    grammar, _ = schema_to_grammar(many, lazy=True)
    assert not grammar.deferred and grammar.write_later is None


COSTLY = {
    "type": "object",
    "properties": {
        "email": {"type": "string", "format": "email", "maxLength": 80},
        "code": {"type": "string", "pattern": "^[A-Z]+-[0-9]+$", "minLength": 70, "maxLength": 90},
        "name": {"type": "string", "minLength": 1, "maxLength": 77},
        "short": {"type": "string", "pattern": "^[a-z]+$", "maxLength": 63},
        "long": {"type": "string", "maxLength": 100_000},
        "empty": {"type": "string", "pattern": "^(ab)+$", "minLength": 65, "maxLength": 65},
        "apart": {"type": "string", "format": "date", "pattern": "^x", "maxLength": 70},
        "both": {"type": "string", "format": "date", "pattern": "^2", "maxLength": 70},
        "more": {"type": "string", "pattern": "^[a-z]+$", "maxLength": 70, "enum": ["abc"]},
    },
    "additionalProperties": False,
}


def test_a_costly_string_is_written_when_a_matcher_reaches_it():
    """In a schema of any size, a string whose counted automaton (at least MIN_COSTLY_LENGTH characters) this
    process has not built yet is put off when lowering it gives one automaton that matches something: not one the
    lengths or a format leave empty, nor one with other keywords. Once a matcher wrote it, the process holds it,
    and the next compile lowers it at once."""
    assert strings.MIN_COSTLY_LENGTH == 64
    strings._STRING_AUTOMATA.clear()
    strings._counted_chars.cache_clear()
    costly = {f"schema:/properties/{name}" for name in ("email", "code", "name", "both")}
    assert schema_to_grammar(COSTLY, lazy=True)[0].deferred == costly
    assert not schema_to_grammar(COSTLY)[0].deferred
    lazy, eager = outcome(COSTLY, True), outcome(COSTLY, False)
    code = "AB-" + "1" * 67
    for value, ok in [
        ({"email": "a@b.co", "code": code, "name": "x" * 77}, True),
        ({"email": "a@b.co", "code": code + "1" * 21}, False),
        ({"email": "a" * 75 + "@b.co"}, True),
        ({"email": "a" * 76 + "@b.co"}, False),
        ({"name": ""}, False),
        ({"short": "a" * 63}, True),
        ({"empty": "ab"}, False),
        ({"apart": "x"}, False),
        ({"both": "2024-02-29"}, True),
        ({"both": "2023-02-29"}, False),
        ({"more": "abc"}, True),
        ({"more": "abd"}, False),
    ]:
        text = dumps(value)
        assert valid(COSTLY, value) == ok
        assert accepts(lazy, text) == accepts(eager, text) == ok, value
    assert schema_to_grammar(COSTLY, lazy=True)[0].deferred == set()  # built by the matchers above


def test_a_costly_string_put_off_is_walked_once_per_process(monkeypatch):
    """Deciding that a costly string may be put off walks its counted automaton; a later compile that meets the
    string again, still unwritten, reads that walk rather than walking again."""
    strings._STRING_AUTOMATA.clear()
    strings._WALKS.clear()
    strings._counted_chars.cache_clear()
    walked = []
    walk = strings._counted_walk
    monkeypatch.setattr(strings, "_counted_walk", lambda *args: walked.append(args[1:3]) or walk(*args))
    schema = {"type": "object", "properties": {"email": COSTLY["properties"]["email"]}}
    for _ in range(3):
        assert schema_to_grammar(schema, lazy=True)[0].deferred == {"schema:/properties/email"}
    assert walked == [(0, 80)]
    machine = outcome(schema, True)
    assert accepts(machine, dumps({"email": "a" * 75 + "@b.co"}))  # the string is folded from that walk
    assert not accepts(machine, dumps({"email": "a" * 76 + "@b.co"}))
    assert walked == [(0, 80)]


def test_a_rule_written_later_that_calls_nothing_is_a_lexical_piece():
    """Until it is written, a rule put off is taken for one that calls others; once written, a string's rule calls
    nothing, and the machine serves its states from the walks every structure shares (not a walk of the whole
    vocabulary at each of its states)."""
    strings._STRING_AUTOMATA.clear()
    strings._counted_chars.cache_clear()
    machine = outcome(COSTLY, True)
    rule = machine.pushdown.names.index("schema:/properties/email")
    assert machine.pushdown.calling[rule] and not machine.call_free[rule]
    assert machine.read(machine.start, b'{"email":"a@b')
    assert not machine.pushdown.calling[rule] and machine.call_free[rule]


def test_lenient_mode_and_the_default_of_schema_to_grammar_lower_everything(put_off_all):
    schema = {"type": "object", "properties": {"a": {"type": "object", "properties": {"b": {"type": "string"}}}}}
    assert not schema_to_grammar(schema)[0].deferred
    assert not schema_to_grammar(schema, lazy=True, strict=False)[0].deferred
    assert schema_to_grammar(schema, lazy=True)[0].deferred


def test_writing_rules_later_leaves_no_reference_cycles_behind(put_off_all):
    schemas = [NESTED, {"type": "array", "items": {"type": "object", "properties": {"a": {"type": "integer"}}}}]

    def run():
        for schema in schemas:
            write_all(build_pushdown(schema_to_grammar(schema, lazy=True)[0], lazy=True))

    ours = cyclic_garbage(run)
    assert not ours, ours[:5]


def test_property_order_any_lowers_everything(put_off_all):
    """Its budget of states per schema must serve the same objects whatever a matcher reads first."""
    schema = {"type": "object", "properties": {"a": _object(2, 3), "b": _object(2, 3)}}
    assert schema_to_grammar(schema, lazy=True)[0].deferred
    assert not schema_to_grammar(schema, lazy=True, property_order="any")[0].deferred


def test_a_structure_dropped_with_rules_still_put_off_leaves_no_reference_cycles(put_off_all):
    """Most rules put off are never written: the compiler that would write them goes with its structure, freed by
    reference counting rather than left, with everything it holds, for a collection of the cyclic collector."""
    schemas = [NESTED, {"type": "array", "items": {"type": "object", "properties": {"a": {"type": "integer"}}}}]

    def run():
        for schema in schemas:
            grammar = schema_to_grammar(schema, lazy=True)[0]
            assert grammar.deferred
            Machine(build_pushdown(grammar, lazy=True))

    ours = cyclic_garbage(run)
    assert not ours, ours[:5]


def test_objects_read_in_any_order_leave_no_reference_cycles():
    """``property_order="any"``: the one rule of a small object's sets of names read, and the rules of a larger
    one's sets written when a text reaches them, close no cycle through the compiler, whether or not they were
    written before the structure is dropped."""
    small = {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(3)}, "required": ["p0"]}
    large = {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(12)}}

    def run():
        assert not schema_to_grammar(small, lazy=True, property_order="any")[0].deferred
        for text in (None, '{"p3":1,"p0":2}'):
            grammar = schema_to_grammar(large, lazy=True, property_order="any")[0]
            assert grammar.deferred
            machine = Machine(build_pushdown(grammar, lazy=True))
            if text is not None:
                assert accepts(machine, text)

    ours = cyclic_garbage(run)
    assert not ours, ours[:5]


def test_a_rule_that_cannot_be_written_fails_the_same_way_each_time(put_off_all):
    """A certificate that failed (here: a rule put off pointed at a string no value satisfies) is refused at the
    step that reaches it, with the pointer, and again the same way if asked for again."""
    never = {"type": "string", "minLength": 3, "maxLength": 1}
    schema = {"type": "object", "properties": {"a": _object(2, 3)}, "$defs": {"never": never}}
    grammar, _ = schema_to_grammar(schema, lazy=True)
    (name,) = grammar.deferred
    writer = grammar.write_later.__self__
    writer.deferred[name] = ("/$defs/never", operator.methodcaller("body", (_Part("/$defs/never"),), None, name))
    machine = Machine(build_pushdown(grammar, lazy=True))
    for _ in range(2):
        with pytest.raises(JsonSchemaError) as caught:
            accepts(machine, '{"a":{}}')
        assert caught.value.pointer.startswith("/$defs/never/") and "unsatisfiable" in caught.value.reason


def test_a_pattern_is_certified_without_writing_its_escapes(monkeypatch, put_off_all):
    """The certificate decides a pattern alone on its text automaton: the JSON strings' automaton (escapes
    written) is built when a matcher first reaches the value, unless the text automaton is large enough that the
    bound on it could be passed; then it is built now, and a value whose automaton passes it is lowered (and
    refused) at once."""
    built = []
    json_string_dfa = strings._json_string_dfa
    monkeypatch.setattr(strings, "_json_string_dfa", lambda text: built.append(text) or json_string_dfa(text))
    strings._STRING_AUTOMATA.clear()
    code = {"type": "string", "pattern": "^[A-Z]{3}-[0-9]+$"}
    schema = {"type": "object", "properties": {"item": {"type": "object", "properties": {"code": code}}}}
    assert schema_to_grammar(schema, lazy=True)[0].deferred == {"schema:/properties/item"}
    assert built == []
    machine = outcome(schema, True)
    assert accepts(machine, dumps({"item": {"code": "ABC-12"}}))
    assert not accepts(machine, dumps({"item": {"code": "AB-12"}}))
    assert len(built) == 1
    strings._STRING_AUTOMATA.clear()
    monkeypatch.setattr(strings, "MAX_BYTE_STATES", 20)  # 7 x the text automaton's 6 states + 2 is past it
    assert schema_to_grammar(schema, lazy=True)[0].deferred == {"schema:/properties/item"}
    assert len(built) == 2
    strings._STRING_AUTOMATA.clear()
    monkeypatch.setattr(strings, "MAX_BYTE_STATES", 7)  # its JSON strings' automaton has 8 states: too large
    with pytest.raises(JsonSchemaError) as refused:  # lowered now, so refused at compile time
        schema_to_grammar(schema, lazy=True)
    assert refused.value.pointer == "/properties/item/properties/code/pattern"


def test_the_json_strings_of_a_text_automaton_stay_within_the_certificate_s_bound():
    """The bound the certificate reads a pattern's size by (:func:`strings._string_holds`) holds for every
    pattern of the dev set that compiles."""
    patterns = set()
    with gzip.open(DEV, "rt") as f:
        for line in f:
            stack = [json.loads(line)["schema"]]
            while stack:
                node = stack.pop()
                if isinstance(node, dict):
                    if isinstance(node.get("pattern"), str):
                        patterns.add(node["pattern"])
                    stack.extend(node.values())
                elif isinstance(node, list):
                    stack.extend(node)
    checked = 0
    for pattern in sorted(patterns):
        try:
            text = strings._search_text(pattern)
        except Exception:
            continue
        if text is not None:
            bound = strings._JSON_STATES_PER_TEXT_STATE * text.num_states + 2
            assert strings._json_string_dfa(text).num_states <= bound, pattern
            checked += 1
    assert checked > 900


def test_on_cycles_finds_the_nodes_on_cycles_only():
    """A self-loop and a two-node cycle are found; a node that only leads into a cycle, or is led to from one,
    is not; a graph without a cycle gives none."""
    graph = {"a": ["a"], "b": ["c"], "c": ["b", "d"], "d": [], "e": ["b", "x"], "f": ["e"]}
    assert _on_cycles(graph) == {"a", "b", "c"}
    assert _on_cycles({"a": ["b"], "b": ["c", "d"], "c": ["d"]}) == set()
