r"""Pydantic models, dataclasses, TypedDicts and any other type pydantic validates, through their JSON Schema.

:func:`compile_pydantic` lowers ``pydantic.TypeAdapter(model_type)``'s JSON Schema through
:func:`~constrain.compilers.json_schema.compile_json_schema`; :func:`parse` reads the finished text back with
``TypeAdapter.validate_json``. The promise is that text the structure accepts parses into ``model_type``.

Which schema
------------
The *validation* schema: it describes what ``validate_json`` reads (input aliases, fields with defaults optional,
no computed fields), whereas the serialization schema describes what ``model_dump_json`` writes (computed fields
required, which a model with ``extra="forbid"`` would then reject). Where pydantic's schema is looser than its
validator, this module tightens it so every accepted text parses:

- ``Decimal``: a JSON number (pydantic's schema also allows any string) of at most ``max_digits`` digits and
  ``decimal_places`` places, and of at most 15 significant digits, as pydantic reads a JSON number through a float.
- ``date``/``datetime``: no year 0000. ``timedelta``: at most 6 digits per number (pydantic caps durations).
- URLs: ``scheme://host[:port][/path][?query][#fragment]`` with a host of letter-led labels (special schemes
  read a numeric last label as IPv4, and ``xn--`` labels as Punycode), ports below 10000, no percent-encoding,
  the type's allowed schemes, and bounded lengths (so ``HttpUrl``'s ``max_length`` holds by construction).
- Discriminated unions: the tag is required, even when the tag field has a default (pydantic reads it).
- ``bytes`` with a length bound: ASCII only (pydantic counts bytes, JSON Schema code points). ``dict[int, ...]``:
  keys are canonical integers. ``UUID1``...``UUID8``: the version and variant digits. ``IPvAnyAddress``: IPv4 or
  IPv6. ``float`` with ``allow_inf_nan=False``: below 1e308 in size (exponents would overflow).
- Objects are closed by default (``additional_properties_default=False``: models, dataclasses and TypedDicts
  that say nothing about extra keys get ``additionalProperties: false``): pydantic ignores extra keys, so they
  would only be noise. A model with ``extra="allow"`` says ``additionalProperties: true`` and stays open.

Refused in strict mode (:class:`PydanticSchemaError`; ``strict=False`` ignores them and lists each in the
structure's ``relaxations``), because pydantic checks what the schema does not say: string formats the JSON
compiler does not check (``email``, networks, paths that must exist, ``Json[...]``, ...), bounds and time-zone
constraints on dates and times, ``dict`` keys other than strings, integers and enums, ``bytes`` read as base64 or
hex, unions with a callable ``Discriminator``. Sets (``uniqueItems``) compile exactly for items from an enum of a
few values; otherwise the JSON compiler refuses them in strict mode, and in lenient mode repeats may appear, which
pydantic collapses.

Not seen: custom validators (``field_validator``, ``AfterValidator``...) are opaque to the schema and may still
reject a text. Keys come in field order; ``\d \w \s`` in patterns are ASCII (pydantic's Rust regex also matches
other Unicode digits and letters, so only negated classes like ``\D`` can differ).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import TypeAdapter
from pydantic.errors import PydanticUndefinedAnnotation, PydanticUserError
from pydantic.json_schema import GenerateJsonSchema, JsonSchemaValue
from pydantic_core import core_schema

from constrain.automata.limits import DEFAULT_TIME_LIMIT, time_limited
from constrain.compilers.json_schema import compile_json_schema
from constrain.errors import ArgumentError, ConstrainError, PydanticSchemaError

if TYPE_CHECKING:
    from constrain.runtime.pushdown import GrammarStructure
    from constrain.vocab.vocabulary import Vocabulary

__all__ = ["PydanticSchemaError", "compile_pydantic", "parse", "pydantic_schema"]

T = TypeVar("T")

#: Significant digits of a JSON number that survive pydantic's float reading of a ``Decimal``.
DECIMAL_DIGITS = 15
#: A round bound below the largest float (whose exact digits make a far larger automaton).
_FINITE = 1e308

_YEAR = "^(?:[1-9][0-9]{3}|0[1-9][0-9]{2}|00[1-9][0-9]|000[1-9])-"
_DURATION_DIGITS = "^(?:[PTYMWDHS]|[0-9]{1,6}[YMWDHS])*$"
_INTEGER_KEY = "^(?:0|-?[1-9][0-9]*)$"
_ASCII = "^[\\x00-\\x7f]*$"

# URLs: scheme://host[:port][/path][?query][#fragment], without percent-encoding. The bounded form (each part
# counted, its longest text below) honours a maxLength by construction, as the JSON compiler refuses a length
# bound beside a pattern this size.
_URL_SCHEME = "[a-z][a-z0-9+.-]{0,15}"
_URL_PATH = "[A-Za-z0-9._~!$&'()*+,;=:@/-]"
_URL_QUERY = "[A-Za-z0-9._~!$&'()*+,;=:@/?-]"
_URL_REST = (
    f"://[a-z][a-z0-9]*(?:[.-][a-z][a-z0-9]*)*(?::[1-9][0-9]{{0,3}})?(?:/{_URL_PATH}*)?"
    f"(?:\\?{_URL_QUERY}*)?(?:#{_URL_QUERY}*)?"
)
_URL_REST_BOUNDED = (
    f"://[a-z][a-z0-9]{{0,15}}(?:[.-][a-z][a-z0-9]{{0,15}}){{0,4}}(?::[1-9][0-9]{{0,3}})?(?:/{_URL_PATH}{{0,127}})?"
    f"(?:\\?{_URL_QUERY}{{0,63}})?(?:#{_URL_QUERY}{{0,63}})?"
)
_URL_REST_MAX = 3 + 16 + 4 * 17 + 5 + 128 + 64 + 64

#: Formats the JSON compiler checks exactly as pydantic does (after the tightening above), and formats of types
#: that read any string.
_EXACT_FORMATS = frozenset({"date", "date-time", "time", "duration", "uuid", "ipv4", "ipv6"})
_ANY_STRING_FORMATS = frozenset({"binary", "password", "path"})
_UUID_VERSION = re.compile(r"uuid([1-8])")
_DATA_KEYWORDS = frozenset({"default", "examples", "enum", "const"})
_SCHEMA_MAPS = frozenset({"properties", "patternProperties", "$defs", "definitions", "dependentSchemas"})
_EXTRA_KEYWORDS = frozenset({"additionalProperties", "patternProperties", "unevaluatedProperties"})


def pydantic_schema(model_type: Any, *, additional_properties_default: bool = False) -> dict[str, Any]:
    """The JSON Schema :func:`compile_pydantic` compiles for ``model_type``: pydantic's validation schema, tightened
    where pydantic validates more than it says, objects that say nothing about extra keys closed unless
    ``additional_properties_default``."""
    return _schema_and_gaps(model_type, additional_properties_default)[0]


def compile_pydantic(
    model_type: Any, vocab: Vocabulary, *, time_limit: float | None = DEFAULT_TIME_LIMIT, **options: Any
) -> GrammarStructure:
    """Compile ``model_type`` (a pydantic model, dataclass, TypedDict or any type pydantic validates) for
    ``vocab`` into a :class:`~constrain.runtime.pushdown.GrammarStructure`.

    ``options`` are those of :func:`~constrain.compilers.json_schema.compile_json_schema` (``strict``,
    ``whitespace``, ``max_whitespace``, ``additional_properties_default`` (default ``False`` here: closed
    objects), ``property_order``, ``cache_bytes``); ``time_limit`` (CPU seconds, None: no limit) covers writing
    the schema too. Raises :class:`PydanticSchemaError` for a type pydantic cannot describe or, in strict mode,
    one it validates more than its schema says; the JSON compiler's refusals propagate as
    :class:`~constrain.compilers.json_schema.JsonSchemaError` with the JSON pointer.
    """
    options.setdefault("additional_properties_default", False)
    with time_limited(time_limit, "the Pydantic type"):
        schema, gaps = _schema_and_gaps(model_type, options["additional_properties_default"])
        strict = options.get("strict", True)
        if gaps and strict:
            raise PydanticSchemaError(
                "pydantic validates more than its JSON Schema says, so some accepted texts would not parse: "
                + "; ".join(gaps)
                + " (refused in strict mode)",
                model_type,
            )
        structure = compile_json_schema(schema, vocab, time_limit=time_limit, **options)
    structure.relaxations = [*gaps, *structure.relaxations]
    return structure


def parse(model_type: type[T], text: str | bytes) -> T:
    """Validate generated JSON text into ``model_type`` (``pydantic.TypeAdapter(model_type).validate_json``)."""
    return TypeAdapter(model_type).validate_json(text)


# -- the schema ------------------------------------------------------------------------------------------------


def _schema_and_gaps(model_type: Any, open_objects: bool) -> tuple[dict[str, Any], list[str]]:
    """The tightened validation schema and what it still cannot say."""
    if isinstance(model_type, (bytes, Mapping)):
        raise ArgumentError(
            "model_type",
            model_type,
            "a type (a pydantic model, a dataclass, a TypedDict...); a JSON Schema or a "
            "grammar goes to constrain.compile",
        )
    generator = _Generator(by_alias=True)
    try:
        schema = generator.generate(TypeAdapter(model_type).core_schema, mode="validation")
    except (PydanticUserError, PydanticUndefinedAnnotation) as exc:
        raise PydanticSchemaError(f"pydantic cannot write a JSON Schema for it: {exc}", model_type) from exc
    except ConstrainError:
        raise
    except Exception as exc:  # what pydantic raises for a value it cannot take as a type varies (SchemaError...)
        reason = f"pydantic cannot take it as a type: {type(exc).__name__}: {exc}"
        raise PydanticSchemaError(reason, model_type) from exc
    gaps = generator.gaps
    _finish(schema, gaps, open_objects)
    return schema, list(dict.fromkeys(gaps))


class _Generator(GenerateJsonSchema):
    """pydantic's validation schema, tightened where its validator is stricter; ``gaps`` lists what is left."""

    def __init__(self, **kwargs: Any):
        super().__init__(**kwargs)
        self.gaps: list[str] = []

    def decimal_schema(self, schema: core_schema.DecimalSchema) -> JsonSchemaValue:
        bounds: dict[str, Any] = {}
        self.update_with_validations(bounds, schema, self.ValidationsMapping.numeric)
        bounds = {k: _json_number(v) for k, v in bounds.items() if v is not None}
        digits = min(schema.get("max_digits") or DECIMAL_DIGITS, DECIMAL_DIGITS)
        places = schema.get("decimal_places")
        if places is None:  # k places, at most digits - k before the point
            shapes = [(digits - k, k) for k in range(digits + 1)]
        else:  # pydantic bounds both parts
            shapes = [(max(digits - places, 0), min(places, digits))]
        return {"type": "number", **bounds, "anyOf": [_decimal_shape(whole, k) for whole, k in shapes]}

    def float_schema(self, schema: core_schema.FloatSchema) -> JsonSchemaValue:
        json_schema = super().float_schema(schema)
        if not schema.get("allow_inf_nan", self._config.config_dict.get("allow_inf_nan", True)):
            if "minimum" not in json_schema and "exclusiveMinimum" not in json_schema:
                json_schema["exclusiveMinimum"] = -_FINITE
            if "maximum" not in json_schema and "exclusiveMaximum" not in json_schema:
                json_schema["exclusiveMaximum"] = _FINITE
        return json_schema

    def date_schema(self, schema: core_schema.DateSchema) -> JsonSchemaValue:
        self._temporal_gaps("date", schema)
        return {**super().date_schema(schema), "pattern": _YEAR}

    def datetime_schema(self, schema: core_schema.DatetimeSchema) -> JsonSchemaValue:
        self._temporal_gaps("datetime", schema)
        return {**super().datetime_schema(schema), "pattern": _YEAR}

    def time_schema(self, schema: core_schema.TimeSchema) -> JsonSchemaValue:
        self._temporal_gaps("time", schema)
        return super().time_schema(schema)

    def timedelta_schema(self, schema: core_schema.TimedeltaSchema) -> JsonSchemaValue:
        self._temporal_gaps("timedelta", schema)
        return {**super().timedelta_schema(schema), "pattern": _DURATION_DIGITS}

    def _temporal_gaps(self, name: str, schema: Any) -> None:
        bounds = [k for k in ("gt", "ge", "lt", "le", "now_op") if k in schema]
        if bounds:
            self.gaps.append(f"{name} bounds ({', '.join(bounds)}) are not in the schema")
        tz = schema.get("tz_constraint")
        if tz is not None and tz != "aware":
            self.gaps.append(f"{name} time-zone constraint {tz!r}: RFC 3339 texts always carry an offset")
        if schema.get("microseconds_precision") == "error":
            self.gaps.append(f"{name} with microseconds_precision='error': RFC 3339 fractions are unbounded")

    def url_schema(self, schema: core_schema.UrlSchema) -> JsonSchemaValue:
        json_schema = super().url_schema(schema)
        del json_schema["format"]
        if json_schema.get("minLength", 0) <= 5:  # "a://a", the shortest URL
            json_schema.pop("minLength", None)
        schemes = schema.get("allowed_schemes")
        scheme = "|".join(map(re.escape, sorted(schemes))) if schemes else _URL_SCHEME
        longest_scheme = max(map(len, schemes)) if schemes else 16
        if "maxLength" not in json_schema:
            json_schema["pattern"] = f"^(?:{scheme}){_URL_REST}$"
            return json_schema
        json_schema["pattern"] = f"^(?:{scheme}){_URL_REST_BOUNDED}$"
        if json_schema["maxLength"] >= longest_scheme + _URL_REST_MAX:
            del json_schema["maxLength"]
        return json_schema

    def bytes_schema(self, schema: core_schema.BytesSchema) -> JsonSchemaValue:
        json_schema = super().bytes_schema(schema)
        reading = self._config.config_dict.get("val_json_bytes", "utf8")
        if reading != "utf8":
            self.gaps.append(f"bytes read as {reading}: the schema does not say so")
            return json_schema
        json_schema["format"] = "binary"
        if "maxLength" in json_schema:
            json_schema["pattern"] = _ASCII
        return json_schema

    def dict_schema(self, schema: core_schema.DictSchema) -> JsonSchemaValue:
        json_schema = super().dict_schema(schema)
        keys = self.generate_inner(schema["keys_schema"]) if "keys_schema" in schema else {}
        if keys.get("type") == "integer" and set(keys) <= {"type", "title"}:
            json_schema["propertyNames"] = {"pattern": _INTEGER_KEY}
        elif keys and "$ref" not in keys and keys.get("type") != "string":
            self.gaps.append(f"dict keys of schema {keys} are not checked by the schema")
        return json_schema

    def tagged_union_schema(self, schema: core_schema.TaggedUnionSchema) -> JsonSchemaValue:
        json_schema = super().tagged_union_schema(schema)
        if "discriminator" in json_schema:  # pydantic reads the tag even when the tag field has a default
            json_schema["required"] = [json_schema["discriminator"]["propertyName"]]
        else:
            self.gaps.append("a union with a callable Discriminator: the schema cannot say where its tag is")
        return json_schema

    def json_schema(self, schema: core_schema.JsonSchema) -> JsonSchemaValue:
        self.gaps.append("Json[...] fields: the schema does not check the string's content")
        return super().json_schema(schema)


def _json_number(value: Any) -> int | float:
    """A Decimal bound as pydantic writes it (ints stay exact)."""
    return int(value) if value == int(value) else float(value)


def _decimal_shape(whole: int, places: int) -> dict[str, Any]:
    """Numbers with at most ``whole`` digits before the point and ``places`` after it."""
    return {
        "exclusiveMinimum": -(10**whole),
        "exclusiveMaximum": 10**whole,
        "multipleOf": 1 if places == 0 else float(f"1e-{places}"),
    }


def _finish(schema: Any, gaps: list[str], open_objects: bool) -> None:
    """Close objects that say nothing about extra keys (in the schema itself, so that ``oneOf`` branches are
    closed too), rewrite the formats of pydantic's own types into ones the JSON compiler checks, note the rest."""
    if isinstance(schema, list):
        for item in schema:
            _finish(item, gaps, open_objects)
        return
    if not isinstance(schema, dict):
        return
    for key, value in schema.items():
        if key in _SCHEMA_MAPS and isinstance(value, dict):  # keys are names, not keywords
            for subschema in value.values():
                _finish(subschema, gaps, open_objects)
        elif key not in _DATA_KEYWORDS:
            _finish(value, gaps, open_objects)
    if not open_objects and schema.get("type") == "object" and "properties" in schema:
        if not _EXTRA_KEYWORDS.intersection(schema):
            schema["additionalProperties"] = False
    fmt = schema.get("format")
    if not isinstance(fmt, str) or fmt in _EXACT_FORMATS or fmt in _ANY_STRING_FORMATS:
        return
    if fmt == "ipvanyaddress":
        del schema["format"]
        schema["anyOf"] = [{"format": "ipv4"}, {"format": "ipv6"}]
    elif version := _UUID_VERSION.fullmatch(fmt):
        schema["format"] = "uuid"
        schema["pattern"] = f"^[0-9a-fA-F]{{8}}-[0-9a-fA-F]{{4}}-{version[1]}[0-9a-fA-F]{{3}}-[89abAB]"
    elif fmt == "email":
        gaps.append("format 'email': pydantic's email-validator refuses addresses RFC 5321 allows")
    else:
        gaps.append(f"format {fmt!r} is not checked by the JSON compiler")


def _type_name(model_type: Any) -> str:
    return model_type.__qualname__ if isinstance(model_type, type) else repr(model_type)
