"""Grammar IR -> rule automata: the checks of build_pushdown (undefined rules, left recursion, rules that never
complete) against fixpoints over the IR, calls listed where subtrees are shared, shared members, hoisted
terminals, rule DFAs less some words, and what a pickled expression keeps."""

from __future__ import annotations

import pickle
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from constrain.compilers.json_schema.strings import _key_except_dfa
from constrain.compilers.json_schema.values import _STRING as STRING_PATTERN
from constrain.errors import GrammarError, RegexError
from constrain.grammar.ir import Alt, Automaton, Grammar, Literal, Ref, Regex, Repeat, Seq, calls_of, shared
from constrain.grammar.rules import _rule_dfa, build_pushdown, terminal_dfa
from constrain.runtime.masks import walk_bytes


def test_build_errors_name_the_rule():
    with pytest.raises(GrammarError, match="undefined rule 'nope'"):
        build_pushdown(Grammar({"s": Ref("nope")}, "s"))
    with pytest.raises(GrammarError, match="left recursion"):
        build_pushdown(Grammar({"s": Alt((Seq((Ref("s"), Literal("+"), Literal("1"))), Literal("1")))}, "s"))
    with pytest.raises(GrammarError, match="never complete"):
        build_pushdown(Grammar({"s": Seq((Literal("("), Ref("s"), Literal(")")))}, "s"))
    with pytest.raises(GrammarError, match="start rule"):
        build_pushdown(Grammar({"s": Literal("x")}, "t"))
    with pytest.raises(RegexError, match="anchors"):
        build_pushdown(Grammar({"s": Regex("^x$")}, "s"))


def _ir_fixpoint(rules: dict, base) -> dict[str, bool]:
    """The least fixpoint of ``base`` (Literal -> bool) over the IR: Ref -> the rule's value, Seq -> all,
    Alt -> any, Repeat -> min == 0 or the item."""
    value = dict.fromkeys(rules, False)

    def of(expr) -> bool:
        if isinstance(expr, Literal):
            return base(expr)
        if isinstance(expr, Ref):
            return value[expr.rule]
        if isinstance(expr, Seq):
            return all(map(of, expr.items))
        if isinstance(expr, Alt):
            return any(map(of, expr.items))
        return expr.min == 0 or of(expr.item)

    changed = True
    while changed:
        changed = False
        for name, body in rules.items():
            if not value[name] and of(body):
                value[name] = changed = True
    return value


def _first_calls(expr, nullable: dict[str, bool]) -> tuple[set[str], bool]:
    """Rules ``expr`` can call before reading a byte, and whether ``expr`` can match the empty string."""
    if isinstance(expr, Literal):
        return set(), not expr.value
    if isinstance(expr, Ref):
        return {expr.rule}, nullable[expr.rule]
    if isinstance(expr, Repeat):
        calls, empty = _first_calls(expr.item, nullable)
        return calls, empty or expr.min == 0
    parts = [_first_calls(item, nullable) for item in expr.items]
    if isinstance(expr, Alt):
        return set().union(*(c for c, _ in parts)), any(e for _, e in parts)
    calls: set[str] = set()
    for c, e in parts:
        calls |= c
        if not e:
            return calls, False
    return calls, True


@st.composite
def small_grammars(draw):
    names = [f"r{i}" for i in range(draw(st.integers(1, 4)))]
    leaf = st.one_of(st.sampled_from([Literal("a"), Literal("b"), Literal("")]), st.sampled_from(names).map(Ref))
    expr = st.recursive(
        leaf,
        lambda inner: st.one_of(
            st.lists(inner, min_size=1, max_size=3).map(lambda xs: Seq(tuple(xs))),
            st.lists(inner, min_size=1, max_size=3).map(lambda xs: Alt(tuple(xs))),
            st.tuples(inner, st.integers(0, 2)).map(lambda t: Repeat(t[0], t[1], None)),
        ),
        max_leaves=6,
    )
    return Grammar({name: draw(expr) for name in names}, names[0])


@given(small_grammars())
@example(  # r0 calls only nullable rules yet reads "a": not nullable, so r2 is not left-recursive
    Grammar(
        {
            "r2": Alt((Seq((Ref("r0"), Ref("r2"))), Literal("b"))),
            "r0": Seq((Ref("r1"), Literal("a"))),
            "r1": Alt((Literal(""), Literal("c"))),
        },
        "r2",
    )  # fmt: skip
)
@example(  # r2 completes through "a", so r3 does, so r0 does, though r0 also calls itself
    Grammar(
        {
            "r0": Seq((Literal("a"), Alt((Ref("r0"), Ref("r3"))))),
            "r2": Alt((Literal("a"), Ref("r0"))),
            "r3": Seq((Ref("r2"),)),
        },
        "r0",
    )  # fmt: skip
)
@settings(max_examples=300, deadline=None)
def test_productivity_and_left_recursion_checks_equal_a_fixpoint_over_the_ir(grammar):
    """build_pushdown refuses a grammar with a rule that can never complete, else one where a rule can call
    itself before reading a byte, else builds it: decided here on the IR, by plain fixpoints."""
    rules = grammar.rules
    productive = _ir_fixpoint(rules, lambda literal: True)
    nullable = _ir_fixpoint(rules, lambda literal: not literal.value)
    first = {name: _first_calls(body, nullable)[0] for name, body in rules.items()}
    left_recursive = False
    for name in rules:  # is `name` reachable from itself through first calls?
        seen, stack = set(), list(first[name])
        while stack:
            r = stack.pop()
            if r == name:
                left_recursive = True
            if r not in seen:
                seen.add(r)
                stack.extend(first[r])
    if not all(productive.values()):
        with pytest.raises(GrammarError, match="never complete"):
            build_pushdown(grammar)
    elif left_recursive:
        with pytest.raises(GrammarError, match="left recursion"):
            build_pushdown(grammar)
    else:
        build_pushdown(grammar)


def _refs_in_order(expr, out):
    """The rules ``expr`` calls in order of first appearance, by a plain walk of the tree."""
    if isinstance(expr, Ref):
        if expr.rule not in out:
            out.append(expr.rule)
    elif isinstance(expr, Repeat):
        _refs_in_order(expr.item, out)
    elif isinstance(expr, (Seq, Alt)):
        for item in expr.items:
            _refs_in_order(item, out)
    return out


@given(small_grammars(), small_grammars())
@settings(max_examples=200, deadline=None)
def test_a_bodys_calls_are_listed_in_order_of_first_appearance_where_subtrees_are_shared(a, b):
    """collect_refs keeps each composite's calls on it: a subtree shared by several bodies (the rules every schema
    shares) answers from what it kept, in the order a walk of each body meets its calls."""
    from constrain.grammar.ir import collect_refs

    bodies = list(a.rules.values()) + list(b.rules.values())
    shared = [Seq((x, y)) for x in bodies for y in bodies] + [Alt((x, Repeat(x, 1, 2))) for x in bodies]
    for body in bodies + shared + bodies:  # again: answered from what the first pass kept
        assert list(collect_refs(body, {})) == _refs_in_order(body, [])
        out = {"zz": 0}
        assert collect_refs(body, out) == {"zz": 0, **{r: i + 1 for i, r in enumerate(_refs_in_order(body, []))}}


def _member_lists(required: list[bool], mark_shared: bool):
    """An object-like body as the JSON Schema compiler writes it: each option a flat sequence of one member and
    the members after it, each later member after a comma, optional unless required."""
    from constrain.grammar.ir import shared

    members = [Seq((Literal(f'"k{j}":'), Ref("v"))) for j in range(len(required))]
    if mark_shared:
        members = [shared(m) for m in members]
    following = [Seq((Literal(","), m)) for m in members]
    following = [f if r else Repeat(f, 0, 1) for f, r in zip(following, required)]
    last = required.index(True) if True in required else len(required) - 1
    options = [Seq((members[j], *following[j + 1 :])) for j in range(last + 1)]
    return Seq((Literal("{"), Alt(tuple(options)) if len(options) > 1 else options[0], Literal("}")))


@given(st.lists(st.booleans(), min_size=1, max_size=7))
@settings(max_examples=100, deadline=None)
def test_a_shared_member_is_built_once_and_the_automaton_stays_the_same(required):
    """A member marked shared, read first or after a comma, is built once per target: its key is read on one
    path of the NFA (an unmarked member read both ways is built twice), and the rule's minimal DFA is the one the
    unmarked body gives, state for state."""
    from constrain.automata.nfa import ByteNFA
    from constrain.grammar.rules import _build

    def paths_reading_key(body, j):
        nfa = ByteNFA()
        start, accept = nfa.new_state(), nfa.new_state()
        _build(nfa, body, start, accept, {"v": 0}, {})
        edges = np.array(nfa._bytes).reshape(-1, 4)
        return int(((edges[:, 1] == ord(str(j))) & (edges[:, 2] == ord(str(j)))).sum())  # keys "k0".."k6"

    plain, marked = _member_lists(required, False), _member_lists(required, True)
    dfas = [build_pushdown(Grammar({"obj": body, "v": Literal("1")}, "obj")).rules[0] for body in (plain, marked)]
    assert np.array_equal(dfas[0].trans, dfas[1].trans) and np.array_equal(dfas[0].calls, dfas[1].calls)
    assert np.array_equal(dfas[0].accepting, dfas[1].accepting)
    last = required.index(True) if True in required else len(required) - 1
    for j in range(len(required)):
        assert paths_reading_key(marked, j) == 1
        assert paths_reading_key(plain, j) == (2 if 1 <= j <= last else 1)


def _hoisted_by_walk(expr, found):
    """The reference for hoisting: terminals replaced by calls of rules named after them, by a plain walk."""
    if isinstance(expr, Regex):
        found[f"regex {expr.pattern!r}"] = expr
        return Ref(f"regex {expr.pattern!r}")
    if isinstance(expr, Repeat):
        return Repeat(_hoisted_by_walk(expr.item, found), expr.min, expr.max)
    if isinstance(expr, (Seq, Alt)):
        return type(expr)(tuple(_hoisted_by_walk(item, found) for item in expr.items))
    return expr


@given(small_grammars(), st.lists(st.sampled_from(["[0-9]+", "[a-z]", "x|yz"]), min_size=1, max_size=3))
@settings(max_examples=200, deadline=None)
def test_hoisting_moves_each_terminal_of_a_calling_rule_into_a_rule_of_its_own(grammar, patterns):
    """Hoisting (in the rules that call others) keeps its answer on each composite: bodies that share subtrees,
    hoisted again in another grammar, get what a plain walk gives, and a body without terminals is handed back as
    the same object."""
    from constrain.grammar.rules import _hoist_terminals

    terminals = [Regex(p) for p in patterns]
    bodies = {name: Seq((body, terminals[i % len(terminals)])) for i, (name, body) in enumerate(grammar.rules.items())}
    bodies["plain"] = Seq((Ref(grammar.start), Literal("!")))
    for extra in ({}, {"again": Alt(tuple(bodies.values()))}):  # the second pass meets the first's subtrees
        rules = {**bodies, **extra}
        hoisted = _hoist_terminals(Grammar(rules, grammar.start)).rules
        found: dict = {}
        expected = {
            name: _hoisted_by_walk(body, found) if _refs_in_order(body, []) else body  # a rule that calls nothing
            for name, body in rules.items()  # is lexical already
        }
        assert {name: hoisted[name] for name in rules} == expected
        assert {name: hoisted[name] for name in found} == found
        assert hoisted["plain"] is bodies["plain"]


def test_only_automata_less_some_words_pair_with_the_automaton_they_came_from():
    plain = terminal_dfa(STRING_PATTERN)
    assert plain.words_removed_from is None and plain.states_before_removal is None
    names = _key_except_dfa(("ab", "b"))
    assert names.words_removed_from is plain
    pairs = names.states_before_removal
    for text in [b'"', b'"a', b'"ab', b'"ax', b'"b', b'"\\', b'"\\u00']:
        state = walk_bytes(names.trans, 0, np.frombuffer(text, dtype=np.uint8), 0, len(text))
        base_state = walk_bytes(plain.trans, 0, np.frombuffer(text, dtype=np.uint8), 0, len(text))
        assert pairs[state] == base_state, text


# -- rules written later -----------------------------------------------------------------------------------------


def _deferring(fragments: dict[str, Grammar]):
    """A grammar writer that hands out ``fragments`` by name, counting what it is asked for."""
    asked: list[str] = []

    def write_later(name: str, known) -> Grammar:
        asked.append(name)
        fragment = fragments[name]
        return Grammar(fragment.rules, name, deferred=fragment.deferred, write_later=write_later)

    return write_later, asked


def _reads(machine, text: bytes) -> bool:
    configs = machine.read(machine.start, text)
    return bool(configs) and machine.can_end(configs)


def test_deferred_rules_are_written_when_first_called_and_numbered_after_the_rest():
    from constrain.runtime.pushdown import Machine

    write_later, asked = _deferring(
        {
            "v": Grammar({"v": Seq((Literal("x"), Ref("w"))), "w": Alt((Literal("y"), Seq((Literal("q"), Ref("u"))),
                         Ref("s")))}, "v", deferred=frozenset({"u"})),
            "u": Grammar({"u": Seq((Literal("z"), Regex("[0-9]+")))}, "u"),
        }
    )  # fmt: skip
    grammar = Grammar({"s": Seq((Literal("a"), Ref("v")))}, "s", deferred=frozenset({"v"}), write_later=write_later)
    pushdown = build_pushdown(grammar, lazy=True)
    assert pushdown.names == ["s", "v"] and not asked
    machine = Machine(pushdown)
    assert _reads(machine, b"axy") and asked == ["v"]
    assert pushdown.names[:2] == ["s", "v"] and "w" in pushdown.names and "u" in pushdown.names
    assert not _reads(machine, b"axz") and _reads(machine, b"axaxy") and asked == ["v"]
    assert _reads(machine, b"axqz42") and asked == ["v", "u"]
    assert not _reads(machine, b"axqz")


@pytest.mark.parametrize(
    "fragment,message",
    [
        (Grammar({"v": Alt((Ref("w"), Literal("b"))), "w": Seq((Ref("v"), Literal("c")))}, "v"), "left recursion"),
        (Grammar({"v": Repeat(Literal("x"), 0, None)}, "v"), "without reading a byte"),
        (Grammar({"v": Seq((Literal("x"), Ref("nope")))}, "v"), "undefined rule 'nope'"),
        (Grammar({"v": Seq((Literal("("), Ref("w"))), "w": Seq((Literal("("), Ref("w")))}, "v"), "never complete"),
    ],
)
def test_a_rule_written_later_is_checked_like_the_rest(fragment, message):
    write_later, _ = _deferring({"v": fragment})
    grammar = Grammar({"s": Seq((Literal("a"), Ref("v")))}, "s", deferred=frozenset({"v"}), write_later=write_later)
    pushdown = build_pushdown(grammar, lazy=True)
    with pytest.raises(GrammarError, match=message):
        pushdown.rule(pushdown.names.index("v"))


def test_settled_rules_are_taken_as_checked_and_the_others_are_checked_as_before():
    loop = Alt((Literal("b"), Seq((Literal("c"), Ref("v")))))
    build_pushdown(Grammar({"s": Seq((Literal("a"), Ref("v"))), "v": loop}, "s", settled=frozenset({"v"})))
    with pytest.raises(GrammarError, match="left recursion: s -> s"):
        build_pushdown(Grammar({"s": Alt((Seq((Ref("s"), Literal("+"))), Ref("v"))), "v": loop}, "s",
                               settled=frozenset({"v"})))  # fmt: skip
    with pytest.raises(GrammarError, match="never complete"):
        build_pushdown(Grammar({"s": Seq((Literal("("), Ref("v"), Ref("s"))), "v": loop}, "s",
                               settled=frozenset({"v"})))  # fmt: skip
    # what the writer vouches for is not looked at again...
    bad = Alt((Seq((Ref("v"), Literal("x"))), Literal("y")))
    build_pushdown(Grammar({"s": Seq((Literal("a"), Ref("v"))), "v": bad}, "s", settled=frozenset({"v"})))
    # ...unless hoisting its terminals changed the rule: then it is not the rule the writer vouched for
    hoisted = Alt((Seq((Ref("v"), Regex("[0-9]"))), Literal("y")))
    with pytest.raises(GrammarError, match="left recursion: v -> v"):
        build_pushdown(Grammar({"s": Seq((Literal("a"), Ref("v"))), "v": hoisted}, "s", settled=frozenset({"v"})))


@pytest.mark.parametrize("whitespace", ["compact", "flexible", "indent"])
def test_the_json_schema_compilers_settled_rules_are_what_it_vouches_for(whitespace):
    """Each settled rule of a JSON Schema grammar completes, reads a byte first and first calls only settled rules:
    checked here on the IR, since compiles take it as read."""
    from constrain.compilers.json_schema import schema_to_grammar

    schema = {"type": "object", "properties": {"a": {}, "b": {"type": "array", "items": {}}, "c": {"type": "string"}}}
    grammar, _ = schema_to_grammar(schema, whitespace=whitespace)
    settled = grammar.settled
    assert {"json_value", "json_string"} <= {name.split("@")[0] for name in settled}
    assert "ws" not in settled and "root" not in settled
    build_pushdown(replace(grammar, settled=frozenset()))  # productive, no left recursion, with every rule checked
    call_free = {name: body for name, body in grammar.rules.items() if not calls_of(body)}
    nullable = {name: bool(_rule_dfa(body)[0].accepting[0]) for name, body in call_free.items()}
    calling = {name: body for name, body in grammar.rules.items() if name not in call_free}
    nullable.update(dict.fromkeys(calling, False))
    changed = True
    while changed:  # the rules that can read nothing, call-free ones known from their DFAs
        changed = False
        for name, body in calling.items():
            if not nullable.get(name) and _first_calls(body, nullable)[1]:
                nullable[name] = changed = True
    for name in settled:
        first, empty = _first_calls(grammar.rules[name], nullable) if name in calling else (set(), nullable[name])
        assert not empty and first <= settled, name


def test_an_automaton_built_later_is_built_when_its_rule_is_first_called():
    from constrain.runtime.pushdown import Machine

    built: list[str] = []

    def build():
        built.append("words")
        return terminal_dfa('"[a-z]+"')

    later = Automaton.later(build, "words", 64)
    assert not later.built and later.bound == 64 and repr(later) == "Automaton(built later: words)"
    assert later == Automaton.later(build, "words", 8) and later != Automaton(terminal_dfa('"[a-z]+"'))
    rules = {"s": Seq((Literal("k="), Ref("w"))), "w": later}
    pushdown = build_pushdown(Grammar(rules, "s", settled=frozenset({"w"})), lazy=True)
    assert not built and not pushdown.is_built(pushdown.names.index("w"))
    machine = Machine(pushdown)
    assert _reads(machine, b'k="abc"') and built == ["words"] and later.built and later.bound == later.dfa.num_states
    assert not _reads(machine, b'k="A"') and built == ["words"]
    # the checks build one its writer did not vouch for, as a pushdown that is not lazy does
    for grammar, lazy in ((Grammar(rules, "s"), True), (Grammar(rules, "s", settled=frozenset({"w"})), False)):
        built.clear()
        rules["w"] = Automaton.later(build, "words", 64)
        build_pushdown(replace(grammar, rules=dict(rules)), lazy=lazy)
        assert built == ["words"]


def test_a_grammar_with_deferred_rules_needs_a_writer():
    with pytest.raises(GrammarError, match="write_later"):
        build_pushdown(Grammar({"s": Ref("v")}, "s", deferred=frozenset({"v"})))


def test_a_pickled_expression_keeps_its_fields_and_shared_mark_and_recomputes_what_it_cached():
    """What a composite caches about itself (hash, calls, hoisted form, DFA) lives in slots and is not pickled:
    str hashes differ from process to process. The shared mark is part of how its automaton is built, and is."""
    member = shared(Seq((Literal('"a":'), Ref("v"))))
    body = Alt((Seq((Literal("{"), member, Literal("}"))), Repeat(Seq((Literal(","), member)), 0, 2)))
    hash(body), calls_of(body), _rule_dfa(body)
    assert not any(key.startswith("_") for key in vars(body))  # the fields only: nothing cached in a dict
    copy = pickle.loads(pickle.dumps(body))
    assert copy == body and hash(copy) == hash(body) and calls_of(copy) == ("v",)
    assert getattr(copy.items[0].items[1], "_shared", False) and not getattr(copy.items[0], "_shared", False)
    assert getattr(copy, "_dfa", None) is None  # built again when asked for, not carried over
    assert np.array_equal(_rule_dfa(copy)[0].trans, _rule_dfa(body)[0].trans)


@given(small_grammars(), small_grammars())
@settings(max_examples=200, deadline=None)
def test_the_rule_dfa_cache_key_of_a_body_names_it_exactly(a, b):
    """Two bodies share a cached rule DFA only when they are equal; a body rebuilt elsewhere (here, unpickled) with
    the same subtrees shared finds the DFA built for the first."""
    from constrain.grammar.rules import _body_key

    bodies = list(a.rules.values()) + list(b.rules.values())
    bodies += [Seq((x, y)) for x in bodies[:3] for y in bodies[:3]] + [Repeat(x, 1, 2) for x in bodies[:3]]
    for x in bodies:
        assert _body_key(pickle.loads(pickle.dumps(x))) == _body_key(x)
        for y in bodies:
            if _body_key(x) == _body_key(y):
                assert x == y


def test_the_rule_dfa_cache_keeps_no_expression_alive_for_the_garbage_collector():
    """A rule's DFA outlives the grammar it was built for, but not its body: the cache's keys are plain tuples,
    which a collection stops tracking, rather than expression trees every later full collection walks again."""
    import gc
    import weakref

    from constrain.grammar.rules import _RULE_DFAS, _body_key

    leaf = Literal("a body no other test writes")
    body = Seq((Literal("{"), Repeat(Alt((leaf, Ref("v"))), 0, 3), Literal("}")))
    dfa = build_pushdown(Grammar({"s": body, "v": Literal("1")}, "s")).rules[0]
    gone, key = weakref.ref(leaf), _body_key(body)
    del body, leaf
    gc.collect()
    assert gone() is None
    # A tuple is untracked by the collection that finds its items untracked: a key nests three levels (the key,
    # its nodes, their leaves), so three collections are enough, whatever order they meet them in.
    gc.collect(), gc.collect()
    assert not gc.is_tracked(_RULE_DFAS._entries[key][2])  # the key the cache holds
    again = Seq((Literal("{"), Repeat(Alt((Literal("a body no other test writes"), Ref("v"))), 0, 3), Literal("}")))
    assert build_pushdown(Grammar({"s": again, "v": Literal("1")}, "s")).rules[0].trans is dfa.trans
