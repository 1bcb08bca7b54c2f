"""Prompts: what ``LLM.generate`` accepts as input, turned into the text a model reads.

A prompt is a string (read as is), or a chat: a list of messages ``{"role": ..., "content": ...}``. A chat goes
through the model's chat template when it has one. A model without one (the embedded Gemma 3 270M is a base
model) gets the plain format: each message on its own paragraph as ``Role: content``, then ``Assistant:`` for the
model to continue::

    System: Answer in JSON.

    User: Who wrote Dune?

    Assistant:

A base model continues the conversation past its own turn, so generation from a chat in the plain format stops
at the next ``User:`` turn (:data:`PLAIN_CHAT_STOP`). A list of strings, or a list of chats, is a batch.
"""

from __future__ import annotations

import string
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from constrain.errors import ArgumentError

Message = Mapping[str, Any]
Prompt = str | Sequence[Message]

_ROLES = ("system", "user", "assistant", "tool")
#: Where a reply in the plain chat format ends: the model starting the user's next turn.
PLAIN_CHAT_STOP = "\nUser:"


def is_chat(prompt: Any) -> bool:
    """Whether ``prompt`` is one chat (a list of message mappings), rather than a string or a batch."""
    if isinstance(prompt, str) or not isinstance(prompt, Sequence):
        return False
    return bool(prompt) and isinstance(prompt[0], Mapping)


def split_batch(prompt: Any) -> tuple[list[Prompt], bool]:
    """The prompts of a call, and whether it was a batch (a list of strings or of chats)."""
    if isinstance(prompt, str) or is_chat(prompt):
        return [prompt], False
    if isinstance(prompt, Sequence) and prompt and all(isinstance(p, str) or is_chat(p) for p in prompt):
        return list(prompt), True
    raise ArgumentError(
        "prompt", prompt, "a string, a chat (a list of {'role', 'content'} messages), or a non-empty list of those"
    )


def check_chat(messages: Sequence[Message]) -> list[dict[str, Any]]:
    """The messages as plain dicts, each with a known role and string content."""
    checked = []
    for i, message in enumerate(messages):
        role, content = message.get("role"), message.get("content")
        if role not in _ROLES:
            raise ArgumentError(f"messages[{i}].role", role, f"one of {', '.join(_ROLES)}")
        if not isinstance(content, str):
            raise ArgumentError(f"messages[{i}].content", content, "a string")
        checked.append(dict(message))
    return checked


def plain_chat(messages: Sequence[Message]) -> str:
    """The plain format for models without a chat template (see the module docstring)."""
    turns = [f"{m['role'].capitalize()}: {m['content'].strip()}" for m in messages]
    return "\n\n".join([*turns, "Assistant:"])


def render(prompt: Prompt, template: Callable[[list[dict[str, Any]]], str] | None) -> str:
    """The text of one prompt: a string as is, a chat through ``template`` (None: :func:`plain_chat`)."""
    if isinstance(prompt, str):
        return prompt
    messages = check_chat(prompt)
    return template(messages) if template is not None else plain_chat(messages)


def template_fields(template: str) -> list[str]:
    """The ``{name}`` fields of a ``str.format`` template (``{{``/``}}`` are literal braces)."""
    try:
        return [name for _, name, _, _ in string.Formatter().parse(template) if name is not None]
    except ValueError as exc:
        requirement = f"a str.format template ({exc}; write {{{{ and }}}} for literal braces)"
        raise ArgumentError("template", template, requirement) from None
