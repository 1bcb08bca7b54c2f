"""Token references in GBNF (``<[id]>``, ``<text>``, ``!<...>``), resolved against the real Gemma 3 vocabulary
(:mod:`constrain.grammar.tokens`): a named token matches exactly where the grammar names it, a repeated negation is
text without that token, and what a byte-level matcher cannot honour is refused."""

from __future__ import annotations

import re

import numpy as np
import pytest

from constrain.compilers.gbnf import compile_gbnf
from constrain.errors import GrammarError, GrammarSyntaxError
from constrain.grammar.ir import Grammar, Literal, Repeat, Seq, Token, TokensExcept
from constrain.grammar.tokens import resolve_tokens, token_id
from constrain.runtime.pushdown import compile_grammar
from constrain.testing import random_walk, token_length_weights

START_OF_TURN = 105
START_OF_IMAGE = 255999
END_OF_IMAGE = 256000
HTML_B = 200  # Gemma's text token "<b>"


def one(vocab, data: bytes) -> int:
    """The smallest matchable id whose bytes are ``data``."""
    lengths = np.diff(np.asarray(vocab.offsets))
    for i in np.flatnonzero(np.asarray(vocab.matchable) & (lengths == len(data))).tolist():
        if vocab.token_bytes(i) == data:
            return i
    raise LookupError(data)


def specials(vocab) -> np.ndarray:
    """The ids that are not text in the base vocabulary (special, end of sequence, holes)."""
    return np.flatnonzero(~np.asarray(vocab.matchable))


def reads(structure, tokens) -> bool:
    """Whether the structure reads ``tokens`` one by one and may end after them."""
    matcher = structure.matcher()
    for token in tokens:
        if not matcher.accepts(token):
            return False
        matcher.advance(token)
    return matcher.is_accepting()


@pytest.fixture(scope="module")
def ids(gemma_vocab, gemma_tokenizer):
    def encode(text: str) -> list[int]:
        out = gemma_tokenizer.encode(text, add_special_tokens=False)
        assert gemma_vocab.decode(out) == text.encode()
        return out

    return encode


def test_a_special_token_by_name_and_by_id_is_the_same_token(gemma_vocab, ids):
    assert token_id("<start_of_turn>", gemma_vocab) == token_id(START_OF_TURN, gemma_vocab) == START_OF_TURN
    by_name = compile_gbnf('root ::= <start_of_turn> "hi"', gemma_vocab)
    by_id = compile_gbnf('root ::= <[105]> "hi"', gemma_vocab)
    assert by_name.vocab is by_id.vocab is gemma_vocab.with_token_literals([START_OF_TURN])
    for structure in (by_name, by_id):
        assert structure.matcher().allowed_tokens().tolist() == [START_OF_TURN]
        assert reads(structure, [START_OF_TURN, *ids("hi")])
        assert not reads(structure, ids("hi"))
        assert not reads(structure, [START_OF_TURN])


def test_a_text_token_named_by_id_matches_only_that_token(gemma_vocab, ids):
    hello = one(gemma_vocab, b"hello")
    structure = compile_gbnf(f'root ::= <[{hello}]> " world"', gemma_vocab)
    assert structure.matcher().allowed_tokens().tolist() == [hello]
    assert reads(structure, [hello, *ids(" world")])
    spelled = [one(gemma_vocab, b"h"), one(gemma_vocab, b"el"), one(gemma_vocab, b"lo")]
    assert gemma_vocab.decode(spelled) == b"hello"
    assert not reads(structure, [*spelled, *ids(" world")])
    assert not structure.matcher().accepts(spelled[0])


def test_a_text_token_named_by_its_text_matches_only_that_token(gemma_vocab):
    assert token_id("<b>", gemma_vocab) == HTML_B and gemma_vocab.token_bytes(HTML_B) == b"<b>"
    structure = compile_gbnf('root ::= <b> "x"', gemma_vocab)
    x = one(gemma_vocab, b"x")
    assert structure.matcher().allowed_tokens().tolist() == [HTML_B]
    assert reads(structure, [HTML_B, x])
    spelled = [one(gemma_vocab, b"<"), one(gemma_vocab, b"b"), one(gemma_vocab, b">")]
    assert not reads(structure, [*spelled, x])
    # and the same text elsewhere in the grammar is plain text, spelled by any tokens but not by the named one
    both = compile_gbnf('root ::= <b> "<b>"', gemma_vocab)
    assert reads(both, [HTML_B, *spelled])
    assert not reads(both, [HTML_B, HTML_B])


def test_a_repeated_negation_is_text_without_that_token(gemma_vocab, ids):
    hello = one(gemma_vocab, b"hello")
    structure = compile_gbnf(f"root ::= (!<[{hello}]>)*", gemma_vocab)
    assert reads(structure, [])
    assert reads(structure, ids("say hello, world! <b> 42 ünïcödé"))
    spelled = [one(gemma_vocab, b"h"), one(gemma_vocab, b"el"), one(gemma_vocab, b"lo")]
    assert reads(structure, [*ids("so: "), *spelled])  # the text "hello", by other tokens
    assert not reads(structure, [*ids("so: "), hello])
    matcher = structure.matcher()
    matcher.advance(ids("abc"))
    allowed = set(matcher.allowed_tokens().tolist())
    assert hello not in allowed and spelled[0] in allowed
    assert allowed & set(specials(gemma_vocab).tolist()) == set(gemma_vocab.eos_ids.tolist())  # no special token
    assert one(gemma_vocab, b"\xff") not in allowed  # not UTF-8


def test_a_negation_repeated_at_least_once_refuses_empty_text(gemma_vocab, ids):
    hello = one(gemma_vocab, b"hello")
    structure = compile_gbnf(f"root ::= <start_of_turn> !<[{hello}]>+", gemma_vocab)
    assert not reads(structure, [START_OF_TURN])
    assert reads(structure, [START_OF_TURN, *ids("x")])
    assert reads(structure, [START_OF_TURN, *ids("x y z")])
    assert not reads(structure, [START_OF_TURN, hello])


@pytest.mark.parametrize("ref", ["<[1]>", "<eos>", "<[106]>", "<end_of_turn>"])
def test_naming_an_end_of_sequence_token_is_refused(gemma_vocab, ref):
    with pytest.raises(GrammarError, match="ends the sequence"):
        compile_gbnf(f'root ::= "a" {ref}', gemma_vocab)


def test_the_reasoning_grammar_with_end_of_turn_is_refused_as_it_ends_the_sequence(gemma_vocab):
    """llama.cpp's ``<start_of_turn> (!<[106]>)* <end_of_turn>``: 106 ends Gemma's sequences, so naming it is
    refused (a structure ends where it is complete)."""
    with pytest.raises(GrammarError, match=r"names token 106 .*ends the sequence"):
        compile_gbnf("root ::= <start_of_turn> (!<[106]>)* <end_of_turn>", gemma_vocab)


@pytest.mark.parametrize(
    "text, message",
    [
        ("root ::= <no_such_token>", "not one token"),
        ("root ::= <[262144]>", "outside this vocabulary"),
        ("root ::= <[99999999]>", "outside this vocabulary"),
        ("root ::= (!<no_such_token>)*", "not one token"),
    ],
)
def test_unknown_tokens_are_refused(gemma_vocab, text, message):
    with pytest.raises(GrammarError, match=message):
        compile_gbnf(text, gemma_vocab)


@pytest.mark.parametrize(
    "text, line, column",
    [
        ('root ::= "a" !<[12]> "b"', 1, 14),
        ('root ::= "a"\nrest ::= "b" | !<[12]>', 2, 16),
        ("root ::= (!<[12]>)?", 1, 19),  # at the quantifier that counts it
        ("root ::= !<[12]>{1,3}", 1, 17),
    ],
)
def test_a_lone_or_counted_negation_is_refused_with_its_position(gemma_vocab, text, line, column):
    with pytest.raises(GrammarSyntaxError, match="negated token reference") as info:
        compile_gbnf(text, gemma_vocab)
    assert (info.value.line, info.value.column) == (line, column)


def test_the_ir_refuses_tokens_except_outside_an_unbounded_repeat(gemma_vocab):
    for body in (TokensExcept((5000,)), Repeat(TokensExcept((5000,)), 2, None), Repeat(TokensExcept((5000,)), 0, 3)):
        grammar = Grammar({"root": Seq((Literal("a"), body))}, "root", names_tokens=True)
        with pytest.raises(GrammarError, match="root"):
            resolve_tokens(grammar, gemma_vocab)
    grammar = Grammar({"root": Seq((Token("<start_of_turn>"), Literal("a")))}, "root", names_tokens=True)
    structure = compile_grammar(grammar, gemma_vocab)
    assert structure.matcher().allowed_tokens().tolist() == [START_OF_TURN]


def test_where_a_special_token_is_allowed_it_is_the_only_special_one(gemma_vocab):
    special = set(specials(gemma_vocab).tolist())
    eos = set(gemma_vocab.eos_ids.tolist())
    structure = compile_gbnf("root ::= (!<[256000]>)* <start_of_turn> [a-z]* <start_of_image>?", gemma_vocab)
    matcher = structure.matcher()
    allowed = set(matcher.allowed_tokens().tolist())
    assert allowed & special == {START_OF_TURN}  # not accepting yet: no end of sequence either
    assert len(allowed) > 200_000  # and any text
    matcher.advance(START_OF_TURN)
    allowed = set(matcher.allowed_tokens().tolist())
    assert allowed & special == {START_OF_IMAGE} | eos  # may end here
    assert all(gemma_vocab.token_bytes(t).isalpha() and gemma_vocab.token_bytes(t).islower() for t in allowed - special)
    matcher.advance(START_OF_IMAGE)
    assert set(matcher.allowed_tokens().tolist()) == eos


def test_a_reasoning_grammar_with_non_eos_tokens_end_to_end(gemma_vocab, gemma_tokenizer, ids):
    grammar = (
        "root   ::= <start_of_image> think <end_of_image> answer\n"
        "think  ::= (!<[256000]>)*\n"
        'answer ::= [A-Za-z ]{1,12} "."\n'
    )
    structure = compile_gbnf(grammar, gemma_vocab)
    # the name of the closing token, spelled by text tokens, is text inside the thinking
    thinking = [*ids("Let me think. <"), *ids("end_of_image> is text")]
    assert gemma_vocab.decode(thinking) == b"Let me think. <end_of_image> is text"
    assert reads(structure, [START_OF_IMAGE, *thinking, END_OF_IMAGE, *ids("Yes.")])
    assert not reads(structure, [START_OF_IMAGE, END_OF_IMAGE, END_OF_IMAGE, *ids("Yes.")])
    assert not reads(structure, [START_OF_IMAGE, START_OF_IMAGE, END_OF_IMAGE, *ids("Yes.")])
    weights = token_length_weights(gemma_vocab, 3.0)
    weights[END_OF_IMAGE] = 0.2 * weights.sum()  # so that the thinking ends within a few tokens
    weights[one(gemma_vocab, b".")] *= 5000
    finished = 0
    for seed in range(4):
        tokens = random_walk(structure, np.random.default_rng(seed), max_tokens=60, weights=weights)
        if tokens is None:
            continue
        finished += 1
        assert tokens[0] == START_OF_IMAGE and tokens.count(END_OF_IMAGE) == 1
        assert not set(tokens[1:]) & set(specials(gemma_vocab).tolist()) - {END_OF_IMAGE}
        end = tokens.index(END_OF_IMAGE)
        gemma_vocab.decode(tokens[1:end]).decode("utf-8")  # the thinking is UTF-8 text
        answer = gemma_vocab.decode(tokens[end + 1 :]).decode("utf-8")
        assert re.fullmatch(r"[A-Za-z ]{1,12}\.", answer), answer
        assert gemma_vocab.text_with_specials(tokens).startswith("<start_of_image>")
    assert finished >= 3
