"""The cache folder: an unusable one falls back to memory with one warning; files are readable by every user."""

from __future__ import annotations

import logging
import stat

import pytest

import constrain
from constrain import cache
from constrain.runtime.lexical import LexicalMasks
from constrain.vocab import Vocabulary


@pytest.fixture
def fresh_warnings(monkeypatch):
    monkeypatch.setattr(cache, "_WARNED", set())
    monkeypatch.setattr(LexicalMasks, "_stores", {})


@pytest.mark.parametrize("where", ["a file", "below a file"])
def test_an_unusable_cache_folder_falls_back_to_memory(cl100k, tmp_path, monkeypatch, caplog, fresh_warnings, where):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("x")
    monkeypatch.setenv("CONSTRAIN_CACHE_DIR", str(blocker if where == "a file" else blocker / "cache"))
    with caplog.at_level(logging.WARNING, logger="constrain"):
        vocab = Vocabulary.from_tokenizer(cl100k)
        again = Vocabulary.from_tokenizer(cl100k)
        structure = constrain.compile({"type": "object", "properties": {"a": {"type": "string"}}}, vocab, cache=False)
        structure.matcher().mask()
    assert vocab.fingerprint == again.fingerprint
    warnings = [r for r in caplog.records if "cannot be used" in r.getMessage()]
    assert len({r.getMessage() for r in warnings}) == len(warnings) >= 1  # once per folder
    assert cache.cache_dir("vocab") is None


def test_cache_files_are_readable_by_every_user(cl100k, tmp_path, monkeypatch, fresh_warnings):
    monkeypatch.setenv("CONSTRAIN_CACHE_DIR", str(tmp_path))
    Vocabulary.from_tokenizer(cl100k)
    files = list((tmp_path / "vocab").glob("*.vocab"))
    assert files
    for path in files:
        assert stat.S_IMODE(path.stat().st_mode) == cache.CACHE_FILE_MODE


def test_disk_dir_falls_back_to_a_folder_of_the_process(tmp_path, monkeypatch, fresh_warnings):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    monkeypatch.setenv("CONSTRAIN_CACHE_DIR", str(blocker))
    folder = cache.disk_dir("models", "x")
    assert folder.is_dir() and blocker not in folder.parents
    (folder / "probe").write_text("ok")
