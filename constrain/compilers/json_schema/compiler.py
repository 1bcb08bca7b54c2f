"""The compiler core: a schema lowered rule by rule, and the public functions :func:`schema_to_grammar` and
:func:`compile_json_schema`.
"""

from __future__ import annotations

import operator
from collections import deque
from collections.abc import Callable, Mapping, Sequence, Set
from typing import Any

from constrain import collector
from constrain.automata.limits import DEFAULT_TIME_LIMIT, CompileTimeout, time_limited
from constrain.compilers.json_schema.any_order import MAX_ANY_ORDER_STATES_TOTAL, _AnyOrderRules
from constrain.compilers.json_schema.arrays import _ArrayRules
from constrain.compilers.json_schema.combinators import _Combinators, _Excluded
from constrain.compilers.json_schema.deferral import MAX_DEFERRING_NODES, MIN_DEFERRING_NODES, _Deferral
from constrain.compilers.json_schema.document import _clean_pointer, _Document, _is_mapping, _json_equal
from constrain.compilers.json_schema.enums import _EnumRules
from constrain.compilers.json_schema.errors import _TIME_LIMIT, _check_time, _OutOfTime, _Unsatisfiable, _verdict
from constrain.compilers.json_schema.keywords import (
    _ANNOTATIONS,
    _BRANCHING,
    _DEPENDENT_KEYWORDS,
    _EXPANDED,
    _SCALAR_TYPES,
    _Part,
    _Shape,
)
from constrain.compilers.json_schema.layout import NULLABLE_SHARED, _any_value_rules, _Layout, _layout, _shared_body
from constrain.compilers.json_schema.numbers import _NumberRules
from constrain.compilers.json_schema.objects import _ObjectRules
from constrain.compilers.json_schema.rules import _finalize
from constrain.compilers.json_schema.strings import _StringRules
from constrain.errors import ArgumentError, AutomatonTooLarge, GrammarError, JsonSchemaError
from constrain.grammar.ir import Alt, Expr, Grammar, Literal, Ref, Seq, calls_of
from constrain.runtime.pushdown import compile_grammar

#: Most grammar rules one schema may produce.
MAX_RULES = 20_000

#: Most bytes of the literals of a value read in place of a call of its rule (:meth:`_Compiler.read_in_place`).
MAX_IN_PLACE_BYTES = 256

#: What the memo holds for a conjunction found unsatisfiable (its verdict is kept in ``unsat``).
_UNSAT = object()


class _Compiler(
    _Deferral, _Combinators, _EnumRules, _NumberRules, _StringRules, _ArrayRules, _ObjectRules, _AnyOrderRules
):
    """The lowering of one schema: every conjunction of parts met becomes a rule (:meth:`conj`), whose body is its
    enum values, a branch over a combinator, or the rules of each kind of value its merged shape allows
    (:meth:`emit`).

    This core holds the state the concerns share (the document, the rules being built, the options, the notes of
    lenient mode and the memos) and the steps they all use; the concerns are its mixins: the combinators
    (:mod:`~constrain.compilers.json_schema.combinators`), enum/const (:mod:`~constrain.compilers.json_schema.enums`),
    numbers, strings, arrays, objects and objects in any order.
    """

    def __init__(
        self,
        schema: Any,
        strict: bool,
        whitespace: str,
        additional_properties_default: bool,
        max_whitespace: int,
        property_order: str = "declared",
        lazy: bool = False,
    ):
        self.doc = _Document(schema)
        #: The (sub)schema at a pointer: the document's own method, called tens of thousands of times a compile.
        self.node = self.doc.node
        self.strict = strict
        self.whitespace = whitespace
        self.ap_default = additional_properties_default
        #: ``property_order="any"``: an object's properties may come in any order (:meth:`members_any_order`).
        self.any_order = property_order == "any"
        #: What is left of :data:`~constrain.compilers.json_schema.any_order.MAX_ANY_ORDER_STATES_TOTAL`.
        self.any_order_left = MAX_ANY_ORDER_STATES_TOTAL
        self.max_ws = max_whitespace
        self.rules: dict[str, Expr] = {}
        #: The rules every schema shares (lexical pieces, any JSON value): productive, free of alias cycles and
        #: calling only each other, so the clean-up takes them as they are.
        self.library: set[str] = set()
        #: The rules the grammar names settled (:attr:`~constrain.grammar.ir.Grammar.settled`): the shared rules
        #: that read a byte first (all but :data:`~constrain.compilers.json_schema.layout.NULLABLE_SHARED`) and
        #: the keys other than an object's names (a JSON string less finitely many: it completes, reads a quote
        #: first and calls nothing), which the checks then do not build.
        self.settled: set[str] = set()
        self.memo: dict[Any, Any] = {}
        self.unsat: dict[Any, _Unsatisfiable] = {}
        self.notes: list[str] = []
        self.names: set[str] = set()
        #: Each schema rule's JSON pointer (its first part's), for refusals that name a rule.
        self.origins: dict[str, str] = {}
        #: The next suffix to try per name base: bases cut at 80 characters repeat (many branches under one long
        #: pointer), and probing ``#2, #3...`` from the start each time is quadratic in their number.
        self._name_next: dict[str, int] = {}
        self._in_place: dict[str, set[str]] = {}
        self._disjoint_cache: dict[tuple, bool] = {}
        #: The values of each negated enum or const met, sorted (by its pointer; see combinators._Excluded).
        self._excluded: dict[str, _Excluded] = {}
        self._finite_cache: dict[str, tuple] = {}
        self._disjoint_checking: set[tuple] = set()
        self._plain: dict[tuple[tuple[str, ...], int | None], Ref] = {}
        #: What distinct and same found per part, and per pair of parts.
        self._signatures: dict[_Part, tuple] = {}
        self._same: dict[tuple[_Part, _Part], bool] = {}
        #: live_keys per part, and what conj returned per (parts as given, depth) once its rule was complete: a
        #: subschema is met many times (each option of a branch, each object that shares a definition). Strict
        #: mode only: in lenient mode normalising again notes again what a probe's notes were reset without.
        self._live: dict[_Part, list[str]] = {}
        self._done: dict[tuple[tuple[_Part, ...], int | None], Ref] | None = {} if strict else None
        #: What normalise returned per conjunction as given, and summary per branch (strict mode only, for the
        #: same reason; a branch is summarised by each test of a oneOf's exclusivity, the certificate's among them).
        self._normal: dict[tuple[_Part, ...], tuple[_Part, ...]] | None = {} if strict else None
        self._summaries: dict[_Part, dict] | None = {} if strict else None
        #: The pointer each reference (pointer, keyword) names, once resolved (strict mode only, likewise).
        self._targets: dict[tuple[str, str], str] | None = {} if strict else None
        #: Whether values whose subschema is certified are lowered later (:mod:`~constrain.compilers.json_schema.
        #: deferral`): strict mode only, where a relaxation cannot wait to be noted, and not with
        #: property_order="any", whose per-schema budget would go to the objects whose texts are read first.
        self.lazy = lazy and strict and not self.any_order and self.doc.containers <= MAX_DEFERRING_NODES
        #: Whether whole subtrees may be among them, or only costly strings (a small schema lowers in less time
        #: than certifying its values would save).
        self.lazy_subtrees = self.lazy and self.doc.containers >= MIN_DEFERRING_NODES
        #: Whether the sets of members an object of ``property_order="any"`` has read may be rules written when a
        #: matcher first reaches them, for objects too large to read in one rule (:meth:`~constrain.compilers.
        #: json_schema.any_order._AnyOrderRules.members_any_order_later`).
        self.any_order_later = lazy and self.any_order
        #: The branching keywords (pointer, keyword) of which more than one alternative may be an object: such
        #: objects keep the declared order past one rule (:meth:`~constrain.compilers.json_schema.any_order.
        #: _AnyOrderRules.among_objects`).
        self.object_branches: set[tuple[str, str]] = set()
        #: The rules put off, each with the pointer it is written for and what writes its body, given the compiler
        #: (not bound to it: the compiler would then be in a reference cycle, left for the cyclic garbage
        #: collector with everything it holds once its structure is dropped).
        self.deferred: dict[str, tuple[str, Callable[[_Compiler], Expr]]] = {}
        #: What writing a rule put off raised (its class and arguments), raised again if it is asked for again.
        self._write_failed: dict[str, tuple[type[Exception], tuple]] = {}
        self._certified: dict[str, bool] = {}
        self._productive: dict[str, bool] = {}
        self._children: dict[str, tuple[str, ...]] = {}
        #: The conjunctions the certificate met, by their names (``&n``) and the names by their parts.
        self._conj_parts: dict[str, frozenset[_Part]] = {}
        self._conj_keys: dict[frozenset[_Part], str] = {}
        self._certifiable: tuple[frozenset[str], frozenset[str]] | None = None

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
            if name not in NULLABLE_SHARED:
                self.settled.add(name)
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
            self.settled.update(name for name in rules if name not in NULLABLE_SHARED)
        return Ref(name)

    # -- parts -----------------------------------------------------------------------------------------------

    def live_keys(self, part: _Part) -> list[str]:
        """The keywords of ``part``'s node that are neither skipped nor annotations (a list shared by every call:
        read it, never change it)."""
        live = self._live.get(part)
        if live is None:
            node = self.node(part.ptr)
            skip = part.skip
            live = [k for k in node if k not in skip and k not in _ANNOTATIONS] if _is_mapping(node) else []
            self._live[part] = live
        return live

    def normalise(self, parts: Sequence[_Part]) -> tuple[_Part, ...]:
        """Expand ``$ref`` and ``allOf`` into the conjunction, drop ``true`` and empty parts; ``false`` is
        unsatisfiable."""
        if len(parts) == 1 and parts[0].neg is None:  # most conjunctions: one subschema with nothing to expand
            node = self.node(parts[0].ptr)
            if type(node) is dict and node.keys().isdisjoint(_EXPANDED):
                return (parts[0],) if self.live_keys(parts[0]) else ()
        given = tuple(parts)
        normal = self._normal
        if normal is not None:
            hit = normal.get(given)
            if hit is not None:
                return hit
        out: dict[_Part, None] = {}  # in order
        seen: set[_Part] = set()
        parent: dict[_Part, _Part] = {}  # the part a reference or allOf expanded each one from
        work = deque(parts)
        while work:
            part = work.popleft()
            if part in seen:
                continue
            seen.add(part)
            if part.neg is not None:
                out[part] = None
                continue
            node = self.node(part.ptr)
            if type(node) is dict and node.keys().isdisjoint(_EXPANDED):  # most parts: kept as they are
                if self.live_keys(part):
                    out[part] = None
                continue
            if node is True:
                continue
            if node is False:
                raise self.unsatisfiable("the schema is false", part.ptr, None)
            if not isinstance(node, Mapping):
                raise JsonSchemaError("a schema must be an object or a boolean", _clean_pointer(part.ptr))
            if "$ptr" in node:
                work.appendleft(_Part(node["$ptr"]))
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
                    self.refuse_ref_cycle(_Part(target), part, parent, kw)
                    if self.doc.legacy and kw == "$ref":
                        added = [_Part(target)]
                        skip = None
                        break
                    skip.add(kw)
                    added.append(_Part(target))
            if skip is None:
                work.extendleft(reversed(added))
                continue
            if "allOf" in node and "allOf" not in skip:
                skip.add("allOf")
                added.extend(_Part(f"{part.ptr}/allOf/{i}") for i in range(len(node["allOf"])))
            for child in added:
                parent.setdefault(child, part)
            part = _Part(part.ptr, frozenset(skip), part.neg)
            work.extend(added)
            if self.live_keys(part):
                out[part] = None
        result = tuple(out)
        if len(result) > 1:
            result = self.distinct(result)
        if normal is not None:
            normal[given] = result
        return result

    def distinct(self, parts: tuple[_Part, ...]) -> tuple[_Part, ...]:
        """``parts`` less each one that says what an earlier one says (:meth:`same`): the conjunction of a
        subschema with itself is that subschema. A property that a ``patternProperties`` pattern also matches
        often repeats the pattern's subschema, whose branches would otherwise be multiplied by themselves."""
        kept: list[_Part] = []
        alike: dict[tuple, list[_Part]] = {}  # by what same compares first
        signatures = self._signatures
        for part in parts:
            signature = signatures.get(part)
            if signature is None:
                signature = signatures[part] = self.signature(part)
            if signature:
                earlier = alike.get(signature)
                if earlier is None:
                    alike[signature] = [part]
                elif any(self.same_cached(part, other) for other in earlier):
                    continue
                else:
                    earlier.append(part)
            kept.append(part)
        return parts if len(kept) == len(parts) else tuple(kept)

    def signature(self, part: _Part) -> tuple:
        """What :meth:`same` tells apart cheaply: the part's skipped keywords, and each live keyword with its value
        when a scalar, its type and size otherwise; empty for a part that is like no other (negated, synthetic)."""
        if part.neg is not None or self.doc.is_synthetic(part.ptr):
            return ()
        node = self.node(part.ptr)
        shallow = []
        for kw in self.live_keys(part):
            value = node[kw]
            shallow.append((kw, (type(value).__name__, len(value)) if isinstance(value, (dict, list)) else value))
        return part.skip, frozenset(shallow)

    def same_cached(self, a: _Part, b: _Part) -> bool:
        """:meth:`same`, kept per pair: the parts a conjunction shares with its branches' are compared again in
        each branch."""
        key = (a, b)
        found = self._same.get(key)
        if found is None:
            found = self._same[key] = self.same(a, b)
        return found

    def same(self, a: _Part, b: _Part) -> bool:
        """Whether the parts ``a`` and ``b`` lower alike: the same keywords (annotations aside) with JSON-equal
        values, read at the same base URI (their references then resolve alike), neither negated nor synthetic."""
        if a.neg is not None or b.neg is not None or a.skip != b.skip:
            return False
        keys = self.live_keys(a)
        if len(keys) != len(self.live_keys(b)) or self.doc.is_synthetic(a.ptr) or self.doc.is_synthetic(b.ptr):
            return False
        na, nb = self.node(a.ptr), self.node(b.ptr)
        if type(na) is not dict or type(nb) is not dict:
            return False
        for kw in keys:
            if kw not in nb or na[kw] != nb[kw]:
                return False
        return all(_json_equal(na[kw], nb[kw]) for kw in keys) and self.doc.base_at(a.ptr) == self.doc.base_at(b.ptr)

    @staticmethod
    def refuse_ref_cycle(target: _Part, part: _Part, parent: Mapping[_Part, _Part], kw: str) -> None:
        """JsonSchemaError when ``target`` is ``part`` or a part it was expanded from: a reference back to a schema
        applied to the same value (``{"$ref": "#"}``), which a validator follows forever. A reference reached
        again inside a property or an item is a recursion over the value's structure, and fine."""
        node: _Part | None = part
        while node is not None:
            if node.ptr == target.ptr and node.neg is None:
                raise JsonSchemaError(
                    "refers back to a schema applied to the same value, without descending into it: "
                    "a validator never finishes",
                    _clean_pointer(f"{part.ptr}/{kw}"),
                    kw,
                )
            node = parent.get(node)

    def resolve_ref(self, ptr: str, kw: str, ref: Any) -> str:
        known = self._targets
        if known is not None:
            target = known.get((ptr, kw))
            if target is None:
                target = known[(ptr, kw)] = self._resolve_ref(ptr, kw, ref)
            return target
        return self._resolve_ref(ptr, kw, ref)

    def _resolve_ref(self, ptr: str, kw: str, ref: Any) -> str:
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
        self.origins[name] = _clean_pointer(parts[0].ptr) if parts else ""
        if len(self.names) > MAX_RULES:
            raise JsonSchemaError(f"the schema needs more than {MAX_RULES:,} grammar rules", "", None)
        return name

    def conj(self, parts: Sequence[_Part], depth: int | None, defer: bool = False) -> Ref:
        """A rule for the conjunction of ``parts`` (raises _Unsatisfiable when none can hold). ``defer``: the rule
        is for a value read after a byte of its container's (a property's, an item's), and may be written later
        when its subschema is certified (:meth:`deferrable`)."""
        done = self._done
        given = (tuple(parts), depth)
        if done is not None:
            ref = done.get(given)
            if ref is not None:
                return ref
        else:
            done = {}  # written, never read
        parts = self.normalise(parts)
        if not parts:
            ref = done[given] = self.any_value(depth)
            return ref
        types = self.plain_types(parts)
        if types is not None:
            ref = done[given] = self.plain_rule(types, parts, depth)
            return ref
        key = (frozenset(parts), depth)
        hit = self.memo.get(key)
        if hit is _UNSAT:
            raise _verdict(self.unsat[key])
        if hit is not None:
            ref = Ref(hit)
            if hit in self.rules:  # complete; a rule still being built (a recursion) may yet prove unsatisfiable
                done[given] = ref
            return ref
        _check_time(parts[0].ptr)
        self.last_pointer = parts[0].ptr
        name = self.new_name(parts, depth)
        self.memo[key] = name
        if defer and self.lazy and self.put_off(given[0], parts):
            self.deferred[name] = (parts[0].ptr, operator.methodcaller("body", parts, depth, name))
            ref = done[given] = Ref(name)
            return ref
        try:
            body = self.body(parts, depth, name)
        except _Unsatisfiable as exc:
            self.memo[key] = _UNSAT
            self.unsat[key] = _verdict(exc)
            raise
        self.rules[name] = body
        ref = done[given] = Ref(name)
        return ref

    def read_in_place(self, value: Ref) -> Expr:
        """What a container reads for ``value``: the body of its rule when that is a few literals (an enum, a
        const), else the call. A value of a few literals is cheaper read in place than compiled, checked and kept
        as a rule of its own, and reads the same text."""
        body = self.rules.get(value.rule)
        literals = (body,) if type(body) is Literal else body.items if type(body) is Alt else None
        if literals is not None and sum(map(_literal_size, literals)) <= MAX_IN_PLACE_BYTES:
            return body
        return value

    def put_off(self, given: tuple[_Part, ...], parts: tuple[_Part, ...]) -> bool:
        """Whether the value of the conjunction ``given``, normalised to ``parts``, may be written later: one
        subschema, taken whole, that the certificate vouches for (:meth:`deferrable`), as normalised or, when it
        opened into several parts (an ``allOf``, a reference beside other keywords), as given."""
        if len(parts) == 1:
            return not parts[0].skip and self.deferrable(parts[0].ptr)
        return len(given) == 1 and not given[0].skip and given[0].neg is None and self.deferrable(given[0].ptr)

    def plain_types(self, parts: tuple[_Part, ...]) -> tuple[str, ...] | None:
        """The type names of a conjunction that is one subschema saying nothing but a ``type`` of scalars (a third
        of the subschemas of real schemas: ``{"type": "string", "description": ...}``), sorted; for one saying
        nothing but ``"type": "array"`` and ``items`` of that kind (``{"type": "array", "items": {"type":
        "string"}}``, one in sixteen), ``"array of"`` followed by the items' names. Otherwise None."""
        if len(parts) != 1 or parts[0].neg is not None:
            return None
        live = self.live_keys(parts[0])
        node = self.node(parts[0].ptr)
        if live == ["type"]:
            return _scalar_types(node["type"])
        if len(live) != 2 or "items" not in live or node.get("type") != "array" or type(node["items"]) is not dict:
            return None
        items = _Part(parts[0].ptr + "/items")
        names = _scalar_types(node["items"]["type"]) if self.live_keys(items) == ["type"] else None
        return None if names is None else ("array of", *names)

    def plain_rule(self, types: tuple[str, ...], parts: tuple[_Part, ...], depth: int | None) -> Ref:
        """What every subschema of :meth:`plain_types` ``types`` compiles to: its body is the same wherever it
        stands, so it is built once per schema, and where it is one call of a shared rule (a string, a number)
        that call takes the place of a rule of its own."""
        ref = self._plain.get((types, depth))
        if ref is None:
            kind = f"array of {'|'.join(types[1:])}" if types[0] == "array of" else "|".join(types)
            name = "type:" + kind + ("" if depth is None else f"@{depth}")
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
                    if self.any_order and _names_only(node, kw):
                        continue  # read by the object's rule (_Shape.dependents)
                    self.quick_check(parts)
                    return self.branch(parts, part, kw, depth)
        shape = self.merge(parts)
        return self.emit(shape, depth, name)

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

    def bracketed(self, nonempty, empty_ok, open_, close, empty, at) -> Expr:
        options = []
        if empty_ok:
            options.append(empty)
        if nonempty is not None:
            options.append(Seq((open_, nonempty, close)))
        if not options:
            raise self.unsatisfiable("no container satisfies the constraints", *at)
        return options[0] if len(options) == 1 else Alt(tuple(options))

    # -- the whole schema ------------------------------------------------------------------------------------

    def compile(self) -> Grammar:
        depth = 0 if self.whitespace == "indent" else None
        root = self.conj((_Part(""),), depth)
        self.rules["root"] = root
        return self.grammar("root", set())

    def grammar(self, start: str, known: Set[str]) -> Grammar:
        """The grammar of ``start``: the rules it reaches that ``known`` lacks, cleaned up, with the rules put off
        that they call."""
        rules = _finalize(self.rules, start, self.library, self.origins, known, self.deferred)
        deferred = (
            {r for body in rules.values() for r in calls_of(body) if r in self.deferred and r not in known}
            if self.deferred
            else ()
        )
        return Grammar(
            rules,
            start,
            {name: self.origins[name] for name in (*rules, *deferred) if name in self.origins},
            deferred=frozenset(deferred),
            write_later=self.write_later if deferred else None,
            settled=frozenset(name for name in rules if name in self.settled),
        )

    def write_later(self, name: str, known: Set[str]) -> Grammar:
        """Write the rule put off as ``name`` (see :attr:`Grammar.write_later`). Certified, so neither refused nor
        unsatisfiable; the time limit and the bounds on automata still hold, and a rule they stop fails the same
        way each time it is asked for."""
        failed = self._write_failed.get(name)
        if failed is not None:
            raise failed[0](*failed[1])
        self.last_pointer, write = self.deferred[name]
        try:
            self.rules[name] = write(self)
            fragment = self.grammar(name, known)
        except _OutOfTime as exc:
            where = _clean_pointer(str(exc)) or "/"
            failed = CompileTimeout, (f"writing the rule of {where} ran past the time limit", name)
        except RecursionError:
            failed = JsonSchemaError, ("the schema nests too deeply to compile", _clean_pointer(self.last_pointer))
        except JsonSchemaError as exc:  # unsatisfiable too: a certificate that failed, refused where it was found
            failed = JsonSchemaError, (exc.reason, exc.pointer, exc.keyword)
        except (AutomatonTooLarge, CompileTimeout) as exc:
            failed = type(exc), (str(exc), exc.rule, exc.origin)
        if failed is not None:
            self._write_failed[name] = failed  # the class and arguments: a raised error would hold the frames
            raise failed[0](*failed[1])
        del self.deferred[name]
        return fragment


def _names_only(node: Mapping, kw: str) -> bool:
    """Whether ``node[kw]`` is ``dependentRequired`` or ``dependencies`` whose every value is a list of names."""
    value = node[kw]
    return (
        kw in ("dependentRequired", "dependencies")
        and isinstance(value, Mapping)
        and all(isinstance(names, list) and all(isinstance(n, str) for n in names) for names in value.values())
    )


# ==============================================================================================================
# Public API


def schema_to_grammar(
    schema: Any,
    *,
    strict: bool = True,
    whitespace: str = "compact",
    additional_properties_default: bool = True,
    max_whitespace: int = 20,
    property_order: str = "declared",
    time_limit: float | None = DEFAULT_TIME_LIMIT,
    lazy: bool = False,
) -> tuple[Grammar, list[str]]:
    """Lower a JSON Schema to a grammar; returns ``(grammar, relaxations)``.

    ``strict`` (default): anything that cannot be honoured exactly raises :class:`JsonSchemaError`; the list of
    relaxations is then empty. ``strict=False``: such keywords are relaxed and each relaxation is listed.
    ``whitespace``: ``"compact"``, ``"flexible"`` (at most ``max_whitespace`` whitespace characters between
    tokens) or ``"indent"`` (two-space indentation). ``time_limit`` (CPU seconds, default
    :data:`DEFAULT_TIME_LIMIT`; ``None`` for none) refuses a schema whose compilation runs longer, the guard
    against hostile schemas that no size limit catches. ``additional_properties_default=False`` treats objects that
    declare ``properties`` (and no ``additionalProperties``/``patternProperties``) as closed.
    ``property_order``: ``"declared"`` writes an object's properties in the order of ``properties`` (then the
    names only in ``required``), additional ones last; ``"any"`` accepts them in any order, additional ones
    anywhere, for objects of at most :data:`~constrain.compilers.json_schema.any_order.MAX_ANY_ORDER_PROPERTIES`
    declared properties, or with ``lazy`` at most
    :data:`~constrain.compilers.json_schema.any_order.MAX_ANY_ORDER_LATER_PROPERTIES` (a larger one keeps the
    declared order).

    ``lazy``: the rules of property values and array items whose subschemas are certified
    (:mod:`~constrain.compilers.json_schema.deferral`; strict mode only), and those of the sets of members a large
    object of ``property_order="any"`` has read, are left out, named in the grammar's ``deferred`` and written by its
    ``write_later`` when a pushdown first calls them; the grammar then holds the compiler until then.
    """
    if whitespace not in ("compact", "flexible", "indent"):
        raise ArgumentError("whitespace", whitespace, "'compact', 'flexible' or 'indent'")
    if not isinstance(max_whitespace, int) or max_whitespace < 0:
        raise ArgumentError("max_whitespace", max_whitespace, "a non-negative int")
    if property_order not in ("declared", "any"):
        raise ArgumentError("property_order", property_order, "'declared' or 'any'")
    compiler = None
    try:
        with time_limited(time_limit, "the schema"):
            compiler = _Compiler(
                schema, strict, whitespace, additional_properties_default, max_whitespace, property_order, lazy
            )
            grammar = compiler.compile()
    except _TIME_LIMIT as exc:
        where = str(exc) if isinstance(exc, _OutOfTime) else getattr(compiler, "last_pointer", "")
        raise JsonSchemaError(
            f"compiling this schema takes longer than time_limit={time_limit:g} s (None lifts the limit)",
            _clean_pointer(where),
        ) from None
    except _Unsatisfiable as exc:  # the compiler's internal signal, shown as the public error it is a kind of
        raise JsonSchemaError(exc.reason, exc.pointer, exc.keyword) from None
    except RecursionError:
        raise JsonSchemaError(
            "the schema nests too deeply to compile", _clean_pointer(getattr(compiler, "last_pointer", ""))
        ) from None
    return grammar, list(compiler.notes)


def compile_json_schema(schema: Any, vocab, **options):
    """Compile a JSON Schema for ``vocab`` into a :class:`~constrain.runtime.pushdown.GrammarStructure`.

    ``options``: those of :func:`schema_to_grammar` (``lazy`` is on unless turned off: a certified value's rules
    are written when a matcher first reaches it), and ``cache_bytes`` for the mask cache. The structure's
    ``relaxations`` lists what lenient mode relaxed. ``time_limit`` covers the grammar and its automata, and each
    rule written later on its own.

    The cyclic garbage collector is paused for the whole compile of a schema of more than :data:`PAUSE_NODES`
    objects and arrays (:mod:`constrain.collector`; a compile that runs long pauses it anyway): such a compile's
    expression trees and automata outlive the young generations' collections while it runs, and each collection
    moves them on toward the oldest generation, whose full collections walk the whole process (hundreds of
    milliseconds once a tokenizer and a few thousand compiles are in it). Over 2,500 dev-set schemas, pausing
    made 9 full collections 3 and the time collections take inside TTFM a quarter. A small schema's compile is
    left alone: it allocates too little to set off a collection that matters."""
    pause = _more_nodes_than(schema, PAUSE_NODES)
    if pause:
        collector.pause()
    try:
        with time_limited(options.get("time_limit", DEFAULT_TIME_LIMIT), "the schema"):
            return _compile_json_schema(schema, vocab, **options)
    finally:
        if pause:
            collector.resume()


#: Objects and arrays in a schema past which its compile pauses the garbage collector from the start (a median
#: dev-set schema has 10; those whose TTFM is above the 90th percentile, 136).
PAUSE_NODES = 32


def _scalar_types(names: Any) -> tuple[str, ...] | None:
    """The value of a ``type`` keyword naming only scalar types, as sorted names; None for anything else."""
    names = [names] if isinstance(names, str) else names
    if not isinstance(names, list) or not all(isinstance(n, str) and n in _SCALAR_TYPES for n in names):
        return None
    return tuple(sorted(set(names)))


def _literal_size(expr: Expr) -> int:
    """The length of a literal; past :data:`MAX_IN_PLACE_BYTES` for anything else."""
    return len(expr.value) if type(expr) is Literal else MAX_IN_PLACE_BYTES + 1


def _more_nodes_than(schema: Any, limit: int) -> bool:
    """Whether ``schema`` holds more than ``limit`` objects and arrays (a walk that stops there). JSON's own types
    are told by ``type`` first: a scalar's ``isinstance`` against ``Mapping`` is the slow path of an ABC."""
    stack = [schema]
    count = 0
    while stack:
        node = stack.pop()
        kind = type(node)
        if kind is dict:
            stack.extend(node.values())
        elif kind is list:
            stack.extend(node)
        elif kind is str or kind is int or kind is float or kind is bool or node is None:
            continue
        elif isinstance(node, Mapping):
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
        else:
            continue
        count += 1
        if count > limit:
            return True
    return False


def _compile_json_schema(schema: Any, vocab, **options):
    grammar_options = {"lazy": True}
    grammar_options.update((k, options.pop(k)) for k in list(options) if k in _GRAMMAR_OPTIONS)
    grammar, notes = schema_to_grammar(schema, **grammar_options)
    time_limit = grammar_options.get("time_limit", DEFAULT_TIME_LIMIT)
    try:
        structure = compile_grammar(grammar, vocab, lazy=True, **options)
    except (AutomatonTooLarge, CompileTimeout, GrammarError) as exc:  # _finalize refuses every other GrammarError
        pointer = grammar.origins.get(getattr(exc, "rule", None) or "", "")
        limit = f" (time_limit={time_limit})" if isinstance(exc, CompileTimeout) else ""
        raise JsonSchemaError(f"the schema's grammar cannot be built: {exc}{limit}", pointer) from exc
    structure.relaxations = notes
    return structure


_GRAMMAR_OPTIONS = {
    "strict",
    "whitespace",
    "additional_properties_default",
    "max_whitespace",
    "property_order",
    "time_limit",
    "lazy",
}
