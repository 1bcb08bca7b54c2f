"""Determinisation: the subset construction in slices (the time limit is looked at between them), and its kernels."""

from __future__ import annotations

import numpy as np
import pytest

from constrain.automata.nfa import ByteNFA


@pytest.mark.parametrize("pattern", [r"(a|b)*abb", r"[0-9]{3,9}(\.[0-9]+)?", r"(foo|bar|baz){2,4}", r"[^x]*x[^x]{4}"])
def test_determinising_in_slices_builds_the_dfa_built_in_one_call(pattern, monkeypatch):
    """A subset construction larger than one slice of work is finished in slices, with the time limit looked at
    between them; the automaton is the one a single call builds."""
    from constrain.automata import nfa as nfa_module
    from constrain.automata.regex import add_regex

    def build():
        nfa = ByteNFA()
        start, accept = nfa.new_state(), nfa.new_state()
        add_regex(nfa, pattern, start, accept)
        return nfa.determinize(start, accept)

    whole = build()
    slices = []
    sliced = nfa_module._subset_construction
    monkeypatch.setattr(nfa_module, "_subset_construction", lambda *a: slices.append(1) or sliced(*a))
    monkeypatch.setattr(nfa_module, "_WORK_PER_SLICE", 2)
    in_slices = build()
    assert len(slices) > 1
    assert np.array_equal(in_slices.trans, whole.trans) and np.array_equal(in_slices.accepting, whole.accepting)


def test_compile_kernels_readies_the_kernels_only_a_large_automaton_reaches():
    from constrain.automata import compile_kernels, determinize

    compile_kernels()
    for kernel in (determinize._index_nfa, determinize._subset_construction, determinize._reduced_subsets):
        assert kernel.signatures, kernel  # compiled (or loaded from the cache) for a call from Python


def test_a_slice_size_given_to_determinize_builds_the_same_dfa():
    nfa = ByteNFA()
    start, accept = nfa.new_state(), nfa.new_state()
    from constrain.automata.regex import add_regex

    add_regex(nfa, r"(foo|bar|baz){2,4}", start, accept)
    whole, in_slices = nfa.determinize(start, accept), nfa.determinize(start, accept, work_per_slice=3)
    assert np.array_equal(in_slices.trans, whole.trans) and np.array_equal(in_slices.accepting, whole.accepting)


def _calling_nfa(rules: list[int], length: int) -> tuple[ByteNFA, int, int]:
    """An NFA that reads ``length`` bytes ``a``, then calls one of ``rules``, then reads ``b``."""
    nfa = ByteNFA()
    start, middle, after, accept = (nfa.new_state() for _ in range(4))
    nfa.add_literal(start, b"a" * length, middle)
    for rule in rules:
        nfa.add_call(middle, rule, after)
    nfa.add_literal(after, b"b", accept)
    return nfa, start, accept


@pytest.mark.parametrize("work_per_slice", [None, 1])
def test_call_columns_are_the_rules_called_however_large_their_numbers(work_per_slice):
    """A rule of a grammar of thousands of rules calls a few: its call table has a column per rule called."""
    nfa, start, accept = _calling_nfa([40_000, 7, 300], 3)
    dfa = nfa.determinize(start, accept, work_per_slice=work_per_slice)
    assert dfa.callees == (7, 300, 40_000) and dfa.calls.shape == (dfa.num_states, 3)
    state = start
    for byte in b"aaa":
        state = int(dfa.trans[state, byte])
    targets = {int(t) for t in dfa.calls[state]}
    assert len(targets) == 1 and targets != {-1}
    assert dfa.accepting[int(dfa.trans[targets.pop(), ord("b")])]


@pytest.mark.parametrize("work_per_slice", [None, 1])
def test_a_transition_table_past_its_cell_bound_is_refused(work_per_slice, monkeypatch):
    from constrain.automata import nfa as nfa_module
    from constrain.errors import AutomatonTooLarge

    nfa, start, accept = _calling_nfa(list(range(50)), 100)
    assert nfa.determinize(start, accept, work_per_slice=work_per_slice).num_states > 100
    monkeypatch.setattr(nfa_module, "MAX_TABLE_CELLS", 64 * 52)  # fewer than 64 rows of 50 calls and the classes
    with pytest.raises(AutomatonTooLarge, match="transition table needs more than 3,328 cells"):
        nfa.determinize(start, accept, work_per_slice=work_per_slice)
