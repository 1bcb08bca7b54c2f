"""Structured output in vLLM through constrain's logits-processor plug-in.

On a machine with an NVIDIA GPU (vLLM's engine is CUDA-only; docs/vllm.md has the details)::

    pip install "constrain[vllm]"                  # vLLM and constrain; nothing else to register
    python examples/vllm_plugin.py [MODEL]         # offline: vllm.LLM(MODEL).generate(...), default google/gemma-3-270m

    vllm serve google/gemma-3-270m                 # or the OpenAI-compatible server; a request then carries
                                                   # extra_body={"vllm_xargs": {"constrain_json": json.dumps(schema)}}

Installing constrain registers the plug-in under vLLM's entry-point group ``vllm.logits_processors``, so every
vLLM engine loads it; a request asks for a structure in ``SamplingParams.extra_args`` (``{"constrain": {"json":
schema}}``, or ``regex``, ``choice``, ``grammar``, ``json_object``). Requests without one are left alone.

Where vLLM's engine cannot run (no CUDA device, or vLLM not installed), this script says so and runs the parts of
the plug-in that need no engine: the entry point, the request parser, the admission check, and the structure the
plug-in builds for a request, driven by the tokens of a known valid output. It exits 0 in both cases.
"""

import importlib.util
import json
import sys
from importlib.metadata import entry_points
from types import SimpleNamespace

import jsonschema

from constrain.errors import StructureError
from constrain.integrations.vllm import ConstrainBackend, structure_request
from constrain.models import load_gemma_tokenizer

MODEL = sys.argv[1] if len(sys.argv) > 1 else "google/gemma-3-270m"

SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 30},
        "country": {"type": "string", "maxLength": 30},
        "population_millions": {"type": "integer", "minimum": 0, "maximum": 100},
    },
    "required": ["city", "country", "population_millions"],
    "additionalProperties": False,
}
PROMPT = 'Madrid as JSON: {"city":"Madrid","country":"Spain","population_millions":3}\nTokyo as JSON: '

# The two spellings of one request: nested (offline SamplingParams) and flat with the constrain_ prefix, the form
# the OpenAI server's vllm_xargs carries (its values are strings, so the schema travels as JSON text).
NESTED = {"constrain": {"json": SCHEMA}}
FLAT = {"constrain_json": json.dumps(SCHEMA)}


def why_no_engine() -> str | None:
    """None when vLLM's engine can run here, otherwise why not."""
    if importlib.util.find_spec("vllm") is None:
        return "vLLM is not installed"
    import torch

    if not torch.cuda.is_available():
        return "no CUDA device: vLLM's engine is CUDA-only"
    return None


def run_on_vllm() -> int:
    """The real thing: one request to a vLLM engine, which has loaded constrain's plug-in."""
    from vllm import LLM, SamplingParams

    llm = LLM(model=MODEL)
    params = SamplingParams(max_tokens=64, temperature=0, extra_args=NESTED)
    text = llm.generate([PROMPT], params)[0].outputs[0].text
    print(f"vLLM ({MODEL}): {text}")
    jsonschema.validate(json.loads(text), SCHEMA)
    print("valid: vLLM's output follows the schema")
    return 0


def run_without_engine(reason: str) -> int:
    """What the plug-in does with the request, up to the point where the engine would sample."""
    print(f"SKIPPED the vLLM generation: {reason}.")
    print(f"On a GPU machine this script runs vllm.LLM({MODEL!r}).generate([PROMPT], SamplingParams(max_tokens=64,")
    print("temperature=0, extra_args={'constrain': {'json': SCHEMA}})) and validates the JSON it returns.")
    print("Running the parts of the plug-in that need no engine instead:\n")

    plugins = [e.value for e in entry_points(group="vllm.logits_processors") if e.value.startswith("constrain.")]
    print(f"1. entry point vllm.logits_processors: {plugins or 'NOT REGISTERED (is constrain installed?)'}")

    # The request parser: both spellings ask for the same structure.
    kind, spec = structure_request(NESTED)
    if structure_request(FLAT) != (kind, json.dumps(SCHEMA)):
        print("invalid: the flat and nested spellings differ")
        return 1
    print(f"2. extra_args -> a {kind.name} request ({len(spec)} characters of schema), nested or flat alike")

    # The backend the plug-in makes on the first constrained request: the vocabulary of the model's tokenizer (the
    # embedded Gemma 3 tokenizer stands in for google/gemma-3-270m's, which vLLM would load).
    tokenizer = load_gemma_tokenizer()
    backend = ConstrainBackend(tokenizer=tokenizer)

    # Admission: a malformed request is refused before it runs (the OpenAI server answers HTTP 400). The plug-in's
    # check needs vLLM's abstract classes, which import without the engine; without vLLM, compiling the request
    # is the same check, later.
    bad_requests = {
        "two structures": {"constrain": {"regex": r"\d+", "choice": ["a", "b"]}},
        "a backreference in a pattern": {"constrain_json": '{"type": "string", "pattern": "(a)\\\\1"}'},
    }
    for what, extra_args in bad_requests.items():
        try:
            try:
                from constrain.integrations.vllm import StructureLogitsProcessor

                StructureLogitsProcessor.validate_params(SimpleNamespace(extra_args=extra_args))
            except ImportError:
                backend.compile_structure(*structure_request(extra_args))
        except StructureError as exc:
            print(f"3. refused at admission, {what}: {str(exc).splitlines()[0]}")
        else:
            print(f"invalid: a request with {what} was not refused")
            return 1

    # The structure the plug-in builds when the request joins the batch, ended by the request's stop tokens
    # (vLLM passes SamplingParams.all_stop_token_ids).
    stop_ids = [tokenizer.eos_token_id]
    grammar = backend.compile_grammar(kind, spec, stop_token_ids=stop_ids)

    # Drive it with the tokens of a valid output, as the engine commits them after sampling from masked logits.
    output = '{"city":"Tokyo","country":"Japan","population_millions":14}'
    tokens = tokenizer.encode(output, add_special_tokens=False)
    space = tokenizer.encode(" ", add_special_tokens=False)
    if grammar.validate_tokens(space):  # JSON output is compact: a leading space is masked
        print("invalid: a leading space was allowed")
        return 1
    accepted = grammar.accept_tokens("request-0", tokens) and grammar.accept_tokens("request-0", stop_ids)
    print(f"4. the request's structure reads the {len(tokens)} tokens of {output}")
    print(f"   and then the stop token: {accepted}; terminated: {grammar.is_terminated()}")
    jsonschema.validate(json.loads(output), SCHEMA)
    if not (accepted and grammar.is_terminated()):
        print("invalid: the structure refused a valid output")
        return 1
    print("\nvalid: the plug-in's request handling works here; the generation itself needs vLLM's engine (skipped)")
    return 0


def main() -> int:
    reason = why_no_engine()
    return run_on_vllm() if reason is None else run_without_engine(reason)


if __name__ == "__main__":
    sys.exit(main())
