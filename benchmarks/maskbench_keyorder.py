"""The JSON Schema compiler's canonical key order for an instance: :func:`canonical_order`.

Used by ``benchmarks/maskbench.py`` (its second validation count: valid instances written in the declared order),
which loads this file by its path (``benchmarks/`` is not a package) and re-exports ``canonical_order``, and through
it by ``tests/maskbench_golden.py`` (the conformance golden file, whose instances are all written this way).

The compiler (``constrain.compilers.json_schema``) writes an object's members in a fixed order, so a
valid instance whose keys come in another order is never produced. The helper walks the schema together with the
instance and, for each object, collects the subschemas that apply to it the way the compiler merges them: the
schema itself, then what its ``$ref`` (JSON pointers, ``$id``/``$anchor`` URIs, ``$defs``/``definitions``) and
``allOf`` point to, breadth first (in draft-04/06/07 a ``$ref`` replaces its siblings); then, one keyword at a time
in the order ``anyOf``, ``oneOf``, ``if``, ``dependentRequired``/``dependentSchemas``/``dependencies``, the
branch the instance takes: the first ``anyOf``/``oneOf`` branch that validates (``jsonschema``, formats
asserted), ``if`` and ``then`` when ``if`` validates, else ``else``; the dependent schema of each trigger present.
The keys are then ordered: the names of ``properties`` of those subschemas in that order, then names that are only
``required``, then the instance's other keys in the instance's own order. Values are ordered recursively with the
subschemas that apply to them (``properties``, matching ``patternProperties``, ``additionalProperties``;
``prefixItems`` / ``items`` / ``additionalItems``, and ``contains`` for the items it matches). When no branch
validates or a ``$ref`` does not resolve, that part is simply left out: the instance's own order is kept where the
helper cannot tell.
"""

from __future__ import annotations

import re
from collections import deque
from typing import Any

_BRANCHING = ("anyOf", "oneOf", "if", "dependentRequired", "dependentSchemas", "dependencies")
_LEGACY = ("Draft3Validator", "Draft4Validator", "Draft6Validator", "Draft7Validator")


class _Orderer:
    """Walks a schema and an instance together; see the module docstring."""

    def __init__(self, schema: Any):
        import referencing
        import referencing.jsonschema as rj
        from jsonschema import validators

        cls = validators.validator_for(schema, default=validators.Draft202012Validator)
        self.legacy = cls.__name__ in _LEGACY
        self.spec = {
            "Draft3Validator": rj.DRAFT3, "Draft4Validator": rj.DRAFT4, "Draft6Validator": rj.DRAFT6,
            "Draft7Validator": rj.DRAFT7, "Draft201909Validator": rj.DRAFT201909,
        }.get(cls.__name__, rj.DRAFT202012)  # fmt: skip
        self.validator = cls(schema, format_checker=cls.FORMAT_CHECKER)
        resolver = getattr(self.validator, "_resolver", None)
        if resolver is None:  # pragma: no cover - jsonschema without referencing
            resource = self.spec.create_resource(schema)
            resolver = referencing.Registry().with_resource(resource.id() or "", resource).resolver(resource.id() or "")
        self.root = (schema, resolver)
        self.seen_validation: dict[tuple[int, str], bool] = {}

    # -- schema walking ----------------------------------------------------------------------------------------

    def _enter(self, node: Any, res: Any) -> Any:
        if isinstance(node, dict) and ("$id" in node or "id" in node):
            try:
                return res.in_subresource(self.spec.create_resource(node))
            except Exception:
                return res
        return res

    def _lookup(self, ref: Any, res: Any) -> tuple[Any, Any] | None:
        if not isinstance(ref, str):
            return None
        try:
            resolved = res.lookup(ref)
        except Exception:
            return None
        return resolved.contents, resolved.resolver

    def _valid(self, node: Any, res: Any, value: Any) -> bool:
        try:
            return self.validator.evolve(schema=node, _resolver=res).is_valid(value)
        except Exception:
            return False

    def _expand(self, parts: list[tuple[Any, Any]]) -> list[tuple[Any, Any]]:
        """``parts`` with what ``$ref`` and ``allOf`` add, breadth first (the compiler's ``normalise``)."""
        out: list[tuple[Any, Any]] = []
        seen: set[int] = set()
        work = deque(parts)
        while work:
            node, res = work.popleft()
            if not isinstance(node, dict) or id(node) in seen:
                continue
            seen.add(id(node))
            res = self._enter(node, res)
            added = []
            ref_only = False
            for kw in ("$ref", "$dynamicRef", "$recursiveRef"):
                if kw in node:
                    target = self._lookup(node[kw], res)
                    if target is None:
                        continue
                    if self.legacy and kw == "$ref":
                        ref_only = True
                        added = [target]
                        break
                    added.append(target)
            if ref_only:
                work.extendleft(reversed(added))
                continue
            if isinstance(node.get("allOf"), list):
                added.extend((sub, res) for sub in node["allOf"])
            out.append((node, res))
            work.extend(added)
        return out

    def _applicable(self, parts: list[tuple[Any, Any]], value: Any) -> list[tuple[Any, Any]]:
        """The subschemas that apply to ``value``: ``parts`` expanded, then the branches ``value`` takes."""
        parts = self._expand(parts)
        done: set[tuple[int, str]] = set()
        while True:
            for node, res in parts:  # noqa: B007 - both are read after the break
                kw = next((k for k in _BRANCHING if k in node and (id(node), k) not in done), None)
                if kw is not None:
                    break
            else:
                return parts
            done.add((id(node), kw))
            extra: list[tuple[Any, Any]] = []
            sub = node[kw]
            if kw in ("anyOf", "oneOf") and isinstance(sub, list):
                branch = next((b for b in sub if self._valid(b, res, value)), None)
                if branch is not None:
                    extra.append((branch, res))
            elif kw == "if":
                if self._valid(sub, res, value):
                    extra.append((sub, res))
                    if "then" in node:
                        extra.append((node["then"], res))
                elif "else" in node:
                    extra.append((node["else"], res))
            elif isinstance(sub, dict) and isinstance(value, dict):
                for trigger, dep in sub.items():
                    if trigger not in value:
                        continue
                    if isinstance(dep, list):
                        extra.append(({"required": [trigger, *dep]}, res))
                    else:
                        extra.append(({"required": [trigger]}, res))
                        extra.append((dep, res))
            parts = self._expand(parts + extra)

    # -- the instance ------------------------------------------------------------------------------------------

    def order(self, value: Any, parts: list[tuple[Any, Any]] | None = None) -> Any:
        if not isinstance(value, (dict, list)):
            return value
        parts = self._applicable([self.root] if parts is None else parts, value)
        if isinstance(value, dict):
            return self._order_object(value, parts)
        return self._order_array(value, parts)

    def _order_object(self, value: dict, parts: list[tuple[Any, Any]]) -> dict:
        names: list[str] = []
        for node, _ in parts:
            props = node.get("properties")
            if isinstance(props, dict):
                names.extend(n for n in props if n not in names)
        for node, _ in parts:
            req = node.get("required")
            if isinstance(req, list):
                names.extend(n for n in req if isinstance(n, str) and n not in names)
        rank = {n: i for i, n in enumerate(names)}
        keys = sorted(value, key=lambda k: (0, rank[k]) if k in rank else (1, 0))  # stable: the rest keep order
        out = {}
        for key in keys:
            sub: list[tuple[Any, Any]] = []
            for node, res in parts:
                matched = False
                props = node.get("properties")
                if isinstance(props, dict) and key in props:
                    sub.append((props[key], res))
                    matched = True
                pats = node.get("patternProperties")
                if isinstance(pats, dict):
                    for pattern, s in pats.items():
                        try:
                            hit = re.search(pattern, key) is not None
                        except re.error:
                            hit = False
                        if hit:
                            sub.append((s, res))
                            matched = True
                if not matched and "additionalProperties" in node:
                    sub.append((node["additionalProperties"], res))
            out[key] = self.order(value[key], sub)
        return out

    def _order_array(self, value: list, parts: list[tuple[Any, Any]]) -> list:
        per_item: list[list[tuple[Any, Any]]] = [[] for _ in value]
        for node, res in parts:
            items = node.get("items")
            if isinstance(items, list):
                prefix, rest = items, node.get("additionalItems")
            else:
                prefix = node.get("prefixItems") if isinstance(node.get("prefixItems"), list) else []
                rest = items
            for i in range(len(value)):
                if i < len(prefix):
                    per_item[i].append((prefix[i], res))
                elif rest is not None:
                    per_item[i].append((rest, res))
            if "contains" in node:
                for i, item in enumerate(value):
                    if self._valid(node["contains"], res, item):
                        per_item[i].append((node["contains"], res))
        return [self.order(item, sub) for item, sub in zip(value, per_item)]


def canonical_order(schema: Any, instance: Any) -> Any:
    """``instance`` with the keys of each object in the order the compiler writes them for ``schema`` (see the
    module docstring); values are not changed. Falls back to the instance as it is if the walk fails."""
    try:
        return _Orderer(schema).order(instance)
    except Exception:
        return instance
