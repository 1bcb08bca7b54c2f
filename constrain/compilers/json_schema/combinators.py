"""The combinators: ``anyOf``, ``oneOf``, ``not``, ``if``/``then``/``else`` and the dependent keywords as
alternatives of conjunctions, the negation of a schema, and the merging of a conjunction's flat parts into a shape.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterator, Mapping, Sequence
from decimal import Decimal
from itertools import islice, product
from typing import Any

from constrain.compilers.json_schema.document import _clean_pointer, _escape_token
from constrain.compilers.json_schema.errors import (
    _check_dependencies,
    _NotNegatable,
    _TooLarge,
    _Unsatisfiable,
    _verdict,
)
from constrain.compilers.json_schema.formats import _FORMATS, _UNSUPPORTED_FORMATS
from constrain.compilers.json_schema.keywords import (
    _ANNOTATIONS,
    _ARRAY_KEYWORDS,
    _BRANCHING,
    _DRAFT3_ONLY,
    _FAMILY,
    _GROUPS,
    _KEYWORD_GROUP,
    _NEGATABLE,
    _OBJECT_KEYWORDS,
    _VALIDATION,
    _Part,
    _Shape,
)
from constrain.compilers.json_schema.rules import _options
from constrain.compilers.json_schema.values import _ALL_KINDS, _dumps, _json_key, _kind_of, _kinds_of_type, _to_decimal
from constrain.errors import JsonSchemaError
from constrain.grammar.ir import Alt, Expr


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


#: Most alternatives an exact ``oneOf`` may take (each branch with the negations of the branches it may overlap).
MAX_ONE_OF_COMBINATIONS = 128
#: Most branches of a ``oneOf`` made exclusive by negation (each pair is tested for a common value).
MAX_ONE_OF_BRANCHES = 32
#: Most trial compiles (is this conjunction satisfiable?) making one ``oneOf`` exclusive may take, and most rules
#: (conjunctions) they may make in all: a bound on the work that counts the same on every machine.
MAX_ONE_OF_PROBES = 4000
MAX_ONE_OF_PROBE_RULES = 6000

#: The bound of a shape that the negation of a count keyword tightens: not ``minLength: n`` is ``maxLength: n - 1``.
_NEGATED_COUNTS = {
    "minLength": "max_len",
    "maxLength": "min_len",
    "minItems": "max_items",
    "maxItems": "min_items",
    "minProperties": "max_props",
    "maxProperties": "min_props",
}


class _Excluded:
    """The values of a negated ``enum`` or ``const``, sorted by what each excludes from a shape. A negated enum is
    merged into every trial conjunction of an exclusive ``oneOf`` over enums, so its values are sorted once."""

    __slots__ = ("null", "bools", "numbers", "strings", "others")

    def __init__(self, values: Sequence[Any]):
        self.null = False
        self.bools: set[bool] = set()
        self.numbers: set[Decimal] = set()
        self.strings: set[str] = set()
        #: Arrays and objects, as (kind, value): a shape cannot exclude one.
        self.others: list[tuple[str, Any]] = []
        for value in values:
            kind = _kind_of(value)
            if kind == "null":
                self.null = True
            elif kind == "boolean":
                self.bools.add(value)
            elif kind in ("int", "frac"):
                self.numbers.add(_to_decimal(value))
            elif kind == "string":
                self.strings.add(value)
            else:
                self.others.append((kind, value))


class _Combinators:
    """The combinators: the branching keywords (``anyOf``, ``oneOf``, ``not``, ``if``/``then``/``else`` and the
    dependent keywords) as alternatives of conjunctions, the negation of a schema, and the merging of a
    conjunction's flat parts (``allOf`` and ``$ref`` already expanded by ``normalise``) into one :class:`_Shape`.

    A mixin of :class:`~constrain.compilers.json_schema.compiler._Compiler`. It relies on the compiler's ``doc``,
    ``node``, ``rules`` and ``notes``, on its caches ``_finite_cache``, ``_disjoint_cache``, ``_disjoint_checking``,
    ``_excluded`` and ``_in_place``, on its methods ``conj``, ``normalise``, ``live_keys``, ``synthetic``,
    ``resolve_ref``, ``foreign``, ``known_here``, ``refuse`` and ``unsatisfiable``, and on ``closed_by_default``
    (:class:`~constrain.compilers.json_schema.objects._ObjectRules`)."""

    # -- contradictions found before branching ---------------------------------------------------------------

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
        if self.any_order_later and sum(self.may_be_object(base + tuple(extra)) for extra in alternatives) > 1:
            self.object_branches.add((part.ptr, kw))
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

    def may_be_object(self, parts: tuple[_Part, ...]) -> bool:
        """Whether the conjunction ``parts`` may describe an object, going by its parts' own ``type``, ``const``
        and ``enum`` (a reference, not followed, may)."""
        for part in parts:
            if part.neg is not None:
                continue
            node = self.node(part.ptr)
            if not isinstance(node, Mapping):
                if node is False:
                    return False
                continue
            live = self.live_keys(part)
            if "type" in live and "object" not in _kinds_of_type(node["type"]):
                return False
            if "const" in live and not isinstance(node["const"], Mapping):
                return False
            if "enum" in live and isinstance(node["enum"], list):
                if not any(isinstance(value, Mapping) for value in node["enum"]):
                    return False
        return True

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
            return self.exclusive_one_of(branches)
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
        _check_dependencies(len(choices), _clean_pointer(f"{ptr}/{kw}"), kw)
        return [tuple(p for conj in combo for p in conj) for combo in product(*choices)]

    def exclusive_one_of(self, branches: list[_Part]) -> list[tuple[_Part, ...]]:
        """``oneOf`` made exact: each branch together with the negation of every other branch it may overlap (a
        branch provably disjoint from it needs none), each negation kept to the alternatives that can hold beside
        the branch. Raises _NotNegatable when an overlapping branch cannot be negated, or when that takes more than
        :data:`MAX_ONE_OF_COMBINATIONS` alternatives or :data:`MAX_ONE_OF_BRANCHES` branches."""
        n = len(branches)
        if n > MAX_ONE_OF_BRANCHES:
            raise _NotNegatable(f"the oneOf branches are not provably exclusive (more than {MAX_ONE_OF_BRANCHES})")
        summaries = [self.summary(b) for b in branches]
        negations: dict[int, list[tuple[_Part, ...]]] = {}
        out: list[tuple[_Part, ...]] = []
        probes = [0]
        made = len(self.memo)

        def holds(parts: tuple[_Part, ...]) -> bool:
            probes[0] += 1
            if probes[0] > MAX_ONE_OF_PROBES or len(self.memo) - made > MAX_ONE_OF_PROBE_RULES:
                raise _NotNegatable(
                    f"the oneOf branches need more than {MAX_ONE_OF_PROBES} trial compiles (or "
                    f"{MAX_ONE_OF_PROBE_RULES} trial rules) to be made exclusive"
                )
            return self.can_hold(parts)

        for i, b in enumerate(branches):
            # The alternatives for branch i, refined one overlapping branch j at a time: an alternative that already
            # excludes branch j stays as it is; another is split by the negation's alternatives that can hold in it.
            terms: list[tuple[_Part, ...]] = [(b,)]
            for j in range(n):
                if j == i or _disjoint(summaries[i], summaries[j]) or self.no_common_value(b, branches[j]):
                    continue
                if j not in negations:
                    try:
                        negations[j] = self.negate(branches[j].ptr)
                    except _NotNegatable as exc:
                        raise _NotNegatable(
                            f"the oneOf branches are not provably exclusive and cannot be negated ({exc})"
                        ) from None
                refined: list[tuple[_Part, ...]] = []
                for term in terms:
                    if not holds((*term, branches[j])):
                        refined.append(term)
                        continue
                    refined.extend((*term, *d) for d in negations[j] if holds((*term, *d)))
                    if len(out) + len(refined) > MAX_ONE_OF_COMBINATIONS:
                        raise _NotNegatable("the oneOf branches need too many exclusive combinations")
                terms = refined
                if not terms:  # branch i implies another: it never holds alone
                    break
            out.extend(terms)
        return out

    def can_hold(self, parts: tuple[_Part, ...]) -> bool:
        """Whether the conjunction of ``parts`` is satisfiable as far as compiling it shows (True when that cannot
        be decided: a refusal or too large an automaton)."""
        key = frozenset(parts)
        hit = self._disjoint_cache.get(key)
        if hit is not None:
            return not hit
        notes = list(self.notes)
        mark = len(self.memo)
        try:
            self.conj(parts, None)
            result = True  # the rules made are kept, and so are the notes of what they relaxed
        except _Unsatisfiable:
            result = False
            self.notes[:] = notes
        except (JsonSchemaError, _NotNegatable, _TooLarge):
            result = True
            self.notes[:] = notes
            self.forget_unfinished(mark)
        self._disjoint_cache[key] = not result
        return result

    def forget_unfinished(self, mark: int) -> None:
        """Drop the memo's entries made since it held ``mark`` entries for rules whose body was never made (a
        compile stopped by a refusal that the caller caught): the next request for them compiles them again, and
        refuses again. Entries made before (rules still being built further up) stay."""
        for key, name in list(islice(self.memo.items(), mark, None)):
            if isinstance(name, str) and name not in self.rules and name not in self.deferred:
                del self.memo[key]

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
        mark = len(self.memo)
        try:
            extra = (self.synthetic(a.ptr, {"type": group}),) if group else ()
            self.conj((a, b) + extra, None)
            result = False
        except _Unsatisfiable:
            result = True
        except (JsonSchemaError, _NotNegatable, _TooLarge):
            result = False
            self.forget_unfinished(mark)
        finally:
            self._disjoint_checking.discard(key)
            self.notes[:] = notes
        self._disjoint_cache[key] = result
        return result

    def summary(self, part: _Part) -> dict:
        """What is cheaply known of a branch: its kinds, finite values, required / forbidden / declared properties
        (with finite values), whether it is a closed object, and which kinds its keywords constrain (shared by
        every call for ``part``: read it, never change it)."""
        known = self._summaries
        if known is None:
            return self._summarise(part)
        found = known.get(part)
        if found is None:
            found = known[part] = self._summarise(part)
        return found

    def _summarise(self, part: _Part) -> dict:
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
            if not self.known_here(kw) and not (kw == "contains" and self.doc.is_synthetic(ptr)):
                self.foreign(ptr, kw)
                continue
            if kw in ("$ref", "$dynamicRef", "$recursiveRef"):
                out.extend(self.negate(self.resolve_ref(ptr, kw, value)))
            elif kw == "allOf":
                for i in range(len(value)):
                    out.extend(self.negate(f"{ptr}/allOf/{i}"))
            elif kw == "anyOf":
                factors = [self.negate(f"{ptr}/anyOf/{i}") for i in range(len(value))]
                if math.prod(len(f) for f in factors) > 64:  # counted before any is made: the product can be huge
                    raise _NotNegatable(f"the negation of {_clean_pointer(ptr)}/anyOf is too large")
                out.extend(tuple(p for conj in combo for p in conj) for combo in product(*factors))
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
            elif kw == "patternProperties" and isinstance(value, Mapping):
                # some key matching the pattern has a value its schema rejects (objects._ObjectRules: witnesses)
                for pattern in value:
                    if self.node(f"{ptr}/patternProperties/{_escape_token(pattern)}") is not True:
                        out.append((_Part(ptr, neg=("patternProperties", pattern)),))
            elif kw == "propertyNames":
                if value is not True:  # some key's name the schema rejects
                    out.append((_Part(ptr, neg=("propertyNames",)),))
            elif kw == "additionalProperties":
                if value is not True:  # some key neither declared nor matched has a value the schema rejects
                    out.append((_Part(ptr, neg=("additionalProperties",)),))
            elif kw == "oneOf":
                # no branch holds, or two do
                count = len(value)
                factors = [self.negate(f"{ptr}/oneOf/{i}") for i in range(count)]
                if math.prod(len(f) for f in factors) > 64:  # counted before any is made: the product can be huge
                    raise _NotNegatable(f"the negation of {_clean_pointer(ptr)}/oneOf is too large")
                out.extend(tuple(p for conj in combo for p in conj) for combo in product(*factors))
                branches = [_Part(f"{ptr}/oneOf/{i}") for i in range(count)]
                if count > 1 and not self.pairwise_disjoint(branches):
                    if count * (count - 1) // 2 > 64:
                        raise _NotNegatable(f"the negation of {_clean_pointer(ptr)}/oneOf is too large")
                    out.extend((branches[i], branches[j]) for i in range(count) for j in range(i + 1, count))
            elif kw in ("dependentRequired", "dependencies"):
                for trigger, dep in value.items():
                    present = self.synthetic(f"{ptr}/{kw}/{_escape_token(trigger)}", {"required": [trigger]})
                    if isinstance(dep, list):
                        out.extend((present, _Part(ptr, neg=("required", name))) for name in dict.fromkeys(dep))
                    else:
                        sub = f"{ptr}/{kw}/{_escape_token(trigger)}"
                        out.extend((present, *d) for d in self.negate(sub))
            elif kw == "dependentSchemas":
                for trigger in value:
                    sub = f"{ptr}/{kw}/{_escape_token(trigger)}"
                    present = self.synthetic(sub, {"required": [trigger]})
                    out.extend((present, *d) for d in self.negate(sub))
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
                if not self.known_here(kw) and not (kw == "contains" and self.doc.is_synthetic(part.ptr)):
                    self.foreign(part.ptr, kw)  # (a synthetic contains, a negated items, is ours in every draft)
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
                elif kw in ("dependentRequired", "dependencies"):  # names only, left unbranched (_Shape.dependents)
                    sh.dependents.extend((trigger, tuple(names), at[0]) for trigger, names in value.items() if names)
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
            excluded = self._excluded.get(at[0])
            if excluded is None:
                excluded = self._excluded[at[0]] = _Excluded([node[kw]] if kw == "const" else node[kw])
            if excluded.null:
                sh.restrict(sh.kinds - {"null"}, message, *at)
            sh.bools -= excluded.bools
            sh.num_excluded |= excluded.numbers
            sh.str_excluded |= excluded.strings
            for kind, value in excluded.others:
                if kind in sh.kinds:
                    self.refuse(at[0], kw, f"cannot exclude the {kind} value {_dumps(value)[:60]}", "ignored")
            if not sh.bools:
                sh.restrict(sh.kinds - {"boolean"}, message, *at)
            return
        if kw == "required":
            sh.restrict({"object"}, message, *at)
            sh.forbidden.setdefault(part.neg[1], at[0])
            return
        if kw in ("patternProperties", "propertyNames", "additionalProperties"):
            sh.restrict({"object"}, message, *at)
            if part not in sh.witnesses:
                sh.witnesses.append(part)
            return
        sh.restrict(set(_FAMILY.get(kw, _ALL_KINDS)), message, *at)
        value = node[kw]
        if kw in ("minimum", "exclusiveMinimum"):
            strict = kw == "exclusiveMinimum" or (self.doc.draft4 and node.get("exclusiveMinimum") is True)
            sh.upper(_to_decimal(value), not strict, at)
        elif kw in ("maximum", "exclusiveMaximum"):
            strict = kw == "exclusiveMaximum" or (self.doc.draft4 and node.get("exclusiveMaximum") is True)
            sh.lower(_to_decimal(value), not strict, at)
        elif kw in _NEGATED_COUNTS:
            self._negate_count(sh, kw, value, message, at)
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
        else:  # pragma: no cover
            raise AssertionError(kw)

    @staticmethod
    def _negate_count(sh: _Shape, kw: str, value: Any, message: str, at: tuple) -> None:
        """Tighten ``sh`` by the negation of a count bound: not ``minX: n`` is ``maxX: n - 1`` (nothing when n is
        0), not ``maxX: n`` is ``minX: n + 1``."""
        bound = _NEGATED_COUNTS[kw]
        if kw.startswith("min"):
            current = getattr(sh, bound)
            if value == 0:
                sh.restrict(set(), message, *at)
            elif current is None or value - 1 < current:
                setattr(sh, bound, int(value) - 1)
                setattr(sh, f"{bound}_at", at)
        elif value + 1 > getattr(sh, bound):
            setattr(sh, bound, int(value) + 1)
            setattr(sh, f"{bound}_at", at)

    # -- subschemas evaluated in place -----------------------------------------------------------------------

    def evaluated_beside(self, part: _Part, sh: _Shape) -> Iterator[tuple[_Part, Any, set[str]]]:
        """The other positive parts of ``sh`` evaluated in place of ``part`` (whose annotations ``unevaluated*``
        sees), each with its schema node and live keywords."""
        scope = self.in_place(part.ptr)
        for q in sh.parts:
            if q.neg is not None or q.ptr not in scope or q.ptr == part.ptr:
                continue
            yield q, self.node(q.ptr), set(self.live_keys(q))

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
