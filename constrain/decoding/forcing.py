"""Forced continuations: the tokens a structure leaves no choice about, appended without asking the model.

Two ways to find them, chosen per row by :data:`FastForward`:

- ``"tokens"``: the tokens that are each the only one the mask allows (:meth:`Matcher.forced_tokens
  <constrain.runtime.matcher.Matcher.forced_tokens>`). Sampling would have drawn exactly these, so the output is
  the one of plain constrained decoding (greedy: the same text; sampled: the same distribution, though a seeded
  run draws no random number for a forced token, so its later draws differ); only the forward passes are fewer
  (the loop feeds them in one pass).
- ``"text"``: the *bytes* the structure forces (after ``{`` of an object whose first key is required, the whole
  ``"name":"``), tokenised the way the tokenizer tokenises that text on its own. A large vocabulary rarely has a
  single allowed token (``"``, ``"n``, ``"name`` ... all fit), so this forces far more; it changes the output
  where the model would have split the forced text into other tokens, or merged its first byte into the token
  before it. The last token is left to the model when a longer allowed token starts with it (``"`` before a
  string value may merge with the value's first letters), so the forced text never ends on a split the model
  would not make.
- ``"off"``: nothing is forced; one sampled token per step.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

from constrain.errors import TokenError
from constrain.kernels.bitmask import allowed_token_ids
from constrain.runtime.matcher import Matcher
from constrain.vocab.vocabulary import LITERAL_BYTE

FastForward = Literal["off", "tokens", "text"]
FAST_FORWARD_MODES: tuple[str, ...] = ("off", "tokens", "text")
#: Most bytes of forced text one step reads (a long constant is forced over several steps).
MAX_FORCED_BYTES = 256
#: Text (forced bytes, decoded) to token ids, without special tokens: the tokenizer's own split.
Tokenize = Callable[[str], list[int]]


def forced_continuation(
    matcher: Matcher, mode: FastForward, *, tokenize: Tokenize | None = None, limit: int = MAX_FORCED_BYTES
) -> list[int]:
    """The tokens to append to ``matcher``'s sequence without sampling (``matcher`` itself is not moved)."""
    if mode == "off" or matcher.is_accepting():
        return []
    if mode == "text" and tokenize is not None:
        tokens = _canonical_tokens(matcher, tokenize, limit)
        if tokens:
            return tokens
    return matcher.forced_tokens()[:limit]


def _canonical_tokens(matcher: Matcher, tokenize: Tokenize, limit: int) -> list[int]:
    """The tokenizer's split of the forced text, less a last token the model might extend; [] when there is none
    or the split does not spell the text (a tokenizer that normalises it)."""
    forced = matcher.forced_bytes(limit)
    text = _complete_characters(forced)
    if not text:
        return []
    tokens = [int(t) for t in tokenize(text)]
    vocab = matcher.structure.vocab
    if not tokens or any(not 0 <= t < vocab.size for t in tokens) or vocab.decode(tokens) != text.encode("utf-8"):
        return []
    probe = matcher.copy()
    try:
        probe.advance(tokens[:-1])
    except TokenError:
        return []
    last = vocab.token_bytes(tokens[-1])
    allowed = allowed_token_ids(probe.mask(), vocab.size)
    if any(len(b) > len(last) and b.startswith(last) for b in map(vocab.token_bytes, allowed.tolist())):
        tokens.pop()
    return tokens


def _complete_characters(data: bytes) -> str:
    """``data`` cut after its last whole UTF-8 character, decoded (forced bytes may stop inside one), and before a
    token literal (a named special token, which is not text: the token itself is forced next)."""
    data = data.split(bytes([LITERAL_BYTE]), 1)[0]
    for cut in range(len(data), max(len(data) - 4, -1), -1):
        try:
            return data[:cut].decode("utf-8")
        except UnicodeDecodeError:
            continue
    return ""
