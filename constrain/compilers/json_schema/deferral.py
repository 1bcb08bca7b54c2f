"""Which subschemas may be lowered later: when a matcher first reaches the value they describe.

Most of a large schema's compile is lowering subschemas that a request never reaches (the properties its output
leaves out, the branches it does not take). A property's value or an array's item whose subschema is *certified*
is therefore put off (:meth:`~constrain.compilers.json_schema.compiler._Compiler.conj` with ``defer``): its rule is
named now and written when the pushdown first calls it (:attr:`~constrain.grammar.ir.Grammar.deferred`).

Putting a rule off must not change what the compile answers, so a subschema is certified only when lowering it
can neither be refused (strict mode refuses at compile time, not in a mask) nor find it unsatisfiable (the caller
would have dropped the property or refused the schema), and when some finite value satisfies it. The walk checks
each subschema it reaches (through references, branches, properties and items) against a small set of keywords
whose lowering is known to succeed under simple conditions (:data:`CERTIFIED_KEYWORDS`); anything else (a
``maxProperties``, a negation of something) keeps the value eager. A conjunction (``allOf``, a reference beside other
keywords, dependencies, a property that a pattern also matches) is read as its lowering reads it, parts merged
kind by kind; its members and items are conjunctions of their own, named ``&n`` in the walk
(:meth:`_Deferral._conj_local`). A pattern is certified on the automaton of the texts it matches (shared per
process): its JSON strings' automaton, escapes written, cannot pass its bound when that one is small, and is built
when the value is lowered. The keys of an object's one ``patternProperties`` pattern are built now (shared per
process with its lowering, see :meth:`~constrain.compilers.json_schema.objects._ObjectRules.pattern_key`). A rule
put off reads a byte first (a JSON value) and every cycle of references passes through a property or an item, so
no left recursion can wait in it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from constrain.automata.regex import RegexError
from constrain.compilers.json_schema.document import _escape_token
from constrain.compilers.json_schema.errors import _TIME_LIMIT, _NotNegatable, _TooLarge, _Unsatisfiable
from constrain.compilers.json_schema.formats import _FORMATS, _UNSUPPORTED_FORMATS
from constrain.compilers.json_schema.keywords import _DRAFT3_ONLY, _VALIDATION, _Part
from constrain.compilers.json_schema.objects import MAX_COUNTED_MEMBER_RULES, counted_member_rules
from constrain.compilers.json_schema.rules import _cyclic_part, _sccs
from constrain.compilers.json_schema.strings import _costly_string, _searched, _string_holds, _StringKey
from constrain.compilers.json_schema.values import _ALL_KINDS, _compact_text, _is_utf8, _kinds_of_type, _to_decimal
from constrain.errors import JsonSchemaError

#: The validation keywords a certified subschema may use.
CERTIFIED_KEYWORDS = frozenset(
    {
        "type", "enum", "const", "properties", "required", "additionalProperties", "patternProperties", "minProperties",
        "items", "additionalItems", "minItems", "maxItems", "minLength", "maxLength", "pattern", "format", "minimum",
        "maximum", "exclusiveMinimum", "exclusiveMaximum", "$ref", "anyOf", "oneOf", "not", "dependencies",
        "dependentRequired", "allOf",
    }
)  # fmt: skip
#: A value is put off only when its subschema reaches at least this many subschemas: writing a rule later costs a
#: mask some hundreds of microseconds, worth it for an object of several members, not for a string.
MIN_DEFERRED_SUBSCHEMAS = 6
#: Schemas of fewer objects and arrays than this are lowered whole: their values are too small to repay the
#: certificate and the mask that writes them (over 1,000 dev-set schemas, 8 instead of 16 saved 1-2% more of TTFM
#: below the median and raised the p99 of time between masks by another 3%).
MIN_DEFERRING_NODES = 16
#: Schemas of more objects and arrays than this are lowered whole too: every refusal of a bound on the grammar's
#: size then comes at compile time.
MAX_DEFERRING_NODES = 4_000
#: Bounds on what a certified subschema counts: a length, a number of items (an array of up to 1,000 items is a
#: rule of some 2,000 states, 4,000 with flexible whitespace, written in about 10 ms), of properties, a name's
#: length.
MAX_CERTIFIED_LENGTH = 65_536
MAX_CERTIFIED_ITEMS = 1_000
MAX_CERTIFIED_PROPERTIES = 1_000
MAX_CERTIFIED_NAME = 1_000
#: Numeric bounds beyond this magnitude keep the value eager. Their ranges are written digit by digit, so one of 64-bit
#: integers (20 digits) takes about 120 states.
MAX_CERTIFIED_MAGNITUDE = 10**20

#: A subschema not read yet (``None`` is JSON's null, which a node may be).
_UNREAD = object()

#: The keywords through which a subschema reaches others.
_REACHING = frozenset(
    {
        "$ref", "anyOf", "oneOf", "allOf", "properties", "additionalProperties", "patternProperties", "items",
        "additionalItems",
    }
)  # fmt: skip
_OBJECT_KEYWORDS = frozenset({"properties", "required", "additionalProperties", "patternProperties", "minProperties"})
_ARRAY_KEYWORDS = frozenset({"items", "additionalItems", "minItems", "maxItems"})
#: The keywords that make a subschema a conjunction of others (:meth:`_Deferral._conj_local`), and the branching
#: keywords a certified conjunction may split on, in the order the lowering tries them.
_CONJOINING = frozenset({"allOf", "not", "dependencies", "dependentRequired"})
_CERTIFIED_BRANCHING = ("anyOf", "oneOf", "not", "dependentRequired", "dependencies")
#: Most triggers of a subschema's dependencies the certificate splits it by, counted as the alternatives of that
#: many (a required trigger is one alternative, not two; the lowering allows more).
MAX_CERTIFIED_DEPENDENCIES = 4
_STRING_KEYWORDS = frozenset({"minLength", "maxLength", "pattern", "format"})
_COSTLY_STRING_KEYWORDS = _STRING_KEYWORDS | {"type"}
_NUMBER_KEYWORDS = frozenset({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"})
#: The kinds of values (:data:`~constrain.compilers.json_schema.values._ALL_KINDS`) that are numbers, and containers.
_NUMBER_KINDS = frozenset({"int", "frac"})
_CONTAINER_KINDS = frozenset({"object", "array"})
_TYPE_NAMES = frozenset({"null", "boolean", "integer", "number", "string", "array", "object"})
_ONE_TYPE = {name: frozenset({name}) for name in _TYPE_NAMES}
#: The productivity of a subschema no value satisfies.
_NO_VALUE = ("any", ())
#: :meth:`_Deferral._local` of a subschema that some value satisfies and that applies no other subschema.
_HOLDS = (True, (), ())

# A subschema's productivity: True, a pointer (productive when that subschema is), or ("any" | "all", terms).
_Formula = Any


class _Deferral:
    """The certificate of :mod:`~constrain.compilers.json_schema.deferral`, a mixin of
    :class:`~constrain.compilers.json_schema.compiler._Compiler` (its ``doc``, ``node``, ``known_here``,
    ``pairwise_disjoint`` and ``pattern_key``). Verdicts are kept per pointer: ``_certified`` (lowering it
    succeeds, whatever it reaches) and ``_productive`` (some finite value satisfies it); ``_certifiable`` is
    :data:`CERTIFIED_KEYWORDS` less those the schema's draft does not know, with the validation keywords outside
    them."""

    def deferrable(self, ptr: str) -> bool:
        """Whether the subschema at ``ptr`` is worth lowering later and may be: either certified, productive and
        reaching at least :data:`MIN_DEFERRED_SUBSCHEMAS` subschemas in a schema of at least
        :data:`MIN_DEFERRING_NODES` objects and arrays, or a costly string (:meth:`_is_costly_string`). Anything
        smaller is cheaper to lower now than to certify."""
        node = self.node(ptr)
        if self.lazy_subtrees and _may_reach(node, MIN_DEFERRED_SUBSCHEMAS):
            certified = self._certified.get(ptr)
            if certified is None:
                self._certify(ptr)
                certified = self._certified[ptr]
            return certified and self._productive[ptr] and self._reaches(ptr, MIN_DEFERRED_SUBSCHEMAS)
        return self._is_costly_string(ptr, node)

    def _is_costly_string(self, ptr: str, node: Any) -> bool:
        """A subschema of type string that says nothing but its lengths, a pattern and a format, whose counted
        automaton this process has not built and is costly to build (:func:`_costly_string`), and whose strings
        lower to one automaton that matches something (:func:`_string_holds`: its states walked, not folded).
        Such a string is put off on its own, in a schema of any size up to :data:`MAX_DEFERRING_NODES`."""
        if type(node) is not dict or node.get("type") != "string" or "$ptr" in node:
            return False
        if "maxLength" not in node and "minLength" not in node:
            return False  # no count, no counted automaton (most strings)
        validation = self._validation_keywords(ptr, node)
        if validation is None or not _COSTLY_STRING_KEYWORDS.issuperset(validation):
            return False
        lengths = _lengths(node)
        key = _text_key(node)
        if lengths is None or key is None or not _costly_string(key, *lengths):
            return False
        try:
            return _string_holds(key, *lengths)
        except (RegexError, _TooLarge):
            return False

    def _validation_keywords(self, ptr: str, node: Mapping) -> list[str] | None:
        """The validation keywords of the subschema ``node`` at ``ptr``, or None when one of them is outside the
        certified set (a ``$schema`` below the root too, unless it names the root's dialect); anything else is an
        annotation, known or not."""
        certifiable, uncertifiable = self._certifiable_keywords()
        if not uncertifiable.isdisjoint(node):
            return None
        if "$schema" in node and ptr and not self.doc.in_own_dialect(node["$schema"]):
            return None
        return [kw for kw in node if kw in certifiable]

    def _certifiable_keywords(self) -> tuple[frozenset[str], frozenset[str]]:
        """:data:`CERTIFIED_KEYWORDS` less those the schema's draft does not know, and the validation keywords
        outside them."""
        found = self._certifiable
        if found is None:
            certifiable = frozenset(kw for kw in CERTIFIED_KEYWORDS if self.known_here(kw))
            found = self._certifiable = (certifiable, (_VALIDATION | _DRAFT3_ONLY) - certifiable)
        return found

    def _reaches(self, ptr: str, count: int) -> bool:
        """Whether the certified subschema at ``ptr`` reaches ``count`` subschemas (itself included)."""
        seen = {ptr}
        work = [ptr]
        while work:
            for child in self._children[work.pop()]:
                if child not in seen:
                    seen.add(child)
                    if len(seen) >= count:
                        return True
                    work.append(child)
        return len(seen) >= count

    def _certify(self, root: str) -> None:
        """Decide every subschema ``root`` reaches: explore them, mark those that lie on a cycle of references and
        branches or reach one, then find which are productive. The walk stops at the first subschema outside the
        certified set: ``root`` and those it passed through to get there are refused, the rest stay undecided.

        Verdicts are final once written, so each subschema is explored at most once per compile unless a walk
        stops, and the children's nodes are kept in the document's node cache as they are met (the lowering reads
        them there too)."""
        certified = self._certified
        nodes = self.doc.nodes
        found: dict[str, tuple[_Formula, tuple[str, ...], tuple[str, ...]]] = {}
        finder: dict[str, str] = {}  # per subschema found, the one whose walk met it first
        work = [root]
        while work:
            ptr = work.pop()
            if ptr in found:
                continue
            verdict = certified.get(ptr)
            if verdict is None:
                local = self._local(ptr, nodes.get(ptr, _UNREAD))
                if local is not None:
                    found[ptr] = local
                    for child in (*local[1], *local[2]):
                        if child not in found:
                            finder.setdefault(child, ptr)
                            work.append(child)
                    continue
                certified[ptr] = False
            elif verdict:
                continue
            # Whatever reaches a subschema refused certification is refused too: so are the root and the
            # subschemas the walk passed through to meet this one. The others found are left undecided.
            while ptr != root:
                ptr = finder[ptr]
                certified[ptr] = False
            return
        bad = self._uncertified(found)
        productive = {ptr: False for ptr in found if ptr not in bad}
        self._productive_fixpoint(found, productive)
        children = self._children
        productive_of = self._productive
        for ptr, local in found.items():
            if ptr in bad:
                certified[ptr] = False
            else:
                certified[ptr] = True
                productive_of[ptr] = productive[ptr]
                children[ptr] = local[1] + local[2]

    def _uncertified(self, found: Mapping[str, tuple[_Formula, tuple[str, ...], tuple[str, ...]]]) -> set[str]:
        """Those of ``found`` (a walk whose every subschema met was found or certified) that lie on a cycle of
        subschemas applied to the same value (references and branches), or reach one."""
        in_place = {ptr: [c for c in same if c in found] for ptr, (_, same, _) in found.items() if same}
        bad = _on_cycles(in_place) if in_place else set()
        if not bad:
            return bad
        callers = _callers(found, found)
        work = list(bad)
        while work:
            for caller in callers.get(work.pop(), ()):
                if caller not in bad:
                    bad.add(caller)
                    work.append(caller)
        return bad

    def _productive_fixpoint(
        self, found: Mapping[str, tuple[_Formula, tuple[str, ...], tuple[str, ...]]], productive: dict[str, bool]
    ) -> None:
        """The least fixpoint of productivity over the certified subschemas ``productive`` names (all False on
        entry). One pass children first (the reverse of their discovery) settles a tree; what a cycle leaves
        undecided is then propagated from each subschema that turns productive to its callers."""
        order = [ptr for ptr in reversed(found) if ptr in productive]
        holds = self._holds
        undecided = False
        for ptr in order:
            formula = found[ptr][0]
            if formula is True or holds(formula, productive):
                productive[ptr] = True
            else:
                undecided = True
        if not undecided:
            return
        callers = _callers(found, order)
        work = [ptr for ptr in order if productive[ptr]]
        while work:  # a subschema turns productive once its terms do, and tells its callers
            for caller in callers.get(work.pop(), ()):
                if not productive[caller] and self._holds(found[caller][0], productive):
                    productive[caller] = True
                    work.append(caller)

    def _holds(self, formula: _Formula, productive: Mapping[str, bool]) -> bool:
        if formula is True:
            return True
        if isinstance(formula, str):
            known = productive.get(formula)
            return self._productive.get(formula, False) if known is None else known
        kind, terms = formula
        test = any if kind == "any" else all
        return test(self._holds(term, productive) for term in terms)

    def _local(self, ptr: str, node: Any) -> tuple[_Formula, tuple[str, ...], tuple[str, ...]] | None:
        """What the subschema at ``ptr`` (``node``, or :data:`_UNREAD`) needs of others: (its productivity, the
        subschemas applied to the same value, those applied to a part of it); None when it is not certified on its
        own. The nodes of the parts it names are kept in the document's node cache."""
        if ptr[:1] == "&":
            return self._conj_local(tuple(self._conj_parts[ptr]))
        if node is _UNREAD:
            try:
                node = self.node(ptr)
            except JsonSchemaError:  # lowering says where, when it comes to it
                return None
        if node is True or node is False:
            return (True if node else _NO_VALUE), (), ()
        if type(node) is not dict or "$ptr" in node:
            return None
        if "$ref" in node and self.doc.legacy and self.known_here("$ref"):  # siblings are ignored
            target = self._target(ptr, node["$ref"])
            return None if target is None else (target, (target,), ())
        validation = self._validation_keywords(ptr, node)
        if validation is None:
            return None
        if validation == ["type"]:  # two in five subschemas: every type a non-empty list names has a value
            return None if _types_of(node["type"]) is None else _HOLDS
        if not _CONJOINING.isdisjoint(validation) or ("$ref" in node and len(validation) > 1):
            return self._conj_local((_Part(ptr),))
        if "$ref" in node:
            target = self._target(ptr, node["$ref"]) if len(validation) == 1 else None
            return None if target is None else (target, (target,), ())
        for kw in ("anyOf", "oneOf"):
            if kw in node:
                branches = node[kw]
                # beside the branches, at most a type: each branch is then read as that type's values
                kind = _types_of(node["type"]) if len(validation) == 2 and "type" in node else None
                if len(validation) != 1 and kind is None:
                    return self._conj_local((_Part(ptr),))
                if not isinstance(branches, list) or not branches:
                    return None
                ptrs = tuple(f"{ptr}/{kw}/{i}" for i in range(len(branches)))
                self.doc.nodes.update(zip(ptrs, branches))
                if kw == "oneOf" and not self._exclusive(ptrs):
                    return self._conj_local((_Part(ptr),))
                if kind is None:
                    return ("any", ptrs), ptrs, ()
                terms = tuple(t for t in (self._as_type(b, kind, _MAX_TYPED_HOPS) for b in ptrs) if t is not False)
                return (("any", terms), ptrs, ()) if terms else None
        types = _types_of(node["type"]) if "type" in node else _TYPE_NAMES
        if types is None:
            return None
        if "enum" in node or "const" in node:
            return _HOLDS if self._some_value(node, validation, types) else None
        return self._conj_merge([(_Part(ptr), node, validation)])

    # -- conjunctions ------------------------------------------------------------------------------------------

    def _conj_key(self, parts: Iterable[_Part]) -> str:
        """The certificate's name for the conjunction of ``parts``: the pointer of a subschema taken whole, or
        ``&n`` (no pointer starts with ``&``), one per set of parts in a compile."""
        parts = tuple(parts)
        if len(parts) == 1 and not parts[0].skip and parts[0].neg is None:  # most members: one subschema
            return parts[0].ptr
        given = frozenset(parts)
        if len(given) == 1:
            (part,) = given
            if not part.skip and part.neg is None:
                return part.ptr
        key = self._conj_keys.get(given)
        if key is None:
            key = self._conj_keys[given] = f"&{len(self._conj_keys)}"
            self._conj_parts[key] = given
        return key

    def _conj_local(self, given: tuple[_Part, ...]) -> tuple[_Formula, tuple[str, ...], tuple[str, ...]] | None:
        """:meth:`_local` of the conjunction of ``given``, read as its lowering reads it: references and ``allOf``
        expanded (:meth:`_expand`), then an ``enum`` or ``const`` (each value checked against the rest now, as
        the lowering does), else the first branching keyword (an alternative per branch, per dependency trigger
        present or absent), else the parts merged: at most one of them constrains strings, one numbers; their
        objects' members and array items are the conjunctions of theirs."""
        parts = self._expand(given)
        if parts is None or parts is False:
            return None if parts is None else (_NO_VALUE, (), ())
        read: list[tuple[_Part, Mapping, list[str]]] = []
        for part in parts:
            node = self.node(part.ptr)
            validation = self._validation_keywords(part.ptr, node)
            if validation is None:
                return None
            read.append((part, node, [kw for kw in validation if kw not in part.skip]))
        if any("enum" in v or "const" in v for _, _, v in read):
            try:
                self.finite_candidates(parts)
            except _Unsatisfiable:
                return _NO_VALUE, (), ()
            except JsonSchemaError:
                return None
            return _HOLDS
        for part, _, validation in read:
            for kw in _CERTIFIED_BRANCHING:
                if kw in validation:
                    return self._conj_branch(parts, part, kw)
        return self._conj_merge(read)

    def _expand(self, given: Iterable[_Part]) -> tuple[_Part, ...] | bool | None:
        """The parts of a conjunction as the lowering normalises them (references followed, ``allOf`` opened,
        parts that say nothing dropped, repeated ones once, :meth:`distinct`); False when one is ``false``; None
        when one expands to a subschema it was expanded from (a cycle, which the lowering refuses) or refers
        dynamically."""
        legacy_ref = self.doc.legacy and self.known_here("$ref")
        out: list[_Part] = []
        work: list[tuple[_Part, frozenset[str]]] = [(part, frozenset()) for part in given]
        seen = {part for part, _ in work}
        while work:
            part, above = work.pop()
            try:
                node = self.node(part.ptr)
            except (JsonSchemaError, KeyError):
                return None
            if node is True:
                continue
            if node is False:
                return False
            if type(node) is not dict or "$ptr" in node or part.neg is not None:
                return None
            if "$dynamicRef" in node or "$recursiveRef" in node:
                return None
            added: list[_Part] = []
            above = above | {part.ptr}
            if "$ref" in node and "$ref" not in part.skip:
                target = self._target(part.ptr, node["$ref"])
                if target is None:
                    return None
                added.append(_Part(target))
                part = None if legacy_ref else part._replace(skip=part.skip | {"$ref"})  # legacy: siblings ignored
            if part is not None and "allOf" in node and "allOf" not in part.skip:
                branches = node["allOf"]
                if type(branches) is not list or not branches:
                    return None
                ptrs = [f"{part.ptr}/allOf/{i}" for i in range(len(branches))]
                self.doc.nodes.update(zip(ptrs, branches))
                added.extend(_Part(b) for b in ptrs)
                part = part._replace(skip=part.skip | {"allOf"})
            for child in added:
                if child.ptr in above:
                    return None
                if child not in seen:
                    seen.add(child)
                    work.append((child, above))
            if part is not None and self.live_keys(part):
                out.append(part)
        return self.distinct(tuple(out))

    def _conj_branch(self, parts: tuple[_Part, ...], part: _Part, kw: str) -> tuple | None:
        """The conjunction ``parts`` split on ``part``'s branching keyword ``kw``: productive when an alternative
        is; ``not`` only of a subschema that says nothing (no value)."""
        node = self.node(part.ptr)
        if kw == "not":
            return (_NO_VALUE, (), ()) if self._says_nothing(f"{part.ptr}/not", node["not"]) else None
        if kw in ("anyOf", "oneOf"):
            branches = node[kw]
            if type(branches) is not list or not branches:
                return None
            ptrs = tuple(f"{part.ptr}/{kw}/{i}" for i in range(len(branches)))
            self.doc.nodes.update(zip(ptrs, branches))
            alternatives: list[tuple[_Part, ...]] | None = [(_Part(b),) for b in ptrs]
            if kw == "oneOf" and not self._exclusive(ptrs):
                alternatives = self._by_kind(ptrs, f"{part.ptr}/oneOf")
                if alternatives is None:
                    return None
        else:  # the lowering's own split: each trigger absent, or present with what it needs
            if type(node[kw]) is not dict:
                return None
            try:
                alternatives = self.alternatives(part, kw, node, parts)
            except (JsonSchemaError, TypeError):  # too many triggers; a name that is not a string
                return None
            if len(alternatives) > 2**MAX_CERTIFIED_DEPENDENCIES:
                return None
        base = tuple(p._replace(skip=p.skip | {kw}) if p == part else p for p in parts)
        keys = tuple(dict.fromkeys(self._conj_key((*base, *extra)) for extra in alternatives))
        return ("any", keys), keys, ()

    def _conj_merge(self, parts: list[tuple[_Part, Mapping, list[str]]]) -> tuple | None:
        """The conjunction of ``parts`` (each with its node and validation keywords) with nothing to branch on,
        merged kind by kind as the lowering merges it."""
        kinds = _ALL_KINDS
        strings = numbers = None
        objects: list[tuple[_Part, Mapping, list[str]]] = []
        arrays: list[tuple[_Part, Mapping, list[str]]] = []
        for part, node, validation in parts:
            if "type" in validation:
                types = _types_of(node["type"])
                if types is None:
                    return None
                kinds = kinds & _kinds_of(types)
            if not _STRING_KEYWORDS.isdisjoint(validation):
                if strings is not None or not self._strings_hold(node):
                    return None
                strings = node
            if not _NUMBER_KEYWORDS.isdisjoint(validation):
                if numbers is not None:
                    return None
                numbers = node
            if not _OBJECT_KEYWORDS.isdisjoint(validation):
                objects.append((part, node, validation))
            if not _ARRAY_KEYWORDS.isdisjoint(validation):
                arrays.append((part, node, validation))
        if numbers is not None and not kinds.isdisjoint(_NUMBER_KINDS):
            if not self._numbers_hold(numbers, {"number"} if "frac" in kinds else {"integer"}):
                return None
        terms: list[_Formula] = []
        below: list[str] = []
        if not kinds <= _CONTAINER_KINDS:
            terms.append(True)
        if "object" in kinds:
            needs = self._conj_object(objects, below)
            if needs is None:
                return None
            terms.append(("all", needs))
        if "array" in kinds:
            needs = self._conj_array(arrays, below)
            if needs is None:
                return None
            if needs is not False:
                terms.append(needs)
        productive = True if terms and terms[0] is True else ("any", tuple(terms))
        return productive, (), tuple(below)

    def _conj_object(self, objects: list[tuple[_Part, Mapping, list[str]]], below: list[str]) -> tuple | None:
        """The productivity the merged object of ``objects`` needs (a term per required property), adding the
        conjunctions of its members and of its other keys to ``below``; None when not certified. A name's value is
        the conjunction of what each part says of it: its property, else its ``additionalProperties`` (``false``
        in a part :meth:`closed_by_default` closes). A ``patternProperties`` pattern is read in an object of one
        part (:meth:`_patterns_hold`)."""
        infos: list[tuple[dict[str, str], str | None, bool]] = []  # per part: members, other keys, closed
        names: dict[str, None] = {}
        required: dict[str, None] = {}
        least, patterned = 0, False  # minProperties; whether a part has patternProperties
        nodes = self.doc.nodes
        for part, node, validation in objects:
            if "minProperties" in validation:
                count = node["minProperties"]
                if type(count) is not int or count < 0:
                    return None
                least = max(least, count)
            props = node.get("properties", {}) if "properties" in validation else {}
            needed = node.get("required", []) if "required" in validation else []
            if type(props) is not dict or len(props) > MAX_CERTIFIED_PROPERTIES or type(needed) is not list:
                return None
            if (props and not _plain_names(tuple(props))) or (needed and not _plain_names(tuple(needed))):
                return None
            members = {name: f"{part.ptr}/properties/{_escape_token(name)}" for name in props}
            nodes.update((members[name], value) for name, value in props.items())
            extra, extra_ptr = True, None
            if "additionalProperties" in validation:
                extra, extra_ptr = node["additionalProperties"], f"{part.ptr}/additionalProperties"
                if type(extra) is not bool and type(extra) is not dict:
                    return None
                nodes[extra_ptr] = extra
            if "patternProperties" in validation:
                patterned = True
                if len(objects) > 1:
                    return None
                if not self._patterns_hold(
                    part.ptr, node["patternProperties"], members, [*props, *needed], extra, below
                ):
                    return None
            closed = not self.ap_default and self.closed_by_default(node, set(self.live_keys(part)))
            infos.append((members, extra_ptr, closed))
            names.update(dict.fromkeys(props))
            required.update(dict.fromkeys(needed))
        names.update(required)
        if len(names) > MAX_CERTIFIED_PROPERTIES:
            return None
        needs: list[_Formula] = []
        optional: list[_Formula] = []  # the values of the names not required
        if len(infos) == 1:  # one part (most objects): its members' subschemas are their values
            members, extra_ptr, _ = infos[0]  # closed: every required name is a member, no other key allowed
            below.extend(members.values())
            for name in required:
                value = members.get(name, extra_ptr)
                if value is not None:
                    needs.append(value)
            optional.extend(key for name, key in members.items() if name not in required)
        else:
            for name in names:
                value: list[str] | None = []  # the keys of the name's parts
                for members, extra_ptr, closed in infos:
                    if name in members:
                        value.append(members[name])
                    elif closed:
                        value = None  # the name is not allowed
                        break
                    elif extra_ptr is not None:
                        value.append(extra_ptr)
                if value is None:
                    if name in required:
                        needs.append(_NO_VALUE)
                    continue
                key = self._conj_key(_Part(k) for k in value) if value else True
                if key is not True:
                    below.append(key)
                (needs if name in required else optional).append(key)
        extras = [extra_ptr for _, extra_ptr, _ in infos if extra_ptr is not None]
        other: _Formula | None = None  # the value of a key no part names; None: no such key is allowed
        if not any(closed for _, _, closed in infos):
            other = True
            if extras:
                other = self._conj_key(_Part(k) for k in extras)
                below.append(other)
        if least > len(required):
            # One more member than the required ones, from the others or a key no part names: more could be met
            # by repeating an additional key, which the lowering refuses; a count over patterns is left eager.
            if (
                least > len(required) + 1
                or patterned
                or counted_member_rules(len(names), least) > MAX_COUNTED_MEMBER_RULES
            ):
                return None
            needs.append(("any", (*optional, *([] if other is None else [other]))))
        return tuple(needs)

    def _conj_array(self, arrays: list[tuple[_Part, Mapping, list[str]]], below: list[str]) -> _Formula | None:
        """The productivity the merged array of ``arrays`` needs, adding the conjunctions of its positions and of
        the items after them to ``below``; False when no array holds; None when not certified. An ``items`` list
        (with ``additionalItems`` after it) is read position by position, as the lowering reads it: the array
        holds when the positions up to ``minItems`` do, and the items after them when it needs more."""
        lo, hi = 0, None
        shapes: list[tuple[list[str], str | None]] = []  # per part: its positions, and what follows them
        nodes = self.doc.nodes
        for part, node, validation in arrays:
            for kw in ("minItems", "maxItems"):
                bound = node.get(kw) if kw in validation else None
                if bound is None:
                    continue
                if type(bound) is not int or not 0 <= bound <= MAX_CERTIFIED_ITEMS:
                    return None
                lo, hi = (max(lo, bound), hi) if kw == "minItems" else (lo, bound if hi is None else min(hi, bound))
            value = node.get("items", True) if "items" in validation else True
            prefix: list[str] = []
            if type(value) is list:
                if len(value) > MAX_CERTIFIED_ITEMS:
                    return None
                prefix = [f"{part.ptr}/items/{i}" for i in range(len(value))]
                nodes.update(zip(prefix, value))
                rest = f"{part.ptr}/additionalItems"
                value = node.get("additionalItems", True) if "additionalItems" in validation else True
            else:
                rest = f"{part.ptr}/items"
            if type(value) is not bool and type(value) is not dict:
                return None
            if value is not True:
                nodes[rest] = value
            shapes.append((prefix, None if value is True else rest))
        if hi is not None and lo > hi:
            return False
        needs: list[_Formula] = []
        k = max((len(prefix) for prefix, _ in shapes), default=0)
        for i in range(k if hi is None else min(k, hi)):
            at = [prefix[i] if i < len(prefix) else rest for prefix, rest in shapes]
            key = self._conj_key(_Part(ptr) for ptr in at if ptr is not None)
            below.append(key)
            if i < lo:
                needs.append(key)
        rests = [_Part(rest) for _, rest in shapes if rest is not None]
        if rests and (hi is None or hi > k):
            key = self._conj_key(rests)
            below.append(key)
            if lo > k:
                needs.append(key)
        return needs[0] if len(needs) == 1 else ("all", tuple(needs)) if needs else True

    def _as_type(self, ptr: str, kind: frozenset[str], hops: int) -> _Formula:
        """The productivity of the subschema at ``ptr`` (a branch, certified on its own) restricted to values of the
        types ``kind``, or False when that is not shown (the branch may then hold no such value, which lowering
        finds; it is not counted on). Shown when the branch (through its references and branches, ``hops`` of
        them at most) declares types among ``kind``, or declares none and so constrains a value of each type by
        that type's keywords alone."""
        node = self.node(ptr)
        if node is True:
            return True
        if type(node) is not dict or hops <= 0:
            return False
        validation = self._validation_keywords(ptr, node)
        if validation is None or not _CONJOINING.isdisjoint(validation):
            return False
        if "$ref" in node:
            target = self._target(ptr, node["$ref"])
            legacy = self.doc.legacy and self.known_here("$ref")
            return (
                False
                if target is None or not (legacy or validation == ["$ref"])
                else self._as_type(target, kind, hops - 1)
            )
        for kw in ("anyOf", "oneOf"):
            if kw in node:
                if validation != [kw] or not isinstance(node[kw], list):
                    return False
                terms = (self._as_type(f"{ptr}/{kw}/{i}", kind, hops - 1) for i in range(len(node[kw])))
                found = tuple(t for t in terms if t is not False)
                return ("any", found) if found else False
        if "type" in node:
            declared = _types_of(node["type"])
            covered = declared is not None and all(t in kind or (t == "integer" and "number" in kind) for t in declared)
            return ptr if covered else False
        if "enum" in node or "const" in node:
            return False
        terms: list[_Formula] = []
        if not kind.isdisjoint(("string", "boolean", "null")):
            terms.append(True)  # a string's keywords were shown to hold when the branch was certified
        if not kind.isdisjoint(("number", "integer")) and _NUMBER_KEYWORDS.isdisjoint(validation):
            terms.append(True)
        if "object" in kind:
            needs = self._conj_object([(_Part(ptr), node, validation)], [])
            if needs is not None:
                terms.append(("all", needs))
        if "array" in kind:
            needs = self._conj_array([(_Part(ptr), node, validation)], [])
            if needs is not None and needs is not False:
                terms.append(needs)
        return ("any", tuple(terms)) if terms else False

    def _target(self, ptr: str, ref: Any) -> str | None:
        try:
            return self.doc.resolve(ptr, ref, "$ref")
        except JsonSchemaError:
            return None

    def _exclusive(self, branches: tuple[str, ...]) -> bool:
        """Whether a ``oneOf``'s branches are pairwise disjoint as the compiler proves it (then its lowering is
        that of an ``anyOf``)."""
        try:
            return self.pairwise_disjoint([_Part(b) for b in branches])
        except _TIME_LIMIT:
            raise
        except (JsonSchemaError, _NotNegatable, _TooLarge, RecursionError):
            return False

    def _by_kind(self, branches: tuple[str, ...], origin: str) -> list[tuple[_Part, ...]] | None:
        """The alternatives a ``oneOf`` whose branches are not pairwise disjoint is lowered as when, kind of value
        by kind, they are (:meth:`one_of_by_kind`); None when that is not shown."""
        try:
            return self.one_of_by_kind([_Part(b) for b in branches], origin)
        except _TIME_LIMIT:
            raise
        except (JsonSchemaError, _NotNegatable, _TooLarge, RecursionError):
            return None

    @staticmethod
    def _some_value(node: Mapping, validation: list[str], types: set[str]) -> bool:
        """An ``enum`` or ``const`` beside nothing but ``type``: whether a value has one of ``types``, and every
        value can be written as UTF-8 JSON."""
        if not set(validation) <= {"type", "enum"} and not set(validation) <= {"type", "const"}:
            return False
        values = node["enum"] if "enum" in node else [node["const"]]
        if not isinstance(values, list):
            return False
        try:
            for value in values:
                _compact_text(value).encode("utf-8")
        except (TypeError, ValueError, UnicodeEncodeError):
            return False
        for value in values:
            if value is None:
                kind = "null"
            elif isinstance(value, bool):
                kind = "boolean"
            elif isinstance(value, int):
                kind = "integer" if "integer" in types else "number"
            elif isinstance(value, float):
                kind = "number"
            elif isinstance(value, str):
                kind = "string"
            elif isinstance(value, dict):
                kind = "object"
            elif isinstance(value, list):
                kind = "array"
            else:
                continue
            if kind in types:
                return True
        return False

    @staticmethod
    def _strings_hold(node: Mapping) -> bool:
        """Lengths in order, and a format alone (supported), or a pattern, or a pattern or a format with lengths,
        whose strings lower to one automaton that matches something (:func:`_string_holds`: a counted automaton's
        states walked, kept for its lowering to fold)."""
        lengths = _lengths(node)
        if lengths is None:
            return False
        pattern, form = node.get("pattern"), node.get("format")
        if pattern is None and form is None:
            return True
        if form is not None and pattern is None and lengths == (0, None):
            return isinstance(form, str) and form not in _UNSUPPORTED_FORMATS
        key = _text_key(node)
        if key is None:
            return False
        try:
            return _string_holds(key, *lengths)
        except (RegexError, _TooLarge):
            return False

    def _numbers_hold(self, node: Mapping, types: set[str]) -> bool:
        """Numeric bounds of moderate size that leave a number (an integer, when only integers are allowed)."""
        lo = hi = None
        lo_strict = hi_strict = False
        for kw in ("minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"):
            if kw not in node:
                continue
            value = node[kw]
            if isinstance(value, bool):
                if not self.doc.draft4 or kw.startswith("min") or kw.startswith("max"):
                    return False
                continue
            if not isinstance(value, (int, float)) or not abs(value) <= MAX_CERTIFIED_MAGNITUDE:
                return False
            strict = kw.startswith("exclusive") or (self.doc.draft4 and node.get("exclusive" + kw.title()) is True)
            value = _to_decimal(value)
            if kw.endswith("inimum"):
                if lo is None or value > lo or (value == lo and strict):
                    lo, lo_strict = value, strict
            elif hi is None or value < hi or (value == hi and strict):
                hi, hi_strict = value, strict
        if lo is None or hi is None or not types & {"integer", "number"}:
            return True
        if "number" in types:
            return lo < hi or (lo == hi and not lo_strict and not hi_strict)
        least = math.floor(lo) + 1 if lo_strict or lo != math.floor(lo) else int(lo)
        most = math.ceil(hi) - 1 if hi_strict or hi != math.ceil(hi) else int(hi)
        return least <= most

    def _patterns_hold(self, ptr: str, patterns: Any, members: dict[str, str], names: list[str], extra: Any,
                       below: list[str]) -> bool:  # fmt: skip
        """At most one ``patternProperties`` pattern, supported, whose keys' automata can be built: they are built
        now (:meth:`pattern_key`), for the lowering to read. The object's ``names`` it matches must be declared:
        each such member's value becomes the conjunction of its subschema and the pattern's in ``members``
        (unless the two say the same, :meth:`same`, or the pattern's says nothing). Adds the pattern's subschema
        to ``below``."""
        if not isinstance(patterns, dict) or len(patterns) > 1:
            return False
        for pattern, value in patterns.items():
            try:
                searched = _searched(pattern)
            except (RegexError, _TooLarge):
                return False
            pattern_ptr = f"{ptr}/patternProperties/{_escape_token(pattern)}"
            matched = [name for name in names if searched.accepts(name)]
            if matched and not self._says_nothing(pattern_ptr, value):
                for name in matched:
                    if name not in members:
                        return False
                    if not self.same(_Part(members[name]), _Part(pattern_ptr)):
                        members[name] = self._conj_key((_Part(members[name]), _Part(pattern_ptr)))
            below.append(pattern_ptr)
            for chosen in (frozenset({pattern}), frozenset()):
                if not chosen and extra is False:
                    continue  # a key no pattern matches has no valid value: no member, no key
                if isinstance(self.pattern_key((pattern,), chosen, names), str):
                    return False
        return True

    def _says_nothing(self, ptr: str, node: Any) -> bool:
        """Whether the subschema ``node`` at ``ptr`` holds for every value: ``true``, or an object of annotations
        alone, which the lowering drops from a conjunction. Keeps the node in the document's node cache."""
        self.doc.nodes[ptr] = node
        return node is True or (type(node) is dict and not self.live_keys(_Part(ptr)))


#: References and branches :meth:`_Deferral._as_type` follows from a branch read as a type's values.
_MAX_TYPED_HOPS = 8


def _types_of(value: Any) -> frozenset[str] | None:
    """The type names a ``type`` keyword's value allows, or None when it is not a name or a list of names."""
    if type(value) is str:
        return _ONE_TYPE.get(value)
    if type(value) is list and value and _TYPE_NAMES.issuperset(value):
        return frozenset(value)
    return None


def _kinds_of(types: frozenset[str]) -> frozenset[str]:
    """The kinds of values ``types`` allows (:func:`_kinds_of_type`), kept per set of type names: the certificate
    reads a ``type`` in most subschemas, and there are at most 128 such sets."""
    kinds = _KINDS_OF.get(types)
    if kinds is None:
        kinds = _KINDS_OF[types] = frozenset(_kinds_of_type(types))
    return kinds


_KINDS_OF: dict[frozenset[str], frozenset[str]] = {}


def _plain_names(names: tuple) -> bool:
    """Whether ``names`` are strings of at most :data:`MAX_CERTIFIED_NAME` characters that UTF-8 can write (no lone
    surrogate): checked all at once, for the objects of a schema's certificate are many."""
    for name in names:
        if type(name) is not str:
            return False
    return max(map(len, names)) <= MAX_CERTIFIED_NAME and _is_utf8("".join(names))


def _lengths(node: Mapping) -> tuple[int, int | None] | None:
    """A subschema's ``minLength`` and ``maxLength`` (0 and None when absent), or None when they are not integers
    from 0 to :data:`MAX_CERTIFIED_LENGTH` in order."""
    lo, hi = node.get("minLength", 0), node.get("maxLength")
    for bound in (lo, hi):
        if bound is not None and (type(bound) is not int or not 0 <= bound <= MAX_CERTIFIED_LENGTH):
            return None
    return None if hi is not None and lo > hi else (lo, hi)


def _text_key(node: Mapping) -> _StringKey | None:
    """What a subschema's ``pattern`` and ``format`` say of a string's text, as its lowering reads them (a format
    it does not know is an annotation); None when either is malformed or the format is not supported."""
    pattern, form = node.get("pattern"), node.get("format")
    if (pattern is not None and not isinstance(pattern, str)) or (form is not None and not isinstance(form, str)):
        return None
    if form in _UNSUPPORTED_FORMATS:
        return None
    return _StringKey(() if pattern is None else (pattern,), (form,) if form in _FORMATS else (), (), (), ())


def _may_reach(node: Any, count: int) -> bool:
    """Whether a subschema may reach ``count`` subschemas: it holds that many objects, or a reference (whose
    target only the certificate's walk measures)."""
    if type(node) is not dict or node.keys().isdisjoint(_REACHING):
        return False
    seen = 0
    work = [node]
    while work:
        item = work.pop()
        if isinstance(item, dict):
            if "$ref" in item:
                return True
            seen += 1
            if seen >= count:
                return True
            work.extend(item.values())
        elif isinstance(item, list):
            work.extend(item)
    return False


def _callers(
    found: Mapping[str, tuple[_Formula, tuple[str, ...], tuple[str, ...]]], among: Iterable[str]
) -> dict[str, list[str]]:
    """Per subschema, those of ``among`` (subschemas of ``found``) that apply it, to the same value or to a part."""
    callers: dict[str, list[str]] = {}
    for ptr in among:
        _, same_value, below = found[ptr]
        for child in (*same_value, *below):
            callers.setdefault(child, []).append(ptr)
    return callers


def _on_cycles(graph: Mapping[str, list[str]]) -> set[str]:
    """The nodes of ``graph`` that lie on a cycle (a self-loop included); a node that is no key has no edge out.
    Components are looked for only among the nodes that reach a cycle: most graphs have none."""
    out: set[str] = set()
    cyclic = _cyclic_part(graph)  # a node's targets are distinct: one reference, or the pointers of branches
    if not cyclic:
        return out
    for component in _sccs(cyclic):
        if len(component) > 1 or any(node in graph.get(node, ()) for node in component):
            out.update(component)
    return out
