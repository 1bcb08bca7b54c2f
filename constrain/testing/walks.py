"""Random walks under a mask, and reading a text byte by byte.

A walk draws each token from the tokens the mask allows, with a seeded generator, so that a test sees what a
sampler could produce: every walk that stops must be a complete match (an oracle such as ``re.fullmatch``, a
parser or a validator can check its text), and no walk may reach a state where nothing is allowed.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray

from constrain.errors import VocabularyError
from constrain.runtime.matcher import CompiledStructure, Matcher
from constrain.vocab.vocabulary import Vocabulary


def token_length_weights(vocab: Vocabulary, power: float = 2.0) -> NDArray[np.float64]:
    """Weights (``vocab.size``,) of ``1 / (1 + length in bytes) ** power``: for :func:`random_walk`, to prefer
    short tokens, which close strings and brackets sooner than the long words of a real vocabulary."""
    lengths = np.diff(np.asarray(vocab.offsets)).astype(np.float64)
    return 1.0 / (1.0 + lengths) ** power


def _draw(rng: random.Random | np.random.Generator, allowed: Sequence[int], weights: NDArray[np.float64] | None) -> int:
    if isinstance(rng, random.Random):
        if weights is None:
            return int(rng.choice(allowed))
        return int(rng.choices(allowed, weights=weights[list(allowed)].tolist())[0])
    if weights is None:
        return int(rng.choice(np.asarray(allowed)))
    w = weights[np.asarray(allowed)]
    return int(rng.choice(np.asarray(allowed), p=w / w.sum()))


def random_walk(
    start: Matcher | CompiledStructure,
    rng: random.Random | np.random.Generator | int,
    *,
    max_tokens: int = 100,
    stop: float = 0.5,
    weights: NDArray[np.float64] | None = None,
) -> list[int] | None:
    """Tokens drawn from the mask until the walk stops where the structure may end; None when ``max_tokens``
    tokens were read without stopping.

    The walk starts at ``start``: a matcher (left unchanged: the walk reads a copy) or a compiled structure (its
    start). At each step, where the structure may end, the walk stops with probability ``stop`` (1 stops at the
    first chance), and always when nothing but the end of sequence is allowed. Otherwise it reads one allowed
    token other than an end-of-sequence one, uniformly or in proportion to ``weights`` (one per token id, e.g.
    :func:`token_length_weights`).

    ``rng`` is a ``random.Random``, a numpy ``Generator``, or a seed for ``random.Random``. The result holds the
    tokens read (no end-of-sequence token); ``vocab.decode(result)`` is the text. A state where no token is
    allowed and the structure cannot end (a dead end, which a correct mask never leads to) raises
    AssertionError.
    """
    if isinstance(rng, int):
        rng = random.Random(rng)
    matcher = start.copy() if isinstance(start, Matcher) else start.matcher()
    vocab = matcher.structure.vocab
    eos = set(vocab.eos_ids.tolist())
    tokens: list[int] = []
    for _ in range(max_tokens):
        allowed = [t for t in matcher.allowed_tokens().tolist() if t not in eos]
        assert allowed or matcher.is_accepting(), f"dead end after {vocab.decode(tokens)!r}"
        if matcher.is_accepting() and (not allowed or rng.random() < stop):
            return tokens
        tokens.append(_draw(rng, allowed, weights))
        matcher.advance(tokens[-1])
    return None


_BYTE_TOKENS: dict[str, NDArray[np.int64]] = {}


def _byte_tokens(vocab: Vocabulary) -> NDArray[np.int64]:
    """For each byte value, the smallest id of a matchable token of exactly that one byte, or -1."""
    table = _BYTE_TOKENS.get(vocab.fingerprint)
    if table is None:
        offsets = np.asarray(vocab.offsets)
        ids = np.flatnonzero((np.diff(offsets) == 1) & np.asarray(vocab.matchable))
        table = np.full(256, -1, dtype=np.int64)
        table[np.asarray(vocab.data)[offsets[ids]][::-1]] = ids[::-1]
        if len(_BYTE_TOKENS) >= 16:
            _BYTE_TOKENS.clear()
        _BYTE_TOKENS[vocab.fingerprint] = table
    return table


def accepts_text(structure: CompiledStructure, text: str | bytes) -> bool:
    """Whether ``structure`` reads ``text`` (UTF-8 when a ``str``) one single-byte token per byte, and may end
    after it.

    This checks a structure's language without a tokenizer: with :func:`byte_vocabulary
    <constrain.testing.vocabularies.byte_vocabulary>` every text can be read this way. Raises VocabularyError
    when a byte of ``text`` has no single-byte token in the structure's vocabulary.
    """
    data = text.encode() if isinstance(text, str) else bytes(text)
    table = _byte_tokens(structure.vocab)
    ids = table[np.frombuffer(data, dtype=np.uint8)].tolist()
    if -1 in ids:
        missing = data[ids.index(-1)]
        raise VocabularyError(f"byte {missing:#04x} of the text has no single-byte token in this vocabulary")
    matcher = structure.matcher()
    if matcher.validate_tokens(ids) < len(ids):
        return False
    matcher.advance(ids)
    return matcher.is_accepting()
