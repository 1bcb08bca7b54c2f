"""LlamaCppModel on the real Gemma 3 270M GGUF: blocks of tokens, verification and rollback, and speculative
decoding in constrain's loop (llama-cpp-python's own ``draft_model`` is refused: tests/integrations/test_llamacpp.py).

llama.cpp's kernels give slightly different logits for the same position when the tokens before it were
evaluated in batches of other shapes (differences up to ~0.7 on this quantised model), so logits are compared
through their order at the top, and greedy outputs with and without speculation are compared on prompts whose
decisions are not near ties.
"""

from __future__ import annotations

import json

import jsonschema
import numpy as np
import pytest

from constrain.compilers.json_schema import compile_json_schema
from constrain.decoding.drafts import ChainedDrafts, ForcedDrafts, PromptLookup
from constrain.decoding.loop import Decoding
from constrain.decoding.speculative import Speculation
from constrain.errors import ArgumentError

llama_cpp = pytest.importorskip("llama_cpp")

pytestmark = pytest.mark.slow

PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 20}, "age": {"type": "integer", "maximum": 150}},
    "required": ["name", "age"],
}
PROMPT = (
    'People as JSON, one per line:\n{"name":"Ada Lovelace","age":36}\n{"name":"Alan Turing","age":41}\n'
    '{"name":"Ada Lovelace","age":36}\n'
)


@pytest.fixture(scope="module")
def model():
    from constrain.integrations.llamacpp_model import LlamaCppModel
    from constrain.models import gguf_model_path

    llm = llama_cpp.Llama(model_path=str(gguf_model_path()), n_ctx=1024, n_threads=1, verbose=False)
    return LlamaCppModel(llm)


def top(logits: np.ndarray, n: int = 3) -> list[int]:
    return np.argsort(logits)[::-1][:n].tolist()


def test_verify_gives_the_logits_after_each_kept_position_and_rollback_forgets(model):
    prompt = model.encode("The capital of France is Paris. The capital of Italy is")
    block = model.tokenize(" Rome. The capital of")
    model.llm.reset()
    model.prefill([prompt])
    kept = model.verify(block, keep=3)
    assert kept.shape == (3, model.logits_width)
    for i, row in enumerate(kept):  # the same positions read one token at a time
        model.llm.reset()
        alone = model.prefill([prompt + block[: len(block) - 2 + i]])[0]
        assert top(row, 1) == top(alone, 1)
    model.rollback(2)
    assert model.llm.n_tokens == len(prompt) + len(block) - 2
    again = model.extend([block[-2:]])[0]  # re-reading the forgotten tokens gives the last row again
    assert top(again, 1) == top(kept[-1], 1)
    with pytest.raises(ArgumentError, match="num_tokens"):
        model.rollback(10_000)
    with pytest.raises(ArgumentError, match="keep"):
        model.verify(block, keep=0)


@pytest.mark.parametrize("source", ["lookup", "forced+lookup"])
def test_speculative_decoding_runs_on_llama_cpp(model, source):
    structure = compile_json_schema(PERSON, model.vocab)
    drafts = PromptLookup() if source == "lookup" else ChainedDrafts(ForcedDrafts(model.tokenize), PromptLookup())
    outputs = {}
    for name, speculation in (("plain", None), ("speculative", Speculation(drafts, k=6))):
        model.llm.reset()
        decoding = Decoding(
            model, [model.encode(PROMPT)], structures=structure, max_new_tokens=40,
            eos_ids=[int(t) for t in model.vocab.eos_ids], fast_forward="off", speculation=speculation,
        )  # fmt: skip
        row = decoding.run()[0]
        assert row.complete
        jsonschema.validate(json.loads(model.vocab.decode(row.tokens)), PERSON)
        outputs[name] = (row.tokens, decoding.forward_passes)
    assert outputs["speculative"][0] == outputs["plain"][0]  # the model copies a line: no near tie
    assert outputs["speculative"][1] < outputs["plain"][1] / 2
