"""``enum`` and ``const``: the values a conjunction allows, validated against all of it, as literals."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from constrain.compilers.json_schema.document import _PLAIN_KEYWORDS, _clean_pointer, _plain_verdict
from constrain.compilers.json_schema.errors import _TIME_LIMIT, _check_time
from constrain.compilers.json_schema.formats import _FORMATS
from constrain.compilers.json_schema.keywords import _VALIDATION, _Part
from constrain.compilers.json_schema.layout import _child_depth
from constrain.compilers.json_schema.strings import _format_language
from constrain.compilers.json_schema.values import _ALL_KINDS, _dumps, _json_key, _json_string, _kind_of, _kinds_of_type
from constrain.errors import JsonSchemaError
from constrain.grammar.ir import Alt, Expr, Literal, Seq


class _EnumRules:
    """``enum`` and ``const``: the values of a conjunction's smallest enum that the whole conjunction accepts, as
    literals laid out like every other value.

    A mixin of :class:`~constrain.compilers.json_schema.compiler._Compiler`. It relies on the compiler's ``doc``,
    ``node`` and ``whitespace``, and on its methods ``layout``, ``live_keys``, ``known_here`` and ``unsatisfiable``."""

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
                if kw in node and kw not in part.skip and self.known_here(kw):  # draft 4 has no const
                    values = [node[kw]] if kw == "const" else list(node[kw])
                    if source is None or len(values) < len(source[0]):
                        source = (values, part, kw)
        if source is None:
            return None
        values, owner, kw = source
        at = f"{owner.ptr}/{kw}"
        if not values:
            raise self.unsatisfiable("the enum is empty", at, kw)
        node = self.node(owner.ptr)
        extra = [k for k in self.live_keys(owner) if k != kw and k in _VALIDATION]  # the other of enum/const too
        simple = len(parts) == 1 and set(extra) <= {"type"}
        kinds = _kinds_of_type(node["type"]) if "type" in extra else _ALL_KINDS
        # One part whose other keywords _plain_verdict evaluates (a type, lengths, bounds): each value is checked
        # against them alone, without the verdict cache's JSON text of every value.
        plain = (
            {k: node[k] for k in extra}
            if len(parts) == 1 and not simple and "$ptr" not in node and _PLAIN_KEYWORDS.issuperset(extra)
            else None
        )
        validators, draft4 = self.doc.cls.VALIDATORS, self.doc.draft4
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
                if draft4 and type(value) is float and "frac" not in kinds:
                    value = int(value)  # draft 4's integer is not 2.0, but 2, equal to it, is valid
            else:
                ok = None
                if plain is not None:
                    _check_time(owner.ptr)  # one enum against another: as many checks as the product of sizes
                    ok = _plain_verdict(plain, value, validators, draft4)
                try:
                    if ok is None:
                        ok = self.doc.is_valid(parts, value)
                except _TIME_LIMIT:
                    raise
                except Exception as exc:  # an unresolvable reference met by jsonschema, a bad regex...
                    raise JsonSchemaError(
                        f"cannot evaluate the enum values against the schema: {exc}", _clean_pointer(at), kw
                    ) from None
                if not ok:
                    continue
                if isinstance(value, str) and any(not _format_language(f).accepts(value) for f in formats):
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
            items = [Seq((Literal(_json_string(k)), lay.colon, self.value_literal(v, child))) for k, v in value.items()]
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
