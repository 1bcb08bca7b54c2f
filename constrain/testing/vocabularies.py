"""Small synthetic vocabularies for tests: every byte, a list of tokens, or seeded random runs of a few units.

Each vocabulary has one end-of-sequence id, right after its tokens (``vocab.eos_ids[0] == vocab.size - 1``), and
no other special token. Text tokens (``str``) are encoded as UTF-8.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence

from constrain.vocab.vocabulary import Vocabulary


def _encoded(token: bytes | str | None) -> bytes | None:
    return token.encode() if isinstance(token, str) else token


def tiny_vocabulary(tokens: Iterable[bytes | str | None]) -> Vocabulary:
    """A vocabulary of ``tokens`` in the order given (token ``i`` has id ``i``; ``None`` leaves a hole), then one
    end-of-sequence id, ``len(tokens)``.

    >>> vocab = tiny_vocabulary([b"a", "é", b"ab"])
    >>> vocab.size, vocab.eos_ids.tolist(), vocab.token_bytes(1)
    (4, [3], b'\\xc3\\xa9')
    """
    listed = [_encoded(t) for t in tokens]
    return Vocabulary.from_token_bytes(listed, eos_ids=[len(listed)])


def byte_vocabulary(extra: Iterable[bytes | str] = ()) -> Vocabulary:
    """Every byte as a token of its own (byte ``b`` is id ``b``), then the ``extra`` tokens in order, then one
    end-of-sequence id (256 when there is no extra token).

    With one token per byte, a structure reads any text: ``list(text.encode())`` are its token ids.
    """
    return tiny_vocabulary([bytes([b]) for b in range(256)] + [_encoded(t) for t in extra])


def random_vocabulary(
    units: Sequence[str],
    *,
    count: int = 3000,
    lengths: tuple[int, int] = (1, 5),
    seed: int = 0,
    extra: Iterable[bytes | str] = (),
    all_bytes: bool = False,
) -> Vocabulary:
    """``count`` seeded random runs of ``units`` (each run joins ``lengths[0]`` to ``lengths[1]`` units drawn
    with replacement; duplicates merge), the ``extra`` tokens, and every byte when ``all_bytes``, sorted by their
    bytes; then one end-of-sequence id.

    Runs of a grammar's pieces (``'{}[],:"ab1'`` for JSON-like text, or whole keywords) give tokens that cross the
    boundaries of its terminals and rules, as a real tokenizer's do, in a vocabulary small enough to check
    exhaustively. Without ``all_bytes`` no other byte appears, so walks stay among the units.

    The same arguments give the same vocabulary (``random.Random(seed)`` draws the runs).
    """
    lo, hi = lengths
    rng = random.Random(seed)
    runs = {"".join(rng.choice(units) for _ in range(rng.randint(lo, hi))) for _ in range(count)}
    tokens = {run.encode() for run in runs}
    tokens.update(t for t in (_encoded(x) for x in extra) if t is not None)
    if all_bytes:
        tokens.update(bytes([b]) for b in range(256))
    return tiny_vocabulary(sorted(tokens))
