"""A JSON Schema with nested objects, arrays and enums: through constrain.LLM, then through transformers' own
``model.generate()`` with constrain's logits processor.

    python examples/json_schema_transformers.py

A JSON Schema dict as ``output_type`` returns parsed JSON (dicts and lists), checked by ``jsonschema``. The
low-level route is for code that already calls ``model.generate()``: build the vocabulary from the tokenizer
(cached on disk), compile the schema once, and pass a ``StructureLogitsProcessor`` per call.
"""

import json
import sys

import jsonschema
from transformers import LogitsProcessorList

import constrain
from constrain.integrations.transformers import StructureLogitsProcessor
from constrain.models import load_default_model

# Every string, array and number is bounded, so a small model's output ends within max_new_tokens.
SCHEMA = {
    "type": "object",
    "properties": {
        "title": {"type": "string", "maxLength": 40},
        "year": {"type": "integer", "minimum": 1900, "maximum": 2030},
        "genre": {"enum": ["drama", "comedy", "science fiction", "animation"]},
        "director": {
            "type": "object",
            "properties": {
                "name": {"type": "string", "maxLength": 30},
                "country": {"type": "string", "maxLength": 20},
            },
            "required": ["name", "country"],
            "additionalProperties": False,
        },
        "cast": {"type": "array", "items": {"type": "string", "maxLength": 30}, "minItems": 1, "maxItems": 2},
    },
    "required": ["title", "year", "genre", "director", "cast"],
    "additionalProperties": False,
}

PROMPT = """Describe the film as JSON.

Text: Toy Story (1995) is an animated film by the American director John Lasseter, with Tom Hanks and Tim Allen.
JSON: {"title":"Toy Story","year":1995,"genre":"animation","director":{"name":"John Lasseter","country":"USA"},\
"cast":["Tom Hanks","Tim Allen"]}

Text: Titanic is a 1997 drama directed by James Cameron, from Canada, starring Leonardo DiCaprio and Kate Winslet.
JSON: """


def check(label: str, value: object) -> None:
    """Raises jsonschema.ValidationError if the value does not follow the schema."""
    jsonschema.validate(value, SCHEMA)
    print(f"{label}: {json.dumps(value)}")


def main() -> int:
    # Load the model once and share it: constrain.LLM takes a transformers model and its tokenizer too.
    model, tokenizer = load_default_model()

    # 1. The one-call route: the schema dict is the output type; the value is json.loads of the text, validated.
    llm = constrain.LLM(model, tokenizer)
    film = llm.generate(PROMPT, output_type=SCHEMA, max_new_tokens=96)
    check("constrain.LLM", film)

    # 2. The transformers route. The vocabulary reads every token's exact bytes from the tokenizer; compile()
    #    turns the schema into automata over that vocabulary, once (it is cached by schema and vocabulary).
    vocab = constrain.Vocabulary.from_tokenizer(tokenizer)
    structure = constrain.compile(SCHEMA, vocab)
    inputs = tokenizer(PROMPT, return_tensors="pt")
    output = model.generate(
        **inputs,
        max_new_tokens=96,
        do_sample=False,
        # A new processor per call: it keeps one matcher per row of this generation.
        logits_processor=LogitsProcessorList([StructureLogitsProcessor(structure)]),
        pad_token_id=tokenizer.pad_token_id,
    )
    new_tokens = output[0, inputs["input_ids"].shape[1] :]
    text = tokenizer.decode(new_tokens, skip_special_tokens=True)  # the end-of-turn token is not part of the JSON
    check("model.generate", json.loads(text))
    # Both routes decode greedily with the same mask, so they write the same text.
    print(f"same output on both routes: {json.loads(text) == film}")

    print("valid: both outputs follow the schema")
    return 0


if __name__ == "__main__":
    sys.exit(main())
