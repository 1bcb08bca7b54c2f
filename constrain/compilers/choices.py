"""A fixed list of choices: the output is exactly one of the given strings."""

from __future__ import annotations

from collections.abc import Sequence

from constrain.automata.limits import DEFAULT_TIME_LIMIT, check_deadline, time_limited
from constrain.compilers.regex import compile_regex
from constrain.errors import StructureError
from constrain.runtime.masks import DEFAULT_CACHE_BYTES
from constrain.runtime.matcher import DFAStructure
from constrain.vocab.vocabulary import Vocabulary

_PLAIN = frozenset(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_")


def choice_regex(choices: Sequence[str]) -> str:
    """A regex matching exactly one of ``choices``: the alternation of the literals, every character that is not
    an ASCII letter, digit or ``_`` escaped as ``\\xNN``, ``\\uNNNN`` or ``\\UNNNNNNNN``."""
    if isinstance(choices, str) or not isinstance(choices, Sequence) or not choices:
        raise StructureError(f"choices must be a non-empty list of strings, got {choices!r}")
    parts = []
    for index, choice in enumerate(choices):
        check_deadline()
        if not isinstance(choice, str):
            raise StructureError(f"choice {index} must be a string, got {type(choice).__name__} {choice!r}")
        parts.append("".join(_escaped(ch) for ch in choice))
    return "(?:" + "|".join(parts) + ")"


def _escaped(ch: str) -> str:
    cp = ord(ch)
    if cp < 128 and cp in _PLAIN:
        return ch
    if cp < 0x100:
        return f"\\x{cp:02x}"
    if cp < 0x10000:
        return f"\\u{cp:04x}"
    return f"\\U{cp:08x}"


def compile_choices(
    choices: Sequence[str],
    vocab: Vocabulary,
    *,
    cache_bytes: int = DEFAULT_CACHE_BYTES,
    time_limit: float | None = DEFAULT_TIME_LIMIT,
) -> DFAStructure:
    """Compile ``choices`` for ``vocab``: the structure accepts exactly the texts in the list. ``time_limit``: CPU
    seconds before :class:`~constrain.errors.CompileTimeout` (None: no limit)."""
    with time_limited(time_limit, "the choices"):
        return compile_regex(choice_regex(choices), vocab, cache_bytes=cache_bytes, time_limit=None)
