"""The fast path of reading a token against the reference.

``Matcher.advance`` first looks the transition up in its structure's cache, and ``GrammarStructure.read`` reads a
plain top frame's run of bytes from a cache per (top state, token) and every other byte from local steps cached
per (state, byte). The reference is ``Machine.read`` over the token's bytes, with no cache. On random walks under
the mask, over grammars with recursion, ambiguity and open objects, both must give the same configurations (the
same tuples, in the same order), the same masks and the same errors, also after copy and rollback and in
``validate_tokens`` and ``fill_draft_bitmasks``.
"""

from __future__ import annotations

import random
import threading

import numpy as np
import pytest

from constrain.cache import BoundedCache, CacheBudget
from constrain.compilers.json_schema import compile_json_schema
from constrain.compilers.lark import compile_lark
from constrain.compilers.regex import compile_regex
from constrain.errors import AmbiguityError, DepthError, TokenError
from constrain.grammar.ir import Alt, Grammar, Literal, Ref, Regex, Repeat, Seq
from constrain.kernels.bitmask import allocate_token_bitmask
from constrain.runtime import pushdown
from constrain.runtime.masks import walk_bytes
from constrain.runtime.matcher import Matcher, TransitionCache, state_bytes
from constrain.runtime.pushdown import GrammarStructure, compile_grammar
from constrain.testing import byte_vocabulary, random_vocabulary, random_walk, token_length_weights

pytestmark = pytest.mark.usefixtures("fresh_lexical_store")

JSON_UNITS = '{}[],:"abnmeikds01-9.tfrulx\\é '


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

#: A tree of nodes (recursion through $ref), an open object whose extra keys are strings, and a choice of types.
TREE_SCHEMA = {
    "$defs": {
        "node": {
            "type": "object",
            "properties": {
                "name": {"type": "string", "maxLength": 6},
                "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}, "maxItems": 3},
                "size": {"anyOf": [{"type": "integer"}, {"type": "null"}, {"type": "number"}]},
            },
            "required": ["name"],
            "additionalProperties": {"type": "string"},
        }
    },
    "$ref": "#/$defs/node",
}

#: An open object whose declared names share prefixes with its other keys, or objects told apart by a constant
#: (two configurations while the constant is read), or arrays of one item type or another.
OPEN_SCHEMA = {
    "anyOf": [
        {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "ab": {"type": "boolean"}, "abc": {"type": "array"}},
            "additionalProperties": {"type": ["string", "object"]},
        },
        {
            "oneOf": [
                {"type": "object", "properties": {"k": {"const": "a"}, "n": {"type": "number"}}, "required": ["k"]},
                {"type": "object", "properties": {"k": {"const": "b"}}, "required": ["k"]},
            ]
        },
        {"anyOf": [{"type": "array", "items": {"type": "integer"}}, {"type": "array", "items": {"type": "string"}}]},
    ]
}

ARITHMETIC_LARK = r"""
    ?start: sum
    ?sum: product | sum /[+-]/ product
    ?product: atom | product "*" atom
    ?atom: NUMBER | "-" atom | "(" sum ")"
    %import common.NUMBER
    %import common.WS_INLINE
    %ignore WS_INLINE
"""

#: Both branches start alike, and which one applies is only known later: ambiguity kept as a set.
AMBIGUOUS = Grammar(
    {
        "s": Alt((Ref("a"), Ref("b"), Seq((Ref("a"), Ref("b"))))),
        "a": Seq((Literal("x"), Repeat(Literal("y")))),
        "b": Seq((Literal("x"), Repeat(Literal("z")), Repeat(Ref("s"), 0, 1))),
    },
    "s",
)


@pytest.fixture(scope="module")
def json_vocab():
    return random_vocabulary(JSON_UNITS, count=3000, lengths=(1, 6), all_bytes=True)


def _structures(json_vocab):
    arithmetic_vocab = random_vocabulary("0123456789+-*(). ", count=1500, all_bytes=True)
    ambiguous_vocab = random_vocabulary("xyz", count=60, lengths=(1, 4), all_bytes=True)
    return {
        "jsonish": compile_grammar(JSONISH, json_vocab),
        "tree schema": compile_json_schema(TREE_SCHEMA, json_vocab),
        "open schema": compile_json_schema(OPEN_SCHEMA, json_vocab),
        "lark": compile_lark(ARITHMETIC_LARK, arithmetic_vocab),
        "ambiguous": compile_grammar(AMBIGUOUS, ambiguous_vocab),
    }


def reference(structure: GrammarStructure, state, token: int):
    """The configurations after ``token`` by the reference (None when rejected)."""
    return structure.machine.read(state, structure.vocab.token_bytes(token)) or None


def reference_mask(structure: GrammarStructure, state) -> np.ndarray:
    return structure.masks.compute(state)


def walks(structure: GrammarStructure, count: int, seed: int):
    """``count`` token sequences drawn under the mask (those of random_walk that stop within 80 tokens)."""
    weights = token_length_weights(structure.vocab)
    rng = random.Random(seed)
    out = []
    while len(out) < count:
        tokens = random_walk(structure, rng, max_tokens=80, stop=0.3, weights=weights)
        if tokens is not None:
            out.append(tokens)
    return out


@pytest.mark.parametrize("name", ["jsonish", "tree schema", "open schema", "lark", "ambiguous"])
def test_walks_give_the_reference_states_masks_and_rejections(json_vocab, name):
    structure = _structures(json_vocab)[name]
    vocab = structure.vocab
    rng = np.random.default_rng(7)
    multi = 0
    for tokens in walks(structure, 12, seed=len(name)):
        matcher = structure.matcher()
        state = structure.start
        states = [state]
        for token in tokens:
            # Other tokens from here, allowed or not: the fast read agrees with the reference on each.
            for other in rng.choice(vocab.size - 1, 12, replace=False).tolist():
                assert structure.read(state, other) == reference(structure, state, other), (state, other)
            state = reference(structure, state, token)
            matcher.advance(token)
            assert matcher._step[0] == state
            multi += len(state) > 1
            states.append(state)
        assert matcher.is_accepting()
        # Masks are a function of the state; those of a few positions against an uncached computation.
        for i in rng.choice(len(states), min(4, len(states)), replace=False).tolist():
            probe = structure.matcher()
            probe.advance(tokens[:i])
            assert np.array_equal(probe.mask(), reference_mask(structure, states[i]))
        # The same walk again: every transition now comes from the caches, and still equals the reference.
        again = structure.matcher()
        for token, want in zip(tokens, states[1:]):
            again.advance(token)
            assert again._step[0] == want
    if name == "ambiguous":
        assert multi, "the walks never held several configurations: the multi-configuration path went untested"


@pytest.mark.parametrize("name", ["tree schema", "lark", "ambiguous"])
def test_copy_rollback_validate_and_drafts_follow_the_reference(json_vocab, name):
    structure = _structures(json_vocab)[name]
    vocab = structure.vocab
    rng = random.Random(3)
    for tokens in walks(structure, 6, seed=11):
        states = [structure.start]
        for token in tokens:
            states.append(reference(structure, states[-1], token))
        matcher = structure.matcher()
        matcher.advance(tokens)
        for _ in range(5):
            back = rng.randint(0, len(tokens))
            copy = matcher.copy()
            copy.rollback(back)
            assert copy._step[0] == states[len(tokens) - back]
            assert matcher._step[0] == states[-1], "rolling a copy back changed the original"
            # What the copy accepts from there: the rest of the walk, then a token the reference rejects.
            at = len(tokens) - back
            draft = tokens[at:] + [_rejected(structure, states[-1])]
            assert copy.validate_tokens(draft) == back
            rows = allocate_token_bitmask(len(draft) + 1, vocab.size)
            assert copy.fill_draft_bitmasks(draft, rows) == back
            for j in range(back + 1):
                assert np.array_equal(rows[j], reference_mask(structure, states[at + j])), (at, j)
            assert not rows[back + 1 :].any()
            copy.advance(tokens[at:])
            assert copy._step[0] == states[-1]
        matcher.rollback(len(tokens))
        assert matcher._step[0] == structure.start


def _rejected(structure: GrammarStructure, state) -> int:
    """A matchable token the reference rejects from ``state``."""
    for token in range(structure.vocab.size):
        if structure.vocab.matchable[token] and reference(structure, state, token) is None:
            return token
    raise AssertionError("every token is allowed")


def outcome(read, *args):
    """What a read gives: its configurations, or the type of error it raises."""
    try:
        return read(*args)
    except (AmbiguityError, DepthError) as exc:
        return type(exc)


#: Each "a" either ends an x or opens an x (closed by "b") or a y (closed by "c"): after k bytes, 2^k stacks.
EXPLOSIVE = Grammar(
    {
        "x": Alt((Literal("a"), Seq((Literal("a"), Ref("x"), Literal("b"))), Seq((Literal("a"), Ref("y"), Literal("c"))))),  # noqa: E501
        "y": Alt((Literal("e"), Seq((Literal("a"), Ref("x"), Literal("b"))), Seq((Literal("a"), Ref("y"), Literal("c"))))),  # noqa: E501
    },
    "x",
)  # fmt: skip


@pytest.mark.parametrize("bound,value", [("MAX_CONFIGS", 6), ("MAX_STACK_DEPTH", 5)])
def test_bounds_raise_where_the_reference_raises(monkeypatch, bound, value):
    """Low bounds make the reference raise often: the fast path must raise (the same error) exactly then, and
    give the same configurations everywhere else."""
    monkeypatch.setattr(pushdown, bound, value)
    vocab = random_vocabulary(["a", "b", "c", "e", "x", "y", "z", "[", "]", "{", "}", '"', ":", ",", "1"],
                              count=2500, lengths=(1, 7), all_bytes=True)  # fmt: skip
    rng = random.Random(5)
    pieces = {
        "explosive": ["a", "a", "a", "b", "c", "e"],
        "ambiguous": ["x", "y", "z"],
        "jsonish": ["[", "[", '{"a":', "1", ",", "]", "}", '"x"'],
    }
    raised = 0
    for name, grammar in (("explosive", EXPLOSIVE), ("ambiguous", AMBIGUOUS), ("jsonish", JSONISH)):
        structure = compile_grammar(grammar, vocab)
        compared = 0
        for _ in range(300):
            text = "".join(rng.choice(pieces[name]) for _ in range(rng.randint(0, 8))).encode()
            try:
                state = structure.machine.read(structure.start, text)
            except (AmbiguityError, DepthError):
                continue
            if not state:
                continue
            for token in rng.sample(range(vocab.size - 1), 20):
                want = outcome(reference, structure, state, token)
                assert outcome(structure.read, state, token) == want, (text, vocab.token_bytes(token))
                raised += isinstance(want, type)
                compared += 1
        assert compared > 500, name
    assert raised > 20, f"{bound} = {value} seldom raised: the test does not reach the bound"


def test_a_matcher_raises_the_reference_errors_and_changes_nothing(monkeypatch):
    monkeypatch.setattr(pushdown, "MAX_STACK_DEPTH", 6)
    vocab = random_vocabulary("[]1,", count=200, all_bytes=True)
    ids = {vocab.token_bytes(i): i for i in range(vocab.size - 1)}
    structure = compile_grammar(JSONISH, vocab)
    machine = structure.machine
    depth = 0
    while outcome(machine.read, machine.start, b"[" * (depth + 1)) is not DepthError:
        depth += 1
    assert depth >= 1
    matcher = structure.matcher()
    matcher.advance([ids[b"["]] * depth)
    for _ in range(2):  # an error is not cached: the same again
        with pytest.raises(DepthError):
            matcher.advance(ids[b"["])
        with pytest.raises(DepthError):
            matcher.advance(ids[b"[["])
    assert matcher.num_tokens == depth
    with pytest.raises(TokenError):
        matcher.advance(ids[b"}"])
    matcher.advance([ids[b"]"]] * depth)
    assert matcher.is_accepting()


def test_matchers_in_threads_share_the_caches_and_agree_with_the_reference(json_vocab):
    """Threads walk one structure whose caches are small enough to be emptied again and again meanwhile."""
    structure = compile_json_schema(TREE_SCHEMA, json_vocab, cache_bytes=1 << 20)
    structure.transitions = TransitionCache(4096)
    structure._runs = TransitionCache(2048)
    structure._local = TransitionCache(2048)
    sequences = walks(structure, 16, seed=2)
    expected = []
    for tokens in sequences:
        states = [structure.start]
        for token in tokens:
            states.append(reference(structure, states[-1], token))
        expected.append(states)
    errors: list[BaseException] = []

    def work(offset: int) -> None:
        try:
            for k in range(len(sequences)):
                tokens, states = sequences[(k + offset) % len(sequences)], expected[(k + offset) % len(sequences)]
                matcher = structure.matcher()
                for token, want in zip(tokens, states[1:]):
                    matcher.advance(token)
                    assert matcher._step[0] == want
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]
    for cache in (structure.transitions, structure._runs, structure._local):
        assert 0 < cache.nbytes <= cache.max_bytes


def test_the_transition_cache_is_bounded_in_bytes():
    cache = TransitionCache(2000)
    state = ((1, 2, 3),)
    for token in range(100):
        nxt = ((token, 4),)
        cache.put((state, token), nxt, state_bytes(state) + state_bytes(nxt))
        assert cache.nbytes <= 2000
        assert cache.get((state, token)) == nxt
    assert 0 < len(cache) < 100
    assert cache.get((state, 0)) is None  # emptied when full
    cache.put((state, 1), ((1,) * 1000,), state_bytes(((1,) * 1000,)))  # more than the bound: not kept
    assert cache.get((state, 1)) is None
    nothing = TransitionCache(0)
    nothing.put((0, 1), 2, 56)
    assert len(nothing) == 0 and nothing.get((0, 1)) is None
    cache.clear()
    assert len(cache) == 0 and cache.nbytes == 0


def test_the_transition_caches_count_against_the_cache_budget():
    budget = CacheBudget(200_000)
    cache = TransitionCache(1 << 20, budget=budget)
    for token in range(500):
        cache.put((0, token), 1, 100)
    assert 0 < budget.used_bytes <= cache.nbytes < budget.used_bytes + TransitionCache.REPORT_BYTES
    other = BoundedCache(1 << 20, budget=budget)
    other.put("walk", object(), 190_000)  # past the budget: the least recently reported cache is emptied
    assert len(cache) == 0 and cache.nbytes == 0 and budget.used_bytes == 190_000
    cache.put((0, 1), 1, 100)
    assert cache.get((0, 1)) == 1


def test_without_a_cache_a_structure_reads_the_same(json_vocab):
    """cache_bytes=0 keeps no transition, run or local step: every token goes the whole way, still exactly."""
    structure = compile_json_schema(TREE_SCHEMA, json_vocab, cache_bytes=0)
    for tokens in walks(_structures(json_vocab)["tree schema"], 4, seed=9):
        matcher = structure.matcher()
        state = structure.start
        for token in tokens:
            state = reference(structure, state, token)
            matcher.advance(token)
            assert matcher._step[0] == state
        assert len(structure.transitions) == len(structure._runs) == len(structure._local) == 0


def test_a_dfa_structure_reads_short_and_long_tokens_as_the_kernel_does():
    long_token = "ab" * 20
    vocab = random_vocabulary("ab-c", count=400, lengths=(1, 8), extra=[long_token, long_token + "c"])
    structure = compile_regex(r"(ab)*c?-?[abc]{0,30}", vocab)
    trans = structure.dfa.trans
    for state in range(structure.dfa.num_states):
        for token in range(vocab.size - 1):
            start, end = vocab.offsets[token], vocab.offsets[token + 1]
            want = walk_bytes(trans, state, vocab.data, start, end)
            assert structure.read(state, token) == (int(want) if want >= 0 else None)
    matcher = structure.matcher()
    (long_id,) = [t for t in range(vocab.size - 1) if vocab.token_bytes(t) == long_token.encode()]
    matcher.advance(long_id)
    matcher.advance(long_id)
    assert isinstance(matcher._step[0], int)


def test_a_plain_run_is_shared_by_stacks_with_the_same_top():
    """The run of a token from a plain top frame is cached per (top state, token), whatever lies below: the same
    key in two objects at different depths must give each its own stack back."""
    vocab = byte_vocabulary(['{"', "name", '":"', "ab", '","', "kids", '":['])
    ids = {vocab.token_bytes(i): i for i in range(vocab.size - 1)}
    structure = compile_json_schema(TREE_SCHEMA, vocab)
    outer = [ids[b'{"'], ids[b"name"], ids[b'":"']]
    inner = outer + [ids[b"a"], ids[b'","'], ids[b"kids"], ids[b'":['], ids[b'{"'], ids[b"name"], ids[b'":"']]
    before = []
    for tokens in (outer, inner):
        matcher = structure.matcher()
        matcher.advance(tokens)
        before.append(matcher._step[0])
        matcher.advance(ids[b"ab"])
        assert matcher._step[0] == reference(structure, before[-1], ids[b"ab"])
    (outer_stack,), (inner_stack,) = before
    assert outer_stack[-1] == inner_stack[-1] and len(outer_stack) < len(inner_stack)
    assert structure._plain[outer_stack[-1]]
    assert structure._runs.get(outer_stack[-1] * vocab.size + ids[b"ab"]) is not None


def test_a_bool_or_numpy_token_is_not_confused_with_a_cached_int(json_vocab):
    structure = compile_grammar(JSONISH, json_vocab)
    matcher = structure.matcher()
    one = 1 if json_vocab.matchable[1] else next(t for t in range(10) if json_vocab.matchable[t])
    try:
        matcher.advance(one)
    except TokenError:
        pass
    matcher.reset()
    with pytest.raises(TokenError):
        matcher.advance(True)
    probe = Matcher(structure)
    assert probe.validate_tokens([np.int64(t) for t in walks(structure, 1, seed=5)[0]]) > 0
