"""Small regex ASTs, as state elimination builds them, and their rendering as regex text (in the subset of
:mod:`constrain.automata.regex`) or as grammar expressions.
"""

from __future__ import annotations

from collections.abc import Sequence

from constrain.automata.utf8 import complement_ranges
from constrain.grammar.ir import Alt, Expr, Repeat, Seq

# Nodes are tuples (kind, size, ...): ("e", 0) empty string; ("c", n, ranges) a class of code points (or of
# symbols); (".", n, items) concatenation; ("|", n, items) alternation; ("?", n, x); ("*", n, x);
# ("{", n, x, lo, hi) counted repetition (hi None: unbounded).
_EPS = ("e", 0)


def _r_set(ranges: tuple[tuple[int, int], ...]) -> tuple:
    return ("c", 4 + 12 * len(ranges), ranges)


def _r_rep_parts(x: tuple) -> tuple[tuple, int, int | None]:
    if x[0] == "{":
        return x[2], x[3], x[4]
    if x[0] == "*":
        return x[2], 0, None
    if x[0] == "?":
        return x[2], 0, 1
    return x, 1, 1


def _r_rep(x: tuple, lo: int, hi: int | None) -> tuple:
    if hi == 0:
        return _EPS
    if lo == 1 and hi == 1:
        return x
    if lo == 0 and hi is None:
        return ("*", x[1] + 3, x)
    if lo == 0 and hi == 1:
        return ("?", x[1] + 3, x)
    return ("{", x[1] + 10, x, lo, hi)


def _r_cat(*items: tuple) -> tuple:
    out: list[tuple] = []
    for item in items:
        parts = item[2] if item[0] == "." else (item,) if item[0] != "e" else ()
        for part in parts:
            if out:
                a, alo, ahi = _r_rep_parts(out[-1])
                b, blo, bhi = _r_rep_parts(part)
                if a == b:
                    out[-1] = _r_rep(a, alo + blo, None if ahi is None or bhi is None else ahi + bhi)
                    continue
            out.append(part)
    if not out:
        return _EPS
    if len(out) == 1:
        return out[0]
    return (".", sum(p[1] for p in out), tuple(out))


def _r_opt(x: tuple) -> tuple:
    if x[0] in ("e", "?", "*"):
        return x
    if x[0] == "{" and x[3] <= 1:
        return _r_rep(x[2], 0, x[4])
    if x[0] == "|":
        return ("?", x[1] + 3, x)
    if x[0] == ".":
        # x (x{0,k}) -> x{0,k+1}
        items = x[2]
        if len(items) == 2:
            a, (b, blo, bhi) = items[0], _r_rep_parts(items[1])
            if a == b and blo == 0:
                return _r_rep(a, 0, None if bhi is None else bhi + 1)
    return ("?", x[1] + 3, x)


def _r_alt(a: tuple | None, b: tuple | None) -> tuple | None:
    if a is None:
        return b
    if b is None:
        return a
    if a == b:
        return a
    if a[0] == "e":
        return _r_opt(b)
    if b[0] == "e":
        return _r_opt(a)
    optional = False
    items: list[tuple] = []
    for x in (a, b):
        if x[0] == "?":
            optional = True
            x = x[2]
        items.extend(x[2] if x[0] == "|" else (x,))
    sets = [x for x in items if x[0] == "c"]
    rest: list[tuple] = []
    for x in items:
        if x[0] != "c" and x not in rest:
            rest.append(x)
    if len(sets) > 1:
        merged = _merge_ranges([r for s in sets for r in s[2]])
        rest.insert(0, _r_set(merged))
    elif sets:
        rest.insert(0, sets[0])
    node = rest[0] if len(rest) == 1 else ("|", sum(x[1] + 1 for x in rest), tuple(rest))
    return _r_opt(node) if optional else node


def _r_star(x: tuple) -> tuple:
    if x[0] == "e":
        return _EPS
    if x[0] in ("*", "?"):
        return _r_star(x[2])
    if x[0] == "{" and x[3] <= 1:
        return _r_star(x[2])
    return ("*", x[1] + 3, x)


def _merge_ranges(ranges: Sequence[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    out: list[list[int]] = []
    for lo, hi in sorted(ranges):
        if out and lo <= out[-1][1] + 1:
            out[-1][1] = max(out[-1][1], hi)
        else:
            out.append([lo, hi])
    return tuple((lo, hi) for lo, hi in out)


def _cp_text(cp: int) -> str:
    if cp < 0x80 and (chr(cp).isalnum() or cp == 0x5F):
        return chr(cp)
    if cp < 0x100:
        return f"\\x{cp:02x}"
    if cp < 0x10000:
        return f"\\u{cp:04x}"
    return f"\\U{cp:08x}"


_FULL = ((0, 0xD7FF), (0xE000, 0x10FFFF))


def _class_text(ranges: tuple[tuple[int, int], ...]) -> str:
    # Bridge the surrogate gap (no text can contain a surrogate, so this changes nothing).
    ranges = _merge_ranges(
        [(lo, 0xDFFF) if hi == 0xD7FF else (0xD800, hi) if lo == 0xE000 else (lo, hi) for lo, hi in ranges]
    )
    if ranges == ((0, 0x10FFFF),):
        return "(?s:.)"
    if len(ranges) == 1 and ranges[0][0] == ranges[0][1]:
        return _cp_text(ranges[0][0])
    # The regex parser materialises classes as sets of characters: write a large class as the negation of
    # its (small) complement.
    size = sum(hi - lo + 1 for lo, hi in ranges)
    negate = size > 0x8000 and size > 0x110000 - size
    if negate:
        ranges = tuple(complement_ranges(list(ranges)))
    body = "".join(_cp_text(lo) if lo == hi else f"{_cp_text(lo)}-{_cp_text(hi)}" for lo, hi in ranges)
    return f"[^{body}]" if negate else f"[{body}]"


def _render(node: tuple) -> str:
    kind = node[0]
    if kind == "e":
        return ""
    if kind == "c":
        return _class_text(node[2])
    if kind == ".":
        return "".join(_render_group(x) if x[0] == "|" else _render(x) for x in node[2])
    if kind == "|":
        return "|".join(_render(x) for x in node[2])
    if kind == "?":
        return _render_atom(node[2]) + "?"
    if kind == "*":
        return _render_atom(node[2]) + "*"
    if kind == "{":
        lo, hi = node[3], node[4]
        count = f"{{{lo}}}" if lo == hi else f"{{{lo},}}" if hi is None else f"{{{lo},{hi}}}"
        return _render_atom(node[2]) + count
    raise AssertionError(kind)


def _render_group(node: tuple) -> str:
    return f"(?:{_render(node)})"


def _render_atom(node: tuple) -> str:
    if node[0] == "c":
        return _class_text(node[2])
    return _render_group(node)


def _ast_to_expr(node: tuple, symbol: Sequence[Expr]) -> Expr:
    """A regex AST over symbols 0..n-1 as a grammar expression, ``symbol[i]`` standing for symbol i."""
    kind = node[0]
    if kind == "e":
        return Seq(())
    if kind == "c":
        options = [symbol[s] for lo, hi in node[2] for s in range(lo, hi + 1)]
        return options[0] if len(options) == 1 else Alt(tuple(options))
    if kind == ".":
        return Seq(tuple(_ast_to_expr(x, symbol) for x in node[2]))
    if kind == "|":
        return Alt(tuple(_ast_to_expr(x, symbol) for x in node[2]))
    if kind == "?":
        return Repeat(_ast_to_expr(node[2], symbol), 0, 1)
    if kind == "*":
        return Repeat(_ast_to_expr(node[2], symbol), 0, None)
    return Repeat(_ast_to_expr(node[2], symbol), node[3], node[4])
