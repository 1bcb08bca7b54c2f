"""A string automaton written as JSON bytes: escapes (one trie per distinct set of targets) and UTF-8 (shared
continuation tails) keep the language exact and the automata small."""

from __future__ import annotations

import json
import random
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from constrain.compilers.json_schema import strings
from constrain.compilers.json_schema.cdfa import _CDFA
from constrain.compilers.json_schema.cdfa_kernels import _byte_nfa_flat

PATTERNS = ["[0-9a-f]{4}", "^[^,]+$", 'a"b', "^\\\\d[\\n\\t]?", "[é中😀]x", "^.{2,5}$", "[^\\u0080-\\u07ff]z"]
ALPHABET = ["0", "a", "f", "x", "z", ",", '"', "\\", "\n", "\t", "\x01", "é", "ß", "中", "😀", "\u07ff", "d"]


@pytest.mark.parametrize("pattern", PATTERNS)
def test_encoded_bytes_accept_exactly_the_json_bodies_of_the_matches(pattern):
    rng = random.Random(pattern)
    python = re.compile(re.sub(r"\$$", r"\\Z", pattern))  # ECMAScript's $ does not match before a final newline
    dfa = _CDFA.from_regex(pattern, search=True).minimized().encode_json().minimized().to_byte_dfa()
    texts = ["".join(rng.choice(ALPHABET) for _ in range(rng.randint(0, 7))) for _ in range(3000)]
    texts += ["0a1f", 'a"b', "\\0\n", "é", "😀x", "ab"]
    for text in texts:
        body = json.dumps(text, ensure_ascii=False)[1:-1].encode()
        assert dfa.matches(body) == bool(python.search(text)), (pattern, text)


def test_states_that_escape_alike_share_one_trie():
    """Every state of a search automaton sends the characters JSON escapes to the same place: one trie of escapes
    (a backslash, ``u``, four hex digits and the short escapes) serves them all."""
    d = _CDFA.from_regex("[0-9a-f]{32}", search=True).minimized()
    encoded = d.encode_json()
    assert encoded.n - d.n < 40 < 3 * d.n


def test_continuation_bytes_to_one_state_share_their_tail():
    """Each state reads the non-ASCII characters it does not name into the same state: the UTF-8 sequences'
    trailing continuation bytes are then states shared by all of them, not a dozen per state."""
    d = _CDFA.from_regex("[0-9]{40}", search=True).minimized()
    _, _, size, _, _ = _byte_nfa_flat(*d.flat(), False)
    assert size < 6 * d.n  # about 19 per state with a tail per state


def _encoded_through_code_points(pattern: str):
    """What a pattern's JSON strings are when combined with other constraints: through code points and back."""
    d = strings._searched(pattern)
    if d.is_empty():
        return strings._StringOutcome.EMPTY
    if strings._is_universal(d):
        return strings._StringOutcome.ANY_TEXT
    return strings._automaton_of(d.encode_json().minimized(), quoted=True)


_PIECES = ["a", "é", "中", "😀", '"', "\\\\", "\\n", "\\t", "\\x01", "\\x1f", "\\u007f", "[^a]", ".", "[\\x00-\\x22]",
           "\\d", "\\s", "(?:a|\\\\)", "^", "$", "[\\s\\S]"]  # fmt: skip


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(_PIECES), st.sampled_from(["", "*", "+", "?", "{2}"])), max_size=5))
def test_a_pattern_alone_escapes_byte_by_byte_to_the_same_automaton(pieces):
    """A pattern alone is written as JSON strings from its UTF-8 text automaton directly; the result is the very
    automaton (state for state) that the path through code points gives, and so are the outcomes of a pattern
    that matches nothing or every string."""
    pattern = "".join(piece + repeat for piece, repeat in pieces)
    assert strings._pattern_automaton(pattern) == _encoded_through_code_points(pattern)
