"""Arrays: the rules of the arrays a shape allows."""

from __future__ import annotations

from decimal import ROUND_CEILING, ROUND_FLOOR, Decimal
from typing import Any

from constrain.compilers.json_schema.cdfa import _CDFA
from constrain.compilers.json_schema.document import _clean_pointer
from constrain.compilers.json_schema.errors import _TIME_LIMIT, _NotNegatable, _Unsatisfiable
from constrain.compilers.json_schema.formats import _FORMATS
from constrain.compilers.json_schema.keywords import _Part, _Shape
from constrain.compilers.json_schema.layout import _child_depth, _Layout
from constrain.compilers.json_schema.regex_ast import _ast_to_expr
from constrain.compilers.json_schema.strings import _format_language
from constrain.compilers.json_schema.values import _ALL_KINDS, _canonical_value, _json_key, _kinds_of_type, _to_decimal
from constrain.errors import JsonSchemaError
from constrain.grammar.ir import Alt, Expr, Ref, Repeat, Seq

#: ``uniqueItems`` is exact when every item comes from a finite set of values, its union at most this many values
#: (an enum, ``const``, booleans, ``null``, integers in a bounded range, or any mix of these): a rule per set of
#: values used so far.
MAX_UNIQUE_ENUM = 16
#: Most sets of values used so far (one rule each) an array of unique items from a finite domain may need: every
#: subset of the domain up to ``maxItems`` values that an array can reach.
MAX_UNIQUE_SETS = 2048
#: Most states of the automaton that counts the items of an array with ``contains`` (positions x counts).
MAX_CONTAINS_STATES = 2000


class _ArrayRules:
    """The rules of the arrays a shape allows: ``prefixItems``/``items`` (and the draft-07 forms), item counts,
    ``contains`` with its counts, ``uniqueItems`` over a small enum, and ``unevaluatedItems``.

    A mixin of :class:`~constrain.compilers.json_schema.compiler._Compiler`. It relies on the compiler's ``doc``,
    ``node`` and ``rules``; on its methods ``conj``, ``normalise``, ``live_keys``, ``known_here``, ``layout``,
    ``bracketed``, ``refuse`` and ``unsatisfiable``; on ``negate`` and ``evaluated_beside``
    (:class:`~constrain.compilers.json_schema.combinators._Combinators`); and on ``finite_candidates`` and
    ``value_literal`` (:class:`~constrain.compilers.json_schema.enums._EnumRules`)."""

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
            if "contains" in live and ("contains" in self.doc.keywords or self.doc.is_synthetic(part.ptr)):
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
                rest_expr = self.conj(rest_parts, cd, defer=True)
            except _Unsatisfiable:
                rest_expr = None
        if rest_expr is None:
            max_n = len(elements) if max_n is None else min(max_n, len(elements))
        if max_n is not None and sh.min_items > max_n:
            at = sh.min_items_at if sh.min_items_at[0] else (sh.array_parts[0].ptr + "/items", "items")
            raise self.unsatisfiable(f"at least {sh.min_items} items are needed but at most {max_n} can be valid", *at)
        if sh.unique is not None and (max_n is None or max_n > 1):
            positions = [
                [_Part(x) for p, r in zip(prefixes, rests) for x in ([p[i]] if i < len(p) else [r]) if x is not None]
                for i in range(len(elements))
            ]  # fmt: skip
            found = self.unique_items_expr(
                positions, rest_parts if rest_expr is not None else None, contains, sh.min_items, max_n, lay, cd,
                name, sh.unique,
            )  # fmt: skip
            if found is not None:
                return found
            self.refuse(
                sh.unique, "uniqueItems", "uniqueness of array items cannot be expressed by a grammar (unless every "
                f"item comes from a finite set of at most {MAX_UNIQUE_ENUM} values: an enum, const, booleans, null or "
                "a bounded integer range)", "dropped",
            )  # fmt: skip
        counted = [c for c in contains if not (c[1] == 0 and c[2] is None)]  # minContains 0 alone: no constraint
        if counted:
            positions = [
                [_Part(x) for p, r in zip(prefixes, rests) for x in ([p[i]] if i < len(p) else [r]) if x is not None]
                for i in range(len(elements))
            ]  # fmt: skip
            return self.contains_expr(
                sh, counted, positions, rest_parts if rest_expr is not None else None, max_n, lay, cd
            )
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

    def finite_domain(self, parts: list[_Part]) -> list[Any] | None:
        """The values the conjunction of ``parts`` allows when they are finitely many and at most
        :data:`MAX_UNIQUE_ENUM` (None otherwise): an enum or const (validated against the whole conjunction), or
        the nulls, booleans and integers of a bounded range its types and bounds leave, each validated against the
        whole conjunction (so its other keywords, branches and negations included, are exact)."""
        try:
            norm = self.normalise(parts)
        except _Unsatisfiable:
            return []
        if not norm:
            return None
        try:
            listed = self.finite_candidates(norm)
        except _Unsatisfiable:
            return []
        if listed is not None:
            return listed if len(listed) <= MAX_UNIQUE_ENUM else None
        candidates = self.finite_superset(norm, 0)
        if candidates is None or len(candidates) > MAX_UNIQUE_ENUM:
            return None
        formats = [
            self.node(p.ptr)["format"]
            for p in norm
            if p.neg is None and "format" in self.live_keys(p) and self.node(p.ptr)["format"] in _FORMATS
        ]
        out = []
        for value in candidates:
            if isinstance(value, str) and any(not _format_language(f).accepts(value) for f in formats):
                continue  # formats are asserted, as for an enum's values (see finite_candidates)
            try:
                ok = self.doc.is_valid(norm, value)
            except _TIME_LIMIT:
                raise
            except Exception as exc:  # an unresolvable reference met by jsonschema, a bad regex...
                raise JsonSchemaError(
                    f"cannot evaluate the item values against the schema: {exc}", _clean_pointer(norm[0].ptr)
                ) from None
            if ok:
                out.append(value)
        return out

    def finite_superset(self, norm: tuple[_Part, ...], depth: int) -> list[Any] | None:
        """A finite set of at most :data:`MAX_UNIQUE_ENUM` values that holds every value the conjunction ``norm``
        allows, or None: what its types and numeric bounds leave (nulls, booleans, the integers of a bounded
        range), its enums and consts, and the union over the branches of an ``anyOf``/``oneOf`` whose branches
        all have such a set."""
        kinds = set(_ALL_KINDS)
        lo: Decimal | None = None
        hi: Decimal | None = None
        listed: dict[str, Any] | None = None
        for part in norm:
            if part.neg is not None:
                continue  # a negation only narrows what the other parts allow
            node = self.node(part.ptr)
            live = self.live_keys(part)
            if "type" in live:
                kinds &= _kinds_of_type(node["type"])
            for kw in ("minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"):
                value = node.get(kw) if kw in live else None
                if isinstance(value, bool) or not isinstance(value, (int, float)):
                    continue
                bound = _to_decimal(value)  # not strict: a superset, which validation narrows
                if kw in ("minimum", "exclusiveMinimum"):
                    lo = bound if lo is None else max(lo, bound)
                else:
                    hi = bound if hi is None else min(hi, bound)
            found: list[list[Any]] = []
            for kw in ("const", "enum"):
                if kw in live and (kw == "const" or isinstance(node[kw], list)):
                    found.append([node[kw]] if kw == "const" else node[kw])
            for kw in ("anyOf", "oneOf"):
                if kw in live and isinstance(node[kw], list) and depth < 4:
                    union: list[Any] = []
                    for i in range(len(node[kw])):
                        try:
                            branch = self.normalise([_Part(f"{part.ptr}/{kw}/{i}")])
                        except _Unsatisfiable:
                            continue
                        sub = self.finite_superset(branch, depth + 1) if branch else None
                        if sub is None:
                            union = None
                            break
                        union.extend(sub)
                    if union is not None:
                        found.append(union)
            for values in found:
                keyed = {_json_key(v): v for v in values}
                listed = keyed if listed is None else {k: v for k, v in listed.items() if k in keyed}
        if listed is not None:
            return list(listed.values())
        if kinds - {"null", "boolean", "int"}:
            return None
        candidates: list[Any] = []
        if "null" in kinds:
            candidates.append(None)
        if "boolean" in kinds:
            candidates += [True, False]
        if "int" in kinds:
            if lo is None or hi is None:
                return None
            first, last = int(lo.to_integral_value(ROUND_CEILING)), int(hi.to_integral_value(ROUND_FLOOR))
            if last - first + 1 > MAX_UNIQUE_ENUM:
                return None
            candidates += range(first, last + 1)
        return candidates

    def unique_items_expr(
        self, positions: list[list[_Part]], rest: list[_Part] | None, contains: list[tuple[str, int, int | None]],
        min_items: int, max_n: int | None, lay: _Layout, cd, name: str, at: str,
    ) -> Expr | None:  # fmt: skip
        """Arrays of distinct items when every item comes from a small finite set (None when one does not):
        ``positions`` are the conjunctions of the prefix items, ``rest`` that of the items after them (None: no
        more), ``contains`` the ``contains`` keywords with their counts. The items an array has used so far are a
        set of values, whose size is the number of items read, so one rule per reachable set (at most
        :data:`MAX_UNIQUE_SETS`) decides what may follow: a value not used yet, allowed at that position; and
        whether the array may end there (``minItems``, and each ``contains`` count over the values used)."""
        domains = [self.finite_domain(parts) for parts in positions]
        rest_domain = self.finite_domain(rest) if rest is not None else []
        if rest_domain is None or any(d is None for d in domains):
            return None
        index: dict[str, int] = {}
        values: list[Any] = []
        for domain in [*domains, rest_domain]:
            for value in domain:
                key = _json_key(value)
                if key not in index:
                    index[key] = len(values)
                    values.append(value)
        if len(values) > MAX_UNIQUE_ENUM:
            return None
        allowed = [sum(1 << index[_json_key(v)] for v in d) for d in domains]
        rest_bits = sum(1 << index[_json_key(v)] for v in rest_domain)
        counted = []
        for c_ptr, low, high in contains:
            bits = 0
            for value in values:
                try:
                    ok = self.doc.is_valid((_Part(c_ptr),), value)
                except _TIME_LIMIT:
                    raise
                except Exception as exc:
                    raise JsonSchemaError(
                        f"cannot evaluate the item values against contains: {exc}", _clean_pointer(c_ptr), "contains"
                    ) from None
                if ok:
                    bits |= 1 << index[_json_key(value)]
            counted.append((bits, low, high))
        cap = len(values) if max_n is None else min(len(values), max_n)

        def following(mask: int) -> int:
            used = mask.bit_count()
            if used >= cap:
                return 0
            return (allowed[used] if used < len(allowed) else rest_bits) & ~mask

        def may_end(mask: int) -> bool:
            if mask.bit_count() < min_items:
                return False
            return all(
                (mask & bits).bit_count() >= low and (high is None or (mask & bits).bit_count() <= high)
                for bits, low, high in counted
            )

        reachable = [0]
        seen = {0}
        i = 0
        while i < len(reachable):
            mask = reachable[i]
            i += 1
            nxt = following(mask)
            while nxt:
                bit = nxt & -nxt
                nxt ^= bit
                if mask | bit not in seen:
                    if len(seen) >= MAX_UNIQUE_SETS:
                        return None
                    seen.add(mask | bit)
                    reachable.append(mask | bit)
        productive = {m for m in reachable if may_end(m)}
        for mask in reversed(reachable):  # supersets come later in breadth-first order
            nxt = following(mask)
            while nxt and mask not in productive:
                bit = nxt & -nxt
                nxt ^= bit
                if mask | bit in productive:
                    productive.add(mask)
        if 0 not in productive:
            pointer = contains[0][0] if contains and min_items <= cap else at
            raise self.unsatisfiable(
                f"no array of at least {min_items} distinct items from the values allowed meets the constraints",
                pointer, "contains" if pointer != at else "uniqueItems",
            )  # fmt: skip
        literals = [self.value_literal(_canonical_value(v), cd) for v in values]

        def options(mask: int) -> list[Expr]:
            out: list[Expr] = []
            nxt = following(mask)
            for j in range(len(values)):
                if nxt >> j & 1 and mask | 1 << j in productive:
                    out.append(Seq(((lay.comma,) if mask else ()) + (literals[j], rule(mask | 1 << j))))
            if may_end(mask):
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
        return self.bracketed(nonempty, may_end(0), lay.arr_open, lay.arr_close, lay.arr_empty, (at, "uniqueItems"))

    def contains_expr(
        self, sh: _Shape, contains: list[tuple[str, int, int | None]], positions: list[list[_Part]],
        rest: list[_Part] | None, max_n: int | None, lay: _Layout, cd,
    ) -> Expr:  # fmt: skip
        """Arrays with ``contains`` counts (each ``(pointer, minContains, maxContains)``), beside prefix items
        (``positions``, the conjunction of each) and the items after them (``rest``; None: none): a small automaton
        over the items, whose state is the position (up to where it no longer matters) and how many items so far
        match each ``contains`` (up to its minimum, or up to its maximum when it has one). Each item is read as
        one of its variants: its schema together with the ``contains`` schemas it is counted for and, for each
        counted with a maximum that it is not counted for, the negation of that one (so those counts are exact;
        a ``contains`` without a maximum may leave a match uncounted, which only ever counts too few)."""
        for i, (c_ptr, low, high) in enumerate(contains):
            if high is not None:
                try:
                    self.negate(c_ptr)
                except _NotNegatable as exc:
                    self.refuse(c_ptr.rsplit("/", 1)[0] + "/maxContains", "maxContains", str(exc), "ignored")
                    contains[i] = (c_ptr, low, None)
        m = len(contains)
        caps = [low if high is None else high for _, low, high in contains]
        k = len(positions)
        t_cap = max_n if max_n is not None else max(sh.min_items, k, 1)
        states = t_cap + 1
        for cap in caps:
            states *= cap + 1
        at = (contains[0][0], "contains")
        if states > MAX_CONTAINS_STATES or m > 3:
            self.refuse(contains[0][0], "contains", "the item counts need too large an automaton", "ignored")
            return self.bracketed(None, True, lay.arr_open, lay.arr_close, lay.arr_empty, at)
        classes = positions + ([rest] if rest is not None else [])
        # per position class and set of contains counted: the item's rule (None: no item is so)
        variants: list[list[Expr | None]] = []
        for parts in classes:
            row: list[Expr | None] = []
            for served in range(2**m):
                extra = []
                for j, (c_ptr, _, high) in enumerate(contains):
                    if served >> j & 1:
                        extra.append(_Part(c_ptr))
                    elif high is not None:
                        extra.append(_Part(self.doc.add_synthetic(c_ptr, {"not": {"$ptr": c_ptr}})))
                try:
                    row.append(self.conj(parts + extra, cd))
                except _Unsatisfiable:
                    row.append(None)
            variants.append(row)
        symbols: list[Expr] = []
        symbol_of: dict[tuple[int, int, bool], int] = {}
        for ci, row in enumerate(variants):
            for served, ref in enumerate(row):
                if ref is None:
                    continue
                for comma in (False, True):
                    symbol_of[(ci, served, comma)] = len(symbols)
                    symbols.append(Seq((lay.comma, ref)) if comma else ref)
        index: dict[tuple[int, tuple[int, ...]], int] = {}
        order: list[tuple[int, tuple[int, ...]]] = []

        def state(t: int, counts: tuple[int, ...]) -> int:
            if (t, counts) not in index:
                index[(t, counts)] = len(order)
                order.append((t, counts))
            return index[(t, counts)]

        state(0, (0,) * m)
        edges: list[list[tuple[int, int, int]]] = []
        accept: list[bool] = []
        i = 0
        while i < len(order):
            t, counts = order[i]
            i += 1
            row_edges = []
            ci = t if t < k else (k if rest is not None else None)
            if ci is not None and (max_n is None or t + 1 <= max_n):
                t2 = t + 1 if max_n is not None else min(t + 1, t_cap)
                for served in range(2**m):
                    sym = symbol_of.get((ci, served, t > 0))
                    if sym is None:
                        continue
                    new = []
                    for j, (_, low, high) in enumerate(contains):
                        c = counts[j] + (served >> j & 1)
                        new.append(c if high is not None else min(c, low))
                    if any(high is not None and c > high for c, (_, _, high) in zip(new, contains)):
                        continue
                    row_edges.append((sym, sym, state(t2, tuple(new))))
            row_edges.sort()
            edges.append(row_edges)
            accept.append(t >= sh.min_items and all(c >= low for c, (_, low, _) in zip(counts, contains)))
        empty_ok = accept[0]
        accept[0] = False
        dfa = _CDFA(edges, accept).minimized()
        ast = None if dfa.is_empty() else dfa.to_ast()
        if ast is None and not empty_ok:
            raise self.unsatisfiable("no array satisfies the contains counts with the other item constraints", *at)
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
        for _, qnode, qlive in self.evaluated_beside(part, sh):
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
