"""Specs whose Python type does not say what they are: a regex, a Lark grammar and a GBNF grammar are all ``str``.

Wrapping the text says which it is, so :func:`constrain.compile` and an ``output_type`` need no ``kind=``. The
wrappers are frozen, so they hash by value and serve as compile-cache keys.
"""

from __future__ import annotations

from dataclasses import dataclass

from constrain.errors import ArgumentError


@dataclass(frozen=True)
class Regex:
    """A regular expression the whole text must match (the subset of :mod:`constrain.compilers.regex`)."""

    pattern: str

    def __post_init__(self) -> None:
        _check_str("pattern", self.pattern, "a regular expression")


@dataclass(frozen=True)
class Lark:
    """A Lark grammar's text; ``start`` names its start rule (None: ``start``)."""

    text: str
    start: str | None = None

    def __post_init__(self) -> None:
        _check_str("text", self.text, "the text of a Lark grammar")
        _check_start(self.start)


@dataclass(frozen=True)
class GBNF:
    """A GBNF grammar's text (llama.cpp's format); ``start`` names its start rule (None: ``root``)."""

    text: str
    start: str | None = None

    def __post_init__(self) -> None:
        _check_str("text", self.text, "the text of a GBNF grammar")
        _check_start(self.start)


def _check_str(parameter: str, value: object, what: str) -> None:
    if not isinstance(value, str):
        raise ArgumentError(parameter, value, f"{what} (a str), got {type(value).__name__}")


def _check_start(start: object) -> None:
    if start is not None and not isinstance(start, str):
        raise ArgumentError("start", start, f"the name of a rule (a str) or None, got {type(start).__name__}")
