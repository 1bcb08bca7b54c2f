"""The schema document: its dialect and metaschema validation, JSON pointers, ``$ref``/``$id``/anchor resolution,
and validation of values against parts of it (the oracle for enum/const candidates and property names).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from functools import cache, cached_property, lru_cache
from typing import Any
from urllib.parse import quote, unquote, urljoin

from constrain.compilers.json_schema.errors import _check_time
from constrain.compilers.json_schema.keywords import _Part
from constrain.compilers.json_schema.values import _sorted_text
from constrain.compilers.metaschema import certainly_valid
from constrain.errors import JsonSchemaError


def _escape_token(token: str) -> str:
    return token.replace("~", "~0").replace("/", "~1")


def _is_mapping(value: Any) -> bool:
    """Whether ``value`` is a JSON object: a dict is told by its type first, since ``Mapping`` is an ABC whose
    failing ``isinstance`` runs Python code."""
    return type(value) is dict or isinstance(value, Mapping)


def _clean_pointer(ptr: str) -> str:
    """A pointer for messages: synthetic steps (``/~sN``) removed."""
    return re.sub(r"/~s\d+(?:/[^/]*)*?(?=/~s|$)", "", ptr) if "/~s" in ptr else ptr


#: The keywords that name a resource or an anchor, per referencing specification.
_NAMING_KEYWORDS = {
    "draft-03": ("id",), "draft-04": ("id",), "draft-06": ("$id",), "draft-07": ("$id",),
    "draft2019-09": ("$id", "$anchor"), "draft2020-12": ("$id", "$anchor", "$dynamicAnchor"),
}  # fmt: skip


#: What a crawl of the document registers (every draft's spellings): anchors anywhere; below the root (whose id
#: is the base URI anyway), ids and embedded dialects, as strings ("id" is also a common property name).
_ANCHOR_KEYWORDS = ("$anchor", "$dynamicAnchor", "$recursiveAnchor")
_ID_KEYWORDS = ("id", "$id", "$schema")
_RESOURCE_KEYS = frozenset(_ANCHOR_KEYWORDS + _ID_KEYWORDS)
#: Keywords whose value is data, not a schema: no reference lands inside one that is not an object.
_VALUE_KEYWORDS = frozenset(("enum", "const", "default", "examples", "example"))


def _names_resources(schema: Any) -> bool:
    """Whether an object below the root names a resource or an anchor (an id, a ``$schema``, an anchor): what only
    a crawl of the document registers. Walked only when :func:`_json_containers` found that one may (most schemas
    hold no such key but the root's own ids)."""
    stack = [(schema, True)]
    while stack:
        node, root = stack.pop()
        if isinstance(node, Mapping):
            if _names_here(node, root):
                return True
            stack.extend(
                (value, False)
                for key, value in node.items()
                if isinstance(value, (Mapping, list)) and (key not in _VALUE_KEYWORDS or isinstance(value, Mapping))
            )
        elif isinstance(node, list):
            stack.extend((value, False) for value in node if isinstance(value, (Mapping, list)))
    return False


def _names_here(node: Mapping, root: bool) -> bool:
    """Whether the object ``node`` names an anchor, or, below the root, a resource or a dialect (as a string)."""
    keys = node.keys()
    if keys.isdisjoint(_RESOURCE_KEYS):  # most objects: one set operation
        return False
    return not keys.isdisjoint(_ANCHOR_KEYWORDS) or (
        not root and any(isinstance(node.get(key), str) for key in _ID_KEYWORDS)
    )


def _total_specification(spec: Any, embedded: list[tuple[Mapping, str]]) -> Any:
    """``spec`` (a ``referencing`` JSON Schema specification) made total over the schemas met here.

    referencing 0.37 reads ``id``/``$id`` and anchors as strings of a JSON object, and its walks break that:
    resolving a JSON pointer through ``items`` or ``dependencies`` asks for the id of every object further down
    the path, such as a ``properties`` object whose ``id`` entry is a property's schema (an AttributeError on
    ``dict.startswith``); crawling an embedded draft-04 subschema (its own ``$schema`` in a draft-07 document)
    meets its boolean subschemas (a TypeError); and the draft-04 to 07 crawl takes every ``dependencies`` value
    after a schema for a subschema, lists of property names too. Here only a string names a resource or an
    anchor, only objects are crawled (booleans and lists name nothing), and a subschema with its own ``$schema``
    is appended to ``embedded`` (with this specification's name) instead: referencing would crawl it with its
    own, partial specification for that dialect.
    """
    import referencing

    keys = _NAMING_KEYWORDS[spec.name]

    def named(contents: Any) -> bool:
        return isinstance(contents, Mapping) and all(isinstance(contents.get(k, ""), str) for k in keys)

    def subresources_of(contents: Any) -> Iterator[Mapping]:
        if not isinstance(contents, Mapping):
            return
        for sub in spec.subresources_of(contents):
            if isinstance(sub, Mapping) and "$schema" in sub:
                embedded.append((sub, spec.name))
            elif isinstance(sub, Mapping):
                yield sub

    return referencing.Specification(
        name=spec.name,
        id_of=lambda contents: spec.id_of(contents) if named(contents) else None,
        subresources_of=subresources_of,
        anchors_in=lambda _spec, contents: spec.anchors_in(contents) if named(contents) else (),
        maybe_in_subresource=spec.maybe_in_subresource,
    )


def _from_nearest(known: dict[str, Any], ptr: str, step: Callable[[Any, str], Any]) -> Any:
    """``known[ptr]`` for a JSON pointer: from the nearest pointer above it in ``known`` (``""`` must be), each
    pointer on the way down gets ``step(value above it, pointer)`` and is kept."""
    missing = [ptr]
    above = ptr.rpartition("/")[0]
    while above not in known:
        missing.append(above)
        above = above.rpartition("/")[0]
    value = known[above]
    for at in reversed(missing):
        value = known[at] = step(value, at)
    return value


@cache
def _known_keywords(cls: type, draft7_spellings: bool) -> frozenset[str]:
    """The keywords a validator class knows, with draft-07's ``dependencies`` and ``additionalItems`` when
    ``draft7_spellings``: made once per process."""
    return frozenset(cls.VALIDATORS).union(("dependencies", "additionalItems") if draft7_spellings else ())


@lru_cache(maxsize=256)  # a bundled schema repeats its $schema in every definition
def _validator_class(uri: str) -> type | None:
    """The jsonschema validator class a ``$schema`` URI names, or None for a URI jsonschema does not know."""
    from jsonschema import validators

    return validators.validator_for({"$schema": uri}, None)


@cache
def _dialects() -> tuple[dict[str, Any], dict[str, Any]]:
    """referencing's specification per jsonschema validator class name, and per specification name (referencing
    is imported when a schema is first compiled, not with constrain)."""
    import referencing.jsonschema as rj

    by_class = {
        "Draft3Validator": rj.DRAFT3, "Draft4Validator": rj.DRAFT4, "Draft6Validator": rj.DRAFT6,
        "Draft7Validator": rj.DRAFT7, "Draft201909Validator": rj.DRAFT201909, "Draft202012Validator": rj.DRAFT202012,
    }  # fmt: skip
    return by_class, {spec.name: spec for spec in by_class.values()}


class _Document:
    def __init__(self, schema: Any):
        import jsonschema
        import referencing
        import referencing.jsonschema as rj
        from jsonschema import validators

        mapping = _is_mapping(schema)
        if not mapping and not isinstance(schema, bool):
            raise JsonSchemaError(f"a schema must be a JSON object or a boolean, not {type(schema).__name__}")
        #: How many objects and arrays the document holds.
        self.containers, may_name = _refuse_non_json(schema)
        if mapping and not isinstance(schema.get("$schema", ""), str):
            raise JsonSchemaError("$schema must be a string (the dialect's URI)", "/$schema", "$schema")
        explicit = mapping and "$schema" in schema
        cls = (_validator_class(schema["$schema"]) if explicit else None) or validators.Draft202012Validator
        # check_schema without format assertions: patterns are ECMAScript regexes, which Python's re (what the
        # "regex" format checker uses) does not always parse; the regex compiler here judges them instead. The
        # fast walk answers for most schemas; when it is not sure, jsonschema decides and words the error.
        error = None
        if not certainly_valid(schema, cls.__name__.replace("Validator", "")):
            error = jsonschema.exceptions.best_match(cls(cls.META_SCHEMA).iter_errors(schema))
        if error is not None and not explicit:
            # No $schema: a draft-07 document (items as a list...) is read as draft-07.
            draft7 = validators.Draft7Validator
            if (
                certainly_valid(schema, "Draft7")
                or jsonschema.exceptions.best_match(draft7(draft7.META_SCHEMA).iter_errors(schema)) is None
            ):
                cls, error = draft7, None
        if error is not None:
            path = list(error.absolute_path)
            pointer = "".join("/" + _escape_token(str(p)) for p in path)
            keyword = str(path[-1]) if path else error.validator
            raise JsonSchemaError(f"not a valid JSON Schema: {error.message}", pointer, keyword)
        self.schema = schema
        self.cls = cls
        # "2020-12 plus draft-07 spellings": without a declared dialect, dependencies and additionalItems keep
        # their draft-07 meaning (definitions is resolved by pointer either way).
        self.keywords = _known_keywords(cls, not explicit and cls is validators.Draft202012Validator)
        self.draft = cls.__name__.replace("Validator", "")
        self.legacy = cls.__name__ in ("Draft3Validator", "Draft4Validator", "Draft6Validator", "Draft7Validator")
        self.draft4 = cls.__name__ in ("Draft3Validator", "Draft4Validator")
        #: Whether the root names its dialect (``$schema``).
        self.declared = explicit
        #: The subschemas with a ``$schema`` of their own met by the crawl, with the dialect around each.
        self._embedded: list[tuple[Mapping, str]] = []
        self._specs: dict[str, Any] = {}
        self._dialect = _dialects()[0].get(cls.__name__, rj.DRAFT202012).name
        self.base = self.id_of(schema) or ""
        self.names_resources = may_name and _names_resources(schema)
        self.nodes: dict[str, Any] = {"": schema}
        self.synthetic: dict[str, Any] = {}
        self.bases: dict[str, str] = {"": self.base}
        #: The pointer each reference resolves to, by (base URI in force, reference): see :meth:`resolve`.
        self._resolved: dict[tuple[str, str], str] = {}
        self.unresolvable = referencing.exceptions.Unresolvable
        self.resolvers: dict[str, Any] = {}
        #: The pointer of each synthetic node by (origin, its JSON text): one node per meaning and origin.
        self._synthetic_at: dict[tuple[str, str], str] = {}
        self._validator = None
        #: Per (pointer, negated keyword): the schema a part means and its JSON text when it refers to nothing.
        self._standalone: dict[tuple[str, tuple | None], tuple[Any, str] | None] = {}
        #: Verdicts by (schema text, instance text) for parts that refer to nothing, else by (pointer, negated
        #: keyword, instance text).
        self._verdicts: dict[tuple, bool] = {}

    def specification(self, name: str) -> Any:
        """The total specification (:func:`_total_specification`) of dialect ``name``, made when first needed:
        most documents use one dialect."""
        spec = self._specs.get(name)
        if spec is None:
            spec = self._specs[name] = _total_specification(_dialects()[1][name], self._embedded)
        return spec

    @cached_property
    def spec(self) -> Any:
        """The total specification of the document's own dialect, made when first needed: a document with no id
        and no reference by URI never needs it."""
        return self.specification(self._dialect)

    @cached_property
    def registry(self) -> Any:
        """The registry of the document's resources and anchors, made when a reference or a validation first needs
        it: a reference that is a JSON pointer into the root resource is read without it (:meth:`resolve`)."""
        import referencing

        if self.names_resources:
            return self._crawl(self._embedded)
        # JSON pointers into the root are all its references can name: no crawl needed
        return referencing.Registry().with_resource(self.base, self.spec.create_resource(self.schema))

    @cached_property
    def root_resolver(self) -> Any:
        return self.registry.resolver(self.base)

    def _crawl(self, embedded: list[tuple[Mapping, str]]) -> Any:
        """The registry of the document's resources and anchors (what ``$ref`` URIs name).

        A subschema with its own ``$schema`` (which ``_total_specification`` leaves out) is crawled on its own,
        with the specification of the dialect it declares as referencing would, from the base URI around it;
        the registries are combined with the enclosing ones last, so the entry that crawl makes for that base URI
        when the subschema has no id of its own does not hide the resource the URI belongs to.
        """
        import referencing
        import referencing.jsonschema as rj

        registries = [referencing.Registry().with_resource(self.base, self.spec.create_resource(self.schema)).crawl()]
        while embedded:
            node, enclosing = embedded.pop()
            dialect = node["$schema"]
            declared = rj.specification_with(dialect, default=None) if isinstance(dialect, str) else None
            spec = self.specification(declared.name if declared is not None else enclosing)
            around = self.base_at(self.ptr_of[id(node)].rpartition("/")[0])
            registries.append(referencing.Registry().with_resource(around, spec.create_resource(node)).crawl())
        return registries[-1].combine(*reversed(registries[:-1]))

    @cached_property
    def ptr_of(self) -> dict[int, str]:
        """The pointer of every object in the document (values of enum/const/default/examples aside), by
        identity: where a reference that is not a plain pointer into the root lands. Made when first needed."""
        out: dict[int, str] = {}

        def walk(node: Any, ptr: str) -> None:
            if isinstance(node, Mapping):
                out.setdefault(id(node), ptr)
                for key, value in node.items():
                    if key in _VALUE_KEYWORDS and not isinstance(value, Mapping):
                        continue
                    walk(value, f"{ptr}/{_escape_token(str(key))}")
            elif isinstance(node, list):
                for i, value in enumerate(node):
                    walk(value, f"{ptr}/{i}")

        walk(self.schema, "")
        return out

    # -- nodes -----------------------------------------------------------------------------------------------

    def node(self, ptr: str) -> Any:
        """The (sub)schema at ``ptr`` (KeyError when there is none): read from the nearest pointer above it already
        known (a synthetic node's own pointer is one), keeping each node on the way."""
        hit = self.nodes.get(ptr, self)
        if hit is not self:
            return hit

        def child(node: Any, at: str) -> Any:
            token = at.rpartition("/")[2].replace("~1", "/").replace("~0", "~")
            if _is_mapping(node):
                return node[token]
            if isinstance(node, list):
                return node[int(token)]
            raise KeyError(ptr)

        return _from_nearest(self.nodes, ptr, child)

    def add_synthetic(self, origin: str, node: Mapping) -> str:
        key = (origin, _sorted_text(node))
        ptr = self._synthetic_at.get(key)
        if ptr is None:
            ptr = self._synthetic_at[key] = f"{origin}/~s{len(self.synthetic)}"
            self.synthetic[ptr] = node
            self.nodes[ptr] = node
        return ptr

    def is_synthetic(self, ptr: str) -> bool:
        return "/~s" in ptr

    def base_at(self, ptr: str) -> str:
        """The base URI in force at ``ptr`` (a pointer into the document): the ids met on the way, read in the
        root's draft. Found from the nearest pointer above it already known, and kept for each one on the way."""
        hit = self.bases.get(ptr)
        if hit is not None:
            return hit

        def within(base: str, at: str) -> str:
            rid = self.id_of(self.node(at))
            return urljoin(base, rid) if rid else base

        return _from_nearest(self.bases, ptr, within)

    def in_own_dialect(self, uri: Any) -> bool:
        """Whether a subschema's ``$schema`` of ``uri`` names the dialect the root declares: then jsonschema, which
        reads such a subschema in its own dialect, reads it as the compiler reads every subschema."""
        return self.declared and isinstance(uri, str) and _validator_class(uri) is self.cls

    def id_of(self, node: Any) -> str | None:
        """The id ``node`` declares in the root's draft, as referencing's ``Resource.id`` reads it (without making a
        resource: this is asked of every pointer a reference stands at)."""
        if type(node) is dict and "$id" not in node and "id" not in node:
            return None  # no draft reads an id here: the specification is not made for it
        found = self.spec.id_of(node)
        return found.rstrip("#") if found is not None else None

    def resolver_at(self, ptr: str):
        if ptr == "" or self.is_synthetic(ptr):
            return self.root_resolver
        hit = self.resolvers.get(ptr)
        if hit is None:
            hit = self.resolvers[ptr] = self.registry.resolver(self.base_at(ptr))
        return hit

    def resolve(self, ptr: str, ref: str, keyword: str = "$ref") -> str:
        """The pointer of the schema ``ref`` (found at ``ptr``) refers to."""
        if not isinstance(ref, str):
            raise JsonSchemaError("a reference must be a string", f"{ptr}/{keyword}", keyword)
        # the base URI in force: the root's wherever no object below it names a resource
        base = self.base_at(ptr) if self.names_resources and not self.is_synthetic(ptr) else self.base
        # A reference means the same wherever the same base URI is in force: it is resolved once per pair.
        scope = (base, ref)
        known = self._resolved.get(scope)
        if known is not None:
            return known
        if (ref == "#" or ref.startswith("#/")) and base == self.base:
            # Most references: a JSON pointer into the root resource, read directly (referencing's lookup costs
            # tens of microseconds, and its registry a crawl of the document); anything unusual is left to it.
            target = unquote(ref[1:])
            if _VALUE_KEYWORDS.isdisjoint(target.split("/")):
                try:
                    if isinstance(self.node(target), (Mapping, bool)):
                        self._resolved[scope] = target
                        return target
                except (KeyError, IndexError, ValueError, TypeError):
                    pass
        where = f"{ptr}/{keyword}"
        try:
            resolved = self.resolver_at(ptr).lookup(ref)
        except self.unresolvable as exc:
            raise JsonSchemaError(
                f"cannot resolve {ref!r} inside this document (remote references are not fetched): {exc}",
                where,
                keyword,
            ) from None
        contents = resolved.contents
        if isinstance(contents, Mapping) and id(contents) in self.ptr_of:
            target = self._resolved[scope] = self.ptr_of[id(contents)]
            return target
        if isinstance(contents, bool):
            doc, _, fragment = ref.partition("#")
            try:
                holder = self.resolver_at(ptr).lookup(doc + "#").contents if doc else None
            except self.unresolvable:
                holder = None
            base_ptr = self.ptr_of.get(id(holder), None) if holder is not None else self._resource_ptr(ptr)
            fragment = unquote(fragment)
            if base_ptr is not None and fragment.startswith("/"):
                target = base_ptr + fragment
                try:
                    if self.node(target) is contents:
                        return target
                except (KeyError, IndexError, ValueError):
                    pass
        raise JsonSchemaError(f"{ref!r} does not refer to a schema of this document", where, keyword)

    def _resource_ptr(self, ptr: str) -> str:
        """The pointer of the innermost resource (the root, or a subschema with an id in the root's draft)
        containing ``ptr``."""
        best = ""
        node = self.schema
        walked = ""
        for token in ptr.split("/")[1:]:
            key = token.replace("~1", "/").replace("~0", "~")
            node = node[int(key)] if isinstance(node, list) else node[key]
            walked += "/" + token
            if self.id_of(node):
                best = walked
        return best

    # -- validation (the oracle used for enum/const candidates and property names) ----------------------------

    def validator(self):
        if self._validator is None:
            # Our resolver (as jsonschema's own descend passes one), not one jsonschema would build on referencing's
            # partial specification of the root's dialect: see _total_specification.
            checker = self.cls.FORMAT_CHECKER
            self._validator = self.cls(self.schema, format_checker=checker, _resolver=self.root_resolver)
        return self._validator

    def validation_schema(self, part: _Part) -> Any:
        """A schema jsonschema can evaluate (relative to the root) that means the same as ``part``."""
        if part.neg is not None:
            return {"not": self.keyword_schema(part)}
        return self._as_schema(part.ptr)

    def _as_schema(self, ptr: str) -> Any:
        if self.is_synthetic(ptr):
            return self._inline(self.node(ptr))
        if ptr == "":
            return {"$ref": "#"} if not self.base else {"$ref": self.base}
        return {"$ref": "#" + quote(ptr, safe="/~!$&'()*+,;=:@")}

    def _inline(self, node: Any) -> Any:
        if isinstance(node, Mapping):
            if set(node) == {"$ptr"}:
                return self._as_schema(node["$ptr"])
            out = {k: self._inline(v) if k not in ("enum", "const", "required") else v for k, v in node.items()}
            if "contains" in out and "contains" not in self.keywords and "not" not in out:
                # a synthetic contains (a negated items) in a draft without it: some item holds, as "not all fail"
                out["not"] = {"items": {"not": out.pop("contains")}}
            return out
        if isinstance(node, list):
            return [self._inline(v) for v in node]
        return node

    def keyword_schema(self, part: _Part) -> dict:
        """The schema of the single keyword a negated part negates."""
        node = self.node(part.ptr)
        kw = part.neg[0]
        if kw == "required":
            return {"required": [part.neg[1]]}
        if kw == "patternProperties":
            pattern = part.neg[1]
            return {kw: {pattern: self._as_schema(f"{part.ptr}/{kw}/{_escape_token(pattern)}")}}
        if kw == "propertyNames":
            return {kw: self._as_schema(f"{part.ptr}/{kw}")}
        if kw == "additionalProperties":  # what counts as additional is this schema object's business
            schema = {kw: self._as_schema(f"{part.ptr}/{kw}")}
            for sibling in ("properties", "patternProperties"):
                if isinstance(node.get(sibling), Mapping):
                    schema[sibling] = dict.fromkeys(node[sibling], True)
            return schema
        schema = {kw: node[kw]}
        if self.draft4 and kw in ("minimum", "maximum"):
            flag = "exclusiveMinimum" if kw == "minimum" else "exclusiveMaximum"
            if node.get(flag) is True:
                schema[flag] = True
        return schema

    def is_valid(self, parts: Sequence[_Part], value: Any) -> bool:
        """Whether ``value`` satisfies every part. Verdicts are kept per part and value (a part means the same
        wherever it appears: each trial conjunction of an exclusive ``oneOf`` checks the same enum values against
        the same negated branches again), and per schema text for parts without references (see
        :meth:`standalone`)."""
        instance = _sorted_text(value)
        for part in parts:
            standalone = self.standalone(part)
            key = (part.ptr, part.neg, instance) if standalone is None else (standalone[1], instance)
            verdict = self._verdicts.get(key)
            if verdict is None:
                _check_time(part.ptr)  # jsonschema's own time is unbounded: a large enum against a large schema
                if standalone is not None:
                    verdict = _plain_verdict(standalone[0], value, self.cls.VALIDATORS, self.draft4)
                elif part.neg is None and not self.names_resources:  # no subschema names a dialect of its own
                    verdict = _plain_verdict(self.node(part.ptr), value, self.cls.VALIDATORS, self.draft4, self.node)
                if verdict is None:
                    schema = self.validation_schema(part) if standalone is None else standalone[0]
                    verdict = self.validator().evolve(schema=schema).is_valid(value)  # its registry made now
                self._verdicts[key] = verdict
            if not verdict:
                return False
        return True

    def standalone(self, part: _Part) -> tuple[Any, str] | None:
        """What ``part`` means as a schema of its own, and its JSON text, when it holds no reference (nor a
        ``$schema`` of its own): then validating against it directly is the same as through a ``$ref`` to its
        pointer, without a lookup through the document, and equal texts (a bundled schema that inlines its
        definitions repeats them at many pointers) give equal verdicts, so they are asked once."""
        key = (part.ptr, part.neg)
        if key in self._standalone:
            return self._standalone[key]
        if part.neg is not None:
            schema = {"not": self.keyword_schema(part)}
        elif self.is_synthetic(part.ptr):
            schema = self._inline(self.node(part.ptr))
        else:
            schema = self.node(part.ptr)
        found = None if _refers(schema) else (schema, _sorted_text(schema))
        self._standalone[key] = found
        return found


#: The numeric bounds :func:`_plain_verdict` evaluates (draft 6 and later; draft 4's are left to jsonschema).
_BOUNDS = frozenset({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"})
#: The keywords :func:`_plain_verdict` evaluates itself.
_PLAIN_KEYWORDS = frozenset({"type", "enum", "const", "not", "minLength", "maxLength"}) | _BOUNDS
#: Most ``$ptr`` links one check follows (synthetic schemas name others; the chains are short).
_MAX_PLAIN_HOPS = 8
_TYPE_NAMES = frozenset(("null", "boolean", "string", "array", "object", "number", "integer"))


def _plain_verdict(
    schema: Any, value: Any, known: Mapping[str, Any], draft4: bool, node: Callable[[str], Any] | None = None
) -> bool | None:
    """Whether ``value`` satisfies ``schema`` when the schema asserts nothing but ``type``, ``enum``, ``const``,
    string lengths, numeric bounds (draft 6 and later) and ``not`` of such schemas (a keyword its dialect does not
    know is ignored, as jsonschema ignores it); None for any other schema (a reference among them). ``node`` looks
    up the pointers of a synthetic schema's ``$ptr``. Most enum values are checked against such parts (an enum
    beside its type and length, an exclusive ``oneOf``'s or an ``if``'s negated branches), where jsonschema's
    set-up costs far more than the check, and its enum search, once per value, makes a large enum quadratic."""
    for _ in range(_MAX_PLAIN_HOPS):
        if node is None or not isinstance(schema, Mapping) or len(schema) != 1 or "$ptr" not in schema:
            break
        schema = node(schema["$ptr"])
    if isinstance(schema, bool):
        return schema
    if not isinstance(schema, Mapping) or "$schema" in schema or "$ptr" in schema:
        return None  # a dialect of its own, or a synthetic schema met past the hops: left to jsonschema
    for keyword, argument in schema.items():
        if keyword not in known:
            continue
        if keyword not in _PLAIN_KEYWORDS:
            return None
        if keyword == "type":
            ok = _has_type(value, argument, draft4)
        elif keyword == "enum":
            if not isinstance(argument, list):
                return None
            if isinstance(value, str) or value is None:  # Python's == is JSON's here: the list's own search
                ok = value in argument
            else:
                ok = any(_json_equal(value, item) for item in argument)
        elif keyword == "const":
            ok = _json_equal(value, argument)
        elif keyword in ("minLength", "maxLength"):
            if type(argument) is not int:
                return None
            length = len(value) if isinstance(value, str) else None  # code points, as JSON Schema counts them
            ok = length is None or (length >= argument if keyword == "minLength" else length <= argument)
        elif keyword in _BOUNDS:
            if draft4 or type(argument) not in (int, float):
                return None  # draft 4's exclusive bounds are flags read by minimum and maximum
            ok = _within(value, keyword, argument)
        else:
            inner = _plain_verdict(argument, value, known, draft4, node)
            ok = None if inner is None else not inner
        if ok is None:
            return None
        if not ok:
            return False
    return True


def _within(value: Any, keyword: str, bound: int | float) -> bool:
    """jsonschema's ``minimum``, ``maximum``, ``exclusiveMinimum`` or ``exclusiveMaximum`` (draft 6 and later): a
    bound holds for every value that is not a number."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return True
    if keyword == "minimum":
        return value >= bound
    if keyword == "maximum":
        return value <= bound
    if keyword == "exclusiveMinimum":
        return value > bound
    return value < bound


def _has_type(value: Any, type_: Any, draft4: bool) -> bool | None:
    """jsonschema's ``type`` check of draft 4 and later (None for a type name it does not define)."""
    names = [type_] if isinstance(type_, str) else type_
    if not isinstance(names, list) or not all(isinstance(n, str) and n in _TYPE_NAMES for n in names):
        return None
    for name in names:
        if name == "null":
            ok = value is None
        elif name == "boolean":
            ok = isinstance(value, bool)
        elif name == "string":
            ok = isinstance(value, str)
        elif name == "array":
            ok = isinstance(value, list)
        elif name == "object":
            ok = isinstance(value, Mapping)
        elif name == "number":
            ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        else:  # integer
            ok = (isinstance(value, int) and not isinstance(value, bool)) or (
                not draft4 and isinstance(value, float) and value.is_integer()
            )
        if ok:
            return True
    return False


def _json_equal(a: Any, b: Any) -> bool:
    """JSON equality as JSON Schema defines it: numbers by value, ``true`` is not ``1``, objects unordered."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    if isinstance(a, str) or isinstance(b, str) or a is None or b is None:
        return type(a) is type(b) and a == b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_json_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return a.keys() == b.keys() and all(_json_equal(a[k], b[k]) for k in a)
    return False


def _refers(schema: Any) -> bool:
    """Whether ``schema`` holds a reference or a dialect of its own anywhere (property names and enum values
    included: a conservative answer)."""
    stack = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, Mapping):
            if any(k in node for k in ("$ref", "$dynamicRef", "$recursiveRef", "$schema")):
                return True
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return False


def _refuse_non_json(schema: Any) -> tuple[int, bool]:
    """JsonSchemaError at the first value no JSON text spells: a key that is not a string, a value that is not a
    string, number, boolean, null, list or mapping (a tuple, a set, an object), an infinite or NaN float. The
    compiler's parts assume JSON, and a bound of infinity has no digits to compile. One quick walk answers for the
    whole schema (about 15 us for a typical one); the walk that finds the pointer runs only when it fails. Returns
    what :func:`_json_containers` does."""
    containers = _json_containers(schema)
    if containers is not None:
        return containers
    work = [("", schema)]
    while work:
        pointer, value = work.pop()
        keyword = next((token for token in reversed(pointer.split("/")) if not token.isdigit()), "") or None
        if isinstance(value, float) and not math.isfinite(value):
            raise JsonSchemaError(f"{value!r} is not a JSON number (JSON has no Infinity or NaN)", pointer, keyword)
        if isinstance(value, Mapping):
            for k in value:
                if not isinstance(k, str):
                    raise JsonSchemaError(f"the key {k!r} is not a string, as JSON object keys are", pointer, keyword)
            work.extend((f"{pointer}/{_escape_token(k)}", v) for k, v in value.items())
        elif isinstance(value, list):
            work.extend((f"{pointer}/{i}", v) for i, v in enumerate(value))
        elif not isinstance(value, (str, int, float, type(None))):
            raise JsonSchemaError(f"a {type(value).__name__} is not a JSON value", pointer, keyword)
        elif isinstance(value, int) and value.bit_length() > _MAX_INT_BITS:
            raise JsonSchemaError(
                f"an integer of {value.bit_length():,} bits is longer than Python writes as text", pointer, keyword
            )


def _json_containers(schema: Any) -> tuple[int, bool] | None:
    """How many objects and arrays ``schema`` holds, and whether an object may name a resource or an anchor (a key
    of :data:`_ANCHOR_KEYWORDS` anywhere, or one of :data:`_ID_KEYWORDS` with a string value below the root: data
    values included, so :func:`_names_resources` decides); None when it holds a value no JSON text spells."""
    stack = [schema]
    containers = 0
    naming = False
    while stack:
        node = stack.pop()
        kind = type(node)
        if kind is str or kind is bool or node is None:
            continue
        if kind is int:
            if node.bit_length() > _MAX_INT_BITS:
                return None
            continue
        if kind is dict or (kind is not list and isinstance(node, Mapping)):
            for key in node:
                if type(key) is not str and not isinstance(key, str):
                    return None
            stack.extend(node.values())
            containers += 1
            naming = naming or _names_here(node, node is schema)
        elif isinstance(node, list):
            stack.extend(node)
            containers += 1
        elif isinstance(node, float):
            if not math.isfinite(node):
                return None
        elif not isinstance(node, (str, int)) or (isinstance(node, int) and node.bit_length() > _MAX_INT_BITS):
            return None
    return containers, naming


#: Integers of more bits are refused: Python writes at most 4,300 digits of an int as text by default.
_MAX_INT_BITS = 13_000
