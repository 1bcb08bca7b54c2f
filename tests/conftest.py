"""Shared fixtures: the real tokenizers and their vocabularies, loaded once per test session."""

from __future__ import annotations

import pytest

from constrain.models.tokenizers import load_cl100k, load_gemma_tokenizer
from constrain.vocab.vocabulary import Vocabulary


@pytest.fixture(scope="session")
def gemma_tokenizer():
    return load_gemma_tokenizer()


@pytest.fixture(scope="session")
def gemma_vocab(gemma_tokenizer) -> Vocabulary:
    return Vocabulary.from_tokenizer(gemma_tokenizer)


@pytest.fixture(scope="session")
def cl100k():
    return load_cl100k()


@pytest.fixture(scope="session")
def cl100k_vocab(cl100k) -> Vocabulary:
    return Vocabulary.from_tokenizer(cl100k)


@pytest.fixture(scope="session", params=["gemma", "cl100k"])
def real_vocab(request) -> Vocabulary:
    """Each real vocabulary in turn."""
    return request.getfixturevalue(f"{request.param}_vocab")
