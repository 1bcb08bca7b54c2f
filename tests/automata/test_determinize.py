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
