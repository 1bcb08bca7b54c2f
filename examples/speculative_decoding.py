"""Faster structured generation with the same output: fast-forward, the sparse output layer, and speculation.

    python examples/speculative_decoding.py

The prompt is a file of records and the model writes the next one, copying most of it from the lines above. The
same greedy generation runs three ways in constrain's own decoding loop:

1. plain: one token per forward pass, the structure's mask on each;
2. constrain.LLM's defaults for JSON: what the structure forces (the keys) is appended without sampling, and steps
   that allow few tokens compute only those tokens' logits;
3. plus speculative decoding with prompt-lookup drafts: the model checks several copied tokens in one pass.

The outputs of 2 and 3 are the same (speculation is exact); each run prints its tokens per second and forward passes
per token.
"""

import sys
import time

from pydantic import BaseModel, Field

import constrain
from constrain.decoding import ChainedDrafts, ForcedDrafts, PromptLookup, Speculation
from constrain.decoding.loop import Decoding


class Book(BaseModel):
    title: str = Field(max_length=40)
    author: str = Field(max_length=30)
    year: int = Field(ge=1000, le=2100)


PROMPT = """Books, one JSON record per line:
{"title":"Pride and Prejudice","author":"Jane Austen","year":1813}
{"title":"Emma","author":"Jane Austen","year":1815}
{"title":"Persuasion","author":"Jane Austen","year":1817}
"""


def run(llm: constrain.LLM, label: str, max_new_tokens: int = 48, **options) -> list[int]:
    backend = llm.backend
    decoding = Decoding(
        backend,
        [backend.encode(PROMPT)],
        structures=llm.structure(Book),
        max_new_tokens=max_new_tokens,
        eos_ids=[int(t) for t in llm.vocab.eos_ids],
        tokenize=backend.tokenize,
        **options,
    )
    began = time.perf_counter()
    row = decoding.run()[0]
    seconds = time.perf_counter() - began
    if not label:  # a warm-up run
        return row.tokens
    text = llm.vocab.decode(row.tokens).decode()
    print(f"{label:<28} {len(row.tokens) / seconds:5.1f} tok/s  {decoding.forward_passes / len(row.tokens):.2f} "
          f"passes/token  {text}")  # fmt: skip
    Book.model_validate_json(text)
    return row.tokens


def main() -> int:
    llm = constrain.LLM()
    run(llm, "", max_new_tokens=4)  # the first forward passes of a process are slower: not timed
    plain = run(llm, "plain", fast_forward="off")
    default = run(llm, "fast-forward + sparse layer", fast_forward="text")
    drafts = ChainedDrafts(ForcedDrafts(llm.backend.tokenize), PromptLookup())
    fast = run(llm, "... + speculation", fast_forward="text", speculation=Speculation(drafts, k=8))
    if fast != default:
        print("speculation changed the output", file=sys.stderr)
        return 1
    print("valid: three outputs, all Books; speculation left the output unchanged"
          + ("" if plain == default else " (fast-forward split the forced keys differently)"))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
