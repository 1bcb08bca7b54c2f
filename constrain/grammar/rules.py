"""A grammar compiled to a pushdown automaton: one small byte DFA per rule, with call edges.

Every structure compiler (JSON Schema, Lark, GBNF, tools) lowers to a :class:`Grammar`: named rules whose bodies
combine terminals (literal bytes, regexes) with sequences, alternatives, repetitions and references to other
rules. :func:`build_pushdown` builds each rule's NFA (terminals expand to byte paths, references stay *calls*),
then determinises and minimises it. Recursion (nested JSON, ``$ref`` cycles, arithmetic) therefore stays a call
on a stack instead of exploding into one huge automaton, and the automata of shared pieces (a JSON string body)
are shared by every place that uses them.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable, Mapping
from contextlib import nullcontext
from dataclasses import replace

from constrain.automata.dfa import ByteDFA, words_dfa
from constrain.automata.limits import (
    AUTOMATON_CACHE_BYTES,
    MAX_GRAMMAR_RULES,
    MAX_NFA_STATES,
    RULE_CACHE_BYTES,
    check_deadline,
    compile_clock,
    seconds_allowed,
)
from constrain.automata.limits import deadline as deadline_of
from constrain.automata.nfa import ByteNFA, determinize_arrays
from constrain.automata.regex import add_regex
from constrain.cache import BoundedCache, memoized
from constrain.errors import AutomatonTooLarge, CompileTimeout, GrammarError
from constrain.grammar.checks import check_rules
from constrain.grammar.ir import (
    Alt,
    Automaton,
    Expr,
    Grammar,
    Literal,
    Pushdown,
    Ref,
    Regex,
    Repeat,
    Seq,
    Token,
    TokensExcept,
    _CachedHash,
    _has_terminals,
    calls_of,
    collect_refs,
)
from constrain.grammar.thompson import (
    ALT_TAG,
    CALL_TAG,
    LITERAL_TAG,
    REPEAT_TAG,
    SEQ_TAG,
    SHARED_ALT_TAG,
    SHARED_SEQ_TAG,
    TOO_MANY_COPIES,
    flat_body,
    thompson_nfa,
)


def build_pushdown(grammar: Grammar, *, deadline: float | None = None, lazy: bool = False) -> Pushdown:
    """Compile ``grammar`` to a :class:`Pushdown`, refusing undefined rules, rules that can never complete and
    left recursion (which a pushdown walk cannot close over) with a :class:`GrammarError` naming the rule.
    ``deadline`` (a :func:`~constrain.automata.limits.compile_clock` value) refuses a grammar whose automata are still
    being built then.

    ``lazy`` determinises only the start rule, the call-free rules (terminals, where automata can grow large:
    mostly shared and cached) but an :class:`Automaton` to be built later, and the rules whose NFA could pass
    :data:`EAGER_NFA_STATES` now; every other rule is determinised when a matcher first calls it
    (:meth:`Pushdown.rule`), so a compile pays only for the rules its first masks reach, and what is too large is
    still refused at compile time. A rule built later may take as long
    as the compile was allowed (``deadline``, or the time limit in force). The checks do not need those DFAs: they
    read the rules' bodies.

    The grammar's deferred rules (:attr:`Grammar.deferred`) are written the same way, when a matcher first calls
    them: the rules each brings are added to the pushdown (:meth:`Pushdown.extend`) and checked against those there
    (:func:`~constrain.grammar.checks.check_rules`)."""
    if grammar.start not in grammar.rules:
        raise GrammarError(f"the start rule {grammar.start!r} is not defined")
    if len(grammar.rules) > MAX_GRAMMAR_RULES:
        raise GrammarError(
            f"the grammar has {len(grammar.rules):,} rules, more than MAX_GRAMMAR_RULES = {MAX_GRAMMAR_RULES:,}"
        )
    if grammar.deferred and grammar.write_later is None:
        raise GrammarError("a grammar with deferred rules needs write_later")
    hoisted = _hoist_terminals(grammar)
    settled = _still_settled(grammar, hoisted)
    grammar = hoisted
    alias = _aliases(grammar.rules)
    start = alias.get(grammar.start, grammar.start)
    names = [start] + sorted(n for n in grammar.rules if n != start and n not in alias)
    names.extend(sorted(grammar.deferred))
    index = {name: i for i, name in enumerate(names)}
    index.update((name, index[target]) for name, target in alias.items())
    bodies: list[Expr | None] = [grammar.rules.get(name) for name in names]
    calling = [body is None or bool(calls_of(body)) for body in bodies]
    _check_calls(names, bodies, range(len(names)), index)
    origins = dict(grammar.origins)  # the rules written later add theirs
    # The rules still to write, and what writes them: dropped once none is left (it holds its compiler).
    unwritten = {index[name] for name in grammar.deferred}
    writer = [grammar.write_later]

    def build(i: int) -> ByteDFA:
        if bodies[i] is None:
            write(i)
        return _checked_rule_dfa(bodies[i], names[i], index)

    def write(i: int) -> None:
        """Write deferred rule ``i``: its body, and the rules it brings numbered after those there are."""
        unhoisted = writer[0](names[i], index.keys())
        fragment = _hoist_terminals(unhoisted)
        added = [name for name in fragment.rules if name not in index]
        first = len(names)
        names.extend(added)
        names.extend(sorted(fragment.deferred.difference(index, fragment.rules)))
        index.update((name, k) for k, name in enumerate(names[first:], first))
        unwritten.discard(i)
        unwritten.update(index[name] for name in fragment.deferred)
        if not unwritten:
            writer[0] = None
        bodies[i] = fragment.rules[names[i]]
        bodies.extend(fragment.rules.get(name) for name in names[first:])
        origins.update(fragment.origins)
        new_calling = [body is None or bool(calls_of(body)) for body in bodies[first:]]
        pushdown = owner()  # alive: it is the one asking
        pushdown.calling[i] = bool(calls_of(bodies[i]))  # taken for a calling rule while it was not written
        pushdown.extend(names[first:], new_calling)
        _check_calls(names, bodies, [i, *range(first, len(names))], index)
        vouched = {index[name] for name in _still_settled(unhoisted, fragment)}
        check_rules(pushdown, bodies, index, [i, *range(first, len(names))], checks, vouched)

    with deadline_of(deadline) if deadline is not None else nullcontext():  # else keep a caller's deadline
        allowed = seconds_allowed() if deadline is None else max(0.0, deadline - compile_clock())
        memo: dict[int, int] = {}

        def eager(i: int, body: Expr) -> bool:
            check_deadline()  # a grammar of tens of thousands of rules takes a good part of a second here
            if not lazy or i == 0 or (not calling[i] and not (type(body) is Automaton and not body.built)):
                return True
            return _nfa_bound(body, memo) > EAGER_NFA_STATES

        rules = [None if body is None else build(i) if eager(i, body) else None for i, body in enumerate(bodies)]

    def build_later(i: int) -> ByteDFA:
        """Rule ``i``'s DFA, built when a matcher first reaches it: its refusal says where the rule came from."""
        try:
            with deadline_of(compile_clock() + allowed) if allowed is not None else nullcontext():
                return build(i)
        except (AutomatonTooLarge, CompileTimeout) as exc:
            origin = origins.get(names[i])
            if origin is None:
                raise
            raise type(exc)(f"{exc} (the rule comes from {origin or '/'})", rule=exc.rule, origin=origin) from None

    pushdown = Pushdown(names, rules, calling=calling, build=build_later)
    checks = check_rules(pushdown, bodies, index, settled={index[name] for name in settled})
    owner = weakref.ref(pushdown)  # not the pushdown itself: it holds these functions, and a cycle waits for the GC
    return pushdown


def _check_calls(names: list[str], bodies: list[Expr | None], rules: Iterable[int], index: Mapping[str, int]) -> None:
    """Refuse a call of ``rules`` to a rule that is not defined."""
    for i in rules:
        if bodies[i] is not None:
            for callee in calls_of(bodies[i]):
                if callee not in index:
                    raise GrammarError(f"rule {names[i]!r} refers to the undefined rule {callee!r}")


#: A lazy build determinises at compile time a rule whose Thompson NFA could have more states than this (by
#: :func:`_nfa_bound`): a large counted array, say, is then refused or paid for within the compile's time limit,
#: not in a mask. Over the calling rules of 400 dev-set schemas, 4 of 5,698 pass it (their NFAs have at most
#: 5,000 states; the bound counts a shared member once per place it is read).
EAGER_NFA_STATES = 20_000


def _nfa_bound(expr: Expr, memo: dict[int, int]) -> int:
    """At least as many states as the Thompson construction of ``expr`` (:func:`_build`) makes, found without
    making them; ``memo`` holds composite nodes already counted, by identity."""
    kind = type(expr)
    if kind is Literal:
        value = expr.value
        return (len(value.encode()) if isinstance(value, str) else len(value)) + 1
    if kind is Ref:
        return 1
    if kind is Regex:
        return 1 + terminal_dfa(expr.pattern).num_states
    if kind is Automaton:
        return 1 + expr.bound
    found = memo.get(id(expr))
    if found is None:
        if kind is Repeat:
            copies = expr.min + 1 if expr.max is None else expr.max
            found = copies * (_nfa_bound(expr.item, memo) + 2) + 2
        else:
            found = 1
            for item in expr.items:  # calls and literals, most items, counted here rather than by a call each
                item_kind = type(item)
                if item_kind is Ref:
                    found += 1
                elif item_kind is Literal:
                    value = item.value
                    found += (len(value.encode()) if isinstance(value, str) else len(value)) + 1
                else:
                    found += _nfa_bound(item, memo)
        memo[id(expr)] = found
    return found


def _aliases(rules: Mapping[str, Expr]) -> dict[str, str]:
    """The rules whose body is one call (a ``$ref`` alone, a Lark rule ``a: b``), each with the rule its chain of
    such calls ends at: a call to an alias goes straight there, so the alias needs neither a DFA nor a stack frame.
    A cycle of aliases is left to the productivity check, which refuses it."""
    direct = {name: body.rule for name, body in rules.items() if isinstance(body, Ref) and body.rule in rules}
    out: dict[str, str] = {}
    for name, target in direct.items():
        seen = {name}
        while target in direct and target not in seen:
            seen.add(target)
            target = direct[target]
        if target not in direct:
            out[name] = target
    return out


def _checked_rule_dfa(body: Expr, name: str, index: Mapping[str, int]) -> ByteDFA:
    """Rule ``name``'s DFA with its calls numbered by ``index``; errors name the rule."""
    try:
        dfa, called = _rule_dfa(body)
    except GrammarError as exc:
        raise GrammarError(f"rule {name!r} {exc}") from None
    except CompileTimeout:
        raise CompileTimeout(f"building the automata ran past the time limit (at rule {name!r})", rule=name) from None
    except AutomatonTooLarge as exc:
        raise AutomatonTooLarge(f"rule {name!r}: {exc}", rule=name) from None
    except RecursionError:
        raise GrammarError(f"rule {name!r} nests too deeply to compile") from None
    if not dfa.callees:
        return dfa  # the shared object itself, with what it keeps (language hashes, acceptance)
    return dfa.with_callees(tuple(index[called[k]] for k in dfa.callees))


def _still_settled(grammar: Grammar, hoisted: Grammar) -> list[str]:
    """The rules of ``grammar.settled`` that hoisting its terminals left as they were (a hoisted terminal is a
    rule its writer did not vouch for)."""
    return [name for name in grammar.settled if hoisted.rules.get(name) is grammar.rules.get(name) is not None]


def _hoist_terminals(grammar: Grammar) -> Grammar:
    """Move every regex terminal of a rule that calls other rules into a rule of its own.

    A regex (a string body, a number) is where a rule reads widely; as its own call-free rule its states are
    lexical, so their walks are shared by every structure over the vocabulary (see
    :class:`~constrain.runtime.lexical.LexicalMasks`), and the calling rule itself reads only its literals.
    """
    rules = dict(grammar.rules)
    hoisted: dict[str, Expr] = {}
    for name, body in grammar.rules.items():
        if calls_of(body) and _has_terminals(body):  # both kept on the body: usually known already
            rules[name], terminals = _hoisted(body)
            hoisted.update(terminals)
    if not hoisted:
        return grammar
    for name, body in hoisted.items():
        rules.setdefault(name, body)
    return replace(grammar, rules=rules)


def _hoisted(expr: Expr) -> tuple[Expr, tuple[tuple[str, Expr], ...]]:
    """``expr`` with its terminals replaced by calls, and those terminals by the rule names the calls use. The
    same object when it has none (what it keeps about itself, its rule DFA among them, stays with it); kept on a
    composite expression, as its calls are (:func:`calls_of`), since the rules every schema shares are the same
    objects."""
    if isinstance(expr, (Regex, Automaton)):
        name = f"regex {expr.pattern!r}" if isinstance(expr, Regex) else f"automaton {expr._key.hex()}"
        return Ref(name), ((name, expr),)
    if not isinstance(expr, (Seq, Alt, Repeat)):
        return expr, ()
    cached = getattr(expr, "_hoisted", None)
    if cached is None:
        parts = [_hoisted(item) for item in ((expr.item,) if isinstance(expr, Repeat) else expr.items)]
        terminals: dict[str, Expr] = {}
        for _, found in parts:
            terminals.update(found)
        if not terminals:
            cached = _NOTHING_HOISTED  # not (expr, ()): a node that refers to itself lives until a collection
        elif isinstance(expr, Repeat):
            cached = (Repeat(parts[0][0], expr.min, expr.max), tuple(terminals.items()))
        else:
            cached = (type(expr)(tuple(part for part, _ in parts)), tuple(terminals.items()))
        object.__setattr__(expr, "_hoisted", cached)
    return (expr, ()) if cached is _NOTHING_HOISTED else cached


_NOTHING_HOISTED = (None, ())


#: Rule DFAs by body (:func:`_body_key`), shared by every grammar built in this process.
_RULE_DFAS = BoundedCache(RULE_CACHE_BYTES)  # a rule DFA is built again in a tenth of a millisecond


def _rule_dfa(body: Expr) -> tuple[ByteDFA, tuple[str, ...]]:
    """A rule body's DFA, its call columns naming rules by position in the returned names. Cached per process by
    the body itself: the pieces every JSON schema shares (a value, an object of anything) are built once. The
    arrays are shared, so they are made read-only."""
    if isinstance(body, Automaton):
        return body.dfa, ()
    kept = getattr(body, "_dfa", None) if isinstance(body, _CachedHash) else None
    if kept is not None:  # a body met before in this process (a shared rule's): no hash, no lookup
        return kept
    try:
        key = _body_key(body)
        cached = _RULE_DFAS.get(key)
    except TypeError:  # an unhashable body (a list where a tuple belongs): build it, uncached
        return _build_rule_dfa(body)
    if cached is None:
        cached = _build_rule_dfa(body, key)
        dfa = cached[0]
        _RULE_DFAS.put(key, cached, dfa.trans.nbytes + dfa.calls.nbytes + dfa.accepting.nbytes + _key_bytes(key))
    if isinstance(body, _CachedHash):
        object.__setattr__(body, "_dfa", cached)
    return cached


#: Per leaf kind but literals and calls (the commonest, keyed first): its tag in a body's key, and its value's field.
_LEAVES = {Regex: ("X", "pattern"), Token: ("T", "ref"), TokensExcept: ("E", "refs")}


def _body_key(body: Expr) -> tuple:
    """``body`` as the rule DFA cache's key: its composite nodes in post-order, each a tuple of its kind's tag (the
    tags :mod:`~constrain.grammar.thompson` reads) and its parts (a child composite by its place in the list, a leaf
    as a tuple of its tag and value), a node the body reaches more than once listed once, a sequence or alternative
    marked :func:`shared` tagged as shared (the NFA built from the key builds it once per target state). Equal keys
    are equal bodies. A key holds only tuples, strings, bytes and numbers, which the garbage collector stops
    tracking, so the cache does not keep every compiled schema's expression trees alive for each later full
    collection to walk."""
    nodes: list[tuple] = []
    root = _key_part(body, nodes, {})
    return tuple(nodes) if nodes else (root,)


def _key_bytes(key: tuple) -> int:
    """About what a body's key holds, in bytes: 64 a part (a leaf's tuple and its value, or a child's number)."""
    return 64 * (len(key) + sum(map(len, key)))


def _key_part(expr: Expr, nodes: list[tuple], numbered: dict[int, int]) -> int | tuple:
    """``expr``'s part in its parent's key (see :func:`_body_key`), its composites added to ``nodes``."""
    kind = type(expr)
    if kind is Literal:
        return (LITERAL_TAG, expr.value)
    if kind is Ref:
        return (CALL_TAG, expr.rule)
    if kind is Seq or kind is Alt or kind is Repeat:
        at = numbered.get(id(expr))
        if at is None:
            if kind is Repeat:
                node = (REPEAT_TAG, expr.min, expr.max, _key_part(expr.item, nodes, numbered))
            else:
                tags = (SEQ_TAG, SHARED_SEQ_TAG) if kind is Seq else (ALT_TAG, SHARED_ALT_TAG)
                tag = tags[getattr(expr, "_shared", False)]
                node = (tag, *[_key_part(item, nodes, numbered) for item in expr.items])
            at = numbered[id(expr)] = len(nodes)
            nodes.append(node)
        return at
    if kind is Automaton:
        return ("A", expr._key)
    leaf = _LEAVES.get(kind)
    if leaf is None:
        raise TypeError(f"not an expression: {expr!r}")
    return (leaf[0], getattr(expr, leaf[1]))


def _build_rule_dfa(body: Expr, key: tuple | None = None) -> tuple[ByteDFA, tuple[str, ...]]:
    """``body``'s DFA and the rules its call columns name. A body of literals and calls whose cache ``key``
    (:func:`_body_key`) is given has its NFA built by a kernel from that key (:mod:`~constrain.grammar.thompson`);
    any other, node by node here (:func:`_build`)."""
    if type(body) is Alt and body.items and all(type(item) is Literal for item in body.items):  # an enum, a choice
        dfa = words_dfa([_literal_bytes(item) for item in body.items])
        for array in (dfa.trans, dfa.accepting, dfa.calls):
            array.flags.writeable = False
        return dfa, ()
    called: dict[str, int] = {}
    collect_refs(body, called)
    program = None if key is None else flat_body(key, called)
    if program is not None:
        check_deadline()
        status, size, byte_edges, epsilons, calls, copies = thompson_nfa(*program, MAX_NFA_STATES)
        if status == TOO_MANY_COPIES:
            raise AutomatonTooLarge(f"repeats {copies:,} times, more states than MAX_NFA_STATES = {MAX_NFA_STATES:,}")
        if status:
            raise AutomatonTooLarge(f"the automaton needs more than {MAX_NFA_STATES:,} NFA states")
        dfa = determinize_arrays(byte_edges, epsilons, calls, None, size, 0, 1)
    else:
        nfa = ByteNFA()
        start, accept = nfa.new_state(), nfa.new_state()
        _build(nfa, body, start, accept, called, {})
        dfa = nfa.determinize(start, accept)
    for array in (dfa.trans, dfa.accepting, dfa.calls):
        array.flags.writeable = False
    return dfa, tuple(called)


def _build(
    nfa: ByteNFA, expr: Expr, src: int, dst: int, index: Mapping[str, int], suffixes: dict, entered: bool = False
) -> None:
    """Thompson construction of one rule body; errors are completed with the rule's name by the caller.

    ``suffixes`` maps (the remaining items of a sequence, its target state) to the state where they were built:
    a sequence ending in items already built toward the same target joins them instead of copying them. This
    keeps "any ordered subset of these members" (a JSON object's optional properties, each option continuing
    with the rest) linear in size, and so its subset construction. It also maps (a :func:`shared` expression,
    its target) to the state it was built from: an object's member, read first in one option and after a comma
    in the others, is built once, so the subset construction meets each of its states once instead of making a
    copy of each that minimisation then merges (a third of all subsets, over a sample of real schemas).

    Literals and calls, most of a rule's leaves, are added where their sequence or alternative meets them rather
    than through a call of this function each. A body of literals and calls alone is built by the kernel of
    :mod:`~constrain.grammar.thompson` instead, which joins states the same way; this construction remains for
    bodies that read terminals or tokens, and for bodies that cannot be keyed."""
    kind = type(expr)
    if not entered and (kind is Seq or kind is Alt) and getattr(expr, "_shared", False):
        # built once toward ``dst``, from a state of its own that every way in reaches by an epsilon
        key = (id(expr), dst)
        entry = suffixes.get(key)
        if entry is None:
            entry = suffixes[key] = nfa.new_state()
            nfa.add_epsilon(src, entry)
            _build(nfa, expr, entry, dst, index, suffixes, True)
        else:
            nfa.add_epsilon(src, entry)
        return
    if kind is Literal or kind is Ref:
        _add_leaf(nfa, expr, src, dst, index)
    elif kind is Seq:
        items = tuple(expr.items)  # the same tuple; a list (a grammar written by hand) becomes a hashable key
        if not items:
            nfa.add_epsilon(src, dst)
        end, entry = len(items), dst
        if len(items) >= 2:
            for j in range(1, len(items)):
                found = suffixes.get((items[j:], dst))
                if found is not None:
                    end, entry = j, found
                    break
        state = src
        for i in range(end):
            if i == end - 1:
                nxt = entry
            else:
                # a state only the rest of this sequence leaves: where a later sequence with that rest may join
                nxt = nfa.new_state()
                if len(items) >= 2:
                    suffixes[(items[i + 1 :], dst)] = nxt
            item = items[i]
            if type(item) is Literal or type(item) is Ref:
                _add_leaf(nfa, item, state, nxt, index)
            else:
                _build(nfa, item, state, nxt, index, suffixes)
            state = nxt
    elif kind is Alt:
        if not expr.items:
            raise GrammarError("has an alternative with no options")
        for item in expr.items:
            if type(item) is Literal or type(item) is Ref:
                _add_leaf(nfa, item, src, dst, index)
            else:
                _build(nfa, item, src, dst, index, suffixes)
    elif kind is Repeat:
        if expr.min < 0 or (expr.max is not None and expr.max < expr.min):
            raise GrammarError(f"repeats between {expr.min} and {expr.max} times")
        copies = expr.min if expr.max is None else expr.max
        if copies - 1 > MAX_NFA_STATES - nfa.size:  # each copy but the last makes a state: known before any is made
            raise AutomatonTooLarge(f"repeats {copies:,} times, more states than MAX_NFA_STATES = {MAX_NFA_STATES:,}")
        state = src
        for _ in range(expr.min):
            nxt = nfa.new_state()
            _build(nfa, expr.item, state, nxt, index, suffixes)
            state = nxt
        if expr.max is None:
            loop = nfa.new_state()
            nfa.add_epsilon(state, loop)
            back = nfa.new_state()
            _build(nfa, expr.item, loop, back, index, suffixes)
            nfa.add_epsilon(back, loop)
            nfa.add_epsilon(loop, dst)
            return
        for i in range(expr.max - expr.min, 0, -1):
            nfa.add_epsilon(state, dst)
            # the last optional copy ends at ``dst`` itself: a shared item in it is then built toward the same
            # target wherever else it is read (an object's optional member, read first or after a comma)
            nxt = dst if i == 1 else nfa.new_state()
            _build(nfa, expr.item, state, nxt, index, suffixes)
            state = nxt
        if state != dst:
            nfa.add_epsilon(state, dst)
    elif kind is Regex:
        nfa.add_dfa(terminal_dfa(expr.pattern), src, dst)
    elif kind is Automaton:
        nfa.add_dfa(expr.dfa, src, dst)
    else:
        raise GrammarError(f"contains {expr!r}, which is not a grammar expression")


def _add_leaf(nfa: ByteNFA, leaf: Literal | Ref, src: int, dst: int, index: Mapping[str, int]) -> None:
    """A literal's path or a rule's call from ``src`` to ``dst``."""
    if type(leaf) is Ref:
        nfa.add_call(src, index[leaf.rule], dst)
        return
    data = _literal_bytes(leaf)
    if data:
        nfa.add_literal(src, data, dst)
    else:
        nfa.add_epsilon(src, dst)


def _literal_bytes(literal: Literal) -> bytes:
    value = literal.value
    return value.encode() if isinstance(value, str) else bytes(value)


@memoized(AUTOMATON_CACHE_BYTES, lambda dfa, pattern: dfa.nbytes + len(pattern))
def terminal_dfa(pattern: str) -> ByteDFA:
    """A regex terminal's minimal DFA: parsed and determinised once per process (the memo bounded in bytes), then
    spliced (copied) wherever the pattern appears."""
    nfa = ByteNFA()
    start, accept = nfa.new_state(), nfa.new_state()
    add_regex(nfa, pattern, start, accept, anchors=False)
    return nfa.determinize(start, accept)
