"""Tool calling on an :class:`~constrain.generation.llm.LLM`: one turn that answers in text or calls tools
(:func:`respond`), and the loop that runs the calls and feeds the results back (:func:`run_tools`).

The tools are described to the model in a system message (:func:`~constrain.compilers.tools.tools_prompt`), and
earlier calls and results are written as plain text (:func:`~constrain.compilers.tools.tool_messages_as_text`), so
any model works, base models included; the structure (:func:`~constrain.compilers.tools.compile_tools`) makes
every call valid.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from constrain.compilers.tools import (
    Tool,
    ToolCall,
    ToolChoice,
    ToolFormat,
    as_tools,
    compile_tools,
    read_tool_calls,
    tool_format,
    tool_messages_as_text,
    tools_prompt,
)
from constrain.errors import ArgumentError, ToolError
from constrain.generation.prompts import Message, is_chat

if TYPE_CHECKING:
    from constrain.generation.llm import LLM, Completion

#: Turns :func:`run_tools` takes by default before it asks for an answer in text.
MAX_STEPS = 8


@dataclass(frozen=True)
class ToolResponse:
    """One assistant turn: its text (before the calls, if any) and the calls, validated."""

    content: str
    tool_calls: list[ToolCall]
    completion: Completion

    @property
    def message(self) -> dict[str, Any]:
        """The turn as an OpenAI-style assistant message."""
        if not self.tool_calls:
            return {"role": "assistant", "content": self.content}
        calls = [call.to_openai() for call in self.tool_calls]
        return {"role": "assistant", "content": self.content or None, "tool_calls": calls}


@dataclass
class ToolRun:
    """What :func:`run_tools` did: the whole conversation (results included), the final answer, and each call
    with what its function returned (or the exception it raised)."""

    messages: list[dict[str, Any]]
    answer: str
    calls: list[tuple[ToolCall, Any]] = field(default_factory=list)
    steps: int = 0


def respond(
    llm: LLM,
    messages: str | Sequence[Message],
    tools: Iterable[Any],
    *,
    tool_choice: ToolChoice = "auto",
    parallel: bool | int = True,
    format: str | ToolFormat = "json",  # noqa: A002 - the name OpenAI-style callers use
    max_new_tokens: int = 256,
    **options: Any,
) -> ToolResponse:
    """Generate one assistant turn for ``messages`` with ``tools`` offered (see :meth:`LLM.respond`)."""
    tools = as_tools(tools)
    fmt = tool_format(format)
    structure = compile_tools(tools, llm.vocab, tool_choice=tool_choice, parallel=parallel, format=fmt)
    options.setdefault("fast_forward", "text")
    completion = llm.complete(_with_tools(messages, tools, fmt), structure, max_new_tokens=max_new_tokens, **options)
    if tool_choice == "none":
        return ToolResponse(completion.text.strip(), [], completion)
    content, calls = read_tool_calls(
        completion.tokens, structure.vocab, tools, format=fmt, required=tool_choice != "auto"
    )
    return ToolResponse(content.strip(), calls, completion)


def run_tools(
    llm: LLM,
    messages: str | Sequence[Message],
    tools: Iterable[Any],
    *,
    max_steps: int = MAX_STEPS,
    tool_choice: ToolChoice = "auto",
    on_call: Callable[[ToolCall, Any], None] | None = None,
    **options: Any,
) -> ToolRun:
    """Answer ``messages``, calling ``tools`` (Python functions) as the model asks (see :meth:`LLM.run_tools`)."""
    if isinstance(max_steps, bool) or not isinstance(max_steps, int) or max_steps < 1:
        raise ArgumentError("max_steps", max_steps, "an int >= 1")
    tools = as_tools(tools)
    missing = [t.name for t in tools if t.function is None]
    if missing:
        raise ToolError(f"run_tools calls Python functions; these tools have none: {', '.join(missing)}")
    by_name = {t.name: t for t in tools}
    history = [{"role": "user", "content": messages}] if isinstance(messages, str) else [dict(m) for m in messages]
    run = ToolRun(history, "")
    choice: ToolChoice = tool_choice
    for step in range(max_steps):
        run.steps = step + 1
        last = step == max_steps - 1
        turn = respond(llm, history, tools, tool_choice="none" if last else choice, **options)
        history.append(turn.message)
        if not turn.tool_calls:
            run.answer = turn.content
            return run
        for call in turn.tool_calls:
            result = _call(by_name[call.name], call)
            run.calls.append((call, result))
            if on_call is not None:
                on_call(call, result)
            history.append({"role": "tool", "tool_call_id": call.id, "name": call.name, "content": _as_text(result)})
        choice = "auto"  # a call was made: the model may now answer
    return run  # pragma: no cover - the last step asks for text, so the loop returns inside


def _with_tools(messages: str | Sequence[Message], tools: list[Tool], fmt: ToolFormat) -> list[dict[str, Any]]:
    """The chat the model reads: the tools described in the system message, calls and results as text."""
    if isinstance(messages, str):
        chat: list[Mapping[str, Any]] = [{"role": "user", "content": messages}]
    elif is_chat(messages):
        chat = list(messages)
    else:
        raise ArgumentError("messages", messages, "a string or a chat (a list of {'role', 'content'} messages)")
    plain = tool_messages_as_text(chat, format=fmt)
    described = tools_prompt(tools, format=fmt)
    if plain and plain[0]["role"] == "system":
        return [{"role": "system", "content": f"{plain[0]['content']}\n\n{described}"}, *plain[1:]]
    return [{"role": "system", "content": described}, *plain]


def _call(tool: Tool, call: ToolCall) -> Any:
    """Run one call: the function's result, or the exception it raised (handed to the model as an error)."""
    try:
        return tool.function(**call.arguments)  # type: ignore[misc]
    except Exception as exc:  # the model sees the failure and may try again
        return exc


def _as_text(result: Any) -> str:
    if isinstance(result, Exception):
        return f"error: {type(result).__name__}: {result}"
    if isinstance(result, str):
        return result
    try:
        return json.dumps(result, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        return str(result)
