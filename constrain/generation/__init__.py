"""Typed generation: the :class:`LLM` handle, its decorators, prompts and streaming."""

from constrain.generation.decorators import structured
from constrain.generation.llm import LLM, Completion

__all__ = ["LLM", "Completion", "structured"]
