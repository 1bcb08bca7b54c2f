"""Checks of a built pushdown automaton: every rule can complete, and no rule is left-recursive.

A rule that can never complete or a left-recursive cycle would make a matcher loop or die without a token to
blame, so such grammars are refused at build time with the rule's name.
"""

from __future__ import annotations

import numpy as np

from constrain.automata.dfa import ByteDFA
from constrain.errors import GrammarError
from constrain.grammar.ir import Pushdown


def _completing_rules(rules: tuple[ByteDFA, ...], byte_edges: bool) -> np.ndarray:
    """Which rules can complete (reach acceptance from their start) through calls of rules that can, and, when
    ``byte_edges``, byte edges: the least fixpoint.

    A rule DFA with calls comes out of determinisation trimmed (every state lies on a path to acceptance), so
    with byte edges it completes as soon as all its callees do: callees are counted down and most rules are
    settled without a search. Without byte edges, a rule whose start makes no call completes only if its start
    accepts. The rest (recursions, and rules with a callee that cannot complete) are searched, each looked at
    again only when one of its callees turns out to complete."""
    done = [False] * len(rules)  # a list, not an array: it is read and written an element at a time
    callers: list[list[int]] = [[] for _ in rules]
    waiting = [0] * len(rules)  # callees not known to complete yet
    for i, dfa in enumerate(rules):
        callees = set(dfa.callees)
        waiting[i] = len(callees)
        for callee in callees:
            callers[callee].append(i)

    work: list[int] = []  # rules to search again: a callee of theirs turned out to complete
    queued = [False] * len(rules)

    def settle(i: int) -> None:
        done[i] = True
        stack = [i]
        while stack:
            for caller in callers[stack.pop()]:
                waiting[caller] -= 1
                if done[caller]:
                    continue
                if byte_edges and waiting[caller] == 0:
                    done[caller] = True
                    stack.append(caller)
                elif not queued[caller]:
                    queued[caller] = True
                    work.append(caller)

    for i, dfa in enumerate(rules):
        if done[i]:
            continue
        if not dfa.callees:
            completes = dfa.reaches_acceptance(_NO_CALLS, byte_edges=byte_edges)
        elif not byte_edges and dfa.calls[0].max() < 0:
            completes = bool(dfa.accepting[0])
        else:
            if not queued[i]:
                queued[i] = True
                work.append(i)
            continue
        if completes:
            settle(i)
    while work:
        i = work.pop()
        queued[i] = False
        dfa = rules[i]
        if not done[i]:
            usable = np.array([done[callee] for callee in dfa.callees], dtype=bool)
            if dfa.reaches_acceptance(usable, byte_edges=byte_edges):
                settle(i)
    return np.array(done, dtype=bool)


_NO_CALLS = np.zeros(0, dtype=bool)
_NO_CALLS.flags.writeable = False


def _check_productive(pushdown: Pushdown) -> None:
    productive = _completing_rules(pushdown.rules, byte_edges=True)
    if not productive.all():
        names = [pushdown.names[i] for i in np.flatnonzero(~productive)]
        raise GrammarError(f"these rules can never complete (each needs itself or another such rule): {names}")


def _check_left_recursion(pushdown: Pushdown) -> None:
    rules = pushdown.rules
    # A rule completes without a byte only if some rule's start accepts (the shortest such completion calls
    # none): in most grammars (a JSON value is never empty) none does, and the search is not needed.
    if any(dfa.accepting[0] for dfa in rules):
        nullable = _completing_rules(rules, byte_edges=False)
    else:
        nullable = np.zeros(len(rules), dtype=bool)
    # Rules callable before any byte is read, from each rule's start.
    first_calls: list[set[int]] = []
    for dfa in rules:
        if not dfa.callees:
            first_calls.append(set())
            continue
        calls: set[int] = set()
        seen, stack = {0}, [0]
        while stack:
            s = stack.pop()
            for callee, t in zip(dfa.callees, dfa.calls[s].tolist()):
                if t < 0:
                    continue
                calls.add(callee)
                if nullable[callee] and t not in seen:
                    seen.add(t)
                    stack.append(t)
        first_calls.append(calls)
    state = [0] * len(rules)  # 0 unvisited, 1 on the path, 2 done
    for i in range(len(rules)):
        if state[i] == 0:
            _visit_first_calls(i, [i], first_calls, state, pushdown.names)


def _visit_first_calls(i: int, path: list[int], first_calls: list[set[int]], state: list[int], names) -> None:
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
