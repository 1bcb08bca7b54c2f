"""constrain.compile: one entry point from any spec to a compiled structure, with a cache keyed by spec, options and
vocabulary."""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass

import jsonschema
import numpy as np
import pytest
from pydantic import BaseModel

import constrain
from constrain.errors import CompileTimeout, GrammarSyntaxError, RegexError, StructureError
from constrain.grammar import Grammar, Literal, Ref, Repeat, Seq
from constrain.runtime import CompiledStructure


def accepts(structure: CompiledStructure, tokenizer, text: str) -> bool:
    matcher = structure.matcher()
    try:
        for token in tokenizer.encode(text):
            matcher.advance(token)
    except constrain.TokenError:
        return False
    return matcher.is_accepting()


class Point(BaseModel):
    x: int
    y: int


@dataclass
class Pair:
    name: str
    count: int


@pytest.mark.parametrize(
    "spec, kind, good, bad",
    [
        (r"\d{4}-\d{2}", "auto", "2024-05", "2024-5"),
        (
            {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
            "auto",
            '{"a":12}',
            '{"a":"x"}',
        ),
        ('{"type": "array", "items": {"type": "boolean"}}', "json_schema", "[true,false]", "[1]"),
        (Point, "auto", '{"x":1,"y":-2}', '{"x":1}'),
        (Pair, "auto", '{"name":"ab","count":3}', '{"name":3,"count":3}'),
        (list[int], "auto", "[1,2,3]", "[1.5]"),
        (["yes", "no", "maybe so"], "auto", "maybe so", "mayb"),
        ('start: "(" start ")" | "x"', "lark", "((x))", "((x)"),
        ('root ::= "a" root | "b"', "gbnf", "aab", "aa"),
        (Grammar({"s": Seq((Literal(b"<"), Repeat(Ref("s"), 0, 1), Literal(b">")))}, "s"), "auto", "<<>>", "<<>"),
    ],
)
def test_every_kind_of_spec_compiles_to_its_language(cl100k, cl100k_vocab, spec, kind, good, bad):
    structure = constrain.compile(spec, cl100k_vocab, kind=kind)
    assert isinstance(structure, CompiledStructure)
    assert accepts(structure, cl100k, good)
    assert not accepts(structure, cl100k, bad)


def test_json_output_validates_against_the_schema(cl100k, cl100k_vocab):
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 3}}, "required": ["n"]}
    structure = constrain.compile(schema, cl100k_vocab)
    for text in ['{"n":3}', '{"n":2}', '{"n":-4}', '{"n":40}']:
        valid = jsonschema.Draft202012Validator(schema).is_valid(json.loads(text))
        assert accepts(structure, cl100k, text) == valid


def test_the_same_spec_compiles_once(cl100k_vocab):
    schema = {"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "integer"}}}
    first = constrain.compile(schema, cl100k_vocab)
    assert constrain.compile(json.loads(json.dumps(schema)), cl100k_vocab) is first  # an equal dict, not the same
    assert constrain.compile(r"[a-z]+", cl100k_vocab) is constrain.compile(r"[a-z]+", cl100k_vocab)
    assert constrain.compile(Point, cl100k_vocab) is constrain.compile(Point, cl100k_vocab)


def test_the_cache_tells_apart_what_changes_the_structure(cl100k, cl100k_vocab, gemma_vocab):
    schema = {"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "integer"}}}
    reordered = {"type": "object", "properties": {"b": {"type": "integer"}, "a": {"type": "string"}}}
    first = constrain.compile(schema, cl100k_vocab)
    other_order = constrain.compile(reordered, cl100k_vocab)
    assert other_order is not first  # properties come out in their order: a different language
    assert accepts(first, cl100k, '{"a":"x","b":1}') and not accepts(other_order, cl100k, '{"a":"x","b":1}')
    assert constrain.compile(schema, cl100k_vocab, whitespace="indent") is not first
    assert constrain.compile(schema, cl100k_vocab, strict=False) is not first
    assert constrain.compile(schema, gemma_vocab).vocab is gemma_vocab
    assert constrain.compile(schema, cl100k_vocab, cache=False) is not first


def test_the_cache_is_bounded(cl100k_vocab):
    from constrain.compilers import api

    constrain.clear_compile_cache()
    first = constrain.compile("q0", cl100k_vocab)
    for i in range(1, api.COMPILE_CACHE_ENTRIES + 1):
        constrain.compile(f"q{i}", cl100k_vocab)
    assert constrain.compile("q0", cl100k_vocab) is not first


@pytest.mark.parametrize(
    "spec, options, error, message",
    [
        (r"\d+", {"whitespace": "indent"}, StructureError, "whitespace= does not apply to a regex"),
        (["a"], {"start": "x"}, StructureError, "start= does not apply to a choices"),
        (3.5, {}, StructureError, "cannot tell what structure a float is"),
        ("a", {"kind": "yaml"}, StructureError, "unknown kind 'yaml'"),
        (42, {"kind": "regex"}, StructureError, "a regex spec must be a string"),
        ("{nope", {"kind": "json_schema"}, StructureError, "not valid JSON"),
        ([], {}, StructureError, "non-empty list"),
        (["a", 1], {}, StructureError, "choice 1 must be a string"),
        ("a(b", {}, RegexError, "position"),
        ("start: (", {"kind": "lark"}, GrammarSyntaxError, "line 1"),
        (
            {"type": "object", "required": ["a"], "properties": {"a": False}},
            {},
            constrain.JsonSchemaError,
            "/properties/a",
        ),
    ],
)
def test_bad_specs_raise_typed_errors_that_name_the_place(cl100k_vocab, spec, options, error, message):
    with pytest.raises(error, match=re.escape(message)):
        constrain.compile(spec, cl100k_vocab, **options)


def test_a_vocabulary_is_required(cl100k):
    with pytest.raises(StructureError, match="vocab must be a constrain.Vocabulary"):
        constrain.compile(r"\d+", cl100k)


def test_time_limit_bounds_a_regex_compile(cl100k_vocab):
    started = time.process_time()
    with pytest.raises(CompileTimeout, match="time_limit=0.3"):
        constrain.compile("((a{1,50}){1,50}){1,50}", cl100k_vocab, time_limit=0.3, cache=False)
    assert time.process_time() - started < 0.3 * 2 + 0.5


def test_a_cached_structure_is_counted_at_the_size_it_grows_to():
    """A JSON Schema's rules are built as matchers reach them: the compile cache counts the structure again each
    time its automaton grows, so the cache's bound holds for what the structures hold now."""
    from constrain.compilers import api
    from constrain.testing import byte_vocabulary

    vocab = byte_vocabulary()
    names = {i: [f"field_{i}_{j}_with_a_long_name" for j in range(12)] for i in range(30)}
    defs = {
        f"d{i}": {
            "type": "object",
            "properties": {name: {"type": "integer"} for name in names[i]},
            "required": names[i][:1],
            "additionalProperties": False,
        }
        for i in names
    }
    schema = {
        "type": "object",
        "properties": {"pick": {"anyOf": [{"$ref": f"#/$defs/{d}"} for d in defs]}},
        "required": ["pick"],
        "$defs": defs,
    }
    constrain.clear_compile_cache()
    structure = constrain.compile(schema, vocab)
    at_compile = structure.nbytes
    assert api._COMPILED.nbytes == max(at_compile, api.COMPILE_CACHE_BYTES // api.COMPILE_CACHE_ENTRIES)
    matcher = structure.matcher()
    for byte in b'{"pick":':
        matcher.advance(byte)
    matcher.fill_bitmask(np.zeros((1, structure.bitmask_width), dtype=np.int32), 0)  # reaches every definition
    assert structure.nbytes > max(4 * at_compile, api.COMPILE_CACHE_BYTES // api.COMPILE_CACHE_ENTRIES)
    assert api._COMPILED.nbytes == structure.nbytes
