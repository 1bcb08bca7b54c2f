"""Byte DFAs: the minimal shape of compiled regexes, minimisation (``reduced``), removing words, and the hashes of
bounded languages."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from constrain.automata.dfa import ByteDFA, bounded_language_hashes
from constrain.automata.regex import regex_to_dfa

# -- digest ----------------------------------------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(
    st.integers(1, 6).flatmap(
        lambda n: st.tuples(
            st.lists(st.integers(-1, n - 1), min_size=4 * n, max_size=4 * n),
            st.lists(st.integers(0, 3), min_size=256, max_size=256),
            st.lists(st.booleans(), min_size=n, max_size=n),
        )
    ),
    st.data(),
)
def test_the_digest_tells_tables_apart_exactly(case, data):
    """Digests of equal tables are equal; changing one cell or one accepting flag changes the digest. Tables are
    drawn with few distinct columns (each byte copies one of four), as automata over text have."""
    cells, byte_column, accepting = case
    n = len(accepting)
    trans = np.array(cells, dtype=np.int32).reshape(n, 4)[:, byte_column]
    dfa = ByteDFA(trans, np.array(accepting))
    assert ByteDFA(trans.copy(), np.array(accepting)).digest == dfa.digest
    s, b = data.draw(st.integers(0, n - 1)), data.draw(st.integers(0, 255))
    changed = trans.copy()
    changed[s, b] = (trans[s, b] + 2) % (n + 1) - 1  # another target in -1 .. n-1
    assert ByteDFA(changed, np.array(accepting)).digest != dfa.digest
    flipped = np.array(accepting)
    flipped[s] = not flipped[s]
    assert ByteDFA(trans, flipped).digest != dfa.digest


# -- DFA shape -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "pattern,states",
    [("(a|b)*abb", 4), ("abc", 4), ("a|b|c", 2), ("(ab|ab)", 3), ("[0-9]+", 2), ("(foo|bar)(foo|bar)", 11), ("a*", 1)],
)
def test_minimal_state_counts(pattern, states):
    assert regex_to_dfa(pattern).num_states == states


def test_every_state_can_still_match():
    dfa = regex_to_dfa(r"(abc|abd)e|x[0-9]{2,3}")
    for state in range(dfa.num_states):
        seen, stack = {state}, [state]
        found = False
        while stack:
            s = stack.pop()
            found |= bool(dfa.accepting[s])
            for t in set(dfa.trans[s].tolist()) - {-1}:
                if t not in seen:
                    seen.add(t)
                    stack.append(t)
        assert found, state


def _brute_force_minimal(trans: np.ndarray, accepting: np.ndarray) -> int:
    """States of the minimal trimmed DFA, by Moore's refinement over the reachable, co-reachable states."""
    n, width = trans.shape
    reach, stack = {0}, [0]
    while stack:
        for t in trans[stack.pop()].tolist():
            if t >= 0 and t not in reach:
                reach.add(t)
                stack.append(t)
    alive = {s for s in range(n) if accepting[s]}
    changed = True
    while changed:
        changed = False
        for s in range(n):
            if s not in alive and any(t in alive for t in trans[s].tolist()):
                alive.add(s)
                changed = True
    states = sorted(reach & alive)
    if 0 not in alive:
        return 1
    block = {s: int(accepting[s]) for s in states}
    while True:
        signature = {s: (block[s], *(block.get(t, -1) for t in trans[s].tolist())) for s in states}
        numbering = {sig: i for i, sig in enumerate(sorted(set(signature.values())))}
        refined = {s: numbering[signature[s]] for s in states}
        if len(set(refined.values())) == len(set(block.values())):
            return len(set(refined.values()))
        block = refined


def _accepted(trans: np.ndarray, accepting: np.ndarray, width: int, length: int) -> set[tuple[int, ...]]:
    out = set()
    for word in itertools.chain.from_iterable(itertools.product(range(width), repeat=k) for k in range(length + 1)):
        state = 0
        for symbol in word:
            state = int(trans[state, symbol])
            if state < 0:
                break
        else:
            if accepting[state]:
                out.add(word)
    return out


@given(st.integers(1, 9), st.integers(1, 4), st.randoms(use_true_random=False))
@settings(max_examples=150, deadline=None)
def test_reduced_is_the_minimal_canonical_dfa(num_states, width, rng):
    """``ByteDFA.reduced`` on random partial DFAs (unreachable and dead-end states included) against brute force:
    the same language, the minimal number of states, and the same table whatever the states' numbering."""
    trans = np.array([[rng.randrange(-1, num_states) for _ in range(width)] for _ in range(num_states)], np.int32)
    accepting = np.array([rng.random() < 0.3 for _ in range(num_states)])
    full = np.full((num_states, 256), -1, dtype=np.int32)
    full[:, 97 : 97 + width] = trans  # bytes a, b, ...: the other byte columns all alike, as in a real rule
    reduced = ByteDFA(full, accepting).reduced()
    assert reduced.num_states == _brute_force_minimal(trans, accepting)
    small = reduced.trans[:, 97 : 97 + width]
    assert _accepted(small, reduced.accepting, width, 5) == _accepted(trans, accepting, width, 5)
    permutation = [0] + rng.sample(range(1, num_states), num_states - 1)  # keep the start
    inverse = np.argsort(permutation)
    shuffled = np.where(full[permutation] >= 0, inverse[np.maximum(full[permutation], 0)], -1).astype(np.int32)
    again = ByteDFA(shuffled, accepting[permutation]).reduced()
    assert np.array_equal(again.trans, reduced.trans) and np.array_equal(again.accepting, reduced.accepting)


def _minus_words_by_product(dfa: ByteDFA, words: list[bytes]) -> ByteDFA:
    """The reference for ``without_words``: a trie of the words beside the DFA (leaving the trie continues in
    the DFA), then minimised by ``reduced``."""
    children: list[dict[int, int]] = [{}]
    ends, state_of = [False], [0]
    for word in words:
        node = 0
        for byte in word:
            if byte not in children[node]:
                children[node][byte] = len(children)
                children.append({})
                ends.append(False)
                state_of.append(int(dfa.trans[state_of[node], byte]))
            node = children[node][byte]
        ends[node] = True
    n = len(children)
    outside = np.where(dfa.trans >= 0, dfa.trans + n, -1).astype(np.int32)
    trans = np.concatenate([outside[state_of], outside])
    for node, table in enumerate(children):
        for byte, child in table.items():
            trans[node, byte] = child
    accepting = np.concatenate([dfa.accepting[state_of] & ~np.array(ends), dfa.accepting])
    return ByteDFA(trans, accepting).reduced()


@given(st.lists(st.text(st.sampled_from('ab"\\\n\x01é€😀\u2028'), max_size=6), max_size=10))
@settings(max_examples=300, deadline=None)
def test_removing_words_from_a_quoted_string_language_builds_the_minimal_dfa(names):
    """``ByteDFA.without_words`` (the keys of an object other than its properties) merges equal subtries instead
    of minimising: the table equals the one the product and a minimisation pass give, state for state."""
    import json

    from constrain.compilers.json_schema.values import _STRING

    string = regex_to_dfa(_STRING).reduced()
    words = sorted({json.dumps(name, ensure_ascii=False).encode() for name in names})
    fast, reference = string.without_words(words), _minus_words_by_product(string, words)
    assert np.array_equal(fast.trans, reference.trans) and np.array_equal(fast.accepting, reference.accepting)


@given(st.lists(st.lists(st.sampled_from(b"ab\x00\xff"), max_size=5).map(bytes), max_size=12))
@settings(max_examples=300, deadline=None)
def test_the_dfa_of_a_set_of_words_is_the_subset_construction_of_their_alternative(words):
    """``words_dfa`` (an enum's values: a trie minimised as edges) gives the table the subset construction of the
    words' alternative gives, state for state: empty words, prefixes of one another, repeats and any byte."""
    from constrain.automata.dfa import words_dfa
    from constrain.automata.nfa import ByteNFA

    nfa = ByteNFA()
    start, accept = nfa.new_state(), nfa.new_state()
    for word in words:
        if word:
            nfa.add_literal(start, word, accept)
        else:
            nfa.add_epsilon(start, accept)
    reference = nfa.determinize(start, accept)
    fast = words_dfa(words)
    assert np.array_equal(fast.trans, reference.trans) and np.array_equal(fast.accepting, reference.accepting)
    for word in words:
        state = 0
        for byte in word:
            state = fast.trans[state, byte]
        assert fast.accepting[state], word


def test_the_dfa_of_too_many_words_is_refused_before_its_table_is_made(monkeypatch):
    """Past the bytes an NFA may hold, refused before the trie is made; past the DFA states, before its table."""
    import constrain.automata.dfa as dfa_module
    from constrain.automata.dfa import words_dfa
    from constrain.errors import AutomatonTooLarge

    monkeypatch.setattr(dfa_module, "MAX_DFA_STATES", 10)
    assert words_dfa([b"abcd", b"abce"]).num_states == 5  # a trie of 6 states, within the bound
    with pytest.raises(AutomatonTooLarge, match="more than 10 DFA states"):
        words_dfa([b"abcdefgh", b"xyzxyzxyz"])
    monkeypatch.setattr(dfa_module, "MAX_NFA_STATES", 16)  # the bytes of the words, as the NFA path counts them
    with pytest.raises(AutomatonTooLarge, match="more than 16 NFA states"):
        words_dfa([b"abcdefgh", b"abcdefghi"])


@given(st.lists(st.text("ab", max_size=4), min_size=1, max_size=8, unique=True), st.data())
@settings(max_examples=200, deadline=None)
def test_removing_words_knows_whether_anything_is_left(bodies, data):
    """What ``without_words`` records of its result's acceptance (the grammar checks ask it of every keys-except
    rule) is what a search of its table finds, removing some of a finite language's words or all of them."""
    from constrain.automata.dfa import _reaches_acceptance, words_dfa

    language = [body.encode() + b"$" for body in bodies]  # prefix-free: an accepting state reads nothing
    removed = data.draw(st.lists(st.sampled_from(language), unique=True))
    left = words_dfa(language).without_words(removed)
    searched = bool(_reaches_acceptance(left.trans, left.calls, left.accepting, np.zeros(0, dtype=bool), True))
    assert left.reaches_acceptance(np.zeros(0, dtype=bool)) == searched == (len(removed) < len(language))


def test_removing_words_needs_a_prefix_free_language_holding_them():
    with pytest.raises(ValueError, match="not in the language"):
        regex_to_dfa('"[a-z]*"').reduced().without_words([b'"A"'])
    with pytest.raises(ValueError, match="accepting states read nothing"):
        regex_to_dfa("a+").reduced().without_words([b"a"])


def test_bounded_language_hashes_identify_states_with_the_same_short_strings():
    depth = 6
    bounded = regex_to_dfa('"[a-z]{0,20}"')
    unbounded = regex_to_dfa('"[a-z]*"')
    narrower = regex_to_dfa('"[a-y]*"')
    h_bounded = bounded_language_hashes(bounded.trans, bounded.accepting, depth)
    h_unbounded = bounded_language_hashes(unbounded.trans, unbounded.accepting, depth)
    h_narrower = bounded_language_hashes(narrower.trans, narrower.accepting, depth)
    inside = int(unbounded.trans[0, ord('"')])
    state = int(bounded.trans[0, ord('"')])
    for letters in range(21):
        # Strings of at most `depth` bytes cannot tell the bounded string from the unbounded one while at least
        # `depth` more letters may come; closer to the bound they can.
        assert (h_bounded[state] == h_unbounded[inside]) == (20 - letters >= depth), letters
        state = int(bounded.trans[state, ord("a")])
    assert h_narrower[int(narrower.trans[0, ord('"')])] != h_unbounded[inside]
    # The same language built differently (other byte classes, other state numbering) hashes the same.
    other = regex_to_dfa('"(?:[a-m]|[n-z])*"')
    assert set(bounded_language_hashes(other.trans, other.accepting, depth)) == set(h_unbounded)
