"""Tool calling: Python functions as tools, an agent loop that runs them, and a forced call.

    python examples/tool_calling.py

- ``llm.run_tools(messages, tools)`` lets the model answer in text or call a tool; each call's arguments are valid
  by construction (the structure of ``constrain.tools.compile_tools``), the function runs, its result goes back as
  a tool message, and the loop goes on until the model answers in text.
- ``llm.respond(messages, tools, tool_choice={"name": ...})`` forces one call of one tool; its arguments come back
  converted to the function's parameter types.
- The embedded model is a 270M base model: one worked exchange in the chat shows it how a call and its result look.
"""

import sys
from datetime import date
from typing import Annotated, Literal

import jsonschema
from pydantic import Field

import constrain
from constrain.tools import as_tool

TEMPERATURES = {"Paris": 18, "Rome": 24, "Oslo": 4}


def get_weather(city: str, unit: Literal["C", "F"] = "C") -> dict:
    """Current weather in a city.

    Args:
        city: The city's name, e.g. "Paris".
        unit: The temperature unit.
    """
    celsius = TEMPERATURES.get(city, 15)
    return {"city": city, "temperature": celsius if unit == "C" else round(celsius * 9 / 5 + 32), "unit": unit}


def book_table(restaurant: str, day: date, guests: Annotated[int, Field(ge=1, le=12)]) -> str:
    """Book a table at a restaurant.

    Args:
        restaurant: The restaurant's name.
        day: The day of the booking.
        guests: How many people come.
    """
    return f"booked {restaurant} for {guests} on {day.isoformat()}"


WORKED_EXAMPLE = [
    {"role": "user", "content": "What is the weather in Rome?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Rome"}'}}
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": '{"city":"Rome","temperature":24,"unit":"C"}'},
    {"role": "assistant", "content": "It is 24 °C in Rome."},
]


def main() -> int:
    llm = constrain.LLM()
    tools = [get_weather, book_table]

    question = {"role": "user", "content": "What is the weather in Paris?"}
    run = llm.run_tools([*WORKED_EXAMPLE, question], tools, max_new_tokens=60, max_steps=3)
    for call, result in run.calls:
        print(f"call: {call.name}({call.raw}) -> {result}")
        jsonschema.validate(
            call.arguments, as_tool(get_weather if call.name == "get_weather" else book_table).parameters
        )
    print(f"answer: {run.answer}")
    ok = bool(run.calls) and bool(run.answer)

    turn = llm.respond(
        "Book a table for 4 at Chez Marie on 2027-03-14.",
        tools,
        tool_choice={"name": "book_table"},
        max_new_tokens=60,
    )
    (call,) = turn.tool_calls
    print(f"forced call: {call.name}{call.arguments}")
    ok = ok and isinstance(call.arguments["day"], date) and isinstance(call.arguments["guests"], int)
    print("valid" if ok else "INVALID")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
