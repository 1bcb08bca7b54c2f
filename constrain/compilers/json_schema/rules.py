"""A schema's rules as expressions: small builders, and the clean-up before they become a grammar (unproductive
rules, alias cycles, reachability; :func:`~constrain.grammar.rules.build_pushdown` resolves plain aliases).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Container, Mapping, Set

from constrain.compilers.json_schema.errors import _check_time, _Unsatisfiable
from constrain.errors import JsonSchemaError
from constrain.grammar.ir import Alt, Automaton, Expr, Literal, Ref, Regex, Repeat, Seq, calls_of

# The walks below meet the same subtree many times where branches were inlined (an option's body is shared by
# every branch that kept it), so composite nodes are looked up by identity in a ``memo`` first.


def _productive(expr: Expr, ok: set[str], memo: dict[int, bool] | None = None) -> bool:
    if isinstance(expr, (Literal, Regex, Automaton)):
        return True
    if isinstance(expr, Ref):
        return expr.rule in ok
    if not isinstance(expr, (Seq, Alt, Repeat)):
        return False
    memo = {} if memo is None else memo
    hit = memo.get(id(expr))
    if hit is None:
        if isinstance(expr, Seq):
            hit = all(_productive(x, ok, memo) for x in expr.items)
        elif isinstance(expr, Alt):
            hit = any(_productive(x, ok, memo) for x in expr.items)
        else:
            hit = expr.min == 0 or _productive(expr.item, ok, memo)
        memo[id(expr)] = hit
    return hit


def _prune(expr: Expr, ok: set[str], memo: dict[int, Expr | None]) -> Expr | None:
    if isinstance(expr, (Literal, Regex, Automaton)):
        return expr
    if isinstance(expr, Ref):
        return expr if expr.rule in ok else None
    if not isinstance(expr, (Seq, Alt, Repeat)):
        return None
    if id(expr) in memo:
        return memo[id(expr)]
    out: Expr | None
    if isinstance(expr, Seq):
        items = []
        for x in expr.items:
            y = _prune(x, ok, memo)
            if y is None:
                items = None
                break
            items.append(y)
        if items is None:
            out = None
        else:
            out = expr if all(a is b for a, b in zip(items, expr.items)) else Seq(tuple(items))
    elif isinstance(expr, Alt):
        kept = [y for y in (_prune(x, ok, memo) for x in expr.items) if y is not None]
        if not kept:
            out = None
        elif len(kept) == len(expr.items) and all(a is b for a, b in zip(kept, expr.items)):
            out = expr  # unchanged: the same object keeps its cached hash
        else:
            out = kept[0] if len(kept) == 1 else Alt(tuple(kept))
    else:
        y = _prune(expr.item, ok, memo)
        if y is None:
            out = Seq(()) if expr.min == 0 else None
        else:
            out = expr if y is expr.item else Repeat(y, expr.min, expr.max)
    memo[id(expr)] = out
    return out


def _then(*items: Expr) -> Seq:
    """``Seq(items)`` with adjacent text literals joined (a member's ``"name":`` rather than the key and the colon):
    the same language and the same automaton, built from fewer expression nodes, which every pass over the grammar
    walks."""
    out: list[Expr] = []
    for item in items:
        if out and type(item) is Literal and type(out[-1]) is Literal:
            a, b = out[-1].value, item.value
            if isinstance(a, str) and isinstance(b, str):
                out[-1] = Literal(a + b)
                continue
        out.append(item)
    return Seq(tuple(out))


def _options(expr: Expr) -> list[Expr]:
    return list(expr.items) if isinstance(expr, Alt) else [expr]


def _reachable(
    rules: dict[str, Expr], start: str, refs: dict[str, tuple[str, ...]], outside: Container[str] = frozenset()
) -> dict[str, Expr]:
    """The rules ``start`` calls, directly or not (and itself), in their order, short of those in ``outside``;
    ``refs`` (each rule's calls) gets those it lacks of the rules reached, so calls are found only for rules that
    stay. Calls to undefined rules (a recursion found unsatisfiable) are left to pruning."""
    keep = {start}
    work = [start]
    while work:
        _check_time()  # tens of thousands of rules take a good part of a second
        name = work.pop()
        calls = refs.get(name)
        if calls is None:
            calls = refs[name] = calls_of(rules[name])
        for r in calls:
            if r not in keep and r in rules and r not in outside:
                keep.add(r)
                work.append(r)
    return {name: rules[name] for name in rules if name in keep}


def _finalize(
    rules: dict[str, Expr],
    start: str,
    library: set[str],
    origins: Mapping[str, str],
    known: Set[str] = frozenset(),
    deferred: Mapping[str, object] | None = None,
) -> dict[str, Expr]:
    """The grammar's rules less those that cannot complete or that ``start`` never reaches; an alias cycle is
    refused with a :class:`JsonSchemaError` at the pointer ``origins`` gives its rule. The ``library`` rules (see
    :attr:`~constrain.compilers.json_schema.compiler._Compiler.library`) are productive and free of alias cycles,
    so only the schema's own rules are analysed.

    The rules in ``known`` (a grammar's, when a deferred rule ``start`` is written for it) and those ``deferred``
    (certified, and written later) are productive and left out: only the rules ``start`` reaches past them are
    returned."""
    outside = _Outside(start, known, deferred) if known or deferred else frozenset()
    refs: dict[str, tuple[str, ...]] = {}  # each reachable rule's calls, found by _reachable
    # first: branches inline their options' bodies, often leaving those unused
    rules = _reachable(rules, start, refs, outside)
    # A rule whose calls are all productive is: calls are counted down, so most rules are settled without a walk.
    # The others (recursions, calls of unproductive or undefined rules) are walked, and walked again only when a
    # rule they call turns out productive.
    ok = {name for name in rules if name in library}
    if known or deferred:
        ok.update(r for calls in refs.values() for r in calls if r in outside)
    own = [name for name in rules if name not in ok]
    callers: dict[str, list[str]] = defaultdict(list)
    waiting: dict[str, int] = {}
    for name in own:
        pending = [r for r in refs[name] if r not in ok]
        waiting[name] = len(pending)
        for r in pending:
            callers[r].append(name)
    work: list[str] = []

    def settle(name: str) -> None:
        ok.add(name)
        stack = [name]
        while stack:
            for caller in callers[stack.pop()]:
                waiting[caller] -= 1
                if caller in ok:
                    continue
                if waiting[caller] == 0:
                    ok.add(caller)
                    stack.append(caller)
                else:
                    work.append(caller)

    for name in own:
        if not waiting[name] and name not in ok:
            settle(name)
    work.extend(name for name in own if name not in ok)
    while work:
        name = work.pop()
        if name not in ok and _productive(rules[name], ok):
            settle(name)
    if start not in ok:
        raise _Unsatisfiable(
            "unsatisfiable: no finite JSON value satisfies the schema (every value needs a recursion that never ends)",
            "",
        )
    pruned: dict[str, Expr] = {}
    prune_memo: dict[int, Expr | None] = {}
    changed = False  # whether a rule or a call was dropped: only then can a rule have become unreachable
    for name, body in rules.items():
        if name in ok:
            pruned[name] = body if ok.issuperset(refs[name]) else _prune(body, ok, prune_memo)
            if pruned[name] is not body:
                refs[name] = calls_of(pruned[name])
                changed = True
        else:
            changed = True
    rules = pruned
    # An alias cycle (A = B | x, B = A | y) is a schema applied to the same value again through references and
    # branches: a validator follows it forever, so no value can be shown valid.
    alias_edges: dict[str, set[str]] = {}
    for name, body in rules.items():
        if name in library:
            continue
        if type(body) is Ref:
            targets = {body.rule}
        elif type(body) is Alt:
            targets = {o.rule for o in body.items if type(o) is Ref}
        else:
            continue  # no alias edge (most rules): on no cycle
        targets = {t for t in targets if t in rules and t not in library}
        if targets:
            alias_edges[name] = targets
    for comp in _sccs(_cyclic_part(alias_edges)) if alias_edges else ():
        name = min(comp)
        if len(comp) > 1 or name in alias_edges.get(name, ()):
            raise JsonSchemaError(
                "its references lead back to it, through branches, without descending into the value: a validator "
                "never finishes",
                origins.get(name, ""),
            )
    return _reachable(rules, start, refs, outside) if changed else rules


class _Outside:
    """The rules a fragment's clean-up leaves out: those ``known`` or ``deferred``, other than its ``start``. A view,
    not a copy: ``known`` holds every rule a pushdown has."""

    __slots__ = ("start", "known", "deferred")

    def __init__(self, start: str, known: Set[str], deferred: Mapping[str, object] | None):
        self.start, self.known, self.deferred = start, known, deferred or {}

    def __contains__(self, name: object) -> bool:
        return name != self.start and (name in self.known or name in self.deferred)


def _cyclic_part(graph: Mapping[str, Collection[str]]) -> dict[str, Collection[str]]:
    """``graph`` without the nodes that reach no cycle (a node reaching none is on none): almost every grammar
    has no alias cycle, and this is cheaper than finding the components. A target that is not a key of ``graph``
    has no edge out; each node's targets are distinct."""
    out_degree = {name: len(targets) for name, targets in graph.items()}
    sources: dict[str, list[str]] = defaultdict(list)
    sinks: set[str] = set()
    for name, targets in graph.items():
        for target in targets:
            sources[target].append(name)
            if target not in graph:
                sinks.add(target)
    work = list(sinks)
    work.extend(name for name, degree in out_degree.items() if degree == 0)
    while work:
        for source in sources[work.pop()]:
            out_degree[source] -= 1
            if out_degree[source] == 0:
                work.append(source)
    return {name: targets for name, targets in graph.items() if out_degree[name]}


def _sccs(graph: Mapping[str, Collection[str]]) -> list[set[str]]:
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on: set[str] = set()
    stack: list[str] = []
    out: list[set[str]] = []
    counter = [0]
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph.get(root, ()))))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            advanced = False
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                    advanced = True
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = set()
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.add(w)
                    if w == v:
                        break
                out.append(comp)
    return out
