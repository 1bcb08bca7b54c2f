"""Tool calls streamed as OpenAI streams them: content deltas until the calls begin, then per call a delta with its
index, id and function name, then the text of its arguments piece by piece.

The calls are read as the tool structure writes them (:func:`constrain.tools.compile_tools`): each is the compact
``{"name":"<tool>","<arguments_key>":<arguments>}``, whatever the format puts around and between them. Text that
may still turn out to begin the format's trigger is held back from the content until it cannot.
"""

from __future__ import annotations

import uuid
from typing import Any

from constrain.generation.batching import safe_text_end
from constrain.tools import ToolFormat

_OPEN = '{"name":"'


class ToolCallStream:
    """Splits one choice's growing text into OpenAI delta pieces: ``{"content": ...}`` and ``{"tool_calls":
    [...]}``. ``required``: the text is calls only (``tool_choice`` ``"required"`` or a named tool), so no content
    and no trigger precede them."""

    def __init__(self, fmt: ToolFormat, *, required: bool):
        self.fmt = fmt
        self.in_calls = required
        self.calls: list[tuple[str, str]] = []  # (id, name) of each call begun
        self._pending = ""
        self._state = "seek"
        self._depth = 0
        self._in_string = False
        self._escaped = False

    def push(self, text: str) -> list[dict[str, Any]]:
        """The deltas ``text`` adds."""
        self._pending += text
        out: list[dict[str, Any]] = []
        if not self.in_calls:
            trigger = self.fmt.trigger
            at = self._pending.find(trigger)
            if at < 0:
                safe = safe_text_end(self._pending, [trigger])
                if safe:
                    out.append({"content": self._pending[:safe]})
                self._pending = self._pending[safe:]
                return out
            if at:
                out.append({"content": self._pending[:at]})
            self.in_calls = True
            self._pending = self._pending[at if self.fmt.trigger_in_block else at + len(trigger) :]
        out.extend(self._scan())
        return out

    def close(self) -> list[dict[str, Any]]:
        """What is still held back, at the end of the text: content that did not begin the trigger."""
        if self.in_calls or not self._pending:
            return []
        out = [{"content": self._pending}]
        self._pending = ""
        return out

    def _scan(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        key = f',"{self.fmt.arguments_key}":'
        while self._pending:
            if self._state == "seek":
                at = self._pending.find(_OPEN)
                if at < 0:
                    self._pending = self._pending[-(len(_OPEN) - 1) :]
                    break
                self._pending = self._pending[at + len(_OPEN) :]
                self._state = "name"
            elif self._state == "name":
                end = self._pending.find('"')
                if end < 0:
                    break
                name, self._pending = self._pending[:end], self._pending[end + 1 :]
                call_id = f"call_{uuid.uuid4().hex[:24]}"
                self.calls.append((call_id, name))
                function = {"name": name, "arguments": ""}
                out.append({"tool_calls": [{"index": len(self.calls) - 1, "id": call_id, "type": "function",
                                            "function": function}]})  # fmt: skip
                self._state = "key"
            elif self._state == "key":
                if len(self._pending) < len(key):
                    break
                if not self._pending.startswith(key):  # not the envelope the structure writes: look again
                    self._state = "seek"
                    continue
                self._pending = self._pending[len(key) :]
                self._state, self._depth, self._in_string, self._escaped = "arguments", 0, False, False
            else:
                piece, done = self._arguments()
                if piece:
                    index = len(self.calls) - 1
                    out.append({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})
                if not done:
                    break
                self._state = "seek"
        return out

    def _arguments(self) -> tuple[str, bool]:
        """Read the arguments' JSON text as far as it goes; (the piece read, whether the value is complete)."""
        text = self._pending
        for i, ch in enumerate(text):
            if self._in_string:
                if self._escaped:
                    self._escaped = False
                elif ch == "\\":
                    self._escaped = True
                elif ch == '"':
                    self._in_string = False
            elif ch == '"':
                self._in_string = True
            elif ch in "{[":
                self._depth += 1
            elif ch in "}]":
                self._depth -= 1
                if self._depth == 0:
                    self._pending = text[i + 1 :]
                    return text[: i + 1], True
        self._pending = ""
        return text, False
