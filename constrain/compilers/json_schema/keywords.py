"""The keywords the compiler knows, in tables by what it does with them, and the two records it works on: a
part (one conjunct of a schema) and a shape (the conjunction of flat parts, per kind of JSON value).
"""

from __future__ import annotations

from decimal import Decimal
from typing import NamedTuple

from constrain.compilers.json_schema.values import _ALL_KINDS

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
#: The keywords :meth:`~constrain.compilers.json_schema.compiler._Compiler.normalise` expands into more conjuncts.
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


class _Part(NamedTuple):
    """One conjunct of a schema being compiled: the (sub)schema at ``ptr`` minus the keywords in ``skip``
    (already turned into structure), or, when ``neg`` is set, the negation of one of its keywords."""

    ptr: str
    skip: frozenset = frozenset()
    neg: tuple | None = None


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
        #: ``dependentRequired`` (and ``dependencies`` of name lists) left to the object's rule under
        #: ``property_order="any"``: (trigger, the names it needs, pointer), see
        #: :meth:`~constrain.compilers.json_schema.any_order._AnyOrderRules.dependents_split`.
        self.dependents: list[tuple[str, tuple[str, ...], str]] = []
        self.min_props = 0
        self.min_props_at = ("", "")
        self.max_props: int | None = None
        self.max_props_at = ("", "")
        self.prop_names: list[_Part] = []
        #: Negated ``patternProperties`` (one pattern), ``propertyNames`` and ``additionalProperties``: each asks
        #: for a member that witnesses it (see objects._ObjectRules.witness_members).
        self.witnesses: list[_Part] = []
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
