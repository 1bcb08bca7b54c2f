"""Tool calling (:mod:`constrain.tools`): tools from functions, models and OpenAI dicts; the compiled structure of
the calls, with the real Gemma 3 and cl100k tokenizers, in each built-in format; calls read back and converted;
random walks under the mask; and tool sets built from MaskBench's BFCL records (real function schemas)."""

from __future__ import annotations

import datetime
import enum
import functools
import json
import random
import typing
import warnings

import jsonschema
import numpy as np
import pytest
from pydantic import BaseModel, Field

from constrain.compilers.api import RelaxationWarning
from constrain.testing import random_walk
from constrain.testing.maskbench import load_records
from constrain.tools import (
    FORMATS,
    Tool,
    ToolCallError,
    ToolError,
    as_tool,
    as_tools,
    compile_tools,
    parse_tool_calls,
    tools_prompt,
)

MASKBENCH = "/work/shared/data/maskbench-dev.jsonl.gz"
FORMAT_NAMES = list(FORMATS)


# -- the tools --------------------------------------------------------------------------------------------------


class Unit(enum.Enum):
    CELSIUS = "celsius"
    FAHRENHEIT = "fahrenheit"


def get_forecast(city: str, day: datetime.date, unit: Unit = Unit.CELSIUS, days: int = 1) -> str:
    """Get the weather forecast for a city.

    The forecast starts on ``day``.

    Args:
        city (str): The city's name.
        day: The first day of the forecast.
        unit: The temperature unit.
        days: How many days.

    Returns:
        The forecast.
    """
    return f"{city} {day} {unit} {days}"


def add(a: int, b: int) -> int:
    """Add two integers.

    :param a: The first one.
    :param int b: The second one.
    :returns: their sum.
    """
    return a + b


class Point(BaseModel):
    """A point on the plane."""

    x: int = Field(description="The abscissa.")
    y: int


TOOLS = as_tools([get_forecast, add, Point])
BY_NAME = {tool.name: tool for tool in TOOLS}
NAMED_ADD = {"type": "function", "function": {"name": "add"}}
CHOICES = {"auto": "auto", "required": "required", "named": NAMED_ADD}

FORECAST = ("get_forecast", {"city": "Paris", "day": "2024-05-01", "unit": "fahrenheit"})
ADD = ("add", {"a": 1, "b": -20})
POINT = ("Point", {"x": 3, "y": 4})
ZURICH = ("get_forecast", {"city": "Zürich", "day": "2000-02-29", "days": 3})


# -- tokenizers and helpers ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tokenizers(gemma_vocab, gemma_tokenizer, cl100k_vocab, cl100k):
    """name -> (vocabulary, encode): encode gives the tokens of a text without special tokens, checked to spell it."""

    def encoder(vocab, encode):
        def run(text: str) -> list[int]:
            ids = [int(t) for t in encode(text)]
            assert vocab.decode(ids) == text.encode(), text
            return ids

        return run

    return {
        "gemma": (gemma_vocab, encoder(gemma_vocab, lambda t: gemma_tokenizer.encode(t, add_special_tokens=False))),
        "cl100k": (cl100k_vocab, encoder(cl100k_vocab, lambda t: cl100k.encode(t, disallowed_special=()))),
    }


def fed(structure, tokens: list[int]) -> tuple[int, bool]:
    """How many of ``tokens`` the structure reads one by one (each allowed by the mask and by advance), and whether
    it may end after all of them."""
    matcher = structure.matcher()
    for i, token in enumerate(tokens):
        if not in_mask(matcher, token) or not matcher.accepts(token):
            return i, False
        matcher.advance(token)
    may_end = matcher.is_accepting() and any(in_mask(matcher, int(t)) for t in structure.vocab.eos_ids)
    return len(tokens), may_end


def in_mask(matcher, token: int) -> bool:
    return bool((int(matcher.mask()[token >> 5]) >> (token & 31)) & 1)


def accepted(structure, tokens: list[int]) -> bool:
    read, may_end = fed(structure, tokens)
    return read == len(tokens) and may_end


@functools.lru_cache(maxsize=4)
def walk_weights(vocab) -> np.ndarray:
    """Weights for random walks: printable ASCII tokens of up to 3 bytes, short ones first and JSON's punctuation
    far more often, so that strings and objects close within a few dozen tokens; any other token almost never."""
    lengths = np.diff(np.asarray(vocab.offsets))
    weights = np.full(vocab.size, 1e-9)
    for i in np.flatnonzero(np.asarray(vocab.matchable) & (lengths <= 3)).tolist():
        data = vocab.token_bytes(i)
        if all(32 <= c < 127 for c in data):
            weights[i] = (1.0 / (1 + len(data)) ** 3) * (300 if all(c in b'"{}[],:' for c in data) else 1)
    return weights


def check_calls(text: str, tools, fmt: str, *, required: bool):
    """Parse ``text`` and validate each call's arguments with jsonschema against its tool's parameters."""
    by_name = {t.name: t for t in as_tools(tools)}
    content, calls = parse_tool_calls(text, tools, format=fmt, required=required)
    for call in calls:
        jsonschema.validate(json.loads(call.raw), by_name[call.name].parameters)
    return content, calls


# -- Tool.from_function / from_model / from_openai ----------------------------------------------------------------


def test_a_function_tool_has_its_schema_from_hints_defaults_and_google_docstring():
    tool = Tool.from_function(get_forecast)
    assert tool.name == "get_forecast" and tool.function is get_forecast and tool.strict
    assert tool.description == "Get the weather forecast for a city."
    params = tool.parameters
    assert params["type"] == "object" and params["additionalProperties"] is False
    assert params["required"] == ["city", "day"]
    props = params["properties"]
    assert list(props) == ["city", "day", "unit", "days"]
    assert props["city"]["type"] == "string" and props["city"]["description"] == "The city's name."
    assert props["day"]["format"] == "date" and props["day"]["description"] == "The first day of the forecast."
    assert props["days"] == {"default": 1, "description": "How many days.", "title": "Days", "type": "integer"}
    assert props["unit"]["default"] == "celsius" and props["unit"]["description"] == "The temperature unit."
    unit = params["$defs"]["Unit"] if "$ref" in props["unit"] else props["unit"]
    assert unit["enum"] == ["celsius", "fahrenheit"]
    jsonschema.validate({"city": "x", "day": "2024-01-01"}, params)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"city": "x", "day": "2024-01-01", "unit": "kelvin"}, params)


def test_sphinx_docstrings_describe_arguments_and_a_name_can_be_given():
    tool = Tool.from_function(add, name="plus")
    assert tool.name == "plus" and tool.description == "Add two integers."
    props = tool.parameters["properties"]
    assert props["a"]["description"] == "The first one." and props["b"]["description"] == "The second one."
    assert tool.parameters["required"] == ["a", "b"]


def test_an_unannotated_parameter_takes_any_json_and_a_string_annotation_is_resolved():
    def f(x, y: int = 2):
        return x

    def g(day: datetime.date):
        return day

    g.__annotations__ = {"day": "datetime.date"}  # as `from __future__ import annotations` writes it
    props = Tool.from_function(f).parameters["properties"]
    assert "type" not in props["x"] and props["y"]["type"] == "integer"
    assert Tool.from_function(g).parameters["properties"]["day"]["format"] == "date"


@pytest.mark.parametrize("star", ["args", "kwargs"])
def test_star_parameters_are_refused(star):
    def f(a: int, *args: int) -> int:
        return a

    def g(a: int, **kwargs: int) -> int:
        return a

    with pytest.raises(ToolError, match=f"\\*{star}"):
        Tool.from_function(f if star == "args" else g)


class Opaque:
    """A type pydantic has no schema for."""


def test_a_type_pydantic_cannot_describe_is_refused():
    def f(x: Opaque) -> None:
        pass

    def g(callback: typing.Callable[[int], int]) -> None:
        pass

    for fn in (f, g):
        with pytest.raises(ToolError, match=f"function {fn.__name__}: its parameters have no JSON Schema"):
            Tool.from_function(fn)


def test_a_model_tool_has_the_models_fields_and_description():
    tool = Tool.from_model(Point)
    assert tool.name == "Point" and tool.model is Point and tool.function is None
    assert tool.description == "A point on the plane."
    assert tool.parameters["required"] == ["x", "y"]
    assert tool.parameters["properties"]["x"]["description"] == "The abscissa."
    assert "title" not in tool.parameters and "description" not in tool.parameters
    assert as_tool(Point).parameters == tool.parameters


def test_an_openai_tool_keeps_its_definition_and_strict_false():
    definition = {
        "type": "function",
        "function": {
            "name": "lookup-v2",
            "description": "Look up.",
            "parameters": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]},
            "strict": False,
        },
    }
    tool = Tool.from_openai(definition)
    assert (tool.name, tool.description, tool.strict) == ("lookup-v2", "Look up.", False)
    assert tool.parameters == definition["function"]["parameters"]
    assert tool.to_openai() == definition
    inner = Tool.from_openai({"name": "ping"})  # the inner function object, no parameters
    assert inner.strict and inner.parameters == {"type": "object", "properties": {}}
    assert Tool.from_openai({**definition["function"], "strict": True}).strict


@pytest.mark.parametrize("name", ["get weather", "pkg.fn", "", "x" * 65, "é", 5])
def test_bad_openai_names_are_refused(name):
    with pytest.raises(ToolError, match="tool name"):
        Tool.from_openai({"type": "function", "function": {"name": name}})


@pytest.mark.parametrize(
    "parameters",
    # the last two were a ValueError and a TypeError (dict(parameters) before the check) until fixed
    [{"type": "string"}, {"type": "array", "items": {}}, "an object", [["type", "object"]]],
)
def test_parameters_that_are_not_an_object_schema_are_refused(parameters):
    with pytest.raises(ToolError, match="parameters must be a JSON Schema of an object"):
        Tool.from_openai({"name": "f", "parameters": parameters})


@pytest.mark.parametrize(
    "schema, pointer",
    [
        ({"type": "object", "properties": {"x": {"type": "strin"}}}, "/properties/x/type"),
        ({"type": "object", "properties": {"x": {"minimum": "a"}}}, "/properties/x/minimum"),
        ({"type": "object", "required": "x"}, "/required"),
    ],
)
def test_an_invalid_schema_is_refused_with_its_pointer(schema, pointer):
    with pytest.raises(ToolError, match=f"parameters at {pointer} are not valid JSON Schema"):
        Tool.from_openai({"name": "f", "parameters": schema})


@pytest.mark.parametrize(
    "definition, message",
    [
        ({"type": "code_interpreter"}, "needs a 'name'"),
        ({"type": "retrieval", "function": {"name": "f"}}, "only 'function' tools"),
        ({"type": "function", "function": "f"}, "must be an object"),
        (["f"], "must be an object"),
    ],
)
def test_malformed_openai_definitions_are_refused(definition, message):
    with pytest.raises(ToolError, match=message):
        Tool.from_openai(definition)


def test_as_tools_refuses_duplicates_empty_lists_and_non_tools():
    with pytest.raises(ToolError, match="two tools are named 'add'"):
        as_tools([add, {"name": "add"}])
    with pytest.raises(ToolError, match="two tools are named 'add'"):
        as_tools([add, Tool.from_function(get_forecast, name="add")])
    with pytest.raises(ToolError, match="no tools"):
        as_tools([])
    for bad in ("add", {"name": "add"}, 3):
        with pytest.raises(ToolError, match="a list of tools"):
            as_tools(bad)
    with pytest.raises(ToolError, match="a tool is a function"):
        as_tools([3])
    assert [t.name for t in as_tools([add, Point, {"name": "x"}, TOOLS[0]])] == ["add", "Point", "x", "get_forecast"]


# -- compile_tools: options ---------------------------------------------------------------------------------------


def test_tool_choice_none_is_text_without_the_trigger(tokenizers):
    """``"none"`` (since bbf6e9d; the first version returned None): free text in which the trigger cannot occur."""
    vocab, encode = tokenizers["gemma"]
    structure = compile_tools(TOOLS, vocab, tool_choice="none")
    assert structure is not None
    assert accepted(structure, encode("Plain text, <tool_call without the end, and {} or [].")) is True
    assert accepted(structure, []) is True
    read, _ = fed(structure, encode("Sure. <tool_call>" + FORMATS["json"].write([ADD])))
    assert read < len(encode("Sure. <tool_call>"))  # refused within the trigger


def test_a_named_tool_that_is_not_offered_is_refused_naming_the_offered_ones(gemma_vocab):
    for choice in ({"type": "function", "function": {"name": "sub"}}, {"name": "sub"}):
        offered = r"'sub', which is not one of the tools offered \(get_forecast, add, Point\)"
        with pytest.raises(ToolError, match=offered):
            compile_tools(TOOLS, gemma_vocab, tool_choice=choice)
    with pytest.raises(ToolError, match="tool_choice must be"):
        compile_tools(TOOLS, gemma_vocab, tool_choice="any")


@pytest.mark.parametrize("parallel", [0, -1, 1.5, "2", None])
def test_a_bad_parallel_is_refused(gemma_vocab, parallel):
    with pytest.raises(ToolError, match="parallel must be"):
        compile_tools(TOOLS, gemma_vocab, parallel=parallel)


def test_required_refuses_text_and_auto_allows_it(tokenizers):
    vocab, encode = tokenizers["gemma"]
    required = compile_tools(TOOLS, vocab, tool_choice="required")
    auto = compile_tools(TOOLS, vocab, tool_choice="auto")
    text = encode("The weather is fine.")
    assert accepted(auto, text) and not accepted(required, text)
    assert not accepted(required, [])  # at least one call
    assert accepted(auto, [])
    call = FORMATS["json"].write([ADD])
    assert accepted(required, encode(call))
    assert accepted(auto, encode(call))  # in auto, a call without the trigger is plain text
    assert parse_tool_calls(call, TOOLS) == (call, [])
    assert accepted(auto, encode("<tool_call>" + call))
    assert accepted(auto, encode("Sure. <tool_call>" + call))


@pytest.mark.parametrize("fmt", FORMAT_NAMES)
def test_parallel_bounds_the_number_of_calls(tokenizers, fmt):
    vocab, encode = tokenizers["gemma"]
    form = FORMATS[fmt]
    for parallel, most in ((False, 1), (1, 1), (3, 3), (True, None)):
        structure = compile_tools(TOOLS, vocab, tool_choice="required", parallel=parallel, format=fmt)
        for count in range(1, 6):
            text = form.write([ADD, POINT, FORECAST, ADD, POINT][:count])
            expected = most is None or count <= most
            assert accepted(structure, encode(text)) == expected, (fmt, parallel, count)


@pytest.mark.parametrize("tools", [TOOLS, [add]], ids=["three tools", "the only tool"])
def test_a_named_tool_is_exactly_one_call_of_it(tokenizers, tools):
    vocab, encode = tokenizers["gemma"]
    for fmt in FORMAT_NAMES:
        form = FORMATS[fmt]
        structure = compile_tools(tools, vocab, tool_choice=NAMED_ADD, parallel=True, format=fmt)
        assert accepted(structure, encode(form.write([ADD])))
        assert not accepted(structure, encode(form.write([ADD, ADD])))
        assert not accepted(structure, encode(form.write([POINT])))
        assert not accepted(structure, encode("Sure. " + form.write([ADD], after_text=True)))


def test_compiled_structures_are_cached(gemma_vocab):
    first = compile_tools(TOOLS, gemma_vocab, tool_choice="required")
    assert compile_tools(as_tools([get_forecast, add, Point]), gemma_vocab, tool_choice="required") is first
    assert compile_tools([t.to_openai() for t in TOOLS], gemma_vocab, tool_choice="required") is first
    assert compile_tools(TOOLS, gemma_vocab, tool_choice="auto") is not first
    assert compile_tools(TOOLS, gemma_vocab, tool_choice="required", parallel=2) is not first
    assert compile_tools(TOOLS, gemma_vocab, tool_choice="required", format="hermes") is not first
    assert compile_tools(TOOLS, gemma_vocab, tool_choice="required", cache=False) is not first


def test_a_schema_refused_in_strict_mode_compiles_with_strict_false(gemma_vocab):
    unique = {"type": "array", "items": {"type": "integer"}, "uniqueItems": True}
    parameters = {"type": "object", "properties": {"ids": unique}}
    with pytest.raises(ToolError, match="'tags'.*/properties/ids/uniqueItems"):
        compile_tools([{"name": "tags", "parameters": parameters}], gemma_vocab)
    with pytest.warns(RelaxationWarning, match="tags: "):
        structure = compile_tools([{"name": "tags", "parameters": parameters, "strict": False}], gemma_vocab)
    assert structure.relaxations and all(r.startswith("tags: ") for r in structure.relaxations)


# -- compile_tools: the formats, with real tokenizers --------------------------------------------------------------


@pytest.mark.parametrize("choice", list(CHOICES))
@pytest.mark.parametrize("fmt", FORMAT_NAMES)
@pytest.mark.parametrize("name", ["gemma", "cl100k"])
def test_written_calls_are_accepted_token_by_token_and_may_end(tokenizers, name, fmt, choice):
    vocab, encode = tokenizers[name]
    form = FORMATS[fmt]
    structure = compile_tools(TOOLS, vocab, tool_choice=CHOICES[choice], format=fmt)
    auto = choice == "auto"
    call_lists = [[ADD]] if choice == "named" else [[FORECAST], [ADD, POINT], [POINT, ZURICH, ADD]]
    for calls in call_lists:
        text = ("I will check that. " if auto else "") + form.write(calls, after_text=auto)
        read, may_end = fed(structure, encode(text))
        assert read == len(encode(text)) and may_end, (text, read)
        content, parsed = check_calls(text, TOOLS, fmt, required=not auto)
        assert content == ("I will check that. " if auto else "")
        assert [(c.name, json.loads(c.raw)) for c in parsed] == [(n, a) for n, a in calls]
        # a prefix that stops inside the calls may not end there
        ids = encode(text)
        assert fed(structure, ids[:-1]) == (len(ids) - 1, False)


@pytest.mark.parametrize("name", ["gemma", "cl100k"])
def test_written_strings_are_the_json_the_structure_reads(tokenizers, name):
    """``ToolFormat.write`` writes non-ASCII characters as they are (it wrote ``\\u`` escapes, which the
    structure's canonical strings refuse, until fixed) and escapes what JSON must."""
    vocab, encode = tokenizers[name]
    structure = compile_tools(TOOLS, vocab, tool_choice="required")
    for city in ["Zürich 😀", "東京", '\n\t"\\/', "\x7f\x1f\x08", "\u2028", "<tool_call>", ""]:
        text = FORMATS["json"].write([("get_forecast", {"city": city, "day": "2024-01-01"})])
        assert accepted(structure, encode(text)), text
        (call,) = parse_tool_calls(text, TOOLS, required=True)[1]
        assert call.arguments["city"] == city


@pytest.mark.parametrize("fmt", FORMAT_NAMES)
def test_calls_whose_arguments_the_schema_refuses_are_rejected(tokenizers, fmt):
    vocab, encode = tokenizers["gemma"]
    form = FORMATS[fmt]
    structure = compile_tools(TOOLS, vocab, tool_choice="required", format=fmt)
    refused = [
        ("add", {"a": "1", "b": 2}),  # a string for an integer
        ("add", {"a": 1}),  # a required argument missing
        ("add", {"a": 1, "b": 2, "c": 3}),  # an argument that is not a parameter
        ("add", {"a": 1.5, "b": 2}),
        ("get_forecast", {"city": "Paris", "day": "2024-05-01", "unit": "kelvin"}),  # not in the enum
        ("get_forecast", {"city": "Paris", "day": "May 1st"}),  # not a date
        ("get_forecast", {"city": "Paris", "day": "2023-02-29"}),  # not a day of 2023
        ("Point", {"x": 1, "y": None}),
        ("sub", {"a": 1, "b": 2}),  # not a tool
    ]
    for call in refused:
        text = form.write([call])
        assert not accepted(structure, encode(text)), text
        with pytest.raises(ToolCallError):
            parse_tool_calls(text, TOOLS, format=fmt, required=True)
    assert accepted(structure, encode(form.write([("get_forecast", {"city": "", "day": "2024-02-29"})])))


def test_the_example_call_of_tools_prompt_is_accepted(tokenizers):
    vocab, encode = tokenizers["gemma"]
    for fmt in FORMAT_NAMES:
        prompt = tools_prompt(as_tools([add, Point]), format=fmt)
        assert "- add: Add two integers." in prompt and "- Point: A point on the plane." in prompt
        example = prompt.split("for example: ", 1)[1].rsplit("\nOtherwise answer in plain text.", 1)[0]
        assert FORMATS[fmt].trigger in example
        assert accepted(compile_tools([add, Point], vocab, format=fmt), encode(example)), example


# -- parse_tool_calls ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", FORMAT_NAMES)
def test_calls_read_back_with_converted_types(fmt):
    form = FORMATS[fmt]
    text = "Let me look. " + form.write([FORECAST, ADD, POINT], after_text=True)
    content, calls = parse_tool_calls(text, [get_forecast, add, Point], format=fmt)
    assert content == "Let me look. "
    assert [c.name for c in calls] == ["get_forecast", "add", "Point"]
    forecast, plus, point = (c.arguments for c in calls)
    assert forecast == {"city": "Paris", "day": datetime.date(2024, 5, 1), "unit": Unit.FAHRENHEIT, "days": 1}
    assert type(forecast["day"]) is datetime.date and type(forecast["unit"]) is Unit
    assert get_forecast(**forecast) == "Paris 2024-05-01 Unit.FAHRENHEIT 1"
    assert plus == {"a": 1, "b": -20} and add(**plus) == -19
    assert isinstance(point, Point) and (point.x, point.y) == (3, 4)
    assert json.loads(calls[0].raw) == FORECAST[1]
    assert calls[1].to_openai()["function"] == {"name": "add", "arguments": '{"a":1,"b":-20}'}
    assert calls[0].id != calls[1].id and calls[0].id.startswith("call_")
    # without the trigger it is an answer; required=True reads calls alone
    assert parse_tool_calls("No calls here.", TOOLS, format=fmt) == ("No calls here.", [])
    assert [c.name for c in parse_tool_calls(form.write([ADD]), TOOLS, format=fmt, required=True)[1]] == ["add"]


def test_an_openai_tool_call_gives_the_parsed_object():
    tool = {"name": "lookup", "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}
    _, (call,) = parse_tool_calls('<tool_call>{"name":"lookup","arguments":{"q":"x"}}', [tool])
    assert call.arguments == {"q": "x"}


def test_an_unknown_tool_is_an_error():
    with pytest.raises(ToolCallError, match=r"names 'sub', which is not one of the tools \(get_forecast, add, Point\)"):
        parse_tool_calls('<tool_call>{"name":"sub","arguments":{}}', TOOLS)


def test_bad_json_is_an_error_with_its_position():
    text = 'Sure.<tool_call>{"name":"add","arguments":{"a":1,,"b":2}}'
    with pytest.raises(ToolCallError, match="not JSON") as info:
        parse_tool_calls(text, TOOLS)
    assert info.value.position == text.index(",,") + 1 and info.value.text == text
    assert f"at character {info.value.position}" in str(info.value)
    text = '<tool_call>{"name":"add","arguments":{"a":1,"b":2}} and more'
    with pytest.raises(ToolCallError, match="unexpected text after the tool calls") as info:
        parse_tool_calls(text, TOOLS)
    assert info.value.position == text.index("and")
    text = '<tool_call>\n{"name":"add","arguments":{"a":1,"b":2}}\n</tool_cal>'
    with pytest.raises(ToolCallError, match="expected '</tool_call>'") as info:
        parse_tool_calls(text, TOOLS, format="hermes")
    assert info.value.position == text.index("</tool_cal>")


@pytest.mark.parametrize(
    "call, message",
    [
        ('{"name":"add","arguments":{"a":"1","b":2}}', "at /a"),
        ('{"name":"add","arguments":{"a":1}}', "at /: 'b' is a required property"),
        ('{"name":"get_forecast","arguments":{"city":"x","day":"2024-01-01","unit":"K"}}', "at /unit"),
        ('{"name":"Point","arguments":{"x":1,"y":2,"z":3}}', "at /: Additional properties"),
    ],
)
def test_arguments_the_schema_refuses_are_an_error_with_the_pointer(call, message):
    with pytest.raises(ToolCallError, match=message) as info:
        parse_tool_calls(call, TOOLS, required=True)
    assert info.value.position is None


@pytest.mark.parametrize(
    "text, message",
    [
        ('<tool_call>["add"]', 'an object with a "name"'),
        ('<tool_call>{"name":"add","args":{}}', "unexpected keys"),
        ('<tool_call>{"name":"add","arguments":[1,2]}', "must be an object"),
        ("<tool_call>[]", "an empty list of calls"),
    ],
)
def test_calls_not_in_the_format_are_errors(text, message):
    with pytest.raises(ToolCallError, match=message):
        parse_tool_calls(text, TOOLS)


# -- random walks under the mask -------------------------------------------------------------------------------------


PREFIXES = {
    "json": "Let me check. <tool_call>",
    "hermes": "Let me check.\n<tool_call>",
    "llama3_json": "<|python_tag|>",
}


@pytest.mark.parametrize("choice", list(CHOICES))
@pytest.mark.parametrize("fmt", FORMAT_NAMES)
@pytest.mark.parametrize("name", ["gemma", "cl100k"])
def test_random_walks_parse_and_validate(tokenizers, name, fmt, choice):
    vocab, encode = tokenizers[name]
    structure = compile_tools(TOOLS, vocab, tool_choice=CHOICES[choice], format=fmt)
    weights = walk_weights(vocab)
    auto = choice == "auto"
    starts = [("", structure.matcher())]
    if auto:  # walks from the start seldom write the trigger: walk on from after it too
        matcher = structure.matcher()
        prefix = PREFIXES[fmt]
        matcher.advance(encode(prefix))
        starts.append((prefix, matcher))
    finished = 0
    seeds = range(2) if name == "gemma" else range(1)
    for prefix, start in starts:
        for seed in seeds:
            tokens = random_walk(start, np.random.default_rng(seed), max_tokens=200, weights=weights, stop=0.5)
            if tokens is None:
                continue
            finished += 1
            text = prefix + vocab.decode(tokens).decode("utf-8")
            content, calls = check_calls(text, TOOLS, fmt, required=not auto)
            if prefix:
                assert calls and content == prefix.split("<")[0], text
            if choice == "named":
                assert [c.name for c in calls] == ["add"], text
            elif not auto:
                assert calls
    assert finished >= len(starts) * len(seeds) - 1


# -- BFCL tool sets from MaskBench ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def bfcl_tool_sets():
    """Tool sets of 4 functions from 40 of MaskBench's single-function ``BFCL_*`` records, drawn with a fixed seed.

    Each record's schema is ``{"properties": {"<function>": <arguments schema>}, "required": ["<function>"]}``
    with one valid test, the ground-truth arguments. Function names may hold dots (``math.factorial``); OpenAI
    names allow only letters, digits, ``_`` and ``-``, so dots become ``_``. A name already in the sample is
    skipped. Returns [(tools as OpenAI dicts, [(name, ground-truth arguments)])]."""
    records = [
        r
        for r in load_records(MASKBENCH)
        if r["name"].startswith("BFCL_") and len(r["schema"].get("properties", {})) == 1
    ]
    assert len(records) > 300
    rng = random.Random(20260)
    seen: set[str] = set()
    chosen = []
    for record in rng.sample(records, len(records)):
        ((function, parameters),) = record["schema"]["properties"].items()
        name = function.replace(".", "_")
        if name in seen:
            continue
        seen.add(name)
        (truth,) = [t["data"][function] for t in record["tests"] if t["valid"]]
        chosen.append(({"type": "function", "function": {"name": name, "parameters": parameters}}, (name, truth)))
        if len(chosen) == 40:
            break
    return [([t for t, _ in chosen[i : i + 4]], [c for _, c in chosen[i : i + 4]]) for i in range(0, 40, 4)]


@pytest.mark.parametrize("name", ["gemma", "cl100k"])
def test_bfcl_tool_sets_compile_and_accept_their_ground_truth(bfcl_tool_sets, tokenizers, name):
    vocab, encode = tokenizers[name]
    strict = 0
    for tools, truths in bfcl_tool_sets:
        try:
            structure = compile_tools(tools, vocab, tool_choice="required")
            strict += 1
        except ToolError:
            lenient = [{**t, "function": {**t["function"], "strict": False}} for t in tools]
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RelaxationWarning)
                structure = compile_tools(lenient, vocab, tool_choice="required")
        for truth in truths:
            text = FORMATS["json"].write([truth])
            assert accepted(structure, encode(text)), text
            (call,) = check_calls(text, tools, "json", required=True)[1]
            assert call.arguments == truth[1]
        everything = FORMATS["json"].write(truths)  # all four in one array of parallel calls
        assert accepted(structure, encode(everything)), everything
        # the ground truth under another function's name is refused (the argument names differ)
        (_, first_args), (other_name, _) = truths[0], truths[1]
        if set(first_args) and not _valid(tools, other_name, first_args):
            assert not accepted(structure, encode(FORMATS["json"].write([(other_name, first_args)])))
    assert strict >= 0.9 * len(bfcl_tool_sets)


def _valid(tools, name: str, arguments) -> bool:
    (tool,) = [t for t in tools if t["function"]["name"] == name]
    return jsonschema.Draft202012Validator(tool["function"]["parameters"]).is_valid(arguments)


def test_bfcl_random_walks_parse_and_validate(bfcl_tool_sets, tokenizers):
    vocab, _ = tokenizers["cl100k"]  # a third of Gemma's vocabulary: walks in strings cost a third
    weights = walk_weights(vocab)
    finished = 0
    for seed, (tools, _) in enumerate(bfcl_tool_sets):
        structure = compile_tools(tools, vocab, tool_choice="required")
        tokens = random_walk(structure, np.random.default_rng(seed), max_tokens=300, weights=weights, stop=0.5)
        if tokens is None:
            continue
        finished += 1
        text = vocab.decode(tokens).decode("utf-8")
        _, calls = check_calls(text, tools, "json", required=True)
        assert calls and {c.name for c in calls} <= {t["function"]["name"] for t in tools}
    assert finished >= 0.7 * len(bfcl_tool_sets)
