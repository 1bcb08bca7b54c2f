"""JSON Schema -> grammar IR: membership against jsonschema, errors, relaxations, layouts, the official test
suite, random schemas (hypothesis) and a few end-to-end runs on the Gemma vocabulary."""

from __future__ import annotations

import collections
import gc
import glob
import inspect
import itertools
import json
import os
import random
import re
from decimal import Decimal
from pathlib import Path

import jsonschema
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from constrain.compilers.json_schema import compile_json_schema, schema_to_grammar
from constrain.compilers.json_schema.cdfa import _CDFA
from constrain.compilers.json_schema.counted import _counted_chars
from constrain.compilers.json_schema.numbers import _decimal_range, _int_range
from constrain.compilers.json_schema.values import _CHAR, _canonical_value
from constrain.errors import JsonSchemaError, StructureError
from constrain.grammar.ir import Automaton, Literal, Regex, Repeat, Seq, calls_of
from constrain.grammar.rules import _build_rule_dfa, build_pushdown
from constrain.runtime.pushdown import Machine
from tests.shared_data import JSON_SCHEMA_TEST_SUITE

SUITE = JSON_SCHEMA_TEST_SUITE / "draft2020-12"

_MACHINES: dict[str, tuple[Machine, list[str]]] = {}


def machine(schema, **options) -> Machine:
    key = json.dumps([schema, options], sort_keys=True)
    if key not in _MACHINES:
        grammar, notes = schema_to_grammar(schema, **options)
        _MACHINES[key] = (Machine(build_pushdown(grammar)), notes)
    return _MACHINES[key][0]


def dumps(value) -> str:
    """Compact JSON in the grammar's canonical form: integral numbers as integers, other numbers in plain decimal
    notation (``1e-07`` as ``0.0000001``), keys in the given order."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, (int, float)):
        value = _canonical_value(value)
        return str(value) if isinstance(value, int) else format(Decimal(repr(value)), "f")
    if isinstance(value, dict):
        return "{" + ",".join(json.dumps(k, ensure_ascii=False) + ":" + dumps(v) for k, v in value.items()) + "}"
    return "[" + ",".join(dumps(v) for v in value) + "]"


def accepts(m: Machine, text: str) -> bool:
    configs = m.read(m.start, text.encode())
    return bool(configs) and m.can_end(configs)


def valid(schema, value) -> bool:
    cls = jsonschema.validators.validator_for(schema)
    return cls(schema, format_checker=cls.FORMAT_CHECKER).is_valid(value)


def check(schema, instances, **options):
    """Acceptance of each instance's compact serialisation equals its validity."""
    m = machine(schema, **options)
    for value in instances:
        assert accepts(m, dumps(value)) == valid(schema, value), (schema, value, valid(schema, value))


# -- membership, keyword by keyword --------------------------------------------------------------------------

CASES = [
    ({"type": "integer", "minimum": 3, "maximum": 17}, [3, 10, 17, 2, 18, -3, 3.5, "3", None, 0]),
    ({"type": "integer", "exclusiveMinimum": -5, "exclusiveMaximum": 120}, [-5, -4, 0, 119, 120, 1000, -100]),
    ({"type": "number", "minimum": -1.5, "maximum": 2.25}, [-1.5, -1.51, -1, 0, 0.5, 2.25, 2.2500001, 3, 1e-7]),
    ({"type": "number", "exclusiveMinimum": 0, "maximum": 1}, [0, 0.0001, 0.5, 1, 1.01, -0.5]),
    ({"type": "integer", "multipleOf": 7}, [0, 7, -14, 700, 1, 13, 7.5]),
    ({"type": "integer", "multipleOf": 5, "minimum": 12, "maximum": 1000}, [10, 15, 20, 995, 1000, 1005, 13]),
    ({"type": "number", "multipleOf": 0.25, "minimum": 0}, [0, 0.25, 0.5, 1, 2.75, 0.3, -0.25, 10]),
    ({"type": "integer", "multipleOf": 37}, [0, 37, -74, 37 * 123456789012, 37 * 123456789012 + 1, 36]),
    ({"type": "integer", "not": {"multipleOf": 3}}, [0, 1, 2, 3, 6, -7, 9, 10]),
    ({"type": "number", "multipleOf": 0.5, "not": {"multipleOf": 1}}, [0.5, 1, 1.5, 2, -2.5, 0.25]),
    ({"type": "string", "minLength": 2, "maxLength": 4}, ["", "a", "ab", "abcd", "abcde", "é😀", '"\\', "\n\t\u0001"]),
    ({"type": "string", "maxLength": 300, "minLength": 290}, ["a" * 289, "a" * 290, "é" * 300, "a" * 301, "\n" * 295]),
    ({"type": "string", "pattern": "^[a-z]+[0-9]?$"}, ["abc", "abc1", "ABC", "", "abc12", "a"]),
    ({"type": "string", "pattern": "ab"}, ["xaby", "ab", "a", 'x"ab', "a\nb", "\\ab"]),
    ({"type": "string", "pattern": "^a.c$"}, ["abc", 'a"c', "a\\c", "a\nc", "ac", "a\u0001c"]),
    ({"type": "string", "pattern": "^[a-z]+$", "minLength": 2, "maxLength": 3}, ["a", "ab", "abc", "abcd", "A1"]),
    (
        {"type": "string", "pattern": "^([a-z0-9-]+):([a-z0-9.-]+):([a-z0-9-]*):([a-z0-9-]+)$", "maxLength": 146},
        ["a:b::c", "a:b:c:d", "a" * 140 + ":b::c", "a" * 142 + ":b::c", "a:b:c", "A:b::c"],
    ),
    (
        {"type": "string", "pattern": "^\\S+@\\S+$", "minLength": 5, "maxLength": 255},
        ["a@b", "ab@cd", "a" * 120 + "@" + "b" * 134, "a" * 120 + "@" + "b" * 135, "a b@c", 'é"@\\'],
    ),
    ({"type": "string", "format": "date"}, ["2024-02-29", "2023-02-29", "2000-02-29", "1900-02-29", "2023-04-31", "x"]),
    ({"type": "string", "format": "ipv4"}, ["1.2.3.4", "255.255.255.255", "256.1.1.1", "01.1.1.1", "1.2.3"]),
    (
        {"type": "string", "format": "uuid"},
        ["123e4567-e89b-12d3-a456-426614174000", "123e4567e89b12d3a456426614174000"],
    ),
    (
        {"enum": [1, "a", None, [1, {"x": True}], {"k": [1.5]}]},
        [1, 1.0, "a", None, [1, {"x": True}], {"k": [1.5]}, 2, True],
    ),
    ({"const": {"b": 1, "a": [2]}}, [{"b": 1, "a": [2]}, {"b": 1}]),
    ({"type": ["string", "null"], "enum": ["a", None, 3]}, ["a", None, 3]),
    ({"not": {"type": "string"}}, [1, None, [], {}, "a", True]),
    ({"not": {"enum": [1, "x", None]}}, [1, 2, "x", "y", None, False]),
    ({"type": "integer", "not": {"const": 5}, "minimum": 0, "maximum": 10}, [0, 4, 5, 6, 10, 11]),
    ({"not": {"minimum": 3}}, [2, 3, 2.99, "x", None]),
    ({"anyOf": [{"type": "string", "maxLength": 2}, {"type": "integer", "minimum": 10}]}, ["ab", "abc", 10, 9, None]),
    ({"oneOf": [{"type": "string"}, {"type": "integer"}]}, ["a", 1, 1.5, None]),
    ({"oneOf": [{"minimum": 5}, {"maximum": 10}]}, [1, 5, 7, 10, 12, "x"]),
    ({"oneOf": [{"type": "string"}, {"pattern": "^a"}]}, ["abc", "bcd", 1, None]),
    (
        {
            "oneOf": [
                {"properties": {"kind": {"const": "a"}, "x": {"type": "integer"}}, "required": ["kind"]},
                {"properties": {"kind": {"const": "b"}, "y": {"type": "string"}}, "required": ["kind"]},
            ],
            "type": "object",
        },
        [{"kind": "a", "x": 1}, {"kind": "b", "y": "s"}, {"kind": "c"}, {"kind": "a", "x": "s"}, {}],
    ),
    (
        {
            "allOf": [
                {"type": "object", "properties": {"a": {"type": "integer"}}},
                {"properties": {"a": {"minimum": 5}}, "required": ["a"]},
            ]
        },
        [{"a": 5}, {"a": 4}, {}, {"a": 5.5}, 3],
    ),
    (
        {"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "integer"}}, "required": ["b"]},
        [
            {"b": 1},
            {"a": "x", "b": 2},
            {"a": "x"},
            {"b": "x"},
            {"a": "x", "b": 2, "c": [1, {"d": None}]},
            {"b": 1, 'é"': 2},
        ],
    ),
    ({"type": "object", "properties": {"a": {}}, "additionalProperties": False}, [{}, {"a": 1}, {"b": 1}]),
    (
        {"type": "object", "additionalProperties": {"type": "integer"}, "minProperties": 1, "maxProperties": 2},
        [{}, {"a": 1}, {"a": 1, "b": 2}, {"a": 1, "b": 2, "c": 3}, {"a": "x"}],
    ),
    (
        {
            "type": "object",
            "properties": {"a": {}, "b": {}, "c": {}},
            "additionalProperties": False,
            "minProperties": 2,
        },
        [{"a": 1}, {"a": 1, "c": 2}, {"b": 1, "c": 1}, {}, {"a": 1, "b": 1, "c": 1}],
    ),
    (
        {
            "type": "object",
            "patternProperties": {"^x": {"type": "integer"}, "y$": {"type": "integer", "minimum": 0}},
            "additionalProperties": {"type": "string"},
        },
        [{"x1": 1, "zy": 2, "q": "s"}, {"xy": -1}, {"xy": 1}, {"q": 1}, {"x": "s"}, {}],
    ),
    (
        {"type": "object", "propertyNames": {"pattern": "^[a-z]+$", "maxLength": 3}},
        [{"ab": 1}, {"abcd": 1}, {"A": 1}, {}],
    ),
    ({"type": "object", "propertyNames": {"enum": ["foo", "bar"]}}, [{"foo": 1}, {"foo": 1, "bar": 2}, {"baz": 1}]),
    (
        {"type": "object", "properties": {"a": {}, "b": {}}, "dependentRequired": {"a": ["b"]}},
        [{"a": 1, "b": 2}, {"b": 1}, {}, {"a": 1}],
    ),
    (
        {
            "type": "object",
            "properties": {"a": {}, "b": {}},
            "dependentSchemas": {"a": {"properties": {"b": {"type": "string"}}}},
        },
        [{"a": 1, "b": "s"}, {"a": 1, "b": 2}, {"b": 2}, {"a": 1}],
    ),
    (
        {
            "if": {"properties": {"k": {"const": "x"}}, "required": ["k"]},
            "then": {"required": ["v"]},
            "else": {"type": "object"},
            "properties": {"k": {}, "v": {}},
        },
        [{"k": "x", "v": 1}, {"k": "y"}, 3, {"k": "x"}, "s", {}],
    ),
    (
        {"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 3},
        [[], [1], [1, 2, 3], [1, 2, 3, 4], ["a"], [1, "a"]],
    ),
    (
        {"type": "array", "prefixItems": [{"type": "string"}, {"type": "integer"}], "items": False},
        [[], ["a"], ["a", 1], [1], ["a", 1, 2]],
    ),
    (
        {"type": "array", "prefixItems": [{"type": "string"}], "items": {"type": "null"}, "minItems": 2},
        [["a"], ["a", None], ["a", None, 1], []],
    ),
    (
        {"type": "array", "contains": {"const": 5}, "maxContains": 2, "items": {"type": "integer"}},
        [[5], [1, 5, 5], [], [1], [5, 5, 5]],
    ),
    (
        {"type": "array", "contains": {"type": "string"}, "minContains": 2, "maxItems": 4},
        [["a", "b"], [1, "a", 2, "b"], ["a"], ["a", "b", 1, 2, 3]],
    ),
    ({"type": "array", "uniqueItems": True, "maxItems": 1}, [[], [1], [1, 1]]),
    (
        {"type": "array", "items": {"enum": ["a", "b", 1, 1.0, None]}, "uniqueItems": True, "minItems": 1},
        [[], ["a"], ["a", "b"], ["a", "a"], [1, None, "b", "a"], [1, 1.0], ["b", 1, "a", None, "b"], ["c"]],
    ),
    ({"type": "string", "pattern": "^dev|alpha|stable$"}, ["dev", "xdev", "alphax", "xstable", "stablex", "x"]),
    (True, [1, "a", None, [], {"a": [1]}]),
    (
        {
            "$defs": {
                "n": {
                    "type": "object",
                    "properties": {"v": {"type": "integer"}, "next": {"$ref": "#/$defs/n"}},
                    "required": ["v"],
                    "additionalProperties": False,
                }
            },
            "$ref": "#/$defs/n",
        },
        [{"v": 1}, {"v": 1, "next": {"v": 2, "next": {"v": 3}}}, {"v": 1, "next": {}}, {"v": 1, "x": 2}],
    ),
    (
        {
            "$defs": {"a~b": {"type": "integer"}, "c/d": {"type": "string"}, "e%f": {"type": "null"}},
            "properties": {
                "x": {"$ref": "#/$defs/a~0b"},
                "y": {"$ref": "#/$defs/c~1d"},
                "z": {"$ref": "#/$defs/e%25f"},
            },
        },
        [{"x": 1, "y": "s", "z": None}, {"x": "s"}, {"y": 1}, {"z": 0}],
    ),
    (
        {
            "$id": "http://example.com/root.json",
            "$defs": {"a": {"$id": "a.json", "type": "integer"}, "b": {"$anchor": "bee", "type": "string"}},
            "properties": {"x": {"$ref": "a.json"}, "y": {"$ref": "#bee"}},
        },
        [{"x": 1, "y": "s"}, {"x": "s"}, {"y": 1}],
    ),
    (  # one relative reference, two base URIs: each resolves where it stands (and again to the same place)
        {
            "$id": "http://example.com/root.json",
            "properties": {
                "p": {"$id": "one/", "$defs": {"i": {"$id": "item.json", "type": "integer"}}, "$ref": "item.json"},
                "q": {"$id": "two/", "$defs": {"i": {"$id": "item.json", "type": "string"}}, "$ref": "item.json"},
                "r": {"$ref": "one/item.json"},
                "s": {"$ref": "two/item.json"},
                "t": {"items": {"$ref": "one/item.json"}},
            },
        },
        [{"p": 1, "q": "s", "r": 2, "s": "t", "t": [3]}, {"p": "s"}, {"q": 1}, {"r": "s"}, {"s": 1}, {"t": ["a"]}],
    ),
    (
        {
            "$schema": "http://json-schema.org/draft-07/schema#",
            "definitions": {"s": {"type": "string"}},
            "type": "array",
            "items": [{"$ref": "#/definitions/s"}, {"type": "integer"}],
            "additionalItems": False,
        },
        [["a", 1], ["a"], ["a", 1, 2], [1]],
    ),
    (
        {
            "$schema": "http://json-schema.org/draft-07/schema#",
            "properties": {"a": {"$ref": "#/definitions/i", "type": "string"}},
            "definitions": {"i": {"type": "integer"}},
        },
        [{"a": 1}, {"a": "s"}],
    ),
    (
        {
            "$schema": "http://json-schema.org/draft-04/schema#",
            "type": "number",
            "minimum": 1,
            "exclusiveMinimum": True,
            "maximum": 3,
        },
        [1, 1.5, 3, 3.5],
    ),
    (
        {
            "type": "object",
            "properties": {"a": {"type": "integer"}},
            "unevaluatedProperties": False,
            "anyOf": [{"properties": {"b": {"type": "string"}}}, {"properties": {"c": {"type": "null"}}}],
        },
        [
            {"a": 1},
            {"a": 1, "b": "s"},
            {"a": 1, "c": None},
            {"a": 1, "b": "s", "c": None},
            {"a": 1, "d": 1},
            {"a": 1, "b": 1},
        ],
    ),
    (
        {
            "type": "array",
            "prefixItems": [{"type": "string"}],
            "allOf": [{"prefixItems": [True, {"type": "integer"}]}],
            "unevaluatedItems": False,
        },
        [["a"], ["a", 1], ["a", 1, 2], []],
    ),
]


@pytest.mark.parametrize("schema,instances", CASES, ids=[json.dumps(c[0])[:60] for c in CASES])
def test_acceptance_equals_validity(schema, instances):
    check(schema, instances)


def test_a_value_of_a_few_literals_is_read_in_place_and_a_long_enum_keeps_its_rule():
    long_enum = [f"value-{i:03d}" for i in range(40)]
    schema = {
        "type": "object",
        "properties": {"a": {"enum": ["x", "y"]}, "b": {"const": 1}, "c": {"enum": long_enum}},
        "required": ["a"],
    }
    grammar, _ = schema_to_grammar(schema)
    own = [name.rsplit("/", 1)[-1] for name in grammar.rules if name.startswith("schema:/properties/")]
    assert own == ["c"]
    check(schema, [{"a": "x", "b": 1}, {"a": "y", "c": "value-039"}, {"a": "z"}, {"a": "x", "b": 2}, {"b": 1},
                   {"a": "y", "b": 1, "c": "value-040"}, {"a": "x", "d": None}])  # fmt: skip


def test_arrays_of_plain_items_share_one_rule_per_kind():
    tags = {"type": "array", "items": {"type": "string", "description": "a tag"}, "title": "tags"}
    schema = {
        "type": "object",
        "properties": {
            "a": tags,
            "b": {"type": "array", "items": {"type": "string"}},
            "c": {"type": "array", "items": {"type": ["integer", "null"]}},
            "d": {"type": "array", "items": {"type": "string"}, "maxItems": 1},
        },
    }
    grammar, _ = schema_to_grammar(schema)
    assert sorted(name for name in grammar.rules if name.startswith("type:array")) == [
        "type:array of integer|null", "type:array of string"
    ]  # fmt: skip
    assert [name.rsplit("/", 1)[-1] for name in grammar.rules if name.startswith("schema:/properties/")] == ["d"]
    check(schema, [{"a": [], "b": ["x", "y"]}, {"a": [1]}, {"c": [1, None, 2]}, {"c": ["1"]}, {"d": ["x", "y"]},
                   {"a": ["p", "q"], "d": ["x"]}])  # fmt: skip


def test_the_keys_other_than_an_objects_names_are_built_when_a_matcher_first_reads_one(gemma_tokenizer, gemma_vocab):
    schema = {
        "type": "object",
        "properties": {"id": {"type": "integer"}, "tag": {"type": "string"}},
        "required": ["id"],
    }
    structure = compile_json_schema(schema, gemma_vocab)
    keys = structure.pushdown.names.index('json_key_except:"id","tag"')
    assert not structure.pushdown.is_built(keys)
    matcher = structure.matcher()
    for token in gemma_tokenizer.encode('{"id":7,"tagged":"x"}', add_special_tokens=False):
        assert matcher.mask()[token >> 5] >> (token & 31) & 1
        matcher.advance(token)
    assert matcher.is_accepting() and structure.pushdown.is_built(keys)
    # a lowering that is not lazy builds it at once, and so does a lazy one past the bound on its states, whose
    # refusal must come at compile time
    assert schema_to_grammar(schema)[0].rules['json_key_except:"id","tag"'].built
    many = {f"{i:05d}" + "x" * 2000: {} for i in range(30)}
    lazy, _ = schema_to_grammar({"type": "object", "properties": many}, lazy=True)
    assert next(body for name, body in lazy.rules.items() if name.startswith("json_key_except:")).built


def test_draft07_spellings_without_a_declared_dialect():
    """No $schema: 2020-12 plus the draft-07 spellings (dependencies, items as a list with additionalItems)."""
    draft7 = jsonschema.Draft7Validator
    for schema, instances in [
        (
            {"type": "object", "properties": {"a": {}}, "dependencies": {"a": ["b"], "c": {"required": ["d"]}}},
            [{"a": 1, "b": 1}, {"a": 1}, {"b": 2}, {"c": 1}, {"c": 1, "d": 1}],
        ),
        (
            {"type": "array", "items": [{"type": "string"}], "additionalItems": {"type": "integer"}},
            [["a", 1], ["a", "b"], [1]],
        ),
    ]:
        m = machine(schema)
        for value in instances:
            assert accepts(m, dumps(value)) == draft7(schema).is_valid(value), (schema, value)


@pytest.mark.parametrize(
    "schema,names",
    [
        ({"$schema": "x", "$id": "http://x/", "properties": {"id": {"type": "string"}}}, False),  # the root's own
        ({"properties": {"a": {"$id": "http://x/a"}}}, True),
        ({"properties": {"a": {"$anchor": "a"}}}, True),
        ({"$dynamicAnchor": "meta"}, True),
        ({"$defs": {"b": {"id": "b.json"}}}, True),  # draft-04 spelling
        ({"description": 'a "id": "x" in the text', "enum": [{"id": "x"}]}, False),  # text and data, not keys
        ({"properties": {"$schema": {"type": "string"}}}, False),  # a property named $schema
        ({"$defs": {"d": {"$schema": "http://json-schema.org/draft-07/schema#"}}}, True),  # an embedded dialect
    ],
)
def test_a_document_crawled_for_resources_only_when_an_object_below_the_root_may_name_one(schema, names):
    """The quick look of the walk that counts containers answers for most schemas (nothing may name a resource);
    the walk of the schema's objects decides the rest. The quick look never misses one."""
    from constrain.compilers.json_schema.document import _Document, _json_containers, _names_resources

    assert _names_resources(schema) is names
    _, may_name = _json_containers(schema)
    assert may_name or not names
    if schema == {"$schema": "x", "$id": "http://x/", "properties": {"id": {"type": "string"}}}:
        assert not may_name  # the root's own ids and a property named "id": no walk
    if "$schema" not in schema:
        assert _Document(schema).names_resources is names


def test_a_document_with_ids_is_crawled_only_when_a_reference_or_a_validation_needs_it():
    """References that are JSON pointers into the root resource, and enum values checked without jsonschema,
    need no registry; a reference by id, or a check only jsonschema can make, crawls the document then."""
    from constrain.compilers.json_schema.compiler import _Compiler

    defs = {"a": {"$id": "http://x/a.json", "type": "integer"}, "c": {"enum": ["x", "y"], "type": "string"}}
    by_pointer = {"$defs": defs, "properties": {"p": {"$ref": "#/$defs/a"}, "q": {"$ref": "#/$defs/c"}}}
    by_id = {"$defs": defs, "properties": {"p": {"$ref": "http://x/a.json"}}}
    by_validation = {"$defs": defs, "properties": {"q": {"enum": ["x", 1], "pattern": "^x"}}}
    for schema, crawled in ((by_pointer, False), (by_id, True), (by_validation, True)):
        compiler = _Compiler(schema, True, "compact", True, 20)
        compiler.compile()
        assert compiler.doc.names_resources
        assert ("registry" in compiler.doc.__dict__) is crawled
    check(by_pointer, [{"p": 1, "q": "y"}, {"p": "x"}, {"q": "z"}])
    check(by_id, [{"p": 1}, {"p": "x"}])


def test_draft04_ids_resolve_where_referencing_expects_string_ids():
    """referencing reads a draft-04 ``id`` as the string of a JSON object. A JSON pointer walked through ``items``
    asked for the ``id`` of a ``properties`` object, here a property's schema (the enum, checked by jsonschema
    through that pointer, was refused as "cannot evaluate"); an embedded draft-04 subschema's boolean subschema
    crashed the crawl with a TypeError (MaskBench JsonSchemaStore---config.json), and so did a property
    dependency (a list) after a schema dependency, which the crawl took for a subschema too."""
    draft4, draft7 = "http://json-schema.org/draft-04/schema#", "http://json-schema.org/draft-07/schema#"
    check(
        {
            "$schema": draft4,
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"id": {"type": "string"}, "kind": {"enum": ["a", "bb", 3], "minLength": 2}},
            },
        },
        [[{"id": "x", "kind": "bb"}], [{"kind": "a"}], [{"kind": 3}], [{"id": 1}]],
    )
    check(
        {
            "$schema": draft7,
            "type": "object",
            "properties": {
                "a": {"$schema": draft4, "type": "object", "properties": {"b": True}, "additionalProperties": False}
            },
        },
        [{"a": {"b": 1}}, {"a": {"c": 1}}, {"a": 1}],
    )
    check(
        {"$schema": draft7, "properties": {"a": {}, "b": {}}, "dependencies": {"a": {"required": ["b"]}, "c": ["d"]}},
        [{"a": 1, "b": 2}, {"a": 1}, {"c": 1}, {"c": 1, "d": 2}, {"b": 1}],
    )


def test_property_order_is_the_schema_order_and_extra_keys_follow():
    m = machine({"type": "object", "properties": {"b": {}, "a": {}}, "required": ["a"]})
    assert accepts(m, '{"b":1,"a":2}') and accepts(m, '{"a":2,"zz":[]}') and accepts(m, '{"b":1,"a":2,"c":3,"d":4}')
    assert not accepts(m, '{"a":2,"b":1}')  # declared properties keep their order
    assert not accepts(m, '{"a":2,"a":3}') and not accepts(m, '{"b":1,"a":2,"b":3}')  # no duplicate of a declared key
    assert not accepts(m, '{"c":3,"a":2}')  # additional properties come last


def test_strings_are_canonical_json():
    m = machine({"type": "string"})
    for text in ['"a\\"b"', '"\\\\"', '"\\n\\t\\b\\f\\r"', '"\\u0001\\u001f"', '"é😀"', '"\u007f"']:
        assert accepts(m, text), text
    for text in ['"\\u0041"', '"\\/"', '"\\u000a"', '"\\u001F"', '"a\nb"', '"\u0001"', '"\\x"', '"a']:
        assert not accepts(m, text), text
    # a pattern constrains the decoded string, escaped characters included
    m = machine({"type": "string", "pattern": '^[^"]*"$'})
    assert accepts(m, '"ab\\""') and not accepts(m, '"ab"') and not accepts(m, '"\\"a"')


def test_numbers_in_canonical_decimal_form():
    m = machine({"type": "number", "minimum": 0, "maximum": 10})
    for text, ok in [
        ("0", True),
        ("10", True),
        ("0.5", True),
        ("9.999", True),
        ("10.0", True),
        ("10.01", False),
        ("-0", False),
        ("-0.0", False),
        ("1e1", False),
        ("01", False),
        ("1.", False),
        (".5", False),
    ]:
        assert accepts(m, text) == ok, text
    m = machine({"type": "number"})
    assert accepts(m, "1e5") and accepts(m, "-0.5E-3") and not accepts(m, "+1")
    m = machine({"type": "integer"})
    assert accepts(m, "-12") and accepts(m, "0") and not accepts(m, "1.0") and not accepts(m, "-0")


def test_numbers_bounded_only_by_zero_take_every_spelling():
    """At a bound of zero the sign alone decides, so exponents are exact there (real data writes 1e-06)."""
    texts = ["0", "0.0", "0e3", "1e-06", "2.5E+3", "0.001", "7", "-1e-06", "-2.5E+3", "-0.5", "-7"]
    for schema in (
        {"type": "number", "minimum": 0},
        {"type": "number", "exclusiveMinimum": 0},
        {"type": "number", "maximum": 0},
        {"type": "number", "exclusiveMaximum": 0},
    ):
        m = machine(schema)
        for text in texts:
            assert accepts(m, text) == valid(schema, json.loads(text)), (schema, text)
    m = machine({"type": "number", "minimum": 0, "maximum": 10})
    assert not accepts(m, "1e-06")  # other ranges are written without exponents


def test_an_integral_float_in_an_enum_takes_the_schema_spelling_too():
    m = machine({"enum": [2.0, "a"]})
    assert accepts(m, "2") and accepts(m, "2.0") and accepts(m, '"a"')
    assert not accepts(m, "2.5") and not accepts(m, "3")


# -- number ranges, against brute force ----------------------------------------------------------------------


def test_integer_ranges_equal_brute_force():
    rng = random.Random(0)
    for _ in range(300):
        lo = rng.choice([None, rng.randint(-400, 400)])
        hi = rng.choice([None, rng.randint(-400, 400)])
        rx = _int_range(lo, hi)
        if lo is not None and hi is not None and lo > hi:
            assert rx is None
            continue
        pattern = re.compile(rx)
        for v in range(-600, 600):
            assert bool(pattern.fullmatch(str(v))) == ((lo is None or v >= lo) and (hi is None or v <= hi)), (lo, hi, v)
        assert not pattern.fullmatch("-0") and not pattern.fullmatch("007")


@settings(max_examples=300, deadline=None)
@given(
    st.one_of(st.none(), st.decimals(-1000, 1000, places=3)),
    st.one_of(st.none(), st.decimals(-1000, 1000, places=3)),
    st.booleans(),
    st.booleans(),
    st.booleans(),
    st.lists(st.decimals(-1200, 1200, places=4), min_size=1, max_size=30),
)
def test_decimal_ranges_equal_brute_force(lo, hi, lo_strict, hi_strict, nonint, values):
    rx = _decimal_range(lo, lo_strict, hi, hi_strict, nonint)
    pattern = re.compile(rx) if rx is not None else None
    for v in values + [lo or Decimal(0), hi or Decimal(0), Decimal(0)]:
        text = format(v, "f")
        for t in {text, text.rstrip("0") if "." in text else text, text + "0" if "." in text else text}:
            if t.endswith(".") or t in ("-0", "0") and v != 0:
                continue
            if re.fullmatch(r"-0(\.0*)?", t):
                assert not (pattern and pattern.fullmatch(t)), t  # never -0
                continue
            value = Decimal(t)
            want = (
                (lo is None or (value > lo if lo_strict else value >= lo))
                and (hi is None or (value < hi if hi_strict else value <= hi))
                and not (nonint and value == value.to_integral_value())
            )
            assert bool(pattern and pattern.fullmatch(t)) == want, (lo, lo_strict, hi, hi_strict, nonint, t, rx)


# -- code-point automata -------------------------------------------------------------------------------------


def test_code_point_automata_intersect_subtract_and_escape():
    words = _CDFA.literals(["ab", 'a"b', "é"])
    anything = _CDFA.universal()
    rest = anything.minus(words).minimized()
    assert not rest.accepts("ab") and rest.accepts("a") and rest.accepts("abc") and rest.accepts("")
    search = _CDFA.from_regex("(?s:.)*(?:b$)(?s:.)*").minimized()
    both = search.intersect(_CDFA.length(2, 3)).minimized()
    assert both.accepts("ab") and both.accepts("a\nb") and not both.accepts("b") and not both.accepts("aaab")
    encoded = words.encode_json().minimized()
    assert encoded.accepts('a\\"b') and not encoded.accepts('a"b') and encoded.accepts("é")
    dfa = encoded.to_byte_dfa(quoted=True)
    assert dfa.matches(b'"a\\"b"') and dfa.matches(b'"ab"') and dfa.matches('"é"'.encode())
    assert not dfa.matches(b'"a"') and not dfa.matches(b"ab") and not dfa.matches(b'"a"b"')


# -- errors --------------------------------------------------------------------------------------------------

ERRORS = [
    ({"type": "integer", "minimum": 5, "maximum": 3}, "/minimum", "minimum"),
    (
        {
            "properties": {"age": {"type": "integer", "minimum": 10, "maximum": 5}},
            "required": ["age"],
            "type": "object",
        },
        "/properties/age/minimum",
        "minimum",
    ),
    ({"enum": []}, "/enum", "enum"),
    ({"allOf": [{"type": "string"}, {"type": "integer"}]}, "/allOf/1/type", "type"),
    ({"type": "string", "minLength": 3, "maxLength": 2}, "/minLength", "minLength"),
    ({"type": "array", "minItems": 3, "maxItems": 2}, "/minItems", "minItems"),
    ({"type": "object", "required": ["a"], "additionalProperties": False}, "/additionalProperties", None),
    ({"$ref": "#/$defs/missing"}, "/$ref", "$ref"),
    ({"$ref": "http://example.com/other.json"}, "/$ref", "$ref"),
    ({"$ref": "#/enum/0", "enum": [{"type": "string"}]}, "/$ref", "$ref"),  # data, not a schema
    ({"type": "strin"}, "/type", "type"),
    ({"properties": {"a": {"minimum": "x"}}}, "/properties/a/minimum", "minimum"),
    ({"type": "object", "properties": {"n": {"$ref": "#"}}, "required": ["n"]}, "", None),
    ({"type": "array", "uniqueItems": True}, "/uniqueItems", "uniqueItems"),
    ({"type": "string", "format": "idn-email"}, "/format", "format"),
    ({"type": "string", "pattern": "(?<=a)b"}, "/pattern", "pattern"),
    (
        {"type": "object", "dependencies": {"a": ["b"]}, "$schema": "https://json-schema.org/draft/2020-12/schema"},
        "/dependencies",
        "dependencies",
    ),
    ({"oneOf": [{"type": "object"}, {"unevaluatedProperties": {"type": "string"}}]}, "/oneOf", "oneOf"),
]


@pytest.mark.parametrize("schema,pointer,keyword", ERRORS, ids=[json.dumps(e[0])[:60] for e in ERRORS])
def test_errors_name_the_pointer_and_keyword(schema, pointer, keyword):
    with pytest.raises(JsonSchemaError) as info:
        schema_to_grammar(schema)
    error = info.value
    assert isinstance(error, StructureError)
    assert error.pointer == pointer, str(error)
    assert error.keyword == keyword, str(error)
    if keyword:
        assert repr(keyword) in str(error) and repr(pointer) in str(error)


@pytest.mark.parametrize(
    ("pattern", "position"),
    [("a)|(?:b", 1), ("a)", 1), ("(a)\\1", 3), ("x(?<=a)b", 1), ("[a", 0)],
)
def test_a_bad_pattern_is_refused_at_its_own_position(pattern, position):
    """A pattern is searched for inside a larger regex; it must still parse alone (``a)|(?:b`` would otherwise
    close the search's group and compile to another language) and its error must point into it."""
    with pytest.raises(JsonSchemaError) as info:
        schema_to_grammar({"type": "string", "pattern": pattern})
    assert info.value.pointer == "/pattern"
    message = str(info.value)
    assert f"at position {position} in regex {pattern!r}" in message, message
    assert "(?s:.)" not in message


def test_unsatisfiable_messages_say_why():
    with pytest.raises(JsonSchemaError, match="minimum 10 and maximum 5 leave no number"):
        schema_to_grammar(
            {
                "type": "object",
                "properties": {"age": {"type": "integer", "minimum": 10, "maximum": 5}},
                "required": ["age"],
            }
        )
    with pytest.raises(JsonSchemaError, match="required property 'a'"):
        schema_to_grammar({"type": "object", "required": ["a"], "additionalProperties": False})
    with pytest.raises(JsonSchemaError, match="never ends"):
        schema_to_grammar({"type": "object", "properties": {"n": {"$ref": "#"}}, "required": ["n"]})
    # unsatisfiable parts that need not be used are simply left out
    grammar, _ = schema_to_grammar(
        {"type": "object", "properties": {"n": {"$ref": "#"}, "x": {"type": "integer", "minimum": 3, "maximum": 1}}}
    )
    m = Machine(build_pushdown(grammar))
    assert accepts(m, '{"n":{"n":{}}}') and not accepts(m, '{"x":2}')


@pytest.mark.parametrize(
    ("schema", "pointer"),
    [
        ({"$ref": "#"}, "/$ref"),
        ({"type": "integer", "allOf": [{"$ref": "#"}]}, "/allOf/0/$ref"),
        (
            {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"allOf": [{"$ref": "#/$defs/a"}]}}, "$ref": "#/$defs/a"},
            "/$defs/b/allOf/0/$ref",
        ),
        ({"anyOf": [{"$ref": "#"}, {"type": "integer"}]}, ""),
        (
            {
                "$defs": {
                    "a": {"anyOf": [{"$ref": "#/$defs/b"}, {"type": "integer"}]},
                    "b": {"anyOf": [{"$ref": "#/$defs/a"}, {"type": "object"}]},
                },
                "$ref": "#/$defs/a",
            },
            "/$defs/a",
        ),
    ],
)
def test_a_reference_back_to_a_schema_applied_to_the_same_value_is_refused(schema, pointer):
    """A validator follows such a cycle forever (jsonschema raises RecursionError on every instance), so no value
    can be shown valid: refused, at the reference or at the schema the cycle comes back to."""
    with pytest.raises(RecursionError):
        jsonschema.validate(1, schema)
    with pytest.raises(JsonSchemaError, match="never finishes") as info:
        schema_to_grammar(schema)
    assert info.value.pointer == pointer


def test_a_recursion_that_descends_into_the_value_still_compiles():
    schema = {"anyOf": [{"type": "integer"}, {"type": "array", "items": {"$ref": "#"}}]}
    grammar, _ = schema_to_grammar(schema)
    m = Machine(build_pushdown(grammar))
    for text in ("1", "[]", "[1,[2,[]]]"):
        assert accepts(m, text), text
    assert not accepts(m, '["x"]')


def test_a_compile_leaves_no_reference_cycles_behind():
    """What a compile drops is freed by reference counting. A kept exception (its traceback holds the compiler's
    frames), a recursive closure or a node that refers to itself would leave the whole compile's garbage to the
    cyclic collector: more young collections, and full ones that walk it again and again."""
    schemas = [
        {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(40)}},  # tail rules
        {"anyOf": [{"type": "string", "minLength": 3, "maxLength": 1}, {"type": "integer"}]},  # a branch refused
        {
            "type": "object",
            "properties": {"a": {"const": 1}, "b": {"type": "string", "maxLength": 0}},
            "required": ["a", "b"],
            "additionalProperties": {"type": "string", "minLength": 2, "maxLength": 1},
        },
        {"type": "object", "properties": {"a": {"enum": [1, "x", {"k": [True, 2.5]}]}}, "required": ["a"]},
        {"type": "array", "items": {"type": "string", "pattern": "^(é|ü)+$", "minLength": 2}},  # code points
        {
            "$defs": {
                "n": {"anyOf": [{"type": "null"}, {"type": "object", "properties": {"next": {"$ref": "#/$defs/n"}}}]}
            },
            "$ref": "#/$defs/n",
        },
        {  # properties counted
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "string"}, "c": {"type": "null"}},
            "minProperties": 1,
            "maxProperties": 2,
        },
    ]
    ours = cyclic_garbage(lambda: [build_pushdown(schema_to_grammar(schema)[0]) for schema in schemas])
    assert not ours, collections.Counter(type(o).__name__ for o in ours)


def cyclic_garbage(run) -> list:
    """The objects of constrain (its instances, frames and functions) that ``run()`` leaves to the cyclic
    collector; ``run`` is called once before, to get first-use imports and process caches out of the way."""
    run()
    gc.collect()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        run()
        gc.collect()
        return [
            o for o in gc.garbage
            if type(o).__module__.startswith("constrain")
            or (inspect.isframe(o) and "constrain" in o.f_code.co_filename)
            or (inspect.isfunction(o) and (o.__module__ or "").startswith("constrain"))
        ]  # fmt: skip
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()


def test_lenient_mode_relaxes_and_lists_each_relaxation():
    schema = {
        "type": "object",
        "properties": {
            "tags": {"type": "array", "items": {"type": "string"}, "uniqueItems": True},
            "v": {"oneOf": [{"type": "object"}, {"unevaluatedProperties": {"type": "string"}}]},
            "e": {"type": "string", "format": "idn-email"},
            "p": {"type": "string", "pattern": "(?<=a)b"},
        },
    }
    with pytest.raises(JsonSchemaError):
        schema_to_grammar(schema)
    grammar, notes = schema_to_grammar(schema, strict=False)
    text = "\n".join(notes)
    for word in ("uniqueItems", "oneOf", "format", "pattern"):
        assert word in text, text
    assert schema_to_grammar({"type": "string"}, strict=False)[1] == []
    m = Machine(build_pushdown(grammar))
    assert accepts(m, '{"tags":["a","a"],"v":{"a":"b"},"e":"x","p":"q"}')


def test_annotations_and_unknown_keywords_are_ignored():
    schema = {
        "title": "t",
        "description": "d",
        "examples": [1],
        "default": 3,
        "$comment": "c",
        "deprecated": True,
        "readOnly": True,
        "x-custom": {"type": "string"},
        "nullable": True,
        "type": "integer",
    }
    check(schema, [1, "s", None])


def test_additional_properties_default_false_closes_declared_objects():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "object"}}}
    m = machine(schema, additional_properties_default=False)
    assert accepts(m, '{"a":1,"b":{"free":1}}') and not accepts(m, '{"a":1,"c":2}')
    assert accepts(machine(schema), '{"a":1,"c":2}')


# -- layouts -------------------------------------------------------------------------------------------------

LAYOUT_SCHEMA = {
    "type": "object",
    "properties": {
        "a": {"type": "array", "items": {"type": "integer"}},
        "b": {"type": "object", "properties": {"c": {"enum": [{"x": [1, 2], "y": {}}, "y"]}}},
        "d": {},
    },
    "required": ["a"],
}
LAYOUT_VALUES = [
    {"a": [1, 2], "b": {"c": {"x": [1, 2], "y": {}}}, "d": {"e": [], "f": {}, "g": [{"h": None, "i": "j"}]}},
    {"a": []},
    {"a": [0], "b": {}, "d": 1},
]


def test_indent_layout_is_json_dumps_indent_2():
    m = machine(LAYOUT_SCHEMA, whitespace="indent")
    for value in LAYOUT_VALUES:
        assert accepts(m, json.dumps(value, indent=2)), value
        assert not accepts(m, dumps(value)) or value == {"a": []}
    assert not accepts(m, json.dumps(LAYOUT_VALUES[0], indent=4))


def test_flexible_layout_allows_bounded_whitespace_between_tokens():
    m = machine(LAYOUT_SCHEMA, whitespace="flexible", max_whitespace=8)
    for value in LAYOUT_VALUES:
        for text in (dumps(value), json.dumps(value), json.dumps(value, indent=1)):
            assert accepts(m, text), text
    assert not accepts(m, '{"a":' + " " * 9 + "[]}")
    assert not accepts(m, ' {"a":[]}')  # nothing before or after the value
    assert not accepts(m, '{"a":[1 2]}')


def _indented(value, limit: int, depth: int = 0) -> str:
    """json.dumps(value, indent=2) for the first ``limit`` levels, compact below."""
    if depth >= limit or not isinstance(value, (list, dict)) or not value:
        return dumps(value)
    inner, outer = "  " * (depth + 1), "  " * depth
    if isinstance(value, list):
        items = [_indented(v, limit, depth + 1) for v in value]
        return "[\n" + ",\n".join(inner + x for x in items) + "\n" + outer + "]"
    items = [json.dumps(k) + ": " + _indented(v, limit, depth + 1) for k, v in value.items()]
    return "{\n" + ",\n".join(inner + x for x in items) + "\n" + outer + "}"


def test_any_value_is_indented_to_the_depth_limit_and_compact_below_it():
    from constrain.compilers.json_schema import MAX_INDENT_DEPTH

    m = machine({}, whitespace="indent")
    value: object = {"k": [1, "x", None]}
    for i in range(MAX_INDENT_DEPTH + 2):
        value = {f"k{i}": [value, {}]} if i % 2 else [value, True]
    assert accepts(m, _indented(value, MAX_INDENT_DEPTH + 1))
    assert not accepts(m, json.dumps(value, indent=2))
    assert not accepts(m, dumps(value))


@pytest.mark.parametrize("whitespace", ["compact", "flexible", "indent"])
def test_the_rules_every_schema_shares_are_the_same_objects_in_every_grammar(whitespace):
    """The rules of any JSON value are built once per process and handed to every grammar as the same objects, so
    their hashes, call lists and rule DFAs are found at once instead of built again for each schema."""
    open_object = {"type": "object", "properties": {"a": {"type": "integer"}}}
    first, _ = schema_to_grammar(open_object, whitespace=whitespace)
    second, _ = schema_to_grammar({"type": "array", "items": {}}, whitespace=whitespace)
    shared = [name for name in first.rules if name.startswith("json_value")]
    assert shared and all(first.rules[name] is second.rules[name] for name in shared)


@pytest.mark.parametrize("whitespace", ["compact", "flexible", "indent"])
def test_any_json_value_is_one_rule_per_depth_that_calls_only_lexical_rules_besides(whitespace):
    """Objects, arrays and literals are read in ``json_value``'s own body: a schema with open objects brings one
    rule per indentation depth and the lexical ones, which every compile checks and cleans up."""
    from constrain.compilers.json_schema import MAX_INDENT_DEPTH

    grammar, _ = schema_to_grammar({"type": "object"}, whitespace=whitespace)
    values = [name for name in grammar.rules if name.startswith("json_value")]
    assert len(values) == (MAX_INDENT_DEPTH + 1 if whitespace == "indent" else 1)  # a member: depth 1 and on
    lexical = {"json_string", "json_number", "ws"}
    for name in values:
        assert set(calls_of(grammar.rules[name])) <= lexical | set(values)
    assert not {"json_object", "json_array", "true", "false", "null"} & set(grammar.rules)
    m = machine({"type": "object"}, whitespace=whitespace)
    value = {"a": [1, {"b": None, "c": [True, False, "x"]}], "d": {}, "e": -1.5e3, "f": []}
    text = _indented(value, MAX_INDENT_DEPTH + 1) if whitespace == "indent" else dumps(value)
    assert accepts(m, text) and not accepts(m, text[:-1] + "]")


def test_string_automata_are_shared_across_schemas_and_their_refusals_are_reported_each_time():
    """A pattern, format and length set is turned into its automaton once per process (identifiers and hex ids
    recur across most real schemas); each schema still gets its own errors and relaxations, at its own pointers."""
    string = {"type": "string", "pattern": "^[0-9a-f]{24}$", "maxLength": 30}
    first, _ = schema_to_grammar({"type": "object", "properties": {"id": string}})
    second, _ = schema_to_grammar({"type": "array", "items": string})
    (shared,) = {body for body in first.rules.values() if isinstance(body, Automaton) and body.dfa.num_states > 24}
    assert any(body is shared for body in second.rules.values())

    unsupported = {"type": "string", "pattern": "(?<=a)b"}
    for where in ("a", "b"):
        with pytest.raises(JsonSchemaError) as info:
            schema_to_grammar({"type": "object", "properties": {where: unsupported}})
        assert info.value.pointer == f"/properties/{where}/pattern"
        _, notes = schema_to_grammar({"properties": {where: unsupported}}, strict=False)
        assert notes and notes[0].startswith(f"/properties/{where}/pattern: pattern: ignored")

    disjoint = {"type": "string", "allOf": [{"pattern": "^a+$"}, {"pattern": "^b+$"}]}
    lengths = {"type": "string", "pattern": "^ab?$", "minLength": 3}
    for where in ("x", "y"):
        with pytest.raises(JsonSchemaError, match="no string satisfies") as info:
            schema_to_grammar({"type": "object", "properties": {where: disjoint}, "required": [where]})
        assert info.value.pointer == f"/properties/{where}/allOf/0/pattern"
        with pytest.raises(JsonSchemaError, match="allowed lengths") as info:
            schema_to_grammar({"type": "object", "properties": {where: lengths}, "required": [where]})
        assert info.value.pointer == f"/properties/{where}/minLength"


def test_indent_layout_continues_compactly_beyond_the_depth_limit():
    from constrain.compilers.json_schema import MAX_INDENT_DEPTH

    schema = {"$defs": {"n": {"type": "array", "items": {"$ref": "#/$defs/n"}}}, "$ref": "#/$defs/n"}
    m = machine(schema, whitespace="indent")
    value: list = [[]]
    for _ in range(MAX_INDENT_DEPTH + 3):
        value = [value, []]
    assert accepts(m, _indented(value, MAX_INDENT_DEPTH + 1))
    assert not accepts(m, json.dumps(value, indent=2))
    shallow = [[[], [[]]]]
    assert accepts(m, json.dumps(shallow, indent=2))


# -- the JSON Schema Test Suite ------------------------------------------------------------------------------


def _key_orders(value, limit: int = 48):
    """Serialisations of ``value`` with its object keys in every order (bounded)."""
    if isinstance(value, dict):
        keys = list(value)
        orders = list(itertools.permutations(keys)) if len(keys) <= 4 else [tuple(keys)]
        out = []
        subs = {k: _key_orders(v, limit) for k, v in value.items()}
        for order in orders:
            for combo in itertools.product(*(subs[k] for k in order)):
                out.append(dict(zip(order, combo)))
                if len(out) >= limit:
                    return out
        return out
    if isinstance(value, list):
        out = []
        for combo in itertools.product(*(_key_orders(v, limit) for v in value)):
            out.append(list(combo))
            if len(out) >= limit:
                return out
        return out
    return [value]


# Groups whose tests this compiler deliberately answers differently, and why.
EXPECTED_DIFFERENT = {
    # formats are asserted here (an LLM asked for a date should write a date); the suite's default is annotation
    ("format.json", "only an annotation by default"),
    # a custom metaschema switches the validation vocabulary off; vocabularies are not read here
    ("vocabulary.json", "no validation: invalid number, but it still validates"),
}


def test_json_schema_test_suite():
    if not SUITE.is_dir():
        pytest.skip(f"the JSON Schema Test Suite is not at {SUITE}")
    groups = refused = tests = agree = 0
    refusals: collections.Counter = collections.Counter()
    disagreements = []
    for path in sorted(glob.glob(str(SUITE / "*.json"))):
        name = os.path.basename(path)
        for group in json.loads(Path(path).read_text()):
            groups += 1
            try:
                grammar, _ = schema_to_grammar(group["schema"])
                m = Machine(build_pushdown(grammar))
            except JsonSchemaError as exc:
                refused += 1
                reason = (
                    "unsatisfiable" if "unsatisfiable" in exc.reason else re.sub(r"'[^']*'", "'…'", exc.reason)[:70]
                )
                refusals[(name, exc.keyword, reason)] += 1
                if "unsatisfiable" in exc.reason:  # then every test of the group must be invalid
                    assert not any(t["valid"] for t in group["tests"]), (name, group["description"])
                continue
            for test in group["tests"]:
                texts = []
                for variant in _key_orders(test["data"]):
                    try:
                        texts.append(dumps(variant))
                    except ValueError:
                        pass
                got = any(accepts(m, t) for t in texts)
                tests += 1
                if got == test["valid"]:
                    agree += 1
                elif not any(file == name and why in test["description"] for file, why in EXPECTED_DIFFERENT):
                    disagreements.append((name, group["description"], test["description"], test["valid"]))
    report = [
        f"JSON Schema Test Suite draft2020-12: {groups} groups, {groups - refused} compiled, {refused} refused; "
        f"{agree}/{tests} tests agree"
    ]
    report += [f"  refused {n}x {file} [{kw}]: {why}" for (file, kw, why), n in sorted(refusals.items(), key=str)]
    print("\n".join(report))
    assert not disagreements, disagreements
    assert groups - refused >= 300 and tests >= 1000


def test_encoded_format_regexes_mean_the_decoded_formats():
    from constrain.compilers.json_schema.formats import _FORMATS, _FORMATS_ENCODED
    from constrain.grammar.rules import terminal_dfa

    for name, decoded in _FORMATS.items():
        direct = terminal_dfa(f'"(?:{_FORMATS_ENCODED[name]})"')
        derived = _CDFA.from_regex(decoded).encode_json().to_byte_dfa(quoted=True)
        assert _same_language(direct, derived), name


def _same_language(a, b) -> bool:
    """Whether two call-free byte DFAs accept the same strings (a walk over the pairs of states)."""
    seen = {(0, 0)}
    stack = [(0, 0)]
    while stack:
        p, q = stack.pop()
        if (p >= 0 and bool(a.accepting[p])) != (q >= 0 and bool(b.accepting[q])):
            return False
        rows_a = a.trans[p] if p >= 0 else [-1] * 256
        rows_b = b.trans[q] if q >= 0 else [-1] * 256
        for pair in {(int(x), int(y)) for x, y in zip(rows_a, rows_b)} - {(-1, -1)}:
            if pair not in seen:
                seen.add(pair)
                stack.append(pair)
    return True


def test_format_regexes_accept_only_valid_values():
    directory = SUITE / "optional" / "format"
    if not directory.is_dir():
        pytest.skip(f"the optional format tests are not at {directory}")
    accepted_valid = total_valid = 0
    for path in sorted(directory.glob("*.json")):
        for group in json.loads(path.read_text()):
            fmt = group["schema"].get("format")
            try:
                m = machine({"type": "string", "format": fmt})
            except JsonSchemaError:
                continue  # an unsupported format: refused
            for test in group["tests"]:
                if not isinstance(test["data"], str):
                    continue
                got = accepts(m, dumps(test["data"]))
                assert not (got and not test["valid"]), (fmt, test["data"], test["description"])
                total_valid += test["valid"]
                accepted_valid += got and test["valid"]
    assert accepted_valid >= 0.85 * total_valid, (accepted_valid, total_valid)


# -- random values and schemas derived from them (hypothesis) ------------------------------------------------

json_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-10**6, 10**6),
    st.floats(-1e6, 1e6, allow_nan=False, allow_infinity=False).map(lambda f: round(f, 3)),
    st.text(st.characters(blacklist_categories=["Cs"]), max_size=8),
)  # fmt: skip
json_values = st.recursive(
    json_scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(st.text(st.characters(blacklist_categories=["Cs"]), max_size=5), inner, max_size=4),
    ),
    max_leaves=12,
)


@st.composite
def value_and_schema(draw):
    value = draw(json_values)

    def derive(v):
        choice = draw(st.integers(0, 9))
        if choice == 0:
            return {}
        if choice == 1:
            return {"enum": [v, draw(json_scalars)]}
        if choice == 2:
            return {"const": v}
        if v is None:
            return {"type": "null"}
        if isinstance(v, bool):
            return {"type": "boolean"}
        if isinstance(v, int) or (isinstance(v, float) and v.is_integer()):
            s = {"type": draw(st.sampled_from(["integer", "number"]))}
            if draw(st.booleans()):
                s["minimum"] = int(v) - draw(st.integers(0, 50))
            if draw(st.booleans()):
                s["exclusiveMaximum"] = int(v) + draw(st.integers(1, 50))
            if draw(st.booleans()) and int(v) % 3 == 0:
                s["multipleOf"] = 3
            return s
        if isinstance(v, float):
            s = {"type": "number"}
            if draw(st.booleans()):
                s["minimum"] = round(v - draw(st.floats(0, 10)), 2)
                if s["minimum"] > v:
                    s["minimum"] = round(v, 3)
            if draw(st.booleans()):
                s["maximum"] = round(v, 3) + draw(st.integers(0, 3))
            return s
        if isinstance(v, str):
            s = {"type": "string"}
            if draw(st.booleans()):
                s["minLength"] = max(0, len(v) - draw(st.integers(0, 3)))
            if draw(st.booleans()):
                s["maxLength"] = len(v) + draw(st.integers(0, 3))
            if v and v[0].isalnum() and v[0].isascii() and draw(st.booleans()):
                s["pattern"] = "^" + v[0]
            return s
        if isinstance(v, list):
            s = {"type": "array"}
            if v and draw(st.booleans()):
                s["prefixItems"] = [derive(x) for x in v]
                s["items"] = draw(st.sampled_from([False, {}]))
            elif draw(st.booleans()):
                s["items"] = {"anyOf": [derive(x) for x in v]} if v else {"type": "integer"}
            if draw(st.booleans()):
                s["minItems"] = max(0, len(v) - 1)
                s["maxItems"] = len(v) + 1
            return s
        s = {"type": "object", "properties": {k: derive(x) for k, x in v.items() if draw(st.booleans())}}
        s["required"] = [k for k in v if draw(st.booleans())]
        if draw(st.booleans()) and set(s["properties"]) == set(v):
            s["additionalProperties"] = False
        if draw(st.booleans()):  # (more than one key beyond the required ones is refused: keys could repeat)
            s["minProperties"] = max(0, min(len(v) - 1, len(s["required"]) + 1))
        return s

    return value, derive(value)


def _schema_order(value, schema):
    """``value`` with its object keys in the order the grammar of ``schema`` (as derived above) writes them."""
    if not isinstance(schema, dict):
        return value
    if isinstance(value, dict):
        props = schema.get("properties", {})
        order = list(props) + [r for r in schema.get("required", []) if r not in props]
        keys = sorted(value, key=lambda k: order.index(k) if k in order else len(order))
        return {k: _schema_order(value[k], props.get(k, {})) for k in keys}
    if isinstance(value, list):
        prefix = schema.get("prefixItems", [])
        items = schema.get("items", {})
        out = []
        for i, x in enumerate(value):
            sub = prefix[i] if i < len(prefix) else items
            if isinstance(sub, dict) and "anyOf" in sub:
                sub = next((b for b in sub["anyOf"] if valid(b, x)), {})
            out.append(_schema_order(x, sub))
        return out
    return value


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(value_and_schema(), json_values)
def test_random_values_are_accepted_by_schemas_derived_from_them(pair, other):
    value, schema = pair
    assert valid(schema, value), (schema, value)
    grammar, _ = schema_to_grammar(schema)
    m = Machine(build_pushdown(grammar))
    # the value, its keys in the grammar's order (properties, then names only required, then the others)
    texts = [dumps(value), dumps(_schema_order(value, schema))]
    assert any(accepts(m, t) for t in texts), (schema, texts)
    # soundness: another random value, and small mutations of the value, are accepted only if valid
    for variant in [other] + _mutations(value):
        try:
            text = dumps(variant)
        except ValueError:
            continue
        if accepts(m, text):
            assert valid(schema, variant), (schema, variant)


def _mutations(value, depth: int = 0) -> list:
    out: list = []
    if isinstance(value, bool) or value is None:
        out += [not value if isinstance(value, bool) else 0, "x"]
    elif isinstance(value, (int, float)):
        out += [value + 1, value - 1, value * 10 + 0.5, -value, str(value)]
    elif isinstance(value, str):
        out += [value + "x", value[:-1], "", value + '"', None]
    elif isinstance(value, list):
        out += [value + [None], value[:-1], []]
        if depth < 2:
            for i, x in enumerate(value[:3]):
                out += [value[:i] + [m] + value[i + 1 :] for m in _mutations(x, depth + 1)[:3]]
    elif isinstance(value, dict):
        out += [{**value, "zz": 1}, {}]
        for k in list(value)[:3]:
            out.append({j: v for j, v in value.items() if j != k})
            if depth < 2:
                out += [{**value, k: m} for m in _mutations(value[k], depth + 1)[:3]]
    return out


# -- end to end --------------------------------------------------------------------------------------------


def test_compile_json_schema_on_a_synthetic_vocabulary():
    from constrain.vocab.vocabulary import Vocabulary

    pieces = [bytes([c]) for c in range(256)] + [b'{"', b'":', b'","', b'"}', b"true", b"12", b"ab", b"\xc3\xa9"]
    vocab = Vocabulary.from_token_bytes(pieces, eos_ids=[len(pieces)])
    schema = {
        "type": "object",
        "properties": {"ab": {"type": "integer"}, "s": {"type": "string", "pattern": "^é"}},
        "required": ["ab"],
        "uniqueItems": True,
    }
    with pytest.raises(JsonSchemaError):
        compile_json_schema({"type": "array", "uniqueItems": True}, vocab)
    structure = compile_json_schema(schema, vocab, whitespace="compact", cache_bytes=1 << 20)
    assert structure.relaxations == []
    lenient = compile_json_schema({"type": "array", "uniqueItems": True}, vocab, strict=False)
    assert any("uniqueItems" in note for note in lenient.relaxations)
    text = '{"ab":12,"s":"éa"}'.encode()
    matcher = structure.matcher()
    i = 0
    while i < len(text):  # longest token first, as a tokenizer would
        token = next(
            t for t in sorted(range(len(pieces)), key=lambda t: -len(pieces[t])) if text.startswith(pieces[t], i)
        )
        mask = matcher.mask()
        assert (mask[token >> 5] >> (token & 31)) & 1, (text[:i], pieces[token])
        matcher.advance(token)
        i += len(pieces[token])
    assert matcher.is_accepting()
    assert not compile_json_schema(schema, vocab).matcher().accepts(pieces.index(b"true"))


# -- end to end on a real vocabulary -------------------------------------------------------------------------

E2E_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 20},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "email": {"type": "string", "format": "email"},
        "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3},
        "address": {"$ref": "#/$defs/address"},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
    "$defs": {
        "address": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
            "required": ["city"],
            "additionalProperties": False,
        }
    },
}


def test_gemma_matcher_follows_tokenized_instances(gemma_vocab, gemma_tokenizer):
    structure = compile_json_schema(E2E_SCHEMA, gemma_vocab)
    assert structure.relaxations == []
    good = [
        {
            "name": "Ada Lovelace",
            "age": 36,
            "email": "ada@example.org",
            "tags": ["a", "c"],
            "address": {"city": "London", "zip": "12345"},
        },
        {"name": "é", "age": 0},
    ]
    for value in good:
        text = dumps(value)
        matcher = structure.matcher()
        for token in gemma_tokenizer.encode(text, add_special_tokens=False):
            mask = matcher.mask()
            assert (mask[token >> 5] >> (token & 31)) & 1, (text, token)
            matcher.advance(token)
        assert matcher.is_accepting(), text
    for bad in [{"name": "", "age": 1}, {"name": "x", "age": 151}, {"name": "x", "age": 1, "zz": 1}]:
        matcher = structure.matcher()
        ok = True
        for token in gemma_tokenizer.encode(dumps(bad), add_special_tokens=False):
            if not matcher.accepts(token):
                ok = False
                break
            matcher.advance(token)
        assert not (ok and matcher.is_accepting()), bad


def test_gemma_random_walks_under_the_mask_produce_valid_json(gemma_vocab):
    structure = compile_json_schema(E2E_SCHEMA, gemma_vocab)
    rng = np.random.default_rng(0)
    lengths = np.diff(np.asarray(gemma_vocab.offsets)).astype(float)
    is_eos = np.zeros(gemma_vocab.size, dtype=bool)
    is_eos[list(gemma_vocab.eos_ids)] = True
    finished = 0
    for _ in range(4):
        matcher = structure.matcher()
        tokens: list[int] = []
        for _step in range(120):
            allowed = matcher.allowed_tokens()
            assert len(allowed), "dead end"
            if matcher.is_accepting():
                break
            allowed = allowed[~is_eos[allowed]]
            # prefer short tokens (they close strings and objects sooner)
            weights = 1.0 / (1.0 + lengths[allowed]) ** 3
            token = int(rng.choice(allowed, p=weights / weights.sum()))
            matcher.advance(token)
            tokens.append(token)
        if matcher.is_accepting():
            finished += 1
            text = gemma_vocab.decode(tokens).decode()
            assert valid(E2E_SCHEMA, json.loads(text)), text
    assert finished >= 1


#: MaskBench Github_medium---o39217 reduced: a recursive $ref under four dependencies, whose triggers come late in
#: the key order. Each of the 16 present/absent combinations was a rule of its own, all followed in parallel to
#: the end of the object, and every nested value multiplied them again: an AmbiguityError two levels down.
RECURSIVE_DEPENDENCIES = {
    "$schema": "http://json-schema.org/draft-07/schema#",
    "properties": {
        "items": {"$ref": "#"},
        "properties": {"type": "object", "additionalProperties": {"$ref": "#"}},
        "propertyNames": {"$ref": "#"},
    },
    "dependencies": {
        "minimum": ["maximum"],
        "patternProperties": {
            "required": ["propertyNames"],
            "properties": {"propertyNames": {"required": ["maxLength"]}},
        },
        "pattern": {"required": ["maxLength"]},
        "format": {"required": ["maxLength"]},
    },
}


def _nested(leaf, depth: int) -> dict:
    for _ in range(depth):
        leaf = {"properties": {"a": leaf}}
    return leaf


def test_recursive_dependencies_are_followed_at_any_depth(gemma_vocab, gemma_tokenizer):
    check(
        RECURSIVE_DEPENDENCIES,
        [
            _nested({"pattern": "x", "maxLength": 3}, 5),
            _nested({"pattern": "x"}, 5),
            _nested(False, 6),
            _nested({"items": {"minimum": 1, "maximum": 2}}, 4),
            _nested({"items": {"minimum": 1}}, 4),
            {"propertyNames": {"maxLength": 2}, "patternProperties": {}},
            {"propertyNames": {"format": "date"}, "patternProperties": {}},
        ],
    )
    structure = compile_json_schema(RECURSIVE_DEPENDENCIES, gemma_vocab)
    leaf = {"items": {"propertyNames": {"maxLength": 9}, "patternProperties": {}}, "format": "x", "maxLength": 1}
    text = dumps(_nested(leaf, 6))
    matcher = structure.matcher()
    for token in gemma_tokenizer.encode(text, add_special_tokens=False):
        mask = matcher.mask()
        assert (mask[token >> 5] >> (token & 31)) & 1, (text, token)
        matcher.advance(token)
    assert matcher.is_accepting()


def test_refused_suite_groups_are_the_listed_ones():
    """docs/json-schema-test-suite.md lists the suite's groups that are refused; a group that starts compiling or
    a compiled group that starts being refused must show there (regenerate: benchmarks/jsts_report.py)."""
    import importlib.util

    if not SUITE.is_dir():
        pytest.skip(f"the JSON Schema Test Suite is not at {SUITE}")
    root = Path(__file__).resolve().parents[3]
    spec = importlib.util.spec_from_file_location("jsts_report", root / "benchmarks" / "jsts_report.py")
    jsts = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(jsts)
    listed = jsts.parse_listing(jsts.LISTING.read_text(encoding="utf-8"))
    _, refused = jsts.refusals(SUITE)
    now = set(refused)
    assert now == listed, (
        f"newly refused: {sorted(now - listed)}; now compiling: {sorted(listed - now)}; "
        f"if intended, regenerate the listing with {jsts.COMMAND}"
    )


def test_closed_by_default_objects_stay_closed_inside_one_of():
    """additional_properties_default=False closes each object where it is written, so merging a branch with
    the negation of another cannot reopen it; a negation of a closed object is refused as for an explicit
    ``additionalProperties: false``."""
    branch = lambda tag, key: {  # noqa: E731
        "type": "object", "properties": {"kind": {"const": tag}, key: {"type": "integer"}}, "required": ["kind"],
    }  # fmt: skip
    grammar, _ = schema_to_grammar({"oneOf": [branch("a", "x"), branch("b", "y")]}, additional_properties_default=False)
    machine = Machine(build_pushdown(grammar))

    def accepts(text: str) -> bool:
        configs = machine.read(machine.start, text.encode())
        return bool(configs) and machine.can_end(configs)

    assert accepts('{"kind":"a","x":1}') and accepts('{"kind":"b","y":1}')
    assert not accepts('{"kind":"a","y":"s"}') and not accepts('{"kind":"a","y":1}')
    loose = {
        "oneOf": [{k: v for k, v in branch(t, key).items() if k != "required"} for t, key in (("a", "x"), ("b", "y"))]
    }
    with pytest.raises(JsonSchemaError):
        schema_to_grammar(loose, additional_properties_default=False)


@pytest.mark.parametrize("lo,hi", [(0, 0), (0, 1), (1, 1), (2, 7), (5, 5), (0, None), (1, None), (3, None), (1, 255),
                                   (50, 255), (256, 256)])  # fmt: skip
def test_counted_string_automata_equal_the_determinised_repetition(lo, hi):
    """Strings with a length bound are chained copies of the character automaton, built directly: the same
    minimal table as determinising the repetition, quotes or not."""
    for open_quote, close_quote in itertools.product((True, False), repeat=2):
        parts = [Literal('"')] * open_quote + [Repeat(Regex(_CHAR), lo, hi)] + [Literal('"')] * close_quote
        expected, _ = _build_rule_dfa(Seq(tuple(parts)))
        built = _counted_chars(lo, hi, open_quote, close_quote).dfa
        assert np.array_equal(built.trans, expected.trans) and np.array_equal(built.accepting, expected.accepting)


def test_negated_enums_exclude_their_values_in_every_conjunction():
    """A negated enum's values are sorted once per schema and merged into every trial conjunction of an exclusive
    ``oneOf``: each branch still excludes exactly the other branches' values, of every kind."""
    schema = {
        "oneOf": [
            {"enum": ["a", "b", 1, None, True]},
            {"enum": ["b", "c", 1.0, 2]},
            {"type": ["string", "number", "boolean", "null"], "not": {"const": "z"}},
        ]
    }
    check(schema, ["a", "b", "c", "d", "z", 1, 1.0, 2, 3, 2.5, None, True, False, [], {}])


def test_a_negated_enum_of_objects_is_refused_with_its_pointer():
    """A shape cannot exclude an object or array value: refused in strict mode at the negated keyword, noted and
    ignored in lenient mode (its scalar values are still excluded)."""
    schema = {"type": ["object", "string"], "not": {"enum": [{"a": 1}, "x"]}}
    with pytest.raises(JsonSchemaError) as info:
        schema_to_grammar(schema)
    assert info.value.pointer == "/not/enum" and "object value" in str(info.value)
    grammar, notes = schema_to_grammar(schema, strict=False)
    assert any("/not/enum" in note and "object value" in note for note in notes), notes
    m = Machine(build_pushdown(grammar))
    assert accepts(m, '"y"') and not accepts(m, '"x"') and accepts(m, '{"a":1}')
