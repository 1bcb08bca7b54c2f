"""Byte-level automata: NFAs, subset construction, minimisation, and regexes compiled to them."""

from constrain.automata.dfa import ByteDFA
from constrain.automata.limits import check_deadline, deadline
from constrain.automata.nfa import ByteNFA, compile_kernels
from constrain.errors import AutomatonTooLarge, CompileTimeout

__all__ = ["AutomatonTooLarge", "ByteDFA", "ByteNFA", "CompileTimeout", "check_deadline", "compile_kernels", "deadline"]
