"""Regex -> byte DFA, checked against Python's ``re`` (with re.ASCII, the documented class semantics)."""

from __future__ import annotations

import itertools
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from constrain.automata.algebra import equivalent
from constrain.automata.nfa import ByteNFA
from constrain.automata.regex import regex_to_dfa, search_dfa
from constrain.errors import RegexError

# -- semantics against re ----------------------------------------------------------------------------------------

CASES = [
    (r"\d{4}-\d{2}-\d{2}", ["2024-01-31", "2024-1-31", "20240131", "２０２４-01-31"]),
    (r"[a-z0-9._%+-]+@[a-z0-9.-]+\.[a-z]{2,}", ["a.b@c.de", "a@b", "@b.cd", "a@b.c"]),
    (r"(?i)hello|bye", ["HeLLo", "BYE", "hello!", "héllo"]),
    (r"(?s)a.b", ["a\nb", "aéb", "ab", "a😀b"]),
    (r"a.b", ["a\nb", "aéb", "a中b"]),
    (r"[^\"\\]*", ["abc", 'a"b', "é中😀", "a\\b", ""]),
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
        ("ab(?<=c)", 2, "lookaround"),
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


@pytest.mark.parametrize(
    "counted,written_out",
    [
        ("(ab|c){2,4}", "(ab|c)(ab|c)(?:(ab|c)(ab|c)?)?"),
        ("[a-zé]{3}x{0,2}", "[a-zé][a-zé][a-zé](?:xx?)?"),
        ("(?:x(?:y{2}|z){1,2}){2}", "x(?:yy|z)(?:yy|z)?x(?:yy|z)(?:yy|z)?"),
        ("(a|b{2}){2,}", "(a|bb)(a|bb)(a|bb)*"),
        ("(?:[0-9]{1,2}\\.){2}", "[0-9][0-9]?\\.[0-9][0-9]?\\."),
        ("(^a|b){2}", "(^a|b)(^a|b)"),  # an anchor in the body: each copy built on its own
    ],
)
def test_a_counted_repetition_equals_its_copies_written_out(counted, written_out):
    assert equivalent(regex_to_dfa(counted), regex_to_dfa(written_out))
    assert equivalent(search_dfa(counted), search_dfa(written_out))


def test_replicated_copies_have_states_of_their_own():
    nfa = ByteNFA()
    a, b, c, d, e = (nfa.new_state() for _ in range(5))
    mark = nfa.mark()
    middle = nfa.new_state()
    nfa.add_bytes(a, ord("x"), ord("x"), middle)
    nfa.add_bytes(middle, ord("y"), ord("y"), b)
    nfa.add_epsilon(middle, b)
    nfa.replicate(mark, a, b, [(b, c), (d, e)])
    assert nfa.size == 8
    assert nfa._bytes[8:] == [b, 120, 120, 6, 6, 121, 121, c, d, 120, 120, 7, 7, 121, 121, e]
    assert nfa._epsilon[2:] == [6, c, 7, e]
    nfa.add_marker(a, 256, b)
    with pytest.raises(ValueError):
        nfa.replicate(mark, a, b, [(b, c)])
