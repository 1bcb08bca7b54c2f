"""Decorators: a Pydantic model that generates itself, and a function whose docstring is the prompt.

    python examples/decorator.py

- ``@constrain.structured(llm)`` gives a model class ``generate``, ``agenerate`` and ``stream`` class methods
  that return instances of it. The class's schema is compiled at decoration, so a type the compiler refuses
  fails at import time, not in the middle of a request.
- ``@llm.function`` turns a function into a call to the model: its docstring is a ``str.format`` template of the
  parameters, its return annotation the output type. The body is never run.

Neither retries: every output is valid for its type by construction.
"""

import sys
from typing import Literal

from pydantic import BaseModel, Field

import constrain

llm = constrain.LLM()  # the embedded Gemma 3 270M


# Keywords given to the decorator (here max_new_tokens) are defaults of every call.
@constrain.structured(llm, max_new_tokens=48)
class Capital(BaseModel):
    country: str = Field(max_length=30)
    city: str = Field(max_length=30)
    continent: Literal["Africa", "Americas", "Asia", "Europe", "Oceania"]


@llm.function
def sentiment(review: str) -> Literal["positive", "negative", "neutral"]:
    """Classify the sentiment of each review.

    Review: I love this phone, the screen is gorgeous.
    Sentiment: positive

    Review: {review}
    Sentiment:"""


# A parameter's default fills the template too. An int is written as a bare number, which may end with one
# newline: that is where a base model ends an answer line, and the value leaves it out.
@llm.function(max_new_tokens=8)
def year_of(event: str, example: str = "Q: When did the French Revolution begin?\nA: 1789") -> int:
    """{example}

    Q: When did {event}?
    A:"""


def main() -> int:
    capital = Capital.generate(
        'The capital of Spain, as JSON: {"country":"Spain","city":"Madrid","continent":"Europe"}\n'
        "The capital of Japan, as JSON: "
    )
    print(repr(capital))

    reviews = ["The battery died after two days.", "Fast delivery, works perfectly."]
    labels = [sentiment(review) for review in reviews]
    for review, label in zip(reviews, labels):
        print(f"{review!r} -> {label}")

    year = year_of("Apollo 11 land on the Moon")
    print(f"Apollo 11 -> {year}")

    valid = (
        isinstance(capital, Capital)
        and all(label in ("positive", "negative", "neutral") for label in labels)
        and isinstance(year, int)
    )
    print("valid: a Capital, two sentiment labels and a year" if valid else "invalid")
    return 0 if valid else 1


if __name__ == "__main__":
    sys.exit(main())
