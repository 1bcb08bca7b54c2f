"""Reading tool calls back from a model's text: the content before them and the validated calls.

The reader follows the format's delimiters and reads each call with Python's JSON decoder, so it also reads text
that a structure did not constrain (whitespace around delimiters is allowed); every call's tool must be offered
and its arguments must validate (:meth:`~constrain.compilers.tools.definitions.Tool.arguments`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

from constrain.compilers.tools.definitions import ToolCall, as_tools
from constrain.compilers.tools.formats import ToolFormat, tool_format
from constrain.errors import ToolCallError
from constrain.vocab.vocabulary import Vocabulary

_DECODER = json.JSONDecoder()


def parse_tool_calls(
    text: str,
    tools: Iterable[Any],
    *,
    format: str | ToolFormat = "json",  # noqa: A002 - the name OpenAI-style callers use
    required: bool = False,
) -> tuple[str, list[ToolCall]]:
    """The text before the calls and the calls of ``text`` written in ``format``.

    Without ``required``, text with no trigger is an answer without calls: ``(text, [])``. With it, ``text`` must be
    calls alone (what ``tool_choice="required"`` or a named tool produce). Raises
    :class:`~constrain.errors.ToolCallError` (with the character offset) when the calls are not in the format,
    name a tool not offered, or have arguments the tool's schema refuses."""
    by_name = {t.name: t for t in as_tools(tools)}
    fmt = tool_format(format)
    if required:
        content, pos = "", 0
    else:
        at = text.find(fmt.trigger)
        if at < 0:
            return text, []
        content = text[:at]
        pos = at if fmt.trigger_in_block else at + len(fmt.trigger)
    reader = _Reader(text, pos)
    found = _read_block(reader, fmt)
    reader.end()
    calls = []
    for name, _arguments, raw in found:
        tool = by_name.get(name)
        if tool is None:
            raise ToolCallError(f"a call names {name!r}, which is not one of the tools ({', '.join(by_name)})", text)
        calls.append(ToolCall(name, tool.arguments(raw), raw))
    return content, calls


def read_tool_calls(
    tokens: Sequence[int],
    vocab: Vocabulary,
    tools: Iterable[Any],
    *,
    format: str | ToolFormat = "json",  # noqa: A002 - the name OpenAI-style callers use
    required: bool = False,
) -> tuple[str, list[ToolCall]]:
    """:func:`parse_tool_calls` over generated token ids. When the trigger is a special token of ``vocab``, the
    calls start at that token: its name spelled by ordinary tokens in the text before is text, as the structure
    read it (in the text alone the two look the same). Special tokens are written as their names."""
    fmt = tool_format(format)
    triggers = {i for i, name in vocab.special_names.items() if name == fmt.trigger}
    tokens = [int(t) for t in tokens]
    at = next((k for k, t in enumerate(tokens) if t in triggers), None)
    if required or not triggers or at is None:
        return parse_tool_calls(vocab.text_with_specials(tokens), tools, format=fmt, required=required)
    _, calls = parse_tool_calls(vocab.text_with_specials(tokens[at:]), tools, format=fmt)
    return vocab.decode(tokens[:at]).decode("utf-8", errors="replace"), calls


class _Reader:
    def __init__(self, text: str, pos: int):
        self.text = text
        self.pos = pos

    def skip_space(self) -> None:
        while self.pos < len(self.text) and self.text[self.pos] in " \t\r\n":
            self.pos += 1

    def take(self, literal: str) -> bool:
        """Read ``literal`` (whitespace around it allowed) if it comes next."""
        stripped = literal.strip()
        if not stripped:
            return True
        self.skip_space()
        if self.text.startswith(stripped, self.pos):
            self.pos += len(stripped)
            return True
        return False

    def expect(self, literal: str) -> None:
        if not self.take(literal):
            raise ToolCallError(f"expected {literal.strip()!r}", self.text, self.pos)

    def value(self) -> Any:
        self.skip_space()
        try:
            value, end = _DECODER.raw_decode(self.text, self.pos)
        except json.JSONDecodeError as exc:
            raise ToolCallError(f"not JSON: {exc.msg}", self.text, exc.pos) from None
        self.pos = end
        return value

    def end(self) -> None:
        self.skip_space()
        if self.pos != len(self.text):
            raise ToolCallError("unexpected text after the tool calls", self.text, self.pos)


def _read_block(reader: _Reader, fmt: ToolFormat) -> list[tuple[str, Any, str]]:
    if fmt.array:
        reader.skip_space()
        start = reader.pos
        value = reader.value()
        items = value if isinstance(value, list) else [value]
        if not items:
            raise ToolCallError("an empty list of calls", reader.text, start)
        return [_call(item, fmt, reader.text, start) for item in items]
    reader.expect(fmt.open)
    calls = []
    while True:
        reader.expect(fmt.call_open)
        start = reader.pos
        calls.append(_call(reader.value(), fmt, reader.text, start))
        reader.expect(fmt.call_close)
        mark = reader.pos
        if fmt.separator.strip() and not reader.take(fmt.separator):
            break
        reader.skip_space()
        if not reader.text.startswith(fmt.call_open.strip() or "{", reader.pos):
            reader.pos = mark
            break
    reader.expect(fmt.close)
    return calls


def _call(value: Any, fmt: ToolFormat, text: str, position: int) -> tuple[str, Any, str]:
    """(name, arguments, arguments as JSON text) of one call object."""
    key = fmt.arguments_key
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        raise ToolCallError('a call must be an object with a "name"', text, position)
    extra = set(value) - {"name", key}
    if extra:
        raise ToolCallError(f"a call has unexpected keys {sorted(extra)}", text, position)
    arguments = value.get(key, {})
    if not isinstance(arguments, dict):
        raise ToolCallError(f'a call\'s "{key}" must be an object', text, position)
    return value["name"], arguments, json.dumps(arguments, ensure_ascii=False, separators=(",", ":"))
