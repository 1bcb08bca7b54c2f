"""The analysis behind strings with a pattern and a length bound (``counted._counted_dfa``): the pair walk and the
fewest / most characters left to read, against brute force, and the language against Python's ``re``."""

from __future__ import annotations

import json
import random
import re

import numpy as np
import pytest

from constrain.compilers.json_schema.cdfa import _CDFA
from constrain.compilers.json_schema.counted import _TRACKER, _counted_dfa, _pair_walk, _remaining_chars


def _reference(trans: np.ndarray, starts: np.ndarray, final: np.ndarray) -> tuple[list[int], list[int]]:
    """Fewest and most characters to acceptance by brute force: shortest paths by relaxing to a fixpoint, and the
    longest by walking every path of at most n edges (a completing path longer than that repeats a pair, so a
    cycle lies on a completing path: unbounded)."""
    n = trans.shape[0]
    edges = [
        (a, int(trans[a, b]), int(starts[a, b])) for a in range(n) for b in range(trans.shape[1]) if trans[a, b] >= 0
    ]
    inf = 1 << 30
    least = [0 if final[s] else inf for s in range(n)]
    for _ in range(n + 1):
        for a, c, w in edges:
            least[a] = min(least[a], least[c] + w)
    live = [x < inf for x in least]
    most = []
    for s in range(n):
        if not live[s]:
            most.append(-1)
            continue
        best, unbounded = -1, False
        stack = [(s, 0, 0)]
        while stack:
            at, length, depth = stack.pop()
            if depth > n:
                unbounded = True
                break
            if final[at]:
                best = max(best, length)
            stack.extend((c, length + w, depth + 1) for a, c, w in edges if a == at and live[c])
        most.append(-1 if unbounded else best)
    return [x if x < inf else -1 for x in least], most


@pytest.mark.parametrize("seed", range(60))
def test_remaining_characters_equal_brute_force(seed):
    rng = random.Random(seed)
    n, k = rng.randint(1, 7), rng.randint(1, 4)
    trans = np.full((n, 256), -1, dtype=np.int32)
    trans[:, :k] = [[rng.choice([-1, -1, *range(n)]) for _ in range(k)] for _ in range(n)]
    starts = np.zeros((n, 256), dtype=np.int32)
    starts[:, :k] = [[rng.randint(0, 1) for _ in range(k)] for _ in range(n)]
    final = np.array([rng.random() < 0.3 for _ in range(n)], dtype=np.bool_)
    least, most = _remaining_chars(trans, starts, final)
    assert (least.tolist(), most.tolist()) == _reference(trans, starts, final)


def test_two_bytes_into_one_pair_count_with_the_larger_weight():
    trans = np.full((2, 256), -1, dtype=np.int32)
    trans[0, 0] = trans[0, 1] = 1  # the first byte begins a character, the second does not
    starts = np.zeros((2, 256), dtype=np.int32)
    starts[0, 0] = 1
    least, most = _remaining_chars(trans, starts, np.array([False, True]))
    assert least.tolist() == [0, 0] and most.tolist() == [1, 0]


def test_the_pair_walk_follows_the_body_and_the_escape_tracker():
    body = _CDFA.from_regex('a"é').encode_json().to_byte_dfa()  # a, an escaped quote, a two-byte character
    trans, pairs = _pair_walk(body.trans, _TRACKER[0])
    state, seen = 0, [tuple(pairs[0])]
    for byte in b'a\\"\xc3\xa9':
        state = int(trans[state, byte])
        seen.append(tuple(pairs[state]))
    assert [t for _, t in seen] == [0, 0, 1, 0, 0, 0]  # only the backslash moves the tracker
    assert body.accepting[seen[-1][0]]
    assert len(set(map(tuple, pairs))) == len(pairs)  # each pair numbered once


@pytest.mark.parametrize(
    "pattern,lo,hi",
    [("[a-z]+x", 2, 5), ("(?:ab|é|日本)*", 1, 4), ("\\d{3}-\\d+", 5, None), ('[^"]*', 0, 3), ("a|bb|ccc", 2, 2)],
)
def test_counted_strings_accept_exactly_the_bounded_matches(pattern, lo, hi):
    dfa = _counted_dfa(_CDFA.from_regex(pattern).minimized(), lo, hi, quoted=True)
    compiled = re.compile(pattern)
    alphabet = ["a", "b", "c", "x", "é", "日", "本", "1", "-", '"', "\\"]
    rng = random.Random(7)
    texts = {"".join(rng.choice(alphabet) for _ in range(rng.randint(0, 7))) for _ in range(3000)}
    texts |= {"ab", "abab", "é日本", "123-4", "axx", "bb", "ccc", "日本日本日本"}
    for text in texts:
        expected = compiled.fullmatch(text) is not None and lo <= len(text) and (hi is None or len(text) <= hi)
        assert dfa.matches(json.dumps(text, ensure_ascii=False).encode()) == expected, text
