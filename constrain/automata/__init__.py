"""Byte-level automata: NFAs, subset construction, minimisation, and regexes compiled to them."""

from constrain.automata.dfa import ByteDFA
from constrain.automata.limits import (
    AutomatonTooLarge,
    CompileTimeout,
    check_deadline,
    deadline,
)
from constrain.automata.nfa import ByteNFA, compile_kernels

__all__ = ["AutomatonTooLarge", "ByteDFA", "ByteNFA", "CompileTimeout", "check_deadline", "compile_kernels", "deadline"]
