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


def test_a_large_array_is_mapped_zeroed_and_writable_and_a_small_one_is_numpys():
    large = pages.empty((pages.MAPPED_BYTES // 1024 + 1, 256), np.int32)
    assert _mapped(large) and large.shape == (pages.MAPPED_BYTES // 1024 + 1, 256) and large.dtype == np.int32
    assert large.flags.writeable and large.flags.c_contiguous and not large.any()
    large[-1, -1] = 7
    assert large.sum() == 7
    small = pages.empty((16, 256), np.int32)
    assert not _mapped(small) and small.shape == (16, 256)


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
    assert structure.machine.trans.shape[0] * 1024 < pages.MAPPED_BYTES  # the start rule alone, before the text
    matcher = structure.matcher()
    for token in f"<{words[1234]}>".encode():
        matcher.advance(token)
    assert matcher.is_accepting()
    assert _mapped(structure.machine.trans) and structure.machine.num_states > 10_000
