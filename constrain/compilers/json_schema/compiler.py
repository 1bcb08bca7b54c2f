"""The compiler core: a schema lowered rule by rule, and the public functions :func:`schema_to_grammar` and
:func:`compile_json_schema`.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from collections.abc import Mapping, Sequence
from decimal import localcontext
from itertools import product
from typing import Any

from constrain.automata.limits import CompileTimeout, compile_clock, deadline
from constrain.compilers.json_schema.cdfa import _CDFA, MAX_AUTOMATON_STATES
from constrain.compilers.json_schema.document import _clean_pointer, _Document, _escape_token
from constrain.compilers.json_schema.errors import (
    _TIME_LIMIT,
    JsonSchemaError,
    _check_time,
    _NotNegatable,
    _OutOfTime,
    _TooLarge,
    _Unsatisfiable,
    _verdict,
)
from constrain.compilers.json_schema.formats import _FORMATS, _FORMATS_ENCODED, _UNSUPPORTED_FORMATS
from constrain.compilers.json_schema.keywords import (
    _ANNOTATIONS,
    _ARRAY_KEYWORDS,
    _BRANCHING,
    _DEPENDENT_KEYWORDS,
    _DRAFT3_ONLY,
    _EXPANDED,
    _FAMILY,
    _GROUPS,
    _KEYWORD_GROUP,
    _NEGATABLE,
    _OBJECT_KEYWORDS,
    _SCALAR_TYPES,
    _VALIDATION,
    _Part,
    _Shape,
)
from constrain.compilers.json_schema.layout import _any_value_rules, _child_depth, _Layout, _layout, _shared_body
from constrain.compilers.json_schema.numbers import (
    MAX_ENUMERATED_MULTIPLES,
    _decimal_range,
    _int_range,
    _modulus_cdfa,
    _signed_number,
)
from constrain.compilers.json_schema.regex_ast import _ast_to_expr, _class_text, _merge_ranges
from constrain.compilers.json_schema.rules import _finalize, _options, _then
from constrain.compilers.json_schema.strings import (
    LENGTH_BLOCK,
    LENGTH_BLOCK_THRESHOLD,
    MAX_COUNTED_BYTE_STATES,
    _automaton_of,
    _counted_chars,
    _counted_dfa,
    _format_cdfa,
    _key_except_dfa,
    _quoted,
    _searched,
    _string_automaton,
    _string_language,
    _StringKey,
    _StringOutcome,
)
from constrain.compilers.json_schema.values import (
    _ALL_KINDS,
    _canonical_value,
    _ceil,
    _dumps,
    _floor,
    _int_above,
    _int_below,
    _json_key,
    _json_string,
    _kind_of,
    _kinds_of_type,
    _num_text,
    _to_decimal,
)
from constrain.errors import RegexError
from constrain.grammar.ir import Alt, Automaton, Expr, Grammar, Literal, Ref, Regex, Repeat, Seq, shared

#: Most ``patternProperties`` patterns that apply to one object (the key space splits into 2**n regions).
MAX_PATTERN_PROPERTIES = 4
#: Most grammar rules one schema may produce.
MAX_RULES = 20_000
#: Seconds a schema may take to lower to a grammar before it is refused (``time_limit``).
DEFAULT_TIME_LIMIT = 5.0
#: ``uniqueItems`` is exact for items drawn from an enum of at most this many values (a rule per subset).
MAX_UNIQUE_ENUM = 8


_UNSAT = object()


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
            info.additional = (
                self.doc.add_synthetic(part.ptr, {"additionalProperties": False}) + "/additionalProperties"
            )
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
