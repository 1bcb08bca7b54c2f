"""A fast, conservative check of a schema against its dialect's metaschema.

jsonschema's metaschema check costs milliseconds per schema (p50 3.8 ms, p90 38 ms on MaskBench), above the whole
compile budget of 2 ms at p50. Most schemas are plainly valid, so :func:`certainly_valid` walks the schema once
with the metaschemas' constraints written out as small rules and answers True for those; False means "not sure",
and the caller then runs jsonschema as before, so a rejected schema keeps jsonschema's message and pointer.

Every rule is at least as strict as the metaschema keyword it stands for (the metaschemas of the
``jsonschema_specifications`` package), so True is never wrong; where a rule is stricter (an integer written
``1.0``, a draft-04 ``enum`` holding arrays or objects) it only sends the schema down the slow path. Formats are
not asserted, as in the caller's check. Keywords a metaschema does not name are unconstrained there, and skipped
here; the values of ``const``, ``enum``, ``default`` and ``examples`` are data, not schemas, and are not walked.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

__all__ = ["certainly_valid"]

#: A keyword's rule: (its value, the dialect, how many more schema levels may be walked) -> certainly valid.
Rule = Callable[[Any, "_Dialect", int], bool]

#: Schema levels walked at most (MaskBench nests 17 at most). jsonschema spends about a dozen stack frames a level
#: (recursion fails near 80 levels of ``allOf`` in 2020-12, from an empty stack); deeper schemas are left to it,
#: so that one too deep for it is still refused as it was, not let through by this shallower walk.
MAX_DEPTH = 32

_SIMPLE_TYPES = frozenset({"array", "boolean", "integer", "null", "number", "object", "string"})
#: 2020-12 ``anchorString``; ``fullmatch`` also refuses the trailing newline that the metaschema's ``$`` allows.
_ANCHOR = re.compile(r"[A-Za-z_][-A-Za-z0-9._]*")
#: 2020-12 ``$id``: no fragment but an empty one.
_ID = re.compile(r"[^#]*#?")
#: Scalars whose Python equality, once booleans are told apart from 0 and 1, is at least as coarse as
#: jsonschema's, so values distinct in a set are distinct for ``uniqueItems`` too.
_SCALARS = (str, int, float, bool, type(None))


class _Dialect:
    """One metaschema: a rule per keyword it constrains."""

    __slots__ = ("rules", "booleans", "requires")

    def __init__(self, rules: dict[str, Rule], booleans: bool = True, requires: tuple[tuple[str, str], ...] = ()):
        self.rules = rules
        #: Whether ``true``/``false`` are schemas (not in draft-04).
        self.booleans = booleans
        #: (keyword, keyword it needs beside it): the metaschema's own ``dependencies`` (draft-04 only).
        self.requires = requires


def certainly_valid(schema: Any, draft: str) -> bool:
    """True only when ``schema`` is valid against the metaschema of ``draft`` (``Draft202012``, ``Draft7``,
    ``Draft6``, ``Draft4``: a jsonschema validator's name less ``Validator``); False when not sure, which includes
    every other draft and schemas nested deeper than :data:`MAX_DEPTH`."""
    dialect = _DIALECTS.get(draft)
    return dialect is not None and _schema(schema, dialect, MAX_DEPTH)


def _schema(node: Any, d: _Dialect, left: int) -> bool:
    """A schema: an object whose keywords obey their rules, or a boolean where the dialect allows one."""
    if isinstance(node, dict):
        if left == 0:
            return False
        left -= 1
        rules = d.rules
        for key, value in node.items():
            rule = rules.get(key)
            if rule is not None and not rule(value, d, left):
                return False
        for key, needed in d.requires:
            if key in node and needed not in node:
                return False
        return True
    return d.booleans and (node is True or node is False)


def _schema_or_boolean(value: Any, d: _Dialect, left: int) -> bool:
    """draft-04 ``additionalItems``/``additionalProperties``: a boolean even where schemas cannot be one."""
    return value is True or value is False or _schema(value, d, left)


def _schemas(value: Any, d: _Dialect, left: int) -> bool:
    """``schemaArray``: a non-empty array of schemas."""
    if not isinstance(value, list) or not value:
        return False
    for item in value:
        if not _schema(item, d, left):
            return False
    return True


def _schema_map(value: Any, d: _Dialect, left: int) -> bool:
    """An object whose values are schemas (``properties``, ``$defs``...)."""
    if not isinstance(value, dict):
        return False
    for item in value.values():
        if not _schema(item, d, left):
            return False
    return True


def _schema_or_schemas(value: Any, d: _Dialect, left: int) -> bool:
    """draft-04 to draft-07 ``items``."""
    return _schemas(value, d, left) if isinstance(value, list) else _schema(value, d, left)


def _string(value: Any, d: _Dialect, left: int) -> bool:
    return isinstance(value, str)


def _boolean(value: Any, d: _Dialect, left: int) -> bool:
    return value is True or value is False


def _array(value: Any, d: _Dialect, left: int) -> bool:
    return isinstance(value, list)


def _number(value: Any, d: _Dialect, left: int) -> bool:
    """A JSON number: not a bool, and not a float JSON cannot write (infinite or NaN)."""
    if isinstance(value, float):
        return math.isfinite(value)
    return isinstance(value, int) and value is not True and value is not False


def _positive_number(value: Any, d: _Dialect, left: int) -> bool:
    """``multipleOf``: a number above 0 (NaN is not)."""
    return _number(value, d, left) and value > 0


def _non_negative_integer(value: Any, d: _Dialect, left: int) -> bool:
    """An ``int`` >= 0; a float such as 1.0 is left to jsonschema (drafts disagree on it)."""
    return isinstance(value, int) and value is not True and value is not False and value >= 0


def _unique_strings(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(item, str) for item in value) and len(set(value)) == len(value)


def _string_array(value: Any, d: _Dialect, left: int) -> bool:
    """``stringArray`` since draft-06: unique strings, possibly none."""
    return _unique_strings(value)


def _string_array_04(value: Any, d: _Dialect, left: int) -> bool:
    """draft-04 ``stringArray``: at least one string."""
    return _unique_strings(value) and len(value) > 0


def _type(value: Any, d: _Dialect, left: int) -> bool:
    """A simple type name, or a non-empty array of distinct ones."""
    if isinstance(value, str):
        return value in _SIMPLE_TYPES
    return (
        isinstance(value, list)
        and len(value) > 0
        and all(isinstance(item, str) and item in _SIMPLE_TYPES for item in value)
        and len(set(value)) == len(value)
    )


def _enum_04(value: Any, d: _Dialect, left: int) -> bool:
    """draft-04 ``enum``: a non-empty array of unique values; uniqueness is only shown for scalars."""
    return (
        isinstance(value, list)
        and len(value) > 0
        and all(isinstance(item, _SCALARS) for item in value)
        and len({(item is True or item is False, item) for item in value}) == len(value)
    )


def _dependencies(value: Any, d: _Dialect, left: int) -> bool:
    """``dependencies`` since draft-06: each value a schema or a ``stringArray``."""
    return isinstance(value, dict) and all(_schema(item, d, left) or _unique_strings(item) for item in value.values())


def _dependencies_04(value: Any, d: _Dialect, left: int) -> bool:
    """draft-04 ``dependencies``: each value a schema or a non-empty ``stringArray``."""
    return isinstance(value, dict) and all(
        _schema(item, d, left) or _string_array_04(item, d, left) for item in value.values()
    )


def _dependent_required(value: Any, d: _Dialect, left: int) -> bool:
    return isinstance(value, dict) and all(_unique_strings(item) for item in value.values())


def _anchor(value: Any, d: _Dialect, left: int) -> bool:
    return isinstance(value, str) and _ANCHOR.fullmatch(value) is not None


def _id(value: Any, d: _Dialect, left: int) -> bool:
    return isinstance(value, str) and _ID.fullmatch(value) is not None


def _vocabulary(value: Any, d: _Dialect, left: int) -> bool:
    """2020-12 ``$vocabulary``: string keys (URIs, format not asserted), boolean values."""
    return isinstance(value, dict) and all(
        isinstance(key, str) and (item is True or item is False) for key, item in value.items()
    )


# The keywords of draft-06 and draft-07 that 2020-12 constrains the same way.
_COMMON: dict[str, Rule] = {
    "$schema": _string, "$ref": _string, "title": _string, "description": _string, "format": _string,
    "pattern": _string, "examples": _array, "enum": _array, "type": _type,
    "multipleOf": _positive_number, "maximum": _number, "exclusiveMaximum": _number, "minimum": _number,
    "exclusiveMinimum": _number,
    "maxLength": _non_negative_integer, "minLength": _non_negative_integer, "maxItems": _non_negative_integer,
    "minItems": _non_negative_integer, "maxProperties": _non_negative_integer,
    "minProperties": _non_negative_integer, "uniqueItems": _boolean, "required": _string_array,
    "properties": _schema_map, "patternProperties": _schema_map, "definitions": _schema_map,
    "dependencies": _dependencies, "additionalProperties": _schema, "contains": _schema,
    "propertyNames": _schema, "not": _schema, "allOf": _schemas, "anyOf": _schemas, "oneOf": _schemas,
}  # fmt: skip

_DRAFT6: dict[str, Rule] = {**_COMMON, "$id": _string, "items": _schema_or_schemas, "additionalItems": _schema}

_DRAFT7: dict[str, Rule] = {
    **_DRAFT6, "$comment": _string, "readOnly": _boolean, "if": _schema, "then": _schema, "else": _schema,
    "contentMediaType": _string, "contentEncoding": _string,
}  # fmt: skip

# Draft-04: the common keywords less those it does not have, and its own forms of the others.
_DRAFT4: dict[str, Rule] = {
    **{k: rule for k, rule in _COMMON.items() if k not in ("$ref", "examples", "contains", "propertyNames")},
    "id": _string, "enum": _enum_04, "exclusiveMaximum": _boolean, "exclusiveMinimum": _boolean,
    "required": _string_array_04, "dependencies": _dependencies_04, "items": _schema_or_schemas,
    "additionalItems": _schema_or_boolean, "additionalProperties": _schema_or_boolean,
}  # fmt: skip

# 2020-12: the core, applicator, unevaluated, validation, meta-data, format-annotation and content vocabularies,
# and the top metaschema's definitions, dependencies, $recursiveAnchor and $recursiveRef.
_DRAFT2020: dict[str, Rule] = {
    **_COMMON, "$id": _id, "$anchor": _anchor, "$dynamicRef": _string, "$dynamicAnchor": _anchor,
    "$vocabulary": _vocabulary, "$comment": _string, "$defs": _schema_map,
    "$recursiveAnchor": _anchor, "$recursiveRef": _string,
    "prefixItems": _schemas, "items": _schema, "dependentSchemas": _schema_map,
    "if": _schema, "then": _schema, "else": _schema,
    "unevaluatedItems": _schema, "unevaluatedProperties": _schema,
    "maxContains": _non_negative_integer, "minContains": _non_negative_integer,
    "dependentRequired": _dependent_required,
    "deprecated": _boolean, "readOnly": _boolean, "writeOnly": _boolean,
    "contentEncoding": _string, "contentMediaType": _string, "contentSchema": _schema,
}  # fmt: skip

_DIALECTS: dict[str, _Dialect] = {
    "Draft202012": _Dialect(_DRAFT2020),
    "Draft7": _Dialect(_DRAFT7),
    "Draft6": _Dialect(_DRAFT6),
    "Draft4": _Dialect(
        _DRAFT4, booleans=False, requires=(("exclusiveMaximum", "maximum"), ("exclusiveMinimum", "minimum"))
    ),
}
