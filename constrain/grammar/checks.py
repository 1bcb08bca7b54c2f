"""Checks of a grammar's rules before they run: every rule can complete, and no rule is left-recursive.

A rule that can never complete or a left-recursive cycle would make a matcher loop or die without a token to
blame, so such grammars are refused when the pushdown is built, with the rule's name. A rule that calls others is
checked on its body (the IR), since a pushdown built lazily has not determinised it yet; a call-free rule (a
regex, a set of literals), on its DFA, which is always built.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from constrain.errors import GrammarError
from constrain.grammar.ir import Alt, Expr, Literal, Pushdown, Ref, Repeat, Seq, calls_of


def check_rules(pushdown: Pushdown, bodies: tuple[Expr, ...], index: Mapping[str, int]) -> None:
    """Refuse ``pushdown`` (whose calling rules have ``bodies``, their calls numbered by ``index``) when a rule can
    never complete, else when a rule can call itself before reading a byte."""
    callees = [
        sorted({index[name] for name in calls_of(body)}) if calling else []
        for body, calling in zip(bodies, pushdown.calling)
    ]
    productive = _fixpoint(pushdown, bodies, index, callees, empty=False)
    if not all(productive):
        names = [pushdown.names[i] for i, ok in enumerate(productive) if not ok]
        raise GrammarError(f"these rules can never complete (each needs itself or another such rule): {names}")
    nullable = _fixpoint(pushdown, bodies, index, callees, empty=True)
    first_calls: list[list[int]] = []
    for body, calling in zip(bodies, pushdown.calling):
        found: dict[int, None] = {}
        if calling:
            _first_calls(body, nullable, index, found, {})
        first_calls.append(list(found))
    state = [0] * len(bodies)  # 0 unvisited, 1 on the path, 2 done
    for i in range(len(bodies)):
        if state[i] == 0:
            _visit_first_calls(i, [i], first_calls, state, pushdown.names)


def _fixpoint(
    pushdown: Pushdown, bodies: tuple[Expr, ...], index: Mapping[str, int], callees: list[list[int]], *, empty: bool
) -> list[bool]:
    """Which rules can complete (``empty``: without reading a byte): the least fixpoint over the calls.

    A call-free rule answers from its DFA. A calling rule completes as soon as all its callees do (every
    expression with completing leaves does), so with bytes allowed most rules are settled by counting callees
    down; the others (recursions, and every rule when no byte may be read) are evaluated on their body, again
    only when one of their callees turns out to complete."""
    done = [False] * len(bodies)
    callers: list[list[int]] = [[] for _ in bodies]
    waiting = [len(c) for c in callees]  # callees not known to complete yet
    for i, found in enumerate(callees):
        for callee in found:
            callers[callee].append(i)
    work: list[int] = []
    queued = [False] * len(bodies)

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

    for i, calling in enumerate(pushdown.calling):
        if done[i]:
            continue
        if not calling:
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
