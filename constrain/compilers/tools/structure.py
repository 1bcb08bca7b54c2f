"""A tool set compiled to one structure: the calls the model may write, or free text then calls.

Each tool's arguments schema is lowered by the JSON Schema compiler, and the grammars are joined under rules for
the call envelope ``{"name":"<tool>","<arguments_key>":<arguments>}`` (compact JSON, as the arguments), the
format's delimiters and the number of calls. With ``tool_choice="auto"`` the text is free until the format's
trigger and then calls: any text in which the trigger does not occur (:func:`~constrain.automata.text.
text_without`), so its first occurrence opens the calls, even when one token straddles the text and the trigger;
a trigger that is a special token of the vocabulary is that token, which text cannot hold.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Iterable, Mapping
from typing import Any
from typing import Literal as TypingLiteral

from constrain.automata.limits import COMPILE_CACHE_BYTES, DEFAULT_TIME_LIMIT, time_limited
from constrain.automata.text import ANY_TEXT, text_without
from constrain.cache import BoundedCache
from constrain.compilers.json_schema import schema_to_grammar
from constrain.compilers.tools.definitions import Tool, as_tools
from constrain.compilers.tools.formats import ToolFormat, tool_format
from constrain.errors import JsonSchemaError, ToolError
from constrain.grammar.ir import (
    Alt,
    Automaton,
    Expr,
    Grammar,
    Literal,
    Ref,
    Regex,
    Repeat,
    Seq,
    Token,
    calls_of,
    shared,
)
from constrain.runtime.pushdown import GrammarStructure, compile_grammar
from constrain.vocab.vocabulary import Vocabulary

ToolChoice = TypingLiteral["auto", "required", "none"] | Mapping[str, Any]
_START = "tool_calls"
_COMPILED = BoundedCache(COMPILE_CACHE_BYTES, costly=True)


def compile_tools(
    tools: Iterable[Any],
    vocab: Vocabulary,
    *,
    tool_choice: ToolChoice = "auto",
    parallel: bool | int = True,
    format: str | ToolFormat = "json",  # noqa: A002 - the name OpenAI-style callers use
    whitespace: str = "compact",
    time_limit: float | None = DEFAULT_TIME_LIMIT,
    cache: bool = True,
) -> GrammarStructure:
    """The structure of what the model may write with ``tools`` offered: calls, or text then calls.

    ``tools``: functions, Pydantic models, OpenAI tool dicts or :class:`Tool` objects. ``tool_choice``: ``"auto"``
    (free text, or the trigger then calls), ``"required"`` (calls only), ``"none"`` (free text without the
    trigger: no call can start), or one tool by name
    (``{"type": "function", "function": {"name": ...}}`` or ``{"name": ...}``: exactly one call of it).
    ``parallel``: ``True`` (any number of calls, at least one), ``False`` (one) or a maximum. ``whitespace``: that of
    the arguments (see :func:`~constrain.compilers.json_schema.schema_to_grammar`). Kept in a cache keyed by the
    tools' definitions, the options and the vocabulary."""
    tools = as_tools(tools)
    fmt = tool_format(format)
    chosen, required = _choice(tool_choice, tools)
    most = _most_calls(parallel) if tool_choice in ("auto", "required", "none") else 1
    key = (
        json.dumps([t.to_openai() for t in chosen], sort_keys=True),
        tool_choice if isinstance(tool_choice, str) else "named",
        most,
        fmt,
        whitespace,
        vocab.fingerprint,
    )
    if cache:
        found = _COMPILED.get(key)
        if found is not None:
            return found
    with time_limited(time_limit, "the tools"):
        grammar, relaxations = tools_grammar(
            chosen, vocab, required=required, most=most, fmt=fmt, whitespace=whitespace, calls=tool_choice != "none"
        )
        structure = compile_grammar(grammar, vocab, source=f"tools {', '.join(t.name for t in chosen)}")
    structure.relaxations = relaxations
    if relaxations:
        from constrain.compilers.api import RelaxationWarning  # the public warning class lives with compile()

        warnings.warn(f"relaxed in the tools' arguments: {'; '.join(relaxations)}", RelaxationWarning, stacklevel=2)
    if cache:
        _COMPILED.put(key, structure, structure.nbytes)
    return structure


def tools_grammar(
    tools: list[Tool],
    vocab: Vocabulary,
    *,
    required: bool,
    most: int | None,
    fmt: ToolFormat,
    whitespace: str,
    calls: bool = True,
) -> tuple[Grammar, list[str]]:
    """The grammar of the calls (see :func:`compile_tools`; ``calls=False``: the free text alone) and what
    strict=False relaxed in the arguments."""
    if not calls:
        return Grammar({_START: _free_text(fmt, vocab)}, _START), []
    rules: dict[str, Expr] = {}
    origins: dict[str, str] = {}
    relaxations: list[str] = []
    calls = []
    for tool in tools:
        try:
            grammar, notes = schema_to_grammar(tool.parameters, strict=tool.strict, whitespace=whitespace)
        except JsonSchemaError as exc:
            raise ToolError(f"tool {tool.name!r}: its arguments schema: {exc}") from exc
        relaxations.extend(f"{tool.name}: {note}" for note in notes)
        start = _merge(grammar, f"{tool.name}:", rules, origins)
        head = Literal(json.dumps({"name": tool.name}, separators=(",", ":"))[:-1] + f',"{fmt.arguments_key}":')
        calls.append(
            Seq((*_pieces(fmt.call_open, vocab), head, Ref(start), Literal("}"), *_pieces(fmt.call_close, vocab)))
        )
    rules["tool_call"] = calls[0] if len(calls) == 1 else Alt(tuple(calls))
    call = Ref("tool_call")
    more = None if most is None else most - 1
    if fmt.array:
        several = Seq((Literal("["), call, Repeat(Seq((Literal(","), call)), 1, more), Literal("]")))
        block: Expr = call if more == 0 else Alt((call, several))
    else:
        rest = Repeat(Seq((*_pieces(fmt.separator, vocab), call)), 0, more)
        block = Seq((*_pieces(fmt.open, vocab), call, rest, *_pieces(fmt.close, vocab)))
    if required:
        rules[_START] = block
    else:
        opened = block if fmt.trigger_in_block else Seq((*_pieces(fmt.trigger, vocab), block))
        rules[_START] = Seq((_free_text(fmt, vocab), Repeat(opened, 0, 1)))
    names_tokens = any(isinstance(p, Token) for s in _delimiters(fmt) for p in _pieces(s, vocab))
    return Grammar({_START: rules.pop(_START), **rules}, _START, origins, names_tokens=names_tokens), relaxations


def _free_text(fmt: ToolFormat, vocab: Vocabulary) -> Expr:
    """Text in which the trigger does not occur (any text when the trigger is a special token, which text cannot
    hold)."""
    trigger = _pieces(fmt.trigger, vocab)
    special = len(trigger) == 1 and isinstance(trigger[0], Token)
    return Regex(ANY_TEXT) if special else Automaton(text_without(fmt.trigger))


def _choice(tool_choice: Any, tools: list[Tool]) -> tuple[list[Tool], bool]:
    """The tools the model may call and whether it must call one."""
    if tool_choice in ("auto", "required", "none"):
        return tools, tool_choice == "required"
    if isinstance(tool_choice, Mapping):
        function = tool_choice.get("function", tool_choice)
        name = function.get("name") if isinstance(function, Mapping) else None
        for tool in tools:
            if tool.name == name:
                return [tool], True
        offered = ", ".join(t.name for t in tools)
        raise ToolError(f"tool_choice names {name!r}, which is not one of the tools offered ({offered})")
    raise ToolError(f"tool_choice must be 'auto', 'required', 'none' or a tool by name, not {tool_choice!r}")


def _most_calls(parallel: Any) -> int | None:
    if parallel is True:
        return None
    if parallel is False:
        return 1
    if isinstance(parallel, int) and parallel >= 1:
        return parallel
    raise ToolError(f"parallel must be True, False or a number of calls >= 1, not {parallel!r}")


def _delimiters(fmt: ToolFormat) -> tuple[str, ...]:
    return (fmt.trigger, fmt.open, fmt.close, fmt.call_open, fmt.call_close, fmt.separator)


def _pieces(text: str, vocab: Vocabulary) -> list[Literal | Token]:
    """``text`` as literals, with each name of a special token of ``vocab`` in it as that token."""
    names = sorted({n for i, n in vocab.special_names.items() if n and n in text and i not in vocab.eos_ids}, key=len)
    out: list[Literal | Token] = []
    rest = text
    while rest:
        hits = [(rest.find(n), -len(n), n) for n in names if n in rest]
        if not hits:
            out.append(Literal(rest))
            break
        at, _, name = min(hits)
        if at:
            out.append(Literal(rest[:at]))
        out.append(Token(name))
        rest = rest[at + len(name) :]
    return out


def _merge(grammar: Grammar, prefix: str, rules: dict[str, Expr], origins: dict[str, str]) -> str:
    """Add ``grammar``'s rules to ``rules``: a rule already there with the same body, calling only such rules, is
    shared (the JSON pieces every schema uses); a new name is kept; any other rule is renamed with ``prefix``.
    Returns the name of its start rule."""
    same = {name for name, body in grammar.rules.items() if rules.get(name) == body}
    while True:  # sharing a rule is right only if the rules it calls are shared too
        kept = {name for name in same if all(callee in same for callee in calls_of(grammar.rules[name]))}
        if kept == same:
            break
        same = kept
    renamed = {name: name if name in same or name not in rules else prefix + name for name in grammar.rules}
    rewrite = any(new != name for name, new in renamed.items())
    done: dict[int, Expr] = {}
    for name, body in grammar.rules.items():
        if name in same:
            continue
        new = renamed[name]
        rules[new] = _renamed(body, renamed, done) if rewrite else body
        if name in grammar.origins:
            origins[new] = f"{prefix}{grammar.origins[name]}"
    return renamed[grammar.start]


def _renamed(expr: Expr, names: dict[str, str], done: dict[int, Expr]) -> Expr:
    kind = type(expr)
    if kind is Ref:
        return Ref(names.get(expr.rule, expr.rule))
    if kind not in (Seq, Alt, Repeat):
        return expr
    found = done.get(id(expr))
    if found is None:
        if kind is Repeat:
            found = Repeat(_renamed(expr.item, names, done), expr.min, expr.max)
        else:
            found = kind(tuple(_renamed(item, names, done) for item in expr.items))
            if getattr(expr, "_shared", False):
                found = shared(found)
        done[id(expr)] = found
    return found
