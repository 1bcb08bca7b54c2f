r"""JSON Schema (draft 2020-12, plus the draft-07 / draft-04 spellings) to the grammar IR.

:func:`schema_to_grammar` lowers a schema to a :class:`~constrain.grammar.ir.Grammar` (and lists what lenient mode
relaxed); :func:`compile_json_schema` compiles it for a vocabulary. The language is JSON text whose value the schema
accepts, in a canonical form (below). Each (sub)schema, keyed by its JSON pointer (a set of pointers once ``allOf``
/ ``$ref`` / branches are merged), becomes one rule, so ``$ref`` cycles are rule calls; the lexical pieces (a JSON
string, number, integer, whitespace, ``true``/``false``/``null``, any value) are shared rules.

How the output is written
-------------------------
- ``whitespace="compact"`` (default): no whitespace, as ``json.dumps(x, separators=(",", ":"))``. ``"flexible"``:
  0 to ``max_whitespace`` characters of ``[ \t\n\r]`` around ``{ } [ ] , :`` inside containers (never before or
  after the top-level value). ``"indent"``: the layout of ``json.dumps(x, indent=2)``; nesting deeper than
  :data:`MAX_INDENT_DEPTH` continues compactly.
- Strings are canonical, as ``json.dumps(s, ensure_ascii=False)`` writes them: ``\"``, ``\\``, ``\b \f \n \r
  \t``, other control characters as ``\u00xx`` (lower-case hex), every other character as itself. Every decoded
  string has exactly one encoding, so constraints on the *decoded* string (``pattern``, ``format``, lengths in
  code points, enums, excluded values, property names) are translated exactly: the decoded language is an
  automaton over code points, each special character on its edges becomes its escape sequence, and the result is
  written back as a regex by state elimination. Patterns and formats therefore see escaped characters like any
  other; nothing is refused for needing an escape. When a pattern's own text (or that text with its character
  classes widened to the escapes they contain) means exactly that language, it is used as is: the automaton
  check decides, so the short form is never wrong.
- Numbers: ``integer`` as ``0`` or ``-?[1-9][0-9]*``; an unconstrained ``number`` as any JSON number; a ``number``
  with bounds, ``multipleOf`` or exclusions in plain decimal notation (no exponent, no ``-0``), where every
  constraint is exact. (``1.0`` is a valid integer that is simply never produced.)
- Objects: the names of ``properties`` (then names only in ``required``) in that order, each present or absent,
  then additional properties (keys that are none of those names, when allowed) in any order.

Keywords
--------
Exact: ``type`` (lists too); ``enum``/``const`` (any JSON values, compared as JSON; the candidates are validated
against the whole conjunction with ``jsonschema``, so they combine exactly with anything); ``properties``,
``required``, ``additionalProperties`` (true / false / schema), ``patternProperties`` (up to
:data:`MAX_PATTERN_PROPERTIES` distinct patterns per object: the key space is split into the regions they
define), ``propertyNames`` (string constraints or enums), ``minProperties``/``maxProperties``,
``dependentRequired``, ``dependentSchemas`` and draft-07 ``dependencies`` (each trigger present or absent);
``allOf`` and ``$ref`` (merged: kinds intersected, bounds tightened, properties and requirements combined, per
schema object for ``additionalProperties``); ``anyOf``; ``oneOf`` when its branches are provably disjoint
(kinds, const/enum values, a required discriminator with disjoint values, a required name another closed branch
forbids), when split by kind of value each kind has at most one branch that always holds, or when every branch
can be made exclusive by negating the others; ``not`` of anything built from ``type``, ``enum``/``const`` of
scalars, single-keyword constraints (bounds, lengths, ``pattern``, ``format``, ``required``, item and property
counts), ``properties``/``items``/``prefixItems``/``contains`` (rewritten positively), ``allOf``/``anyOf``/
``not``/``if``; ``if``/``then``/``else`` when ``if`` can be negated so; ``$ref`` with JSON pointers (``~0 ~1``,
percent-encoding), ``$anchor``, ``$id``-based URIs inside the document, ``$defs``/``definitions``, recursion;
``$dynamicRef``/``$recursiveRef`` that resolve statically; ``items``, ``prefixItems``, draft-07 ``items`` lists
with ``additionalItems``, ``minItems``/``maxItems``; ``contains`` with ``minContains``/``maxContains`` (arrays
without a prefix: counted by a small automaton over "matching / other" items); ``minLength``/``maxLength``
(code points; long bounds as blocks of fixed-length rules); ``pattern`` (ECMAScript search semantics: each
top-level alternative anchored only by its own ``^``/``$``; the regex subset of :mod:`constrain.automata.regex`:
``\d \w \s`` ASCII, ``.`` any character but ``\n``; together with a length bound, one byte automaton that
counts characters beside the pattern's (:func:`_counted_dfa`), or when that is too large, blocks of a fixed
number of characters, one rule per pattern state and block count);
``minimum``/``maximum``/``exclusiveMinimum``/``exclusiveMaximum`` (digit by digit on both sides of the point;
draft-04 boolean exclusives too);
``multipleOf`` (integer or decimal: a remainder automaton for moduli ``M / 10**k`` with ``M`` up to
:data:`MAX_MODULUS`, combined with the range, written as one regex when small, else as one rule per remainder
state, a call per digit; finite ranges are listed);
``unevaluatedProperties``/``unevaluatedItems`` (what in-place subschemas of the same conjunction evaluate;
``anyOf`` then branches on every non-empty set of holding branches, so the annotations are exact).

Formats (strings only): ``date``, ``duration``, ``ipv4`` (no leading zeros), ``ipv6`` (RFC 4291, no zone id),
``uuid``, ``json-pointer``, ``relative-json-pointer``: exact. ``time``/``date-time`` (RFC 3339 without leap
seconds), ``email`` (RFC 5321 Mailbox: dot-atom or quoted local part; LDH domain or address literal),
``hostname`` (RFC 1123 LDH labels of at most 48 characters, at most 5 labels, no ``--`` in positions 3-4 so no
IDNA A-labels), ``uri``/``uri-reference`` (RFC 3986, no IPvFuture), ``uri-template`` (RFC 6570): subsets. A
format regex never accepts an invalid value. ``idn-email``, ``idn-hostname``, ``iri``, ``iri-reference``,
``regex`` are refused (lenient: ignored); unknown formats are annotations and ignored.

``uniqueItems`` is exact when at most one item is possible or the items come from an enum of at most
:data:`MAX_UNIQUE_ENUM` values (one rule per set of values used).

Refused in strict mode, relaxed in lenient mode (each relaxation listed): other ``uniqueItems: true``
(dropped); ``oneOf`` not shown exact (treated as ``anyOf``); ``not``/``if`` that cannot be negated (ignored);
``contains`` beside prefix items, several ``contains``, ``maxContains`` whose schema cannot be negated,
``unevaluatedItems`` beside ``contains`` (ignored); unsupported regex constructs and formats (ignored);
``multipleOf`` with a large modulus, a pattern/format together with a length bound whose exact combination
needs too large an automaton, counts of many optional properties, too many ``patternProperties`` (the keyword
ignored or, for keys, additional properties not produced); ``minProperties`` that repeated additional keys could
fake (kept); ``$dynamicRef``/``$recursiveRef`` with a dynamic scope (resolved statically); keywords of another
draft that this draft's validator ignores, e.g. ``dependencies`` in a schema declaring 2020-12, and the draft-03
``divisibleBy``/``disallow``/``extends`` (ignored, as a validator would). Without ``$schema``, a schema is read
as 2020-12 plus the draft-07 spellings (``dependencies``, ``items`` lists with ``additionalItems``), or as draft-07
when only the draft-07 metaschema accepts it. Unknown keywords and annotations (``title``, ``description``,
``default``, ``examples``, ``$comment``, ``deprecated``, ``readOnly``, ``writeOnly``, ``content*``, ``$schema``,
``$id``...) are ignored in both modes.

Errors (:class:`JsonSchemaError`, with the JSON pointer and keyword at fault): a schema that is not valid JSON
Schema (its metaschema; patterns are judged by the regex compiler, not by Python's ``re``), an unresolvable or
remote ``$ref``, an unsatisfiable schema (``minimum`` above ``maximum``, an empty enum, a contradictory
``allOf``, ``minLength`` above ``maxLength``, a required property that cannot be present, a recursion that never
ends). Unsatisfiable parts that are optional (an anyOf branch, an optional property) are simply left out.

Known limits: the property order is fixed (a valid object whose keys come in another order is not produced);
additional-property keys may repeat (a grammar cannot remember unbounded key sets; ``minProperties`` that only
repeated keys could meet is refused); ``\d``/``\w``/``\s`` are ASCII as in ECMAScript, whereas Python's ``re``
(what jsonschema uses) also matches other Unicode digits/letters/spaces, so a negated class such as ``\D`` allows
a few characters that jsonschema would reject; formats are asserted (also on enum values of the same schema),
while jsonschema treats most of them as annotations.
"""

from __future__ import annotations

import json
import re
from bisect import bisect_left, bisect_right
from collections import defaultdict
from collections.abc import Iterator, Mapping, Sequence
from decimal import Decimal, localcontext
from enum import Enum
from functools import cached_property, lru_cache
from itertools import product
from types import MappingProxyType
from typing import Any, NamedTuple
from urllib.parse import quote, unquote, urljoin

import numpy as np

from constrain.cache import BoundedCache
from constrain.errors import RegexError, StructureError
from constrain.automata.dfa import DEAD, ByteDFA
from constrain.automata.nfa import ByteNFA
from constrain.automata.limits import CompileTimeout, check_deadline, compile_clock, deadline
from constrain.automata.minimize import column_classes, partial_dfa_blocks
from constrain.automata.utf8 import complement_ranges
from constrain.grammar.ir import Alt, Automaton, Expr, Grammar, Literal, Ref, Regex, Repeat, Seq, calls_of, shared
from constrain.grammar.rules import terminal_dfa
from constrain.compilers.metaschema import certainly_valid
from constrain.automata.regex import regex_to_dfa

__all__ = ["JsonSchemaError", "schema_to_grammar", "compile_json_schema"]

#: Indentation levels written exactly in ``whitespace="indent"``; deeper values continue compactly.
MAX_INDENT_DEPTH = 12
#: Largest ``multipleOf`` modulus (the integer ``M`` of ``multipleOf = M / 10**k``) compiled as an automaton.
MAX_MODULUS = 1_000
#: Most ``patternProperties`` patterns that apply to one object (the key space splits into 2**n regions).
MAX_PATTERN_PROPERTIES = 4
#: Largest regex text written for one derived string/number language (characters).
MAX_REGEX_CHARS = 60_000
#: Most automaton states of one derived string/number language.
MAX_AUTOMATON_STATES = 4_000
#: States of one byte automaton handed to the grammar (a string's pattern with its bounds, keys, number forms).
MAX_BYTE_STATES = 8_000
#: Most grammar rules one schema may produce.
MAX_RULES = 20_000
#: Seconds a schema may take to lower to a grammar before it is refused (``time_limit``).
DEFAULT_TIME_LIMIT = 5.0
#: ``uniqueItems`` is exact for items drawn from an enum of at most this many values (a rule per subset).
MAX_UNIQUE_ENUM = 8
#: Largest finite enum of multiples listed value by value.
MAX_ENUMERATED_MULTIPLES = 512
#: ``maxLength`` above this is written as blocks of fixed-length rules rather than one counted automaton. Long
#: blocks keep the states where a token can cross into the next block (the last ~48 characters, the longest
#: token) a small share of the string: those masks depend on the caller and are walked, not shared.
LENGTH_BLOCK_THRESHOLD = 256
LENGTH_BLOCK = 256


class JsonSchemaError(StructureError):
    """A schema is invalid, unresolvable, unsatisfiable, or (in strict mode) cannot be honoured exactly.

    ``pointer`` is the JSON pointer of the keyword at fault (``/properties/age/minimum``), ``keyword`` its name.
    """

    def __init__(self, message: str, pointer: str = "", keyword: str | None = None):
        self.pointer = pointer
        self.keyword = keyword
        self.reason = message
        where = f"keyword {keyword!r} at {pointer!r}" if keyword else f"schema at {pointer or '/'!r}"
        super().__init__(f"{where}: {message}")


class _Unsatisfiable(JsonSchemaError):
    """No JSON value satisfies the (sub)schema."""


def _verdict(exc: _Unsatisfiable) -> _Unsatisfiable:
    """A copy of ``exc`` that was never raised: what the compiler keeps of a verdict, and what it raises again.
    A raised exception holds the frames it went through, and a frame that keeps it (the compiler's memo, a local
    list of failures) closes a reference cycle around the whole compile that only the cyclic collector frees."""
    return _Unsatisfiable(exc.reason, exc.pointer, exc.keyword)


class _OutOfTime(Exception):
    """The schema's time limit ran out (at the JSON pointer given); no handler relaxes this."""


#: What the time limit raises; a handler that turns errors into refusals or fallbacks lets these through first.
_TIME_LIMIT = (_OutOfTime, CompileTimeout)


def _check_time(ptr: str = "") -> None:
    try:
        check_deadline()
    except CompileTimeout:
        raise _OutOfTime(ptr) from None


class _TooLarge(Exception):
    """A derived automaton or regex exceeds its budget."""


# ==============================================================================================================
# Lexical pieces (regex text in the subset of constrain.automata.regex)

_PLAIN = r'[^"\\\x00-\x1f]'
_ESCAPE = r'\\(?:["\\bfnrt]|u00(?:0[0-7bef]|1[0-9a-f]))'
_CHAR = f"(?:{_PLAIN}|{_ESCAPE})"
_STRING = f'"{_CHAR}*"'
_NUMBER = r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?"
_INTEGER = r"(?:0|-?[1-9][0-9]*)"
_NONINT = r"-?(?:0|[1-9][0-9]*)\.[0-9]*[1-9][0-9]*"

_SPECIAL_ESCAPES = {0x22: '\\"', 0x5C: "\\\\", 0x08: "\\b", 0x0C: "\\f", 0x0A: "\\n", 0x0D: "\\r", 0x09: "\\t"}


def _escape_of(cp: int) -> str:
    return _SPECIAL_ESCAPES.get(cp) or f"\\u{cp:04x}"


def _quoted(body_regex: str) -> str:
    return f'"(?:{body_regex})"'


def _format_cdfa(name: str) -> _CDFA:
    return _CDFA.from_regex(_FORMATS[name]).minimized()


#: The code points a JSON string must escape, in order.
_SPECIALS = [cp for cp in range(0x5D) if cp < 0x20 or cp in (0x22, 0x5C)]


#: ``json.dumps(s, ensure_ascii=False)`` for a str ``s``: the function it ends in, without the encoder's Python
#: layers (keys and enum strings are written tens of times per schema).
_json_string = json.encoder.encode_basestring


def _dumps(value: Any, indent_depth: int | None = None) -> str:
    if isinstance(value, str):
        return _json_string(value)
    value = _canonical_value(value)
    if indent_depth is None:
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    text = json.dumps(value, indent=2, ensure_ascii=False)
    return text.replace("\n", "\n" + "  " * indent_depth)


def _canonical_value(value: Any) -> Any:
    """Integral floats as ints (``1.0`` is the integer 1 in JSON Schema); containers recursively."""
    if isinstance(value, bool) or value is None or isinstance(value, (int, str)):
        return value
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise ValueError("NaN and infinities are not JSON")
        return int(value) if value.is_integer() else value
    if isinstance(value, Mapping):
        return {k: _canonical_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_canonical_value(v) for v in value]
    return value


def _json_key(value: Any) -> str:
    """A key equal for JSON-equal values (numbers by value, object keys unordered, true != 1)."""
    if isinstance(value, str):
        return _json_string(value)
    return json.dumps(_json_normal(value), sort_keys=True, ensure_ascii=False)


def _json_normal(v: Any) -> Any:
    if isinstance(v, bool) or v is None or isinstance(v, str):
        return v
    if isinstance(v, (int, float)):
        return ["#num", str(_to_decimal(v).normalize())]
    if isinstance(v, Mapping):
        return {k: _json_normal(x) for k, x in v.items()}
    return [_json_normal(x) for x in v]


def _to_decimal(v: Any) -> Decimal:
    if isinstance(v, bool):
        raise TypeError("a boolean is not a number")
    if isinstance(v, int):
        return Decimal(v)
    if isinstance(v, float):
        return Decimal(repr(v))
    if isinstance(v, Decimal):
        return v
    raise TypeError(f"{v!r} is not a number")


def _kind_of(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "int" if value.is_integer() else "frac"
    if isinstance(value, str):
        return "string"
    if isinstance(value, Mapping):
        return "object"
    return "array"


_ALL_KINDS = frozenset({"null", "boolean", "int", "frac", "string", "array", "object"})
_TYPE_KINDS = {
    "null": {"null"},
    "boolean": {"boolean"},
    "integer": {"int"},
    "number": {"int", "frac"},
    "string": {"string"},
    "array": {"array"},
    "object": {"object"},
}


def _kinds_of_type(value: Any) -> set[str]:
    names = [value] if isinstance(value, str) else list(value)
    out: set[str] = set()
    for name in names:
        out |= _TYPE_KINDS.get(name, set())
    return out


# ==============================================================================================================
# Regex ASTs (built by state elimination) and their rendering

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


# ==============================================================================================================
# Automata over code points


class _CDFA:
    """A DFA over Unicode code points (or small symbol alphabets): ``edges[s]`` are sorted disjoint
    ``(lo, hi, target)``; state 0 is the start. Used to combine string and number constraints exactly
    (intersection, difference, escaping) before writing the result back as a regex."""

    __slots__ = ("edges", "accept")

    def __init__(self, edges: list[list[tuple[int, int, int]]], accept: list[bool]):
        self.edges = edges
        self.accept = accept

    @property
    def n(self) -> int:
        return len(self.accept)

    @staticmethod
    def empty() -> _CDFA:
        return _CDFA([[]], [False])

    @staticmethod
    def universal(ranges=_FULL) -> _CDFA:
        return _CDFA([[(lo, hi, 0) for lo, hi in ranges]], [True])

    @staticmethod
    def literals(strings) -> _CDFA:
        edges: list[dict[int, int]] = [{}]
        accept = [False]
        for text in strings:
            s = 0
            for ch in text:
                cp = ord(ch)
                nxt = edges[s].get(cp)
                if nxt is None:
                    nxt = len(accept)
                    edges[s][cp] = nxt
                    edges.append({})
                    accept.append(False)
                s = nxt
            accept[s] = True
        return _CDFA([[(cp, cp, t) for cp, t in sorted(e.items())] for e in edges], accept)

    @staticmethod
    def length(lo: int, hi: int | None, ranges=_FULL) -> _CDFA:
        count = (hi if hi is not None else lo) + 1
        if count > MAX_AUTOMATON_STATES:
            raise _TooLarge("length bound")
        edges = []
        for i in range(count):
            nxt = i + 1 if i + 1 < count else (i if hi is None else None)
            edges.append([] if nxt is None else [(a, b, nxt) for a, b in ranges])
        return _CDFA(edges, [i >= lo for i in range(count)])

    @staticmethod
    def from_regex(pattern: str) -> _CDFA:
        try:
            dfa = regex_to_dfa(pattern)
        except RegexError as exc:
            if "matches no string" in str(exc):
                return _CDFA.empty()
            raise
        return _cdfa_from_bytes(dfa.trans, dfa.accepting)

    def is_empty(self) -> bool:
        seen, stack = {0}, [0]
        while stack:
            s = stack.pop()
            if self.accept[s]:
                return False
            for _, _, t in self.edges[s]:
                if t not in seen:
                    seen.add(t)
                    stack.append(t)
        return True

    def accepts(self, text: str) -> bool:
        s = 0
        for ch in text:
            cp = ord(ch)
            for lo, hi, t in self.edges[s]:
                if lo <= cp <= hi:
                    s = t
                    break
            else:
                return False
        return self.accept[s]

    def intersect(self, other: _CDFA) -> _CDFA:
        return _product(self, other, False)

    def minus(self, other: _CDFA) -> _CDFA:
        return _product(self, other, True)

    def length_range(self) -> tuple[int, int | None]:
        """Shortest and longest accepted lengths (None: unbounded); the DFA must be trimmed."""
        dist = {0: 0}
        frontier = [0]
        shortest = None
        while frontier:
            nxt = []
            for s in frontier:
                if self.accept[s] and shortest is None:
                    shortest = dist[s]
                for _, _, t in self.edges[s]:
                    if t not in dist:
                        dist[t] = dist[s] + 1
                        nxt.append(t)
            frontier = nxt
        # longest: cycle -> unbounded; else longest path in a DAG
        color = [0] * self.n
        longest: dict[int, int] = {}

        def visit(s: int) -> int | None:
            stack = [(s, iter(self.edges[s]))]
            color[s] = 1
            while stack:
                state, it = stack[-1]
                advanced = False
                for _, _, t in it:
                    if color[t] == 1:
                        return None
                    if color[t] == 0:
                        color[t] = 1
                        stack.append((t, iter(self.edges[t])))
                        advanced = True
                        break
                if not advanced:
                    stack.pop()
                    color[state] = 2
                    best = 0 if self.accept[state] else -1
                    for _, _, t in self.edges[state]:
                        if longest[t] >= 0:
                            best = max(best, longest[t] + 1)
                    longest[state] = best
            return longest[s]

        top = visit(0)
        return (shortest or 0), (None if top is None else top)

    def minimized(self) -> _CDFA:
        return _minimize(self)

    def from_state(self, start: int, accept_only: int | None = None) -> _CDFA:
        """The same automaton started at ``start`` (accepting only in ``accept_only`` when given)."""
        index = {start: 0}
        order = [start]
        edges = []
        i = 0
        while i < len(order):
            row = []
            for lo, hi, t in self.edges[order[i]]:
                if t not in index:
                    index[t] = len(order)
                    order.append(t)
                row.append((lo, hi, index[t]))
            edges.append(row)
            i += 1
        accept = [self.accept[s] if accept_only is None else s == accept_only for s in order]
        return _CDFA(edges, accept)

    def encode_json(self) -> _CDFA:
        """The language of canonical JSON string bodies whose decoded text this DFA accepts."""
        edges: list[list[tuple[int, int, int]]] = []
        accept = list(self.accept)
        extra: list[dict] = []
        n = self.n
        tries: dict[int, int] = {}
        for s in range(n):
            out = []
            for lo, hi, t in self.edges[s]:
                # plain parts
                for a, b in _subtract_specials(lo, hi):
                    out.append((a, b, t))
                for cp in _SPECIALS[bisect_left(_SPECIALS, lo) : bisect_right(_SPECIALS, hi)]:
                    esc = _escape_of(cp)
                    node = tries.get(s)
                    if node is None:
                        node = tries[s] = n + len(extra)
                        extra.append({})
                        out.append((0x5C, 0x5C, node))
                    for i, ch in enumerate(esc[1:]):
                        table = extra[node - n]
                        if i == len(esc) - 2:
                            table[ord(ch)] = t
                        else:
                            nxt = table.get(ord(ch))
                            if nxt is None:
                                nxt = n + len(extra)
                                extra.append({})
                                table[ord(ch)] = nxt
                            node = nxt
            out.sort()
            edges.append(out)
        for table in extra:
            edges.append([(cp, cp, t) for cp, t in sorted(table.items())])
            accept.append(False)
        return _CDFA(edges, accept)

    def to_ast(self, budget: int = MAX_REGEX_CHARS) -> tuple | None:
        return _eliminate(self, budget)

    def to_byte_dfa(self, quoted: bool = False) -> ByteDFA:
        """The same language over UTF-8 bytes (between double quotes when ``quoted``), trimmed and minimised."""
        nfa = ByteNFA()
        states = [nfa.new_state() for _ in range(self.n)]
        accept = nfa.new_state()
        start = states[0]
        if quoted:
            start = nfa.new_state()
            nfa.add_bytes(start, 0x22, 0x22, states[0])
        for s, edges in enumerate(self.edges):
            by_target: dict[int, list[tuple[int, int]]] = defaultdict(list)
            for lo, hi, t in edges:
                by_target[t].append((lo, hi))
            for t, ranges in by_target.items():
                nfa.add_code_points(states[s], _merge_ranges(ranges), states[t])
            if self.accept[s]:
                if quoted:
                    nfa.add_bytes(states[s], 0x22, 0x22, accept)
                else:
                    nfa.add_epsilon(states[s], accept)
        return nfa.determinize(start, accept)


@lru_cache(maxsize=256)
def _key_except_dfa(names: tuple[str, ...]) -> ByteDFA:
    """JSON strings (quotes included) other than ``names``: the automaton of any JSON string less the names'
    canonical encodings, built minimal in one kernel (:meth:`~constrain.automata.dfa.ByteDFA.without_words`).
    Linear in the names' length; shared per process, since the same objects recur across schemas."""
    words = []
    for name in names:
        try:
            words.append(_json_string(name).encode())
        except UnicodeEncodeError:  # a lone surrogate: no JSON text spells it, nothing to exclude
            continue
    return terminal_dfa(_STRING).without_words(words)


#: Most states of a pattern/format automaton with a length bound handed to the grammar as one automaton: as many
#: as the blocks of fixed-length rules (``blocks_of``) may use together, which one automaton beats on compile and
#: mask time alike, its states far from the bound sharing their walks (measured on ``.+[@].+[.]___`` up to 200).
MAX_COUNTED_BYTE_STATES = 4 * MAX_BYTE_STATES
#: Most states of the byte-level product of a pattern with a character counter before it is minimised (its
#: table is states x 256 int32, 32 MiB at this size).
MAX_COUNTED_STATES = 1 << 15


def _escape_tracker() -> tuple[np.ndarray, np.ndarray]:
    """Where a canonical JSON string body is within its current character, read byte by byte: state 0 between
    characters (or inside a UTF-8 sequence), 1 after a backslash, 2-5 after ``\\u`` and 0-3 hex digits. Returns
    ``(next, starts)``, both (6, 256): the next state, and whether the byte read there begins a character (not a
    UTF-8 continuation byte, nor inside an escape). A body's bytes fix it, so it runs beside any body automaton."""
    nxt = np.zeros((6, 256), dtype=np.int32)
    nxt[0, 0x5C] = 1
    nxt[1, ord("u")] = 2
    nxt[2:5] = np.arange(3, 6, dtype=np.int32)[:, None]
    starts = np.zeros((6, 256), dtype=np.int32)
    starts[0] = 1
    starts[0, 0x80:0xC0] = 0
    return nxt, starts


_TRACKER = _escape_tracker()


@lru_cache(maxsize=256)
def _counted_chars(lo: int, hi: int | None, open_quote: bool, close_quote: bool) -> Automaton:
    """Canonical JSON string bodies of ``lo`` to ``hi`` characters (``hi=None``: at least ``lo``), after an
    opening quote and before a closing one when asked, as a minimal byte DFA.

    Built directly rather than by determinising ``"`` (char){lo,hi} ``"``: a character's encoding is a prefix
    code (its minimal automaton accepts in one state with no edge out), so the counted language is that
    automaton copied once per count, each copy's accepting state being the next copy's start. The copies are
    told apart by the characters left to read, so the chain is minimal as built; it is only numbered breadth
    first, as :meth:`~constrain.automata.dfa.ByteDFA.reduced` numbers states. A 255-character bound (3,572 states)
    takes a few milliseconds instead of a dozen. Shared per process (the same bounds recur), as an
    :class:`~constrain.grammar.ir.Automaton` whose key is hashed once."""
    char = terminal_dfa(_CHAR)
    (accept,) = np.flatnonzero(char.accepting)
    inner = np.delete(np.arange(char.num_states), accept)  # a copy's states: all but the accepting one
    local = np.full(char.num_states, DEAD, dtype=np.int32)
    local[inner] = np.arange(len(inner), dtype=np.int32)
    width = len(inner)
    body = char.trans[inner]
    # One copy, its targets relative to its own first row; the accepting state becomes the next copy's start.
    template = np.where(body < 0, DEAD, np.where(body == accept, width, local[np.maximum(body, 0)]))
    # Unbounded: after `lo` characters, one more state, accepting, that reads like the last copy's start (the
    # last copy's inner states then serve both); with `lo` = 0, one copy that leads back to its own start.
    copies = hi if hi is not None else max(lo, 1)
    first = 1 if open_quote else 0
    end = first + copies * width  # the state after `copies` characters (unless a copy loops)
    rows = end + (0 if hi is None and lo == 0 else 1) + (1 if close_quote else 0)
    trans = np.full((rows, 256), DEAD, dtype=np.int32)
    offsets = first + width * np.arange(copies, dtype=np.int32)
    trans[first:end] = np.where(template >= 0, template[None] + offsets[:, None, None], DEAD).reshape(-1, 256)
    if hi is None and lo == 0:
        trans[first:end][template == width] = first
        starts = np.array([first])
    elif hi is None:
        trans[end] = trans[offsets[-1]]  # the last copy's characters already end at `end`
        starts = np.array([end])
    else:
        starts = first + width * np.arange(lo, hi + 1)  # after a whole count of characters
    accepting = np.zeros(rows, dtype=bool)
    if close_quote:
        trans[starts, ord('"')] = rows - 1  # a character never starts with a bare quote
        accepting[rows - 1] = True
    else:
        accepting[starts] = True
    if open_quote:
        trans[0, ord('"')] = first
    return Automaton(ByteDFA(trans, accepting).numbered_breadth_first())


def _counted_dfa(d: _CDFA, lo: int, hi: int | None, quoted: bool = False) -> ByteDFA:
    """The canonical JSON string bodies (between double quotes when ``quoted``) that decode to a string of ``d``
    with ``lo`` to ``hi`` code points (``hi=None``: at least ``lo``), as a minimal byte DFA.

    Built once at the byte level rather than as a product over code points written back as blocks: the body
    automaton of ``d`` runs beside :data:`_TRACKER`, which says which bytes begin a character, and a counter
    0..K (saturating at K when unbounded) is laid over the pairs as one numpy table; the numba minimiser then
    folds it. Raises _TooLarge past :data:`MAX_COUNTED_STATES` states before minimising."""
    body = d.encode_json().to_byte_dfa()
    track_next, track_starts = _TRACKER
    # the reachable (body state, tracker state) pairs, numbered from the start; a pair is coded e * 6 + t
    index = {0: 0}
    order = [(0, 0)]
    rows: list[np.ndarray] = []
    for e, t in order:
        row_e = body.trans[e]
        codes, where = np.unique(np.where(row_e >= 0, row_e * 6 + track_next[t], DEAD), return_inverse=True)
        ids = np.empty(len(codes), dtype=np.int32)
        for j, code in enumerate(codes.tolist()):
            if code >= 0 and code not in index:
                index[code] = len(order)
                order.append(divmod(code, 6))
            ids[j] = index[code] if code >= 0 else DEAD
        rows.append(ids[where])
    n = len(order)
    k = hi if hi is not None else lo
    if (k + 1) * n + 2 > MAX_COUNTED_STATES:
        raise _TooLarge("counted product")
    check_deadline()
    pairs = np.array(order, dtype=np.int32)
    trans = np.stack(rows)
    starts = track_starts[pairs[:, 1]]  # (n, 256)
    counts = np.arange(k + 1, dtype=np.int32)[:, None, None] + starts[None]
    if hi is None:
        np.minimum(counts, k, out=counts)
    first = 1 if quoted else 0  # a quoted automaton starts on a state of its own that reads the opening quote
    ok = (trans[None] >= 0) & (counts <= k)
    table = np.where(ok, first + counts * n + trans[None], DEAD).astype(np.int32).reshape(-1, 256)
    final = (body.accepting[pairs[:, 0]][None] & (np.arange(k + 1) >= lo)[:, None]).reshape(-1)
    if quoted:
        total = table.shape[0] + 2
        closed = np.full((total, 256), DEAD, dtype=np.int32)
        closed[1:-1] = table
        closed[0, 0x22] = 1
        assert not (table[final, 0x22] >= 0).any()  # a body reads '"' only inside an escape, never where it ends
        closed[1:-1][final, 0x22] = total - 1
        accepting = np.zeros(total, dtype=np.bool_)
        accepting[-1] = True
        table, final = closed, accepting
    return ByteDFA(table, final).reduced()


class _StringKey(NamedTuple):
    """A string's constraints on its decoded text: the patterns it matches and does not, the formats it has and
    has not (by name), the values it may not take."""

    patterns: tuple[str, ...]
    formats: tuple[str, ...]
    excluded: tuple[str, ...]
    neg_patterns: tuple[str, ...]
    neg_formats: tuple[str, ...]


class _StringOutcome(Enum):
    """Why :func:`_string_automaton` gave no automaton; the compiler reports it at its own pointers."""

    EMPTY = "no string satisfies the patterns and formats"
    EMPTY_AT_LENGTHS = "no string of the allowed lengths does"
    TOO_LARGE = "the constraints need too large an automaton"
    NEEDS_BLOCKS = "with the length bound, one automaton would be too large"


@lru_cache(maxsize=1024)
def _searched(pattern: str) -> _CDFA:
    """Strings in which ``pattern`` matches somewhere, minimal; raises RegexError or _TooLarge. Shared per
    process: a few patterns (identifiers, hex ids, versions) recur across most schemas."""
    return _CDFA.from_regex(f"(?s:.)*(?:{pattern})(?s:.)*").minimized()


@lru_cache(maxsize=1024)
def _string_language(key: _StringKey) -> _CDFA | None:
    """The decoded strings ``key`` allows, minimal (None: too large). The patterns must be supported (their
    :func:`_searched` succeeds)."""
    d = _CDFA.universal()
    try:
        for pattern in key.patterns:
            d = d.intersect(_searched(pattern)).minimized()
        for name in key.formats:
            d = d.intersect(_format_language(name)).minimized()
        if key.excluded:
            d = d.minus(_CDFA.literals(key.excluded)).minimized()
        for pattern in key.neg_patterns:
            d = d.minus(_searched(pattern)).minimized()
        for name in key.neg_formats:
            d = d.minus(_format_language(name)).minimized()
    except _TooLarge:
        return None
    return d


@lru_cache(maxsize=64)
def _format_language(name: str) -> _CDFA:
    return _CDFA.from_regex(_FORMATS[name])


#: String automata by (constraints, lengths), shared by every schema compiled in this process.
_STRING_AUTOMATA = BoundedCache(64 * 1024 * 1024)


def _string_automaton(key: _StringKey, lo: int, hi: int | None) -> Automaton | _StringOutcome:
    """The JSON strings (quotes included) whose decoded text ``key`` allows with ``lo`` to ``hi`` code points, as
    one grammar automaton, or why there is none. Built once per process for each constraint set."""
    cache_key = (key, lo, hi)
    found = _STRING_AUTOMATA.get(cache_key)
    if found is None:
        found = _build_string_automaton(key, lo, hi)
        nbytes = found.dfa.trans.nbytes if isinstance(found, Automaton) else 64
        _STRING_AUTOMATA.put(cache_key, found, nbytes)
    return found


def _build_string_automaton(key: _StringKey, lo: int, hi: int | None) -> Automaton | _StringOutcome:
    d = _string_language(key)
    if d is None:
        return _StringOutcome.TOO_LARGE
    if d.is_empty():
        return _StringOutcome.EMPTY
    if lo > 0 or hi is not None:
        shortest, longest = d.length_range()
        if shortest >= lo and (hi is None or (longest is not None and longest <= hi)):
            return _string_automaton(key, 0, None)  # the lengths are redundant
        try:
            counted = _counted_dfa(d, lo, hi, quoted=True)
        except _TooLarge:
            return _StringOutcome.NEEDS_BLOCKS
        if counted.is_empty:
            return _StringOutcome.EMPTY_AT_LENGTHS
        if counted.num_states > MAX_COUNTED_BYTE_STATES:
            return _StringOutcome.NEEDS_BLOCKS
        return Automaton(counted)
    try:
        return _automaton_of(d.encode_json().minimized(), quoted=True)
    except _TooLarge:
        return _StringOutcome.TOO_LARGE


def _automaton_of(d: _CDFA, quoted: bool = False, budget: int = MAX_BYTE_STATES) -> Automaton:
    """The language of ``d`` as a grammar automaton (quoted: a JSON string); raises _TooLarge when empty or past
    ``budget`` byte states."""
    dfa = d.to_byte_dfa(quoted)
    if dfa.is_empty:
        raise _TooLarge("empty")
    if dfa.num_states > budget:
        raise _TooLarge("states")
    return Automaton(dfa)


def _subtract_specials(lo: int, hi: int) -> list[tuple[int, int]]:
    out = []
    for a, b in ((0x20, 0x21), (0x23, 0x5B), (0x5D, 0x10FFFF)):
        x, y = max(lo, a), min(hi, b)
        if x <= y:
            out.append((x, y))
    return out


def _runs(row: np.ndarray, first: int) -> list[tuple[int, int, int]]:
    """Maximal runs of equal non-negative targets in ``row`` (indices offset by ``first``)."""
    out = []
    n = len(row)
    i = 0
    while i < n:
        t = int(row[i])
        j = i
        while j + 1 < n and row[j + 1] == t:
            j += 1
        if t >= 0:
            out.append((first + i, first + j, t))
        i = j + 1
    return out


def _cdfa_from_bytes(trans: np.ndarray, accepting: np.ndarray) -> _CDFA:
    """Collapse a byte DFA that reads valid UTF-8 into a DFA over code points."""
    memo: dict[tuple[int, int], list[tuple[int, int, int]]] = {}
    index = {0: 0}
    order = [0]
    edges: list[list[tuple[int, int, int]]] = []
    i = 0
    while i < len(order):
        s = order[i]
        out = list(_runs(trans[s, 0:0x80], 0))
        for lead in range(0xC2, 0xF5):
            t1 = int(trans[s, lead])
            if t1 < 0:
                continue
            k = 1 if lead < 0xE0 else 2 if lead < 0xF0 else 3
            base = (lead & (0x1F, 0x0F, 0x07)[k - 1]) << (6 * k)
            out.extend((base + a, base + b, t) for a, b, t in _continuations(trans, t1, k, memo))
        merged = []
        for lo, hi, t in _merge_edges(out):
            j = index.get(t)
            if j is None:
                j = index[t] = len(order)
                order.append(t)
            merged.append((lo, hi, j))
        edges.append(merged)
        i += 1
    return _CDFA(edges, [bool(accepting[s]) for s in order])


def _continuations(
    trans: np.ndarray, state: int, k: int, memo: dict[tuple[int, int], list[tuple[int, int, int]]]
) -> list[tuple[int, int, int]]:
    """The code-point edges ``(lo, hi, target)`` of the ``k`` continuation bytes read from ``state``, the value
    their bits make (memoised in ``memo`` per state and count)."""
    key = (state, k)
    if key in memo:
        return memo[key]
    out: list[tuple[int, int, int]] = []
    size = 64 ** (k - 1)
    for a, b, t in _runs(trans[state, 0x80:0xC0], 0):
        if k == 1:
            out.append((a, b, t))
            continue
        sub = _continuations(trans, t, k - 1, memo)
        if len(sub) == 1 and sub[0][0] == 0 and sub[0][1] == size - 1:
            out.append((a * size, (b + 1) * size - 1, sub[0][2]))
        else:
            for c in range(a, b + 1):
                out.extend((c * size + x, c * size + y, u) for x, y, u in sub)
    memo[key] = _merge_edges(out)
    return memo[key]


def _merge_edges(edges: list[tuple[int, int, int]]) -> list[tuple[int, int, int]]:
    edges = sorted(edges)
    out: list[tuple[int, int, int]] = []
    for lo, hi, t in edges:
        if out and out[-1][2] == t and out[-1][1] + 1 == lo:
            out[-1] = (out[-1][0], hi, t)
        else:
            out.append((lo, hi, t))
    return out


def _product(a: _CDFA, b: _CDFA, minus: bool) -> _CDFA:
    index = {(0, 0): 0}
    order = [(0, 0)]
    edges: list[list[tuple[int, int, int]]] = []
    accept: list[bool] = []
    i = 0
    while i < len(order):
        sa, sb = order[i]
        if len(order) > MAX_AUTOMATON_STATES * 4:
            raise _TooLarge("product automaton")
        if i % 256 == 0:
            _check_time()
        eb = b.edges[sb] if sb >= 0 else []
        out = []
        j = 0
        for lo, hi, ta in a.edges[sa]:
            pos = lo
            while j < len(eb) and eb[j][1] < lo:
                j += 1
            k = j
            while k < len(eb) and eb[k][0] <= hi:
                blo, bhi, tb = eb[k]
                if minus and blo > pos:
                    out.append((pos, blo - 1, (ta, -1)))
                x, y = max(lo, blo), min(hi, bhi)
                if x <= y:
                    out.append((x, y, (ta, tb)))
                pos = max(pos, bhi + 1)
                if bhi > hi:
                    break
                k += 1
            if minus and pos <= hi:
                out.append((pos, hi, (ta, -1)))
        row = []
        for lo, hi, pair in out:
            t = index.get(pair)
            if t is None:
                t = index[pair] = len(order)
                order.append(pair)
            row.append((lo, hi, t))
        edges.append(_merge_edges(row))
        acc_b = sb >= 0 and b.accept[sb]
        accept.append(a.accept[sa] and (not acc_b if minus else acc_b))
        i += 1
    return _CDFA(edges, accept)


def _minimize(d: _CDFA) -> _CDFA:
    # reachable from the start
    seen = {0}
    stack = [0]
    while stack:
        s = stack.pop()
        for _, _, t in d.edges[s]:
            if t not in seen:
                seen.add(t)
                stack.append(t)
    # co-reachable
    rev: dict[int, list[int]] = defaultdict(list)
    for s in seen:
        for _, _, t in d.edges[s]:
            rev[t].append(s)
    alive = {s for s in seen if d.accept[s]}
    stack = list(alive)
    while stack:
        s = stack.pop()
        for p in rev[s]:
            if p not in alive:
                alive.add(p)
                stack.append(p)
    if 0 not in alive:
        return _CDFA.empty()
    states = sorted(alive)
    pos = {s: i for i, s in enumerate(states)}
    bounds = sorted(
        {lo for s in states for lo, _, t in d.edges[s] if t in alive}
        | {hi + 1 for s in states for _, hi, t in d.edges[s] if t in alive}
    )
    m = max(len(bounds) - 1, 0)
    rows = [[-1] * max(m, 1) for _ in states]  # lists: slice assignment in numpy costs a microsecond per edge
    for s in states:
        row = rows[pos[s]]
        for lo, hi, t in d.edges[s]:
            if t in alive:
                a = bisect_right(bounds, lo) - 1
                b = bisect_right(bounds, hi + 1) - 1
                row[a:b] = [pos[t]] * (b - a)
    check_deadline()
    table = np.array(rows, dtype=np.int32)
    columns = np.ascontiguousarray(table[:, column_classes(table)[0]])  # identical columns refine alike
    block_of = partial_dfa_blocks(columns, np.array([d.accept[s] for s in states], dtype=np.bool_)).tolist()
    # renumber blocks in BFS order from the start
    start_block = block_of[pos[0]]
    number = {start_block: 0}
    queue = [start_block]
    rep: dict[int, int] = {}
    for i, b in enumerate(block_of):
        rep.setdefault(b, i)
    edges: list[list[tuple[int, int, int]]] = []
    accept: list[bool] = []
    qi = 0
    while qi < len(queue):
        r = rep[queue[qi]]
        qi += 1
        row = []
        for c, t in enumerate(rows[r][:m]):
            if t < 0:
                continue
            target = number.get(block_of[t])
            if target is None:
                target = number[block_of[t]] = len(queue)
                queue.append(block_of[t])
            row.append((bounds[c], bounds[c + 1] - 1, target))
        edges.append(_merge_edges(row))
        accept.append(bool(d.accept[states[r]]))
    return _CDFA(edges, accept)


def _eliminate(d: _CDFA, budget: int) -> tuple | None:
    """State elimination: a regex AST for the language of ``d`` (None when empty); raises _TooLarge past
    ``budget`` characters."""
    n = d.n
    start, final = n, n + 1
    label: dict[tuple[int, int], tuple] = {}
    succ: dict[int, set[int]] = defaultdict(set)
    pred: dict[int, set[int]] = defaultdict(set)

    def add(p: int, q: int, node: tuple) -> None:
        new = _r_alt(label.get((p, q)), node)
        if new[1] > budget:
            raise _TooLarge("regex")
        if len(label) % 256 == 0:
            _check_time()
        label[(p, q)] = new
        succ[p].add(q)
        pred[q].add(p)

    for s in range(n):
        by_target: dict[int, list[tuple[int, int]]] = defaultdict(list)
        for lo, hi, t in d.edges[s]:
            by_target[t].append((lo, hi))
        for t, ranges in by_target.items():
            add(s, t, _r_set(_merge_ranges(ranges)))
        if d.accept[s]:
            add(s, final, _EPS)
    add(start, 0, _EPS)
    remaining = set(range(n))
    while remaining:
        s = min(remaining, key=lambda x: (len(pred[x] - {x}) * len(succ[x] - {x}), -x))
        remaining.discard(s)
        loop = label.pop((s, s), None)
        middle = _r_star(loop) if loop is not None else _EPS
        ins = [p for p in pred[s] if p != s]
        outs = [q for q in succ[s] if q != s]
        for p in ins:
            for q in outs:
                add(p, q, _r_cat(label[(p, s)], middle, label[(s, q)]))
        for p in ins:
            label.pop((p, s), None)
            succ[p].discard(s)
        for q in outs:
            label.pop((s, q), None)
            pred[q].discard(s)
        pred.pop(s, None)
        succ.pop(s, None)
    return label.get((start, final))


# ==============================================================================================================
# Numbers: canonical decimal literals in ranges, digit by digit


def _digits_ge(s: str) -> str:
    """Regex for digit strings of length len(s) that are >= s."""
    if not s:
        return ""
    if set(s) == {"0"}:
        return f"[0-9]{{{len(s)}}}"
    head, rest = s[0], s[1:]
    options = [re.escape(head) + _digits_ge(rest)]
    if head != "9":
        options.append(f"[{int(head) + 1}-9]" + (f"[0-9]{{{len(rest)}}}" if rest else ""))
    return "(?:" + "|".join(options) + ")"


def _digits_le(s: str) -> str:
    if not s:
        return ""
    if set(s) == {"9"}:
        return f"[0-9]{{{len(s)}}}"
    head, rest = s[0], s[1:]
    options = [head + _digits_le(rest)]
    if head != "0":
        options.append(f"[0-{int(head) - 1}]" + (f"[0-9]{{{len(rest)}}}" if rest else ""))
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


@lru_cache(maxsize=4096)
def _fraction_digits(lo: str | None, lo_strict: bool, hi: str | None, hi_strict: bool) -> tuple[bool, str | None]:
    """Digit strings D (after the point) with lo <(=) 0.D <(=) hi, as (D may be empty, regex for nonempty D).

    ``lo``/``hi`` are digit strings (the value 0.lo), None for no bound."""
    if lo is not None:
        lo = lo.rstrip("0")
        if lo == "" and not lo_strict:
            lo = None
    if hi is not None:
        hi = hi.rstrip("0")
    if lo is None and hi is None:
        return True, "[0-9]+"
    if hi == "":
        if hi_strict or lo is not None:
            return False, None
        return True, "0+"
    if lo == "" and hi is None:
        return False, "[0-9]*[1-9][0-9]*"
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
    options = []
    for (nlo, nhi), digits in groups.items():
        sub_empty, sub = _fraction_digits(nlo, lo_strict, nhi, hi_strict)
        if sub is None and not sub_empty:
            continue
        rest = "" if sub is None else (f"(?:{sub})?" if sub_empty else f"(?:{sub})")
        cls = str(digits[0]) if len(digits) == 1 else f"[{''.join(map(str, digits))}]"
        options.append(cls + rest)
    if not options:
        return empty_ok, None
    return empty_ok, "|".join(options)


def _frac_part(lo: str | None, lo_strict: bool, hi: str | None, hi_strict: bool, nonint: bool) -> str | None:
    """Regex for the optional fraction part ``(\\.D)?`` given bounds on 0.D; None when impossible."""
    if nonint and (lo is None or lo.rstrip("0") == ""):
        lo, lo_strict = "", True
    empty_ok, rx = _fraction_digits(lo, lo_strict, hi, hi_strict)
    if rx is None:
        return "" if empty_ok else None
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
    return _CDFA([edges[i] for i in range(n)], [accept[i] for i in range(n)])


# ==============================================================================================================
# Formats: regexes over the decoded string. All accept only valid values (exact or a subset).

_DATE = (
    r"(?:[0-9]{4}-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12][0-9]|3[01])|(?:0[469]|11)-(?:0[1-9]|[12][0-9]|30)"
    r"|02-(?:0[1-9]|1[0-9]|2[0-8]))|(?:[0-9]{2}(?:0[48]|[2468][048]|[13579][26])|(?:[02468][048]|[13579][26])00)-02-29)"
)
_TIME = r"(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\.[0-9]+)?(?:[Zz]|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])"
_DUR_TIME = r"T(?:[0-9]+H(?:[0-9]+M(?:[0-9]+S)?)?|[0-9]+M(?:[0-9]+S)?|[0-9]+S)"
_DUR_DATE = r"(?:[0-9]+D|[0-9]+M(?:[0-9]+D)?|[0-9]+Y(?:[0-9]+M(?:[0-9]+D)?)?)"
_DURATION = f"P(?:{_DUR_DATE}(?:{_DUR_TIME})?|{_DUR_TIME}|[0-9]+W)"
# An LDH label of at most 48 characters, without "--" in positions 3-4 (so never an IDNA "xn--" label, whose
# validity depends on Punycode decoding).
_LABEL = (
    r"[A-Za-z0-9](?:[A-Za-z0-9]|[A-Za-z0-9-][A-Za-z0-9]|[A-Za-z0-9-]{2}[A-Za-z0-9]"
    r"|[A-Za-z0-9-](?:[A-Za-z0-9][A-Za-z0-9-]|-[A-Za-z0-9])[A-Za-z0-9-]{0,43}[A-Za-z0-9])?"
)
_HOSTNAME = f"{_LABEL}(?:\\.{_LABEL}){{0,4}}"
_LDH = r"[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?"
_ATEXT = r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]"
_OCTET = r"(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
_IPV4 = f"{_OCTET}(?:\\.{_OCTET}){{3}}"


def _ipv6() -> str:
    h = "[0-9A-Fa-f]{1,4}"
    ls32 = f"(?:{h}:{h}|{_IPV4})"
    forms = [f"(?:{h}:){{6}}{ls32}", f"::(?:{h}:){{5}}{ls32}"]
    tails = {4: f"(?:{h}:){{4}}{ls32}", 3: f"(?:{h}:){{3}}{ls32}", 2: f"(?:{h}:){{2}}{ls32}", 1: f"{h}:{ls32}", 0: ls32}
    for before, tail in ((0, tails[4]), (1, tails[3]), (2, tails[2]), (3, tails[1]), (4, tails[0])):
        head = h if before == 0 else f"(?:{h}:){{0,{before}}}{h}"
        forms.append(f"(?:{head})?::{tail}")
    forms.append(f"(?:(?:{h}:){{0,5}}{h})?::{h}")
    forms.append(f"(?:(?:{h}:){{0,6}}{h})?::")
    return "(?:" + "|".join(forms) + ")"


_IPV6 = _ipv6()
_IPV4_TEXT, _IPV6_TEXT = _IPV4, _IPV6
_QUOTED_LOCAL = r'"(?:[ !#-\[\]-~]|\\[ -~])*"'
_EMAIL = (
    f"(?:{_ATEXT}+(?:\\.{_ATEXT}+)*|{_QUOTED_LOCAL})"
    f"@(?:{_LDH}(?:\\.{_LDH})*|\\[{_IPV4_TEXT}\\]|\\[IPv6:{_IPV6_TEXT}\\])"
)
_UUID = r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
_PCT = "%[0-9A-Fa-f]{2}"
_PCHAR = f"(?:[A-Za-z0-9._~!$&'()*+,;=:@-]|{_PCT})"
_SEG_NC = f"(?:[A-Za-z0-9._~!$&'()*+,;=@-]|{_PCT})"
_AUTHORITY = (
    f"(?:(?:[A-Za-z0-9._~!$&'()*+,;=:-]|{_PCT})*@)?"
    f"(?:\\[{_IPV6}\\]|{_IPV4}|(?:[A-Za-z0-9._~!$&'()*+,;=-]|{_PCT})*)(?::[0-9]*)?"
)
_PATH_ABEMPTY = f"(?:/{_PCHAR}*)*"
_QUERY_FRAGMENT = f"(?:\\?(?:{_PCHAR}|[/?])*)?(?:#(?:{_PCHAR}|[/?])*)?"
_HIER = f"(?://{_AUTHORITY}{_PATH_ABEMPTY}|/(?:{_PCHAR}+{_PATH_ABEMPTY})?|{_PCHAR}+{_PATH_ABEMPTY}|)"
_URI = f"[A-Za-z][A-Za-z0-9+.-]*:{_HIER}{_QUERY_FRAGMENT}"
_RELATIVE = (
    f"(?://{_AUTHORITY}{_PATH_ABEMPTY}|/(?:{_PCHAR}+{_PATH_ABEMPTY})?|{_SEG_NC}+{_PATH_ABEMPTY}|){_QUERY_FRAGMENT}"
)
_URI_REFERENCE = f"(?:{_URI}|{_RELATIVE})"
_VARCHAR = f"(?:[A-Za-z0-9_]|{_PCT})"
_VARSPEC = f"{_VARCHAR}(?:\\.?{_VARCHAR})*(?::[1-9][0-9]{{0,3}}|\\*)?"
# RFC 6570 literals: ASCII %x21 / %x23-24 / %x26 / %x28-3B / %x3D / %x3F-5B / %x5D / %x5F / %x61-7A / %x7E, and
# RFC 3987 ucschar / iprivate (written as a negated class: the regex parser materialises classes as sets).
_TEMPLATE_LITERAL = _class_text(
    _merge_ranges(
        [
            (0x21, 0x21),
            (0x23, 0x24),
            (0x26, 0x26),
            (0x28, 0x3B),
            (0x3D, 0x3D),
            (0x3F, 0x5B),
            (0x5D, 0x5D),
            (0x5F, 0x5F),
            (0x61, 0x7A),
            (0x7E, 0x7E),
            (0xA0, 0xD7FF),
            (0xE000, 0xFDCF),
            (0xFDF0, 0xFFEF),
        ]
        + [(plane << 16, (plane << 16) + 0xFFFD) for plane in range(1, 14)]
        + [(0xE1000, 0xEFFFD), (0xF0000, 0xFFFFD), (0x100000, 0x10FFFD)]
    )
)
_URI_TEMPLATE = f"(?:{_TEMPLATE_LITERAL}|{_PCT}|\\{{[+#./;?&]?{_VARSPEC}(?:,{_VARSPEC})*\\}})*"
_JSON_POINTER = r"(?:/(?:[^~/]|~[01])*)*"
_RELATIVE_JSON_POINTER = f"(?:0|[1-9][0-9]*)(?:#|{_JSON_POINTER})"

_FORMATS = {
    "date": _DATE,
    "time": _TIME,
    "date-time": f"{_DATE}[Tt]{_TIME}",
    "duration": _DURATION,
    "email": _EMAIL,
    "hostname": _HOSTNAME,
    "ipv4": _IPV4,
    "ipv6": _IPV6,
    "uuid": _UUID,
    "uri": _URI,
    "uri-reference": _URI_REFERENCE,
    "uri-template": _URI_TEMPLATE,
    "json-pointer": _JSON_POINTER,
    "relative-json-pointer": _RELATIVE_JSON_POINTER,
}
#: Formats whose characters never need a JSON escape (their regex is also the encoded language).
_ENCODED_QUOTED = r'\\"(?:[ !#-\[\]-~]|\\\\(?:[ !#-\[\]-~]|\\"|\\\\))*\\"'
_ENCODED_POINTER = f'(?:/(?:[^~/"\\\\\\x00-\\x1f]|{_ESCAPE}|~[01])*)*'
#: The formats as regexes over the encoded string body (what appears between the quotes), for the direct path.
_FORMATS_ENCODED = {
    **_FORMATS,
    "email": _EMAIL.replace(_QUOTED_LOCAL, _ENCODED_QUOTED),
    "json-pointer": _ENCODED_POINTER,
    "relative-json-pointer": f"(?:0|[1-9][0-9]*)(?:#|{_ENCODED_POINTER})",
}
_UNSUPPORTED_FORMATS = {"idn-email", "idn-hostname", "iri", "iri-reference", "regex"}


# ==============================================================================================================
# Keyword tables

_ANNOTATIONS = frozenset(
    {
        "title", "description", "default", "examples", "example", "$comment", "deprecated", "readOnly", "writeOnly",
        "contentMediaType", "contentEncoding", "contentSchema", "$schema", "$id", "id", "$anchor", "$dynamicAnchor",
        "$recursiveAnchor", "$vocabulary", "$defs", "definitions",
    }
)  # fmt: skip
#: Keywords handled here (whether the schema's draft has them is checked against its validator).
_VALIDATION = frozenset(
    {
        "type", "enum", "const", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf",
        "minLength", "maxLength", "pattern", "format", "items", "prefixItems", "additionalItems", "minItems",
        "maxItems", "uniqueItems", "contains", "minContains", "maxContains", "unevaluatedItems", "properties",
        "patternProperties", "additionalProperties", "required", "propertyNames", "minProperties", "maxProperties",
        "unevaluatedProperties", "dependentRequired", "dependentSchemas", "dependencies", "allOf", "anyOf", "oneOf",
        "not", "if", "then", "else", "$ref", "$dynamicRef", "$recursiveRef",
    }
)  # fmt: skip
#: Validation keywords of draft-03 only (refused: never implemented here, ignored by later drafts' validators).
_DRAFT3_ONLY = frozenset({"divisibleBy", "disallow", "extends"})
#: Keywords that live inside another keyword's evaluation (not in a validator's own table).
_DEPENDENT_KEYWORDS = {"then": "if", "else": "if", "minContains": "contains", "maxContains": "contains"}
_ARRAY_KEYWORDS = frozenset(
    {"items", "prefixItems", "additionalItems", "contains", "minContains", "maxContains", "unevaluatedItems"}
)
_OBJECT_KEYWORDS = frozenset(
    {"properties", "patternProperties", "additionalProperties", "propertyNames", "unevaluatedProperties"}
)
#: The keywords :meth:`_Compiler.normalise` expands into more conjuncts.
_EXPANDED = frozenset({"$ptr", "$ref", "$dynamicRef", "$recursiveRef", "allOf"})
#: The values of ``type`` whose subschemas need no structure of their own.
_SCALAR_TYPES = frozenset({"null", "boolean", "integer", "number", "string"})
_BRANCHING = ("anyOf", "oneOf", "not", "if", "dependentRequired", "dependentSchemas", "dependencies")
_NEGATABLE = frozenset(
    {
        "type", "enum", "const", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "minLength",
        "maxLength", "pattern", "format", "minItems", "maxItems", "minProperties", "maxProperties", "multipleOf",
    }
)  # fmt: skip
_NUMERIC_KW = frozenset({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"})
_GROUPS = {
    "null": frozenset({"null"}), "boolean": frozenset({"boolean"}), "number": frozenset({"int", "frac"}),
    "string": frozenset({"string"}), "array": frozenset({"array"}), "object": frozenset({"object"}),
}  # fmt: skip
_KEYWORD_GROUP = {
    **{k: "number" for k in _NUMERIC_KW},
    **{k: "string" for k in ("minLength", "maxLength", "pattern", "format")},
    **{k: "array" for k in ("items", "prefixItems", "additionalItems", "contains", "minContains", "maxContains",
                            "minItems", "maxItems", "uniqueItems", "unevaluatedItems")},
    **{k: "object" for k in ("properties", "required", "additionalProperties", "patternProperties", "propertyNames",
                             "minProperties", "maxProperties", "dependentRequired", "dependentSchemas",
                             "dependencies", "unevaluatedProperties")},
}  # fmt: skip
_STRING_KW = frozenset({"minLength", "maxLength", "pattern", "format"})
_FAMILY = {
    **{k: {"int", "frac"} for k in _NUMERIC_KW},
    **{k: {"string"} for k in _STRING_KW},
    "minItems": {"array"},
    "maxItems": {"array"},
    "minProperties": {"object"},
    "maxProperties": {"object"},
    "required": {"object"},
}


def _escape_token(token: str) -> str:
    return token.replace("~", "~0").replace("/", "~1")


def _clean_pointer(ptr: str) -> str:
    """A pointer for messages: synthetic steps (``/~sN``) removed."""
    return re.sub(r"/~s\d+(?:/[^/]*)*?(?=/~s|$)", "", ptr) if "/~s" in ptr else ptr


class _Part(NamedTuple):
    """One conjunct of a schema being compiled: the (sub)schema at ``ptr`` minus the keywords in ``skip``
    (already turned into structure), or, when ``neg`` is set, the negation of one of its keywords."""

    ptr: str
    skip: frozenset = frozenset()
    neg: tuple | None = None


_UNSAT = object()


class _NotNegatable(Exception):
    """A schema whose negation (or an exclusive oneOf) cannot be written exactly."""


def _disjoint(a: dict, b: dict) -> bool:
    if a.get("empty") or b.get("empty"):
        return True
    common = a["kinds"] & b["kinds"]
    if not common:
        return True
    if a["values"] is not None and b["values"] is not None and not (set(a["values"]) & set(b["values"])):
        return True
    if common <= {"object"}:
        for name in a["required"] & b["required"]:
            if name in a["props"] and name in b["props"] and not (set(a["props"][name]) & set(b["props"][name])):
                return True
        for x, y in ((a, b), (b, a)):
            if x["required"] & y["forbidden"]:
                return True
            if y.get("closed") and x["required"] - y.get("declared", set()):
                return True
    return False


# ==============================================================================================================
# The document: validation, pointers and $ref resolution

#: The keywords that name a resource or an anchor, per referencing specification.
_NAMING_KEYWORDS = {
    "draft-03": ("id",), "draft-04": ("id",), "draft-06": ("$id",), "draft-07": ("$id",),
    "draft2019-09": ("$id", "$anchor"), "draft2020-12": ("$id", "$anchor", "$dynamicAnchor"),
}  # fmt: skip


#: What a crawl of the document registers (every draft's spellings): anchors anywhere; below the root (whose id
#: is the base URI anyway), ids and embedded dialects, as strings ("id" is also a common property name).
_ANCHOR_KEYWORDS = ("$anchor", "$dynamicAnchor", "$recursiveAnchor")
_ID_KEYWORDS = ("id", "$id", "$schema")
#: Keywords whose value is data, not a schema: no reference lands inside one that is not an object.
_VALUE_KEYWORDS = frozenset(("enum", "const", "default", "examples", "example"))


#: A key that may name a resource (with a string value) or an anchor, as ``json.dumps`` writes it. Inside a string
#: every quote is escaped, so these occur in a document's text only as keys (or as keys inside data values).
_NAMING_TEXT = re.compile(r'"(?:\$id|id|\$schema)": "|"\$(?:anchor|dynamicAnchor|recursiveAnchor)": ')


def _names_resources(schema: Any) -> bool:
    """Whether an object below the root could name a resource or an anchor (an id, a ``$schema``, an anchor):
    what only a crawl of the document registers. The document's text answers at once when it holds no such key
    but the root's own ids (most schemas); otherwise the objects are walked."""
    if isinstance(schema, Mapping):
        try:
            found = len(_NAMING_TEXT.findall(json.dumps(schema)))
        except (TypeError, ValueError):  # not plain JSON data: walk it
            found = -1
        if found == sum(isinstance(schema.get(key), str) for key in _ID_KEYWORDS):
            return False
    stack = [(schema, True)]
    while stack:
        node, root = stack.pop()
        if isinstance(node, Mapping):
            if any(key in node for key in _ANCHOR_KEYWORDS):
                return True
            if not root and any(isinstance(node.get(key), str) for key in _ID_KEYWORDS):
                return True
            stack.extend(
                (value, False)
                for key, value in node.items()
                if isinstance(value, (Mapping, list)) and (key not in _VALUE_KEYWORDS or isinstance(value, Mapping))
            )
        elif isinstance(node, list):
            stack.extend((value, False) for value in node if isinstance(value, (Mapping, list)))
    return False


def _total_specification(spec: Any, embedded: list[tuple[Mapping, str]]) -> Any:
    """``spec`` (a ``referencing`` JSON Schema specification) made total over the schemas met here.

    referencing 0.37 reads ``id``/``$id`` and anchors as strings of a JSON object, and its walks break that:
    resolving a JSON pointer through ``items`` or ``dependencies`` asks for the id of every object further down
    the path, such as a ``properties`` object whose ``id`` entry is a property's schema (an AttributeError on
    ``dict.startswith``); crawling an embedded draft-04 subschema (its own ``$schema`` in a draft-07 document)
    meets its boolean subschemas (a TypeError); and the draft-04 to 07 crawl takes every ``dependencies`` value
    after a schema for a subschema, lists of property names too. Here only a string names a resource or an
    anchor, only objects are crawled (booleans and lists name nothing), and a subschema with its own ``$schema``
    is appended to ``embedded`` (with this specification's name) instead: referencing would crawl it with its
    own, partial specification for that dialect.
    """
    import referencing

    keys = _NAMING_KEYWORDS[spec.name]

    def named(contents: Any) -> bool:
        return isinstance(contents, Mapping) and all(isinstance(contents.get(k, ""), str) for k in keys)

    def subresources_of(contents: Any) -> Iterator[Mapping]:
        if not isinstance(contents, Mapping):
            return
        for sub in spec.subresources_of(contents):
            if isinstance(sub, Mapping) and "$schema" in sub:
                embedded.append((sub, spec.name))
            elif isinstance(sub, Mapping):
                yield sub

    return referencing.Specification(
        name=spec.name,
        id_of=lambda contents: spec.id_of(contents) if named(contents) else None,
        subresources_of=subresources_of,
        anchors_in=lambda _spec, contents: spec.anchors_in(contents) if named(contents) else (),
        maybe_in_subresource=spec.maybe_in_subresource,
    )


class _Document:
    def __init__(self, schema: Any):
        import jsonschema
        import referencing
        import referencing.jsonschema as rj
        from jsonschema import validators

        if not isinstance(schema, (bool, Mapping)):
            raise JsonSchemaError(f"a schema must be a JSON object or a boolean, not {type(schema).__name__}")
        cls = validators.validator_for(schema, default=validators.Draft202012Validator)
        explicit = isinstance(schema, Mapping) and "$schema" in schema
        # check_schema without format assertions: patterns are ECMAScript regexes, which Python's re (what the
        # "regex" format checker uses) does not always parse; the regex compiler here judges them instead. The
        # fast walk answers for most schemas; when it is not sure, jsonschema decides and words the error.
        error = None
        if not certainly_valid(schema, cls.__name__.replace("Validator", "")):
            error = jsonschema.exceptions.best_match(cls(cls.META_SCHEMA).iter_errors(schema))
        if error is not None and not explicit:
            # No $schema: a draft-07 document (items as a list...) is read as draft-07.
            draft7 = validators.Draft7Validator
            if (
                certainly_valid(schema, "Draft7")
                or jsonschema.exceptions.best_match(draft7(draft7.META_SCHEMA).iter_errors(schema)) is None
            ):
                cls, error = draft7, None
        if error is not None:
            path = list(error.absolute_path)
            pointer = "".join("/" + _escape_token(str(p)) for p in path)
            keyword = str(path[-1]) if path else error.validator
            raise JsonSchemaError(f"not a valid JSON Schema: {error.message}", pointer, keyword)
        self.schema = schema
        self.cls = cls
        self.keywords = set(cls.VALIDATORS)
        if not explicit and cls is validators.Draft202012Validator:
            # "2020-12 plus draft-07 spellings": without a declared dialect, dependencies and additionalItems keep
            # their draft-07 meaning (definitions is resolved by pointer either way).
            self.keywords |= {"dependencies", "additionalItems"}
        dialects = {
            "Draft3Validator": rj.DRAFT3, "Draft4Validator": rj.DRAFT4, "Draft6Validator": rj.DRAFT6,
            "Draft7Validator": rj.DRAFT7, "Draft201909Validator": rj.DRAFT201909,
            "Draft202012Validator": rj.DRAFT202012,
        }  # fmt: skip
        self.draft = cls.__name__.replace("Validator", "")
        self.legacy = cls.__name__ in ("Draft3Validator", "Draft4Validator", "Draft6Validator", "Draft7Validator")
        self.draft4 = cls.__name__ in ("Draft3Validator", "Draft4Validator")
        embedded: list[tuple[Mapping, str]] = []
        self._embedded = embedded
        self._dialects = {spec.name: spec for spec in dialects.values()}
        self._specs: dict[str, Any] = {}
        self.spec = self.specification(dialects.get(cls.__name__, rj.DRAFT202012).name)
        self.base = self.spec.create_resource(schema).id() or ""
        self.names_resources = _names_resources(schema)
        self.bases: dict[str, str] = {"": self.base}
        if self.names_resources:
            self.registry = self._crawl(embedded)
        else:  # JSON pointers into the root are all its $refs can name: no crawl needed
            self.registry = referencing.Registry().with_resource(self.base, self.spec.create_resource(schema))
        self.root_resolver = self.registry.resolver(self.base)
        self.unresolvable = referencing.exceptions.Unresolvable
        self.nodes: dict[str, Any] = {"": schema}
        self.resolvers: dict[str, Any] = {"": self.root_resolver}
        self.synthetic: dict[str, Any] = {}
        self._validator = None
        #: Per (pointer, negated keyword): the schema a part means and its JSON text when it refers to nothing.
        self._standalone: dict[tuple[str, tuple | None], tuple[Any, str] | None] = {}
        #: Verdicts by (schema text, instance text), for parts that refer to nothing.
        self._verdicts: dict[tuple[str, str], bool] = {}

    def specification(self, name: str) -> Any:
        """The total specification (:func:`_total_specification`) of dialect ``name``, made when first needed:
        most documents use one dialect."""
        spec = self._specs.get(name)
        if spec is None:
            spec = self._specs[name] = _total_specification(self._dialects[name], self._embedded)
        return spec

    def _crawl(self, embedded: list[tuple[Mapping, str]]) -> Any:
        """The registry of the document's resources and anchors (what ``$ref`` URIs name).

        A subschema with its own ``$schema`` (which ``_total_specification`` leaves out) is crawled on its own,
        with the specification of the dialect it declares as referencing would, from the base URI around it;
        the registries are combined with the enclosing ones last, so the entry that crawl makes for that base URI
        when the subschema has no id of its own does not hide the resource the URI belongs to.
        """
        import referencing
        import referencing.jsonschema as rj

        registries = [referencing.Registry().with_resource(self.base, self.spec.create_resource(self.schema)).crawl()]
        while embedded:
            node, enclosing = embedded.pop()
            dialect = node["$schema"]
            declared = rj.specification_with(dialect, default=None) if isinstance(dialect, str) else None
            spec = self.specification(declared.name if declared is not None else enclosing)
            around = self.base_at(self.ptr_of[id(node)].rpartition("/")[0])
            registries.append(referencing.Registry().with_resource(around, spec.create_resource(node)).crawl())
        return registries[-1].combine(*reversed(registries[:-1]))

    @cached_property
    def ptr_of(self) -> dict[int, str]:
        """The pointer of every object in the document (values of enum/const/default/examples aside), by
        identity: where a reference that is not a plain pointer into the root lands. Made when first needed."""
        out: dict[int, str] = {}

        def walk(node: Any, ptr: str) -> None:
            if isinstance(node, Mapping):
                out.setdefault(id(node), ptr)
                for key, value in node.items():
                    if key in _VALUE_KEYWORDS and not isinstance(value, Mapping):
                        continue
                    walk(value, f"{ptr}/{_escape_token(str(key))}")
            elif isinstance(node, list):
                for i, value in enumerate(node):
                    walk(value, f"{ptr}/{i}")

        walk(self.schema, "")
        return out

    # -- nodes -----------------------------------------------------------------------------------------------

    def node(self, ptr: str) -> Any:
        hit = self.nodes.get(ptr, self)
        if hit is not self:
            return hit
        root_ptr, node = "", self.schema
        if "/~s" in ptr:  # under a synthetic node (each is named origin/~sN)
            for key in self.synthetic:
                if ptr.startswith(key + "/") and len(key) > len(root_ptr):
                    root_ptr, node = key, self.synthetic[key]
        for token in ptr[len(root_ptr) :].split("/")[1:]:
            token = token.replace("~1", "/").replace("~0", "~")
            if isinstance(node, Mapping):
                node = node[token]
            elif isinstance(node, list):
                node = node[int(token)]
            else:
                raise KeyError(ptr)
        self.nodes[ptr] = node
        return node

    def add_synthetic(self, origin: str, node: Mapping) -> str:
        key = json.dumps(node, sort_keys=True)
        for ptr, existing in self.synthetic.items():
            if ptr.startswith(origin + "/~s") and json.dumps(existing, sort_keys=True) == key:
                return ptr
        ptr = f"{origin}/~s{len(self.synthetic)}"
        self.synthetic[ptr] = node
        self.nodes[ptr] = node
        return ptr

    def is_synthetic(self, ptr: str) -> bool:
        return "/~s" in ptr

    def base_at(self, ptr: str) -> str:
        """The base URI in force at ``ptr`` (a pointer into the document): the ids met on the way, read in the
        root's draft."""
        hit = self.bases.get(ptr)
        if hit is not None:
            return hit
        base, node = self.base, self.schema
        for token in ptr.split("/")[1:]:
            key = token.replace("~1", "/").replace("~0", "~")
            node = node[int(key)] if isinstance(node, list) else node[key]
            rid = self.spec.create_resource(node).id()
            if rid:
                base = urljoin(base, rid)
        self.bases[ptr] = base
        return base

    def resolver_at(self, ptr: str):
        if self.is_synthetic(ptr):
            return self.root_resolver
        hit = self.resolvers.get(ptr)
        if hit is None:
            hit = self.resolvers[ptr] = self.registry.resolver(self.base_at(ptr))
        return hit

    def resolve(self, ptr: str, ref: str, keyword: str = "$ref") -> str:
        """The pointer of the schema ``ref`` (found at ``ptr``) refers to."""
        where = f"{ptr}/{keyword}"
        if not isinstance(ref, str):
            raise JsonSchemaError("a reference must be a string", where, keyword)
        if (ref == "#" or ref.startswith("#/")) and not self.names_resources:
            # Most references: a JSON pointer into the root, the only resource. Read directly (referencing's
            # lookup costs tens of microseconds); anything unusual is left to it.
            target = unquote(ref[1:])
            if _VALUE_KEYWORDS.isdisjoint(target.split("/")):
                try:
                    if isinstance(self.node(target), (Mapping, bool)):
                        return target
                except (KeyError, IndexError, ValueError, TypeError):
                    pass
        try:
            resolved = self.resolver_at(ptr).lookup(ref)
        except self.unresolvable as exc:
            raise JsonSchemaError(
                f"cannot resolve {ref!r} inside this document (remote references are not fetched): {exc}",
                where,
                keyword,
            ) from None
        contents = resolved.contents
        if isinstance(contents, Mapping) and id(contents) in self.ptr_of:
            return self.ptr_of[id(contents)]
        if isinstance(contents, bool):
            doc, _, fragment = ref.partition("#")
            try:
                holder = self.resolver_at(ptr).lookup(doc + "#").contents if doc else None
            except self.unresolvable:
                holder = None
            base_ptr = self.ptr_of.get(id(holder), None) if holder is not None else self._resource_ptr(ptr)
            fragment = unquote(fragment)
            if base_ptr is not None and fragment.startswith("/"):
                target = base_ptr + fragment
                try:
                    if self.node(target) is contents:
                        return target
                except (KeyError, IndexError, ValueError):
                    pass
        raise JsonSchemaError(f"{ref!r} does not refer to a schema of this document", where, keyword)

    def _resource_ptr(self, ptr: str) -> str:
        """The pointer of the innermost resource (the root, or a subschema with an id in the root's draft)
        containing ``ptr``."""
        best = ""
        node = self.schema
        walked = ""
        for token in ptr.split("/")[1:]:
            key = token.replace("~1", "/").replace("~0", "~")
            node = node[int(key)] if isinstance(node, list) else node[key]
            walked += "/" + token
            if self.spec.create_resource(node).id():
                best = walked
        return best

    # -- validation (the oracle used for enum/const candidates and property names) ----------------------------

    def validator(self):
        if self._validator is None:
            # Our resolver (as jsonschema's own descend passes one), not one jsonschema would build on referencing's
            # partial specification of the root's dialect: see _total_specification.
            checker = self.cls.FORMAT_CHECKER
            self._validator = self.cls(self.schema, format_checker=checker, _resolver=self.root_resolver)
        return self._validator

    def validation_schema(self, part: _Part) -> Any:
        """A schema jsonschema can evaluate (relative to the root) that means the same as ``part``."""
        if part.neg is not None:
            return {"not": self.keyword_schema(part)}
        return self._as_schema(part.ptr)

    def _as_schema(self, ptr: str) -> Any:
        if self.is_synthetic(ptr):
            return self._inline(self.node(ptr))
        if ptr == "":
            return {"$ref": "#"} if not self.base else {"$ref": self.base}
        return {"$ref": "#" + quote(ptr, safe="/~!$&'()*+,;=:@")}

    def _inline(self, node: Any) -> Any:
        if isinstance(node, Mapping):
            if set(node) == {"$ptr"}:
                return self._as_schema(node["$ptr"])
            return {k: self._inline(v) if k not in ("enum", "const", "required") else v for k, v in node.items()}
        if isinstance(node, list):
            return [self._inline(v) for v in node]
        return node

    def keyword_schema(self, part: _Part) -> dict:
        """The schema of the single keyword a negated part negates."""
        node = self.node(part.ptr)
        kw = part.neg[0]
        if kw == "required":
            return {"required": [part.neg[1]]}
        schema = {kw: node[kw]}
        if self.draft4 and kw in ("minimum", "maximum"):
            flag = "exclusiveMinimum" if kw == "minimum" else "exclusiveMaximum"
            if node.get(flag) is True:
                schema[flag] = True
        return schema

    def is_valid(self, parts: Sequence[_Part], value: Any) -> bool:
        validator = self.validator()
        instance = None
        for part in parts:
            _check_time(part.ptr)  # jsonschema's own time is unbounded: a large enum against a large schema
            standalone = self.standalone(part)
            if standalone is None:
                if not validator.evolve(schema=self.validation_schema(part)).is_valid(value):
                    return False
                continue
            schema, text = standalone
            instance = instance if instance is not None else json.dumps(value)
            verdict = self._verdicts.get((text, instance))
            if verdict is None:
                verdict = self._verdicts[(text, instance)] = validator.evolve(schema=schema).is_valid(value)
            if not verdict:
                return False
        return True

    def standalone(self, part: _Part) -> tuple[Any, str] | None:
        """What ``part`` means as a schema of its own, and its JSON text, when it holds no reference (nor a
        ``$schema`` of its own): then validating against it directly is the same as through a ``$ref`` to its
        pointer, without a lookup through the document, and equal texts (a bundled schema that inlines its
        definitions repeats them at many pointers) give equal verdicts, so they are asked once."""
        key = (part.ptr, part.neg)
        if key in self._standalone:
            return self._standalone[key]
        if part.neg is not None:
            schema = {"not": self.keyword_schema(part)}
        elif self.is_synthetic(part.ptr):
            schema = self._inline(self.node(part.ptr))
        else:
            schema = self.node(part.ptr)
        found = None if _refers(schema) else (schema, json.dumps(schema, sort_keys=True))
        self._standalone[key] = found
        return found


def _refers(schema: Any) -> bool:
    """Whether ``schema`` holds a reference or a dialect of its own anywhere (property names and enum values
    included: a conservative answer)."""
    stack = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, Mapping):
            if any(k in node for k in ("$ref", "$dynamicRef", "$recursiveRef", "$schema")):
                return True
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return False


# ==============================================================================================================
# The compiler


class _Layout(NamedTuple):
    obj_open: Expr
    obj_close: Expr
    arr_open: Expr
    arr_close: Expr
    comma: Expr
    colon: Expr
    obj_empty: Expr
    arr_empty: Expr


class _Shape:
    """The conjunction of flat parts, per kind of JSON value."""

    def __init__(self) -> None:
        self.kinds = set(_ALL_KINDS)
        self.emptied: tuple[str, str, str] | None = None
        self.why: dict[str, tuple[str, str, str]] = {}  # kind -> (message, pointer, keyword) when removed
        self.type_ptr: tuple[str, str] | None = None
        self.bools = {True, False}
        self.lo: Decimal | None = None
        self.lo_strict = False
        self.lo_at = ("", "")
        self.hi: Decimal | None = None
        self.hi_strict = False
        self.hi_at = ("", "")
        self.multiples: list[tuple[Decimal, str]] = []
        self.neg_multiples: list[tuple[Decimal, str]] = []
        self.num_excluded: set[Decimal] = set()
        self.min_len = 0
        self.min_len_at = ("", "")
        self.max_len: int | None = None
        self.max_len_at = ("", "")
        self.patterns: list[tuple[str, str]] = []
        self.neg_patterns: list[tuple[str, str]] = []
        self.formats: list[tuple[str, str]] = []
        self.neg_formats: list[tuple[str, str]] = []
        self.str_excluded: set[str] = set()
        self.array_parts: list[_Part] = []
        self.min_items = 0
        self.min_items_at = ("", "")
        self.max_items: int | None = None
        self.max_items_at = ("", "")
        self.unique: str | None = None
        self.object_parts: list[_Part] = []
        self.required: dict[str, str] = {}
        self.forbidden: dict[str, str] = {}
        self.min_props = 0
        self.min_props_at = ("", "")
        self.max_props: int | None = None
        self.max_props_at = ("", "")
        self.prop_names: list[_Part] = []
        self.parts: tuple[_Part, ...] = ()

    def restrict(self, kinds: set[str], message: str, ptr: str, keyword: str) -> None:
        before = bool(self.kinds)
        for kind in self.kinds - kinds:
            self.why.setdefault(kind, (message, ptr, keyword))
        self.kinds &= kinds
        if before and not self.kinds:
            self.emptied = (message, ptr, keyword)

    def lower(self, v: Decimal, strict: bool, at: tuple[str, str]) -> None:
        if self.lo is None or v > self.lo or (v == self.lo and strict and not self.lo_strict):
            self.lo, self.lo_strict, self.lo_at = v, strict, at

    def upper(self, v: Decimal, strict: bool, at: tuple[str, str]) -> None:
        if self.hi is None or v < self.hi or (v == self.hi and strict and not self.hi_strict):
            self.hi, self.hi_strict, self.hi_at = v, strict, at


class _ObjectInfo:
    """What one object part says about keys: its properties, patterns, additionalProperties, and (for
    ``unevaluatedProperties``) what its in-place subschemas in the same conjunction evaluate."""

    def __init__(self, props: dict[str, str], patterns: list[tuple[str, str]], additional: str | None):
        self.props = props
        self.patterns = patterns
        self.additional = additional
        self.unevaluated: str | None = None
        self.evaluated_names: set[str] = set()
        self.evaluated_patterns: list[tuple[str, str]] = []
        self.evaluates_all = False

    def evaluates(self, compiler: _Compiler, key: str) -> bool:
        if self.evaluates_all or key in self.props or key in self.evaluated_names:
            return True
        for pattern, ptr in self.patterns + self.evaluated_patterns:
            c = compiler.search(pattern, ptr)
            if c is not None and c.accepts(key):
                return True
        return False


def _child_depth(depth: int | None) -> int | None:
    if depth is None or depth + 1 > MAX_INDENT_DEPTH:
        return None
    return depth + 1


# The rules every schema may share are built once per process, so that each schema's grammar holds the very same
# objects: their hashes are cached on them, cache lookups by body meet them by identity, and the rule DFAs built
# from them are found at once.


@lru_cache(maxsize=256)
def _shared_body(name: str, max_ws: int) -> Expr:
    """The body of a shared lexical rule."""
    if name.startswith("json_chars_"):
        size = int(name.rsplit("_", 1)[1])
        return _counted_chars(size, size, False, False)
    if name == "ws":
        return Regex(f"[ \\t\\n\\r]{{0,{max_ws}}}")
    if name in ("true", "false", "null"):
        return Literal(name)
    patterns = {"json_string": _STRING, "json_number": _NUMBER, "json_integer": _INTEGER, "json_fraction": _NONINT}
    return Regex(patterns[name])


@lru_cache(maxsize=256)
def _layout(whitespace: str, max_ws: int, depth: int | None) -> _Layout:
    """The punctuation of objects and arrays at ``depth`` (indented output) or anywhere."""
    if whitespace == "indent" and depth is not None:
        inner = "  " * (depth + 1)
        outer = "  " * depth
        return _Layout(
            Literal("{\n" + inner), Literal("\n" + outer + "}"),
            Literal("[\n" + inner), Literal("\n" + outer + "]"),
            Literal(",\n" + inner), Literal(": "), Literal("{}"), Literal("[]"),
        )  # fmt: skip
    if whitespace == "flexible":
        ws = Ref("ws")
        return _Layout(
            Seq((Literal("{"), ws)), Seq((ws, Literal("}"))), Seq((Literal("["), ws)), Seq((ws, Literal("]"))),
            Seq((ws, Literal(","), ws)), Seq((ws, Literal(":"), ws)), Seq((Literal("{"), ws, Literal("}"))),
            Seq((Literal("["), ws, Literal("]"))),
        )  # fmt: skip
    return _Layout(
        Literal("{"), Literal("}"), Literal("["), Literal("]"), Literal(","), Literal(":"), Literal("{}"), Literal("[]")
    )


@lru_cache(maxsize=256)
def _any_value_rules(whitespace: str, max_ws: int, depth: int | None) -> Mapping[str, Expr]:
    """The rules of any JSON value at ``depth``: ``json_value`` (suffixed ``@depth`` for indented output), its
    objects and arrays, those of the values nested in them, and the lexical rules they call."""
    suffix = "" if depth is None else f"@{depth}"
    lay = _layout(whitespace, max_ws, depth)
    child = _child_depth(depth)
    rules: dict[str, Expr] = {}
    if child != depth:
        rules.update(_any_value_rules(whitespace, max_ws, child))
    for name in ("json_string", "json_number", "true", "false", "null") + (("ws",) if whitespace == "flexible" else ()):
        rules[name] = _shared_body(name, max_ws)
    value = Ref("json_value" + ("" if child is None else f"@{child}"))
    obj, arr = "json_object" + suffix, "json_array" + suffix
    member = Seq((Ref("json_string"), lay.colon, value))
    rules[obj] = Alt((lay.obj_empty, Seq((lay.obj_open, member, Repeat(Seq((lay.comma, member))), lay.obj_close))))
    rules[arr] = Alt((lay.arr_empty, Seq((lay.arr_open, value, Repeat(Seq((lay.comma, value))), lay.arr_close))))
    rules["json_value" + suffix] = Alt(
        (Ref(obj), Ref(arr), Ref("json_string"), Ref("json_number"), Ref("true"), Ref("false"), Ref("null"))
    )
    return MappingProxyType(rules)  # shared by every caller: read-only


class _Compiler:
    def __init__(
        self, schema: Any, strict: bool, whitespace: str, additional_properties_default: bool, max_whitespace: int
    ):
        self.doc = _Document(schema)
        #: The (sub)schema at a pointer: the document's own method, called tens of thousands of times a compile.
        self.node = self.doc.node
        self.strict = strict
        self.whitespace = whitespace
        self.ap_default = additional_properties_default
        self.max_ws = max_whitespace
        self.rules: dict[str, Expr] = {}
        #: The rules every schema shares (lexical pieces, any JSON value): productive, free of alias cycles and
        #: calling only each other, so the clean-up takes them as they are.
        self.library: set[str] = set()
        self.memo: dict[Any, Any] = {}
        self.unsat: dict[Any, _Unsatisfiable] = {}
        self.notes: list[str] = []
        self.names: set[str] = set()
        #: The next suffix to try per name base: bases cut at 80 characters repeat (many branches under one long
        #: pointer), and probing ``#2, #3...`` from the start each time is quadratic in their number.
        self._name_next: dict[str, int] = {}
        self._in_place: dict[str, set[str]] = {}
        self._disjoint_cache: dict[tuple, bool] = {}
        self._finite_cache: dict[str, tuple] = {}
        self._disjoint_checking: set[tuple] = set()
        self._plain: dict[tuple[tuple[str, ...], int | None], Ref] = {}

    # -- policy ----------------------------------------------------------------------------------------------

    def refuse(self, ptr: str, keyword: str, message: str, relaxation: str) -> None:
        """Strict: raise. Lenient: record ``relaxation`` and return (the caller then relaxes)."""
        ptr = _clean_pointer(ptr)
        if self.strict:
            raise JsonSchemaError(message + " (refused in strict mode)", ptr, keyword)
        note = f"{ptr or '/'}: {keyword}: {relaxation} ({message})"
        if note not in self.notes:
            self.notes.append(note)

    def unsatisfiable(self, message: str, ptr: str, keyword: str | None) -> _Unsatisfiable:
        return _Unsatisfiable(f"unsatisfiable: {message}", _clean_pointer(ptr), keyword)

    # -- shared lexical rules --------------------------------------------------------------------------------

    def shared(self, name: str) -> Ref:
        if name not in self.rules:
            self.rules[name] = _shared_body(name, self.max_ws)
            self.library.add(name)
        return Ref(name)

    def layout(self, depth: int | None) -> _Layout:
        if self.whitespace == "flexible":
            self.shared("ws")  # what the layout's punctuation calls
        return _layout(self.whitespace, self.max_ws, depth)

    def any_value(self, depth: int | None) -> Ref:
        name = "json_value" + ("" if depth is None else f"@{depth}")
        if name not in self.rules:
            rules = _any_value_rules(self.whitespace, self.max_ws, depth)
            self.rules.update(rules)
            self.library.update(rules)
        return Ref(name)

    # -- parts -----------------------------------------------------------------------------------------------

    def live_keys(self, part: _Part) -> list[str]:
        node = self.node(part.ptr)
        if not isinstance(node, Mapping):
            return []
        return [k for k in node if k not in part.skip and k not in _ANNOTATIONS]

    def normalise(self, parts: Sequence[_Part]) -> tuple[_Part, ...]:
        """Expand ``$ref`` and ``allOf`` into the conjunction, drop ``true`` and empty parts; ``false`` is
        unsatisfiable."""
        if len(parts) == 1 and parts[0].neg is None:  # most conjunctions: one subschema with nothing to expand
            node = self.node(parts[0].ptr)
            if type(node) is dict and node.keys().isdisjoint(_EXPANDED):
                return (parts[0],) if self.live_keys(parts[0]) else ()
        out: list[_Part] = []
        seen: set[_Part] = set()
        work = list(parts)
        while work:
            part = work.pop(0)
            if part in seen:
                continue
            seen.add(part)
            if part.neg is not None:
                out.append(part)
                continue
            node = self.node(part.ptr)
            if node is True:
                continue
            if node is False:
                raise self.unsatisfiable("the schema is false", part.ptr, None)
            if not isinstance(node, Mapping):
                raise JsonSchemaError("a schema must be an object or a boolean", _clean_pointer(part.ptr))
            if "$ptr" in node:
                work.insert(0, _Part(node["$ptr"]))
                continue
            skip = set(part.skip)
            added: list[_Part] = []
            for kw in ("$ref", "$dynamicRef", "$recursiveRef"):
                if kw in node and kw not in skip:
                    if kw not in self.doc.keywords:
                        if self.foreign(part.ptr, kw):
                            skip.add(kw)
                            continue
                    target = self.resolve_ref(part.ptr, kw, node[kw])
                    if self.doc.legacy and kw == "$ref":
                        added = [_Part(target)]
                        skip = None
                        break
                    skip.add(kw)
                    added.append(_Part(target))
            if skip is None:
                work[0:0] = added
                continue
            if "allOf" in node and "allOf" not in skip:
                skip.add("allOf")
                added.extend(_Part(f"{part.ptr}/allOf/{i}") for i in range(len(node["allOf"])))
            part = part._replace(skip=frozenset(skip))
            work.extend(added)
            if not self.live_keys(part):
                continue
            if part not in out:
                out.append(part)
        return tuple(out)

    def resolve_ref(self, ptr: str, kw: str, ref: Any) -> str:
        target = self.doc.resolve(ptr, ref, kw)
        if kw == "$dynamicRef":
            node = self.node(target)
            anchor = ref.partition("#")[2]
            if isinstance(node, Mapping) and node.get("$dynamicAnchor") == anchor:
                self.refuse(
                    ptr + "/$dynamicRef", "$dynamicRef", "a $dynamicRef with a dynamic scope is not supported",
                    "resolved statically like $ref",
                )  # fmt: skip
        if kw == "$recursiveRef":
            node = self.node(target)
            if isinstance(node, Mapping) and node.get("$recursiveAnchor") is True and target != "":
                self.refuse(
                    ptr + "/$recursiveRef", "$recursiveRef", "a $recursiveRef with a dynamic scope is not supported",
                    "resolved statically like $ref",
                )  # fmt: skip
        return target

    def foreign(self, ptr: str, kw: str) -> bool:
        """A keyword of another draft (its validator ignores it here). Returns True when it is to be ignored."""
        self.refuse(
            f"{ptr}/{kw}", kw, f"{kw!r} is not a keyword of {self.doc.draft}, so validators ignore it",
            "ignored, as a validator would",
        )  # fmt: skip
        return True

    def known_here(self, kw: str) -> bool:
        """Whether ``kw`` is a keyword of the schema's draft."""
        if self.doc.draft4 and kw in ("exclusiveMinimum", "exclusiveMaximum"):
            return True  # draft-04: booleans read by minimum / maximum
        if kw in _DEPENDENT_KEYWORDS:
            return _DEPENDENT_KEYWORDS[kw] in self.doc.keywords and (kw in ("then", "else") or not self.doc.legacy)
        return kw in self.doc.keywords

    def synthetic(self, origin: str, node: Mapping) -> _Part:
        return _Part(self.doc.add_synthetic(origin, node))

    # -- rules -----------------------------------------------------------------------------------------------

    def new_name(self, parts: Sequence[_Part], depth: int | None) -> str:
        def one(p: _Part) -> str:
            text = _clean_pointer(p.ptr) or "/"
            if p.neg:
                text = "not(" + text + "/" + "/".join(map(str, p.neg)) + ")"
            elif p.skip:
                text += "-" + ",".join(sorted(k for k in p.skip if k not in ("$ref", "allOf")))
            return text.rstrip("-")

        base = "&".join(one(p) for p in parts[:3]) + ("&..." if len(parts) > 3 else "")
        base = "schema:" + (base if len(base) <= 80 else base[:77] + "...")
        if depth is not None:
            base += f"@{depth}"
        i = self._name_next.get(base, 1)  # every name below it is in self.names, which only grows
        name = base if i == 1 else f"{base}#{i}"
        while name in self.names or name in self.rules:
            i += 1
            name = f"{base}#{i}"
        self._name_next[base] = i + 1
        self.names.add(name)
        if len(self.names) > MAX_RULES:
            raise JsonSchemaError(f"the schema needs more than {MAX_RULES:,} grammar rules", "", None)
        return name

    def conj(self, parts: Sequence[_Part], depth: int | None) -> Ref:
        """A rule for the conjunction of ``parts`` (raises _Unsatisfiable when none can hold)."""
        parts = self.normalise(parts)
        if not parts:
            return self.any_value(depth)
        types = self.plain_types(parts)
        if types is not None:
            return self.plain_rule(types, parts, depth)
        key = (frozenset(parts), depth)
        hit = self.memo.get(key)
        if hit is _UNSAT:
            raise _verdict(self.unsat[key])
        if hit is not None:
            return Ref(hit)
        _check_time(parts[0].ptr)
        self.last_pointer = parts[0].ptr
        name = self.new_name(parts, depth)
        self.memo[key] = name
        try:
            body = self.body(parts, depth, name)
        except _Unsatisfiable as exc:
            self.memo[key] = _UNSAT
            self.unsat[key] = _verdict(exc)
            raise
        self.rules[name] = body
        return Ref(name)

    def plain_types(self, parts: tuple[_Part, ...]) -> tuple[str, ...] | None:
        """The type names of a conjunction that is one subschema saying nothing but a ``type`` of scalars (a third
        of the subschemas of real schemas: ``{"type": "string", "description": ...}``), sorted; otherwise None."""
        if len(parts) != 1 or parts[0].neg is not None or self.live_keys(parts[0]) != ["type"]:
            return None
        names = self.node(parts[0].ptr)["type"]
        names = [names] if isinstance(names, str) else names
        if not isinstance(names, list) or not all(isinstance(n, str) and n in _SCALAR_TYPES for n in names):
            return None
        return tuple(sorted(set(names)))

    def plain_rule(self, types: tuple[str, ...], parts: tuple[_Part, ...], depth: int | None) -> Ref:
        """What every subschema of :meth:`plain_types` ``types`` compiles to: its body is the same wherever it
        stands, so it is built once per schema, and where it is one call of a shared rule (a string, a number)
        that call takes the place of a rule of its own."""
        ref = self._plain.get((types, depth))
        if ref is None:
            name = "type:" + "|".join(types) + ("" if depth is None else f"@{depth}")
            body = self.body(parts, depth, name)
            if isinstance(body, Ref):
                ref = body
            else:
                self.rules[name] = body
                ref = Ref(name)
            self._plain[(types, depth)] = ref
        return ref

    def body(self, parts: tuple[_Part, ...], depth: int | None, name: str) -> Expr:
        finite = self.finite_values(parts, depth)
        if finite is not None:
            return finite
        for part in parts:
            if part.neg is not None:
                continue
            node = self.node(part.ptr)
            for kw in _BRANCHING:
                if kw in node and kw not in part.skip:
                    self.quick_check(parts)
                    return self.branch(parts, part, kw, depth)
        shape = self.merge(parts)
        return self.emit(shape, depth, name)

    def quick_check(self, parts: tuple[_Part, ...]) -> None:
        """Raise _Unsatisfiable early for contradictions that branching would otherwise only find at every leaf:
        no kind of value left, or a required property whose const/enum values exclude each other. (Chains of
        if/then or oneOf discriminated by a property would otherwise branch exponentially.)"""
        kinds = set(_ALL_KINDS)
        required: dict[str, str] = {}
        props: dict[str, list[str]] = defaultdict(list)
        for p in parts:
            node = self.node(p.ptr)
            if p.neg is not None:
                if p.neg[0] == "type":
                    kinds -= _kinds_of_type(node["type"])
                elif p.neg[0] == "required":
                    kinds &= {"object"}
                continue
            live = self.live_keys(p)
            if "type" in live:
                kinds &= _kinds_of_type(node["type"])
            if "required" in live and isinstance(node["required"], list):
                for n in node["required"]:
                    required.setdefault(n, f"{p.ptr}/required")
            if "properties" in live:
                for n in node["properties"]:
                    props[n].append(f"{p.ptr}/properties/{_escape_token(n)}")
        if not kinds:
            raise self.unsatisfiable("the types of the combined subschemas exclude each other", parts[0].ptr, "type")
        if "object" not in kinds:
            return
        for n, at in required.items():
            allowed: dict[str, Any] | None = None
            excluded: set[str] = set()
            for ptr in props.get(n, ()):
                values, minus = self.finite_of(ptr)
                if values is None and minus is None:
                    continue
                if values is False:
                    allowed = {}
                    break
                if values is not None:
                    allowed = values if allowed is None else {k: v for k, v in allowed.items() if k in values}
                excluded |= minus or set()
            if allowed is not None and not (set(allowed) - excluded):
                if kinds == {"object"}:
                    raise self.unsatisfiable(f"the required property {n!r} can take no value", at, "required")

    def finite_of(self, ptr: str) -> tuple[Any, set[str] | None]:
        """(allowed values by JSON key, or None when unbounded, or False when none; excluded keys) of the schema
        at ``ptr``, looking only at const/enum, ``not`` of const/enum, and ``false``."""
        hit = self._finite_cache.get(ptr)
        if hit is not None:
            return hit
        self._finite_cache[ptr] = (None, None)  # cycles: unknown
        values: Any = None
        excluded: set[str] = set()
        try:
            parts = self.normalise([_Part(ptr)])
        except _Unsatisfiable:
            parts, values = (), False
        except JsonSchemaError:
            parts = ()
        for p in parts:
            node = self.node(p.ptr)
            if p.neg is not None:
                if p.neg[0] in ("const", "enum"):
                    vals = [node["const"]] if p.neg[0] == "const" else node["enum"]
                    excluded.update(_json_key(v) for v in vals)
                continue
            live = self.live_keys(p)
            for kw in ("const", "enum"):
                if kw in live:
                    vals = {_json_key(v): v for v in ([node[kw]] if kw == "const" else node[kw])}
                    values = (
                        vals
                        if values is None
                        else ({} if values is False else {k: v for k, v in values.items() if k in vals})
                    )
            if "not" in live and isinstance(node["not"], Mapping):
                inner = f"{p.ptr}/not"
                if set(node["not"]) == {"$ptr"}:
                    inner = node["not"]["$ptr"]
                sub, _ = self.finite_of(inner)
                if isinstance(sub, dict):
                    excluded.update(sub)
        result = (values, excluded or None)
        self._finite_cache[ptr] = result
        return result

    # -- enum / const ----------------------------------------------------------------------------------------

    def finite_values(self, parts: tuple[_Part, ...], depth: int | None) -> Expr | None:
        chosen = self.finite_candidates(parts)
        if chosen is None:
            return None
        literals = [self.value_literal(value, depth) for value in chosen]
        return literals[0] if len(literals) == 1 else Alt(tuple(literals))

    def finite_candidates(self, parts: tuple[_Part, ...]) -> list[Any] | None:
        """The distinct values an enum/const of the conjunction allows (validated against all of it), or None
        when no part has an enum/const."""
        source = None
        for part in parts:
            if part.neg is not None:
                continue
            node = self.node(part.ptr)
            for kw in ("const", "enum"):
                if kw in node and kw not in part.skip:
                    values = [node[kw]] if kw == "const" else list(node[kw])
                    if source is None or len(values) < len(source[0]):
                        source = (values, part, kw)
        if source is None:
            return None
        values, owner, kw = source
        at = f"{owner.ptr}/{kw}"
        if not values:
            raise self.unsatisfiable("the enum is empty", at, kw)
        extra = [k for k in self.live_keys(owner) if k not in ("enum", "const") and k in _VALIDATION]
        simple = len(parts) == 1 and set(extra) <= {"type"}
        kinds = _kinds_of_type(self.node(owner.ptr)["type"]) if "type" in extra else _ALL_KINDS
        formats = [
            self.node(p.ptr)["format"]
            for p in parts
            if p.neg is None and "format" in self.live_keys(p) and self.node(p.ptr)["format"] in _FORMATS
        ]
        chosen: dict[str, Any] = {}
        for value in values:
            key = _json_key(value)
            if key in chosen:
                continue
            if simple:
                if _kind_of(value) not in kinds:
                    continue
            else:
                try:
                    ok = self.doc.is_valid(parts, value)
                except _TIME_LIMIT:
                    raise
                except Exception as exc:  # an unresolvable reference met by jsonschema, a bad regex...
                    raise JsonSchemaError(
                        f"cannot evaluate the enum values against the schema: {exc}", _clean_pointer(at), kw
                    ) from None
                if not ok:
                    continue
                if isinstance(value, str) and any(not _format_cdfa(f).accepts(value) for f in formats):
                    continue  # formats are asserted here, also where jsonschema has no checker for them
            chosen[key] = value
        if not chosen:
            raise self.unsatisfiable(f"no value of {kw!r} satisfies the rest of the schema", at, kw)
        for value in chosen.values():
            try:
                _dumps(value).encode("utf-8")
            except (ValueError, UnicodeEncodeError) as exc:
                raise JsonSchemaError(
                    f"the value {value!r} cannot be written as UTF-8 JSON: {exc}", _clean_pointer(at), kw
                ) from None
        return list(chosen.values())

    def value_literal(self, value: Any, depth: int | None) -> Expr:
        """Exactly ``value`` (keys in the given order), laid out like every other value."""
        if (
            not isinstance(value, (Mapping, list))
            or not value
            or self.whitespace == "compact"
            or (self.whitespace == "indent" and depth is None)
        ):
            if isinstance(value, float) and value.is_integer():
                # the schema's own spelling (2.0) besides the canonical one (2): JSON Schema compares by value
                return Alt((Literal(_dumps(value)), Literal(json.dumps(value))))
            return Literal(_dumps(value))
        lay = self.layout(depth)
        child = _child_depth(depth)
        if isinstance(value, Mapping):
            items = [
                Seq((Literal(json.dumps(k, ensure_ascii=False)), lay.colon, self.value_literal(v, child)))
                for k, v in value.items()
            ]
            open_, close = lay.obj_open, lay.obj_close
        else:
            items = [self.value_literal(v, child) for v in value]
            open_, close = lay.arr_open, lay.arr_close
        seq: list[Expr] = [open_]
        for i, item in enumerate(items):
            if i:
                seq.append(lay.comma)
            seq.append(item)
        seq.append(close)
        return Seq(tuple(seq))

    # -- branching -------------------------------------------------------------------------------------------

    def branch(self, parts: tuple[_Part, ...], part: _Part, kw: str, depth: int | None) -> Expr:
        node = self.node(part.ptr)
        at = f"{part.ptr}/{kw}"
        skip = {kw} | ({"then", "else"} if kw == "if" else set())
        base = tuple(p._replace(skip=p.skip | skip) if p == part else p for p in parts)
        if kw not in self.doc.keywords and kw in ("dependentRequired", "dependentSchemas", "dependencies"):
            self.foreign(part.ptr, kw)
            return self.conj(base, depth)
        try:
            alternatives = self.alternatives(part, kw, node, parts)
        except _NotNegatable as exc:
            relaxed = {"oneOf": "treated as anyOf", "not": "ignored", "if": "ignored (with then/else)"}[kw]
            self.refuse(at, kw, str(exc), relaxed)
            if kw == "oneOf":
                alternatives = [(_Part(f"{part.ptr}/oneOf/{i}"),) for i in range(len(node["oneOf"]))]
            else:
                alternatives = [()]
        options: list[Expr] = []
        failure: _Unsatisfiable | None = None
        for extra in alternatives:
            try:
                ref = self.conj(base + tuple(extra), depth)
            except _Unsatisfiable as exc:
                failure = failure or _verdict(exc)
                continue
            if ref not in options:
                options.append(ref)
        if not options:
            if failure is not None and len(alternatives) == 1:
                raise _verdict(failure)
            raise self.unsatisfiable(
                f"no branch of {kw!r} can be satisfied together with the rest of the schema", at, kw
            )
        if len(options) == 1:
            return options[0]
        # The options' bodies, not calls to their rules: one DFA then follows every option. Called rules would each
        # be a configuration of their own until the text tells them apart (for an object, maybe only at its last
        # key), and every value nested inside would multiply those by its own options' count, level after level.
        # A rule still being built (a recursion) stays a call.
        inlined: list[Expr] = []
        for ref in options:
            inlined.extend(_options(self.rules.get(ref.rule, ref)))
        unique = tuple(dict.fromkeys(inlined))
        return unique[0] if len(unique) == 1 else Alt(unique)

    def alternatives(self, part: _Part, kw: str, node: Mapping, parts: tuple[_Part, ...]) -> list[tuple[_Part, ...]]:
        ptr = part.ptr
        if kw == "anyOf":
            branches = [_Part(f"{ptr}/anyOf/{i}") for i in range(len(node["anyOf"]))]
            if self.sees_annotations(parts) and 1 < len(branches) <= 4:
                # every branch that holds contributes its annotations: one alternative per set of holding branches
                subsets = []
                for mask in range(1, 2 ** len(branches)):
                    subsets.append(tuple(b for i, b in enumerate(branches) if mask >> i & 1))
                return subsets
            return [(b,) for b in branches]
        if kw == "oneOf":
            branches = [_Part(f"{ptr}/oneOf/{i}") for i in range(len(node["oneOf"]))]
            if self.pairwise_disjoint(branches):
                return [(b,) for b in branches]
            split = self.one_of_by_kind(branches, f"{ptr}/oneOf")
            if split is not None:
                return split
            # exact: branch i and the negation of every other branch
            if len(branches) > 4:
                raise _NotNegatable("the oneOf branches are not provably exclusive")
            out: list[tuple[_Part, ...]] = []
            negs = []
            for b in branches:
                try:
                    negs.append(self.negate(b.ptr))
                except _NotNegatable:
                    raise _NotNegatable("the oneOf branches are not provably exclusive and cannot be negated") from None
            for i, b in enumerate(branches):
                others = [negs[j] for j in range(len(branches)) if j != i]
                for combo in product(*others):
                    out.append((b,) + tuple(p for conj in combo for p in conj))
                    if len(out) > 64:
                        raise _NotNegatable("the oneOf branches need too many exclusive combinations")
            return out
        if kw == "not":
            return self.negate(f"{ptr}/not")
        if kw == "if":
            then = (_Part(f"{ptr}/then"),) if "then" in node else ()
            other = (_Part(f"{ptr}/else"),) if "else" in node else ()
            if not then and not other and not self.sees_annotations(parts):
                return [()]
            negated = self.negate(f"{ptr}/if")
            return [(_Part(f"{ptr}/if"),) + then] + [d + other for d in negated]
        # dependencies: each trigger present (with its dependency) or absent
        value = node[kw]
        required = set()
        for p in parts:
            if p.neg is None:
                n = self.node(p.ptr)
                if isinstance(n.get("required"), list) and "required" not in p.skip:
                    required.update(n["required"])
        choices = []
        for trigger, dep in value.items():
            if kw == "dependentRequired" or (kw == "dependencies" and isinstance(dep, list)):
                if set(dep) <= required or not dep:
                    continue
                present = self.synthetic(f"{ptr}/{kw}/{_escape_token(trigger)}", {"required": [trigger, *dep]})
            else:
                sub = _Part(f"{ptr}/{kw}/{_escape_token(trigger)}")
                if self.node(sub.ptr) is True:
                    continue
                present = (self.synthetic(f"{ptr}/{kw}/{_escape_token(trigger)}", {"required": [trigger]}), sub)
            absent = self.synthetic(f"{ptr}/{kw}/{_escape_token(trigger)}", {"properties": {trigger: False}})
            present = (present,) if isinstance(present, _Part) else present
            choices.append([present] if trigger in required else [(absent,), present])
        if len(choices) > 10:
            raise JsonSchemaError(
                f"{kw!r} has too many conditional properties ({len(choices)})", _clean_pointer(f"{ptr}/{kw}"), kw
            )
        return [tuple(p for conj in combo for p in conj) for combo in product(*choices)]

    def sees_annotations(self, parts: Sequence[_Part]) -> bool:
        """Whether an unevaluatedProperties/unevaluatedItems of the conjunction depends on which branches hold."""
        for p in parts:
            if p.neg is None:
                node = self.node(p.ptr)
                if isinstance(node, Mapping) and (
                    ("unevaluatedProperties" in node and "unevaluatedProperties" not in p.skip)
                    or ("unevaluatedItems" in node and "unevaluatedItems" not in p.skip)
                ):
                    return True
        return False

    def pairwise_disjoint(self, branches: list[_Part]) -> bool:
        summaries = [self.summary(b) for b in branches]
        for i in range(len(summaries)):
            for j in range(i + 1, len(summaries)):
                if not _disjoint(summaries[i], summaries[j]) and not self.no_common_value(branches[i], branches[j]):
                    return False
        return True

    def no_common_value(self, a: _Part, b: _Part, group: str | None = None) -> bool:
        """Whether compiling ``a`` and ``b`` together (restricted to one kind of value) shows them unsatisfiable:
        the compiler itself as the disjointness prover."""
        key = (a, b, group)
        hit = self._disjoint_cache.get(key)
        if hit is not None:
            return hit
        if key in self._disjoint_checking or len(self._disjoint_checking) > 4:
            return False
        self._disjoint_checking.add(key)
        notes = list(self.notes)
        try:
            extra = (self.synthetic(a.ptr, {"type": group}),) if group else ()
            self.conj((a, b) + extra, None)
            result = False
        except _Unsatisfiable:
            result = True
        except (JsonSchemaError, _NotNegatable, _TooLarge):
            result = False
        finally:
            self._disjoint_checking.discard(key)
            self.notes[:] = notes
        self._disjoint_cache[key] = result
        return result

    def summary(self, part: _Part) -> dict:
        """What is cheaply known of a branch: its kinds, finite values, required / forbidden / declared properties
        (with finite values), whether it is a closed object, and which kinds its keywords constrain."""
        kinds = set(_ALL_KINDS)
        values: dict[str, Any] | None = None
        required: set[str] = set()
        props: dict[str, dict[str, Any]] = {}
        forbidden: set[str] = set()
        declared: set[str] = set()
        closed = False
        constrained: set[str] = set()
        try:
            parts = self.normalise([part])
        except _Unsatisfiable:
            return {"empty": True}
        for p in parts:
            if p.neg is not None:
                constrained |= set(_GROUPS)
                continue
            node = self.node(p.ptr)
            live = set(self.live_keys(p))
            for kw in live:
                if kw in _BRANCHING or kw in ("enum", "const"):
                    constrained |= set(_GROUPS)
                elif kw in _KEYWORD_GROUP:
                    constrained.add(_KEYWORD_GROUP[kw])
            if "type" in live:
                kinds &= _kinds_of_type(node["type"])
            for kw in ("const", "enum"):
                if kw in live:
                    vals = [node[kw]] if kw == "const" else node[kw]
                    found = {_json_key(v): v for v in vals}
                    values = found if values is None else {k: v for k, v in values.items() if k in found}
            if "required" in live and isinstance(node["required"], list):
                required.update(node["required"])
            if (
                "additionalProperties" in live
                and node["additionalProperties"] is False
                and "patternProperties" not in live
            ):
                closed = True
            for name, sub in (node.get("properties") or {}).items() if "properties" in live else ():
                declared.add(name)
                if sub is False:
                    forbidden.add(name)
                    continue
                sub_ptr = f"{p.ptr}/properties/{_escape_token(name)}"
                try:
                    sub_parts = self.normalise([_Part(sub_ptr)])
                except _Unsatisfiable:
                    forbidden.add(name)
                    continue
                for sp in sub_parts:
                    if sp.neg is not None:
                        continue
                    sn = self.node(sp.ptr)
                    for kw in ("const", "enum"):
                        if kw in sn and kw not in sp.skip:
                            vals = [sn[kw]] if kw == "const" else sn[kw]
                            found = {_json_key(v): v for v in vals}
                            old = props.get(name)
                            props[name] = found if old is None else {k: v for k, v in old.items() if k in found}
        if values is not None:
            kinds &= {_kind_of(v) for v in values.values()}
        return {
            "kinds": kinds, "values": values, "required": required, "props": props, "forbidden": forbidden,
            "declared": declared, "closed": closed, "constrained": constrained,
        }  # fmt: skip

    def one_of_by_kind(self, branches: list[_Part], origin: str) -> list[tuple[_Part, ...]] | None:
        """oneOf split by kind of value: per kind, the branches that hold for every value of that kind, those
        that never hold and the others; exact when, per kind, at most one branch holds for all its values (and
        then no other may hold) or the partial branches are provably disjoint. None when that cannot be shown."""
        summaries = [self.summary(b) for b in branches]
        out: list[tuple[_Part, ...]] = []
        for group, kinds in _GROUPS.items():
            trivial, partial = [], []
            for b, sm in zip(branches, summaries):
                if sm.get("empty") or not (sm["kinds"] & kinds):
                    continue
                if kinds <= sm["kinds"] and group not in sm["constrained"]:
                    trivial.append(b)
                else:
                    partial.append((b, sm))
            if len(trivial) >= 2:
                continue  # two branches always hold: no value of this kind is valid
            if trivial and partial:
                return None
            for i in range(len(partial)):
                for j in range(i + 1, len(partial)):
                    a = dict(partial[i][1], kinds=partial[i][1]["kinds"] & kinds)
                    c = dict(partial[j][1], kinds=partial[j][1]["kinds"] & kinds)
                    if not _disjoint(a, c) and not self.no_common_value(partial[i][0], partial[j][0], group):
                        return None
            restrict = self.synthetic(origin, {"type": group})
            out.extend((b, restrict) for b in trivial + [b for b, _ in partial])
        return out

    # -- negation --------------------------------------------------------------------------------------------

    def negate(self, ptr: str) -> list[tuple[_Part, ...]]:
        """The negation of the schema at ``ptr`` as a disjunction of conjunctions of parts."""
        node = self.node(ptr)
        if node is True:
            return []
        if node is False:
            return [()]
        if not isinstance(node, Mapping):
            raise JsonSchemaError("a schema must be an object or a boolean", _clean_pointer(ptr))
        if "$ptr" in node:
            return self.negate(node["$ptr"])
        if self.doc.legacy and "$ref" in node:
            return self.negate(self.resolve_ref(ptr, "$ref", node["$ref"]))
        if self.closed_by_default(node, {k for k in node if self.known_here(k)}):
            raise _NotNegatable(
                f"cannot negate an object closed by additional_properties_default=False (at {_clean_pointer(ptr)})"
            )
        out: list[tuple[_Part, ...]] = []
        for kw, value in node.items():
            if kw in _ANNOTATIONS:
                continue
            if kw not in _VALIDATION:
                continue  # unknown keywords are annotations
            if not self.known_here(kw):
                self.foreign(ptr, kw)
                continue
            if kw in ("$ref", "$dynamicRef", "$recursiveRef"):
                out.extend(self.negate(self.resolve_ref(ptr, kw, value)))
            elif kw == "allOf":
                for i in range(len(value)):
                    out.extend(self.negate(f"{ptr}/allOf/{i}"))
            elif kw == "anyOf":
                combos = list(product(*(self.negate(f"{ptr}/anyOf/{i}") for i in range(len(value)))))
                if len(combos) > 64:
                    raise _NotNegatable(f"the negation of {_clean_pointer(ptr)}/anyOf is too large")
                out.extend(tuple(p for conj in combo for p in conj) for combo in combos)
            elif kw == "not":
                out.append((_Part(f"{ptr}/not"),))
            elif kw in _NEGATABLE:
                if kw in ("exclusiveMinimum", "exclusiveMaximum") and isinstance(value, bool):
                    continue  # draft-04: part of minimum / maximum
                out.append((_Part(ptr, neg=(kw,)),))
            elif kw == "required":
                out.extend((_Part(ptr, neg=("required", name)),) for name in dict.fromkeys(value))
            elif kw == "properties":
                for name in value:
                    sub = f"{ptr}/properties/{_escape_token(name)}"
                    if self.node(sub) is True:
                        continue
                    out.append(
                        (
                            self.synthetic(
                                ptr,
                                {"type": "object", "required": [name], "properties": {name: {"not": {"$ptr": sub}}}},
                            ),
                        )
                    )
            elif kw == "prefixItems" or (kw == "items" and isinstance(value, list)):
                for i in range(len(value)):
                    sub = f"{ptr}/{kw}/{i}"
                    if self.node(sub) is True:
                        continue
                    out.append(
                        (
                            self.synthetic(
                                ptr,
                                {
                                    "type": "array",
                                    "minItems": i + 1,
                                    "prefixItems" if not self.doc.legacy else "items": [True] * i
                                    + [{"not": {"$ptr": sub}}],
                                },
                            ),
                        )
                    )
            elif kw == "items" and isinstance(value, (Mapping, bool)) and "prefixItems" not in node:
                if value is not True:
                    out.append((self.synthetic(ptr, {"type": "array", "contains": {"not": {"$ptr": f"{ptr}/items"}}}),))
            elif kw == "contains" and "minContains" not in node and "maxContains" not in node:
                out.append((self.synthetic(ptr, {"type": "array", "items": {"not": {"$ptr": f"{ptr}/contains"}}}),))
            elif kw in ("then", "else") and "if" in node:
                continue
            elif kw == "if":
                # not(if-then-else) = (if and not then) or (not if and not else)
                then_neg = self.negate(f"{ptr}/then") if "then" in node else []
                else_neg = self.negate(f"{ptr}/else") if "else" in node else []
                out.extend((_Part(f"{ptr}/if"),) + d for d in then_neg)
                if else_neg:
                    for d in self.negate(f"{ptr}/if"):
                        out.extend(d + e for e in else_neg)
            else:
                raise _NotNegatable(f"cannot negate {kw!r} (at {_clean_pointer(ptr)}/{kw})")
        return out

    # -- merging flat parts ----------------------------------------------------------------------------------

    def merge(self, parts: tuple[_Part, ...]) -> _Shape:
        sh = _Shape()
        sh.parts = parts
        for part in parts:
            if part.neg is not None:
                self.merge_negated(sh, part)
                continue
            node = self.node(part.ptr)
            for kw in self.live_keys(part):
                value = node[kw]
                at = (f"{part.ptr}/{kw}", kw)
                if kw in _DRAFT3_ONLY:
                    if kw in self.doc.keywords:
                        self.refuse(at[0], kw, f"the draft-03 keyword {kw!r} is not supported", "ignored")
                    else:
                        self.foreign(part.ptr, kw)
                    continue
                if kw not in _VALIDATION:
                    continue  # unknown keywords are annotations
                if not self.known_here(kw):
                    self.foreign(part.ptr, kw)
                    continue
                if kw == "type":
                    sh.restrict(_kinds_of_type(value), f"type {value} leaves no type with the other constraints", *at)
                elif kw in ("minimum", "exclusiveMinimum"):
                    if isinstance(value, bool):
                        continue
                    strict = kw == "exclusiveMinimum" or (self.doc.draft4 and node.get("exclusiveMinimum") is True)
                    sh.lower(_to_decimal(value), strict, at)
                elif kw in ("maximum", "exclusiveMaximum"):
                    if isinstance(value, bool):
                        continue
                    strict = kw == "exclusiveMaximum" or (self.doc.draft4 and node.get("exclusiveMaximum") is True)
                    sh.upper(_to_decimal(value), strict, at)
                elif kw == "multipleOf":
                    sh.multiples.append((_to_decimal(value), at[0]))
                elif kw == "minLength":
                    if value > sh.min_len:
                        sh.min_len, sh.min_len_at = int(value), at
                elif kw == "maxLength":
                    if sh.max_len is None or value < sh.max_len:
                        sh.max_len, sh.max_len_at = int(value), at
                elif kw == "pattern":
                    sh.patterns.append((value, at[0]))
                elif kw == "format":
                    if value in _FORMATS:
                        sh.formats.append((value, at[0]))
                    elif value in _UNSUPPORTED_FORMATS:
                        self.refuse(at[0], kw, f"the format {value!r} is not supported", "ignored")
                elif kw in ("minItems", "maxItems"):
                    if kw == "minItems" and value > sh.min_items:
                        sh.min_items, sh.min_items_at = int(value), at
                    if kw == "maxItems" and (sh.max_items is None or value < sh.max_items):
                        sh.max_items, sh.max_items_at = int(value), at
                elif kw == "uniqueItems":
                    if value:
                        sh.unique = at[0]
                elif kw in _ARRAY_KEYWORDS:
                    if part not in sh.array_parts:
                        sh.array_parts.append(part)
                elif kw in ("minProperties", "maxProperties"):
                    if kw == "minProperties" and value > sh.min_props:
                        sh.min_props, sh.min_props_at = int(value), at
                    if kw == "maxProperties" and (sh.max_props is None or value < sh.max_props):
                        sh.max_props, sh.max_props_at = int(value), at
                elif kw == "required":
                    if isinstance(value, list):
                        for name in value:
                            sh.required.setdefault(name, at[0])
                elif kw in _OBJECT_KEYWORDS:
                    if part not in sh.object_parts:
                        sh.object_parts.append(part)
                    if kw == "propertyNames":
                        sh.prop_names.append(_Part(f"{part.ptr}/propertyNames"))
                elif kw in ("then", "else"):
                    continue  # without "if" they mean nothing
                else:  # pragma: no cover - every validation keyword is handled above or branched on
                    raise AssertionError(kw)
        if "boolean" in sh.kinds and not sh.bools:
            sh.restrict(sh.kinds - {"boolean"}, "no boolean is allowed", "", "not")
        return sh

    def merge_negated(self, sh: _Shape, part: _Part) -> None:
        node = self.node(part.ptr)
        kw = part.neg[0]
        at = (f"{part.ptr}/{kw}", kw)
        message = f"excluded by a negated {kw!r}"
        if kw == "type":
            sh.restrict(_ALL_KINDS - _kinds_of_type(node["type"]), message, *at)
            return
        if kw in ("enum", "const"):
            values = [node[kw]] if kw == "const" else node[kw]
            for value in values:
                kind = _kind_of(value)
                if kind == "null":
                    sh.restrict(sh.kinds - {"null"}, message, *at)
                elif kind == "boolean":
                    sh.bools.discard(value)
                elif kind in ("int", "frac"):
                    sh.num_excluded.add(_to_decimal(value))
                elif kind == "string":
                    sh.str_excluded.add(value)
                elif kind in sh.kinds:
                    self.refuse(at[0], kw, f"cannot exclude the {kind} value {_dumps(value)[:60]}", "ignored")
            if not sh.bools:
                sh.restrict(sh.kinds - {"boolean"}, message, *at)
            return
        if kw == "required":
            sh.restrict({"object"}, message, *at)
            sh.forbidden.setdefault(part.neg[1], at[0])
            return
        sh.restrict(set(_FAMILY.get(kw, _ALL_KINDS)), message, *at)
        value = node[kw]
        if kw in ("minimum", "exclusiveMinimum"):
            strict = kw == "exclusiveMinimum" or (self.doc.draft4 and node.get("exclusiveMinimum") is True)
            sh.upper(_to_decimal(value), not strict, at)
        elif kw in ("maximum", "exclusiveMaximum"):
            strict = kw == "exclusiveMaximum" or (self.doc.draft4 and node.get("exclusiveMaximum") is True)
            sh.lower(_to_decimal(value), not strict, at)
        elif kw == "minLength":
            if value == 0:
                sh.restrict(set(), message, *at)
            elif sh.max_len is None or value - 1 < sh.max_len:
                sh.max_len, sh.max_len_at = int(value) - 1, at
        elif kw == "maxLength":
            if value + 1 > sh.min_len:
                sh.min_len, sh.min_len_at = int(value) + 1, at
        elif kw == "pattern":
            sh.neg_patterns.append((value, at[0]))
        elif kw == "multipleOf":
            sh.neg_multiples.append((_to_decimal(value), at[0]))
        elif kw == "format":
            if value in _FORMATS:
                sh.neg_formats.append((value, at[0]))
            elif value in _UNSUPPORTED_FORMATS:
                self.refuse(at[0], kw, f"cannot negate the unsupported format {value!r}", "ignored")
            else:
                sh.restrict(set(), message, *at)  # an unknown format holds for every string
        elif kw == "minItems":
            if value == 0:
                sh.restrict(set(), message, *at)
            elif sh.max_items is None or value - 1 < sh.max_items:
                sh.max_items, sh.max_items_at = int(value) - 1, at
        elif kw == "maxItems":
            if value + 1 > sh.min_items:
                sh.min_items, sh.min_items_at = int(value) + 1, at
        elif kw == "minProperties":
            if value == 0:
                sh.restrict(set(), message, *at)
            elif sh.max_props is None or value - 1 < sh.max_props:
                sh.max_props, sh.max_props_at = int(value) - 1, at
        elif kw == "maxProperties":
            if value + 1 > sh.min_props:
                sh.min_props, sh.min_props_at = int(value) + 1, at
        else:  # pragma: no cover
            raise AssertionError(kw)

    # -- emission --------------------------------------------------------------------------------------------

    def emit(self, sh: _Shape, depth: int | None, name: str) -> Expr:
        options: list[Expr] = []
        failures: list[_Unsatisfiable] = []

        def attempt(make) -> None:
            try:
                expr = make()
            except _Unsatisfiable as exc:
                failures.append(_verdict(exc))
                return
            if expr is not None:
                options.append(expr)

        kinds = sh.kinds
        if "null" in kinds:
            options.append(self.shared("null"))
        if "boolean" in kinds:
            for value in (True, False):
                if value in sh.bools:
                    options.append(self.shared("true" if value else "false"))
        if kinds & {"int", "frac"}:
            attempt(lambda: self.number_expr(sh))
        if "string" in kinds:
            attempt(lambda: self.string_expr(sh))
        if "array" in kinds:
            attempt(lambda: self.array_expr(sh, depth, name))
        if "object" in kinds:
            attempt(lambda: self.object_expr(sh, depth, name))
        if not options:
            if failures:
                raise _verdict(failures[0])
            message, ptr, keyword = sh.emptied or ("no JSON value satisfies the schema", "", None)
            raise self.unsatisfiable(message, ptr, keyword)
        return options[0] if len(options) == 1 else Alt(tuple(options))

    # -- numbers ---------------------------------------------------------------------------------------------

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
            for m, ptr in sh.multiples:
                d = d.intersect(_modulus_cdfa(m)).minimized()
            for m, ptr in sh.neg_multiples:
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

    # -- strings ---------------------------------------------------------------------------------------------

    def string_expr(self, sh: _Shape) -> Expr:
        if sh.max_len is not None and sh.min_len > sh.max_len:
            raise self.unsatisfiable(f"minLength {sh.min_len} is above maxLength {sh.max_len}", *sh.min_len_at)
        decoded = sh.patterns or sh.formats or sh.str_excluded or sh.neg_patterns or sh.neg_formats
        if not decoded:
            if sh.min_len == 0 and sh.max_len is None:
                return self.shared("json_string")
            return self.length_expr(sh.min_len, sh.max_len)
        if (
            len(sh.formats) == 1 and not sh.patterns and not sh.str_excluded and not sh.neg_patterns
            and not sh.neg_formats and sh.min_len == 0 and sh.max_len is None
        ):  # fmt: skip
            return Regex(_quoted(_FORMATS_ENCODED[sh.formats[0][0]]))
        at = (sh.patterns or sh.formats or sh.neg_patterns or sh.neg_formats or [("", "")])[0][1]
        keyword = "pattern" if sh.patterns or sh.neg_patterns else "format"
        key = self.string_key(sh)
        found = _string_automaton(key, sh.min_len, sh.max_len)
        length_at = sh.max_len_at if sh.max_len is not None else sh.min_len_at
        if found is _StringOutcome.EMPTY:
            raise self.unsatisfiable("no string satisfies the pattern/format constraints together", *self.string_at(sh))
        if found is _StringOutcome.EMPTY_AT_LENGTHS:
            raise self.unsatisfiable("no string of the allowed lengths satisfies the pattern/format", *length_at)
        if found is _StringOutcome.NEEDS_BLOCKS:
            if sh.max_len is not None:
                try:
                    return self.length_blocks(_string_language(key), sh.min_len, sh.max_len)
                except _TooLarge:
                    pass
            self.refuse(
                *length_at,
                "a length bound together with a pattern or format needs too large an automaton",
                "the length bound ignored",
            )  # fmt: skip
            found = _string_automaton(key, 0, None)
        if found is _StringOutcome.TOO_LARGE:
            self.refuse(at, keyword, "the string constraints need too large an automaton", "any string allowed")
            return self.shared("json_string")
        assert isinstance(found, Automaton)
        return found

    def length_blocks(self, d: _CDFA, lo: int, hi: int) -> Expr:
        """See :meth:`blocks_of`; tries shorter blocks while the block regexes are too large."""
        for size in (32, 16, 8, 4):
            if hi // size > 64:
                break
            saved = dict(self.rules)
            try:
                return self.blocks_of(d, lo, hi, size)
            except _TooLarge:
                self.rules = saved
        raise _TooLarge("blocks")

    def blocks_of(self, d: _CDFA, lo: int, hi: int, size: int) -> Expr:
        """Strings of ``d`` with lo <= length <= hi when the product automaton would be too large: a string is cut
        into blocks of ``size`` characters and a shorter remainder. One regex per (state, state) for
        a block, one rule per (state, blocks so far): deterministic (a block's end state is fixed by the DFA) and
        the stack grows by one call per block."""
        d = d.minimized()
        if d.n > 12:
            raise _TooLarge("pattern states")
        prefix = f"blocks{len(self.rules)}."
        while any(name.startswith(prefix) for name in self.rules):
            prefix += "x"
        budget = [MAX_COUNTED_BYTE_STATES]

        def counted_rule(name: str, lang: _CDFA, a: int, b: int) -> str | None:
            """A rule for the strings of ``lang`` with ``a`` to ``b`` characters (None when there are none)."""
            if name in self.rules:
                return name
            dfa = _counted_dfa(lang, a, b)
            if dfa.is_empty:
                return None
            budget[0] -= dfa.num_states
            if budget[0] < 0:
                raise _TooLarge("blocks")
            self.rules[name] = Automaton(dfa)
            return name

        def block(p: int, q: int) -> str | None:
            return counted_rule(f"{prefix}b{p}.{q}", d.from_state(p, q), size, size)

        def remainder(p: int, a: int, b: int) -> str | None:
            return counted_rule(f"{prefix}r{p}.{a}.{b}", d.from_state(p), a, b)

        made: dict[tuple[int, int], bool] = {}

        def rule(p: int, j: int) -> bool:
            """Define M(p, j): the rest of a string from state p after j blocks; False when empty."""
            key = (p, j)
            if key in made:
                return made[key]
            made[key] = False
            options: list[Expr] = []
            if (j + 1) * size <= hi:
                for q in range(d.n):
                    b = block(p, q)
                    if b is not None and rule(q, j + 1):
                        options.append(Seq((Ref(b), Ref(f"{prefix}m{q}.{j + 1}"))))
            a, c = max(0, lo - j * size), min(size - 1, hi - j * size)
            if a <= c:
                r = remainder(p, a, c)
                if r is not None:
                    options.append(Ref(r))
            if options:
                self.rules[f"{prefix}m{p}.{j}"] = options[0] if len(options) == 1 else Alt(tuple(options))
                made[key] = True
            return made[key]

        if not rule(0, 0):
            raise _TooLarge("empty")
        return Seq((Literal('"'), Ref(f"{prefix}m0.0"), Literal('"')))

    def search(self, pattern: str, ptr: str) -> _CDFA | None:
        """Strings in which ``pattern`` matches somewhere (ECMAScript ``pattern`` semantics); None, with the
        pattern refused, when it is not supported."""
        try:
            return _searched(pattern)
        except (RegexError, _TooLarge) as exc:
            kw = ptr.rsplit("/", 2)[-2] if "/patternProperties/" in ptr else "pattern"
            self.refuse(ptr, kw, f"unsupported regex {pattern!r}: {exc}", "ignored")
            return None

    def string_key(self, sh: _Shape) -> _StringKey:
        """What ``sh`` says of a string's decoded text, the patterns that cannot be honoured left out (and
        refused): the key of the languages shared per process."""
        return _StringKey(
            tuple(p for p, ptr in sh.patterns if self.search(p, ptr) is not None),
            tuple(name for name, _ in sh.formats),
            tuple(sorted(sh.str_excluded)),
            tuple(p for p, ptr in sh.neg_patterns if self.search(p, ptr) is not None),
            tuple(name for name, _ in sh.neg_formats),
        )

    def string_cdfa(self, sh: _Shape) -> _CDFA | None:
        """The decoded strings ``sh`` allows, or None when the string constraints are only lengths."""
        if not (sh.patterns or sh.formats or sh.str_excluded or sh.neg_patterns or sh.neg_formats):
            return None
        d = _string_language(self.string_key(sh))
        if d is None:
            raise _TooLarge("string constraints")
        if d.is_empty():
            raise self.unsatisfiable("no string satisfies the pattern/format constraints together", *self.string_at(sh))
        return d

    def string_at(self, sh: _Shape) -> tuple[str, str]:
        """The pointer and keyword an unsatisfiable string constraint is reported at."""
        for pattern, ptr in sh.patterns:
            if self.search(pattern, ptr) is not None:
                return ptr, "pattern"
        if sh.formats:
            return sh.formats[0][1], "format"
        return (sh.neg_patterns or sh.neg_formats or [("", "")])[0][1], "pattern"

    def encoded(self, d: _CDFA, ptr: str, keyword: str) -> Expr | None:
        """The JSON strings (quotes included) whose canonical bodies decode to the language ``d`` (None when
        refused)."""
        try:
            return _automaton_of(d.encode_json().minimized(), quoted=True)
        except _TooLarge:
            self.refuse(ptr, keyword, "the string constraints need too large an automaton", "any string allowed")
            return None

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

    def length_expr(self, lo: int, hi: int | None) -> Expr:
        quote_ = Literal('"')
        top = hi if hi is not None else lo
        if top <= LENGTH_BLOCK_THRESHOLD:
            name = f"json_string_{lo}_{'' if hi is None else hi}"
            if name not in self.rules:
                self.rules[name] = _counted_chars(lo, hi, True, True)
            return Ref(name)
        # Blocks of characters and the tail with the closing quote are rules of their own that call nothing: the
        # wide states of a long string are then lexical, and their walks are shared (see LexicalMasks).
        b = LENGTH_BLOCK
        block = self.shared(f"json_chars_{b}")
        if hi is None:
            q, r = divmod(lo, b)
            return Seq((quote_, Repeat(block, q, q), self.string_tail(r, None)))
        groups: list[list[int]] = []  # [k_first, k_last, r_lo, r_hi]
        for k in range(hi // b + 1):
            r_lo, r_hi = max(0, lo - k * b), min(b - 1, hi - k * b)
            if r_lo > r_hi:
                continue
            if groups and groups[-1][1] == k - 1 and groups[-1][2:] == [r_lo, r_hi]:
                groups[-1][1] = k
            else:
                groups.append([k, k, r_lo, r_hi])
        options = tuple(Seq((Repeat(block, k1, k2), self.string_tail(r1, r2))) for k1, k2, r1, r2 in groups)
        return Seq((quote_, options[0] if len(options) == 1 else Alt(options)))

    def string_tail(self, lo: int, hi: int | None) -> Ref:
        """A shared rule: between ``lo`` and ``hi`` characters, then the closing quote."""
        name = f"json_tail_{lo}_{'' if hi is None else hi}"
        if name not in self.rules:
            self.rules[name] = _counted_chars(lo, hi, False, True)
        return Ref(name)

    # -- arrays ----------------------------------------------------------------------------------------------

    def array_expr(self, sh: _Shape, depth: int | None, name: str) -> Expr:
        if sh.max_items is not None and sh.min_items > sh.max_items:
            raise self.unsatisfiable(f"minItems {sh.min_items} is above maxItems {sh.max_items}", *sh.min_items_at)
        lay = self.layout(depth)
        cd = _child_depth(depth)
        prefixes: list[list[str]] = []
        rests: list[str | None] = []
        contains: list[tuple[str, int, int | None]] = []
        for part in sh.array_parts:
            node = self.node(part.ptr)
            live = set(self.live_keys(part))
            items = node.get("items") if "items" in live else None
            if isinstance(items, list):
                prefix = [f"{part.ptr}/items/{i}" for i in range(len(items))]
                rest = f"{part.ptr}/additionalItems" if "additionalItems" in live else None
            else:
                prefix = []
                if "prefixItems" in live and "prefixItems" in self.doc.keywords:
                    prefix = [f"{part.ptr}/prefixItems/{i}" for i in range(len(node["prefixItems"]))]
                rest = f"{part.ptr}/items" if items is not None else None
            if "contains" in live and "contains" in self.doc.keywords:
                has_counts = not self.doc.legacy
                low = node.get("minContains", 1) if has_counts else 1
                high = node.get("maxContains") if has_counts else None
                contains.append((f"{part.ptr}/contains", int(low), None if high is None else int(high)))
            if "unevaluatedItems" in live and self.known_here("unevaluatedItems"):
                prefix, rest = self.unevaluated_items(part, prefix, rest, sh)
            prefixes.append(prefix)
            rests.append(rest)
        max_n = sh.max_items
        elements: list[Ref] = []
        k = max((len(p) for p in prefixes), default=0)
        for i in range(k):
            if max_n is not None and i >= max_n:
                break
            conj = [p[i] if i < len(p) else r for p, r in zip(prefixes, rests) if i < len(p) or r is not None]
            conj = [x for x in conj if x is not None]
            try:
                elements.append(self.conj([_Part(x) for x in conj], cd))
            except _Unsatisfiable:
                max_n = i
                break
        rest_parts = [_Part(r) for r in rests if r is not None]
        rest_expr: Ref | None = None
        if max_n is None or max_n > len(elements):
            try:
                rest_expr = self.conj(rest_parts, cd)
            except _Unsatisfiable:
                rest_expr = None
        if rest_expr is None:
            max_n = len(elements) if max_n is None else min(max_n, len(elements))
        if max_n is not None and sh.min_items > max_n:
            at = sh.min_items_at if sh.min_items_at[0] else (sh.array_parts[0].ptr + "/items", "items")
            raise self.unsatisfiable(f"at least {sh.min_items} items are needed but at most {max_n} can be valid", *at)
        if sh.unique is not None and (max_n is None or max_n > 1):
            finite = None
            if not elements and not contains and rest_parts:
                try:
                    finite = self.finite_candidates(self.normalise(rest_parts))
                except _Unsatisfiable:
                    finite = None
            if finite is not None and len(finite) <= MAX_UNIQUE_ENUM:
                return self.unique_items_expr(finite, sh.min_items, max_n, lay, cd, name, sh.unique)
            self.refuse(
                sh.unique, "uniqueItems", "uniqueness of array items cannot be expressed by a grammar (unless the "
                f"items come from an enum of at most {MAX_UNIQUE_ENUM} values)", "dropped",
            )  # fmt: skip
        if contains:
            low = max(c[1] for c in contains)
            if len(contains) > 1 or elements:
                if low > 0 or any(c[2] is not None for c in contains):
                    self.refuse(
                        contains[0][0],
                        "contains",
                        "contains is supported only once per array and without prefix items",
                        "ignored",
                    )
            elif not (contains[0][1] == 0 and contains[0][2] is None):
                return self.contains_expr(sh, contains[0], rest_parts, rest_expr, max_n, lay, cd)
        k = len(elements)
        tail: Expr | None = None
        if rest_expr is not None and (max_n is None or max_n > k):
            tail = Repeat(Seq((lay.comma, rest_expr)), max(0, sh.min_items - k), None if max_n is None else max_n - k)
        nonempty: Expr | None
        if k == 0:
            if rest_expr is None or max_n == 0:
                nonempty = None
            else:
                more = Repeat(
                    Seq((lay.comma, rest_expr)), max(0, sh.min_items - 1), None if max_n is None else max_n - 1
                )
                nonempty = Seq((rest_expr, more))
        else:
            x = tail
            nonempty = None
            for i in reversed(range(k)):
                s_i = Seq((elements[i],) + ((x,) if x is not None else ()))
                if i == 0:
                    nonempty = s_i
                    break
                item = Seq((lay.comma, s_i))
                x = item if i < sh.min_items else Repeat(item, 0, 1)
        return self.bracketed(nonempty, sh.min_items == 0, lay.arr_open, lay.arr_close, lay.arr_empty, sh.min_items_at)

    def unique_items_expr(
        self, values: list, min_items: int, max_n: int | None, lay: _Layout, cd, name: str, at: str
    ) -> Expr:
        """Arrays of distinct values from a small finite set: one rule per set of values used so far."""
        literals = [self.value_literal(_canonical_value(v), cd) for v in values]
        cap = len(values) if max_n is None else min(len(values), max_n)
        if min_items > cap:
            raise self.unsatisfiable(f"{min_items} distinct items are needed but only {cap} can be", at, "uniqueItems")

        def options(mask: int) -> list[Expr]:
            used = bin(mask).count("1")
            out: list[Expr] = []
            if used < cap:
                for i, lit in enumerate(literals):
                    if not mask >> i & 1:
                        out.append(Seq(((lay.comma,) if mask else ()) + (lit, rule(mask | 1 << i))))
            if used >= min_items:
                out.append(Seq(()))
            return out

        def rule(mask: int) -> Ref:
            rname = f"{name}/unique{mask}"
            if rname not in self.rules:
                self.rules[rname] = Seq(())
                opts = options(mask)
                self.rules[rname] = opts[0] if len(opts) == 1 else Alt(tuple(opts))
            return Ref(rname)

        top = [o for o in options(0) if o != Seq(())]
        nonempty = None if not top else top[0] if len(top) == 1 else Alt(tuple(top))
        return self.bracketed(nonempty, min_items == 0, lay.arr_open, lay.arr_close, lay.arr_empty, (at, "uniqueItems"))

    def bracketed(self, nonempty, empty_ok, open_, close, empty, at) -> Expr:
        options = []
        if empty_ok:
            options.append(empty)
        if nonempty is not None:
            options.append(Seq((open_, nonempty, close)))
        if not options:
            raise self.unsatisfiable("no container satisfies the constraints", *at)
        return options[0] if len(options) == 1 else Alt(tuple(options))

    def contains_expr(self, sh, contains, rest_parts, rest_expr, max_n, lay, cd) -> Expr:
        c_ptr, min_c, max_c = contains
        at = (c_ptr, "contains")
        match = None
        try:
            match = self.conj(rest_parts + [_Part(c_ptr)], cd)
        except _Unsatisfiable:
            pass
        if max_c is not None:
            try:
                negations = self.negate(c_ptr)
            except _NotNegatable as exc:
                self.refuse(c_ptr.rsplit("/", 1)[0] + "/maxContains", "maxContains", str(exc), "ignored")
                max_c = None
            else:
                others = []
                for d in negations:
                    try:
                        ref = self.conj(rest_parts + list(d), cd)
                    except _Unsatisfiable:
                        continue
                    if ref not in others:
                        others.append(ref)
                other: Expr | None = None if not others else others[0] if len(others) == 1 else Alt(tuple(others))
        if max_c is None:
            other = rest_expr
        if match is None:
            if min_c > 0:
                raise self.unsatisfiable("no item can satisfy contains", *at)
        if max_n is None:
            t_cap = max(sh.min_items, 1)
        else:
            t_cap = max_n
        c_cap = min_c if max_c is None else max_c
        if (t_cap + 1) * (c_cap + 1) > 2000:
            self.refuse(c_ptr, "contains", "the item counts need too large an automaton", "ignored")
            return self.bracketed(None, True, lay.arr_open, lay.arr_close, lay.arr_empty, at)
        index: dict[tuple[int, int], int] = {}
        order: list[tuple[int, int]] = []

        def state(t: int, c: int) -> int:
            if (t, c) not in index:
                index[(t, c)] = len(order)
                order.append((t, c))
            return index[(t, c)]

        state(0, 0)
        edges: list[list[tuple[int, int, int]]] = []
        accept: list[bool] = []
        i = 0
        while i < len(order):
            t, c = order[i]
            row = []
            t2 = t + 1
            if max_n is None:
                t2 = min(t2, t_cap)
            if max_n is None or t + 1 <= max_n:
                first = 0 if t == 0 else 2
                if other is not None:
                    row.append((first, first, state(t2, c)))
                if match is not None:
                    c2 = c + 1 if max_c is not None else min(c + 1, c_cap)
                    if max_c is None or c2 <= max_c:
                        row.append((first + 1, first + 1, state(t2, c2)))
            edges.append(row)
            accept.append(t >= sh.min_items and c >= min_c)
            i += 1
        dfa = _CDFA(edges, accept)
        empty_ok = accept[0]
        dfa.accept[0] = False
        dfa = dfa.minimized()
        ast = None if dfa.is_empty() else dfa.to_ast()
        symbols = [
            other or Seq(()), match or Seq(()), Seq((lay.comma, other or Seq(()))), Seq((lay.comma, match or Seq(()))),
        ]  # fmt: skip
        nonempty = None if ast is None else _ast_to_expr(ast, symbols)
        return self.bracketed(nonempty, empty_ok, lay.arr_open, lay.arr_close, lay.arr_empty, at)

    def unevaluated_items(self, part: _Part, prefix: list, rest: str | None, sh: _Shape) -> tuple[list, str | None]:
        """``unevaluatedItems`` of ``part``: items past every prefix evaluated in place (in this conjunction)."""
        if rest is not None:
            return prefix, rest  # "items" evaluates every item past the prefix
        ptr = f"{part.ptr}/unevaluatedItems"
        length = len(prefix)
        evaluates_all = False
        with_contains = "contains" in self.live_keys(part)
        scope = self.in_place(part.ptr)
        for q in sh.parts:
            if q.neg is not None or q.ptr not in scope or q.ptr == part.ptr:
                continue
            qnode = self.node(q.ptr)
            qlive = set(self.live_keys(q))
            items = qnode.get("items") if "items" in qlive else None
            if isinstance(items, list):
                length = max(length, len(items))
                evaluates_all |= "additionalItems" in qlive
            elif items is not None:
                evaluates_all = True
            if "prefixItems" in qlive:
                length = max(length, len(qnode["prefixItems"]))
            evaluates_all |= "unevaluatedItems" in qlive
            with_contains |= "contains" in qlive
        if evaluates_all:
            return prefix, None
        if with_contains:
            self.refuse(ptr, "unevaluatedItems", "unevaluatedItems together with contains is not supported", "ignored")
            return prefix, None
        return prefix + [None] * (length - len(prefix)), ptr

    # -- objects ---------------------------------------------------------------------------------------------

    def object_expr(self, sh: _Shape, depth: int | None, name: str) -> Expr:
        if sh.max_props is not None and sh.min_props > sh.max_props:
            raise self.unsatisfiable(
                f"minProperties {sh.min_props} is above maxProperties {sh.max_props}", *sh.min_props_at
            )
        lay = self.layout(depth)
        cd = _child_depth(depth)
        infos = [self.object_info(part, sh) for part in sh.object_parts]
        closed = (
            (not self.ap_default)
            and any(i.props for i in infos)
            and not any(i.patterns or i.additional or i.unevaluated for i in infos)
        )
        names: list[str] = []
        for info in infos:
            names.extend(n for n in info.props if n not in names)
        names.extend(n for n in sh.required if n not in names)
        names.extend(n for n in sh.forbidden if n not in names)
        items: list[tuple[str, Expr, bool]] = []
        for key in names:
            value = None
            if key not in sh.forbidden:
                vparts: list[str] = []
                declared = False
                for info in infos:
                    matched = False
                    if key in info.props:
                        vparts.append(info.props[key])
                        matched = True
                    for pattern, pptr in info.patterns:
                        c = self.search(pattern, pptr)
                        if c is not None and c.accepts(key):
                            vparts.append(pptr)
                            matched = True
                    declared = declared or matched
                    if info.additional is not None and not matched:
                        vparts.append(info.additional)
                    if info.unevaluated is not None and not info.evaluates(self, key):
                        vparts.append(info.unevaluated)
                cause = None
                if closed and not declared and key not in sh.required:
                    cause = "additional properties are closed (additional_properties_default=False)"
                elif not self.name_allowed(sh, key):
                    cause = "the name fails propertyNames"
                else:
                    try:
                        value = self.conj([_Part(v) for v in vparts], cd)
                    except _Unsatisfiable as exc:
                        value, cause = None, _verdict(exc)
            else:
                cause = "it is excluded"
            required = key in sh.required
            if value is None:
                if required:
                    if isinstance(cause, _Unsatisfiable):
                        raise _Unsatisfiable(
                            f"the required property {key!r} (required at {_clean_pointer(sh.required[key])!r}) "
                            f"cannot be present: {cause.reason}",
                            cause.pointer,
                            cause.keyword,
                        )
                    raise self.unsatisfiable(
                        f"the required property {key!r} cannot be present: {cause}", sh.required[key], "required"
                    )
                continue
            # shared: read first or after a comma, a member is built once (see members_plain)
            items.append((key, shared(_then(Literal(_json_string(key)), lay.colon, value)), required))
        extra = None if closed else self.additional_member(sh, infos, names, lay, cd)
        n_req = sum(1 for it in items if it[2])
        max_possible = None if extra is not None else len(items)
        if max_possible is not None and sh.min_props > max_possible:
            raise self.unsatisfiable(
                f"minProperties {sh.min_props} but at most {max_possible} properties can be valid", *sh.min_props_at
            )
        if sh.max_props is not None and sh.max_props < n_req:
            raise self.unsatisfiable(
                f"maxProperties {sh.max_props} is below the {n_req} required properties", *sh.max_props_at
            )
        counting = sh.min_props > n_req or (
            sh.max_props is not None and (max_possible is None or sh.max_props < max_possible)
        )
        if extra is not None and sh.min_props - n_req >= 2:
            # Additional keys may repeat (a grammar cannot remember them); a repeated key would count twice here
            # and once in the parsed object.
            self.refuse(
                *sh.min_props_at, "minProperties could be met by repeating an additional property's key",
                "kept; a repeated key counts twice",
            )  # fmt: skip
        if counting:
            if extra is not None and not isinstance(extra, Ref):
                self.rules[f"{name}/additional"] = extra  # one rule, however many counts it may appear at
                extra = Ref(f"{name}/additional")
            result = self.members_counted(items, extra, sh, lay, name)
        else:
            result = None
        if result is None:
            result = self.members_plain(items, extra, lay, name)
        nonempty, empty_ok = result
        at = (
            sh.min_props_at
            if sh.min_props_at[0]
            else ((sh.object_parts[0].ptr if sh.object_parts else ""), "properties")
        )
        return self.bracketed(nonempty, empty_ok, lay.obj_open, lay.obj_close, lay.obj_empty, at)

    def name_allowed(self, sh: _Shape, key: str) -> bool:
        if not sh.prop_names:
            return True
        try:
            return self.doc.is_valid(sh.prop_names, key)
        except _TIME_LIMIT:
            raise
        except Exception as exc:
            raise JsonSchemaError(
                f"cannot evaluate propertyNames: {exc}", _clean_pointer(sh.prop_names[0].ptr), "propertyNames"
            ) from None

    def property_names_cdfa(self, sh: _Shape) -> _CDFA | None:
        if not sh.prop_names:
            return None
        at = sh.prop_names[0].ptr
        try:
            parts = self.normalise(sh.prop_names)
        except _Unsatisfiable:
            return _CDFA.empty()
        if not parts:
            return None
        for part in parts:
            node = self.node(part.ptr) if part.neg is None else {}
            for kw in ("const", "enum"):
                if kw in node and kw not in part.skip:
                    values = [node[kw]] if kw == "const" else node[kw]
                    names = [v for v in values if isinstance(v, str) and self.doc.is_valid(parts, v)]
                    return _CDFA.literals(names).minimized()
            if part.neg is None and any(kw in node and kw not in part.skip for kw in _BRANCHING):
                self.refuse(
                    at, "propertyNames", "only string constraints and enums are supported in propertyNames", "ignored"
                )
                return None
        sub = self.merge(parts)
        if "string" not in sub.kinds:
            return _CDFA.empty()
        d = self.string_cdfa(sub)
        if sub.min_len > 0 or sub.max_len is not None:
            if sub.max_len is not None and sub.min_len > sub.max_len:
                return _CDFA.empty()
            length = _CDFA.length(sub.min_len, sub.max_len)
            d = length if d is None else d.intersect(length).minimized()
        return d

    def additional_member(self, sh: _Shape, infos, names: list[str], lay: _Layout, cd: int | None) -> Expr | None:
        patterns: dict[str, str] = {}  # pattern -> a pointer where it appears
        for info in infos:
            for p, pp in info.patterns + info.evaluated_patterns:
                patterns.setdefault(p, pp)
        if len(patterns) > MAX_PATTERN_PROPERTIES:
            ptr = next(iter(patterns.values()))
            self.refuse(
                ptr.rsplit("/", 1)[0], "patternProperties",
                f"more than {MAX_PATTERN_PROPERTIES} patternProperties apply to one object", "no additional properties",
            )  # fmt: skip
            return None
        search_of = {p: self.search(p, pp) for p, pp in patterns.items()}
        if any(c is None for c in search_of.values()):
            return None  # lenient: an unsupported pattern; additional properties are not produced
        order = list(patterns)
        try:
            allowed_names = self.property_names_cdfa(sh)
        except _TooLarge:
            self.refuse(sh.prop_names[0].ptr, "propertyNames", "propertyNames needs too large an automaton", "ignored")
            allowed_names = None
        members: list[Expr] = []
        for mask in range(2 ** len(order)):
            chosen = {p for i, p in enumerate(order) if mask >> i & 1}
            vparts: list[str] = []
            for info in infos:
                hit = [pp for p, pp in info.patterns if p in chosen]
                vparts.extend(hit)
                if not hit and info.additional is not None:
                    vparts.append(info.additional)
                if (
                    info.unevaluated is not None
                    and not info.evaluates_all
                    and not any(p in chosen for p, _ in info.patterns + info.evaluated_patterns)
                ):
                    vparts.append(info.unevaluated)
            try:
                value = self.conj([_Part(v) for v in vparts], cd)
            except _Unsatisfiable:
                continue
            if not order and allowed_names is None and not names:
                key: Expr = self.shared("json_string")
            elif not order and allowed_names is None:
                key = self.key_except(names)
            else:
                d = _CDFA.universal()
                try:
                    for p in order:
                        d = (d.intersect(search_of[p]) if p in chosen else d.minus(search_of[p])).minimized()
                    if names:
                        d = d.minus(_CDFA.literals(names)).minimized()
                    if allowed_names is not None:
                        d = d.intersect(allowed_names).minimized()
                except _TooLarge:
                    self.refuse(
                        _clean_pointer(vparts[0] if vparts else ""), "patternProperties",
                        "the keys need too large an automaton", "not produced",
                    )  # fmt: skip
                    continue
                if d.is_empty():
                    continue
                quoted = self.encoded(d, vparts[0] if vparts else "", "patternProperties" if order else "propertyNames")
                if quoted is None:
                    continue
                key = quoted
            members.append(Seq((key, lay.colon, value)))
        if not members:
            return None
        return members[0] if len(members) == 1 else Alt(tuple(members))

    def key_except(self, names: list[str]) -> Ref:
        """A JSON string other than the given names (see :func:`_key_except_dfa`). A rule that calls no other rule,
        so its automaton returns only after the closing quote and its string states share their masks with every
        other string (see :class:`~constrain.runtime.lexical.LexicalMasks`)."""
        rule = "json_key_except:" + json.dumps(sorted(names), ensure_ascii=False)
        if rule not in self.rules:
            self.rules[rule] = Automaton(_key_except_dfa(tuple(sorted(set(names)))))
        return Ref(rule)

    def in_place(self, ptr: str) -> set[str]:
        """Pointers of the subschemas evaluated in place of ``ptr`` (whose annotations it sees)."""
        hit = self._in_place.get(ptr)
        if hit is not None:
            return hit
        seen = {ptr}
        work = [ptr]
        while work:
            q = work.pop()
            node = self.node(q)
            if not isinstance(node, Mapping):
                continue
            subs: list[str] = []
            if "$ptr" in node:
                subs.append(node["$ptr"])
            for kw in ("$ref", "$dynamicRef", "$recursiveRef"):
                if kw in node and self.known_here(kw):
                    subs.append(self.doc.resolve(q, node[kw], kw))
            for kw in ("allOf", "anyOf", "oneOf"):
                if kw in node:
                    subs.extend(f"{q}/{kw}/{i}" for i in range(len(node[kw])))
            for kw in ("if", "then", "else"):
                if kw in node:
                    subs.append(f"{q}/{kw}")
            if isinstance(node.get("dependentSchemas"), Mapping):
                subs.extend(f"{q}/dependentSchemas/{_escape_token(k)}" for k in node["dependentSchemas"])
            for sub in subs:
                if sub not in seen:
                    seen.add(sub)
                    work.append(sub)
        self._in_place[ptr] = seen
        return seen

    def closed_by_default(self, node: Mapping, live: set[str]) -> bool:
        """Whether ``additional_properties_default=False`` closes this object schema: it names properties (all
        its required ones among them) and says nothing about other keys."""
        required = node.get("required", []) if "required" in live else []
        return (
            not self.ap_default
            and "properties" in live
            and bool(node.get("properties"))
            and not live & {"additionalProperties", "patternProperties", "unevaluatedProperties"}
            and all(isinstance(r, str) and r in node["properties"] for r in required)
        )

    def object_info(self, part: _Part, sh: _Shape) -> _ObjectInfo:
        node = self.node(part.ptr)
        live = set(self.live_keys(part))
        props = node.get("properties", {}) if "properties" in live else {}
        pats = node.get("patternProperties", {}) if "patternProperties" in live else {}
        info = _ObjectInfo(
            {n: f"{part.ptr}/properties/{_escape_token(n)}" for n in props},
            [(p, f"{part.ptr}/patternProperties/{_escape_token(p)}") for p in pats],
            f"{part.ptr}/additionalProperties" if "additionalProperties" in live else None,
        )
        if self.closed_by_default(node, live):  # as if this part said additionalProperties false itself
            info.additional = self.doc.add_synthetic(part.ptr, {"additionalProperties": False}) + "/additionalProperties"
        if "unevaluatedProperties" in live and self.known_here("unevaluatedProperties") and info.additional is None:
            info.unevaluated = f"{part.ptr}/unevaluatedProperties"
            info.evaluated_names = set(info.props)
            scope = self.in_place(part.ptr)
            for q in sh.parts:
                if q.neg is not None or q.ptr not in scope or q.ptr == part.ptr:
                    continue
                qnode = self.node(q.ptr)
                qlive = set(self.live_keys(q))
                if "properties" in qlive:
                    info.evaluated_names.update(qnode["properties"])
                if "patternProperties" in qlive:
                    info.evaluated_patterns.extend(
                        (p, f"{q.ptr}/patternProperties/{_escape_token(p)}") for p in qnode["patternProperties"]
                    )
                if "additionalProperties" in qlive or "unevaluatedProperties" in qlive:
                    info.evaluates_all = True
            if info.evaluates_all:
                info.unevaluated = None
        return info

    def members_plain(self, items, extra, lay: _Layout, name: str) -> tuple[Expr | None, bool]:
        n = len(items)
        tail_extra = Repeat(Seq((lay.comma, extra))) if extra is not None else None
        # Each member after a comma, optional unless required: built once, shared by every option's tail.
        following = [Seq((lay.comma, member)) for _, member, _ in items]
        following = [item if required else Repeat(item, 0, 1) for item, (_, _, required) in zip(following, items)]
        first_required = next((i for i, it in enumerate(items) if it[2]), None)
        last = first_required if first_required is not None else n - 1
        # One flat sequence per option: its rest joins the states built for the first option's (see
        # grammar._build), and so its first member, which is shared, is entered where it is read after a comma.
        options: list[Expr] = [
            Seq((items[j][1], *self.members_after(following, tail_extra, name, j + 1).items)) for j in range(last + 1)
        ]
        if first_required is None and extra is not None:
            options.append(Seq((extra, tail_extra)))
        nonempty = None if not options else options[0] if len(options) == 1 else Alt(tuple(options))
        return nonempty, first_required is None

    def members_after(self, following: list[Expr], tail_extra: Expr | None, name: str, i: int) -> Expr:
        """The members ``following[i:]`` in order, then the extra members: every 16 members the rest is a rule of
        its own (``name/tail16``...), shared by the options before it, so an object's DFA stays linear in its
        number of properties."""
        n, block = len(following), 16
        seq: list[Expr] = []
        j = i
        while j < n:
            if j > i and j % block == 0 and n - j > block:
                rule = f"{name}/tail{j}"
                if rule not in self.rules:
                    self.rules[rule] = Seq(())
                    self.rules[rule] = self.members_after(following, tail_extra, name, j)
                seq.append(Ref(rule))
                break
            seq.append(following[j])
            j += 1
        else:
            if tail_extra is not None:
                seq.append(tail_extra)
        return Seq(tuple(seq))

    def members_counted(self, items, extra, sh: _Shape, lay: _Layout, name: str) -> tuple[Expr | None, bool] | None:
        n = len(items)
        lo, hi = sh.min_props, sh.max_props
        cap = hi if hi is not None else lo
        if (n + 1) * (min(cap, n) + 2) * (n + 1) > 200_000:
            at = sh.max_props_at if hi is not None else sh.min_props_at
            self.refuse(at[0], at[1], "counting this many optional properties needs too many rules", "ignored")
            return None
        required_from = [None] * (n + 1)
        nxt = None
        for i in reversed(range(n)):
            if items[i][2]:
                nxt = i
            required_from[i] = nxt

        def options_at(i: int, c: int) -> list[Expr]:
            options: list[Expr] = []
            sep = (lay.comma,) if c > 0 else ()
            r = required_from[i]
            last = r if r is not None else n - 1
            for j in range(i, last + 1):
                c2 = c + 1
                if hi is not None and c2 > hi:
                    break
                follow = rule(j + 1, c2 if hi is not None else min(c2, cap))
                options.append(Seq(sep + (items[j][1], follow)))
            if r is None:
                k_lo = max(0, lo - c)
                k_hi = None if hi is None else hi - c
                if extra is None:
                    k_hi = 0
                if k_hi is None or k_lo <= k_hi:
                    if c > 0:
                        options.append(Repeat(Seq((lay.comma, extra)), k_lo, k_hi) if extra is not None else Seq(()))
                    else:
                        if k_lo == 0:
                            options.append(Seq(()))
                        if extra is not None and (k_hi is None or k_hi >= 1):
                            more = Repeat(Seq((lay.comma, extra)), max(0, k_lo - 1), None if k_hi is None else k_hi - 1)
                            options.append(Seq((extra, more)))
            return options

        def rule(i: int, c: int) -> Ref:
            rname = f"{name}/m{i}.{c}"
            if rname not in self.rules and rname not in self.names:
                self.names.add(rname)
                options = options_at(i, c)
                if options:
                    self.rules[rname] = options[0] if len(options) == 1 else Alt(tuple(options))
            return Ref(rname)

        top = options_at(0, 0)
        empty_ok = Seq(()) in top
        top = [o for o in top if o != Seq(())]
        nonempty = None if not top else top[0] if len(top) == 1 else Alt(tuple(top))
        return nonempty, empty_ok

    # -- the whole schema ------------------------------------------------------------------------------------

    def compile(self) -> Grammar:
        depth = 0 if self.whitespace == "indent" else None
        root = self.conj((_Part(""),), depth)
        self.rules["root"] = root
        return Grammar(_finalize(self.rules, "root", self.library), "root")


def _num_text(v: Decimal) -> str:
    return format(v.normalize(), "f")


def _floor(v: Decimal) -> int:
    from decimal import ROUND_FLOOR

    return int(v.to_integral_value(rounding=ROUND_FLOOR))


def _ceil(v: Decimal) -> int:
    from decimal import ROUND_CEILING

    return int(v.to_integral_value(rounding=ROUND_CEILING))


def _int_above(v: Decimal, strict: bool) -> int:
    return _floor(v) + 1 if strict else _ceil(v)


def _int_below(v: Decimal, strict: bool) -> int:
    return _ceil(v) - 1 if strict else _floor(v)


# ==============================================================================================================
# Grammar clean-up: unproductive rules, alias cycles, reachability (build_pushdown resolves plain aliases)


# The walks below meet the same subtree many times where branches were inlined (an option's body is shared by
# every branch that kept it), so composite nodes are looked up by identity in a ``memo`` first.


def _productive(expr: Expr, ok: set[str], memo: dict[int, bool] | None = None) -> bool:
    if isinstance(expr, (Literal, Regex, Automaton)):
        return True
    if isinstance(expr, Ref):
        return expr.rule in ok
    if not isinstance(expr, (Seq, Alt, Repeat)):
        return False
    memo = {} if memo is None else memo
    hit = memo.get(id(expr))
    if hit is None:
        if isinstance(expr, Seq):
            hit = all(_productive(x, ok, memo) for x in expr.items)
        elif isinstance(expr, Alt):
            hit = any(_productive(x, ok, memo) for x in expr.items)
        else:
            hit = expr.min == 0 or _productive(expr.item, ok, memo)
        memo[id(expr)] = hit
    return hit


def _prune(expr: Expr, ok: set[str], memo: dict[int, Expr | None]) -> Expr | None:
    if isinstance(expr, (Literal, Regex, Automaton)):
        return expr
    if isinstance(expr, Ref):
        return expr if expr.rule in ok else None
    if not isinstance(expr, (Seq, Alt, Repeat)):
        return None
    if id(expr) in memo:
        return memo[id(expr)]
    out: Expr | None
    if isinstance(expr, Seq):
        items = []
        for x in expr.items:
            y = _prune(x, ok, memo)
            if y is None:
                items = None
                break
            items.append(y)
        if items is None:
            out = None
        else:
            out = expr if all(a is b for a, b in zip(items, expr.items)) else Seq(tuple(items))
    elif isinstance(expr, Alt):
        kept = [y for y in (_prune(x, ok, memo) for x in expr.items) if y is not None]
        if not kept:
            out = None
        elif len(kept) == len(expr.items) and all(a is b for a, b in zip(kept, expr.items)):
            out = expr  # unchanged: the same object keeps its cached hash
        else:
            out = kept[0] if len(kept) == 1 else Alt(tuple(kept))
    else:
        y = _prune(expr.item, ok, memo)
        if y is None:
            out = Seq(()) if expr.min == 0 else None
        else:
            out = expr if y is expr.item else Repeat(y, expr.min, expr.max)
    memo[id(expr)] = out
    return out


def _then(*items: Expr) -> Seq:
    """``Seq(items)`` with adjacent text literals joined (a member's ``"name":`` rather than the key and the colon):
    the same language and the same automaton, built from fewer expression nodes, which every pass over the grammar
    walks."""
    out: list[Expr] = []
    for item in items:
        if out and type(item) is Literal and type(out[-1]) is Literal:
            a, b = out[-1].value, item.value
            if isinstance(a, str) and isinstance(b, str):
                out[-1] = Literal(a + b)
                continue
        out.append(item)
    return Seq(tuple(out))


def _options(expr: Expr) -> list[Expr]:
    return list(expr.items) if isinstance(expr, Alt) else [expr]


def _reachable(rules: dict[str, Expr], start: str, refs: dict[str, tuple[str, ...]]) -> dict[str, Expr]:
    """The rules ``start`` calls, directly or not (and itself), in their order; ``refs`` (each rule's calls) gets
    those it lacks of the rules reached, so calls are found only for rules that stay. Calls to undefined rules (a
    recursion found unsatisfiable) are left to pruning."""
    keep = {start}
    work = [start]
    while work:
        name = work.pop()
        calls = refs.get(name)
        if calls is None:
            calls = refs[name] = calls_of(rules[name])
        for r in calls:
            if r not in keep and r in rules:
                keep.add(r)
                work.append(r)
    return {name: rules[name] for name in rules if name in keep}


def _finalize(rules: dict[str, Expr], start: str, library: set[str]) -> dict[str, Expr]:
    """The grammar's rules less those that cannot complete or that ``start`` never reaches, with alias cycles
    resolved. The ``library`` rules (see :attr:`_Compiler.library`) are productive and free of alias cycles, so
    only the schema's own rules are analysed."""
    refs: dict[str, tuple[str, ...]] = {}  # each reachable rule's calls, found by _reachable
    rules = _reachable(rules, start, refs)  # first: branches inline their options' bodies, often leaving those unused
    # A rule whose calls are all productive is: calls are counted down, so most rules are settled without a walk.
    # The others (recursions, calls of unproductive or undefined rules) are walked, and walked again only when a
    # rule they call turns out productive.
    ok = {name for name in rules if name in library}
    own = [name for name in rules if name not in ok]
    callers: dict[str, list[str]] = defaultdict(list)
    waiting: dict[str, int] = {}
    for name in own:
        pending = [r for r in refs[name] if r not in ok]
        waiting[name] = len(pending)
        for r in pending:
            callers[r].append(name)
    work: list[str] = []

    def settle(name: str) -> None:
        ok.add(name)
        stack = [name]
        while stack:
            for caller in callers[stack.pop()]:
                waiting[caller] -= 1
                if caller in ok:
                    continue
                if waiting[caller] == 0:
                    ok.add(caller)
                    stack.append(caller)
                else:
                    work.append(caller)

    for name in own:
        if not waiting[name] and name not in ok:
            settle(name)
    work.extend(name for name in own if name not in ok)
    while work:
        name = work.pop()
        if name not in ok and _productive(rules[name], ok):
            settle(name)
    if start not in ok:
        raise _Unsatisfiable(
            "unsatisfiable: no finite JSON value satisfies the schema (every value needs a recursion that never ends)",
            "",
        )
    pruned: dict[str, Expr] = {}
    prune_memo: dict[int, Expr | None] = {}
    changed = False  # whether a rule or a call was dropped: only then can a rule have become unreachable
    for name, body in rules.items():
        if name in ok:
            pruned[name] = body if ok.issuperset(refs[name]) else _prune(body, ok, prune_memo)
            if pruned[name] is not body:
                refs[name] = calls_of(pruned[name])
                changed = True
        else:
            changed = True
    rules = pruned
    # Alias cycles (A = B | x, B = A | y): each rule of the cycle means the union of their other options.
    alias_edges = {
        name: {o.rule for o in _options(body) if isinstance(o, Ref) and o.rule in rules and o.rule not in library}
        for name, body in rules.items()
        if name not in library
    }
    for comp in _sccs(_cyclic_part(alias_edges)):
        if len(comp) == 1 and next(iter(comp)) not in alias_edges[next(iter(comp))]:
            continue
        union: list[Expr] = []
        for name in sorted(comp):
            for o in _options(rules[name]):
                if not (isinstance(o, Ref) and o.rule in comp) and o not in union:
                    union.append(o)
        for name in comp:
            rules[name] = union[0] if len(union) == 1 else Alt(tuple(union))
            refs[name] = calls_of(rules[name])
        changed = True
    return _reachable(rules, start, refs) if changed else rules


def _cyclic_part(graph: Mapping[str, set[str]]) -> dict[str, set[str]]:
    """``graph`` without the nodes that reach no cycle (a node reaching none is on none): almost every grammar
    has no alias cycle, and this is cheaper than finding the components."""
    out_degree = {name: len(targets) for name, targets in graph.items()}
    sources: dict[str, list[str]] = defaultdict(list)
    for name, targets in graph.items():
        for target in targets:
            sources[target].append(name)
    work = [name for name, degree in out_degree.items() if degree == 0]
    while work:
        for source in sources[work.pop()]:
            out_degree[source] -= 1
            if out_degree[source] == 0:
                work.append(source)
    return {name: targets for name, targets in graph.items() if out_degree[name]}


def _sccs(graph: Mapping[str, set[str]]) -> list[set[str]]:
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on: set[str] = set()
    stack: list[str] = []
    out: list[set[str]] = []
    counter = [0]
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph.get(root, ()))))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            advanced = False
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                    advanced = True
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = set()
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.add(w)
                    if w == v:
                        break
                out.append(comp)
    return out


# ==============================================================================================================
# Public API


def schema_to_grammar(
    schema: Any,
    *,
    strict: bool = True,
    whitespace: str = "compact",
    additional_properties_default: bool = True,
    max_whitespace: int = 20,
    time_limit: float | None = DEFAULT_TIME_LIMIT,
) -> tuple[Grammar, list[str]]:
    """Lower a JSON Schema to a grammar; returns ``(grammar, relaxations)``.

    ``strict`` (default): anything that cannot be honoured exactly raises :class:`JsonSchemaError`; the list of
    relaxations is then empty. ``strict=False``: such keywords are relaxed and each relaxation is listed.
    ``whitespace``: ``"compact"``, ``"flexible"`` (at most ``max_whitespace`` whitespace characters between
    tokens) or ``"indent"`` (two-space indentation). ``time_limit`` (CPU seconds, default
    :data:`DEFAULT_TIME_LIMIT`; ``None`` for none) refuses a schema whose compilation runs longer, the guard
    against hostile schemas that no size limit catches. ``additional_properties_default=False`` treats objects that
    declare ``properties`` (and no ``additionalProperties``/``patternProperties``) as closed.
    """
    if whitespace not in ("compact", "flexible", "indent"):
        raise ValueError(f"whitespace must be 'compact', 'flexible' or 'indent', not {whitespace!r}")
    if not isinstance(max_whitespace, int) or max_whitespace < 0:
        raise ValueError(f"max_whitespace must be a non-negative int, not {max_whitespace!r}")
    compiler = None
    try:
        with deadline(None if time_limit is None else compile_clock() + time_limit):
            compiler = _Compiler(schema, strict, whitespace, additional_properties_default, max_whitespace)
            grammar = compiler.compile()
    except _TIME_LIMIT as exc:
        where = str(exc) if isinstance(exc, _OutOfTime) else getattr(compiler, "last_pointer", "")
        raise JsonSchemaError(
            f"compiling this schema takes longer than time_limit={time_limit:g} s (None lifts the limit)",
            _clean_pointer(where),
        ) from None
    except RecursionError:
        raise JsonSchemaError(
            "the schema nests too deeply to compile", _clean_pointer(getattr(compiler, "last_pointer", ""))
        ) from None
    return grammar, list(compiler.notes)


def compile_json_schema(schema: Any, vocab, **options):
    """Compile a JSON Schema for ``vocab`` into a :class:`~constrain.runtime.pushdown.GrammarStructure`.

    ``options``: those of :func:`schema_to_grammar`, and ``cache_bytes`` for the mask cache. The structure's
    ``relaxations`` lists what lenient mode relaxed."""
    from constrain.grammar.ir import GrammarError
    from constrain.runtime.pushdown import compile_grammar

    started = compile_clock()
    grammar_options = {k: options.pop(k) for k in list(options) if k in _GRAMMAR_OPTIONS}
    grammar, notes = schema_to_grammar(schema, **grammar_options)
    time_limit = grammar_options.get("time_limit", DEFAULT_TIME_LIMIT)
    at = None if time_limit is None else started + time_limit
    try:
        structure = compile_grammar(grammar, vocab, deadline=at, **options)
    except (GrammarError, CompileTimeout) as exc:  # a time limit; _finalize removes the rest of what it refuses
        raise JsonSchemaError(f"the schema's grammar cannot be built: {exc} (time_limit={time_limit})") from exc
    structure.relaxations = notes
    return structure


_GRAMMAR_OPTIONS = {"strict", "whitespace", "additional_properties_default", "max_whitespace", "time_limit"}
