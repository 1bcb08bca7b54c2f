"""Grammar IR -> pushdown automaton: language membership against lark, masks against brute force."""

from __future__ import annotations

import itertools
import json
import random

import lark
import numpy as np
import pytest

from constrain.compilers.json_schema import compile_json_schema
from constrain.errors import DepthError
from constrain.grammar.ir import Alt, Grammar, Literal, Ref, Regex, Repeat, Seq
from constrain.grammar.rules import build_pushdown
from constrain.kernels.bitmask import bitmask_to_bool
from constrain.runtime import pushdown
from constrain.runtime.pushdown import Machine, compile_grammar
from constrain.testing import brute_force_state_mask, random_vocabulary, tiny_vocabulary

pytestmark = pytest.mark.usefixtures("fresh_lexical_store")


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


def accepts(machine: Machine, text: str) -> bool:
    configs = machine.read(machine.start, text.encode())
    return bool(configs) and machine.can_end(configs)


@pytest.mark.parametrize(
    "grammar,lark_text,alphabet,length",
    [(ARITHMETIC, ARITHMETIC_LARK, "1+*()", 6), (AMBIGUOUS, AMBIGUOUS_LARK, "xyz", 7)],
)
def test_membership_equals_lark_on_every_short_string(grammar, lark_text, alphabet, length):
    machine = Machine(build_pushdown(grammar))
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
    machine = Machine(build_pushdown(JSONISH))
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


NESTED = Grammar({"n": Alt((Seq((Literal("("), Ref("n"), Literal(")"))), Literal("x")))}, "n")


def test_nesting_past_the_stack_bound_raises_instead_of_losing_parses(gemma_vocab, gemma_tokenizer):
    """Each "(" of NESTED calls the rule again, one frame deeper. Up to MAX_STACK_DEPTH frames the text is
    followed exactly; a byte read deeper raises DepthError. Pushes past the bound used to be dropped: the text
    was rejected as if invalid and the mask there was empty, though the grammar allows "x"."""
    limit = pushdown.MAX_STACK_DEPTH
    machine = Machine(build_pushdown(NESTED))
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
        "x": Alt((Literal("a"), Seq((Literal("a"), Ref("x"), Literal("b"))), Seq((Literal("a"), Ref("y"), Literal("c"))))),  # noqa: E501
        "y": Alt((Literal("e"), Seq((Literal("a"), Ref("x"), Literal("b"))), Seq((Literal("a"), Ref("y"), Literal("c"))))),  # noqa: E501
    },
    "x",
)  # fmt: skip


def test_a_token_that_opens_too_many_parses_raises_instead_of_losing_some():
    """Inside one token the walk carries every configuration; past MAX_CONFIGS it must raise, not drop parses
    (dropping would let the mask disagree with reading). Short tokens still get exact masks."""
    tokens = [b"a" * n for n in (1, 2, 3, 12)] + [b"b", b"c", b"e", b"ab", b"ec", b"bc"]
    vocab = tiny_vocabulary(tokens)
    structure = compile_grammar(AMBIGUOUS, vocab)
    machine = structure.machine
    with pytest.raises(pushdown.AmbiguityError, match="inside one token"):
        structure.masks.get(machine.start)
    short = tiny_vocabulary(tokens[:3] + tokens[4:])
    structure = compile_grammar(AMBIGUOUS, short)
    machine = structure.machine
    for prefix in [b"", b"a", b"aa", b"aaae", b"aab"]:
        configs = machine.read(machine.start, prefix)
        mask = bitmask_to_bool(structure.masks.get(configs), short.size)
        want = brute_force_state_mask(structure, configs)  # end of sequence where the machine can end
        assert np.array_equal(mask, want), prefix


PREFIXES = [
    "",
    "{",
    '{"a',
    '{"a":',
    '{"a":[',
    '{"a":[1,',
    '{"a":[1,{"b":true}',
    "[[[[",
    '[1,"x"',
    '"é',
    "-",
    '{"a":1,"b"',
]


def test_masks_equal_brute_force_on_a_synthetic_vocabulary():
    vocab = random_vocabulary('{}[],:"ab1-0truexé\\', count=4000, all_bytes=True)
    structure = compile_grammar(JSONISH, vocab)
    machine = structure.machine
    for prefix in PREFIXES:
        configs = machine.read(machine.start, prefix.encode())
        mask = bitmask_to_bool(structure.masks.get(configs), vocab.size)
        want = brute_force_state_mask(structure, configs)  # end of sequence where the machine can end
        assert np.array_equal(mask, want), prefix


@pytest.mark.parametrize("prefix", PREFIXES)
def test_masks_on_gemma_equal_brute_force_on_allowed_and_sampled_tokens(gemma_vocab, prefix):
    structure = compile_grammar(JSONISH, gemma_vocab)
    machine = structure.machine
    configs = machine.read(machine.start, prefix.encode())
    mask = bitmask_to_bool(structure.masks.get(configs), gemma_vocab.size)
    rng = np.random.default_rng(1)
    allowed = np.flatnonzero(mask & gemma_vocab.matchable)
    if len(allowed) > 3000:
        allowed = rng.choice(allowed, 3000, replace=False)
    ids = np.union1d(allowed, rng.choice(gemma_vocab.size, 3000, replace=False))
    want = brute_force_state_mask(structure, configs, ids) & gemma_vocab.matchable
    assert np.array_equal(mask[ids] & gemma_vocab.matchable[ids], want[ids])


@pytest.mark.parametrize("chars", [250, 255, 256, 300, 511])
def test_masks_across_a_long_strings_block_boundary_equal_brute_force(gemma_vocab, chars):
    # Past 256 characters a string is read in blocks: near a block's end most tokens return from it into two
    # configurations at once (another block, or the tail), the walk's multi-configuration plain path.
    structure = compile_json_schema({"type": "string", "minLength": 260, "maxLength": 600}, gemma_vocab)
    machine = structure.machine
    configs = machine.read(machine.start, b'"' + "é".encode() * 3 + b"x" * (chars - 3))
    mask = bitmask_to_bool(structure.masks.get(configs), gemma_vocab.size)
    rng = np.random.default_rng(chars)
    allowed = np.flatnonzero(mask & gemma_vocab.matchable)
    ids = np.union1d(rng.choice(allowed, min(3000, len(allowed)), replace=False), rng.choice(gemma_vocab.size, 3000))
    long_tokens = np.flatnonzero([len(gemma_vocab.token_bytes(int(i))) >= 12 for i in range(gemma_vocab.size)])
    ids = np.union1d(ids, rng.choice(long_tokens, 2000, replace=False))  # those that cross the boundary
    want = brute_force_state_mask(structure, configs, ids) & gemma_vocab.matchable
    assert np.array_equal(mask[ids] & gemma_vocab.matchable[ids], want[ids])


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
