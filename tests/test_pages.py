"""Large arrays mapped a page at a time (constrain.pages): what the pushdown's growing tables are made of."""

from __future__ import annotations

import mmap

import numpy as np

from constrain import pages


def _mapped(array: np.ndarray) -> bool:
    base = array.base
    while isinstance(base, np.ndarray):
        base = base.base
    return isinstance(base, memoryview) and isinstance(base.obj, mmap.mmap)


def _mapping_id(array: np.ndarray) -> int:
    """The identity of the mapping under ``array`` (an id, not the mapping: a reference would keep it in use)."""
    base = array.base
    while isinstance(base, np.ndarray):
        base = base.base
    return id(base.obj)


def _kept_ids() -> list[int]:
    return [id(m) for m in pages._mappings]


def test_a_large_array_is_mapped_and_writable_and_a_small_one_is_numpys():
    large = pages.empty((pages.MAPPED_BYTES // 1024 + 1, 256), np.int32)
    assert _mapped(large) and large.shape == (pages.MAPPED_BYTES // 1024 + 1, 256) and large.dtype == np.int32
    assert large.flags.writeable and large.flags.c_contiguous
    large[:] = 0
    large[-1, -1] = 7
    assert large.sum() == 7
    small = pages.empty((16, 256), np.int32)
    assert not _mapped(small) and small.shape == (16, 256)


def test_a_mapping_is_reused_once_no_array_uses_it_and_never_while_one_does(monkeypatch):
    """A mapping goes to the next array that fits once every array (and view) on it is gone: its pages are the
    ones already written. Two live arrays never share one."""
    monkeypatch.setattr(pages, "_mappings", [])
    shape = (pages.MAPPED_BYTES // 1024 + 8, 256)
    first = pages.empty(shape, np.int32)
    first[:] = 5
    view = first[10:]
    mapping = _mapping_id(first)
    second = pages.empty(shape, np.int32)  # the first is alive (and viewed): a mapping of its own
    assert _mapping_id(second) != mapping
    del first
    third = pages.empty(shape, np.int32)  # the view still holds the first's mapping
    assert _mapping_id(third) not in (mapping, _mapping_id(second))
    del view, second, third
    again = pages.empty((shape[0] - 8, 256), np.int32)  # the first free one that fits: the first array's
    assert _mapping_id(again) == mapping and (again == 5).all()
    assert len(pages._mappings) == 3 and pages.kept_bytes() == 2 * shape[0] * 1024


def test_free_mappings_past_the_bound_are_given_back(monkeypatch):
    monkeypatch.setattr(pages, "_mappings", [])
    monkeypatch.setattr(pages, "KEPT_BYTES", 3 * pages.MAPPED_BYTES)
    arrays = [pages.empty((pages.MAPPED_BYTES // 1024, 256), np.int32) for _ in range(4)]
    mappings = [_mapping_id(a) for a in arrays]
    del arrays
    pages.empty((16, 256), np.int32)  # a small array looks at no mapping
    assert pages.kept_bytes() == 4 * pages.MAPPED_BYTES
    large = pages.empty((2 * pages.MAPPED_BYTES // 1024, 256), np.int32)  # fits none kept: one is given back
    assert _kept_ids() == [*mappings[:3], _mapping_id(large)] and pages.kept_bytes() == 3 * pages.MAPPED_BYTES


def test_a_pushdown_that_grows_past_the_threshold_keeps_its_states_in_mapped_tables():
    """A rule of thousands of states, appended when a mask first reaches it, grows the machine's table into mapped
    memory; the states it held before are carried over, and the text reads through both."""
    import random

    from constrain.grammar.ir import Alt, Grammar, Literal, Ref, Seq
    from constrain.runtime.pushdown import compile_grammar
    from constrain.testing import byte_vocabulary

    rng = random.Random(0)
    words = sorted({"".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(12)) for _ in range(1500)})
    rules = {
        "start": Seq((Literal("<"), Ref("words"))),
        "words": Seq((Alt(tuple(map(Literal, words))), Ref("close"))),  # it calls a rule: built when reached
        "close": Literal(">"),
    }
    grammar = Grammar(rules, "start")
    structure = compile_grammar(grammar, byte_vocabulary(), lazy=True)
    assert structure.machine.num_states < 10  # the start rule alone, before the text
    matcher = structure.matcher()
    for token in f"<{words[1234]}>".encode():
        matcher.advance(token)
    assert matcher.is_accepting()
    assert _mapped(structure.machine.trans) and structure.machine.num_states > 10_000


def test_a_mapping_larger_than_the_bound_is_not_kept(monkeypatch):
    monkeypatch.setattr(pages, "_mappings", [])
    monkeypatch.setattr(pages, "KEPT_BYTES", 2 * pages.MAPPED_BYTES)
    huge = pages.empty((3 * pages.MAPPED_BYTES // 1024, 256), np.int32)
    assert _mapped(huge) and pages._mappings == []
