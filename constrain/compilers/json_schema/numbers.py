"""Numbers: canonical integer and decimal literals in ranges, digit by digit, and ``multipleOf`` as a remainder
automaton; and their rules.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Callable
from decimal import Decimal, localcontext

from constrain.automata.limits import AUTOMATON_CACHE_BYTES, PIECE_CACHE_BYTES
from constrain.cache import memoized
from constrain.compilers.json_schema.cdfa import _CDFA, MAX_AUTOMATON_STATES, _merge_edges
from constrain.compilers.json_schema.errors import _TooLarge
from constrain.compilers.json_schema.keywords import _Shape
from constrain.compilers.json_schema.regex_ast import _class_text, _merge_ranges
from constrain.compilers.json_schema.strings import _automaton_of, _cdfa_bytes
from constrain.compilers.json_schema.values import _ceil, _floor, _int_above, _int_below, _num_text
from constrain.grammar.ir import Alt, Expr, Ref, Regex, Seq

#: Largest ``multipleOf`` modulus (the integer ``M`` of ``multipleOf = M / 10**k``) compiled as an automaton.
MAX_MODULUS = 1_000
#: Largest finite enum of multiples listed value by value.
MAX_ENUMERATED_MULTIPLES = 512


def _digits_ge(s: str) -> str:
    """Regex for digit strings of length len(s) that are >= s: one flat alternation (a bound of hundreds of
    digits, as ``1e308`` is, must not nest a group per digit)."""
    return _digits_beyond(s, "0", lambda d: f"[{int(d) + 1}-9]" if d != "9" else None)


def _digits_le(s: str) -> str:
    """Regex for digit strings of length len(s) that are <= s (flat, as :func:`_digits_ge`)."""
    return _digits_beyond(s, "9", lambda d: f"[0-{int(d) - 1}]" if d != "0" else None)


def _digits_beyond(s: str, free: str, beyond: Callable[[str], str | None]) -> str:
    """``s`` itself or, for some position, ``s``'s digits before it, a digit of ``beyond(s[i])`` at it and any
    digits after it. A tail of ``free`` digits (zeros for >=, nines for <=) already admits any digits."""
    n = len(s)
    k = len(s.rstrip(free))
    options = [s[:k] + (f"[0-9]{{{n - k}}}" if k < n else "")] if n else []
    for i in range(k):
        digit = beyond(s[i])
        if digit is not None:
            options.append(s[:i] + digit + (f"[0-9]{{{n - i - 1}}}" if i < n - 1 else ""))
    if len(options) <= 1:
        return "".join(options)
    return "(?:" + "|".join(options) + ")"


def _same_length(x: str, y: str) -> str:
    """Regex for digit strings s with len(s) == len(x) == len(y) and x <= s <= y."""
    i = 0
    while i < len(x) and x[i] == y[i]:
        i += 1
    prefix = x[:i]
    if i == len(x):
        return prefix
    a, b = x[i], y[i]
    xr, yr = x[i + 1 :], y[i + 1 :]
    m = len(xr)
    tail = f"[0-9]{{{m}}}" if m else ""
    if set(xr) <= {"0"} and set(yr) <= {"9"}:
        return prefix + f"[{a}-{b}]" + tail
    options = [a + _digits_ge(xr)]
    if int(b) - int(a) > 1:
        options.append(f"[{int(a) + 1}-{int(b) - 1}]" + tail)
    options.append(b + _digits_le(yr))
    return prefix + "(?:" + "|".join(options) + ")"


def _nat_range(a: int, b: int | None) -> str | None:
    """Regex for canonical natural numbers (no leading zeros) in [a, b] (b None: unbounded)."""
    a = max(a, 0)
    if b is not None and b < a:
        return None
    options = []
    la = len(str(a))
    lb = len(str(b)) if b is not None else la
    for length in range(la, lb + 1):
        lo = max(a, 10 ** (length - 1) if length > 1 else 0)
        hi = min(b, 10**length - 1) if b is not None else 10**length - 1
        if lo <= hi:
            options.append(_same_length(str(lo), str(hi)))
    if b is None:
        options.append(f"[1-9][0-9]{{{la},}}")
    return options[0] if len(options) == 1 else "(?:" + "|".join(options) + ")"


def _int_range(lo: int | None, hi: int | None) -> str | None:
    """Regex for canonical integers (no ``-0``) in [lo, hi] (None: unbounded)."""
    options = []
    if lo is None or lo < 0:
        top = -1 if hi is None else min(hi, -1)  # the negative closest to zero that is allowed
        mag = _nat_range(-top, None if lo is None else -lo)
        if mag is not None:
            options.append("-" + mag)
    if hi is None or hi >= 0:
        mag = _nat_range(0 if lo is None else max(lo, 0), hi)
        if mag is not None:
            options.append(mag)
    if not options:
        return None
    return options[0] if len(options) == 1 else "(?:" + "|".join(options) + ")"


@memoized(PIECE_CACHE_BYTES, lambda out, *bounds: 100 + len(repr(out)))  # its patterns grow with the bounds
def _fraction_digits(lo: str | None, lo_strict: bool, hi: str | None, hi_strict: bool) -> tuple[bool, tuple[str, ...]]:
    """Digit strings D (after the point) with lo <(=) 0.D <(=) hi, as (D may be empty, the alternatives for
    nonempty D: none of them holds a ``|``, so a bound of hundreds of digits gives one flat alternation).

    ``lo``/``hi`` are digit strings (the value 0.lo), None for no bound."""
    if lo is not None:
        lo = lo.rstrip("0")
        if lo == "" and not lo_strict:
            lo = None
    if hi is not None:
        hi = hi.rstrip("0")
    if lo is None and hi is None:
        return True, ("[0-9]+",)
    if hi == "":
        if hi_strict or lo is not None:
            return False, ()
        return True, ("0+",)
    if lo == "" and hi is None:
        return False, ("[0-9]*[1-9][0-9]*",)
    empty_ok = lo is None and (hi is None or hi != "" or not hi_strict)
    groups: dict[tuple, list[int]] = {}
    for d in range(10):
        c = str(d)
        if lo is None:
            nlo = None
        else:
            l0 = lo[0] if lo else "0"
            if c < l0:
                continue
            nlo = None if c > l0 else (lo[1:] if lo else "")
        if hi is None:
            nhi = None
        else:
            h0 = hi[0] if hi else "0"
            if c > h0:
                continue
            nhi = None if c < h0 else hi[1:]
        groups.setdefault((nlo, nhi), []).append(d)
    options: list[str] = []
    for (nlo, nhi), digits in groups.items():
        sub_empty, subs = _fraction_digits(nlo, lo_strict, nhi, hi_strict)
        cls = str(digits[0]) if len(digits) == 1 else f"[{''.join(map(str, digits))}]"
        if sub_empty:
            options.append(cls)
        options.extend(cls + sub for sub in subs)
    return empty_ok, tuple(options)


def _frac_part(lo: str | None, lo_strict: bool, hi: str | None, hi_strict: bool, nonint: bool) -> str | None:
    """Regex for the optional fraction part ``(\\.D)?`` given bounds on 0.D; None when impossible."""
    if nonint and (lo is None or lo.rstrip("0") == ""):
        lo, lo_strict = "", True
    empty_ok, options = _fraction_digits(lo, lo_strict, hi, hi_strict)
    if not options:
        return "" if empty_ok else None
    rx = "|".join(options)
    return f"(?:\\.(?:{rx}))?" if empty_ok else f"\\.(?:{rx})"


def _split_decimal(v: Decimal) -> tuple[int, str]:
    """Integer part and fraction digits of a non-negative decimal."""
    text = format(v, "f")
    if "." in text:
        whole, frac = text.split(".")
        return int(whole), frac.rstrip("0")
    return int(text), ""


def _magnitude_range(lo: Decimal, lo_strict: bool, hi: Decimal | None, hi_strict: bool, nonint: bool) -> str | None:
    """Regex for plain decimal literals (no sign) with value in the interval; lo >= 0."""
    il, fl = _split_decimal(lo)
    options = []

    def add(int_rx: str | None, frac_rx: str | None) -> None:
        if int_rx is not None and frac_rx is not None:
            options.append(int_rx + frac_rx)

    if hi is None:
        add(str(il), _frac_part(fl, lo_strict, None, False, nonint))
        add(_nat_range(il + 1, None), _frac_part(None, False, None, False, nonint))
    else:
        ih, fh = _split_decimal(hi)
        if il == ih:
            add(str(il), _frac_part(fl, lo_strict, fh, hi_strict, nonint))
        elif il < ih:
            add(str(il), _frac_part(fl, lo_strict, None, False, nonint))
            if ih - il > 1:
                add(_nat_range(il + 1, ih - 1), _frac_part(None, False, None, False, nonint))
            add(str(ih), _frac_part(None, False, fh, hi_strict, nonint))
    if not options:
        return None
    return options[0] if len(options) == 1 else "(?:" + "|".join(options) + ")"


#: A number other than zero, unsigned, in any JSON spelling (exponents too).
_POSITIVE = r"(?:[1-9][0-9]*(?:\.[0-9]+)?|0\.[0-9]*[1-9][0-9]*)(?:[eE][+-]?[0-9]+)?"
_ZERO = r"0(?:\.0+)?(?:[eE][+-]?[0-9]+)?"


def _signed_number(sh: _Shape) -> str | None:
    """Numbers bounded only by zero (``minimum: 0``, ``exclusiveMaximum: 0``...) in every JSON spelling,
    exponents included, since the sign alone decides; None for other shapes (their ranges are written without
    exponents)."""
    if not ("int" in sh.kinds and "frac" in sh.kinds) or sh.multiples or sh.neg_multiples or sh.num_excluded:
        return None
    if sh.hi is None and sh.lo == 0:
        return _POSITIVE if sh.lo_strict else f"(?:{_ZERO}|{_POSITIVE})"
    if sh.lo is None and sh.hi == 0:
        return f"-{_POSITIVE}" if sh.hi_strict else f"(?:{_ZERO}|-{_POSITIVE})"
    return None


def _decimal_range(
    lo: Decimal | None, lo_strict: bool, hi: Decimal | None, hi_strict: bool, nonint: bool
) -> str | None:
    """Regex for plain decimal literals (no exponent, no -0) with value in the interval."""
    options = []
    if lo is None or lo < 0:
        if hi is not None and hi < 0:
            mlo, mlo_strict = -hi, hi_strict
        else:
            mlo, mlo_strict = Decimal(0), True
        mhi, mhi_strict = (None, False) if lo is None else (-lo, lo_strict)
        if mhi is None or mhi > mlo or (mhi == mlo and not mlo_strict and not mhi_strict):
            mag = _magnitude_range(mlo, mlo_strict, mhi, mhi_strict, nonint)
            if mag is not None:
                options.append("-" + mag)
    if hi is None or hi >= 0:
        plo, plo_strict = (Decimal(0), False) if lo is None or lo < 0 else (lo, lo_strict)
        if hi is None or hi > plo or (hi == plo and not plo_strict and not hi_strict):
            mag = _magnitude_range(plo, plo_strict, hi, hi_strict, nonint)
            if mag is not None:
                options.append(mag)
    if not options:
        return None
    return options[0] if len(options) == 1 else "(?:" + "|".join(options) + ")"


@memoized(AUTOMATON_CACHE_BYTES, lambda d, m: _cdfa_bytes(d))  # the branches of one schema share moduli
def _modulus_cdfa(m: Decimal) -> _CDFA:
    """Plain decimal literals (sign, digits, optional fraction) whose value is a multiple of ``m`` > 0: a
    remainder automaton over the digits of value * 10**k, where m = M / 10**k."""
    m = m.normalize()
    sign, digits, exp = m.as_tuple()
    k = max(0, -exp)
    big = int(m.scaleb(k))
    if big > MAX_MODULUS:
        raise _TooLarge("modulus")
    # states: 0 start; 1 after '-'; int(r) ; frac(r, j)
    ids: dict[tuple, int] = {("s",): 0, ("neg",): 1}
    edges: dict[int, list[tuple[int, int, int]]] = {0: [], 1: []}
    accept: dict[int, bool] = {0: False, 1: False}
    work = [("s",), ("neg",)]

    def state(key: tuple) -> int:
        if key not in ids:
            ids[key] = len(ids)
            edges[ids[key]] = []
            kind = key[0]
            if kind == "int":
                accept[ids[key]] = (key[1] * 10**k) % big == 0
            else:
                accept[ids[key]] = (key[1] * 10 ** (k - key[2])) % big == 0
            work.append(key)
        return ids[key]

    done = set()
    while work:
        key = work.pop()
        if key in done:
            continue
        done.add(key)
        s = ids[key]
        out = []
        if key[0] in ("s", "neg"):
            if key[0] == "s":
                out.append((ord("-"), ord("-"), state(("neg",))))
            for d in range(10):
                out.append((48 + d, 48 + d, state(("int", d % big))))
        elif key[0] == "int":
            r = key[1]
            for d in range(10):
                out.append((48 + d, 48 + d, state(("int", (r * 10 + d) % big))))
            out.append((ord("."), ord("."), state(("frac", r, 0))))
        else:
            r, j = key[1], key[2]
            for d in range(10):
                if j < k:
                    out.append((48 + d, 48 + d, state(("frac", (r * 10 + d) % big, j + 1))))
                elif d == 0:
                    out.append((48, 48, s))
        edges[s] = _merge_edges(out)
    n = len(ids)
    return _CDFA([edges[i] for i in range(n)], [accept[i] for i in range(n)]).frozen()  # kept, combined often


class _NumberRules:
    """The rules of the numbers a shape allows: bounds, excluded values and ``multipleOf`` (negated too).

    A mixin of :class:`~constrain.compilers.json_schema.compiler._Compiler`. It relies on the compiler's ``rules``
    (the rules being built) and on its methods ``shared``, ``refuse`` and ``unsatisfiable``."""

    def number_expr(self, sh: _Shape) -> Expr:
        int_ok, frac_ok = "int" in sh.kinds, "frac" in sh.kinds
        lo, ls, hi, hs = sh.lo, sh.lo_strict, sh.hi, sh.hi_strict
        if lo is not None and hi is not None and (lo > hi or (lo == hi and (ls or hs))):
            raise self.unsatisfiable(
                f"{sh.lo_at[1]} {_num_text(lo)} and {sh.hi_at[1]} {_num_text(hi)} leave no number", *sh.lo_at
            )
        if lo is None and hi is None and not sh.multiples and not sh.neg_multiples and not sh.num_excluded:
            if int_ok and frac_ok:
                return self.shared("json_number")
            return self.shared("json_integer" if int_ok else "json_fraction")
        signed = _signed_number(sh)
        if signed is not None:
            return Regex(signed)
        with localcontext() as ctx:
            ctx.prec = 2000
            # split the interval at the excluded values
            cuts = sorted(v for v in sh.num_excluded if (lo is None or v >= lo) and (hi is None or v <= hi))
            intervals = []
            a, a_strict = lo, ls
            for v in cuts:
                intervals.append((a, a_strict, v, True))
                a, a_strict = v, True
            intervals.append((a, a_strict, hi, hs))
            pieces = []
            for a, a_strict, b, b_strict in intervals:
                if int_ok and not frac_ok:
                    ai = None if a is None else _int_above(a, a_strict)
                    bi = None if b is None else _int_below(b, b_strict)
                    rx = _int_range(ai, bi)
                else:
                    if a is not None and b is not None and (a > b or (a == b and (a_strict or b_strict))):
                        continue
                    rx = _decimal_range(a, a_strict, b, b_strict, nonint=not int_ok)
                if rx is not None:
                    pieces.append(rx)
            if not pieces:
                at = sh.lo_at if lo is not None else sh.hi_at
                raise self.unsatisfiable("no number satisfies the bounds and exclusions", *at)
            rx = pieces[0] if len(pieces) == 1 else "(?:" + "|".join(pieces) + ")"
            if not sh.multiples and not sh.neg_multiples:
                return Regex(rx)
            return self.multiples_expr(sh, rx, int_ok, frac_ok)

    def multiples_expr(self, sh: _Shape, range_rx: str, int_ok: bool, frac_ok: bool) -> Expr:
        lo, ls, hi, hs = sh.lo, sh.lo_strict, sh.hi, sh.hi_strict
        ms = [m for m, _ in sh.multiples]
        not_ms = [m for m, _ in sh.neg_multiples]
        first_m, at = (sh.multiples or sh.neg_multiples)[0]
        if lo is not None and hi is not None and ms:
            step = max(ms)
            first = _ceil(lo / step)
            last = _floor(hi / step)
            if last - first + 1 <= MAX_ENUMERATED_MULTIPLES:
                literals = []
                for i in range(first, last + 1):
                    v = step * i
                    if (ls and v == lo) or (hs and v == hi) or v < lo or v > hi or v in sh.num_excluded:
                        continue
                    integral = v == v.to_integral_value()
                    if (integral and not int_ok) or (not integral and not frac_ok):
                        continue
                    if any(v % m != 0 for m in ms) or any(v % m == 0 for m in not_ms):
                        continue
                    literals.append(str(int(v)) if integral else format(v.normalize(), "f"))
                if not literals:
                    raise self.unsatisfiable("no multiple of multipleOf lies within the bounds", at, "multipleOf")
                return Regex("(?:" + "|".join(re.escape(t) for t in literals) + ")")
        try:
            d = _CDFA.from_regex(range_rx)
            for m, _ in sh.multiples:
                d = d.intersect(_modulus_cdfa(m)).minimized()
            for m, _ in sh.neg_multiples:
                d = d.minus(_modulus_cdfa(m)).minimized()
            if d.is_empty():
                raise self.unsatisfiable("no number satisfies multipleOf and the bounds", at, "multipleOf")
            if d.n > MAX_AUTOMATON_STATES // 4:
                raise _TooLarge("states")
            try:
                return _automaton_of(d)
            except _TooLarge:
                return self.digit_rules(d)
        except _TooLarge:
            self.refuse(at, "multipleOf", f"multipleOf {first_m} needs too large an automaton", "ignored")
            return Regex(range_rx)

    def digit_rules(self, d: _CDFA) -> Ref:
        """The language of ``d`` (a number automaton) as right-linear rules: one rule per state, one call per
        character read. Exact and deterministic at any size of automaton, but the stack grows with the number
        of digits, so this is kept for what no regex of reasonable size can express (remainders)."""
        prefix = f"digits{len(self.rules)}."
        while any(name.startswith(prefix) for name in self.rules):
            prefix += "x"
        for state in range(d.n):
            by_target: dict[int, list[tuple[int, int]]] = defaultdict(list)
            for lo, hi, t in d.edges[state]:
                by_target[t].append((lo, hi))
            options: list[Expr] = [
                Seq((Regex(_class_text(_merge_ranges(ranges))), Ref(f"{prefix}{t}"))) for t, ranges in by_target.items()
            ]
            if d.accept[state]:
                options.append(Seq(()))
            self.rules[f"{prefix}{state}"] = options[0] if len(options) == 1 else Alt(tuple(options))
        return Ref(f"{prefix}0")
