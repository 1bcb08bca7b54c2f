"""How a model writes tool calls: formats are data (:class:`ToolFormat`), not code paths.

A format says how one call is written (``{"name": ..., <arguments_key>: {...}}`` with the text around it), how
several are joined, and what opens the calls where the model may also answer in text (its ``trigger``). Any
delimiter that is the name of a special token of the vocabulary (``<tool_call>`` in Qwen's, ``<|python_tag|>`` in
Llama 3's) is matched as that token, and stays unmatchable everywhere else; in a vocabulary without it, it is
text. Built in:

- ``"json"`` (the default, for base models such as the embedded one): one call is a JSON object, several a JSON
  array of them; the trigger ``<tool_call>`` precedes them after text.
- ``"hermes"`` (Hermes, Qwen 2.5 / 3): each call in ``<tool_call>\\n...\\n</tool_call>``, one per line; the first
  ``<tool_call>`` is the trigger.
- ``"llama3_json"`` (Llama 3.1 / 3.2 JSON tool calling): ``<|python_tag|>`` then calls with a ``"parameters"``
  key, joined by ``"; "``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from constrain.compilers.tools.definitions import as_tools
from constrain.errors import ToolError


@dataclass(frozen=True)
class ToolFormat:
    """How tool calls are written. The calls block is ``open, call, (separator, call)*, close``, each call being
    ``call_open {"name": ..., "<arguments_key>": ...} call_close``. ``trigger`` opens the calls after free text;
    ``trigger_in_block``: the block itself starts with the trigger (so it is not written twice); otherwise the
    trigger is written only after text (``tool_choice="auto"``)."""

    name: str
    trigger: str
    trigger_in_block: bool = False
    open: str = ""
    close: str = ""
    call_open: str = ""
    call_close: str = ""
    separator: str = ""
    arguments_key: str = "arguments"
    #: Several calls go in a JSON array (``open``/``close``/``separator`` then apply only to several).
    array: bool = False

    def __post_init__(self) -> None:
        if not self.trigger:
            raise ToolError(f"tool format {self.name!r} needs a trigger")
        if self.trigger_in_block and not (self.open or self.call_open).startswith(self.trigger):
            raise ToolError(f"tool format {self.name!r}: a trigger in the block must start it")

    def write(self, calls: Sequence[tuple[str, Any]], *, after_text: bool = False) -> str:
        """The text of ``calls`` (pairs of name and arguments) in this format, in compact JSON with non-ASCII
        characters as they are (what the structure reads); ``after_text``: with the trigger that opens them after
        an answer's text."""
        bodies = [
            self.call_open
            + json.dumps({"name": n, self.arguments_key: a}, separators=(",", ":"), ensure_ascii=False)
            + self.call_close
            for n, a in calls
        ]
        if self.array:
            block = f"[{','.join(bodies)}]" if len(bodies) > 1 else bodies[0]
        else:
            block = self.open + self.separator.join(bodies) + self.close
        return (self.trigger if after_text and not self.trigger_in_block else "") + block


FORMATS: dict[str, ToolFormat] = {
    "json": ToolFormat("json", trigger="<tool_call>", array=True),
    "hermes": ToolFormat(
        "hermes",
        trigger="<tool_call>",
        trigger_in_block=True,
        call_open="<tool_call>\n",
        call_close="\n</tool_call>",
        separator="\n",
    ),
    "llama3_json": ToolFormat(
        "llama3_json", trigger="<|python_tag|>", open="", separator="; ", arguments_key="parameters"
    ),
}


def tool_format(format: str | ToolFormat) -> ToolFormat:  # noqa: A002 - the name callers use
    """A format by name (see :data:`FORMATS`) or as given."""
    if isinstance(format, ToolFormat):
        return format
    if format not in FORMATS:
        raise ToolError(f"unknown tool format {format!r}; the built-in formats are {', '.join(FORMATS)}")
    return FORMATS[format]


def tools_prompt(tools: Iterable[Any], *, format: str | ToolFormat = "json") -> str:  # noqa: A002
    """A system message describing ``tools`` (anything :func:`~constrain.compilers.tools.definitions.as_tools`
    takes) and how to call them, for a model whose chat template knows no tools:
    each tool's name, description and arguments schema, and an example of a call in ``format``."""
    fmt = tool_format(format)
    tools = as_tools(tools)
    lines = ["You can call these tools:"]
    for tool in tools:
        schema = json.dumps(tool.parameters, separators=(",", ":"))
        lines.append(f"- {tool.name}: {tool.description or '(no description)'} Arguments: {schema}")
    example = fmt.write([(tools[0].name, _example_arguments(tools[0].parameters))], after_text=True)
    lines.append(f"To call a tool, write {fmt.trigger} and the call, for example: {example}")
    lines.append("Otherwise answer in plain text.")
    return "\n".join(lines)


def tool_messages_as_text(messages: Sequence[Mapping[str, Any]], *, format: str | ToolFormat = "json") -> list[dict]:  # noqa: A002
    """``messages`` with tool calls and tool results written as plain text, for a chat template without tool
    support: an assistant message's ``tool_calls`` become its text in ``format``; a ``tool`` message becomes a
    user message ``Result of <name>: <content>``."""
    fmt = tool_format(format)
    names: dict[str, str] = {}
    out: list[dict] = []
    for message in messages:
        role = message.get("role")
        content = message.get("content") or ""
        if role == "assistant" and message.get("tool_calls"):
            calls = []
            for call in message["tool_calls"]:
                function = call["function"]
                arguments = function.get("arguments") or "{}"
                calls.append((function["name"], json.loads(arguments) if isinstance(arguments, str) else arguments))
                names[call.get("id", "")] = function["name"]
            out.append({"role": "assistant", "content": content + fmt.write(calls, after_text=True)})
        elif role == "tool":
            name = message.get("name") or names.get(message.get("tool_call_id", ""), "the tool")
            out.append({"role": "user", "content": f"Result of {name}: {content}"})
        else:
            out.append({"role": role, "content": content})
    return out


def _example_arguments(schema: Mapping[str, Any]) -> dict[str, Any]:
    """Placeholder arguments for a prompt's example call: each required property with a value of its type."""
    placeholders = {"string": "...", "integer": 1, "number": 1.5, "boolean": True, "array": [], "object": {}}
    properties = schema.get("properties") or {}
    out = {}
    for name in schema.get("required") or []:
        kind = (properties.get(name) or {}).get("type", "string")
        out[name] = placeholders.get(kind if isinstance(kind, str) else "string", "...")
    return out
