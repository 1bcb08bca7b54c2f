"""``LLM.respond`` and ``LLM.run_tools`` on the embedded model: calls valid by construction, dispatched to the
functions, results fed back, text answers, stop strings and the plain chat format's stop."""

from __future__ import annotations

import json
from datetime import date
from typing import Annotated, Literal

import jsonschema
import pytest
from pydantic import Field

import constrain
from constrain.errors import IncompleteOutputError, ToolError
from constrain.generation.agent import ToolRun
from constrain.tools import as_tool

pytestmark = pytest.mark.slow


CALLS: list[tuple[str, str]] = []


def get_weather(city: str, unit: Literal["C", "F"] = "C") -> dict:
    """Current weather in a city.

    Args:
        city: The city's name.
        unit: The temperature unit.
    """
    CALLS.append(("get_weather", city))
    return {"city": city, "temperature": 18, "unit": unit}


def book_table(restaurant: str, day: date, guests: Annotated[int, Field(ge=1, le=12)]) -> str:
    """Book a table."""
    CALLS.append(("book_table", restaurant))
    return "booked"


def broken(city: str) -> str:
    """Always fails."""
    raise RuntimeError("service down")


EXAMPLE = [
    {"role": "user", "content": "What is the weather in Rome?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Rome"}'}}
        ],
    },
    {"role": "tool", "tool_call_id": "c1", "content": '{"city":"Rome","temperature":24,"unit":"C"}'},
    {"role": "assistant", "content": "It is 24 degrees in Rome."},
]
QUESTION = {"role": "user", "content": "What is the weather in Paris?"}


def test_run_tools_calls_the_function_and_answers_in_text(llm):
    CALLS.clear()
    seen = []
    run = llm.run_tools([*EXAMPLE, QUESTION], [get_weather], max_new_tokens=48, on_call=lambda c, r: seen.append(r))
    assert isinstance(run, ToolRun)
    assert run.calls and [("get_weather", c.arguments["city"]) for c, _ in run.calls] == CALLS
    assert seen == [r for _, r in run.calls]
    for call, _ in run.calls:
        jsonschema.validate(json.loads(call.raw), as_tool(get_weather).parameters)
    roles = [m["role"] for m in run.messages[len(EXAMPLE) + 1 :]]
    assert roles[0] == "assistant" and "tool" in roles and roles[-1] == "assistant"
    assert run.messages[-1]["content"] == run.answer and run.answer
    tool_message = next(m for m in run.messages[len(EXAMPLE) :] if m["role"] == "tool")
    assert json.loads(tool_message["content"])["temperature"] == 18


def test_the_last_step_asks_for_text(llm):
    run = llm.run_tools([*EXAMPLE, QUESTION], [get_weather], max_new_tokens=48, max_steps=1)
    assert run.steps == 1 and run.calls == [] and run.answer


def test_a_failing_function_hands_the_model_the_error(llm):
    run = llm.run_tools(
        "Weather in Oslo?", [broken], tool_choice="required", max_new_tokens=40, max_steps=2, parallel=False
    )
    assert len(run.calls) == 1 and isinstance(run.calls[0][1], RuntimeError)
    tool_message = next(m for m in run.messages if m["role"] == "tool")
    assert tool_message["content"] == "error: RuntimeError: service down"


def test_forced_call_converts_arguments(llm):
    turn = llm.respond(
        "Book a table for 4 at Chez Marie on 2027-03-14.", [get_weather, book_table],
        tool_choice={"type": "function", "function": {"name": "book_table"}}, max_new_tokens=60,
    )  # fmt: skip
    (call,) = turn.tool_calls
    assert call.name == "book_table"
    assert isinstance(call.arguments["day"], date) and 1 <= call.arguments["guests"] <= 12
    assert turn.message["tool_calls"][0]["function"]["name"] == "book_table"


@pytest.mark.parametrize("fmt", ["json", "hermes", "llama3_json"])
def test_required_calls_parse_in_every_format(llm, fmt):
    turn = llm.respond(
        [*EXAMPLE, QUESTION], [get_weather], tool_choice="required", format=fmt, parallel=False, max_new_tokens=48
    )
    assert len(turn.tool_calls) == 1 and turn.tool_calls[0].name == "get_weather"


def test_tool_choice_none_is_free_text(llm):
    turn = llm.respond([*EXAMPLE, QUESTION], [get_weather], tool_choice="none", max_new_tokens=16)
    assert turn.tool_calls == [] and "<tool_call>" not in turn.content


def test_run_tools_needs_functions(llm):
    schema_only = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    with pytest.raises(ToolError, match="have none: f"):
        llm.run_tools("hi", [schema_only])


def test_stop_strings_cut_the_output(llm):
    free = llm.complete("Count: one, two, three, four,", max_new_tokens=12)
    assert "," in free.text
    stop = free.text[free.text.index(",") :]
    cut = llm.complete("Count: one, two, three, four,", max_new_tokens=12, stop=",")
    assert cut.finish_reason == "stop" and "," not in cut.text and free.text.startswith(cut.text)
    assert stop  # the free output went past the stop string


def test_a_plain_chat_stops_at_the_next_user_turn(llm):
    completion = llm.complete([{"role": "user", "content": "Say hello."}], max_new_tokens=40)
    assert "User:" not in completion.text


def test_a_stop_inside_a_structure_is_incomplete(llm):
    with pytest.raises(IncompleteOutputError):
        llm.generate("Name: ", constrain.Regex("[A-Z][a-z]+ [A-Z][a-z]+"), stop=" ", max_new_tokens=12)
