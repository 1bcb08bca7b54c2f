"""TransformersModel: the sparse output layer against the full projection, blocks of forced tokens against one
token at a time, and the fallback for models whose logits are not ``lm_head(decoder(x))``.

The real Gemma 3 270M runs here; the fallback and the soft-capping use small randomly initialised transformers
models of real architectures (Gemma 2 soft-caps its logits, Cohere scales them), built from their configs.
"""

from __future__ import annotations

import json

import jsonschema
import numpy as np
import pytest
import torch
from transformers import CohereConfig, CohereForCausalLM, Gemma2Config, Gemma2ForCausalLM

from constrain.compilers.json_schema import compile_json_schema
from constrain.compilers.regex import compile_regex
from constrain.decoding.loop import Decoding
from constrain.errors import ArgumentError
from constrain.integrations.transformers_model import TransformersModel
from constrain.models.gemma import load_default_model

pytestmark = pytest.mark.slow

#: Largest difference between a logit of the sparse path and the same logit of the full projection: float32 dot
#: products of 640 terms over logits of magnitude up to ~30 (measured differences are below 2e-5).
TOLERANCE = 1e-4

SCHEMAS = [
    {
        "type": "object",
        "properties": {
            "city": {"type": "string", "maxLength": 16},
            "population": {"type": "integer", "minimum": 0},
            "capital": {"type": "boolean"},
        },
        "required": ["city", "population", "capital"],
    },
    {
        "type": "object",
        "properties": {
            "colour": {"enum": ["red", "green", "blue"]},
            "sizes": {"type": "array", "items": {"type": "integer", "maximum": 99}, "maxItems": 3},
        },
        "required": ["colour", "sizes"],
    },
    {"type": "array", "items": {"type": "string", "enum": ["yes", "no", "maybe"]}, "minItems": 2, "maxItems": 4},
]
PROMPTS = [
    'Example: {"city":"Lyon","population":500000,"capital":false}\nParis, 2 million people, capital.\nJSON: ',
    'Example: {"colour":"red","sizes":[1,2]}\nA blue shirt in sizes 3 and 5.\nJSON: ',
    'Example: ["yes","no"]\nThree answers: no, no, yes.\nJSON: ',
]


@pytest.fixture(scope="module")
def gemma():
    torch.set_num_threads(1)
    return load_default_model()


@pytest.fixture(scope="module")
def models(gemma):
    model, tokenizer = gemma
    return TransformersModel(model, tokenizer, output_layer="full"), TransformersModel(model, tokenizer)


def tiny_model(cls, config_cls, **extra):
    torch.manual_seed(0)
    config = config_cls(
        vocab_size=262144, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, **extra,
    )  # fmt: skip
    return cls(config).eval()


def test_the_default_model_takes_the_sparse_path(models):
    full, sparse = models
    assert sparse.output_layer == "sparse" and sparse.output_layer_reason is None
    assert sparse.sparse_limit == sparse.logits_width // 2
    assert full.output_layer == "full" and full.sparse_limit == 0


def test_sparse_logits_equal_the_full_projection_row_by_row(models):
    full, sparse = models
    rng = np.random.default_rng(0)
    prompts = [full.encode("The quick brown fox"), full.encode("JSON: {"), full.encode("1, 2, 3,")]
    allowed = [np.sort(rng.choice(full.logits_width, 5000, replace=False)), None, np.array([236770, 236771])]
    expected, got = full.prefill(prompts), sparse.prefill(prompts, allowed)
    blocks = [[107, 818], [236779], [236743, 236770, 236770]]  # forced tokens: blocks of different lengths
    expected_next, got_next = full.extend(blocks), sparse.extend(blocks, allowed[::-1])
    for want, have, sets in ((expected, got, allowed), (expected_next, got_next, allowed[::-1])):
        for row, ids in enumerate(sets):
            if ids is None:
                assert torch.allclose(have[row], want[row], atol=TOLERANCE, rtol=0)
                continue
            assert float((have[row, ids] - want[row, ids]).abs().max()) <= TOLERANCE
            others = torch.ones(full.logits_width, dtype=torch.bool)
            others[ids] = False
            assert bool(torch.isneginf(have[row, others]).all())


def test_a_block_of_tokens_reads_like_one_token_at_a_time(gemma):
    model = TransformersModel(*gemma, output_layer="full")
    prompt = model.encode("Name: Ada. Age:")
    block = model.tokenize(" 36, born 1815")
    model.prefill([prompt])
    together = model.extend([block])
    model.prefill([prompt])
    for token in block:
        alone = model.extend([[token]])
    assert torch.allclose(together, alone, atol=1e-3, rtol=0)
    assert int(together.argmax()) == int(alone.argmax())


@pytest.mark.parametrize("fast_forward", ["off", "text"])
def test_greedy_outputs_are_identical_with_the_sparse_layer_on_and_off(models, fast_forward):
    full, sparse = models
    for schema, prompt in zip(SCHEMAS, PROMPTS):
        structure = compile_json_schema(schema, full.vocab)
        outputs = []
        for model in (full, sparse):
            decoding = Decoding(
                model, [model.encode(prompt)], structures=structure, max_new_tokens=60,
                eos_ids=[int(t) for t in model.vocab.eos_ids], fast_forward=fast_forward, tokenize=model.tokenize,
            )  # fmt: skip
            row = decoding.run()[0]
            assert row.complete
            jsonschema.validate(json.loads(model.vocab.decode(row.tokens)), schema)
            outputs.append((row.tokens, decoding.sparse_row_steps))
        assert outputs[0][0] == outputs[1][0]
        assert outputs[0][1] == 0 and outputs[1][1] > 0


def test_a_batch_mixes_sparse_full_and_finished_rows(models):
    full, sparse = models
    digits = compile_regex(r"[0-9]{1,3}", full.vocab)
    structures = [digits, None, compile_regex(r"(yes|no)", full.vocab)]
    prompts = ["Two plus two is ", "Once upon a time", "Is water wet? Answer yes or no: "]
    rows = {}
    for model in (full, sparse):
        decoding = Decoding(
            model, [model.encode(p) for p in prompts], structures=structures, max_new_tokens=8,
            eos_ids=[int(t) for t in model.vocab.eos_ids],
        )  # fmt: skip
        rows[model.output_layer] = [r.tokens for r in decoding.run()]
        if model is sparse:
            assert decoding.sparse_row_steps > 0
    assert rows["sparse"] == rows["full"]


def test_final_soft_capping_is_reproduced(gemma_tokenizer):
    model = tiny_model(Gemma2ForCausalLM, Gemma2Config, head_dim=8, final_logit_softcapping=0.05)
    wrapped = TransformersModel(model, gemma_tokenizer)
    assert wrapped.output_layer == "sparse"
    reference = TransformersModel(model, gemma_tokenizer, output_layer="full")
    ids = np.array([5, 17, 236770, 262000])
    prompt = [wrapped.encode("capped")]
    want, got = reference.prefill(prompt)[0, ids], wrapped.prefill(prompt, [ids])[0, ids]
    assert torch.allclose(got, want, atol=1e-6, rtol=0)
    hidden = model.get_decoder()(input_ids=torch.tensor(prompt)).last_hidden_state[0, -1]
    uncapped = model.get_output_embeddings()(hidden)[ids]
    assert not torch.allclose(uncapped, want, atol=1e-3)  # the cap matters at this scale


def test_a_model_that_scales_its_logits_keeps_the_full_projection(gemma_tokenizer):
    model = tiny_model(CohereForCausalLM, CohereConfig, logit_scale=0.25)
    wrapped = TransformersModel(model, gemma_tokenizer)
    assert wrapped.output_layer == "full" and wrapped.sparse_limit == 0
    assert "lm_head(decoder(x))" in wrapped.output_layer_reason
    # the loop's allowed sets are ignored: the logits are the model's own
    prompt = [wrapped.encode("scaled")]
    with torch.inference_mode():
        own = model(input_ids=torch.tensor(prompt)).logits[0, -1]
    assert torch.allclose(wrapped.prefill(prompt, [np.array([1, 2])])[0], own, atol=1e-6)
    with pytest.raises(ArgumentError, match="lm_head"):
        TransformersModel(model, gemma_tokenizer, output_layer="sparse")


def test_bad_arguments(gemma):
    with pytest.raises(ArgumentError, match="output_layer"):
        TransformersModel(*gemma, output_layer="fast")
    with pytest.raises(ArgumentError, match="sparse_limit"):
        TransformersModel(*gemma, sparse_limit=0.5)
