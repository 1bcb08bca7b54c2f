"""JSON values as the compiler writes and compares them: the regexes of the lexical pieces, canonical text,
keys equal for JSON-equal values, kinds of values, and decimal helpers.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from decimal import ROUND_CEILING, ROUND_FLOOR, Decimal
from typing import Any

# The lexical pieces of JSON text (regex text in the subset of constrain.automata.regex)

_PLAIN = r'[^"\\\x00-\x1f]'
_ESCAPE = r'\\(?:["\\bfnrt]|u00(?:0[0-7bef]|1[0-9a-f]))'
_CHAR = f"(?:{_PLAIN}|{_ESCAPE})"
_STRING = f'"{_CHAR}*"'
_NUMBER = r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?"
_INTEGER = r"(?:0|-?[1-9][0-9]*)"
_NONINT = r"-?(?:0|[1-9][0-9]*)\.[0-9]*[1-9][0-9]*"


#: ``json.dumps(s, ensure_ascii=False)`` for a str ``s``: the function it ends in, without the encoder's Python
#: layers (keys and enum strings are written tens of times per schema).
_json_string = json.encoder.encode_basestring
# ``json.dumps`` with any option but the defaults builds an encoder per call: these are made once.
_compact_text = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode
_indented_text = json.JSONEncoder(indent=2, ensure_ascii=False).encode
#: JSON text with each object's keys sorted, the same whatever order the keys came in (``1`` and ``1.0`` still
#: differ): the key of the compiler's caches of verdicts and synthetic nodes.
_sorted_text = json.JSONEncoder(sort_keys=True, ensure_ascii=False).encode


def _is_utf8(text: str) -> bool:
    """Whether ``text`` is UTF-8 encodable: a lone surrogate (which JSON's parsers can read from a ``\\ud800``
    escape) is not, and canonical JSON text never spells it."""
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def _dumps(value: Any, indent_depth: int | None = None) -> str:
    if isinstance(value, str):
        return _json_string(value)
    value = _canonical_value(value)
    if indent_depth is None:
        return _compact_text(value)
    text = _indented_text(value)
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
    return _sorted_text(_json_normal(value))


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


def _num_text(v: Decimal) -> str:
    return format(v.normalize(), "f")


def _floor(v: Decimal) -> int:
    return int(v.to_integral_value(rounding=ROUND_FLOOR))


def _ceil(v: Decimal) -> int:
    return int(v.to_integral_value(rounding=ROUND_CEILING))


def _int_above(v: Decimal, strict: bool) -> int:
    return _floor(v) + 1 if strict else _ceil(v)


def _int_below(v: Decimal, strict: bool) -> int:
    return _ceil(v) - 1 if strict else _floor(v)
