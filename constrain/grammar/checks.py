"""Checks of a grammar's rules before they run: every rule can complete, and no rule is left-recursive.

A rule that can never complete or a left-recursive cycle would make a matcher loop or die without a token to
blame, so such grammars are refused when the pushdown is built, with the rule's name. A rule that calls others is
checked on its body (the IR), since a pushdown built lazily has not determinised it yet; a call-free rule (a
regex, a set of literals), on its DFA, which is always built.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

import numpy as np

from constrain.errors import GrammarError
from constrain.grammar.ir import Alt, Expr, Literal, Pushdown, Ref, Repeat, Seq, calls_of


class RuleChecks:
    """What the checks found per rule, kept so that rules added later (a grammar's deferred rules written when a
    matcher reaches them) are checked against the rules already there."""

    __slots__ = ("nullable", "first_calls")

    def __init__(self) -> None:
        #: Per rule: whether it can complete without reading a byte.
        self.nullable: list[bool] = []
        #: Per rule: the rules it can call before reading a byte.
        self.first_calls: list[list[int]] = []


def check_rules(
    pushdown: Pushdown,
    bodies: Sequence[Expr | None],
    index: Mapping[str, int],
    rules: Sequence[int] | None = None,
    checked: RuleChecks | None = None,
    settled: Collection[int] = (),
) -> RuleChecks:
    """Refuse ``pushdown`` (whose calling rules have ``bodies``, their calls numbered by ``index``) when a rule can
    never complete, else when a rule can call itself before reading a byte; returns what was found.

    ``rules``: the rules to check (default all); the others passed before, with what ``checked`` holds of them.
    A rule whose body is None is deferred: it is taken to complete, to read a byte before it does, and to call no
    rule first, which its writer certified and the check of its body confirms once it is written. The rules in
    ``settled`` (see :attr:`~constrain.grammar.ir.Grammar.settled`) are taken to complete and to read a byte
    first, and no cycle of calls before a byte can pass through them, as their writer vouched."""
    checked = checked if checked is not None else RuleChecks()
    count, before = len(bodies), len(checked.nullable)
    rules = list(range(count)) if rules is None else list(rules)
    # deferred rules are taken as certified, settled ones as vouched for
    written = [i for i in rules if bodies[i] is not None and i not in settled]
    checked.nullable.extend([False] * (count - before))
    checked.first_calls.extend([] for _ in range(count - before))
    todo = set(written)
    callees = {i: {index[name] for name in calls_of(bodies[i])} if pushdown.calling[i] else () for i in written}
    productive = _fixpoint(pushdown, bodies, index, callees, [i not in todo for i in range(count)], empty=False)
    failed = [pushdown.names[i] for i in written if not productive[i]]
    if failed:
        raise GrammarError(f"these rules can never complete (each needs itself or another such rule): {failed}")
    nullable = [checked.nullable[i] and i not in todo for i in range(count)]
    nullable = _fixpoint(pushdown, bodies, index, callees, nullable, empty=True)
    for i in written:
        if nullable[i] and i < before:
            raise GrammarError(f"the deferred rule {pushdown.names[i]!r} can complete without reading a byte")
        checked.nullable[i] = nullable[i]
        found: dict[int, None] = {}
        if pushdown.calling[i]:
            _first_calls(bodies[i], nullable, index, found, {})
        checked.first_calls[i] = list(found)
    state = [0] * count  # 0 unvisited, 1 on the path, 2 done
    for i in written:
        if state[i] == 0:
            _visit_first_calls(i, [i], checked.first_calls, state, pushdown.names)
    return checked


def _fixpoint(
    pushdown: Pushdown,
    bodies: Sequence[Expr | None],
    index: Mapping[str, int],
    callees: Mapping[int, Collection[int]],
    done: list[bool],
    *,
    empty: bool,
) -> list[bool]:
    """Which rules can complete (``empty``: without reading a byte): the least fixpoint over the calls of the
    rules in ``callees`` (each with the rules it calls), the others settled as ``done`` says (which is updated and
    returned).

    A call-free rule answers from its DFA. A calling rule completes as soon as all its callees do (every
    expression with completing leaves does), so with bytes allowed most rules are settled by counting callees
    down; the others (recursions, and every rule when no byte may be read) are evaluated on their body, again
    only when one of their callees turns out to complete."""
    count = len(done)
    callers: list[list[int]] = [[] for _ in range(count)]
    waiting = [0] * count  # callees not known to complete yet
    for i, called in callees.items():
        if done[i] or not called:
            continue
        pending = [callee for callee in called if not done[callee]]
        waiting[i] = len(pending)
        for callee in pending:
            callers[callee].append(i)
    work: list[int] = []
    queued = [False] * count

    def settle(i: int) -> None:
        done[i] = True
        stack = [i]
        while stack:
            for caller in callers[stack.pop()]:
                waiting[caller] -= 1
                if done[caller]:
                    continue
                if not empty and waiting[caller] == 0:
                    done[caller] = True
                    stack.append(caller)
                elif not queued[caller]:
                    queued[caller] = True
                    work.append(caller)

    for i in callees:
        if done[i]:
            continue
        if not pushdown.calling[i]:
            dfa = pushdown.rule(i)
            if bool(dfa.accepting[0]) if empty else dfa.reaches_acceptance(_NO_CALLS, byte_edges=True):
                settle(i)
        elif not queued[i]:
            queued[i] = True
            work.append(i)
    while work:
        i = work.pop()
        queued[i] = False
        if not done[i] and _completes(bodies[i], done, index, empty, {}):
            settle(i)
    return done


_NO_CALLS = np.zeros(0, dtype=bool)
_NO_CALLS.flags.writeable = False


def _completes(expr: Expr, done: list[bool], index: Mapping[str, int], empty: bool, memo: dict[int, bool]) -> bool:
    """Whether ``expr`` matches some text (``empty``: the empty text) when the rules in ``done`` can complete."""
    kind = type(expr)
    if kind is Ref:
        return done[index[expr.rule]]
    if kind is Literal:
        return not (empty and expr.value)
    if kind is not Seq and kind is not Alt and kind is not Repeat:
        return not empty  # a terminal left in a calling rule: built as a call-free rule's would be
    hit = memo.get(id(expr))
    if hit is None:
        if kind is Seq:
            hit = all(_completes(x, done, index, empty, memo) for x in expr.items)
        elif kind is Alt:
            hit = any(_completes(x, done, index, empty, memo) for x in expr.items)
        else:
            hit = expr.min == 0 or expr.max == 0 or _completes(expr.item, done, index, empty, memo)
        memo[id(expr)] = hit
    return hit


def _first_calls(
    expr: Expr, nullable: list[bool], index: Mapping[str, int], out: dict[int, None], memo: dict[int, bool]
) -> bool:
    """Add to ``out`` the rules ``expr`` can call before reading a byte; returns whether ``expr`` can match the
    empty text (when the rules in ``nullable`` can)."""
    kind = type(expr)
    if kind is Ref:
        rule = index[expr.rule]
        out[rule] = None
        return nullable[rule]
    if kind is Literal:
        return not expr.value
    if kind is not Seq and kind is not Alt and kind is not Repeat:
        return False
    hit = memo.get(id(expr))
    if hit is None:
        if kind is Seq:
            hit = True
            for item in expr.items:
                if not _first_calls(item, nullable, index, out, memo):
                    hit = False
                    break
        elif kind is Alt:
            hit = False
            for item in expr.items:
                hit = _first_calls(item, nullable, index, out, memo) or hit
        elif expr.max == 0:
            hit = True
        else:
            hit = _first_calls(expr.item, nullable, index, out, memo) or expr.min == 0
        memo[id(expr)] = hit
    return hit


def _visit_first_calls(i: int, path: list[int], first_calls: list[list[int]], state: list[int], names) -> None:
    """Depth-first search of the rules callable before a byte is read, from rule ``i`` (reached along ``path``);
    raises on a cycle."""
    state[i] = 1
    for j in first_calls[i]:
        if state[j] == 1:
            cycle = path[path.index(j) :] + [j]
            raise GrammarError("left recursion: " + " -> ".join(names[k] for k in cycle) + " reads no byte first")
        if state[j] == 0:
            _visit_first_calls(j, path + [j], first_calls, state, names)
    state[i] = 2
