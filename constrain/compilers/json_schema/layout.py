"""How values are laid out: the punctuation of each whitespace mode, and the rules every schema shares (the
lexical pieces, any JSON value).
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import lru_cache
from types import MappingProxyType
from typing import NamedTuple

from constrain.compilers.json_schema.counted import _counted_chars
from constrain.compilers.json_schema.values import _INTEGER, _NONINT, _NUMBER, _STRING
from constrain.grammar.ir import Alt, Expr, Literal, Ref, Regex, Repeat, Seq

#: Indentation levels written exactly in ``whitespace="indent"``; deeper values continue compactly.
MAX_INDENT_DEPTH = 12


class _Layout(NamedTuple):
    obj_open: Expr
    obj_close: Expr
    arr_open: Expr
    arr_close: Expr
    comma: Expr
    colon: Expr
    obj_empty: Expr
    arr_empty: Expr


def _child_depth(depth: int | None) -> int | None:
    if depth is None or depth + 1 > MAX_INDENT_DEPTH:
        return None
    return depth + 1


# The rules every schema may share are built once per process, so that each schema's grammar holds the very same
# objects: their hashes are cached on them, cache lookups by body meet them by identity, and the rule DFAs built
# from them are found at once.


#: The shared rules that can complete without reading a byte. Every other shared rule (the lexical ones, and the
#: rules of any JSON value) reads a byte first and calls first only shared rules that do, so grammars name them
#: settled (:attr:`~constrain.grammar.ir.Grammar.settled`) and compiles do not check them again.
NULLABLE_SHARED = frozenset({"ws"})


@lru_cache(maxsize=256)  # small entries (a literal, a short regex) but one: the block of LENGTH_BLOCK characters
def _shared_body(name: str, max_ws: int) -> Expr:
    """The body of a shared lexical rule."""
    if name.startswith("json_chars_"):
        size = int(name.rsplit("_", 1)[1])
        return _counted_chars(size, size, False, False)
    if name == "ws":
        return Regex(f"[ \\t\\n\\r]{{0,{max_ws}}}")
    if name in ("true", "false", "null"):
        return Literal(name)
    patterns = {"json_string": _STRING, "json_number": _NUMBER, "json_integer": _INTEGER, "json_fraction": _NONINT}
    return Regex(patterns[name])


@lru_cache(maxsize=256)  # entries are small: eight punctuation expressions
def _layout(whitespace: str, max_ws: int, depth: int | None) -> _Layout:
    """The punctuation of objects and arrays at ``depth`` (indented output) or anywhere."""
    if whitespace == "indent" and depth is not None:
        inner = "  " * (depth + 1)
        outer = "  " * depth
        return _Layout(
            Literal("{\n" + inner), Literal("\n" + outer + "}"),
            Literal("[\n" + inner), Literal("\n" + outer + "]"),
            Literal(",\n" + inner), Literal(": "), Literal("{}"), Literal("[]"),
        )  # fmt: skip
    if whitespace == "flexible":
        ws = Ref("ws")
        return _Layout(
            Seq((Literal("{"), ws)), Seq((ws, Literal("}"))), Seq((Literal("["), ws)), Seq((ws, Literal("]"))),
            Seq((ws, Literal(","), ws)), Seq((ws, Literal(":"), ws)), Seq((Literal("{"), ws, Literal("}"))),
            Seq((Literal("["), ws, Literal("]"))),
        )  # fmt: skip
    return _Layout(
        Literal("{"), Literal("}"), Literal("["), Literal("]"), Literal(","), Literal(":"), Literal("{}"), Literal("[]")
    )


@lru_cache(maxsize=256)  # entries are small: a few rules of a few literals and calls, and their few-state DFAs
def _any_value_rules(whitespace: str, max_ws: int, depth: int | None) -> Mapping[str, Expr]:
    """The rules of any JSON value at ``depth``: ``json_value`` (suffixed ``@depth`` for indented output), those
    of the values nested in it, and the lexical rules they call.

    Objects, arrays and the literals are written in ``json_value``'s own body, not as rules of their own: every
    compile of a schema with an open object carries these rules through its checks and clean-up, so one rule costs
    it less than six would (the language and the masks are the same)."""
    suffix = "" if depth is None else f"@{depth}"
    lay = _layout(whitespace, max_ws, depth)
    child = _child_depth(depth)
    rules: dict[str, Expr] = {}
    if child != depth:
        rules.update(_any_value_rules(whitespace, max_ws, child))
    for name in ("json_string", "json_number") + (("ws",) if whitespace == "flexible" else ()):
        rules[name] = _shared_body(name, max_ws)
    value = Ref("json_value" + ("" if child is None else f"@{child}"))
    member = Seq((Ref("json_string"), lay.colon, value))
    rules["json_value" + suffix] = Alt(
        (
            lay.obj_empty,
            Seq((lay.obj_open, member, Repeat(Seq((lay.comma, member))), lay.obj_close)),
            lay.arr_empty,
            Seq((lay.arr_open, value, Repeat(Seq((lay.comma, value))), lay.arr_close)),
            Ref("json_string"),
            Ref("json_number"),
            Literal("true"),
            Literal("false"),
            Literal("null"),
        )
    )
    return MappingProxyType(rules)  # shared by every caller: read-only
