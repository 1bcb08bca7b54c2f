"""Your own decoding loop: constrain gives the mask, you own the model calls and the sampling.

    python examples/own_sampling_loop.py

The low-level API, for code that runs its own loop (a server, a custom sampler, another framework):

- ``constrain.compile(spec, vocab)``: once per structure and vocabulary; shared across sequences and threads;
- ``structure.matcher()``: one per sequence, cheap;
- each step: ``matcher.fill_bitmask(bitmask, row)`` writes the allowed tokens, the sampler draws under that mask,
  ``matcher.advance(token)`` reads the token.

Here with the embedded Gemma 3 270M through transformers, one forward pass per token thanks to the key-value
cache, and constrain's sampler (temperature 0.7, top-p 0.9, seeded, so the run is reproducible).
"""

import inspect
import sys
from typing import Literal

import torch
from pydantic import BaseModel, Field

import constrain
from constrain.models import load_default_model


class Pet(BaseModel):
    name: str = Field(max_length=20)
    species: Literal["cat", "dog", "rabbit", "parrot"]
    age: int = Field(ge=0, le=30)


PROMPT = 'A pet as JSON: {"name":"Rex","species":"dog","age":4}\nAnother pet as JSON: '
MAX_NEW_TOKENS = 48


def main() -> int:
    model, tokenizer = load_default_model()
    vocab = constrain.Vocabulary.from_tokenizer(tokenizer)  # exact token bytes, and the end-of-sequence ids
    structure = constrain.compile(Pet, vocab)
    matcher = structure.matcher()

    # The bitmask is as wide as the model's logits, which may be padded past the vocabulary; the extra ids are
    # never allowed. Allocate it once and reuse it at every step.
    width = model.get_output_embeddings().weight.shape[0]
    bitmask = constrain.allocate_token_bitmask(1, width)
    sampler = constrain.Sampler(constrain.SamplingParams(temperature=0.7, top_p=0.9, seed=0))
    end_ids = {int(t) for t in vocab.eos_ids}

    # transformers 5 calls the key-value cache argument `cache`; earlier versions `past_key_values`.
    cache_name = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    cache = None
    inputs = torch.tensor([tokenizer.encode(PROMPT)])  # the whole prompt on the first step, then one token
    generated: list[int] = []

    with torch.inference_mode():
        for _ in range(MAX_NEW_TOKENS):
            out = model(input_ids=inputs, use_cache=True, logits_to_keep=1, **{cache_name: cache})
            cache = getattr(out, cache_name)
            logits = out.logits[:, -1, :]  # (1, width)

            matcher.fill_bitmask(bitmask, 0)
            token = int(sampler.sample(logits, mask=bitmask)[0])  # masked tokens are never drawn
            matcher.advance(token)  # an end token is allowed only where the structure is complete
            if token in end_ids:
                break
            generated.append(token)
            inputs = torch.tensor([[token]])

    text = vocab.decode(generated).decode("utf-8")
    print(f"{len(generated)} tokens: {text}")
    if not matcher.is_accepting():
        print(f"invalid: stopped after {MAX_NEW_TOKENS} tokens before the structure was complete")
        return 1
    pet = Pet.model_validate_json(text)  # raises if the text is not a valid Pet
    print(f"valid: {pet!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
