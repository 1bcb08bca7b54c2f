"""Extract fields from a short text into a Pydantic model, in one call.

    python examples/pydantic_extraction.py

``llm.generate(prompt, output_type=Person)`` compiles Person's JSON Schema once for the model's vocabulary, keeps
every generated token inside it, and returns a validated ``Person``. The model is the embedded Gemma 3 270M (a
base model, on the CPU): small, so the prompt shows it one example, and every string and number is bounded so
that the output ends within a few dozen tokens.
"""

import sys
from typing import Literal

from pydantic import BaseModel, Field

import constrain


class Person(BaseModel):
    name: str = Field(max_length=40)
    birth_year: int = Field(ge=1000, le=2100)
    city: str = Field(max_length=30)
    # A Literal becomes an enum in the schema: the model can only pick one of these.
    occupation: Literal["mathematician", "physicist", "chemist", "writer", "other"]


# One worked example, then the text to extract from. The JSON is compact because that is how constrain writes it
# (no whitespace, keys in the model's order), so the example looks like what the model will produce.
EXAMPLE = """Extract the person as JSON.

Text: Alan Turing, the mathematician, was born in London in 1912.
JSON: {"name":"Alan Turing","birth_year":1912,"city":"London","occupation":"mathematician"}

"""
TEXTS = [
    "Marie Curie was a physicist. She was born in Warsaw in 1867.",
    "The novelist Jane Austen was born in Steventon in 1775.",
]


def prompt(text: str) -> str:
    return f"{EXAMPLE}Text: {text}\nJSON: "


def main() -> int:
    llm = constrain.LLM()  # the embedded Gemma 3 270M through transformers; decoding is greedy by default

    # One prompt in, one validated Person out.
    person = llm.generate(prompt(TEXTS[0]), output_type=Person, max_new_tokens=64)
    print(repr(person))

    # A list of prompts is a batch, decoded together. complete() gives the raw text and what it cost as well.
    for completion in llm.complete([prompt(t) for t in TEXTS], output_type=Person, max_new_tokens=64):
        print(f"{completion.text}  ({len(completion.tokens)} tokens, finish_reason={completion.finish_reason})")
        # The library validated it already; checking again here shows what "valid" means.
        if Person.model_validate_json(completion.text) != completion.value:
            print("invalid: the text does not validate to the returned value")
            return 1

    if not isinstance(person, Person):
        print("invalid: not a Person")
        return 1
    print("valid: every output is a Person")
    return 0


if __name__ == "__main__":
    sys.exit(main())
