"""Forced continuations: the forced bytes against a brute-force oracle, forced tokens in the loop, and the
tokenizer's split of forced text on the real Gemma vocabulary.

The oracle reads masks over a byte vocabulary (one token per byte), where the allowed tokens are exactly the bytes
that may come next: a byte is forced when it is the only one and the structure may not end there.
"""

from __future__ import annotations

import json
import re

import jsonschema
import numpy as np
import pytest

from constrain.compilers.json_schema import compile_json_schema
from constrain.compilers.lark import compile_lark
from constrain.compilers.regex import compile_regex
from constrain.decoding.forcing import forced_continuation
from constrain.decoding.loop import Decoding
from constrain.decoding.params import SamplingParams
from constrain.errors import ArgumentError
from constrain.testing import byte_vocabulary, random_walk, tiny_vocabulary
from tests.decoding.test_loop import TableModel

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "role": {"enum": ["admin", "user"]},
        "tags": {"type": "array", "items": {"const": "x"}, "maxItems": 3},
    },
    "required": ["name", "age", "role"],
    "additionalProperties": False,
}
LARK = r"""
start: "call " NAME "(" args? ")" ";"
args: NUMBER ("," NUMBER)*
NAME: /[a-z]+/
NUMBER: /[0-9]+/
"""


def oracle_forced_bytes(matcher) -> bytes:
    """The forced bytes from the masks of a byte vocabulary: one allowed byte at a time, until the end may come."""
    probe = matcher.copy()
    eos = set(probe.structure.vocab.eos_ids.tolist())
    out = bytearray()
    while not probe.is_accepting():
        allowed = [t for t in probe.allowed_tokens().tolist() if t not in eos]
        if len(allowed) != 1:
            break
        out.append(allowed[0])
        probe.advance(allowed[0])
    return bytes(out)


@pytest.fixture(scope="module")
def byte_structures():
    vocab = byte_vocabulary()
    return {
        "regex": compile_regex(r"id-[0-9]{2,3}-(end|stop)!", vocab),
        "json": compile_json_schema(PERSON, vocab),
        "lark": compile_lark(LARK, vocab),
    }


@pytest.mark.parametrize("kind", ["regex", "json", "lark"])
def test_forced_bytes_equal_the_oracle_along_random_walks(byte_structures, kind):
    structure = byte_structures[kind]
    checked = 0
    for seed in range(25):
        walk = random_walk(structure, seed, max_tokens=200, stop=0.3)
        assert walk is not None
        matcher = structure.matcher()
        for token in walk:
            assert matcher.forced_bytes() == oracle_forced_bytes(matcher)
            matcher.advance(token)
            checked += 1
        assert matcher.forced_bytes() == b""  # the walk stopped where the structure may end
    assert checked > 100


def test_forced_bytes_of_a_json_object_run_to_the_first_choice(byte_structures):
    matcher = byte_structures["json"].matcher()
    assert matcher.forced_bytes() == b'{"name":"'
    matcher.advance(list(b'{"name":"Al"'))
    assert matcher.forced_bytes() == b',"age":'
    assert matcher.forced_bytes(limit=3) == b',"a'


def test_forced_tokens_leave_the_output_unchanged_and_save_forward_passes():
    vocab = tiny_vocabulary(["id", "-", "0", "1", "2", "end", "e", "nd", "!", "x"])
    structure = compile_regex(r"id-[012]{2}-end!", vocab)
    runs = {}
    for mode in ("off", "tokens"):  # greedy: a seeded sampler would draw no number for a forced token
        model = TableModel(vocab.size, seed=7)
        decoding = Decoding(model, [[9], [3]], structures=structure, fast_forward=mode)
        rows = decoding.run()
        runs[mode] = ([r.tokens for r in rows], model.passes, [r.forced for r in rows])
    assert runs["tokens"][0] == runs["off"][0]
    for tokens in runs["off"][0]:
        assert re.fullmatch(r"id-[012]{2}-end!", vocab.decode(tokens).decode())
    # "id" and "-" are forced at the start, "-" after the digits; "end" / "e"+"nd" is a choice, "!" is forced
    assert runs["off"][2] == [0, 0]
    assert all(forced >= 3 for forced in runs["tokens"][2])
    assert runs["tokens"][1] < runs["off"][1]


def test_forced_tokens_respect_max_new_tokens():
    vocab = tiny_vocabulary(["a", "b"])
    structure = compile_regex(r"a{6}b?", vocab)
    row = Decoding(TableModel(vocab.size), [[0]], structures=structure, max_new_tokens=4).run()[0]
    assert row.tokens == [0] * 4 and row.forced == 4 and row.finish_reason == "length"


def test_a_fully_forced_structure_needs_no_forward_pass():
    vocab = tiny_vocabulary(["ok", "o", "k"])
    model = TableModel(vocab.size)
    decoding = Decoding(model, [[0]], structures=compile_regex("ok", vocab), fast_forward="tokens")
    steps = list(decoding)
    assert decoding.rows[0].finish_reason == "stop" and decoding.rows[0].complete
    # "ok" and "o" fit at the start: a choice, so the model is asked once, then "k" may be forced
    assert model.passes <= 1 and [t for step in steps for _, t in step] == decoding.rows[0].tokens


def test_text_mode_needs_a_tokenizer_and_modes_are_checked():
    vocab = tiny_vocabulary(["a"])
    structure = compile_regex("a+", vocab)
    model = TableModel(vocab.size)
    with pytest.raises(ArgumentError, match="tokenize"):
        Decoding(model, [[0]], structures=structure, fast_forward="text")
    with pytest.raises(ArgumentError, match="fast_forward"):
        Decoding(model, [[0]], structures=structure, fast_forward="bytes")
    with pytest.raises(ArgumentError, match="fast_forward"):
        Decoding(model, [[0], [0]], structures=structure, fast_forward=["off"])


# -- the tokenizer's split of forced text, on the real Gemma vocabulary --------------------------------------


@pytest.fixture(scope="module")
def gemma_person(gemma_vocab):
    return compile_json_schema(PERSON, gemma_vocab)


class NoiseModel:
    """Seeded random logits for every row at every pass: a model over a vocabulary too large for a table."""

    max_batch = None
    context_length = None
    sparse_limit = 0

    def __init__(self, width: int, *, seed: int = 0):
        self.logits_width = width
        self.rng = np.random.default_rng(seed)

    def prefill(self, prompts):
        return self.rng.normal(size=(len(prompts), self.logits_width)).astype(np.float32)

    def extend(self, tokens):
        return self.rng.normal(size=(len(tokens), self.logits_width)).astype(np.float32)


def tokenize_with(tokenizer):
    return lambda text: tokenizer.encode(text, add_special_tokens=False)


def test_text_mode_forces_the_canonical_split_of_the_forced_text(gemma_tokenizer, gemma_vocab, gemma_person):
    matcher = gemma_person.matcher()
    tokenize = tokenize_with(gemma_tokenizer)
    forced = forced_continuation(matcher, "text", tokenize=tokenize)
    text = gemma_vocab.decode(forced)
    assert forced and b'{"name":"'.startswith(text)
    assert forced == tokenize(text.decode())  # the tokenizer's own split of what it forces
    assert matcher.num_tokens == 0  # the matcher is not moved
    # token by token, nothing is forced: '{', '{"' ... all fit
    assert forced_continuation(matcher, "tokens") == []
    assert forced_continuation(matcher, "off", tokenize=tokenize) == []


def test_text_mode_leaves_a_last_token_a_longer_allowed_token_extends(gemma_tokenizer, gemma_vocab):
    tokenize = tokenize_with(gemma_tokenizer)
    # "Answer: " ends on a space, which Gemma merges into the word after it (" Yes"): the model picks that token
    matcher = compile_regex(r"Answer: [A-Za-z]+\.", gemma_vocab).matcher()
    full = tokenize("Answer: ")
    probe = matcher.copy()
    probe.advance(full[:-1])
    last = gemma_vocab.token_bytes(full[-1])
    longer = [t for t in probe.allowed_tokens().tolist() if gemma_vocab.token_bytes(t).startswith(last + b"Y")]
    assert longer
    assert forced_continuation(matcher, "text", tokenize=tokenize) == full[:-1]
    # "Answer:" before a digit keeps its last token: no allowed token runs past ":" into the digit
    matcher = compile_regex(r"Answer:[0-9]", gemma_vocab).matcher()
    assert forced_continuation(matcher, "text", tokenize=tokenize) == tokenize("Answer:")


def test_text_mode_outputs_stay_valid_on_the_real_vocabulary(gemma_tokenizer, gemma_vocab, gemma_person):
    tokenize = tokenize_with(gemma_tokenizer)
    validator = jsonschema.Draft202012Validator(PERSON)
    for seed in range(3):
        model = NoiseModel(gemma_vocab.size, seed=seed)
        rows = Decoding(
            model,
            [[2]],
            structures=gemma_person,
            sampling=SamplingParams(temperature=1.0, top_k=20, seed=seed),
            max_new_tokens=80,
            fast_forward="text",
            tokenize=tokenize,
        ).run()
        row = rows[0]
        assert row.complete and row.forced > 0
        validator.validate(json.loads(gemma_vocab.decode(row.tokens)))
