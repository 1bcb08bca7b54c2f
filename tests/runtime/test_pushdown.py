"""Grammar IR -> pushdown automaton: language membership against lark, masks against brute force."""

from __future__ import annotations

import itertools
import json
import random

import lark
import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from constrain.automata.dfa import bounded_language_hashes
from constrain.automata.regex import regex_to_dfa
from constrain.compilers.json_schema import compile_json_schema
from constrain.compilers.json_schema.strings import _key_except_dfa
from constrain.compilers.json_schema.values import _STRING as STRING_PATTERN
from constrain.errors import DepthError, GrammarError, RegexError
from constrain.grammar.ir import Alt, Grammar, Literal, Ref, Regex, Repeat, Seq
from constrain.grammar.rules import build_pushdown, terminal_dfa
from constrain.runtime import lexical, pushdown
from constrain.runtime.lexical import LexicalMasks
from constrain.runtime.masks import walk_bytes, walk_trie
from constrain.runtime.pushdown import Machine, compile_grammar
from constrain.vocab.vocabulary import Vocabulary


def comma_list(item):
    return Repeat(Seq((item, Repeat(Seq((Literal(","), item))))), 0, 1)


JSONISH = Grammar(
    {
        "value": Alt((Ref("object"), Ref("array"), Ref("string"), Regex(r"-?(0|[1-9]\d*)"), Literal("true"))),
        "object": Seq((Literal("{"), comma_list(Seq((Ref("string"), Literal(":"), Ref("value")))), Literal("}"))),
        "array": Seq((Literal("["), comma_list(Ref("value")), Literal("]"))),
        "string": Regex(r'"([^"\\\x00-\x1f]|\\["\\nt])*"'),
    },
    "value",
)

ARITHMETIC = Grammar(
    {
        "expr": Seq((Ref("term"), Repeat(Seq((Regex("[+-]"), Ref("term")))))),
        "term": Seq((Ref("factor"), Repeat(Seq((Literal("*"), Ref("factor")))))),
        "factor": Alt((Regex("[0-9]+"), Seq((Literal("("), Ref("expr"), Literal(")"))))),
    },
    "expr",
)
ARITHMETIC_LARK = r"""
    expr: term (/[+-]/ term)*
    term: factor ("*" factor)*
    factor: /[0-9]+/ | "(" expr ")"
"""

# Ambiguous on purpose: both branches start alike, and which one applies is only known later.
AMBIGUOUS = Grammar(
    {
        "s": Alt((Ref("a"), Ref("b"), Seq((Ref("a"), Ref("b"))))),
        "a": Seq((Literal("x"), Repeat(Literal("y")))),
        "b": Seq((Literal("x"), Repeat(Literal("z")), Repeat(Ref("s"), 0, 1))),
    },
    "s",
)
AMBIGUOUS_LARK = r"""
    s: a | b | a b
    a: "x" "y"*
    b: "x" "z"* s?
"""


@pytest.fixture(autouse=True)
def fresh_lexical_store(tmp_path, monkeypatch):
    """Each test computes lexical walks itself, in its own cache folder, instead of reading earlier runs'."""
    def cache_dir(*parts: str):
        folder = tmp_path.joinpath(*parts)
        folder.mkdir(parents=True, exist_ok=True)
        return folder

    monkeypatch.setattr(lexical, "cache_dir", cache_dir)
    monkeypatch.setattr(LexicalMasks, "_stores", {})


def test_lexical_walks_are_shared_and_reloaded_from_disk(tmp_path):
    vocab = synthetic_vocab('{}[],:"ab1-0truexé\\')
    first = compile_grammar(JSONISH, vocab)
    configs = first.machine.read(first.machine.start, b'{"a')
    mask = first.masks.get(configs)
    files = sorted(tmp_path.glob("masks/*/*/*.walk"))
    assert files, "the string rule's walks were not written"
    LexicalMasks._stores.clear()  # as in a new process: only the disk is left
    second = compile_grammar(JSONISH, vocab)
    assert np.array_equal(second.masks.get(configs), mask)
    assert sorted(tmp_path.glob("masks/*/*/*.walk")) == files


def accepts(machine: Machine, text: str) -> bool:
    configs = machine.read(machine.start, text.encode())
    return bool(configs) and machine.can_end(configs)


@pytest.mark.parametrize(
    "grammar,lark_text,alphabet,length",
    [(ARITHMETIC, ARITHMETIC_LARK, "1+*()", 6), (AMBIGUOUS, AMBIGUOUS_LARK, "xyz", 7)],
)
def test_membership_equals_lark_on_every_short_string(grammar, lark_text, alphabet, length):
    machine = Machine.from_pushdown(build_pushdown(grammar))
    parser = lark.Lark(lark_text, start=grammar.start, parser="earley")
    for n in range(length + 1):
        for chars in itertools.product(alphabet, repeat=n):
            text = "".join(chars)
            try:
                parser.parse(text)
                expected = True
            except lark.exceptions.LarkError:
                expected = False
            assert accepts(machine, text) == expected, text


def test_prefixes_stay_alive_exactly_while_a_completion_exists():
    machine = Machine.from_pushdown(build_pushdown(JSONISH))
    rng = random.Random(0)
    for _ in range(200):
        value = {"a": [1, "x", {"b": True}], "c\\d": rng.randint(-50, 50), "e": [[], {}]}
        text = json.dumps(value, separators=(",", ":"))
        configs = machine.start
        for i in range(len(text)):
            configs = machine.read(configs, text[i].encode())
            assert configs, text[: i + 1]
        assert machine.can_end(configs)
    for bad in ['{"a":}', "[1,]", '{"a" 1}', "01", '"\\q"', "[1]]", "{,}"]:
        assert not accepts(machine, bad), bad


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
    Grammar({"r2": Alt((Seq((Ref("r0"), Ref("r2"))), Literal("b"))), "r0": Seq((Ref("r1"), Literal("a"))),
             "r1": Alt((Literal(""), Literal("c")))}, "r2")  # fmt: skip
)
@example(  # r2 completes through "a", so r3 does, so r0 does, though r0 also calls itself
    Grammar({"r0": Seq((Literal("a"), Alt((Ref("r0"), Ref("r3"))))), "r2": Alt((Literal("a"), Ref("r0"))),
             "r3": Seq((Ref("r2"),))}, "r0")  # fmt: skip
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


NESTED = Grammar({"n": Alt((Seq((Literal("("), Ref("n"), Literal(")"))), Literal("x")))}, "n")


def test_nesting_past_the_stack_bound_raises_instead_of_losing_parses(gemma_vocab, gemma_tokenizer):
    """Each "(" of NESTED calls the rule again, one frame deeper. Up to MAX_STACK_DEPTH frames the text is
    followed exactly; a byte read deeper raises DepthError. Pushes past the bound used to be dropped: the text
    was rejected as if invalid and the mask there was empty, though the grammar allows "x"."""
    limit = pushdown.MAX_STACK_DEPTH
    machine = Machine.from_pushdown(build_pushdown(NESTED))
    assert accepts(machine, "(" * (limit - 1) + "x" + ")" * (limit - 1))  # "x" read in frame number `limit`
    deep = machine.read(machine.start, b"(" * limit)
    assert deep
    with pytest.raises(DepthError, match="MAX_STACK_DEPTH"):
        machine.read(deep, b"x")

    structure = compile_grammar(NESTED, gemma_vocab)
    (open_,) = gemma_tokenizer.encode("(", add_special_tokens=False)
    (x,) = gemma_tokenizer.encode("x", add_special_tokens=False)
    matcher = structure.matcher()
    matcher.advance([open_] * limit)
    mask = matcher.mask()
    assert (mask[x >> 5] >> (x & 31)) & 1, "the grammar allows x here"
    with pytest.raises(DepthError):
        matcher.advance(x)
    assert matcher.num_tokens == limit


#: Each "a" either ends an x or opens an x (closed by "b") or a y (closed by "c"): after k bytes, 2^k stacks.
AMBIGUOUS = Grammar(
    {
        "x": Alt((Literal("a"), Seq((Literal("a"), Ref("x"), Literal("b"))), Seq((Literal("a"), Ref("y"), Literal("c"))))),
        "y": Alt((Literal("e"), Seq((Literal("a"), Ref("x"), Literal("b"))), Seq((Literal("a"), Ref("y"), Literal("c"))))),
    },
    "x",
)  # fmt: skip


def test_a_token_that_opens_too_many_parses_raises_instead_of_losing_some():
    """Inside one token the walk carries every configuration; past MAX_CONFIGS it must raise, not drop parses
    (dropping would let the mask disagree with reading). Short tokens still get exact masks."""
    tokens = [b"a" * n for n in (1, 2, 3, 12)] + [b"b", b"c", b"e", b"ab", b"ec", b"bc"]
    vocab = Vocabulary.from_token_bytes(tokens, eos_ids=[len(tokens)])
    structure = compile_grammar(AMBIGUOUS, vocab)
    machine = structure.machine
    with pytest.raises(pushdown.AmbiguityError, match="inside one token"):
        structure.masks.get(machine.start)
    short = Vocabulary.from_token_bytes(tokens[:3] + tokens[4:], eos_ids=[len(tokens) - 1])
    structure = compile_grammar(AMBIGUOUS, short)
    machine = structure.machine
    for prefix in [b"", b"a", b"aa", b"aaae", b"aab"]:
        configs = machine.read(machine.start, prefix)
        mask = np.unpackbits(structure.masks.get(configs).view(np.uint8), bitorder="little")[: short.size]
        want = brute_force(machine, short, configs, range(short.size))
        want[short.eos_ids] = machine.can_end(configs)
        assert np.array_equal(mask.astype(bool), want), prefix


def synthetic_vocab(alphabet: str, seed: int = 0) -> Vocabulary:
    rng = random.Random(seed)
    pieces = {"".join(rng.choice(alphabet) for _ in range(rng.randint(1, 5))).encode() for _ in range(4000)}
    tokens = sorted(pieces | {bytes([c]) for c in range(256)})
    return Vocabulary.from_token_bytes(tokens, eos_ids=[len(tokens)])


def brute_force(machine: Machine, vocab: Vocabulary, configs, ids) -> np.ndarray:
    return np.array([bool(vocab.matchable[i]) and bool(machine.read(configs, vocab.token_bytes(int(i)))) for i in ids])


PREFIXES = ["", "{", '{"a', '{"a":', '{"a":[', '{"a":[1,', '{"a":[1,{"b":true}', "[[[[", '[1,"x"', '"é', "-", '{"a":1,"b"']


def test_masks_equal_brute_force_on_a_synthetic_vocabulary():
    vocab = synthetic_vocab('{}[],:"ab1-0truexé\\')
    structure = compile_grammar(JSONISH, vocab)
    machine = structure.machine
    for prefix in PREFIXES:
        configs = machine.read(machine.start, prefix.encode())
        mask = np.unpackbits(structure.masks.get(configs).view(np.uint8), bitorder="little")[: vocab.size]
        want = brute_force(machine, vocab, configs, range(vocab.size))
        want[vocab.eos_ids] = machine.can_end(configs)
        assert np.array_equal(mask.astype(bool), want), prefix


@pytest.mark.parametrize("prefix", PREFIXES)
def test_masks_on_gemma_equal_brute_force_on_allowed_and_sampled_tokens(gemma_vocab, prefix):
    structure = compile_grammar(JSONISH, gemma_vocab)
    machine = structure.machine
    configs = machine.read(machine.start, prefix.encode())
    mask = np.unpackbits(structure.masks.get(configs).view(np.uint8), bitorder="little")[: gemma_vocab.size]
    mask = mask.astype(bool)
    rng = np.random.default_rng(1)
    allowed = np.flatnonzero(mask & gemma_vocab.matchable)
    if len(allowed) > 3000:
        allowed = rng.choice(allowed, 3000, replace=False)
    ids = np.union1d(allowed, rng.choice(gemma_vocab.size, 3000, replace=False))
    assert np.array_equal(mask[ids] & gemma_vocab.matchable[ids], brute_force(machine, gemma_vocab, configs, ids))


@pytest.mark.parametrize("chars", [250, 255, 256, 300, 511])
def test_masks_across_a_long_strings_block_boundary_equal_brute_force(gemma_vocab, chars):
    # Past 256 characters a string is read in blocks: near a block's end most tokens return from it into two
    # configurations at once (another block, or the tail), the walk's multi-configuration plain path.
    structure = compile_json_schema({"type": "string", "minLength": 260, "maxLength": 600}, gemma_vocab)
    machine = structure.machine
    configs = machine.read(machine.start, b'"' + "é".encode() * 3 + b"x" * (chars - 3))
    mask = np.unpackbits(structure.masks.get(configs).view(np.uint8), bitorder="little")[: gemma_vocab.size]
    mask = mask.astype(bool)
    rng = np.random.default_rng(chars)
    allowed = np.flatnonzero(mask & gemma_vocab.matchable)
    ids = np.union1d(rng.choice(allowed, min(3000, len(allowed)), replace=False), rng.choice(gemma_vocab.size, 3000))
    long_tokens = np.flatnonzero([len(gemma_vocab.token_bytes(int(i))) >= 12 for i in range(gemma_vocab.size)])
    ids = np.union1d(ids, rng.choice(long_tokens, 2000, replace=False))  # those that cross the boundary
    assert np.array_equal(mask[ids] & gemma_vocab.matchable[ids], brute_force(machine, gemma_vocab, configs, ids))


def test_matcher_follows_real_tokenizations(gemma_vocab, gemma_tokenizer):
    structure = compile_grammar(JSONISH, gemma_vocab)
    for text in ['{"name":"Ada","tags":["x",{"k":[1,2,-3]}],"ok":true}', "[[[],[]],{}]", '"tab\\t"']:
        matcher = structure.matcher()
        for token in gemma_tokenizer.encode(text, add_special_tokens=False):
            allowed = matcher.mask()
            assert (allowed[token >> 5] >> (token & 31)) & 1, (text, token)
            matcher.advance(token)
        assert matcher.is_accepting()
        matcher.advance(1)
        assert matcher.is_finished()
        matcher.rollback(2)
        assert not matcher.is_finished()


def test_bounded_language_hashes_identify_states_with_the_same_short_strings():
    depth = 6
    bounded = regex_to_dfa('"[a-z]{0,20}"')
    unbounded = regex_to_dfa('"[a-z]*"')
    narrower = regex_to_dfa('"[a-y]*"')
    h_bounded = bounded_language_hashes(bounded.trans, bounded.accepting, depth)
    h_unbounded = bounded_language_hashes(unbounded.trans, unbounded.accepting, depth)
    h_narrower = bounded_language_hashes(narrower.trans, narrower.accepting, depth)
    inside = int(unbounded.trans[0, ord('"')])
    state = int(bounded.trans[0, ord('"')])
    for letters in range(21):
        # Strings of at most `depth` bytes cannot tell the bounded string from the unbounded one while at least
        # `depth` more letters may come; closer to the bound they can.
        assert (h_bounded[state] == h_unbounded[inside]) == (20 - letters >= depth), letters
        state = int(bounded.trans[state, ord("a")])
    assert h_narrower[int(narrower.trans[0, ord('"')])] != h_unbounded[inside]
    # The same language built differently (other byte classes, other state numbering) hashes the same.
    other = regex_to_dfa('"(?:[a-m]|[n-z])*"')
    assert set(bounded_language_hashes(other.trans, other.accepting, depth)) == set(h_unbounded)


SCHEMA_WITH_KEYS = {
    "type": "object",
    "properties": {"deliveryRoundID": {"type": "string"}, "name": {"type": "string", "maxLength": 40}},
    "additionalProperties": {"type": "integer"},
}


@pytest.mark.parametrize("prefix", ['{"', '{"deliveryR', '{"deliveryRoundID":"x","na', '{"name":"ab', '{"zz":1,"d'])
def test_composed_lexical_walks_equal_a_whole_walk_on_gemma(gemma_vocab, prefix):
    """Walks composed from other states' subtrees (a property name the schema excludes borrows the plain
    string's walk) give exactly the mask of one whole walk of the configurations."""
    structure = compile_json_schema(SCHEMA_WITH_KEYS, gemma_vocab)
    machine = structure.machine
    warm = machine.read(machine.start, b'{"q')  # a plain key string: its walk becomes a lender
    structure.masks.get(warm)
    configs = machine.read(machine.start, prefix.encode())
    assert configs, prefix
    got = structure.masks.get(configs).view(np.uint32).copy()
    want = np.zeros_like(got)
    machine.walk(configs, gemma_vocab.trie, want)
    assert not machine.can_end(configs)  # inside an object: no end-of-sequence bits to add
    assert np.array_equal(got, want), prefix


def test_masks_along_a_whole_object_equal_whole_walks_on_gemma(gemma_vocab):
    """Typing property names and values in one structure: prefix states of names borrow the plain string's
    subtrees, stack masks are cached by their lexical top's language and reused at later positions; each mask
    must still equal one whole walk of its configurations."""
    structure = compile_json_schema(SCHEMA_WITH_KEYS, gemma_vocab)
    machine = structure.machine
    structure.masks.get(machine.read(machine.start, b'{"q'))  # the plain key string lends
    text = '{"deliveryRoundID":"x","name":"y","nab":1,"deliv'
    for end in range(2, len(text) + 1):
        configs = machine.read(machine.start, text[:end].encode())
        assert configs, text[:end]
        got = structure.masks.get(configs).view(np.uint32).copy()
        want = np.zeros_like(got)
        machine.walk(configs, gemma_vocab.trie, want)
        assert np.array_equal(got, want), text[:end]


MANY_NAMES = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet", "kilo",
              "lima"]  # fmt: skip


def test_two_byte_subtrees_are_borrowed_and_walks_equal_whole_walks_on_gemma(gemma_vocab):
    """A string automaton whose states differ from a plain string's below a few first bytes (here "any string but
    these names", walked by the store itself as it walks any call-free automaton) walks those letters' subtrees but
    borrows the two-byte nodes below them from the plain string's walk; its tokens still equal a whole walk's."""
    store = LexicalMasks.of(gemma_vocab)
    depth = store.depth
    plain = terminal_dfa(STRING_PATTERN)
    store.walk(plain.trans, plain.accepting, plain.language_hashes(depth), int(plain.trans[0, ord('"')]))
    assert store._deep_lenders  # the plain string's body: a deep lender
    names = _key_except_dfa(tuple(MANY_NAMES))
    hashes = names.language_hashes(depth)
    trie = gemma_vocab.trie
    before = store.deep_borrowed_nodes
    for prefix in [b'"', b'"a', b'"al', b'"alp', b'"c', b'"ch', b'"k', b'"li', b'"lim', b'"ab']:
        state = walk_bytes(names.trans, 0, np.frombuffer(prefix, dtype=np.uint8), 0, len(prefix))
        words, _ = store.walk(names.trans, names.accepting, hashes, int(state))
        want = np.zeros_like(words)
        walk_trie(
            np.ascontiguousarray(names.trans).reshape(-1), int(state), trie.node_key, trie.node_next,
            trie.node_token_ptr, trie.token_ids, trie.root_children, np.empty(trie.max_depth + 1, dtype=np.int32),
            want,
        )  # fmt: skip
        assert np.array_equal(words, want), prefix
    assert store.deep_borrowed_nodes - before > 12 * 10  # most two-byte nodes under each declared first letter


@pytest.mark.parametrize(
    "names", [MANY_NAMES, ["a", "ab", "abc", "b"], ["key"], ["é", "naïve", 'say "hi"', "back\\slash", "tab\t", "日本"]]
)
def test_walks_of_keys_other_than_the_properties_equal_the_stores_own_on_gemma(gemma_vocab, names):
    """The keys of an object other than its properties: each state's walk, made from the plain string's walk less
    the tokens that end exactly at the end of a property's name (and the returns after them), equals the walk the
    store composes for that state itself, tokens and returns alike."""
    structure = compile_json_schema({"type": "object", "properties": {n: {} for n in names}}, gemma_vocab)
    rule = next(i for i, n in enumerate(structure.pushdown.names) if n.startswith("json_key_except:"))
    dfa = structure.pushdown.rules[rule]
    assert dfa.states_before_removal is not None
    store = LexicalMasks.of(gemma_vocab)
    hashes = dfa.language_hashes(store.depth)
    base = dfa.words_removed_from
    base_hashes = base.language_hashes(store.depth)
    fewer = 0
    for state in range(dfa.num_states):
        if not (dfa.trans[state] >= 0).any():
            continue  # the closing quote's state: nothing to walk
        fast = store.walk_without_words(dfa, state)
        assert fast is not None, state
        words, ranges = store.walk(dfa.trans, dfa.accepting, hashes, state)
        assert np.array_equal(fast[0], words), state
        assert sorted(map(tuple, fast[1].tolist())) == sorted(map(tuple, ranges.tolist())), state
        paired = int(dfa.states_before_removal[state])
        fewer += not np.array_equal(words, store.walk(base.trans, base.accepting, base_hashes, paired)[0])
    assert fewer  # some state's walk left tokens out: one that ends a name with its closing quote


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


def test_a_subtree_copied_from_a_deep_lender_drops_the_two_byte_nodes_it_does_not_lend_on_gemma(gemma_vocab):
    """A name that starts with "a" must not go on with "z": below the first byte "a", every two-byte node but
    "az" has the plain name's language, so the walk copies the plain name's tokens of the whole "a" subtree and
    must then drop the tokens under "az" (there are hundreds: "azure", "az", ...)."""
    plain = compile_json_schema({"type": "object"}, gemma_vocab)
    store = LexicalMasks.of(gemma_vocab)
    plain.masks.get(plain.machine.read(plain.machine.start, b'{"'))  # the plain name: a deep lender
    assert store._deep_lenders
    structure = compile_json_schema({"type": "object", "propertyNames": {"pattern": "^(?:a[^z]|[^a])"}}, gemma_vocab)
    machine = structure.machine
    before = store.deep_borrowed_nodes
    az = [i for i in range(gemma_vocab.size) if gemma_vocab.token_bytes(i).startswith(b"az")]
    assert len(az) > 50
    for prefix in ['{"', '{"b":1,"']:
        configs = machine.read(machine.start, prefix.encode())
        got = structure.masks.get(configs).view(np.uint32).copy()
        want = np.zeros_like(got)
        machine.walk(configs, gemma_vocab.trie, want)
        assert np.array_equal(got, want), prefix
        assert not any(got[i >> 5] & (1 << (i & 31)) for i in az)
    assert store.deep_borrowed_nodes > before


def test_walks_borrow_from_several_lenders_and_drop_the_main_lenders_other_tokens_on_gemma(gemma_vocab):
    """A name state borrows most subtrees from the plain name's walk (its main lender) and the subtree of "a"
    from an earlier walk that excluded the same names under "a". A name that must start with a lowercase ASCII
    letter borrows those subtrees from the plain name and must drop every token the plain name allows under the
    other first bytes (a dense pass for the large subtree of words after a space, token by token for the
    others)."""
    def mask(structure, prefix):
        configs = structure.machine.read(structure.machine.start, prefix)
        got = structure.masks.get(configs).view(np.uint32).copy()
        want = np.zeros_like(got)
        structure.machine.walk(configs, gemma_vocab.trie, want)
        assert np.array_equal(got, want), prefix
        return got

    plain = compile_json_schema({"type": "object"}, gemma_vocab)
    mask(plain, b'{"')
    mask(compile_json_schema({"type": "object", "properties": {"alpha": {}}}, gemma_vocab), b'{"')
    mask(compile_json_schema({"type": "object", "properties": {"alpha": {}, "bravo": {}}}, gemma_vocab), b'{"')
    lowercase = compile_json_schema({"type": "object", "propertyNames": {"pattern": "^[a-z]"}}, gemma_vocab)
    got = mask(lowercase, b'{"')
    word = next(i for i in range(gemma_vocab.size) if gemma_vocab.token_bytes(i) == b" the")
    assert not got[word >> 5] & (1 << (word & 31))


def test_a_lenders_pop_ranges_are_indexed_as_the_lender_lists_them_now_on_gemma(gemma_vocab):
    """A walk evicted and composed again lists the same pop ranges in another order (its lenders differ then).
    The first-byte subtree of each range, which says which rows a borrower takes, must be that of the ranges as
    listed now: an index kept from the old order picked other subtrees' rows (on the whole dev set that lost
    pops, and then tokens of valid instances)."""
    structure = compile_json_schema({"type": "object"}, gemma_vocab)
    machine = structure.machine
    structure.masks.get(machine.read(machine.start, b'{"'))
    store = LexicalMasks.of(gemma_vocab)
    key, (_, ranges) = next((k, v[0]) for k, v in store._entries._entries.items() if len(v[0][1]) > 10)
    again = ranges[np.roll(np.arange(len(ranges)), 7)]
    for listed in (ranges, again, ranges):
        got = [bytes([store.first_bytes[j]]) for j in store._ranges_by_subtree(key, listed)]
        assert got == [gemma_vocab.trie.node_path(int(first) - 1)[:1] for first in listed[:, 0]]
