"""Typed errors. Each says what is wrong and where, so a caller can fix the input without a debugger."""

from __future__ import annotations


class ConstrainError(Exception):
    """Base class of every error this library raises on purpose."""


class StructureError(ConstrainError, ValueError):
    """A structure (regex, schema, grammar) is malformed or cannot be honoured exactly."""


class RegexError(StructureError):
    """A regular expression is malformed or uses a construct outside the supported subset.

    ``position`` is the 0-based character offset in ``pattern`` where the problem starts (or None when the
    whole pattern is at fault).
    """

    def __init__(self, message: str, pattern: str, position: int | None = None):
        self.pattern = pattern
        self.position = position
        where = f" at position {position}" if position is not None else ""
        pointer = ""
        if position is not None and len(pattern) <= 200:
            pointer = f"\n  {pattern}\n  {' ' * position}^"
        super().__init__(f"{message}{where} in regex {pattern!r}{pointer}")


class VocabularyError(ConstrainError, ValueError):
    """A tokenizer cannot be read, or a structure meets a vocabulary it was not compiled for."""


class TokenError(ConstrainError, ValueError):
    """A token id is out of range or not allowed by the structure at this point."""


class ShapeError(ConstrainError, ValueError):
    """An array (logits, bitmask) has the wrong shape, dtype or width."""


class DeadEndError(ConstrainError, RuntimeError):
    """No token is allowed: the structure cannot continue from here. ``text`` holds the output so far."""

    def __init__(self, message: str, text: str | bytes | None = None):
        self.text = text
        super().__init__(message if text is None else f"{message} (output so far: {text!r})")
