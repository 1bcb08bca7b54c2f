"""Fixtures of the runtime tests."""

from __future__ import annotations

import pytest

from constrain.runtime import lexical
from constrain.runtime.lexical import LexicalMasks


@pytest.fixture
def fresh_lexical_store(tmp_path, monkeypatch):
    """Each test computes lexical walks itself, in its own cache folder, instead of reading earlier runs' (the
    grammar tests use it in every test: ``pytestmark = pytest.mark.usefixtures("fresh_lexical_store")``)."""

    def cache_dir(*parts: str):
        folder = tmp_path.joinpath(*parts)
        folder.mkdir(parents=True, exist_ok=True)
        return folder

    monkeypatch.setattr(lexical, "cache_dir", cache_dir)
    monkeypatch.setattr(LexicalMasks, "_stores", {})
