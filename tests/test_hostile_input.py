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
