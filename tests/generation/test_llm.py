"""``constrain.LLM`` end to end on the embedded Gemma 3 270M: every kind of output type, batches, sampling,
streaming, async, decorators, chat input, llama.cpp, and bad input.

Prompts hold the answer to copy (a base model of 270M parameters copies well and reasons little), and every
schema bounds its strings and numbers, so greedy outputs finish within ``max_new_tokens``. What the tests check
is the library's promise, not the model's knowledge: the value has the type asked for and validates.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import json
from typing import Annotated, Literal

import jsonschema
import lark
import pytest
import torch
from pydantic import BaseModel, Field, field_validator
from transformers import LogitsProcessorList
from typing_extensions import TypedDict  # pydantic reads typing.TypedDict only from Python 3.12

import constrain
from constrain.decoding.loop import Decoding
from constrain.errors import (
    ArgumentError,
    ContextLengthError,
    IncompleteOutputError,
    OutputTypeError,
    OutputValidationError,
    PydanticSchemaError,
)
from constrain.generation.prompts import plain_chat
from constrain.integrations.transformers import StructureLogitsProcessor

pytestmark = pytest.mark.slow


class Address(BaseModel):
    city: str = Field(max_length=20)
    country: str = Field(max_length=20)


class Person(BaseModel):
    name: str = Field(max_length=30)
    age: int = Field(ge=0, le=120)
    address: Address


class Tree(BaseModel):
    label: str = Field(max_length=8)
    children: list[Tree] = Field(max_length=2)


PERSON_PROMPT = (
    'Text: Ada Lovelace, 36, lives in London, UK.\nJSON: {"name": "Ada Lovelace", "age": 36, "address": '
    '{"city": "London", "country": "UK"}}\n\nText: Alan Turing, 41, lives in Manchester, UK.\nJSON: '
)


def test_a_pydantic_model_comes_back_validated(llm):
    person = llm.generate(PERSON_PROMPT, Person, max_new_tokens=60)
    assert isinstance(person, Person) and isinstance(person.address, Address)
    assert person.name == "Alan Turing" and person.age == 41  # copied from the text: the prompt works


def test_a_recursive_model(llm):
    prompt = 'Copy the tree.\nTree: {"label":"root","children":[{"label":"leaf","children":[]}]}\nCopy: '
    tree = llm.generate(prompt, Tree, max_new_tokens=60)
    assert isinstance(tree, Tree) and all(isinstance(child, Tree) for child in tree.children)


@dataclasses.dataclass
class Point:
    x: Annotated[int, Field(ge=-9, le=9)]
    y: Annotated[int, Field(ge=-9, le=9)]


class Book(TypedDict):
    title: Annotated[str, Field(max_length=30)]
    year: Annotated[int, Field(ge=1000, le=2100)]


class Colour(enum.Enum):
    RED = "red"
    GREEN = "green"
    BLUE = "blue"


def test_dataclass_typed_dict_list_and_json_schema(llm):
    point = llm.generate('Point: {"x": 3, "y": -2}\nThe same point: ', Point, max_new_tokens=20)
    assert isinstance(point, Point)
    book = llm.generate('Book: {"title": "Dune", "year": 1965}\nAgain: ', Book, max_new_tokens=30)
    assert isinstance(book, dict) and set(book) == {"title", "year"}
    digits = llm.generate("Digits as a JSON list: [1, 2, 3]\nAgain: ", list[Annotated[int, Field(ge=0, le=9)]])
    assert isinstance(digits, list) and all(0 <= d <= 9 for d in digits)
    schema = {
        "type": "object",
        "properties": {
            "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3},
            "size": {"enum": ["S", "M", "L"]},
        },
        "required": ["tags", "size"],
        "additionalProperties": False,
    }
    value = llm.generate('{"tags": ["a", "c"], "size": "M"}\nAgain: ', schema, max_new_tokens=30)
    jsonschema.validate(value, schema)


def test_scalars_literals_and_enums(llm):
    sentiment = Literal["positive", "negative"]
    assert llm.generate("Review: 'I loved it.' Sentiment: ", sentiment) in ("positive", "negative")
    assert isinstance(llm.generate("Colour of the sky: ", Colour), Colour)
    answer = llm.complete("2+2=", int)  # the model ends the line after the number: the newline lets it
    assert isinstance(answer.value, int) and answer.text == f"{answer.value}\n"
    assert isinstance(llm.generate("Is the sky blue (true or false)? ", bool), bool)
    assert llm.generate("Answer with one of yes/no. Is water wet? ", ["yes", "no"]) in ("yes", "no")


def test_regex_and_grammars(llm):
    date = llm.generate("The Moon landing happened on (YYYY-MM-DD): ", constrain.Regex(r"\d{4}-\d{2}-\d{2}"))
    assert len(date) == 10 and date[4] == "-"
    # a line of arithmetic: the newline gives the model a way to end that it takes (after "3" it would go on)
    line = 'start: sum "\\n"\nsum: NUMBER ((PLUS | TIMES) NUMBER)*\nPLUS: " + "\nTIMES: " * "\n%import common.NUMBER\n'
    text = llm.generate("1 + 2 * 3\n4 * 5 + 6\n", constrain.Lark(line), max_new_tokens=20)
    lark.Lark(line).parse(text)
    gbnf = 'root ::= "(" [a-z]+ ")"'
    assert llm.generate("A word in brackets: ", constrain.GBNF(gbnf), max_new_tokens=12).startswith("(")


def test_free_text_is_the_default_and_stops_at_max_new_tokens(llm):
    completion = llm.complete("The capital of France is", max_new_tokens=5)
    assert isinstance(completion.text, str) and completion.value == completion.text
    assert len(completion.tokens) <= 5 and completion.finish_reason in ("stop", "length")


def test_the_loop_matches_transformers_generate_under_greedy(llm):
    """The same structure, greedy, gives the same tokens in constrain's loop and in transformers' generate(): the
    sparse output layer and the forced tokens change nothing (the forced text, "text" mode, would)."""
    backend = llm.backend
    structure = llm.structure(Person)
    ids = backend.encode(PERSON_PROMPT)
    out = backend.model.generate(
        torch.tensor([ids]),
        max_new_tokens=60,
        do_sample=False,
        logits_processor=LogitsProcessorList([StructureLogitsProcessor(structure)]),
        eos_token_id=[int(t) for t in llm.vocab.eos_ids],
    )
    theirs = [t for t in out[0, len(ids) :].tolist() if t not in llm.vocab.eos_ids]
    assert llm.backend.output_layer == "sparse"
    assert llm.complete(PERSON_PROMPT, Person, max_new_tokens=60, fast_forward="tokens").tokens == theirs


def test_speculation_keeps_the_greedy_output_and_a_batch_runs_row_by_row(llm):
    speculation = constrain.Speculation(constrain.PromptLookup(), k=4)
    plain = llm.complete([PERSON_PROMPT, PERSON_PROMPT + "  "], Person, max_new_tokens=60)
    fast = llm.complete([PERSON_PROMPT, PERSON_PROMPT + "  "], Person, max_new_tokens=60, speculation=speculation)
    assert [c.tokens for c in fast] == [c.tokens for c in plain]
    assert fast[0].value.name == "Alan Turing"


def test_a_batch_gives_what_each_prompt_gives_alone(llm):
    prompts = ["The Moon landing happened on (YYYY-MM-DD): ", "The Berlin Wall fell on (YYYY-MM-DD): "]
    date = constrain.Regex(r"\d{4}-\d{2}-\d{2}")
    assert llm.generate(prompts, date) == [llm.generate(p, date) for p in prompts]


def test_seeded_sampling_is_reproducible_and_valid(llm):
    runs = [llm.generate(PERSON_PROMPT, Person, temperature=1.0, seed=7, max_new_tokens=60) for _ in range(2)]
    assert runs[0] == runs[1]
    other = llm.generate(PERSON_PROMPT, Person, sampling=constrain.SamplingParams(temperature=1.0, top_p=0.9, seed=8))
    assert isinstance(other, Person)


def test_streamed_chunks_make_the_text_and_partial_values_grow_into_the_result(llm):
    chunks = list(llm.stream(PERSON_PROMPT, Person, max_new_tokens=60))
    assert "".join(chunks) == llm.complete(PERSON_PROMPT, Person, max_new_tokens=60).text
    values = list(llm.stream(PERSON_PROMPT, Person, partial=True, max_new_tokens=60))
    final = values[-1]
    assert isinstance(final, Person)
    assert all(_is_prefix(v, final.model_dump()) for v in values[:-1])
    assert len(values) > 3


def _is_prefix(partial, final) -> bool:
    """Whether a partial JSON value can grow into ``final``."""
    if isinstance(partial, dict):
        return isinstance(final, dict) and all(k in final and _is_prefix(v, final[k]) for k, v in partial.items())
    if isinstance(partial, list):
        return isinstance(final, list) and len(partial) <= len(final) and all(map(_is_prefix, partial, final))
    if isinstance(partial, str):
        return isinstance(final, str) and final.startswith(partial)
    if isinstance(partial, (int, float)) and not isinstance(partial, bool):
        return isinstance(final, (int, float)) and str(final).startswith(str(partial))
    return partial == final


def test_async_variants_give_what_the_sync_ones_give(llm):
    async def run():
        value = await llm.agenerate(PERSON_PROMPT, Person, max_new_tokens=60)
        chunks = [chunk async for chunk in llm.astream("The capital of France is", max_new_tokens=5)]
        return value, chunks

    value, chunks = asyncio.run(run())
    assert value == llm.generate(PERSON_PROMPT, Person, max_new_tokens=60)
    assert chunks == list(llm.stream("The capital of France is", max_new_tokens=5))


def test_decorators(llm):
    @constrain.structured(llm, max_new_tokens=60)
    class City(BaseModel):
        name: str = Field(max_length=20)
        country: str = Field(max_length=20)

    city = City.generate('Paris, France -> {"name": "Paris", "country": "France"}\nRome, Italy -> ')
    assert isinstance(city, City)

    @llm.function
    def capital(country: str) -> Literal["Paris", "Rome", "Berlin"]:
        """Capitals: France -> Paris. Germany -> Berlin. {country} ->"""

    assert capital("Italy") in ("Paris", "Rome", "Berlin")
    assert capital.__name__ == "capital"


def test_chat_messages_use_the_plain_format_without_a_template(llm):
    messages = [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "Say hi."}]
    assert plain_chat(messages) == "System: Answer briefly.\n\nUser: Say hi.\n\nAssistant:"
    assert llm.backend.chat_template() is None
    completion = llm.complete(messages, max_new_tokens=4)
    alone = llm.complete(plain_chat(messages), max_new_tokens=4)
    assert completion.tokens == alone.tokens


def test_chat_messages_use_the_tokenizers_template_when_it_has_one(llm):
    tokenizer = llm.backend.tokenizer
    tokenizer.chat_template = "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}<assistant>"
    try:
        completion = llm.complete([{"role": "user", "content": "Hello"}], max_new_tokens=3)
        assert completion.prompt_tokens == len(llm.backend.encode("<user>Hello<assistant>"))
    finally:
        tokenizer.chat_template = None


def test_llama_cpp_backend():
    llama_cpp = pytest.importorskip("llama_cpp")
    from constrain.models import gguf_model_path

    llm = constrain.LLM(llama_cpp.Llama(model_path=str(gguf_model_path()), n_ctx=512, n_threads=1, verbose=False))
    forced = llm.complete(PERSON_PROMPT, Person, max_new_tokens=60)  # JSON: the forced text, in one eval each
    assert isinstance(forced.value, Person) and forced.value.name == "Alan Turing"
    plain = llm.complete(PERSON_PROMPT, Person, max_new_tokens=60, fast_forward="off")
    assert plain.value == forced.value
    backend = llm.backend
    decoding = Decoding(
        backend, [backend.encode(PERSON_PROMPT)], structures=llm.structure(Person), max_new_tokens=60,
        eos_ids=[int(t) for t in llm.vocab.eos_ids], fast_forward="text", tokenize=backend.tokenize,
    )  # fmt: skip
    row = decoding.run()[0]
    assert row.forced > 0 and decoding.forward_passes < len(row.tokens)
    # forced tokens change nothing under greedy decoding; a regex with a long forced stretch
    date = constrain.Regex(r"year [0-9]{4}, month [0-9]{2}")
    outputs = {mode: llm.complete("The Moon landing: ", date, fast_forward=mode).tokens for mode in ("off", "tokens")}
    assert outputs["off"] == outputs["tokens"]
    assert llm.generate(["2 + 2 = ", "3 + 4 = "], constrain.Regex("[0-9]")) and llm.backend.max_batch == 1


def test_bad_input(llm):
    with pytest.raises(OutputTypeError, match="object"):
        llm.generate("x", object())

    class Opaque:
        pass

    class Holder(BaseModel, arbitrary_types_allowed=True):
        thing: Opaque

    with pytest.raises(PydanticSchemaError, match="Holder"):
        llm.generate("x", Holder)
    with pytest.raises(IncompleteOutputError) as cut:
        llm.generate(PERSON_PROMPT, Person, max_new_tokens=4)
    assert cut.value.text.startswith("{") and len(cut.value.tokens) == 4
    with pytest.raises(ContextLengthError, match="context holds 32,768 tokens"):
        llm.generate("hello " * 33_000, max_new_tokens=4)
    with pytest.raises(ArgumentError, match="temprature"):
        llm.generate("x", temprature=0.5)
    with pytest.raises(ArgumentError, match="batch"):
        list(llm.stream(["a", "b"]))
    with pytest.raises(ArgumentError, match="partial"):
        list(llm.stream("a", constrain.Regex("[ab]"), partial=True))
    with pytest.raises(ArgumentError, match="prompt"):
        llm.generate(42)


def test_a_validator_the_schema_cannot_express_is_reported_with_the_text(llm):
    class Shouting(BaseModel):
        word: str = Field(max_length=10)

        @field_validator("word")
        @classmethod
        def upper(cls, value: str) -> str:
            if not value.isupper():
                raise ValueError("not upper case")
            return value

    with pytest.raises(OutputValidationError) as refused:
        llm.generate('{"word": "hello"}\nAgain: ', Shouting, max_new_tokens=20)
    assert not json.loads(refused.value.text)["word"].isupper()  # the text the structure accepted, kept
