"""Code-point ranges as UTF-8 byte-range sequences.

Tokens are byte strings that may end inside a character, so character sets become exact byte paths here.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from constrain.automata.limits import PIECE_CACHE_BYTES
from constrain.cache import memoized

MAX_CODE_POINT = 0x10FFFF
SURROGATES = (0xD800, 0xDFFF)


# --------------------------------------------------------------------------------------------------------------
# UTF-8 encoding of code-point ranges


_UTF8_LENGTH_BOUNDS = ((0, 0x7F), (0x80, 0x7FF), (0x800, 0xFFFF), (0x10000, MAX_CODE_POINT))


def _encode(cp: int, length: int) -> list[int]:
    if length == 1:
        return [cp]
    out = []
    for _ in range(length - 1):
        out.append(0x80 | (cp & 0x3F))
        cp >>= 6
    lead = {2: 0xC0, 3: 0xE0, 4: 0xF0}[length]
    out.append(lead | cp)
    return out[::-1]


def _split_same_length(lo: int, hi: int, length: int) -> list[list[tuple[int, int]]]:
    """Byte-range sequences for [lo, hi], all of whose code points encode to ``length`` bytes."""
    if length == 1:
        return [[(lo, hi)]]
    # Split until each range is "rectangular": every byte position varies over a full sub-range.
    for i in range(1, length):
        mask = (1 << (6 * i)) - 1
        if lo & ~mask != hi & ~mask:
            if lo & mask != 0:
                return _split_same_length(lo, lo | mask, length) + _split_same_length((lo | mask) + 1, hi, length)
            if hi & mask != mask:
                return _split_same_length(lo, (hi & ~mask) - 1, length) + _split_same_length(hi & ~mask, hi, length)
    a, b = _encode(lo, length), _encode(hi, length)
    return [list(zip(a, b))]


def utf8_sequences(lo: int, hi: int) -> list[list[tuple[int, int]]]:
    """Sequences of inclusive byte ranges whose concatenations encode exactly the code points in [lo, hi].

    Surrogates (U+D800-U+DFFF) have no UTF-8 encoding and are left out.
    """
    sequences: list[list[tuple[int, int]]] = []
    pieces = [(lo, hi)]
    if lo <= SURROGATES[1] and hi >= SURROGATES[0]:
        pieces = [(lo, SURROGATES[0] - 1), (SURROGATES[1] + 1, hi)]
    for a, b in pieces:
        if a > b:
            continue
        for length, (blo, bhi) in enumerate(_UTF8_LENGTH_BOUNDS, start=1):
            x, y = max(a, blo), min(b, bhi)
            if x <= y:
                sequences.extend(_split_same_length(x, y, length))
    return sequences


@memoized(PIECE_CACHE_BYTES, lambda paths, ranges: 100 * (len(ranges) + len(paths[1])))  # ~100 B a tuple
def _utf8_paths(ranges: tuple[tuple[int, int], ...]) -> tuple[int, list[tuple[int, int, int, int]]]:
    """The byte paths that read one code point of ``ranges``, as ``(number of inner states, edges)``; an edge is
    ``(from, first byte, last byte, to)`` with -1 for the outer source and target, inner states numbered from 0.
    Sequences that share a leading byte range share their first inner state, so large classes stay small. Cached:
    the same classes recur in every pattern."""
    prefix_states: dict[tuple[tuple[int, int], ...], int] = {(): -1}
    edges = []
    for lo, hi in ranges:
        for seq in utf8_sequences(lo, hi):
            state = -1
            for depth in range(len(seq) - 1):
                key = tuple(seq[: depth + 1])
                nxt = prefix_states.get(key)
                if nxt is None:
                    nxt = prefix_states[key] = len(prefix_states) - 1
                    edges.append((state, seq[depth][0], seq[depth][1], nxt))
                state = nxt
            edges.append((state, seq[-1][0], seq[-1][1], -1))
    return len(prefix_states) - 1, edges


def code_point_ranges(code_points: Iterable[int]) -> list[tuple[int, int]]:
    """Sorted, merged inclusive ranges covering the given code points."""
    ranges: list[tuple[int, int]] = []
    for cp in sorted(set(code_points)):
        if ranges and ranges[-1][1] + 1 == cp:
            ranges[-1] = (ranges[-1][0], cp)
        else:
            ranges.append((cp, cp))
    return ranges


def complement_ranges(ranges: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """All code points not in ``ranges`` (which must be sorted and disjoint)."""
    out = []
    nxt = 0
    for lo, hi in ranges:
        if lo > nxt:
            out.append((nxt, lo - 1))
        nxt = hi + 1
    if nxt <= MAX_CODE_POINT:
        out.append((nxt, MAX_CODE_POINT))
    return out
