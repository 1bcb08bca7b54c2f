"""The fast metaschema pre-check (constrain.compilers.metaschema) against jsonschema, the oracle.

Soundness: whenever ``certainly_valid`` says True, jsonschema's own metaschema check must accept the schema too
(on MaskBench, on the JSON Schema Test Suite, on every metaschema keyword with probe values, and on random
mutations of valid schemas). Usefulness: it says True for nearly all MaskBench schemas that jsonschema accepts.
Invalid schemas keep jsonschema's error: the pre-check is not sure, and the compiler names the same pointer.
Without ``../shared/data`` the data-driven tests are skipped with the reason.
"""

from __future__ import annotations

import gzip
import json
import random
from typing import Any

import jsonschema_specifications
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jsonschema import validators

from constrain.compilers.json_schema import compile_json_schema, schema_to_grammar
from constrain.compilers.json_schema.document import _Document
from constrain.compilers.metaschema import MAX_DEPTH, certainly_valid
from constrain.errors import JsonSchemaError
from constrain.testing import tiny_vocabulary
from constrain.vocab.vocabulary import Vocabulary
from tests.shared_data import JSON_SCHEMA_TEST_SUITE as SUITE
from tests.shared_data import MASKBENCH_DEV as MASKBENCH

#: MaskBench schemas checked against the oracle (jsonschema takes about 6 ms a schema, 50 s for the whole set).
SAMPLE_SIZE = 1000
#: Share of the sample's jsonschema-valid (schema, draft) pairs that the fast check must accept. Measured: all
#: 1,546 of the sample; 8,597 of 8,604 on the whole set (the misses: three draft-04 enums holding arrays or
#: objects, four 2019-09 schemas, a draft this module leaves to jsonschema).
MIN_ACCEPTED = 0.99

D4 = "http://json-schema.org/draft-04/schema#"
D6 = "http://json-schema.org/draft-06/schema#"
D7 = "http://json-schema.org/draft-07/schema#"
D2020 = "https://json-schema.org/draft/2020-12/schema"

VALIDATORS = {
    "Draft4": validators.Draft4Validator,
    "Draft6": validators.Draft6Validator,
    "Draft7": validators.Draft7Validator,
    "Draft202012": validators.Draft202012Validator,
}
ORACLES = {draft: cls(cls.META_SCHEMA) for draft, cls in VALIDATORS.items()}


def oracle(schema: Any, draft: str) -> bool:
    return ORACLES[draft].is_valid(schema)


def drafts_of(schema: Any) -> list[str]:
    """The drafts the compiler checks a schema against: its dialect, and draft-07 too when ``$schema`` is absent."""
    cls = validators.validator_for(schema, default=validators.Draft202012Validator)
    drafts = [cls.__name__.replace("Validator", "")]
    if not (isinstance(schema, dict) and "$schema" in schema):
        drafts.append("Draft7")
    return drafts


def metaschema_keywords(draft: str) -> list[str]:
    """The keywords a dialect's metaschema constrains, read from the metaschemas jsonschema uses."""
    meta = VALIDATORS[draft].META_SCHEMA
    keywords = set(meta["properties"])
    if draft == "Draft202012":
        base = "https://json-schema.org/draft/2020-12/"
        for ref in meta["allOf"]:
            keywords |= set(jsonschema_specifications.REGISTRY.contents(base + ref["$ref"])["properties"])
    return sorted(keywords)


needs_maskbench = pytest.mark.skipif(not MASKBENCH.is_file(), reason=f"MaskBench data not found at {MASKBENCH}")
needs_suite = pytest.mark.skipif(not SUITE.is_dir(), reason=f"the JSON Schema Test Suite is not at {SUITE}")


# -- soundness and usefulness on real schemas -------------------------------------------------------------------


@needs_maskbench
def test_maskbench_sample_is_sound_and_mostly_accepted():
    with gzip.open(MASKBENCH, "rt", encoding="utf-8") as lines:
        schemas = [json.loads(line)["schema"] for line in lines]
    sample = random.Random(0).sample(schemas, min(SAMPLE_SIZE, len(schemas)))
    unsound, valid, accepted = [], 0, 0
    for schema in sample:
        for draft in drafts_of(schema):
            fast, slow = certainly_valid(schema, draft), oracle(schema, draft)
            if fast and not slow:
                unsound.append((draft, json.dumps(schema)[:200]))
            valid += slow
            accepted += fast and slow
    assert not unsound, unsound[:5]
    assert valid > SAMPLE_SIZE // 2
    assert accepted / valid >= MIN_ACCEPTED, f"accepted {accepted} of {valid} valid"


@needs_suite
def test_json_schema_test_suite_is_sound_in_every_draft():
    """Every schema of the suite (draft 2020-12, the only one in ../shared/data), asked of each draft here."""
    files = sorted(SUITE.rglob("*.json"))
    assert files
    accepted = 0
    for path in files:
        for group in json.loads(path.read_text(encoding="utf-8")):
            for draft in VALIDATORS:
                if certainly_valid(group["schema"], draft):
                    accepted += 1
                    assert oracle(group["schema"], draft), (path.name, group["description"], draft)
    assert accepted > 0


PROBES: list[Any] = [
    None, True, False, 0, 1, -1, 1.0, 2.5, -0.5, "", "a", "string", "_a-1.b", "1a", "a b", "#", "#a", "a#b", "abc\n",
    [], ["a"], ["a", "a"], ["a", "b"], [1], [1, True], [1, 1.0], ["string", "integer"], ["strin"], [{}], [True],
    [{"type": "x"}], [["a"]], {}, {"a": 1}, {"a": True}, {"a": {}}, {"a": ["b"]}, {"a": []}, {"a": ["b", "b"]},
    {"type": "string"}, {"type": "x"}, {"minimum": "1"}, {1: True},
]  # fmt: skip


@pytest.mark.parametrize("draft", list(VALIDATORS))
def test_every_metaschema_keyword_is_sound(draft):
    """Each keyword of the real metaschema, with each probe value, at the root and in a subschema: a keyword
    this module forgot would be accepted with any value, and fail here."""
    for keyword in metaschema_keywords(draft):
        for value in PROBES:
            for schema in ({keyword: value}, {"properties": {"a": {keyword: value}}}):
                if certainly_valid(schema, draft):
                    assert oracle(schema, draft), (draft, schema)


# -- hypothesis: mutations of valid schemas --------------------------------------------------------------------

VALID: list[Any] = [
    True,
    {},
    {"type": "object", "properties": {"a": {"type": "string", "minLength": 1}}, "required": ["a"]},
    {"type": ["integer", "null"], "minimum": 0, "exclusiveMaximum": 10, "multipleOf": 2},
    {"items": {"enum": [1, "a", None]}, "minItems": 1, "uniqueItems": True, "contains": {"const": 1}},
    {"anyOf": [{"$ref": "#/$defs/x"}, {"not": {"type": "array"}}], "$defs": {"x": {"pattern": "^a"}}},
    {"$schema": D2020, "$id": "http://example.com/s", "$anchor": "top", "prefixItems": [{}], "items": False,
     "dependentRequired": {"a": ["b"]}, "dependentSchemas": {"a": {"maxProperties": 2}},
     "if": {"minProperties": 1}, "then": True, "else": {"unevaluatedProperties": False}},
    {"definitions": {"d": {"format": "date"}}, "dependencies": {"a": ["b"], "c": {"title": "t"}},
     "patternProperties": {"^x": {"description": "d"}}, "additionalProperties": {"type": "number"}},
    {"$schema": D7, "items": [{"type": "string"}], "additionalItems": False, "if": {"maxLength": 3},
     "$comment": "c", "readOnly": True, "dependencies": {"a": ["b"]}},
    {"$schema": D6, "items": [{}], "contains": {"type": "integer"}, "propertyNames": {"maxLength": 3},
     "examples": [1], "const": 1},
    {"$schema": D4, "id": "http://example.com/s", "type": "object", "required": ["a"],
     "properties": {"a": {"enum": [1, True, "x"], "maximum": 3, "exclusiveMaximum": True}},
     "additionalProperties": False, "dependencies": {"a": ["b"]}, "items": [{"minItems": 0}]},
]  # fmt: skip

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 3) | st.floats(-3, 3) | st.text(max_size=3),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=3), children, max_size=3),
    max_leaves=6,
)
KEYWORDS = sorted({keyword for draft in VALIDATORS for keyword in metaschema_keywords(draft)})


def objects_in(value: Any) -> list[dict]:
    found = []
    if isinstance(value, dict):
        found.append(value)
        for item in value.values():
            found += objects_in(item)
    elif isinstance(value, list):
        for item in value:
            found += objects_in(item)
    return found


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_mutated_schemas_are_sound(data):
    schema = json.loads(json.dumps(data.draw(st.sampled_from(VALID))))
    targets = objects_in(schema)
    if targets:
        target = data.draw(st.sampled_from(targets))
        keyword = data.draw(st.sampled_from(sorted(set(target) | set(KEYWORDS), key=str)))
        target[keyword] = data.draw(JSON_VALUES | st.sampled_from(PROBES))
    for draft in VALIDATORS:
        if certainly_valid(schema, draft):
            assert oracle(schema, draft), (draft, schema)


def test_valid_examples_are_certain():
    """The mutation base: each schema valid in its drafts, and the fast check says so."""
    for schema in VALID:
        for draft in drafts_of(schema)[:1]:
            assert oracle(schema, draft) and certainly_valid(schema, draft), (draft, schema)


# -- invalid schemas keep jsonschema's error -------------------------------------------------------------------

INVALID: list[tuple[Any, str, str]] = [
    # 2020-12 (no $schema: draft-07 rejects these too)
    ({"type": "strin"}, "/type", "type"),
    ({"type": []}, "/type", "type"),
    ({"type": ["string", "string"]}, "/type", "type"),
    ({"type": 5}, "/type", "type"),
    ({"minLength": -1}, "/minLength", "minLength"),
    ({"minItems": 1.5}, "/minItems", "minItems"),
    ({"maxLength": True}, "/maxLength", "maxLength"),
    ({"allOf": []}, "/allOf", "allOf"),
    ({"anyOf": {}}, "/anyOf", "anyOf"),
    ({"required": ["a", "a"]}, "/required", "required"),
    ({"required": "a"}, "/required", "required"),
    ({"enum": "x"}, "/enum", "enum"),
    ({"multipleOf": 0}, "/multipleOf", "multipleOf"),
    ({"multipleOf": -2}, "/multipleOf", "multipleOf"),
    ({"title": 1}, "/title", "title"),
    ({"properties": []}, "/properties", "properties"),
    ({"not": 5}, "/not", "not"),
    ({"if": "x"}, "/if", "if"),
    ({"properties": {"a": {"minimum": "x"}}}, "/properties/a/minimum", "minimum"),
    ({"items": {"type": "strin"}}, "/items/type", "type"),
    ({"definitions": {"x": {"type": 1}}}, "/definitions/x/type", "type"),
    ({"dependencies": {"a": {"required": [1]}}}, "/dependencies/a/required/0", "0"),
    ({"dependencies": {"a": 5}}, "/dependencies/a", "a"),
    (
        {"properties": {"a": {"properties": {"b": {"allOf": [{"minLength": -3}]}}}}},
        "/properties/a/properties/b/allOf/0/minLength",
        "minLength",
    ),
    # 2020-12 declared (without $schema these would be read as draft-07, which ignores them)
    ({"$schema": D2020, "$defs": {"x": {"maxItems": -1}}}, "/$defs/x/maxItems", "maxItems"),
    ({"$schema": D2020, "$anchor": "1abc"}, "/$anchor", "$anchor"),
    ({"$schema": D2020, "$dynamicAnchor": "a b"}, "/$dynamicAnchor", "$dynamicAnchor"),
    ({"$schema": D2020, "$id": "http://x/y#frag"}, "/$id", "$id"),
    ({"$schema": D2020, "$recursiveAnchor": True}, "/$recursiveAnchor", "$recursiveAnchor"),
    ({"$schema": D2020, "$recursiveRef": 1}, "/$recursiveRef", "$recursiveRef"),
    ({"$schema": D2020, "prefixItems": []}, "/prefixItems", "prefixItems"),
    ({"$schema": D2020, "dependentRequired": {"a": ["b", "b"]}}, "/dependentRequired/a", "a"),
    ({"$schema": D2020, "deprecated": "yes"}, "/deprecated", "deprecated"),
    ({"$schema": D2020, "$vocabulary": {"x": 1}}, "/$vocabulary/x", "x"),
    ({"$schema": D2020, "contentSchema": {"minimum": "1"}}, "/contentSchema/minimum", "minimum"),
    ({"$schema": D2020, "unevaluatedProperties": {"type": "x"}}, "/unevaluatedProperties/type", "type"),
    ({"$schema": D2020, "dependentSchemas": {"a": {"type": "x"}}}, "/dependentSchemas/a/type", "type"),
    ({"$schema": D2020, "items": [{"type": "string"}]}, "/items", "items"),
    # draft-07 and draft-06
    ({"$schema": D7, "items": []}, "/items", "items"),
    ({"$schema": D7, "items": [{"type": "strin"}]}, "/items/0/type", "type"),
    ({"$schema": D7, "dependencies": {"a": [1]}}, "/dependencies/a/0", "0"),
    ({"$schema": D7, "additionalItems": 5}, "/additionalItems", "additionalItems"),
    ({"$schema": D7, "if": {"minimum": "x"}}, "/if/minimum", "minimum"),
    ({"$schema": D6, "contains": 3}, "/contains", "contains"),
    ({"$schema": D6, "propertyNames": {"maxLength": -1}}, "/propertyNames/maxLength", "maxLength"),
    # draft-04
    ({"$schema": D4, "enum": []}, "/enum", "enum"),
    ({"$schema": D4, "enum": [1, 1]}, "/enum", "enum"),
    ({"$schema": D4, "required": []}, "/required", "required"),
    ({"$schema": D4, "minimum": 0, "exclusiveMaximum": True}, "", "dependencies"),
    ({"$schema": D4, "exclusiveMaximum": 5, "maximum": 3}, "/exclusiveMaximum", "exclusiveMaximum"),
    ({"$schema": D4, "id": 5}, "/id", "id"),
    ({"$schema": D4, "properties": {"a": True}}, "/properties/a", "a"),
    ({"$schema": D4, "minItems": 1.0}, "/minItems", "minItems"),
    ({"$schema": D4, "dependencies": {"a": []}}, "/dependencies/a", "a"),
    ({"$schema": D4, "items": [{"maxLength": -1}]}, "/items/0/maxLength", "maxLength"),
]


@pytest.fixture(scope="module")
def toy_vocab() -> Vocabulary:
    return tiny_vocabulary([b"{", b"}", b'"', b"a", b"1", b"[", b"]", b",", b":"])


@pytest.mark.parametrize("schema,pointer,keyword", INVALID, ids=[json.dumps(c[0])[:70] for c in INVALID])
def test_invalid_schemas_keep_jsonschemas_error(schema, pointer, keyword, toy_vocab):
    for draft in drafts_of(schema):
        assert not oracle(schema, draft)
        assert not certainly_valid(schema, draft)
    with pytest.raises(JsonSchemaError, match="not a valid JSON Schema") as info:
        compile_json_schema(schema, toy_vocab)
    assert (info.value.pointer, info.value.keyword) == (pointer, keyword), str(info.value)


@pytest.mark.parametrize(
    "schema,draft",
    [
        ({"minItems": 2.0}, "Draft202012"),  # an integer from draft-06 on, but a float: jsonschema decides
        ({"$schema": D4, "enum": [[1], {"a": 1}]}, "Draft4"),  # uniqueness of arrays and objects is not shown
        ({"$schema": D2020, "$anchor": "abc\n"}, "Draft202012"),  # the metaschema's $ allows a final newline
    ],
)
def test_valid_but_unsure_schemas_go_to_jsonschema(schema, draft):
    assert oracle(schema, draft) and not certainly_valid(schema, draft)
    schema_to_grammar(schema)


def test_without_schema_the_draft_07_reading_is_kept():
    """No $schema: when 2020-12 rejects the schema and draft-07 accepts it, it is read as draft-07, as before."""
    items_list = {"items": [{"type": "string"}], "additionalItems": False}
    assert not oracle(items_list, "Draft202012") and certainly_valid(items_list, "Draft7")
    assert _Document(items_list).draft == "Draft7"
    # $defs is only an annotation in draft-07, so a bad subschema there does not stop the draft-07 reading.
    assert _Document({"$defs": {"x": {"maxItems": -1}}}).draft == "Draft7"
    assert _Document({"items": {"type": "string"}}).draft == "Draft202012"


def test_other_drafts_are_not_certain():
    assert not certainly_valid({}, "Draft201909") and not certainly_valid({}, "Draft3")
    assert not certainly_valid({}, "Draft2020-12")


@pytest.mark.parametrize("draft", list(VALIDATORS))
def test_deeper_schemas_are_left_to_jsonschema(draft):
    """Up to MAX_DEPTH levels the walk answers, and jsonschema could too (its recursion, which a too deep schema
    exhausts, is not reached there, so skipping it changes nothing); one level more, jsonschema decides."""

    def nested(levels: int) -> dict:
        schema: dict = {"type": "string"}
        for _ in range(levels - 1):
            schema = {"allOf": [schema]}
        return schema

    assert certainly_valid(nested(MAX_DEPTH), draft) and oracle(nested(MAX_DEPTH), draft)
    assert not certainly_valid(nested(MAX_DEPTH + 1), draft)
    cyclic: dict = {}
    cyclic["not"] = cyclic
    assert not certainly_valid(cyclic, draft)
