"""End to end with the real Gemma 3 270M model: ``constrain.generate`` under JSON Schemas and regexes, greedy and
sampled, every output checked by the oracle (``jsonschema`` with the format checker, ``re.fullmatch``); Gemma's two
end tokens; bad input. The transformers processor's own cases (a batch of regexes, beam search, narrow logits, a
structure for another vocabulary in ``generate``, a dead end on a toy vocabulary) are in test_transformers.py.

Every schema bounds its strings and arrays (or its recursion needs the model to close it, greedy only), so outputs
finish within ``max_new_tokens``; a row cut off there would fail ``json.loads``.
"""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import torch
from jsonschema import Draft202012Validator
from transformers import LogitsProcessorList

import constrain
from constrain.compilers.json_schema import compile_json_schema
from constrain.compilers.regex import compile_regex
from constrain.errors import (
    DeadEndError,
    GrammarError,
    JsonSchemaError,
    RegexError,
    ShapeError,
    TokenError,
    VocabularyError,
)
from constrain.grammar.ir import Grammar, Literal, Ref, Seq
from constrain.integrations.transformers import StructureLogitsProcessor
from constrain.models.gemma import load_default_model
from constrain.runtime.pushdown import compile_grammar
from constrain.testing import tiny_vocabulary
from constrain.vocab.vocabulary import Vocabulary

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def gemma():
    """The model, loaded once for the module, run on one torch thread: on a shared 2-core machine two OpenMP threads
    that wait for each other made generation up to 8x slower than one (restored afterwards)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    model, tokenizer = load_default_model()
    yield model, tokenizer, Vocabulary.from_tokenizer(tokenizer)
    torch.set_num_threads(threads)


def obj(properties: dict, required: list[str] | None = None) -> dict:
    return {
        "type": "object",
        "properties": properties,
        "required": list(properties) if required is None else required,
        "additionalProperties": False,
    }


NODE = obj(
    {
        "value": {"type": "integer", "minimum": 0, "maximum": 9},
        "children": {"type": "array", "items": {"$ref": "#/$defs/node"}, "maxItems": 2},
    },
    ["value"],
)

# name -> (prompt, schema, max_new_tokens)
SCHEMAS: dict[str, tuple[str, dict, int]] = {
    "nested objects": (
        "A customer with a postal address, as JSON: ",
        obj(
            {
                "name": {"type": "string", "minLength": 1, "maxLength": 16},
                "address": obj(
                    {"city": {"type": "string", "maxLength": 16}, "zip": {"type": "string", "pattern": "^[0-9]{5}$"}}
                ),
            }
        ),
        48,
    ),
    "array with min/maxItems": (
        "Four lottery numbers as a JSON array: ",
        {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 99}, "minItems": 2, "maxItems": 4},
        24,
    ),
    "enums": (
        "A T-shirt order as JSON: ",
        obj({"color": {"enum": ["red", "green", "blue"]}, "size": {"enum": ["S", "M", "L", None]}}),
        24,
    ),
    "integer ranges": (
        "A player as JSON: ",
        obj(
            {
                "age": {"type": "integer", "minimum": 18, "maximum": 65},
                "score": {"type": "integer", "exclusiveMinimum": -10, "maximum": 10},
                "level": {"type": "integer", "minimum": 100, "maximum": 250},
            }
        ),
        32,
    ),
    "string formats": (
        "A user account as JSON: ",
        obj(
            {
                "born": {"type": "string", "format": "date"},
                "email": {"type": "string", "format": "email"},
                "id": {"type": "string", "format": "uuid"},
            }
        ),
        96,
    ),
    "pattern": (
        "A licence plate as a JSON string: ",
        {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$"},
        16,
    ),
    "anyOf": (
        "A shape as JSON: ",
        {
            "anyOf": [
                obj({"kind": {"const": "circle"}, "radius": {"type": "integer", "minimum": 1, "maximum": 100}}),
                obj(
                    {
                        "kind": {"const": "rect"},
                        "width": {"type": "integer", "minimum": 1, "maximum": 100},
                        "height": {"type": "integer", "minimum": 1, "maximum": 100},
                    }
                ),
                {"type": "null"},
            ]
        },
        32,
    ),
    "tool call": (
        "Weather tool call as JSON: ",
        obj(
            {
                "name": {"const": "get_weather"},
                "arguments": obj(
                    {"city": {"type": "string", "maxLength": 20}, "unit": {"enum": ["celsius", "fahrenheit"]}}
                ),
            }
        ),
        40,
    ),
    "array of objects": (
        "The items of an order, as JSON: ",
        {
            "type": "array",
            "items": obj(
                {
                    "sku": {"type": "string", "pattern": "^[A-Z]{2}[0-9]{3}$"},
                    "qty": {"type": "integer", "minimum": 1, "maximum": 5},
                }
            ),
            "minItems": 1,
            "maxItems": 3,
        },
        56,
    ),
    "booleans, decimals, string arrays": (
        "A feature flag as JSON: ",
        obj(
            {
                "enabled": {"type": "boolean"},
                "ratio": {"type": "number", "minimum": 0, "maximum": 1, "multipleOf": 0.01},
                "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 3},
            }
        ),
        48,
    ),
    # $ref recursion: the root must have a child, each node may have more; the prompt shows a depth-3 example
    "recursive $ref": (
        'A tree: {"value":1,"children":[{"value":2,"children":[{"value":3}]},{"value":4}]}\nAnother tree: ',
        {
            "$defs": {"node": NODE},
            **obj(
                {
                    "value": {"type": "integer", "minimum": 0, "maximum": 9},
                    "children": {"type": "array", "items": {"$ref": "#/$defs/node"}, "minItems": 1, "maxItems": 2},
                }
            ),
        },
        64,
    ),
}
UNBOUNDED = {"recursive $ref"}  # only greedy: sampling may keep nesting


def validate(schema: dict, text: str):
    value = json.loads(text)
    Draft202012Validator(schema, format_checker=Draft202012Validator.FORMAT_CHECKER).validate(value)
    return value


@pytest.fixture(scope="module")
def structures(gemma):
    _, _, vocab = gemma
    return {name: compile_json_schema(schema, vocab) for name, (_, schema, _) in SCHEMAS.items()}


@pytest.mark.parametrize("name", list(SCHEMAS))
def test_json_schema_greedy(gemma, structures, name):
    model, tokenizer, _ = gemma
    prompt, schema, max_new_tokens = SCHEMAS[name]
    text = constrain.generate(model, tokenizer, prompt, structures[name], max_new_tokens=max_new_tokens)
    value = validate(schema, text)
    if name == "recursive $ref":
        depth = lambda node: 1 + max((depth(c) for c in node.get("children", [])), default=0)  # noqa: E731
        assert depth(value) >= 2, text


def sample(model, tokenizer, names, structures, seed):
    torch.manual_seed(seed)
    texts = constrain.generate(
        model,
        tokenizer,
        [SCHEMAS[n][0] for n in names],
        [structures[n] for n in names],
        max_new_tokens=max(SCHEMAS[n][2] for n in names),
        do_sample=True,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
    )
    for name, text in zip(names, texts):
        try:
            validate(SCHEMAS[name][1], text)
        except Exception as exc:
            raise AssertionError(f"{name}: {text!r}") from exc


def test_json_schemas_sampled_in_one_batch(gemma, structures):
    """The bounded schemas at once, one row each (rows of one batch follow different structures), sampled from the
    model's full distribution under the structure; the long one (a uuid is ~36 tokens) alone, so the batch is short."""
    model, tokenizer, _ = gemma
    sample(model, tokenizer, [n for n in SCHEMAS if n not in UNBOUNDED | {"string formats"}], structures, seed=1234)
    sample(model, tokenizer, ["string formats"], structures, seed=1234)


OCTET = r"(25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)"
REGEXES = {
    "phone": ("Call us at ", r"\(\d{3}\) \d{3}-\d{4}"),
    "date": ("The invoice is dated ", r"\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])"),
    "ipv4": ("The server's IP address is ", rf"({OCTET}\.){{3}}{OCTET}"),
    "choice": ("My favourite fruit is the ", r"(apple|banana|cherry|dragon fruit)"),
    "csv line": ("name,age,member\n", r"[A-Z][a-z]{1,9},\d{1,3},(true|false)"),
}


@pytest.mark.parametrize("name", list(REGEXES))
def test_regex_greedy(gemma, name):
    model, tokenizer, vocab = gemma
    prompt, pattern = REGEXES[name]
    text = constrain.generate(model, tokenizer, prompt, compile_regex(pattern, vocab), max_new_tokens=24)
    assert re.fullmatch(pattern, text), (pattern, text)


def test_regexes_sampled_in_one_batch(gemma):
    model, tokenizer, vocab = gemma
    names = list(REGEXES)
    torch.manual_seed(99)
    texts = constrain.generate(
        model,
        tokenizer,
        [REGEXES[n][0] for n in names],
        [compile_regex(REGEXES[n][1], vocab) for n in names],
        max_new_tokens=24,
        do_sample=True,
        temperature=1.2,
    )
    for name, text in zip(names, texts):
        assert re.fullmatch(REGEXES[name][1], text), (name, text)


def test_greedy_is_unchanged_by_prompt_lookup_speculation(gemma, structures):
    """Assisted generation (prompt lookup) proposes drafts, verifies them, and rolls the processor back over the
    rejected ones: greedy output under a structure must be the same as without it."""
    model, tokenizer, _ = gemma
    prompt = 'Call: {"name":"get_weather","arguments":{"city":"Paris","unit":"celsius"}}\nCall: '
    structure = structures["tool call"]
    plain = constrain.generate(model, tokenizer, prompt, structure, max_new_tokens=40)
    assisted = constrain.generate(model, tokenizer, prompt, structure, max_new_tokens=40, prompt_lookup_num_tokens=4)
    assert assisted == plain
    validate(SCHEMAS["tool call"][1], plain)


# ------------------------------------------------------------------------------------------------------------
# Gemma's two end tokens: <eos> (1) and <end_of_turn> (106)
# ------------------------------------------------------------------------------------------------------------


class Prefer:
    """A logits processor run after the structure's: among the finite logits, push ``token`` of each row to the top."""

    def __init__(self, tokens: list[int]):
        self.tokens = tokens

    def __call__(self, input_ids, scores):
        for row, token in enumerate(self.tokens):
            if torch.isfinite(scores[row, token]):
                scores[row, token] = 1e4
        return scores


def test_both_end_tokens_are_allowed_once_complete(gemma):
    _, tokenizer, vocab = gemma
    assert {1, 106} <= {int(t) for t in vocab.eos_ids}
    structure = compile_regex("(yes|no)", vocab)
    text_ids = tokenizer("yes", add_special_tokens=False)["input_ids"]
    processor = StructureLogitsProcessor(structure)
    prompt = [2, 818]
    scores = torch.zeros((1, 262_144))
    out = processor(torch.tensor([prompt]), scores.clone())
    assert not torch.isfinite(out[0, [1, 106]]).any()  # not before the structure is complete
    out = processor(torch.tensor([prompt + text_ids]), scores.clone())
    assert set(torch.nonzero(torch.isfinite(out[0])).flatten().tolist()) == {1, 106}


def test_generation_stops_on_either_end_token(gemma):
    """Once the structure is complete only 1 and 106 are allowed; a row that picks 106 stops there just as one that
    picks 1 (the model's generation config stops on both)."""
    model, tokenizer, vocab = gemma
    structure = compile_regex("(yes|no)", vocab)
    tokenizer.padding_side = "left"
    inputs = tokenizer(["Is water wet? Answer: ", "Is fire cold? Answer: "], return_tensors="pt", padding=True)
    max_new = 12
    out = model.generate(
        **inputs,
        logits_processor=LogitsProcessorList([StructureLogitsProcessor(structure), Prefer([106, 1])]),
        max_new_tokens=max_new,
        do_sample=False,
        pad_token_id=tokenizer.pad_token_id,
    )
    generated = out[:, inputs["input_ids"].shape[1] :].tolist()
    assert len(generated[0]) < max_new  # stopped early, not cut off
    for row, end in zip(generated, (106, 1)):
        k = row.index(end)
        assert re.fullmatch("(yes|no)", tokenizer.decode(row[:k])), row
        assert all(t == tokenizer.pad_token_id for t in row[k + 1 :]), row
    # the convenience function stops on both too, and leaves them out of the text
    texts = constrain.generate(model, tokenizer, ["Is water wet? Answer: "], structure, max_new_tokens=max_new)
    assert re.fullmatch("(yes|no)", texts[0])


# ------------------------------------------------------------------------------------------------------------
# bad input
# ------------------------------------------------------------------------------------------------------------


def test_logits_narrower_than_the_tokenizer_inside_generate(gemma):
    """A model whose logits are narrower than the structure's vocabulary (here: cut by a processor before ours)."""
    model, tokenizer, vocab = gemma
    inputs = tokenizer(["x"], return_tensors="pt")
    narrow = lambda ids, scores: scores[:, :100_000]  # noqa: E731
    with pytest.raises(ShapeError, match="tokenizer and model do not match"):
        model.generate(
            **inputs,
            logits_processor=LogitsProcessorList([narrow, StructureLogitsProcessor(compile_regex("a+", vocab))]),
            max_new_tokens=2,
            pad_token_id=tokenizer.pad_token_id,
        )


def test_padded_logits_columns_are_masked(gemma):
    gemma_vocab = gemma[2]
    processor = StructureLogitsProcessor(compile_regex("[a-z]+", gemma_vocab))
    out = processor(torch.tensor([[2]]), torch.zeros((1, gemma_vocab.size + 64)))
    assert torch.isinf(out[0, gemma_vocab.size :]).all() and torch.isfinite(out[0]).any()


def test_structures_of_another_vocabulary(gemma, cl100k_vocab):
    model, tokenizer, vocab = gemma
    other = compile_regex("[a-z]+", cl100k_vocab)  # a real tokenizer, and narrower than Gemma's logits
    with pytest.raises(VocabularyError, match="another vocabulary"):
        constrain.generate(model, tokenizer, "x", other)
    with pytest.raises(VocabularyError, match="same vocabulary"):
        StructureLogitsProcessor([compile_regex("[a-z]+", vocab), other])


def test_structures_that_can_never_end_are_refused_at_compile_time(gemma):
    gemma_vocab = gemma[2]
    with pytest.raises(RegexError, match="matches no string"):
        compile_regex(r"a+[^\s\S]", gemma_vocab)
    with pytest.raises(GrammarError, match="never complete"):
        compile_grammar(Grammar({"start": Seq([Literal("a"), Ref("start")])}, start="start"), gemma_vocab)
    recursive = {"$defs": {"n": obj({"next": {"$ref": "#/$defs/n"}})}, "$ref": "#/$defs/n"}
    with pytest.raises(JsonSchemaError, match="recursion that never ends"):
        compile_json_schema(recursive, gemma_vocab)
    with pytest.raises(JsonSchemaError, match="unsatisfiable"):
        compile_json_schema({"type": "integer", "minimum": 5, "maximum": 3}, gemma_vocab)


# ------------------------------------------------------------------------------------------------------------
# the processor's bookkeeping, on a toy vocabulary (no model)
# ------------------------------------------------------------------------------------------------------------

TOY = [b"a", b"b", b"c", b"ab", b"xy"]
TOY_EOS = len(TOY)


@pytest.fixture(scope="module")
def toy():
    return tiny_vocabulary(TOY)


def allowed(scores_row) -> set[int]:
    return set(torch.nonzero(torch.isfinite(scores_row)).flatten().tolist())


def expected(structure, tokens) -> set[int]:
    m = structure.matcher()
    for t in tokens:
        if m.is_finished():
            break
        m.advance(t)
    return set(m.allowed_tokens().tolist())


def test_dead_end_mid_generation_in_a_batch(toy):
    # after "a", "c" is allowed (the DFA reads "cd"), but no token reads "d": after "ac" the row is stuck
    stuck = compile_regex("a(cd|b)", toy)
    processor = StructureLogitsProcessor(stuck, on_dead_end="stop")
    scores = torch.zeros((2, TOY_EOS + 1))
    processor(torch.tensor([[9], [9]]), scores.clone())
    out = processor(torch.tensor([[9, 0], [9, 0]]), scores.clone())
    assert allowed(out[0]) == allowed(out[1]) == {1, 2}
    out = processor(torch.tensor([[9, 0, 2], [9, 0, 1]]), scores.clone())
    assert allowed(out[0]) == {TOY_EOS}  # row 0 ("ac") is at a dead end: sent to the end of sequence
    assert allowed(out[1]) == {TOY_EOS}  # row 1 ("ab") is complete
    out = processor(torch.tensor([[9, 0, 2, TOY_EOS], [9, 0, 1, TOY_EOS]]), scores.clone())
    assert allowed(out[0]) == allowed(out[1]) == {TOY_EOS}
    # assisted generation rolls row 0 back to before its dead end: it follows the structure again
    out = processor(torch.tensor([[9, 0], [9, 0]]), scores.clone())
    assert allowed(out[0]) == allowed(out[1]) == {1, 2}
    out = processor(torch.tensor([[9, 0, 1], [9, 0, 2]]), scores.clone())
    assert allowed(out[0]) == allowed(out[1]) == {TOY_EOS}

    raising = StructureLogitsProcessor(stuck)
    raising(torch.tensor([[9], [9]]), scores.clone())
    raising(torch.tensor([[9, 0], [9, 0]]), scores.clone())
    with pytest.raises(DeadEndError, match="row 1") as info:
        raising(torch.tensor([[9, 0, 1], [9, 0, 2]]), scores.clone())
    assert info.value.text == "ac"
    # a token the structure does not allow (another processor changed the logits after ours): TokenError
    raising = StructureLogitsProcessor(stuck)
    raising(torch.tensor([[9], [9]]), scores.clone())
    with pytest.raises(TokenError):
        raising(torch.tensor([[9, 0], [9, 2]]), scores.clone())


def test_incremental_sync_matches_fresh_matchers(toy):
    """The one-token fast path, reordered rows (beam search), rollbacks (assisted generation), finished rows padded
    after the end token, and generate() writing input_ids into one buffer in place: every mask is the one a fresh
    matcher gives for the row's tokens."""
    structure = compile_regex("(a(b|c)c|abc)*", toy)
    processor = StructureLogitsProcessor(structure)
    rng = np.random.default_rng(0)
    batch, prompt = 4, [7, 8]
    rows: list[list[int]] = [[] for _ in range(batch)]
    buffer = torch.zeros((batch, 64), dtype=torch.long)
    buffer[:, :2] = torch.tensor(prompt)
    out = processor(buffer[:, :2], torch.zeros((batch, TOY_EOS + 1)))  # the first call sees the prompt alone
    assert all(allowed(out[i]) == expected(structure, []) for i in range(batch))
    paths = set()
    for step in range(40):
        event = rng.random()
        if step and event < 0.2:  # beam search: rows reordered (within one prompt's beams), then a token each
            rows = [list(rows[i]) for i in rng.permutation(batch)]
            paths.add("reorder")
        elif step and event < 0.35:  # assisted generation: rejected drafts dropped, then a token each
            cut = int(rng.integers(1, 3))
            rows = [r[: len(r) - cut] for r in rows] if min(len(r) for r in rows) >= cut else rows
            paths.add("rollback")
        for r in rows:
            options = sorted(expected(structure, r))
            token = int(rng.choice(options))
            if token == TOY_EOS and rng.random() < 0.7 and len(options) > 1:
                token = int(rng.choice([t for t in options if t != TOY_EOS]))
            r.append(token)
        length = 2 + len(rows[0])
        for i in range(batch):
            buffer[i, :length] = torch.tensor(prompt + rows[i])
        out = processor(buffer[:, :length], torch.zeros((batch, TOY_EOS + 1)))
        for i in range(batch):
            assert allowed(out[i]) == expected(structure, rows[i]), (step, i, rows[i])
    assert paths == {"reorder", "rollback"}
    assert any(TOY_EOS in r for r in rows)  # a finished row, padded with more tokens after its end
    # the same processor for a new generation: a prompt of the same length, or the same prompt again
    for prompts in ([[5, 5]] * batch, [[5, 5]] * batch, [[6, 6, 6]] * batch):
        out = processor(torch.tensor(prompts), torch.zeros((batch, TOY_EOS + 1)))
        assert all(allowed(out[i]) == expected(structure, []) for i in range(batch))
        out = processor(torch.tensor([p + [0] for p in prompts]), torch.zeros((batch, TOY_EOS + 1)))
        assert all(allowed(out[i]) == expected(structure, [0]) for i in range(batch))
