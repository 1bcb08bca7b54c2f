"""Regex -> byte DFA, checked against Python's ``re`` (with re.ASCII, the documented class semantics)."""

from __future__ import annotations

import itertools
import random
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import numpy as np

from constrain.automata.dfa import ByteDFA
from constrain.automata.nfa import ByteNFA
from constrain.automata.utf8 import utf8_sequences
from constrain.automata.regex import regex_to_dfa
from constrain.errors import RegexError

# -- UTF-8 ranges -----------------------------------------------------------------------------------------------


def _covered(sequences) -> int:
    total = 0
    for seq in sequences:
        n = 1
        for lo, hi in seq:
            n *= hi - lo + 1
        total += n
    return total


@pytest.mark.parametrize(
    "lo,hi",
    [(0, 0x7F), (0x7F, 0x80), (0x80, 0x7FF), (0x7FF, 0x800), (0x800, 0xFFFF), (0xD7FF, 0xE000), (0xFFFF, 0x10000),
     (0x10000, 0x10FFFF), (0, 0x10FFFF), (0x3B1, 0x3C9), (0x4E00, 0x9FFF), (0x1F600, 0x1F64F), (0xE9, 0xE9)],
)
def test_utf8_sequences_cover_exactly_the_range(lo, hi):
    sequences = utf8_sequences(lo, hi)
    surrogates = max(0, min(hi, 0xDFFF) - max(lo, 0xD800) + 1)
    assert _covered(sequences) == hi - lo + 1 - surrogates
    rng = random.Random(lo * 31 + hi)
    samples = {lo, hi} | {rng.randint(lo, hi) for _ in range(300)}
    for cp in samples:
        if 0xD800 <= cp <= 0xDFFF:
            continue
        encoded = chr(cp).encode()
        assert any(
            len(seq) == len(encoded) and all(a <= b <= z for (a, z), b in zip(seq, encoded)) for seq in sequences
        ), hex(cp)


def test_code_point_class_reads_utf8_exactly():
    nfa = ByteNFA()
    start, accept = nfa.new_state(), nfa.new_state()
    nfa.add_code_points(start, [(0x80, 0x10FFFF)], accept)
    dfa = nfa.determinize(start, accept)
    assert dfa.matches("é".encode()) and dfa.matches("😀".encode()) and dfa.matches("中".encode())
    assert not dfa.matches(b"a")
    assert not dfa.matches(b"\xc3")  # truncated
    assert not dfa.matches(b"\xc0\x80")  # overlong
    assert not dfa.matches(b"\xed\xa0\x80")  # a surrogate
    assert not dfa.matches(b"\xf4\x90\x80\x80")  # beyond U+10FFFF
    assert not dfa.matches("é".encode() + b"\x80")


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


def test_removing_words_needs_a_prefix_free_language_holding_them():
    with pytest.raises(ValueError, match="not in the language"):
        regex_to_dfa('"[a-z]*"').reduced().without_words([b'"A"'])
    with pytest.raises(ValueError, match="accepting states read nothing"):
        regex_to_dfa("a+").reduced().without_words([b"a"])


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


# -- semantics against re ----------------------------------------------------------------------------------------

CASES = [
    (r"\d{4}-\d{2}-\d{2}", ["2024-01-31", "2024-1-31", "20240131", "２０２４-01-31"]),
    (r"[a-z0-9._%+-]+@[a-z0-9.-]+\.[a-z]{2,}", ["a.b@c.de", "a@b", "@b.cd", "a@b.c"]),
    (r"(?i)hello|bye", ["HeLLo", "BYE", "hello!", "héllo"]),
    (r"(?s)a.b", ["a\nb", "aéb", "ab", "a😀b"]),
    (r"a.b", ["a\nb", "aéb", "a中b"]),
    (r"[^\"\\]*", ['abc', 'a"b', "é中😀", "a\\b", ""]),
    (r"\w+\s\W", ["ab c!", "é c!", "ab\tc!", "ab\u00a0!"]),
    (r"[]a]+", ["]]a", "a", "b"]),
    (r"[^]a]", ["]", "a", "b", "é"]),
    (r"^(?:ab)+$", ["abab", "aba", ""]),
    (r"\Aab\Z", ["ab", "abc"]),
    (r"[\u00e0-\u00ff]{1,3}", ["à", "àÿ", "àÿé", "àÿéé", "a"]),
    (r"(?P<y>\d+)(?:\.\d*)?", ["12.", "12.5", ".5", "1"]),
    (r"x{0}y{2,}z{,2}", ["yy", "yyyz", "xyy", "yyzzz"]),
    (r"a*?b+?c??", ["aabbc", "b", "abcc"]),
    (r"[\U0001F600-\U0001F64F]+", ["😀😁", "😀a", ""]),
    (r"(a|)+b", ["b", "ab", "aab", "ba"]),
    (r"\x41\101[\x30-\x39]", ["AA5", "AAx"]),
]


@pytest.mark.parametrize("pattern,texts", CASES)
def test_matches_like_re(pattern, texts):
    dfa = regex_to_dfa(pattern)
    for text in texts:
        expected = re.fullmatch(pattern, text, re.ASCII) is not None
        assert dfa.matches(text.encode()) == expected, (pattern, text)


_ALPHABET = "ab\n é中😀-.0"
_ATOMS = ["a", "b", ".", r"\d", r"\w", r"\s", r"\W", "[ab]", "[^a]", "[a-c]", "é", "中", "😀", r"\.", "[é-ü]", "[^é]"]


@st.composite
def regexes(draw, depth=0):
    kind = draw(st.integers(0, 5 if depth < 3 else 0))
    if kind == 0:
        return draw(st.sampled_from(_ATOMS))
    if kind == 1:
        return "".join(draw(st.lists(regexes(depth=depth + 1), min_size=1, max_size=3)))
    if kind == 2:
        return "(" + "|".join(draw(st.lists(regexes(depth=depth + 1), min_size=1, max_size=3))) + ")"
    inner = draw(regexes(depth=depth + 1))
    quantifier = draw(st.sampled_from(["*", "+", "?", "{2}", "{1,3}", "{0,2}", "{2,}", "*?"]))
    return f"(?:{inner}){quantifier}"


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(regexes(), st.lists(st.text(alphabet=_ALPHABET, max_size=6), min_size=1, max_size=20))
def test_random_regexes_agree_with_re_on_random_strings(pattern, texts):
    dfa = regex_to_dfa(pattern)
    for text in texts:
        assert dfa.matches(text.encode()) == (re.fullmatch(pattern, text, re.ASCII) is not None), (pattern, text)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(st.data(), regexes())
def test_strings_the_regex_generates_are_accepted(data, pattern):
    text = data.draw(st.from_regex(re.compile(pattern, re.ASCII), fullmatch=True))
    assert dfa_accepts(pattern, text)


def dfa_accepts(pattern: str, text: str) -> bool:
    return regex_to_dfa(pattern).matches(text.encode())


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=8))
def test_any_character_star_accepts_exactly_valid_utf8(data):
    try:
        data.decode()
        valid = True
    except UnicodeDecodeError:
        valid = False
    assert regex_to_dfa(r"(?s).*").matches(data) == valid


def test_prefixes_of_a_multibyte_character_are_live_but_not_accepting():
    dfa = regex_to_dfa("中")
    encoded = "中".encode()
    state = 0
    for byte in encoded[:-1]:
        state = int(dfa.trans[state, byte])
        assert state >= 0 and not dfa.accepting[state]
    assert dfa.accepting[int(dfa.trans[state, encoded[-1]])]


# -- errors ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "pattern,position,words",
    [
        ("ab(?=c)", 2, "lookaround"),
        ("ab(?<!c)d", 2, "lookaround"),
        ("(a)\\1", 3, "backreference"),
        ("x\\bfoo", 1, "word boundary"),
        ("a[bc", 1, "unterminated"),
        ("(?m)^a", 0, "flag"),
        ("ab(", 2, "missing"),
        ("a{5,2}", 2, "repeat"),
        ("(a)(?(1)b|c)", 3, "conditional"),
        ("\\p{L}", 0, "\\p"),
        ("*a", 0, "nothing to repeat"),
    ],
)
def test_unsupported_or_malformed_regex_names_the_position(pattern, position, words):
    with pytest.raises(RegexError) as info:
        regex_to_dfa(pattern)
    assert info.value.position == position
    if words:
        assert words in str(info.value)


@pytest.mark.parametrize("pattern", ["a^b", "[^\\x00-\\U0010ffff]", "a$b"])
def test_regex_matching_nothing_is_refused(pattern):
    with pytest.raises(RegexError, match="matches no string"):
        regex_to_dfa(pattern)


def test_hostile_repetition_is_refused():
    with pytest.raises(RegexError, match="refused"):
        regex_to_dfa("a{100000}")


def test_case_insensitive_non_ascii_letter_is_refused_not_relaxed():
    with pytest.raises(RegexError, match="non-ASCII"):
        regex_to_dfa("(?i)é")


def test_non_string_pattern_is_a_type_error():
    with pytest.raises(TypeError):
        regex_to_dfa(b"abc")  # type: ignore[arg-type]


def test_all_short_strings_over_small_alphabet():
    """Exhaustive agreement on every string of length <= 4 over a small alphabet for a few tricky patterns."""
    patterns = [r"(a|ab)(c|bcd)(d*)", r"(?:a+b?)*", r"[^a]?a{2}|b", r"(?i)(A|b)+"]
    alphabet = "abcdB"
    for pattern in patterns:
        dfa = regex_to_dfa(pattern)
        for n in range(5):
            for chars in itertools.product(alphabet, repeat=n):
                text = "".join(chars)
                assert dfa.matches(text.encode()) == (re.fullmatch(pattern, text, re.ASCII) is not None), (
                    pattern,
                    text,
                )
