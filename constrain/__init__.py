"""constrain: make a language model's output follow a structure exactly.

Compile a structure once for a vocabulary, make a cheap matcher per sequence, and mask the logits::

    vocab = constrain.Vocabulary.from_tokenizer(tokenizer)
    structure = constrain.compile_regex(r"\\d{4}-\\d{2}-\\d{2}", vocab)
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
    "Vocabulary": "constrain.vocab",
    "compile_regex": "constrain.compilers.regex",
    "CompiledStructure": "constrain.runtime.matcher",
    "Matcher": "constrain.runtime.matcher",
    "allocate_token_bitmask": "constrain.kernels.bitmask",
    "apply_token_bitmask": "constrain.kernels.bitmask",
    "bitmask_to_bool": "constrain.kernels.bitmask",
    "bool_to_bitmask": "constrain.kernels.bitmask",
    "generate": "constrain.integrations.transformers",
    "compile_grammar": "constrain.runtime.pushdown",
    "compile_json_schema": "constrain.compilers.json_schema",
    "JsonSchemaError": "constrain.compilers.json_schema",
    "compile_lark": "constrain.compilers.lark",
    "compile_gbnf": "constrain.compilers.gbnf",
    "GrammarSyntaxError": "constrain.compilers.gbnf",
    "compile_pydantic": "constrain.compilers.pydantic",
    "SamplingParams": "constrain.decoding.sampling",
    "Sampler": "constrain.decoding.sampling",
    "beam_search": "constrain.decoding.beam",
    "ConstrainError": "constrain.errors",
    "StructureError": "constrain.errors",
    "RegexError": "constrain.errors",
    "VocabularyError": "constrain.errors",
    "TokenError": "constrain.errors",
    "ShapeError": "constrain.errors",
    "DeadEndError": "constrain.errors",
}

__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:
    from constrain.decoding.beam import beam_search
    from constrain.compilers.gbnf import GrammarSyntaxError, compile_gbnf
    from constrain.compilers.json_schema import JsonSchemaError, compile_json_schema
    from constrain.compilers.lark import compile_lark
    from constrain.compilers.pydantic import compile_pydantic
    from constrain.integrations.transformers import generate
    from constrain.runtime.pushdown import compile_grammar
    from constrain.compilers.regex import compile_regex
    from constrain.errors import ConstrainError, DeadEndError, RegexError, ShapeError, StructureError, TokenError, VocabularyError
    from constrain.kernels.bitmask import allocate_token_bitmask, apply_token_bitmask, bitmask_to_bool, bool_to_bitmask
    from constrain.runtime.matcher import CompiledStructure, Matcher
    from constrain.decoding.sampling import Sampler
    from constrain.decoding.params import SamplingParams
    from constrain.vocab.vocabulary import Vocabulary


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'constrain' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(list(globals()) + __all__)
