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


# -- the process-wide budget of in-memory caches ----------------------------------------------------------------


def test_a_budget_evicts_least_recently_used_entries_across_caches():
    from constrain.cache import BoundedCache, CacheBudget

    budget = CacheBudget(100)
    first, second = BoundedCache(1000, budget=budget), BoundedCache(1000, budget=budget)
    first.put("a", 1, 40)
    second.put("b", 2, 40)
    assert first.get("a") == 1  # "a" is now more recent than "b"
    second.put("c", 3, 40)  # 120 > 100: the least recently used, "b", goes
    assert second.get("b") is None and first.get("a") == 1 and second.get("c") == 3
    assert budget.used_bytes == 80 == first.nbytes + second.nbytes


def test_a_budget_evicts_cheap_entries_before_costly_ones_while_the_cheap_hold_half_of_it():
    """Masks and walks (microseconds to redo) go before automata (milliseconds), however recently either was
    used, until the cheap entries hold less than half the budget; then the costly ones go, least recent first."""
    from constrain.cache import BoundedCache, CacheBudget

    budget = CacheBudget(100)
    automata, masks = BoundedCache(1000, budget=budget, costly=True), BoundedCache(1000, budget=budget)
    automata.put("old automaton", 1, 20)
    for i in range(8):  # each over budget evicts the oldest mask, never the older automaton
        masks.put(i, i, 20)
    assert automata.get("old automaton") == 1
    assert [i for i in range(8) if masks.get(i) is not None] == [4, 5, 6, 7]
    automata.put("new automaton", 2, 40)  # the cheap hold 80 >= 50: they give way, oldest first
    assert automata.get("old automaton") == 1 and automata.get("new automaton") == 2
    assert [i for i in range(8) if masks.get(i) is not None] == [6, 7]
    automata.put("third", 3, 20)  # the cheap would hold 40 < 50: now the least recent automaton goes
    assert automata.get("old automaton") is None and automata.get("third") == 3
    assert [i for i in range(8) if masks.get(i) is not None] == [6, 7]
    assert budget.used_bytes == automata.nbytes + masks.nbytes <= 100


def test_an_entry_alone_in_its_kind_stays_when_it_is_the_one_just_put():
    from constrain.cache import BoundedCache, CacheBudget

    budget = CacheBudget(100)
    automata, masks = BoundedCache(1000, budget=budget, costly=True), BoundedCache(1000, budget=budget)
    automata.put("a", 1, 90)
    masks.put("m", 2, 30)  # 120 > 100; the cheap hold less than half, and the only cheap entry is this one
    assert masks.get("m") == 2 and automata.get("a") is None and budget.used_bytes == 30


class _CountedKey:
    """A key equal to every other of its value, that counts how often it is compared."""

    compared = 0

    def __init__(self, value):
        self.value = value

    def __hash__(self):
        return hash(self.value)

    def __eq__(self, other):
        _CountedKey.compared += 1
        return isinstance(other, _CountedKey) and self.value == other.value


def test_a_hit_compares_an_equal_key_once_and_keeps_the_order_by_the_stored_one():
    from constrain.cache import BoundedCache, CacheBudget

    budget = CacheBudget(100)
    cache = BoundedCache(1000, budget=budget)
    cache.put(_CountedKey("a"), 1, 40)
    cache.put(_CountedKey("b"), 2, 40)
    _CountedKey.compared = 0
    assert cache.get(_CountedKey("a")) == 1  # an equal key, not the stored one: "a" is now the most recent
    assert _CountedKey.compared == 1
    cache.put(_CountedKey("c"), 3, 40)  # 120 > 100: "b" goes, in the cache and in the budget
    assert cache.get(_CountedKey("b")) is None and cache.get(_CountedKey("a")) == 1
    assert budget.used_bytes == 80 == cache.nbytes
    assert cache.pop(_CountedKey("a")) == 1 and budget.used_bytes == 40


def test_a_cache_that_dies_leaves_the_budget_with_its_bytes():
    import gc

    from constrain.cache import BoundedCache, CacheBudget

    budget = CacheBudget(1000)
    kept, dropped = BoundedCache(1000, budget=budget), BoundedCache(1000, budget=budget)
    kept.put("k", 1, 10)
    dropped.put("d", 2, 300)
    assert budget.used_bytes == 310
    del dropped
    gc.collect()
    assert budget.used_bytes == 10
    kept.put("k2", 3, 900)  # fits now that the dead cache's bytes are gone: nothing of kept is evicted
    assert kept.get("k") == 1 and kept.get("k2") == 3
    kept.put("k3", 4, 500)  # over: the least recently used go, and the count stays that of what is held
    assert budget.used_bytes == kept.nbytes <= 1000


def test_each_cache_keeps_its_own_bound_and_clear_returns_its_bytes():
    from constrain.cache import BoundedCache, CacheBudget

    budget = CacheBudget(10_000)
    cache = BoundedCache(50, budget=budget)
    for i in range(5):
        cache.put(i, i, 20)
    assert len(cache) == 2 and cache.nbytes == 40 and budget.used_bytes == 40
    cache.clear()
    assert budget.used_bytes == 0


def test_pop_takes_an_entry_out_with_its_bytes_and_contains_leaves_the_order_alone():
    from constrain.cache import BoundedCache, CacheBudget

    budget = CacheBudget(100)
    cache = BoundedCache(1000, budget=budget)
    cache.put("a", 1, 30)
    cache.put("b", 2, 30)
    assert "a" in cache and "c" not in cache  # "a" stays the least recently used
    cache.put("c", 3, 50)  # 110 > 100: "a" goes, not "b"
    assert "a" not in cache and cache.get("b") == 2
    assert cache.pop("b") == 2 and cache.pop("b") is None and cache.pop("never") is None
    assert cache.nbytes == 50 == budget.used_bytes


def test_set_cache_budget_shrinks_the_process_budget_at_once():
    from constrain.cache import DEFAULT_CACHE_BUDGET, PROCESS_BUDGET, BoundedCache, set_cache_budget

    cache = BoundedCache(1 << 20)  # joins the process budget
    try:
        cache.put("x", 1, 4096)
        set_cache_budget(PROCESS_BUDGET.used_bytes - 1)  # one byte less than what is held: the oldest go
        assert PROCESS_BUDGET.used_bytes <= PROCESS_BUDGET.max_bytes
        with pytest.raises(ValueError, match="number of bytes"):
            set_cache_budget(-1)
    finally:
        set_cache_budget(DEFAULT_CACHE_BUDGET)


def test_mask_caches_count_against_the_process_budget(cl100k_vocab):
    from constrain.cache import PROCESS_BUDGET
    from constrain.compilers.json_schema import compile_json_schema

    structure = compile_json_schema({"type": "array", "items": {"type": "integer"}}, cl100k_vocab)
    before = PROCESS_BUDGET.used_bytes
    structure.masks.get(structure.start)  # the first mask, computed and cached
    assert PROCESS_BUDGET.used_bytes >= before + cl100k_vocab.size // 8


def test_reprice_counts_an_entry_at_its_new_size_and_evicts_what_is_then_over():
    from constrain.cache import BoundedCache, CacheBudget

    budget = CacheBudget(100)
    cache = BoundedCache(1000, budget=budget)
    cache.put("old", 1, 30)
    cache.put("grows", 2, 30)
    cache.reprice("grows", 80)  # 110 > 100: the least recently used, "old", goes
    assert cache.get("old") is None and cache.get("grows") == 2
    assert cache.nbytes == 80 == budget.used_bytes
    cache.reprice("gone", 500)  # not held: nothing happens
    assert cache.get("gone") is None and cache.nbytes == 80 == budget.used_bytes
