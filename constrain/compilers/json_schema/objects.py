"""Objects: the rules of the objects a shape allows."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from functools import partial
from typing import NamedTuple

from constrain.automata.limits import MAX_DFA_STATES
from constrain.compilers.json_schema.any_order import (
    MAX_ANY_ORDER_LATER_NAME_BYTES,
    MAX_ANY_ORDER_LATER_PROPERTIES,
    MAX_ANY_ORDER_PROPERTIES,
    MAX_ANY_ORDER_STATES,
    _any_order_states,
    _AnyOrder,
    _dependent_bits,
)
from constrain.compilers.json_schema.cdfa import _CDFA
from constrain.compilers.json_schema.document import _clean_pointer, _escape_token
from constrain.compilers.json_schema.errors import (
    _TIME_LIMIT,
    _check_time,
    _TooLarge,
    _Unsatisfiable,
    _verdict,
)
from constrain.compilers.json_schema.keywords import _BRANCHING, _Part, _Shape
from constrain.compilers.json_schema.layout import _child_depth, _Layout
from constrain.compilers.json_schema.rules import _then
from constrain.compilers.json_schema.strings import (
    _ENCODING_TOO_LARGE,
    _KEYS_TOO_LARGE,
    _build_key,
    _Key,
    _key_except_dfa,
    _key_language,
    _pattern_key,
    _StringRules,
)
from constrain.compilers.json_schema.values import _is_utf8, _json_string
from constrain.errors import AutomatonTooLarge, JsonSchemaError
from constrain.grammar.ir import Alt, Automaton, Expr, Literal, Ref, Repeat, Seq, shared

#: The names of the rules of the keys other than an object's names (:meth:`_ObjectRules.key_except`).
KEY_EXCEPT_PREFIX = "json_key_except:"
#: Most ``patternProperties`` patterns that apply to one object (the key space splits into 2**n regions).
MAX_PATTERN_PROPERTIES = 4
#: Members of an object read in place in one rule before the rest is a rule of its own; also the fan-out of the
#: tree of rules a long object's members are grouped in (:meth:`_ObjectRules.members_from`).
MEMBER_BLOCK = 16


#: Most rules the members of an object whose properties are counted may take (:func:`counted_member_rules`).
MAX_COUNTED_MEMBER_RULES = 200_000


def counted_member_rules(members: int, count: int) -> int:
    """The rules :meth:`_ObjectRules.members_counted` may write for ``members`` optional members counted up to
    ``count``: (members + 1) x (counts + 2) x (members + 1)."""
    return (members + 1) * (min(count, members) + 2) * (members + 1)


#: Most negated ``patternProperties`` / ``propertyNames`` / ``additionalProperties`` (each needs a member that
#: witnesses it) one object may have: the rules of its members are multiplied by 2 ** that.
MAX_WITNESSES = 4
#: Most rules the members of an object with witnesses may take: (declared properties + 1) x (counts) x (sets of
#: witnesses served).
MAX_WITNESS_RULES = 20_000


#: What :meth:`_ObjectRules.names_cdfa` returns for ``propertyNames`` that allow any name, and for ones refused.
_ANY_NAME = object()
_REFUSED = object()


class _Witness(NamedTuple):
    """What a negated ``patternProperties`` (one pattern), ``propertyNames`` or ``additionalProperties`` asks: a
    member whose key it ``accepts`` (the key language: ``keys()``, an automaton over code points, None when it
    cannot be built) and whose value satisfies the schemas at ``serve``; a member with such a key that does not
    serve it has a value satisfying ``decline`` (None: every such member serves it, as for propertyNames)."""

    part: _Part
    accepts: Callable[[str], bool]
    keys: Callable[[], _CDFA | None]
    serve: list[str]
    decline: list[str] | None


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

    def evaluates(self, compiler: _StringRules, key: str) -> bool:
        if self.evaluates_all or key in self.props or key in self.evaluated_names:
            return True
        for pattern, ptr in self.patterns + self.evaluated_patterns:
            c = compiler.search(pattern, ptr)
            if c is not None and c.accepts(key):
                return True
        return False


class _ObjectRules:
    """The rules of the objects a shape allows: the declared properties in order, required and forbidden names,
    ``patternProperties``, ``additionalProperties``, ``propertyNames``, ``unevaluatedProperties`` and property
    counts.

    A mixin of :class:`~constrain.compilers.json_schema.compiler._Compiler`. It relies on the compiler's ``doc``,
    ``node``, ``rules``, ``settled``, ``names`` and ``ap_default``; on its methods ``conj``, ``normalise``,
    ``live_keys``, ``known_here``, ``layout``, ``shared``, ``bracketed``, ``refuse`` and ``unsatisfiable``; on
    ``merge`` and ``evaluated_beside`` (:class:`~constrain.compilers.json_schema.combinators._Combinators`); and on
    ``search``, ``string_cdfa`` and ``encoded`` (:class:`~constrain.compilers.json_schema.strings._StringRules`)."""

    def object_expr(self, sh: _Shape, depth: int | None, name: str, *, alternative: bool = False) -> Expr:
        """The object of ``sh``. ``alternative``: it is one of several alternatives read in place (see
        :meth:`among_objects`)."""
        if sh.max_props is not None and sh.min_props > sh.max_props:
            raise self.unsatisfiable(
                f"minProperties {sh.min_props} is above maxProperties {sh.max_props}", *sh.min_props_at
            )
        if sh.dependents and sh.witnesses:
            return self.dependents_split(sh, depth, name)
        lay = self.layout(depth)
        cd = _child_depth(depth)
        infos = [self.object_info(part, sh) for part in sh.object_parts]
        closed = (
            (not self.ap_default)
            and any(i.props for i in infos)
            and not any(i.patterns or i.additional or i.unevaluated for i in infos)
        )
        ordered: dict[str, None] = {}  # a dict, not a list: membership is looked up once per name
        for info in infos:
            ordered.update(dict.fromkeys(info.props))
        ordered.update(dict.fromkeys(sh.required))
        ordered.update(dict.fromkeys(sh.forbidden))
        names = list(ordered)
        here = sh.object_parts[0].ptr if sh.object_parts else ""
        items: list[tuple[str, Expr, bool]] = []
        values: dict[str, Expr] = {}
        item_parts: dict[str, list[str]] = {}
        for key in names:
            _check_time(here)
            self.check_name_length(key, infos, sh)
            value = None
            if not _is_utf8(key):
                cause = "its name holds a lone surrogate, which no UTF-8 JSON text spells"
            elif key not in sh.forbidden:
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
                item_parts[key] = vparts
                if closed and not declared and key not in sh.required:
                    cause = "additional properties are closed (additional_properties_default=False)"
                elif not self.name_allowed(sh, key):
                    cause = "the name fails propertyNames"
                else:
                    try:
                        value = self.conj([_Part(v) for v in vparts], cd, defer=True)
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
            member = _then(Literal(_json_string(key)), lay.colon, self.read_in_place(value))
            items.append((key, shared(member), required))
            values[key] = value
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
        witnesses = self.witness_specs(sh) if sh.witnesses else []
        if witnesses:
            extras = None if closed else self.witness_extras(sh, infos, names, witnesses, lay, cd)
            found = self.witnessed_members(items, item_parts, extras, witnesses, sh, lay, cd, name)
            if found is not None:
                at = (sh.witnesses[0].ptr + "/" + sh.witnesses[0].neg[0], "not")
                return self.bracketed(found[0], found[1], lay.obj_open, lay.obj_close, lay.obj_empty, at)
        result = None
        dependents = _dependent_bits(sh, items, names, extra) if sh.dependents else []
        any_order = (
            self.any_order
            and (len(items) > 1 or (items and extra is not None))
            and not (counting and (extra is not None or sh.dependents))
            and dependents is not None
        )
        states = _any_order_states(items, values) if any_order and len(items) <= MAX_ANY_ORDER_PROPERTIES else None
        if states is not None and states <= min(MAX_ANY_ORDER_STATES, self.any_order_left):
            self.any_order_left -= states
            result = self.members_any_order(_AnyOrder(self, items, values, extra, dependents, sh, lay, name))
        elif (
            any_order
            and self.any_order_later
            and len(items) <= MAX_ANY_ORDER_LATER_PROPERTIES
            and sum(len(_json_string(key).encode()) for key, _, _ in items) <= MAX_ANY_ORDER_LATER_NAME_BYTES
            and not alternative
            and not self.among_objects(sh.parts)
        ):
            order = _AnyOrder(self, items, values, extra, dependents, sh, lay, name)
            result = self.members_any_order_later(order, sh, name)
        elif sh.dependents:
            return self.dependents_split(sh, depth, name)
        elif counting:
            extra = self.extra_rule(extra, name)  # one rule, however many counts it may appear at
            result = self.members_counted(items, extra, sh, lay, name)
        if result is None:
            result = self.members_plain(items, extra, lay, name)
        nonempty, empty_ok = result
        at = (
            sh.min_props_at
            if sh.min_props_at[0]
            else ((sh.object_parts[0].ptr if sh.object_parts else ""), "properties")
        )
        return self.bracketed(nonempty, empty_ok, lay.obj_open, lay.obj_close, lay.obj_empty, at)

    def check_name_length(self, key: str, infos: list[_ObjectInfo], sh: _Shape) -> None:
        """JsonSchemaError, at the name's pointer, for a property name longer than one automaton can read: a rule
        reading it needs a state per byte, past :data:`~constrain.automata.limits.MAX_DFA_STATES`. Refused before
        anything is built from it (a name of a megabyte once took gigabytes to reach that limit)."""
        if len(key) * 6 <= MAX_DFA_STATES or not _is_utf8(key):  # \u00XX, the longest escape, is 6 bytes
            return
        size = len(_json_string(key).encode())
        if size <= MAX_DFA_STATES:
            return
        at = next((info.props[key] for info in infos if key in info.props), None)
        at, keyword = (at, "properties") if at else (sh.required.get(key) or sh.forbidden[key], "required")
        raise JsonSchemaError(
            f"a property name of {size:,} bytes is longer than one automaton may read "
            f"(MAX_DFA_STATES = {MAX_DFA_STATES:,})",
            _clean_pointer(at),
            keyword,
        )

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
        d = self.names_cdfa(sh.prop_names)
        return None if d is _ANY_NAME or d is _REFUSED else d

    # -- witnesses: negated patternProperties, propertyNames, additionalProperties ---------------------------------

    def witness_specs(self, sh: _Shape) -> list[_Witness]:
        """What each of ``sh.witnesses`` asks of one member; refused (lenient: the negation ignored) when a key
        language cannot be built or there are more than :data:`MAX_WITNESSES`."""
        if len(sh.witnesses) > MAX_WITNESSES:
            part = sh.witnesses[MAX_WITNESSES]
            self.refuse(
                f"{part.ptr}/{part.neg[0]}", "not", f"more than {MAX_WITNESSES} negated patternProperties, "
                "propertyNames or additionalProperties apply to one object", "ignored",
            )  # fmt: skip
            return []
        out = []
        for part in sh.witnesses:
            kw = part.neg[0]
            node = self.node(part.ptr)
            if kw == "patternProperties":
                value = f"{part.ptr}/{kw}/{_escape_token(part.neg[1])}"
                keys = self.search(part.neg[1], value)
                if keys is None:
                    return []  # lenient: an unsupported pattern, refused by search
                pos = [self.doc.add_synthetic(part.ptr, {"not": {"$ptr": value}})]
                out.append(_Witness(part, keys.accepts, lambda keys=keys: keys, pos, [value]))
            elif kw == "propertyNames":
                names = _Part(f"{part.ptr}/{kw}")

                def fails(key: str, names: _Part = names) -> bool:
                    return not self.valid_name((names,), key)

                def keys(names: _Part = names) -> _CDFA | None:
                    allowed = self.names_cdfa([names])
                    if allowed is _REFUSED:
                        return None
                    if allowed is _ANY_NAME:
                        return _CDFA.empty()
                    return _CDFA.universal().minus(allowed).minimized()

                out.append(_Witness(part, fails, keys, [], None))
            else:  # additionalProperties
                declared = list(node.get("properties", {})) if isinstance(node.get("properties"), Mapping) else []
                pats = node.get("patternProperties", {}) if isinstance(node.get("patternProperties"), Mapping) else {}
                searched = []
                for pattern in pats:
                    c = self.search(pattern, f"{part.ptr}/patternProperties/{_escape_token(pattern)}")
                    if c is None:
                        return []
                    searched.append(c)

                def additional(key: str, declared=declared, searched=searched) -> bool:
                    return key not in declared and not any(c.accepts(key) for c in searched)

                def keys(declared=declared, searched=searched) -> _CDFA:
                    d = _CDFA.universal()
                    if declared:
                        d = d.minus(_CDFA.literals([n for n in declared if _is_utf8(n)])).minimized()
                    for c in searched:
                        d = d.minus(c).minimized()
                    return d

                value = f"{part.ptr}/{kw}"
                pos = [self.doc.add_synthetic(part.ptr, {"not": {"$ptr": value}})]
                out.append(_Witness(part, additional, keys, pos, [value]))
        return out

    def valid_name(self, parts: tuple[_Part, ...], key: str) -> bool:
        try:
            return self.doc.is_valid(parts, key)
        except _TIME_LIMIT:
            raise
        except Exception as exc:
            raise JsonSchemaError(
                f"cannot evaluate propertyNames: {exc}", _clean_pointer(parts[0].ptr), "propertyNames"
            ) from None

    def witness_variants(
        self, vparts: list[str], applicable: int, witnesses: list[_Witness], cd: int | None
    ) -> list[tuple[int, Ref]]:
        """A member's values split by the witnesses it serves: for each subset ``T`` of the ``applicable`` ones (a
        bit mask), its value schema ``vparts`` with every witness of ``T`` served and every other applicable one
        not (so the values of different subsets are disjoint); ``(T, value rule)`` for each that can hold."""
        out = []
        for served in range(applicable + 1):
            if served & ~applicable:
                continue
            parts = list(vparts)
            possible = True
            for k, w in enumerate(witnesses):
                if served >> k & 1:
                    parts.extend(w.serve)
                elif applicable >> k & 1:
                    if w.decline is None:
                        possible = False
                        break
                    parts.extend(w.decline)
            if not possible:
                continue
            try:
                out.append((served, self.conj([_Part(v) for v in parts], cd)))
            except _Unsatisfiable:
                continue
        return out

    def witness_extras(
        self, sh: _Shape, infos, names: list[str], witnesses: list[_Witness], lay: _Layout, cd: int | None
    ) -> list[tuple[int, Expr]]:
        """The additional members (keys that are none of ``names``), split by the ``patternProperties`` regions
        and by the witnesses each key and value serve, as ``(witnesses served, member)``."""
        patterns: dict[str, str] = {}
        for info in infos:
            for p, pp in info.patterns + info.evaluated_patterns:
                patterns.setdefault(p, pp)
        if len(patterns) > MAX_PATTERN_PROPERTIES:
            ptr = next(iter(patterns.values()))
            self.refuse(
                ptr.rsplit("/", 1)[0], "patternProperties",
                f"more than {MAX_PATTERN_PROPERTIES} patternProperties apply to one object", "no additional properties",
            )  # fmt: skip
            return []
        search_of = {p: self.search(p, pp) for p, pp in patterns.items()}
        if any(c is None for c in search_of.values()):
            return []
        order = list(patterns)
        try:
            allowed_names = self.property_names_cdfa(sh)
            key_sets = [w.keys() for w in witnesses]
        except _TooLarge:
            self.refuse(sh.witnesses[0].ptr, "not", "the keys need too large an automaton", "not produced")
            return []
        out: list[tuple[int, Expr]] = []
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
            at = _clean_pointer(vparts[0] if vparts else sh.witnesses[0].ptr)
            try:
                d = _key_language(order, chosen, [n for n in names if _is_utf8(n)], allowed_names)
            except _TooLarge:
                self.refuse(at, "patternProperties", "the keys need too large an automaton", "not produced")
                continue
            if d.is_empty():
                continue
            for applicable in range(2 ** len(witnesses)):
                region = d
                try:
                    for k, keys in enumerate(key_sets):
                        if keys is None:
                            if applicable >> k & 1:
                                region = _CDFA.empty()
                            continue
                        region = (region.intersect(keys) if applicable >> k & 1 else region.minus(keys)).minimized()
                except _TooLarge:
                    self.refuse(at, "not", "the keys need too large an automaton", "not produced")
                    continue
                if region.is_empty():
                    continue
                variants = self.witness_variants(vparts, applicable, witnesses, cd)
                if not variants:
                    continue
                key = self.encoded(region, at, "patternProperties" if order else "propertyNames")
                if key is None:
                    continue
                out.extend((served, Seq((key, lay.colon, value))) for served, value in variants)
        return out

    def witnessed_members(
        self, items, item_parts: dict[str, list[str]], extras: list[tuple[int, Expr]] | None,
        witnesses: list[_Witness], sh: _Shape, lay: _Layout, cd: int | None, name: str,
    ) -> tuple[Expr | None, bool] | None:  # fmt: skip
        """The members of an object that must hold a witness of each of ``witnesses`` (a member whose key and
        value serve it), with the property counts: one rule per (next declared property, members so far, witnesses
        served), the declared properties in order, then the additional ones. None, refused, when that needs
        more than :data:`MAX_WITNESS_RULES` rules."""
        full = (1 << len(witnesses)) - 1
        declared: list[tuple[list[tuple[int, Expr]], bool]] = []
        for key, _, required in items:
            applicable = sum(1 << k for k, w in enumerate(witnesses) if w.accepts(key))
            variants = [
                (served, shared(_then(Literal(_json_string(key)), lay.colon, value)))
                for served, value in self.witness_variants(item_parts[key], applicable, witnesses, cd)
            ]
            if not variants:
                if required:
                    raise self.unsatisfiable(
                        f"the required property {key!r} cannot be present with the negated keywords",
                        sh.required[key], "required",
                    )  # fmt: skip
                continue
            declared.append((variants, required))
        n = len(declared)
        lo, hi = sh.min_props, sh.max_props
        cap = hi if hi is not None else max(lo, 1)
        if (n + 1) * (cap + 1) * (full + 1) > MAX_WITNESS_RULES:
            self.refuse(
                f"{sh.witnesses[0].ptr}/{sh.witnesses[0].neg[0]}", "not",
                "the members that witness the negated keywords need too many rules", "ignored",
            )  # fmt: skip
            return None
        required_from: list[int | None] = [None] * (n + 1)
        for i in reversed(range(n)):
            required_from[i] = i if declared[i][1] else required_from[i + 1]
        extra = extras or []

        def moves(state: tuple[int, int, int]) -> list[tuple[Expr, tuple[int, int, int]]]:
            i, c, mask = state
            c2 = c + 1 if hi is not None else min(c + 1, cap)
            if hi is not None and c2 > hi:
                return []
            r = required_from[i]
            last = r if r is not None else n - 1
            out = [
                (member, (j + 1, c2, mask | served)) for j in range(i, last + 1) for served, member in declared[j][0]
            ]
            if r is None:
                out += [(member, (n, c2, mask | served)) for served, member in extra]
            return out

        def accepting(state: tuple[int, int, int]) -> bool:
            i, c, mask = state
            return required_from[i] is None and c >= lo and mask == full

        graph: dict[tuple[int, int, int], list[tuple[Expr, tuple[int, int, int]]]] = {}
        work = [(0, 0, 0)]
        while work:
            state = work.pop()
            if state in graph:
                continue
            _check_time(sh.witnesses[0].ptr)
            graph[state] = moves(state)
            work.extend(t for _, t in graph[state] if t not in graph)
        productive = {st for st in graph if accepting(st)}
        changed = True
        while changed:
            changed = False
            for st, edges in graph.items():
                if st not in productive and any(t in productive for _, t in edges):
                    productive.add(st)
                    changed = True
        if (0, 0, 0) not in productive:
            raise self.unsatisfiable(
                "no object has members that witness every negated keyword", sh.witnesses[0].ptr, "not"
            )

        def options(state: tuple[int, int, int]) -> list[Expr]:
            sep = (lay.comma,) if state[1] else ()
            out: list[Expr] = [Seq((*sep, member, rule(t))) for member, t in graph[state] if t in productive]
            if accepting(state):
                out.append(Seq(()))
            return out

        def rule(state: tuple[int, int, int]) -> Ref:
            rname = f"{name}/w{state[0]}.{state[1]}.{state[2]}"
            if rname not in self.rules:
                self.rules[rname] = Seq(())
                opts = options(state)
                self.rules[rname] = opts[0] if len(opts) == 1 else Alt(tuple(opts))
            return Ref(rname)

        top = [o for o in options((0, 0, 0)) if o != Seq(())]
        nonempty = None if not top else top[0] if len(top) == 1 else Alt(tuple(top))
        return nonempty, accepting((0, 0, 0))

    def names_cdfa(self, prop_names: list[_Part]) -> _CDFA | object:
        """The key names ``propertyNames`` schemas allow, as an automaton over code points, or ``_ANY_NAME``, or
        ``_REFUSED`` (a schema this cannot turn into one, refused); raises _TooLarge."""
        at = prop_names[0].ptr
        try:
            parts = self.normalise(prop_names)
        except _Unsatisfiable:
            return _CDFA.empty()
        if not parts:
            return _ANY_NAME
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
                return _REFUSED
        sub = self.merge(parts)
        if "string" not in sub.kinds:
            return _CDFA.empty()
        d = self.string_cdfa(sub)
        if sub.min_len > 0 or sub.max_len is not None:
            if sub.max_len is not None and sub.min_len > sub.max_len:
                return _CDFA.empty()
            length = _CDFA.length(sub.min_len, sub.max_len)
            d = length if d is None else d.intersect(length).minimized()
        return d if d is not None else _ANY_NAME

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
            if any(self.node(v) is False for v in vparts):  # `additionalProperties: false`, without an exception
                continue
            try:
                value = self.conj([_Part(v) for v in vparts], cd, defer=True)
            except _Unsatisfiable:
                continue
            if not order and allowed_names is None and not names:
                key: Expr = self.shared("json_string")
            elif not order and allowed_names is None:
                key = self.key_except(names, vparts[0] if vparts else sh.object_parts[0].ptr if sh.object_parts else "")
                if key is None:
                    continue
            else:
                if allowed_names is None:
                    found = self.pattern_key(tuple(order), frozenset(chosen), names)
                else:
                    found = _build_key(tuple(order), frozenset(chosen), names, allowed_names)
                at = vparts[0] if vparts else ""
                if found is _KEYS_TOO_LARGE:
                    self.refuse(
                        _clean_pointer(at), "patternProperties", "the keys need too large an automaton", "not produced"
                    )
                    continue
                if found is _ENCODING_TOO_LARGE:
                    keyword = "patternProperties" if order else "propertyNames"
                    self.refuse(at, keyword, "the string constraints need too large an automaton", "any string allowed")
                    continue
                if found is None:
                    continue
                key = found
            members.append(Seq((key, lay.colon, value)))
        if not members:
            return None
        return members[0] if len(members) == 1 else Alt(tuple(members))

    def pattern_key(self, order: tuple[str, ...], chosen: frozenset[str], names: Iterable[str]) -> _Key:
        """:func:`_build_key` without ``propertyNames`` (:func:`_pattern_key`, shared per process): the certificate
        of a value put off (:mod:`~constrain.compilers.json_schema.deferral`) builds the keys of its objects'
        ``patternProperties``, and their lowering, now or later, finds them built."""
        return _pattern_key(order, chosen, frozenset(names))

    def key_except(self, names: list[str], ptr: str) -> Ref | None:
        """A JSON string other than the given names (see :func:`_key_except_dfa`); None, refused at ``ptr``, when
        it needs too large an automaton (tens of thousands of long names). A rule that calls no other rule,
        so its automaton returns only after the closing quote and its string states share their masks with every
        other string (see :class:`~constrain.runtime.lexical.LexicalMasks`). A lazy lowering leaves the automaton
        to be built when a matcher first reads such a key (:meth:`~constrain.grammar.ir.Automaton.later`), unless
        its size could reach the bound whose refusal belongs to the compile."""
        distinct = tuple(sorted(set(names)))
        rule = KEY_EXCEPT_PREFIX + ",".join(map(_json_string, distinct))  # unambiguous: each name is quoted
        if rule not in self.rules:
            # At most a state per byte of the names' JSON text (4 a character in UTF-8) beside the few of any JSON
            # string: one that cannot pass the bound is built when a matcher first reads such a key.
            bound = 4 * len(rule) + 64
            self.settled.add(rule)
            if self.lazy and bound <= MAX_DFA_STATES:
                self.rules[rule] = Automaton.later(partial(_key_except_dfa, distinct), rule, bound)
                return Ref(rule)
            try:
                self.rules[rule] = Automaton(_key_except_dfa(distinct))
            except AutomatonTooLarge:
                self.refuse(
                    ptr, "additionalProperties", "the keys other than the declared names need too large an automaton",
                    "no additional properties produced",
                )  # fmt: skip
                return None
        return Ref(rule)

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
            for q, qnode, qlive in self.evaluated_beside(part, sh):
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

    def extra_rule(self, extra: Expr | None, name: str) -> Expr | None:
        """The additional member ``extra`` as a call of a rule of its own: read at many places of the object's
        rule (each count of it, each set of names read), it is built once."""
        if extra is None or isinstance(extra, Ref):
            return extra
        self.rules[f"{name}/additional"] = extra
        return Ref(f"{name}/additional")

    def members_after(self, following: list[Expr], tail_extra: Expr | None, name: str, i: int) -> Expr:
        """The members ``following[i:]`` in order, then the extra members: from the next multiple of
        :data:`MEMBER_BLOCK` on, the rest is a rule of its own (:meth:`members_from`), shared by the options
        before it, so an object's DFA stays linear in its number of properties."""
        n, block = len(following), MEMBER_BLOCK
        seq: list[Expr] = []
        j = i
        while j < n:
            if j > i and j % block == 0 and n - j > block:
                seq.append(self.members_from(following, tail_extra, name, j))
                break
            seq.append(following[j])
            j += 1
        else:
            if tail_extra is not None:
                seq.append(tail_extra)
        return Seq(tuple(seq))

    def members_from(self, following: list[Expr], tail_extra: Expr | None, name: str, j: int) -> Ref:
        """A rule for the members ``following[j:]`` (``j`` a multiple of :data:`MEMBER_BLOCK`), then the extra
        members. Members are grouped in a tree: :data:`MEMBER_BLOCK` members make a block, as many blocks a block
        of the next size, and so on (:meth:`member_block`). The rule reads the largest blocks that start at ``j``
        and fit, then calls the rule for the rest: a chain of at most ``MEMBER_BLOCK - 1`` calls per block size
        on the way up and again on the way down, so a parse of an object of ``n`` properties nests
        O(log ``n``) calls deep, far within the pushdown's stack bound, and the rules hold O(``n``) items in all.
        The smallest blocks are read in place (a chain of rules of ``MEMBER_BLOCK`` members each, as far as the
        first multiple of ``MEMBER_BLOCK ** 2``)."""
        rule = f"{name}/tail{j}"
        if rule in self.rules:
            return Ref(rule)
        n, block = len(following), MEMBER_BLOCK
        size = block
        while j % (size * block) == 0 and j + size * block <= n:
            size *= block
        if size == block:
            seq: list[Expr] = list(following[j : j + block])
            k = j + block
        else:
            seq = []
            k = j
            while k + size <= n and (k == j or k % (size * block)):
                seq.append(self.member_block(following, name, k, size))
                k += size
        if k < n and n - k > block:
            seq.append(self.members_from(following, tail_extra, name, k))
        else:
            seq.extend(following[k:])
            if tail_extra is not None:
                seq.append(tail_extra)
        self.rules[rule] = Seq(tuple(seq))
        return Ref(rule)

    def member_block(self, following: list[Expr], name: str, j: int, size: int) -> Ref:
        """A rule for the ``size`` members from ``j`` (``size`` a power of :data:`MEMBER_BLOCK` above it, ``j`` a
        multiple of ``size``): the blocks of the size below, or the members themselves."""
        rule = f"{name}/block{j}+{size}"
        if rule not in self.rules:
            part = size // MEMBER_BLOCK
            if part == 1:
                body = Seq(tuple(following[j : j + size]))
            else:
                body = Seq(tuple(self.member_block(following, name, j + k * part, part) for k in range(MEMBER_BLOCK)))
            self.rules[rule] = body
        return Ref(rule)

    def members_counted(self, items, extra, sh: _Shape, lay: _Layout, name: str) -> tuple[Expr | None, bool] | None:
        n = len(items)
        lo, hi = sh.min_props, sh.max_props
        cap = hi if hi is not None else lo
        if counted_member_rules(n, cap) > MAX_COUNTED_MEMBER_RULES:
            at = sh.max_props_at if hi is not None else sh.min_props_at
            self.refuse(at[0], at[1], "counting this many optional properties needs too many rules", "ignored")
            return None
        top = _CountedMembers(self, items, extra, lo, hi, cap, lay, name).options_at(0, 0)
        empty_ok = Seq(()) in top
        top = [o for o in top if o != Seq(())]
        nonempty = None if not top else top[0] if len(top) == 1 else Alt(tuple(top))
        return nonempty, empty_ok


class _CountedMembers:
    """The members of an object whose properties are counted (``minProperties``, ``maxProperties``): rule
    ``{name}/m{i}.{c}`` reads the members from the ``i``-th on with ``c`` read so far. A class rather than two
    closures that call each other: those would close a reference cycle that keeps the whole compiler alive until
    the cyclic garbage collector runs."""

    __slots__ = ("compiler", "items", "extra", "lo", "hi", "cap", "lay", "name", "required_from")

    def __init__(
        self, compiler: _ObjectRules, items, extra, lo: int, hi: int | None, cap: int, lay: _Layout, name: str
    ):
        self.compiler = compiler
        self.items = items
        self.extra = extra
        self.lo, self.hi, self.cap = lo, hi, cap
        self.lay = lay
        self.name = name
        n = len(items)
        #: Per member: the first required member from it on (None: none is left).
        self.required_from: list[int | None] = [None] * (n + 1)
        nxt = None
        for i in reversed(range(n)):
            if items[i][2]:
                nxt = i
            self.required_from[i] = nxt

    def options_at(self, i: int, c: int) -> list[Expr]:
        """What may follow once the members before the ``i``-th were passed and ``c`` were read."""
        items, extra, lay, lo, hi = self.items, self.extra, self.lay, self.lo, self.hi
        n = len(items)
        options: list[Expr] = []
        sep = (lay.comma,) if c > 0 else ()
        r = self.required_from[i]
        last = r if r is not None else n - 1
        for j in range(i, last + 1):
            c2 = c + 1
            if hi is not None and c2 > hi:
                break
            follow = self.rule(j + 1, c2 if hi is not None else min(c2, self.cap))
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

    def rule(self, i: int, c: int) -> Ref:
        """The rule of :meth:`options_at` ``(i, c)``, written once."""
        compiler = self.compiler
        rname = f"{self.name}/m{i}.{c}"
        if rname not in compiler.rules and rname not in compiler.names:
            compiler.names.add(rname)
            options = self.options_at(i, c)
            if options:
                compiler.rules[rname] = options[0] if len(options) == 1 else Alt(tuple(options))
        return Ref(rname)
