"""UTF-8: code-point ranges as byte sequences, and code-point classes that read UTF-8 exactly."""

from __future__ import annotations

import random

import pytest

from constrain.automata.nfa import ByteNFA
from constrain.automata.utf8 import utf8_sequences

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
    [
        (0, 0x7F),
        (0x7F, 0x80),
        (0x80, 0x7FF),
        (0x7FF, 0x800),
        (0x800, 0xFFFF),
        (0xD7FF, 0xE000),
        (0xFFFF, 0x10000),
        (0x10000, 0x10FFFF),
        (0, 0x10FFFF),
        (0x3B1, 0x3C9),
        (0x4E00, 0x9FFF),
        (0x1F600, 0x1F64F),
        (0xE9, 0xE9),
    ],
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
