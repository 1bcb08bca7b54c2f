"""The transformers logits processor with the real Gemma 3 270M model."""

from __future__ import annotations

import re

import pytest
import torch
from transformers import LogitsProcessorList

import constrain
from constrain.compilers.regex import compile_regex
from constrain.errors import DeadEndError, ShapeError, VocabularyError
from constrain.integrations.transformers import StructureLogitsProcessor
from constrain.models.gemma import default_eos_ids, load_default_model
from constrain.testing import tiny_vocabulary
from constrain.vocab.vocabulary import Vocabulary

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def gemma():
    model, tokenizer = load_default_model()
    return model, tokenizer, Vocabulary.from_tokenizer(tokenizer)


def generate(model, tokenizer, prompts, structures, **kwargs):
    tokenizer.padding_side = "left"
    inputs = tokenizer(prompts, return_tensors="pt", padding=True)
    out = model.generate(
        **inputs,
        logits_processor=LogitsProcessorList([StructureLogitsProcessor(structures)]),
        eos_token_id=default_eos_ids(tokenizer),
        pad_token_id=tokenizer.pad_token_id,
        max_new_tokens=24,
        **kwargs,
    )
    eos = set(default_eos_ids(tokenizer)) | {tokenizer.pad_token_id}
    return [
        tokenizer.decode([t for t in row if t not in eos]) for row in out[:, inputs["input_ids"].shape[1] :].tolist()
    ]


def test_batch_with_a_structure_per_row(gemma):
    model, tokenizer, vocab = gemma
    patterns = [r"\d{4}-\d{2}-\d{2}", r"(yes|no)", r"[A-Z][a-z]{2,8}", r"-?\d{1,3}\.\d"]
    prompts = ["Today's date: ", "Is the sky blue? Answer: ", "A first name: ", "Temperature: "]
    texts = generate(model, tokenizer, prompts, [compile_regex(p, vocab) for p in patterns], do_sample=False)
    for pattern, text in zip(patterns, texts):
        assert re.fullmatch(pattern, text), (pattern, text)


def test_sampling_and_beam_search_stay_inside(gemma):
    model, tokenizer, vocab = gemma
    pattern = r"[a-z]{3,6}@[a-z]{3,6}\.(com|org)"
    structure = compile_regex(pattern, vocab)
    torch.manual_seed(0)
    for text in generate(model, tokenizer, ["Email: "] * 2, structure, do_sample=True, temperature=1.5):
        assert re.fullmatch(pattern, text), text
    for text in generate(model, tokenizer, ["Email: "], structure, num_beams=3, num_return_sequences=3):
        assert re.fullmatch(pattern, text), text


def test_logits_narrower_than_the_vocabulary_are_refused(gemma):
    _, _, vocab = gemma
    processor = StructureLogitsProcessor(compile_regex("a", vocab))
    with pytest.raises(ShapeError, match="do not match"):
        processor(torch.zeros((1, 3), dtype=torch.long), torch.zeros((1, 1000)))


def test_generate_convenience_with_a_batch(gemma):
    model, tokenizer, vocab = gemma
    patterns = [r"(red|green|blue)", r"\d{2}:\d{2}"]
    texts = constrain.generate(
        model, tokenizer, ["A colour: ", "The time: "], [compile_regex(p, vocab) for p in patterns], max_new_tokens=12
    )
    assert [bool(re.fullmatch(p, t)) for p, t in zip(patterns, texts)] == [True, True], texts
    single = constrain.generate(model, tokenizer, "A colour: ", compile_regex(patterns[0], vocab), max_new_tokens=8)
    assert single == texts[0]


def test_structure_for_another_vocabulary_is_refused(gemma):
    model, tokenizer, _ = gemma
    other = tiny_vocabulary([b"a", b"b"])
    with pytest.raises(VocabularyError, match="another vocabulary"):
        constrain.generate(model, tokenizer, "x", compile_regex("a+", other))


def test_dead_end_raises_with_the_text_or_stops():
    vocab = tiny_vocabulary([b"a", b"b", b"xy"])
    structure = compile_regex("a(c|b)", vocab)  # after "a", "b" works; after "ab" the end; "c" is no token
    dead = compile_regex("ac", vocab)
    scores = torch.zeros((1, 4))
    processor = StructureLogitsProcessor(dead)
    processor(torch.tensor([[2]]), scores.clone())  # the prompt: one token
    with pytest.raises(DeadEndError) as info:
        processor(torch.tensor([[2, 0]]), scores.clone())
    assert info.value.text == "a"
    stopping = StructureLogitsProcessor(dead, on_dead_end="stop")
    stopping(torch.tensor([[2]]), scores.clone())
    out = stopping(torch.tensor([[2, 0]]), scores.clone())
    assert torch.isinf(out[0, :3]).all() and out[0, 3] == 0
    fine = StructureLogitsProcessor(structure)
    fine(torch.tensor([[2]]), scores.clone())
    out = fine(torch.tensor([[2, 0]]), scores.clone())
    assert out[0].tolist() == [float("-inf"), 0.0, float("-inf"), float("-inf")]
