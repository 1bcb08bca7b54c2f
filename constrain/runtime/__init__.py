"""Running a compiled structure: the per-sequence matcher, the pushdown machine, and token masks."""

from constrain.runtime.matcher import CompiledStructure, Matcher
from constrain.runtime.pushdown import GrammarStructure, compile_grammar

__all__ = ["CompiledStructure", "GrammarStructure", "Matcher", "compile_grammar"]
