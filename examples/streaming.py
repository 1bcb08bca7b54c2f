"""Streaming: text chunks as they are generated, partial objects while JSON grows, and the async variants.

    python examples/streaming.py

- ``llm.stream(prompt)`` yields text chunks; they concatenate to the output's text (a chunk never holds half a
  UTF-8 character).
- ``llm.stream(prompt, Model, partial=True)`` yields the value parsed so far each time it grows (plain dicts,
  lists, strings and numbers), and last the validated ``Model``.
- ``llm.agenerate`` and ``llm.astream`` run the generation in a worker thread, so an event loop keeps serving.
"""

import asyncio
import sys
from typing import Literal

from pydantic import BaseModel, Field

import constrain


class Book(BaseModel):
    title: str = Field(max_length=40)
    author: str = Field(max_length=30)
    year: int = Field(ge=1000, le=2030)
    genre: Literal["novel", "poetry", "drama", "essay"]


BOOK_PROMPT = """Text: Hamlet is a play by William Shakespeare, written around 1600.
JSON: {"title":"Hamlet","author":"William Shakespeare","year":1600,"genre":"drama"}

Text: Pride and Prejudice, the novel by Jane Austen, appeared in 1813.
JSON: """


def stream_text(llm: constrain.LLM) -> bool:
    """Free text (no output_type), printed as it comes; True if the chunks join to what generate() returns."""
    prompt = "The three primary colours are"
    chunks = []
    for chunk in llm.stream(prompt, max_new_tokens=6):
        print(f"[{chunk}]", end="", flush=True)
        chunks.append(chunk)
    print()
    return "".join(chunks) == llm.generate(prompt, max_new_tokens=6)  # greedy: the same text


def stream_partial(llm: constrain.LLM) -> Book:
    values = list(llm.stream(BOOK_PROMPT, Book, partial=True, max_new_tokens=64))
    for value in values[:-1:4]:  # every fourth partial value, to keep the output short
        print(f"  partial: {value}")
    print(f"  {len(values) - 1} partial values, then the validated value:")
    print(f"  {values[-1]!r}")
    return values[-1]


async def run_async(llm: constrain.LLM) -> tuple[Book, str]:
    # The event loop stays free while the model runs: the ticker keeps ticking during the generation.
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.1)
            ticks += 1

    task = asyncio.create_task(ticker())
    book = await llm.agenerate(BOOK_PROMPT, Book, max_new_tokens=64)
    # A list of strings is a choice between them (a bare answer like this may end with one newline).
    choices = ["yes", "no"]
    text = "".join([chunk async for chunk in llm.astream("Is the sky blue on a clear day? Yes or no:", choices)])
    task.cancel()
    print(f"  agenerate: {book!r}")
    print(f"  astream: {text!r}; the event loop ticked {ticks} times meanwhile")
    return book, text


def main() -> int:
    llm = constrain.LLM()

    print("llm.stream, text chunks:")
    joined = stream_text(llm)

    print("llm.stream(partial=True):")
    book = stream_partial(llm)

    print("asyncio:")
    async_book, async_text = asyncio.run(run_async(llm))

    valid = (
        joined
        and isinstance(book, Book)
        and async_book == book  # greedy decoding: the same prompt gives the same value
        and async_text.rstrip("\n") in ("yes", "no")
    )
    print("valid: chunks, partial values and async results" if valid else "invalid")
    return 0 if valid else 1


if __name__ == "__main__":
    sys.exit(main())
