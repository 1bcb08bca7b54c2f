"""Text out of tokens as they come: bytes of several tokens may make one character."""

from __future__ import annotations

import codecs

from constrain.vocab.vocabulary import Vocabulary


class TextStream:
    """Turns one row's tokens into text chunks; the chunks concatenate to the decoded text of all the tokens.

    A token may end inside a UTF-8 character: its bytes wait for the next token's, so no chunk holds a broken
    character (bytes that never complete one become U+FFFD at :meth:`close`).
    """

    def __init__(self, vocab: Vocabulary):
        self.vocab = vocab
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.text = ""

    def push(self, token: int) -> str:
        """The new text after ``token`` ("" while a character is incomplete)."""
        chunk = self._decoder.decode(self.vocab.token_bytes(token))
        self.text += chunk
        return chunk

    def close(self) -> str:
        """The text still held back at the end."""
        chunk = self._decoder.decode(b"", final=True)
        self.text += chunk
        return chunk
