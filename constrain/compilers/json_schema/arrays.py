"""Arrays: the rules of the arrays a shape allows."""

from __future__ import annotations

from constrain.compilers.json_schema.cdfa import _CDFA
from constrain.compilers.json_schema.errors import _NotNegatable, _Unsatisfiable
from constrain.compilers.json_schema.keywords import _Part, _Shape
from constrain.compilers.json_schema.layout import _child_depth, _Layout
from constrain.compilers.json_schema.regex_ast import _ast_to_expr
from constrain.compilers.json_schema.values import _canonical_value
from constrain.grammar.ir import Alt, Expr, Ref, Repeat, Seq

#: ``uniqueItems`` is exact for items drawn from an enum of at most this many values (a rule per subset).
MAX_UNIQUE_ENUM = 8


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
