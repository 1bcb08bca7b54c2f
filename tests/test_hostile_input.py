"""Hostile or careless input gets a typed constrain error that names the place, never a bare Python exception."""

from __future__ import annotations

import numpy as np
import pytest

import constrain
from constrain.compilers.json_schema import schema_to_grammar
from constrain.errors import ArgumentError, GrammarSyntaxError, RegexError, SamplingParamsError, ShapeError
from constrain.testing import byte_vocabulary


@pytest.fixture(scope="module")
def vocab():
    return byte_vocabulary()


@pytest.mark.parametrize("depth", [200, 1000, 5000])
def test_deeply_nested_regex_is_refused_with_a_position(vocab, depth):
    pattern = "(" * depth + "a" + ")" * depth
    with pytest.raises(RegexError, match="nest too deeply") as info:
        constrain.compile(pattern, vocab, cache=False)
    assert info.value.position == 100


@pytest.mark.parametrize("depth", [1000, 5000])
def test_deeply_nested_gbnf_is_refused_with_line_and_column(vocab, depth):
    text = "root ::= " + "(" * depth + '"a"' + ")" * depth
    with pytest.raises(GrammarSyntaxError, match="nest too deeply") as info:
        constrain.compile(text, vocab, kind="gbnf", cache=False)
    assert (info.value.line, info.value.column) == (1, 110)


def test_a_nesting_real_grammars_use_still_compiles(vocab):
    assert constrain.compile("(" * 50 + "a" + ")" * 50, vocab, cache=False).matcher().accepts(ord("a"))
    text = "root ::= " + "(" * 400 + '"a"' + ")" * 400
    assert constrain.compile(text, vocab, kind="gbnf", cache=False).matcher().accepts(ord("a"))


@pytest.mark.parametrize("options", [{"whitespace": "bad"}, {"max_whitespace": -1}])
def test_bad_json_schema_options_are_argument_errors(options):
    with pytest.raises(ArgumentError):
        schema_to_grammar({"type": "object"}, **options)


def test_fill_bitmask_refuses_a_float_row_and_a_read_only_array(vocab):
    matcher = constrain.compile("a", vocab).matcher()
    bitmask = constrain.allocate_token_bitmask(2, vocab.size)
    with pytest.raises(ArgumentError, match="row"):
        matcher.fill_bitmask(bitmask, 0.5)
    with pytest.raises(ArgumentError, match="row"):
        matcher.fill_bitmask(bitmask, True)
    bitmask.setflags(write=False)
    with pytest.raises(ShapeError, match="read-only"):
        matcher.fill_bitmask(bitmask, 0)
    writable = np.zeros_like(bitmask)
    matcher.fill_bitmask(writable, np.int64(1))
    assert writable[1].any() and not writable[0].any()


@pytest.mark.parametrize("name", ["top_k", "no_repeat_ngram_size"])
def test_counts_past_int64_are_refused(name):
    with pytest.raises(SamplingParamsError, match=name):
        constrain.SamplingParams(**{name: 2**70})
    assert getattr(constrain.SamplingParams(**{name: 2**62}), name) == 2**62


@pytest.mark.parametrize(
    "schema, pointer",
    [
        ({"type": "integer", "minimum": float("inf")}, "/minimum"),
        ({"properties": {"a": {"maximum": float("nan")}}}, "/properties/a/maximum"),
        ({"type": "number", "exclusiveMaximum": float("-inf")}, "/exclusiveMaximum"),
    ],
)
def test_a_number_json_cannot_write_is_refused_at_its_pointer(schema, pointer):
    with pytest.raises(constrain.JsonSchemaError, match="not a JSON number") as info:
        schema_to_grammar(schema)
    assert info.value.pointer == pointer


@pytest.mark.parametrize(
    "schema, pointer, message",
    [
        ({"const": object()}, "/const", "object is not a JSON value"),
        ({"enum": [1, (2, 3)]}, "/enum/1", "tuple is not a JSON value"),
        ({"properties": {"a": {"const": {1: 2}}}}, "/properties/a/const", "key 1 is not a string"),
        ({"type": "object", "properties": {5: {}}}, "/properties", "key 5 is not a string"),
        ({"type": "integer", "minimum": 10**5000}, "/minimum", "longer than Python writes"),
        ({"$schema": 5}, "/$schema", "must be a string"),
    ],
)
def test_a_value_no_json_text_spells_is_refused_at_its_pointer(schema, pointer, message):
    with pytest.raises(constrain.JsonSchemaError, match=message) as info:
        schema_to_grammar(schema)
    assert info.value.pointer == pointer


def test_a_property_name_with_a_lone_surrogate_is_never_written(vocab):
    """Canonical JSON text cannot spell a lone surrogate: an optional property so named is left out, a required
    one refused at ``required``; the property beside it is unaffected."""
    optional = constrain.compile({"properties": {"\ud800": {}, "b": {"type": "integer"}}}, vocab, cache=False)
    assert constrain.testing.accepts_text(optional, b'{"b":1}')
    assert not constrain.testing.accepts_text(optional, '{"\ud800":1}'.encode("utf-8", "surrogatepass"))
    with pytest.raises(constrain.JsonSchemaError, match="lone surrogate") as info:
        schema_to_grammar({"type": "object", "properties": {"\ud800": {}}, "required": ["\ud800"]})
    assert info.value.pointer == "/required"


def test_an_unsatisfiable_schema_raises_the_public_error_class():
    with pytest.raises(constrain.JsonSchemaError) as info:
        schema_to_grammar({"oneOf": [{"type": "string"}, {"type": "string"}], "required": ["a"], "type": "object"})
    assert type(info.value) is constrain.JsonSchemaError


@pytest.mark.parametrize("compiler", ["regex", "lark", "gbnf", "json_schema", "choices", "pydantic"])
@pytest.mark.parametrize(
    "option, value",
    [("time_limit", "x"), ("time_limit", -1), ("time_limit", float("nan")), ("time_limit", True)]
    + [("cache_bytes", "x"), ("cache_bytes", -5)],
)
def test_every_compiler_refuses_a_bad_time_limit_or_cache_bytes(vocab, compiler, option, value):
    from constrain.compilers import choices, gbnf, json_schema, lark, pydantic, regex

    calls = {
        "regex": lambda **o: regex.compile_regex("a+", vocab, **o),
        "lark": lambda **o: lark.compile_lark('start: "a"+', vocab, **o),
        "gbnf": lambda **o: gbnf.compile_gbnf('root ::= "a"+', vocab, **o),
        "json_schema": lambda **o: json_schema.compile_json_schema({"type": "integer"}, vocab, **o),
        "choices": lambda **o: choices.compile_choices(["a", "b"], vocab, **o),
        "pydantic": lambda **o: pydantic.compile_pydantic(int, vocab, **o),
    }
    with pytest.raises(ArgumentError, match=option):
        calls[compiler](**{option: value})


def test_a_pattern_that_is_not_a_string_and_a_type_pydantic_cannot_take_are_typed(vocab):
    from constrain.compilers.pydantic import compile_pydantic
    from constrain.compilers.regex import compile_regex
    from constrain.errors import PydanticSchemaError

    with pytest.raises(ArgumentError, match="pattern"):
        compile_regex(["a"], vocab)
    with pytest.raises(ArgumentError, match="model_type"):
        compile_pydantic({"type": "integer"}, vocab)
    with pytest.raises(PydanticSchemaError, match="cannot"):
        compile_pydantic("(", vocab)


@pytest.mark.parametrize("count", [True, "1", 1.0, None])
def test_rollback_takes_only_an_int(vocab, count):
    matcher = constrain.compile("ab+", vocab).matcher()
    matcher.advance(ord("a"))
    with pytest.raises(ArgumentError, match="num_tokens"):
        matcher.rollback(count)
    matcher.rollback(np.int64(1))
    assert matcher.accepts(ord("a"))
