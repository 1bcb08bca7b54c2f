"""Lookahead in whole-text regexes, and the boolean operations on byte DFAs it shares its purpose with.

Python's ``re`` is the oracle: random patterns built from literals, classes, ``.``, groups, alternatives,
quantifiers, anchors and positive / negative lookaheads (nested too, inside repetitions too) are compiled by
:func:`~constrain.automata.regex.regex_to_dfa` and compared with ``re.fullmatch`` (and, wrapped as the JSON
Schema compiler wraps a ``pattern``, with ``re.search``) on random strings. ``$`` is the end of the text here, as
in ECMAScript; Python's ``$`` also matches before a final newline, so the oracle reads it as ``\\Z``.
"""

from __future__ import annotations

import random
import re
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from constrain.automata import algebra
from constrain.automata.limits import time_limited
from constrain.automata.regex import MAX_LOOKAROUND_STATES, add_regex, regex_to_dfa
from constrain.errors import AutomatonTooLarge, CompileTimeout, RegexError

ALPHABET = "abc1 \né"


def _texts(rng: random.Random, count: int, longest: int = 7) -> list[str]:
    out = ["", "a", "ab", "abc", "\n", "é"]
    while len(out) < count:
        out.append("".join(rng.choice(ALPHABET) for _ in range(rng.randint(0, longest))))
    return out


# -- random patterns, each as (ours, the oracle's) --------------------------------------------------------------

_atoms = st.sampled_from(
    [("a", "a"), ("b", "b"), ("c", "c"), ("1", "1"), ("é", "é"), (".", "."), ("[ab]", "[ab]"), ("[^a]", "[^a]"),
     ("\\d", "\\d"), ("\\s", "\\s"), ("(?s:.)", "(?s:.)"), ("$", "\\Z")]
)  # fmt: skip


def _extend(inner):
    def quantified(pair_q):
        (ours, theirs), q = pair_q
        return f"(?:{ours}){q}", f"(?:{theirs}){q}"

    def look(pair_kind):
        (ours, theirs), kind, anchored = pair_kind
        caret = "^" if anchored else ""
        return f"(?{kind}{caret}{ours})", f"(?{kind}{caret}{theirs})"

    return st.one_of(
        st.tuples(inner, inner).map(lambda p: (p[0][0] + p[1][0], p[0][1] + p[1][1])),
        st.tuples(inner, inner).map(lambda p: (f"(?:{p[0][0]}|{p[1][0]})", f"(?:{p[0][1]}|{p[1][1]})")),
        st.tuples(inner, st.sampled_from(["*", "+", "?", "{2}", "{0,2}"])).map(quantified),
        st.tuples(inner, st.sampled_from(["=", "!"]), st.booleans()).map(look),
    )


# ``^`` only leads the pattern or a lookahead's body: ``$^`` (an end, then a start) is a corner the subset
# construction of regexes without lookahead does not take, and no real pattern writes.
patterns = st.tuples(st.booleans(), st.recursive(_atoms, _extend, max_leaves=8)).map(
    lambda p: ("^" + p[1][0], "^" + p[1][1]) if p[0] else p[1]
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pattern=patterns, seed=st.integers(0, 2**32))
def test_lookahead_patterns_match_what_python_matches(pattern, seed):
    ours, theirs = pattern
    compiled = re.compile(theirs, re.ASCII)
    try:
        dfa = regex_to_dfa(ours)
    except RegexError as exc:
        assert "matches no string" in str(exc)
        dfa = algebra.empty()
    for text in _texts(random.Random(seed), 60):
        assert dfa.matches(text.encode()) == (compiled.fullmatch(text) is not None), (ours, text)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pattern=patterns, seed=st.integers(0, 2**32))
def test_searched_lookahead_patterns_match_what_python_searches(pattern, seed):
    """A JSON Schema ``pattern`` is searched for: the compiler wraps it as below."""
    ours, theirs = pattern
    compiled = re.compile(theirs, re.ASCII)
    try:
        dfa = regex_to_dfa(f"(?s:.)*(?:{ours})(?s:.)*")
    except RegexError as exc:
        assert "matches no string" in str(exc)
        dfa = algebra.empty()
    for text in _texts(random.Random(seed), 60):
        assert dfa.matches(text.encode()) == (compiled.search(text) is not None), (ours, text)


@pytest.mark.parametrize(
    "pattern",
    [
        r"^(?!foo|bar).*", r"(?=.*\d)", r"^(?=.*[a-z])(?=.*\d)[a-z\d]{3,8}$", r"^((?!mode)(?!Mode).)*$",
        r"^(?!org\.bukkit\.)([a-zA-Z_$][a-zA-Z\d_$]*\.)*[a-zA-Z_$][a-zA-Z\d_$]*$", r"^(?!pattern$).*$",
        r"^(?![ \t\n]*\(default(.*)\))[\s\S]*", r"(?i)^(?!abc)[a-c]+$", r"x(?=y(?!z))", r"(?!^a)a",
    ],
)  # fmt: skip
def test_lookahead_patterns_of_real_schemas_are_searched_exactly(pattern):
    dfa = regex_to_dfa(f"(?s:.)*(?:{pattern})(?s:.)*")
    compiled = re.compile(re.sub(r"(?<!\\)\$(?=\)|$)", r"\\Z", pattern), re.ASCII)  # an anchor, not a class's $
    words = ["foo", "bar", "mode", "Mode", "org.bukkit.", "pattern", "(default x)", "abc", "xyz", "xy", "a1"]
    rng = random.Random(pattern)
    for _ in range(2000):
        text = "".join(rng.choice(words + list("aAbz9_.$ \n(")) for _ in range(rng.randint(0, 5)))
        assert dfa.matches(text.encode()) == (compiled.search(text) is not None), (pattern, text)


def test_lookahead_is_refused_in_a_grammar_terminal_and_lookbehind_everywhere():
    from constrain.automata.nfa import ByteNFA

    nfa = ByteNFA()
    with pytest.raises(RegexError, match="grammar terminal") as info:
        add_regex(nfa, "ab(?=c)c", nfa.new_state(), nfa.new_state(), anchors=False)
    assert info.value.position == 2
    for pattern in ("(?<=a)b", "(?<!a)b"):
        with pytest.raises(RegexError, match="lookbehind"):
            regex_to_dfa(pattern)


def test_add_regex_with_anchors_splices_both_variants_of_a_lookahead_at_the_start():
    from constrain.automata.nfa import ByteNFA

    nfa = ByteNFA()
    start, accept = nfa.new_state(), nfa.new_state()
    add_regex(nfa, "(?=^a)a.|b(?!c).", start, accept)
    dfa = nfa.determinize(start, accept)
    for text in ["ab", "bd", "bc", "a", "ba", "xa"]:
        assert dfa.matches(text.encode()) == (re.fullmatch("(?=^a)a.|b(?!c).", text) is not None), text


@pytest.mark.parametrize("pattern", [r"((?!a.{14}b).)*", r"(?=.*a.{13})(?=.*b.{13})(?!.*c.{13}).*"])
def test_hostile_lookahead_is_refused_by_size_or_time(pattern):
    started = time.process_time()
    with pytest.raises((AutomatonTooLarge, CompileTimeout)), time_limited(2.0, "the regex"):
        regex_to_dfa(pattern)
    assert time.process_time() - started < 6
    assert MAX_LOOKAROUND_STATES <= 50_000


# -- the boolean operations -----------------------------------------------------------------------------------

_PLAIN = ["[a-c]*b[a-c]*", "[a-b1]+", "(ab|c)*", "a.{2}", "[^b]*", "(?s:.)*é.*", "\\d\\d?", "a|b|"]


@pytest.mark.parametrize("p", _PLAIN)
@pytest.mark.parametrize("q", _PLAIN)
def test_intersection_difference_complement_union_match_their_definitions(p, q):
    a, b = regex_to_dfa(p), regex_to_dfa(q)
    both, only, neither, either = algebra.intersect(a, b), algebra.difference(a, b), algebra.complement(a), None
    either = algebra.union(a, b)
    for text in _texts(random.Random(p + q), 300, 5):
        x, y = re.fullmatch(p, text) is not None, re.fullmatch(q, text) is not None
        data = text.encode()
        assert both.matches(data) == (x and y)
        assert only.matches(data) == (x and not y)
        assert neither.matches(data) == (not x)
        assert either.matches(data) == (x or y)
    assert not neither.matches(b"\xff")  # the complement is of text: never invalid UTF-8
    assert algebra.equivalent(both, algebra.intersect(b, a))


def test_products_are_bounded():
    a, b = regex_to_dfa("(?s:.)*a.{12}"), regex_to_dfa("(?s:.)*b.{12}")
    with pytest.raises(AutomatonTooLarge):
        algebra.intersect(a, b)  # past MAX_DFA_STATES: found before the table is finished
    small = regex_to_dfa("(?s:.)*a.{5}")
    with pytest.raises(AutomatonTooLarge):
        algebra.intersect(small, b, max_states=1000)
