"""constrain: make a language model's output follow a structure exactly.

Generate typed, validated outputs in one call::

    llm = constrain.LLM()                      # the embedded Gemma 3 270M, or LLM(model, tokenizer), LLM(llama)
    person = llm.generate("Extract the person: ...", output_type=Person)   # a validated Person

Or compile a structure once for a vocabulary, make a cheap matcher per sequence, and mask the logits::

    vocab = constrain.Vocabulary.from_tokenizer(tokenizer)
    structure = constrain.compile(r"\\d{4}-\\d{2}-\\d{2}", vocab)   # or a JSON Schema, a Pydantic type, ...
    matcher = structure.matcher()
    bitmask = constrain.allocate_token_bitmask(1, logits.shape[-1])
    matcher.fill_bitmask(bitmask, 0)
    constrain.apply_token_bitmask(logits, bitmask)

Names are imported on first use, so ``import constrain`` stays fast.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

__version__ = "0.1.0"

_EXPORTS = {
    "LLM": "constrain.generation",
    "Completion": "constrain.generation",
    "structured": "constrain.generation",
    "Regex": "constrain.compilers.specs",
    "Lark": "constrain.compilers.specs",
    "GBNF": "constrain.compilers.specs",
    "compile": "constrain.compilers.api",
    "RelaxationWarning": "constrain.compilers.api",
    "warmup": "constrain.compilers.warmup",
    "clear_compile_cache": "constrain.compilers.api",
    "set_cache_budget": "constrain.cache",
    "Vocabulary": "constrain.vocab",
    "CompiledStructure": "constrain.runtime",
    "Matcher": "constrain.runtime",
    "compile_regex": "constrain.compilers.regex",
    "compile_choices": "constrain.compilers.choices",
    "compile_json_schema": "constrain.compilers.json_schema",
    "compile_pydantic": "constrain.compilers.pydantic",
    "compile_lark": "constrain.compilers.lark",
    "compile_gbnf": "constrain.compilers.gbnf",
    "compile_grammar": "constrain.runtime",
    "allocate_token_bitmask": "constrain.kernels",
    "apply_token_bitmask": "constrain.kernels",
    "bitmask_to_bool": "constrain.kernels",
    "bool_to_bitmask": "constrain.kernels",
    "SamplingParams": "constrain.decoding",
    "Sampler": "constrain.decoding",
    "beam_search": "constrain.decoding",
    "Speculation": "constrain.decoding",
    "PromptLookup": "constrain.decoding",
    "Candidate": "constrain.decoding.selection",
    "Selection": "constrain.decoding.selection",
    "generate": "constrain.integrations.transformers",
    "ConstrainError": "constrain.errors",
    "StructureError": "constrain.errors",
    "RegexError": "constrain.errors",
    "VocabularyError": "constrain.errors",
    "TokenError": "constrain.errors",
    "ShapeError": "constrain.errors",
    "DeadEndError": "constrain.errors",
    "AutomatonTooLarge": "constrain.errors",
    "CompileTimeout": "constrain.errors",
    "GrammarError": "constrain.errors",
    "GrammarSyntaxError": "constrain.errors",
    "DepthError": "constrain.errors",
    "AmbiguityError": "constrain.errors",
    "PydanticSchemaError": "constrain.errors",
    "LogitsError": "constrain.errors",
    "SamplingParamsError": "constrain.errors",
    "BeamSearchError": "constrain.errors",
    "JsonSchemaError": "constrain.errors",
    "OutputTypeError": "constrain.errors",
    "OutputValidationError": "constrain.errors",
    "IncompleteOutputError": "constrain.errors",
    "ContextLengthError": "constrain.errors",
}

__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:
    from constrain.cache import set_cache_budget
    from constrain.compilers.api import RelaxationWarning, clear_compile_cache, compile
    from constrain.compilers.choices import compile_choices
    from constrain.compilers.gbnf import compile_gbnf
    from constrain.compilers.json_schema import compile_json_schema
    from constrain.compilers.lark import compile_lark
    from constrain.compilers.pydantic import compile_pydantic
    from constrain.compilers.regex import compile_regex
    from constrain.compilers.specs import GBNF, Lark, Regex
    from constrain.compilers.warmup import warmup
    from constrain.decoding import PromptLookup, Sampler, SamplingParams, Speculation, beam_search
    from constrain.decoding.selection import Candidate, Selection
    from constrain.errors import (
        AmbiguityError,
        AutomatonTooLarge,
        BeamSearchError,
        CompileTimeout,
        ConstrainError,
        ContextLengthError,
        DeadEndError,
        DepthError,
        GrammarError,
        GrammarSyntaxError,
        IncompleteOutputError,
        JsonSchemaError,
        LogitsError,
        OutputTypeError,
        OutputValidationError,
        PydanticSchemaError,
        RegexError,
        SamplingParamsError,
        ShapeError,
        StructureError,
        TokenError,
        VocabularyError,
    )
    from constrain.generation import LLM, Completion, structured
    from constrain.integrations.transformers import generate
    from constrain.kernels import allocate_token_bitmask, apply_token_bitmask, bitmask_to_bool, bool_to_bitmask
    from constrain.runtime import CompiledStructure, Matcher, compile_grammar
    from constrain.vocab import Vocabulary


#: Subpackages reachable as attributes (``constrain.models.gguf_model_path()``), imported on first use.
_SUBPACKAGES = frozenset({"decoding", "generation", "grammars", "integrations", "models", "testing"})


def __getattr__(name: str):
    if name in _SUBPACKAGES:
        return importlib.import_module(f"constrain.{name}")
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'constrain' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(list(globals()) + __all__)
