"""The vocabulary tests' own readings of the real tokenizers: built afresh, not from the disk cache, so that the
tests check the build itself."""

from __future__ import annotations

import pytest

from constrain.models.tokenizers import load_cl100k_byte_level
from constrain.vocab.vocabulary import Vocabulary


@pytest.fixture(scope="session")
def gemma_vocab(gemma_tokenizer):
    """Built afresh (not from the disk cache), so these tests check the build itself."""
    return Vocabulary.from_tokenizer(gemma_tokenizer, cache=False)


@pytest.fixture(scope="session")
def cl100k_vocab(cl100k):
    return Vocabulary.from_tokenizer(cl100k, cache=False)


@pytest.fixture(scope="session")
def cl100k_hf():
    return load_cl100k_byte_level()


@pytest.fixture(scope="session")
def cl100k_hf_vocab(cl100k_hf):
    return Vocabulary.from_tokenizer(cl100k_hf, cache=False)
