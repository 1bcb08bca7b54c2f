"""Vocabularies: token id -> bytes for every tokenizer kind, the matchable tokens, end-of-sequence ids, the trie."""

from constrain.vocab.readers import (
    END_OF_TURN_TOKENS,
    EOS_TOKEN_NAMES,
    NON_TEXT_ADDED_TOKENS,
    bytes_to_unicode,
)
from constrain.vocab.trie import TokenTrie
from constrain.vocab.vocabulary import Vocabulary

__all__ = [
    "END_OF_TURN_TOKENS",
    "EOS_TOKEN_NAMES",
    "NON_TEXT_ADDED_TOKENS",
    "TokenTrie",
    "Vocabulary",
    "bytes_to_unicode",
]
