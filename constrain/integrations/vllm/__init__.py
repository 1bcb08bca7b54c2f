"""vLLM: the V1 structured-output protocol classes, and a logits-processor plug-in built on them.

vLLM picks its structured-output backend from a fixed list, so there are two routes, sharing one implementation:

- :class:`ConstrainBackend` / :class:`ConstrainGrammar` implement vLLM's structured-output protocol
  (``vllm/v1/structured_output/backend_types.py``: ``StructuredOutputBackend`` and ``StructuredOutputGrammar``),
  for vLLM's own ``StructuredOutputManager`` and for upstreaming. They import nothing from vLLM;
  :func:`vllm_structured_output_classes` gives subclasses of vLLM's abstract classes when vLLM is installed.
- :class:`StructureLogitsProcessor` is a logits-processor plug-in, registered under vLLM's entry-point group
  ``vllm.logits_processors``: the route that works today without patching vLLM. It reads the structure from
  ``SamplingParams.extra_args`` (see :func:`structure_request`), keeps one :class:`ConstrainGrammar` per request
  and masks the logits rows vLLM hands it. It implements the logits-processor interface of vLLM's V2 model runner
  (the default in vLLM 0.33: ``vllm.v1.worker.gpu.sample.logits_processor``), where under speculative decoding
  a request owns one logits row per draft position, and, so that the installed plug-in never breaks an engine,
  the legacy V1 runner's interface too (``vllm.v1.sample.logits_processor``; that runner loads no plug-in under
  speculative decoding). The class is built on first access, as a subclass of vLLM's abstract classes.

Ending: the grammar object treats the request's stop tokens (vLLM passes ``SamplingParams.all_stop_token_ids``;
without them, the vocabulary's end-of-sequence ids) as the end of the structure: they are masked until the
structure is complete, allowed once it is, and accepting one terminates the grammar. The vocabulary's other
end-of-sequence ids stay masked, since vLLM would not stop on them.
"""

from __future__ import annotations

from typing import Any

from constrain.compilers.choices import choice_regex
from constrain.integrations.vllm.backend import (
    ConstrainBackend,
    ConstrainGrammar,
    fill_draft_bitmasks,
    vllm_structured_output_classes,
)
from constrain.integrations.vllm.plugin import _plugin_class
from constrain.integrations.vllm.requests import (
    RequestType,
    compile_structure,
    structure_request,
)

# StructureLogitsProcessor is left out of __all__: it is built from vLLM's classes on first access, and a star
# import must work without vLLM.
__all__ = [
    "ConstrainBackend",
    "ConstrainGrammar",
    "RequestType",
    "choice_regex",
    "compile_structure",
    "fill_draft_bitmasks",
    "structure_request",
    "vllm_structured_output_classes",
]


def __getattr__(name: str) -> Any:
    if name == "StructureLogitsProcessor":
        return _plugin_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
