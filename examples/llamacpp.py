"""The same embedded Gemma 3 270M, as a GGUF through llama-cpp-python.

    python examples/llamacpp.py

Two routes:

1. ``constrain.LLM(llama)``: constrain's own decoding loop reads the logits from llama.cpp and samples under
   the structure's mask. Output types, batches, streaming and chat work as with transformers.
2. ``logits_processor_list``: keep calling ``llama(...)`` / ``create_completion`` as before, with constrain's
   logits processor masking llama.cpp's scores at every sampled token.
"""

import re
import sys

import llama_cpp
from pydantic import BaseModel, Field

import constrain
from constrain.integrations.llamacpp import logits_processor_list
from constrain.models import gguf_model_path

DATE = r"\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])"


class City(BaseModel):
    name: str = Field(max_length=30)
    country: str = Field(max_length=30)
    population_millions: int = Field(ge=0, le=100)


def main() -> int:
    # The vocabulary is read from llama.cpp itself (exact for any GGUF) and cached on disk.
    llama = llama_cpp.Llama(model_path=str(gguf_model_path()), n_ctx=512, verbose=False)

    # 1. constrain.LLM over the Llama.
    llm = constrain.LLM(llama)
    city = llm.generate(
        'The capital of Spain, as JSON: {"name":"Madrid","country":"Spain","population_millions":3}\n'
        "The capital of Japan, as JSON: ",
        output_type=City,
        max_new_tokens=48,
    )
    print(f"constrain.LLM:          {city!r}")

    # 2. llama-cpp-python's own sampling with constrain's processor. Make one list per call: the processor
    #    follows one generation (the vocabulary and the compiled regex are cached, so this is cheap).
    processors = logits_processor_list(llama, DATE)
    out = llama(
        "The first crewed Moon landing happened on (YYYY-MM-DD): ",
        max_tokens=16,
        temperature=0,
        logits_processor=processors,
        # The processor runs inside a ctypes callback, where exceptions are dropped; its stopping criteria
        # re-raise them here (constrain.integrations.llamacpp.create_completion does both in one call).
        stopping_criteria=processors[0].stopping_criteria(),
    )
    date = out["choices"][0]["text"]
    print(f"logits_processor_list:  {date!r} (finish_reason={out['choices'][0]['finish_reason']})")

    valid = isinstance(city, City) and re.fullmatch(DATE, date) is not None
    print("valid: a City and a date" if valid else "invalid")
    return 0 if valid else 1


if __name__ == "__main__":
    sys.exit(main())
