"""Regex structures: a regular expression compiled for a vocabulary (whole-text match).

The supported subset and what is refused are described in :mod:`constrain.automata.regex`.
"""

from __future__ import annotations

from constrain.automata.limits import DEFAULT_TIME_LIMIT, time_limited
from constrain.automata.regex import regex_to_dfa
from constrain.errors import ArgumentError
from constrain.runtime.matcher import DFAStructure
from constrain.vocab.vocabulary import Vocabulary


def compile_regex(
    pattern: str, vocab: Vocabulary, *, time_limit: float | None = DEFAULT_TIME_LIMIT, **options
) -> DFAStructure:
    """Compile a regex (whole-text match) for ``vocab``; ``options`` (``cache_bytes``) go to :class:`DFAStructure`.
    ``time_limit``: CPU seconds before :class:`~constrain.errors.CompileTimeout` (None: no limit)."""
    if not isinstance(pattern, str):
        raise ArgumentError("pattern", pattern, "a regex must be a str")
    with time_limited(time_limit, "the regex"):
        return DFAStructure(regex_to_dfa(pattern), vocab, source=pattern, **options)
