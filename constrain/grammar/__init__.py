"""The grammar IR and its compilation to rule DFAs: the layer every structure compiler lowers to."""

from constrain.errors import GrammarError
from constrain.grammar.ir import Alt, Automaton, Expr, Grammar, Literal, Ref, Regex, Repeat, Seq, shared
from constrain.grammar.rules import Pushdown, build_pushdown

__all__ = [
    "Alt",
    "Automaton",
    "Expr",
    "Grammar",
    "GrammarError",
    "Literal",
    "Pushdown",
    "Ref",
    "Regex",
    "Repeat",
    "Seq",
    "build_pushdown",
    "shared",
]
