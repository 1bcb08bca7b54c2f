"""Output types -> structures and back, on the real Gemma vocabulary: each kind of ``output_type`` resolves, compiles,
and seeded random walks under its mask parse back into a valid value of the type; bad types and refused texts
raise typed errors; partial JSON of every prefix grows into the final value. Also ``constrain.compile`` of the
``Regex``, ``Lark`` and ``GBNF`` wrappers."""

from __future__ import annotations

import dataclasses
import datetime
import enum
import json
import re
from collections.abc import Callable
from typing import Annotated, Any, Literal, NamedTuple

import jsonschema
import lark
import numpy as np
import pytest
from pydantic import BaseModel, ConfigDict, Field, field_validator
from typing_extensions import TypedDict

import constrain
from constrain import grammars
from constrain.compilers.output_types import FLOAT_PATTERN, INT_PATTERN, OutputType, output_type
from constrain.compilers.specs import GBNF, Lark, Regex
from constrain.errors import (
    ArgumentError,
    OutputTypeError,
    OutputValidationError,
    PydanticSchemaError,
    StructureError,
    VocabularyError,
)
from constrain.grammar import ir
from constrain.testing import random_walk, token_length_weights

# -- the types -------------------------------------------------------------------------------------------------


class Address(BaseModel):
    city: str = Field(min_length=1, max_length=6)
    zip: str = Field(pattern=r"^[0-9]{5}$")


class Person(BaseModel):
    name: str = Field(min_length=1, max_length=8)
    age: int = Field(ge=0, le=150)
    address: Address
    tags: list[Literal["a", "b"]] = Field(max_length=3)


class Tree(BaseModel):
    label: Literal["x", "y"]
    children: list[Tree] = Field(max_length=2)


@dataclasses.dataclass
class Point:
    x: int
    y: float


class Movie(TypedDict):
    title: Annotated[str, Field(max_length=5)]
    year: Annotated[int, Field(ge=1900, le=2100)]


class Pair(NamedTuple):
    left: int
    right: bool


class Color(str, enum.Enum):
    RED = "red"
    GREEN = "green"


class Level(enum.IntEnum):
    LOW = 1
    HIGH = 10


SCHEMA = {
    "type": "object",
    "properties": {
        "id": {"type": "integer", "minimum": 1, "maximum": 999},
        "kind": {"enum": ["a", "b", None]},
        "scores": {"type": "array", "items": {"type": "number"}, "maxItems": 3},
        "note": {"type": "string", "maxLength": 4},
    },
    "required": ["id", "kind"],
    "additionalProperties": False,
}

ARITHMETIC = lark.Lark(grammars.load("arithmetic.lark"), lexer="dynamic_complete")
PARENS = re.compile(r"\([0-9]+\)")
CHOICES = ["yes", "no", "maybe"]


def is_model(model_type: type[BaseModel]) -> Callable[[Any], bool]:
    return lambda value: type(value) is model_type and model_type.model_validate(value.model_dump()) == value


#: name -> (output type, kind, is_json, whether a parsed value is what the type promises)
CASES: dict[str, tuple[Any, str, bool, Callable[[Any], bool]]] = {
    "model": (Person, "pydantic", True, is_model(Person)),
    "recursive model": (Tree, "pydantic", True, is_model(Tree)),
    "dataclass": (Point, "pydantic", True, lambda v: type(v) is Point and type(v.x) is int and type(v.y) is float),
    "TypedDict": (Movie, "pydantic", True, lambda v: set(v) == {"title", "year"} and 1900 <= v["year"] <= 2100),
    "NamedTuple": (Pair, "pydantic", True, lambda v: type(v) is Pair and type(v.right) is bool),
    "Optional": (Point | None, "pydantic", True, lambda v: v is None or type(v) is Point),
    "list[int]": (list[int], "pydantic", True, lambda v: type(v) is list and all(type(x) is int for x in v)),
    "dict[short str, bool]": (
        dict[Annotated[str, Field(max_length=3)], bool],
        "pydantic",
        True,
        lambda v: all(type(x) is bool for x in v.values()),
    ),
    "constrained int": (Annotated[int, Field(ge=0, le=100)], "pydantic", True, lambda v: type(v) is int and v <= 100),
    "Literal str": (Literal["a", "b"], "choices", False, lambda v: v in ("a", "b")),
    "Literal int": (Literal[1, 2], "choices", False, lambda v: type(v) is int and v in (1, 2)),
    "Literal mixed": (Literal["x", 7, False], "choices", False, lambda v: v in ("x", 7) or v is False),
    "str Enum": (Color, "choices", False, lambda v: type(v) is Color),
    "IntEnum": (Level, "choices", False, lambda v: type(v) is Level),
    "int": (int, "regex", False, lambda v: type(v) is int),
    "float": (float, "regex", False, lambda v: type(v) is float),  # 1e999 is read as inf, as float() reads it
    "bool": (bool, "choices", False, lambda v: type(v) is bool),
    "Regex": (Regex(r"[a-z]{2,5}-[0-9]{2}"), "regex", False, lambda v: re.fullmatch(r"[a-z]{2,5}-[0-9]{2}", v)),
    "Lark": (Lark(grammars.load("arithmetic.lark")), "lark", False, lambda v: ARITHMETIC.parse(v) is not None),
    "GBNF": (GBNF('top ::= "(" digit+ ")"\ndigit ::= [0-9]', start="top"), "gbnf", False, PARENS.fullmatch),
    "choices": (CHOICES, "choices", False, lambda v: v in CHOICES),
    "JSON Schema": (SCHEMA, "json_schema", True, lambda v: jsonschema.validate(v, SCHEMA) is None),
}

#: Walks per case, and the longest walk: a recursive type can nest past it, which skips that walk.
WALKS = 12
MAX_TOKENS = 300


@pytest.fixture(scope="module")
def weights(gemma_vocab) -> np.ndarray:
    return token_length_weights(gemma_vocab, power=3.0)


def walk_texts(structure, vocab, weights, seed: int) -> list[str]:
    """The texts of the walks that finished within MAX_TOKENS."""
    rng = np.random.default_rng(seed)
    walks = [random_walk(structure, rng, max_tokens=MAX_TOKENS, stop=0.3, weights=weights) for _ in range(WALKS)]
    return [vocab.decode(tokens).decode() for tokens in walks if tokens is not None]


# -- each kind: resolve, compile, walk, parse ------------------------------------------------------------------


@pytest.mark.parametrize("name", list(CASES))
def test_walks_parse_back_into_the_type(name, gemma_vocab, weights):
    python_type, kind, is_json, valid = CASES[name]
    resolved = output_type(python_type)
    assert (resolved.python_type, resolved.kind, resolved.is_json) == (python_type, kind, is_json)
    structure = resolved.compile(gemma_vocab)
    texts = walk_texts(structure, gemma_vocab, weights, seed=sum(map(ord, name)))
    assert len(texts) >= WALKS * 3 // 4, f"only {len(texts)} of {WALKS} walks finished"
    for text in texts:
        value = resolved.parse(text)
        assert valid(value), (text, value)
    assert len(set(texts)) > 1 or kind == "choices", texts


def test_recursive_walks_nest(gemma_vocab, weights):
    resolved = output_type(Tree)
    texts = walk_texts(resolved.compile(gemma_vocab), gemma_vocab, weights, seed=11)

    def depth(tree: Tree) -> int:
        return 1 + max(map(depth, tree.children), default=0)

    assert max(depth(resolved.parse(text)) for text in texts) >= 3, texts


def test_scalars_are_bare_text():
    """Each may end with one newline, which the value leaves out."""
    assert (output_type(int).spec, output_type(float).spec) == (f"({INT_PATTERN})\n?", f"({FLOAT_PATTERN})\n?")
    assert output_type(bool).spec == ("true", "false", "true\n", "false\n")
    assert output_type(Literal["x", 7, False]).spec == ("x", "7", "false", "x\n", "7\n", "false\n")
    assert output_type(Color).spec == ("red", "green", "red\n", "green\n")
    assert output_type(Level).spec == ("1", "10", "1\n", "10\n")
    assert output_type(Level).parse("10") is Level.HIGH
    assert output_type(Level).parse("10\n") is Level.HIGH
    assert output_type(int).parse("-42\n") == -42
    assert output_type(Literal[1, True]).parse("true") is True
    assert output_type(float).parse("-1.5e3") == -1500.0
    refused = [(int, " 1"), (int, "1_000"), (int, "01"), (int, "1\n\n"), (float, "nan"), (float, "1."), (bool, "True")]
    for python_type, text in refused:
        with pytest.raises(OutputValidationError) as caught:
            output_type(python_type).parse(text)
        assert caught.value.text == text


def test_constrained_scalars_keep_their_constraints(gemma_vocab):
    """pydantic's JSON honours them: a bounded int is the same bare number, a bounded str a quoted string."""
    bounded = output_type(Annotated[int, Field(ge=0, le=100)])
    assert bounded.parse("100") == 100
    with pytest.raises(OutputValidationError):
        bounded.parse("101")
    short = output_type(Annotated[str, Field(max_length=3)])
    assert short.kind == "pydantic" and short.parse('"abc"') == "abc"
    structure = short.compile(gemma_vocab)
    assert all(text.startswith('"') for text in walk_texts(structure, gemma_vocab, None, seed=0))


def test_free_text():
    for python_type in (None, str):
        resolved = output_type(python_type)
        assert (resolved.spec, resolved.kind, resolved.is_json) == (None, "text", False)
        assert resolved.compile(None) is None  # no vocabulary needed
        assert resolved.parse("any text {") == "any text {"
        assert resolved.partial('{"a": 1') is None


def test_resolution_and_compile_are_cached(gemma_vocab):
    assert output_type(Person) is output_type(Person)
    assert output_type(list[int]) is output_type(list[int])
    assert output_type(Person).compile(gemma_vocab) is output_type(Person).compile(gemma_vocab)
    assert output_type(SCHEMA).compile(gemma_vocab) is output_type(dict(SCHEMA)).compile(gemma_vocab)
    assert output_type(Regex("a+")).compile(gemma_vocab) is constrain.compile(Regex("a+"), gemma_vocab)


def test_compile_options_reach_constrain_compile(gemma_vocab):
    flexible = output_type(list[int]).compile(gemma_vocab, whitespace="flexible")
    assert walk_texts(flexible, gemma_vocab, None, seed=0)
    with pytest.raises(StructureError, match="start="):
        output_type(int).compile(gemma_vocab, start="x")
    with pytest.raises(ArgumentError, match="whitespace"):
        output_type(str).compile(gemma_vocab, whitespace="flexible")
    assert output_type(str).compile(gemma_vocab, strict=True) is None


# -- compiled structures ---------------------------------------------------------------------------------------


def test_a_compiled_structure_is_used_as_it_is(gemma_vocab, cl100k_vocab):
    structure = constrain.compile(r"[0-9]{3}", gemma_vocab)
    resolved = output_type(structure)
    assert (resolved.kind, resolved.is_json) == ("structure", False)
    assert resolved.compile(gemma_vocab) is structure
    assert resolved.parse("123") == "123"
    with pytest.raises(VocabularyError):
        resolved.compile(cl100k_vocab)
    with pytest.raises(ArgumentError):
        resolved.compile(gemma_vocab, time_limit=1.0)


def test_a_grammar_ir(gemma_vocab):
    grammar = ir.Grammar({"start": ir.Seq((ir.Literal("<"), ir.Regex("[a-z]{1,6}"), ir.Literal(">")))}, "start")
    resolved = output_type(grammar)
    assert resolved.kind == "grammar"
    texts = walk_texts(resolved.compile(gemma_vocab), gemma_vocab, token_length_weights(gemma_vocab, 3.0), 1)
    assert texts and all(re.fullmatch("<[a-z]{1,6}>", resolved.parse(text)) for text in texts)


# -- refusals --------------------------------------------------------------------------------------------------


class Opaque:
    pass


class WithOpaque(BaseModel):
    model_config = ConfigDict(arbitrary_types_allowed=True)
    thing: Opaque


class Shape(enum.Enum):
    SQUARE = (1, 1)


def some_function() -> int:
    return 1


@pytest.mark.parametrize(
    ("bad", "named"),
    [
        (Opaque(), "Opaque"),
        (some_function, "some_function"),
        (re, "module 're'"),
        (b"bytes", "b'bytes'"),
        (3, "3"),
        ([], "[]"),
        (["yes", 1], "['yes', 1]"),
        (Literal["a", None], "Literal"),
        (Literal["1", 1], "both"),
        (Literal[True, "true"], "both"),
        (Shape, "Shape"),
    ],
)
def test_what_is_not_an_output_type_is_refused(bad, named):
    with pytest.raises(OutputTypeError) as caught:
        output_type(bad)
    assert named in str(caught.value)
    assert caught.value.type is bad


def test_an_arbitrary_object_error_says_what_is_accepted():
    with pytest.raises(OutputTypeError, match="a value of type Opaque is not an output type; .*BaseModel"):
        output_type(Opaque())


def test_a_type_pydantic_cannot_describe_is_refused_at_resolution():
    for python_type in (WithOpaque, Opaque):
        with pytest.raises(PydanticSchemaError) as caught:
            output_type(python_type)
        assert caught.value.type is python_type


class Booking(BaseModel):
    day: datetime.date = Field(gt=datetime.date(2000, 1, 1))


def test_a_gap_between_schema_and_validation_is_refused_at_compile_in_strict_mode(gemma_vocab):
    resolved = output_type(Booking)  # resolves: pydantic writes a schema for it
    with pytest.raises(PydanticSchemaError, match="date bounds"):
        resolved.compile(gemma_vocab)
    assert resolved.compile(gemma_vocab, strict=False).relaxations


class Even(BaseModel):
    n: int = Field(ge=0, le=99)

    @field_validator("n")
    @classmethod
    def even(cls, n: int) -> int:
        if n % 2:
            raise ValueError("n must be even")
        return n


def test_validation_the_schema_cannot_say_refuses_the_text(gemma_vocab, gemma_tokenizer):
    resolved = output_type(Even)
    structure = resolved.compile(gemma_vocab)
    matcher = structure.matcher()
    matcher.advance(gemma_tokenizer.encode('{"n":7}', add_special_tokens=False))
    assert matcher.is_accepting()  # the structure takes it; only the validator refuses
    assert resolved.parse('{"n":8}') == Even(n=8)
    with pytest.raises(OutputValidationError, match="n must be even") as caught:
        resolved.parse('{"n":7}')
    assert caught.value.text == '{"n":7}'
    assert caught.value.errors[0]["loc"] == ("n",)


def test_a_json_schema_refusal_carries_the_text_and_errors():
    resolved = output_type(SCHEMA)
    assert resolved.parse('{"id":5,"kind":null}') == {"id": 5, "kind": None}
    with pytest.raises(OutputValidationError, match="1000") as caught:
        resolved.parse('{"id":1000,"kind":"a"}')
    assert caught.value.text == '{"id":1000,"kind":"a"}'
    assert all(isinstance(error, jsonschema.ValidationError) for error in caught.value.errors)
    with pytest.raises(OutputValidationError, match="not JSON"):
        resolved.parse('{"id":')
    with pytest.raises(OutputValidationError):
        output_type({"type": "string", "format": "date"}).parse('"2024-13-01"')
    assert output_type(True).parse("[1]") == [1]
    # no $schema and items as a list: draft-07, as the compiler reads it (2020-12 would not take the list)
    draft7 = output_type({"type": "array", "items": [{"type": "integer"}], "additionalItems": False})
    assert draft7.parse("[1]") == [1]
    with pytest.raises(OutputValidationError, match="Additional items"):
        draft7.parse("[1,2]")


def test_choices_refuse_other_texts():
    for python_type in (CHOICES, Literal["a", "b"], Color):
        with pytest.raises(OutputValidationError, match="none of"):
            output_type(python_type).parse("other")
    with pytest.raises(ArgumentError):
        output_type(CHOICES).parse(b"yes")


# -- partial JSON ----------------------------------------------------------------------------------------------


def is_prefix(partial: Any, final: Any) -> bool:
    """Whether ``partial``, the value of a prefix of a JSON text, can grow into ``final``: an object's keys are
    the first keys of the final object with their final values, except the last, which may still grow; likewise
    an array's items; a string may be cut short, and so may a number (``1`` of ``12``, ``12`` of ``12.5``)."""
    if isinstance(final, dict):
        if not isinstance(partial, dict) or list(partial) != list(final)[: len(partial)]:
            return False
        if not partial:
            return True
        *done, last = partial
        return all(partial[k] == final[k] for k in done) and is_prefix(partial[last], final[last])
    if isinstance(final, list):
        if not isinstance(partial, list) or len(partial) > len(final):
            return False
        if not partial:
            return True
        last = len(partial) - 1
        return partial[:last] == final[:last] and is_prefix(partial[last], final[last])
    if isinstance(final, str):
        return isinstance(partial, str) and final.startswith(partial)
    if type(final) in (int, float):
        if type(partial) is int and type(final) is int:
            return str(final).startswith(str(partial))
        return type(partial) in (int, float)
    return partial == final


@pytest.mark.parametrize("name", ["model", "recursive model", "TypedDict", "list[int]", "JSON Schema"])
def test_partial_json_of_every_prefix_grows_into_the_final_value(name, gemma_vocab, weights):
    resolved = output_type(CASES[name][0])
    texts = walk_texts(resolved.compile(gemma_vocab), gemma_vocab, weights, seed=7)
    assert texts
    for text in texts:
        final = json.loads(text)
        assert resolved.partial(text) == final
        for end in range(len(text)):
            partial = resolved.partial(text[:end])
            assert partial is None or is_prefix(partial, final), (text[:end], partial, final)


def test_partial_is_none_for_what_is_not_json():
    assert output_type(Person).partial("") is None
    assert output_type(Person).partial('{"name":"Al') == {"name": "Al"}
    assert output_type(int).partial("12") is None
    assert output_type(CHOICES).partial("yes") is None


def test_is_prefix():
    final = {"a": [1, "xy"], "b": 12.5}
    assert is_prefix({}, final) and is_prefix({"a": [1, "x"]}, final) and is_prefix({"a": [1, "xy"], "b": 12}, final)
    assert not is_prefix({"b": 12.5}, final)  # keys out of order
    assert not is_prefix({"a": [2]}, final) and not is_prefix({"a": [1, "xz"]}, final)
    assert not is_prefix({"a": [1], "b": 1}, final)  # "a" is finished once "b" starts
    assert is_prefix(1, 12) and not is_prefix(2, 12)


# -- constrain.compile of the wrappers -------------------------------------------------------------------------


def test_compile_regex_lark_gbnf_wrappers(gemma_vocab, weights):
    """A wrapper compiles to the structure of its text with the kind said: every walk under it is a text the
    unwrapped structure accepts token for token, and that its oracle accepts."""
    arithmetic = grammars.load("arithmetic.lark")
    parens = 'root ::= "(" [0-9]+ ")"'
    cases = [
        (Regex("[0-9]{2}"), "[0-9]{2}", "regex", re.compile("[0-9]{2}").fullmatch),
        (Lark(arithmetic), arithmetic, "lark", ARITHMETIC.parse),
        (GBNF(parens), parens, "gbnf", PARENS.fullmatch),
    ]
    rng = np.random.default_rng(3)
    for wrapped, text, kind, check in cases:
        structure = constrain.compile(wrapped, gemma_vocab)
        assert structure is constrain.compile(wrapped, gemma_vocab, kind=kind)
        unwrapped = constrain.compile(text, gemma_vocab, kind=kind)
        for _ in range(WALKS):
            tokens = random_walk(structure, rng, max_tokens=MAX_TOKENS, stop=0.3, weights=weights)
            assert tokens is not None
            assert check(gemma_vocab.decode(tokens).decode())
            matcher = unwrapped.matcher()
            matcher.advance(tokens)
            assert matcher.is_accepting()
    assert hash(Lark(arithmetic)) == hash(Lark(arithmetic)) and Lark(arithmetic) != Lark(arithmetic, start="sum")


def test_a_wrapper_start_is_the_start_option(gemma_vocab):
    text = 'top ::= "a" | other\nother ::= "b"'
    structure = constrain.compile(GBNF(text, start="other"), gemma_vocab)
    assert structure is not constrain.compile(GBNF(text, start="top"), gemma_vocab)
    assert constrain.compile(GBNF(text, start="top"), gemma_vocab, start="top") is not None
    with pytest.raises(StructureError, match="conflicts"):
        constrain.compile(GBNF(text, start="top"), gemma_vocab, start="other")
    assert constrain.compile(Lark('s: "x"', start="s"), gemma_vocab) is not None
    with pytest.raises(StructureError, match="start="):
        constrain.compile(Regex("a"), gemma_vocab, start="a")


def test_a_wrapper_kind_cannot_be_contradicted(gemma_vocab):
    with pytest.raises(StructureError, match="not kind='lark'"):
        constrain.compile(Regex("a"), gemma_vocab, kind="lark")
    with pytest.raises(StructureError, match="not kind='regex'"):
        constrain.compile(GBNF('root ::= "a"'), gemma_vocab, kind="regex")


@pytest.mark.parametrize(
    ("make", "parameter"),
    [
        (lambda: Regex(1), "pattern"),
        (lambda: Regex(b"a"), "pattern"),
        (lambda: Lark(None), "text"),
        (lambda: GBNF('root ::= "a"', start=1), "start"),
        (lambda: Lark('s: "x"', start=["s"]), "start"),
    ],
)
def test_wrappers_refuse_what_is_not_text(make, parameter):
    with pytest.raises(ArgumentError) as caught:
        make()
    assert caught.value.parameter == parameter


def test_output_type_is_generic():
    resolved: OutputType[Person] = output_type(Person)
    assert isinstance(resolved, OutputType)
    assert "python_type=" in repr(resolved) and "_read" not in repr(resolved)
