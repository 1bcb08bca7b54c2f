"""The transformers logits processor with the real Gemma 3 270M model."""

from __future__ import annotations

import re

import pytest
import torch
from transformers import LogitsProcessorList

from constrain.compilers.regex import compile_regex
from constrain.errors import ShapeError
from constrain.integrations.transformers import StructureLogitsProcessor
from constrain.models import default_eos_ids, load_default_model
from constrain.vocab import Vocabulary

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
    return [tokenizer.decode([t for t in row if t not in eos]) for row in out[:, inputs["input_ids"].shape[1] :].tolist()]


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
