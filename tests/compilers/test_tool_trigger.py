"""The trigger of ``tool_choice="auto"``: free text in which the trigger does not occur, then optionally the
trigger and the calls. Checked against a reference matcher on random strings built from pieces of the triggers
(so that near misses, straddling tokens and calls inside text occur), fed token by token with the real Gemma 3
and cl100k tokenizers; and, for a trigger that is a special token of the vocabulary, the token itself: allowed
exactly where the calls may open, never spelled by text, and refused by every other structure."""

from __future__ import annotations

import collections
import json
import random
import re

import numpy as np
import pytest

from constrain.compilers.gbnf import compile_gbnf
from constrain.compilers.json_schema import compile_json_schema
from constrain.compilers.regex import compile_regex
from constrain.tools import (
    FORMATS,
    ToolCallError,
    ToolFormat,
    as_tools,
    compile_tools,
    parse_tool_calls,
    read_tool_calls,
)


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def echo(text: str) -> str:
    """Say it again."""
    return text


TOOLS = as_tools([add, echo])
CALLS = [
    ("add", {"a": 1, "b": 2}),
    ("echo", {"text": "hi <tool_call> there <|python_tag|>"}),
    ("echo", {"text": ""}),
    ("add", {"a": -3, "b": 40}),
    ("echo", {"text": "é 😀 ; [x]"}),
]
#: Pieces of text: those of the triggers and of the calls, near misses, straddles ("<<", "><"), non-ASCII.
PIECES = [
    "<", "tool", "_call", "call", ">", "<tool_call>", "</tool_call>", "<tool_call", "tool_call>", "<tool_",
    "<|python_tag|>", "<|", "|>", "python_tag", "<|python", "_tag|>", " ", "  ", "\n", "a", "Hi", "é", "😀",
    '"', "{", "}", "[", "]", ",", ":", ";", "; ", "1", "-", "<<", "><", '{"name":"add"', '"arguments":',
]  # fmt: skip


# -- the reference --------------------------------------------------------------------------------------------------


def reference(text: str, fmt: ToolFormat) -> bool:
    """Whether the auto structure should accept ``text``: no trigger in it, or text without the trigger, the
    trigger, and a calls block in ``fmt`` exactly as :meth:`ToolFormat.write` writes the calls it holds (the
    structure is compact JSON)."""
    at = text.find(fmt.trigger)
    if at < 0:
        return True
    rest = text[at:] if fmt.trigger_in_block else text[at + len(fmt.trigger) :]
    try:
        _, calls = parse_tool_calls(rest, TOOLS, format=fmt, required=True)
    except (ToolCallError, ValueError):
        return False
    return fmt.write([(c.name, json.loads(c.raw)) for c in calls]) == rest


def random_texts(fmt: ToolFormat, seed: int, count: int) -> list[str]:
    """Texts of up to 6 random pieces and call blocks; about half end with the trigger and valid calls (after
    which, sometimes, one more piece)."""
    rng = random.Random(seed)
    blocks = [fmt.write(rng.sample(CALLS, rng.randint(1, 3)), after_text=rng.random() < 0.5) for _ in range(30)]
    pieces = PIECES + blocks + [b[:-1] for b in blocks[:5]] + [b.replace(",", ", ", 1) for b in blocks[5:10]]
    texts = []
    for _ in range(count):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 6)))
        if rng.random() < 0.5:
            text += fmt.write(rng.sample(CALLS, rng.randint(1, 3)), after_text=True)
            if rng.random() < 0.3:
                text += rng.choice(pieces)
        texts.append(text)
    return texts


# -- helpers ----------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tokenizers(gemma_vocab, gemma_tokenizer, cl100k_vocab, cl100k):
    """name -> (vocabulary, encode): the tokens of a text without special tokens (None when they do not spell it)."""

    def encoder(vocab, encode):
        def run(text: str) -> list[int] | None:
            ids = [int(t) for t in encode(text)]
            if vocab.decode(ids) != text.encode():  # Gemma's tokenizer reads "<start_of_image>" as the token
                ids = [int(t) for part in re.split("(<)", text) if part for t in encode(part)]
            return ids if vocab.decode(ids) == text.encode() else None

        return run

    return {
        "gemma": (gemma_vocab, encoder(gemma_vocab, lambda t: gemma_tokenizer.encode(t, add_special_tokens=False))),
        "cl100k": (cl100k_vocab, encoder(cl100k_vocab, lambda t: cl100k.encode(t, disallowed_special=()))),
    }


def in_mask(matcher, token: int) -> bool:
    return bool((int(matcher.mask()[token >> 5]) >> (token & 31)) & 1)


def accepted(structure, tokens: list[int]) -> bool:
    """Whether the structure reads ``tokens`` one by one (each in the mask, and read) and may end after them (an
    end-of-sequence token in the mask). A token refused means the text is not accepted."""
    matcher = structure.matcher()
    for token in tokens:
        allowed = in_mask(matcher, token)
        assert allowed == matcher.accepts(token), f"the mask and the matcher disagree on token {token}"
        if not allowed:
            return False
        matcher.advance(token)
    may_end = any(in_mask(matcher, int(t)) for t in structure.vocab.eos_ids)
    assert may_end == matcher.is_accepting()
    return may_end


# -- the text trigger against the reference ---------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("name", ["gemma", "cl100k"])
def test_the_auto_structure_agrees_with_the_reference_on_random_texts(tokenizers, name, fmt):
    vocab, encode = tokenizers[name]
    form = FORMATS[fmt]
    structure = compile_tools(TOOLS, vocab, format=fmt)
    seen = collections.Counter()
    for text in random_texts(form, seed=len(fmt) + len(name), count=300):
        tokens = encode(text)
        if tokens is None:
            continue
        expected = reference(text, form)
        assert accepted(structure, tokens) == expected, (text, [vocab.token_bytes(t) for t in tokens])
        seen[form.trigger in text, expected] += 1
        if expected:  # and what is accepted reads back
            content, calls = parse_tool_calls(text, TOOLS, format=fmt)
            assert content == text.split(form.trigger, 1)[0] and bool(calls) == (form.trigger in text)
    # every kind of text occurred: plain text, text then calls, and a trigger followed by what is not calls
    assert seen[False, True] >= 25 and seen[True, True] >= 40 and seen[True, False] >= 40, seen
    assert seen[False, False] == 0


@pytest.mark.parametrize("name", ["gemma", "cl100k"])
def test_near_misses_of_the_trigger_are_text(tokenizers, name):
    vocab, encode = tokenizers[name]
    structure = compile_tools(TOOLS, vocab)
    call = FORMATS["json"].write([CALLS[0]])
    for text in ["<tool_call", "<tool_call >", "< tool_call>", "<tool_calls", "<tool_", "tool_call>", "<Tool_call>"]:
        assert accepted(structure, encode(text + " " + call)), text
    for text in ["<tool_call>", "x<tool_call>", "<<tool_call>", "<tool_call<tool_call>"]:
        assert not accepted(structure, encode(text))  # the trigger opens calls: it cannot end there
        assert accepted(structure, encode(text + call)), text
        assert not accepted(structure, encode(text + " " + call))  # compact: no space after the trigger
        assert not accepted(structure, encode(text + call + "<tool_call>" + call))  # one trigger, one block


# -- tokens that straddle the text and the trigger ----------------------------------------------------------------


def _tokens_with(vocab, test, limit: int = 10) -> list[int]:
    """Up to ``limit`` matchable ids, shortest first, whose bytes pass ``test``."""
    lengths = np.diff(np.asarray(vocab.offsets))
    out = []
    for n in range(2, 6):
        for i in np.flatnonzero(np.asarray(vocab.matchable) & (lengths == n)).tolist():
            if test(vocab.token_bytes(i)):
                out.append(i)
                if len(out) == limit:
                    return out
    return out


def test_a_gemma_token_straddling_the_text_and_the_trigger_is_read(tokenizers):
    vocab, encode = tokenizers["gemma"]
    structure = compile_tools(TOOLS, vocab)
    call = FORMATS["json"].write([CALLS[1]])
    # tokens that end with the trigger's first byte after some text: " <" (655), '"<', "<<", "><", ...
    straddling = _tokens_with(vocab, lambda b: b.endswith(b"<") and not b.endswith(b"<<") and b"\xff" not in b)
    assert 655 in straddling and vocab.token_bytes(655) == b" <"
    rest = encode("tool_call>") + encode(call)
    for token in straddling:
        tokens = [*encode("He said"), token, *rest]
        assert accepted(structure, tokens), vocab.decode(tokens)
        text = vocab.decode(tokens).decode()
        content, calls = parse_tool_calls(text, TOOLS)
        assert content == "He said" + vocab.token_bytes(token)[:-1].decode() and [c.name for c in calls] == ["echo"]
        # the same token, followed by what does not complete the trigger, is text
        assert accepted(structure, [*encode("He said"), token, *encode("tool_call ok")])
    # a token that ends the trigger and opens the calls: ">{", '>["', ...
    call = FORMATS["json"].write([CALLS[0], CALLS[3]])  # no trigger in its arguments
    closing = [
        t
        for t in _tokens_with(vocab, lambda b: b.startswith(b">") and b[1:2] in (b"{", b"["), limit=50)
        if call.startswith(vocab.token_bytes(t)[1:].decode())  # ">[" here
    ]
    assert closing
    for token in closing:
        tail = call[len(vocab.token_bytes(token)) - 1 :]
        tokens = [*encode("Sure <tool_call"), token, *encode(tail)]
        assert accepted(structure, tokens), vocab.decode(tokens)
        # the same token after text that is not the trigger: text, and no calls
        tokens = [*encode("Sure <tool_cal"), token, *encode(tail)]
        assert accepted(structure, tokens) and parse_tool_calls(vocab.decode(tokens).decode(), TOOLS)[1] == []
    # "<<" straddles a "<" of text and the trigger's
    (double,) = _tokens_with(vocab, lambda b: b == b"<<", limit=1)
    assert accepted(structure, [double, *encode("tool_call>"), *encode(call)])
    assert parse_tool_calls(vocab.decode([double, *encode("tool_call>" + call)]).decode(), TOOLS)[0] == "<"


# -- a trigger that is a special token --------------------------------------------------------------------------------


@pytest.fixture(scope="module", params=["cl100k", "gemma"])
def special(request, tokenizers):
    """(vocabulary, encode, format, block format, trigger id, closing id): a json-like format whose trigger is a
    special token that does not end the sequence (cl100k's <|fim_prefix|>, Gemma's <start_of_image>), and a
    hermes-like one whose calls are each enclosed in two special tokens (the first being the trigger)."""
    vocab, encode = tokenizers[request.param]
    opening, closing = {
        "cl100k": ("<|fim_prefix|>", "<|fim_suffix|>"),
        "gemma": ("<start_of_image>", "<end_of_image>"),
    }[request.param]
    ids = {name: i for i, name in vocab.special_names.items()}
    assert opening in ids and closing in ids
    eos = set(vocab.eos_ids.tolist())
    assert ids[opening] not in eos and ids[closing] not in eos and not vocab.matchable[ids[opening]]
    fmt = ToolFormat("special", trigger=opening, array=True)
    block = ToolFormat(
        "special-block",
        trigger=opening,
        trigger_in_block=True,
        call_open=opening + "\n",
        call_close="\n" + closing,
        separator="\n",
    )
    return vocab, encode, fmt, block, ids[opening], ids[closing]


def test_the_special_trigger_is_allowed_exactly_where_calls_may_open(special):
    vocab, encode, fmt, _, trigger, _ = special
    structure = compile_tools(TOOLS, vocab, format=fmt)
    spelled = encode(fmt.trigger)  # the trigger's name, spelled by text tokens
    assert trigger not in spelled and len(spelled) > 1
    text = [*encode("Let me see: "), *spelled, *encode(" is its name.")]
    calls = encode(fmt.write([CALLS[0], CALLS[1]]))
    sequence = [*text, trigger, *calls]
    assert accepted(structure, sequence)
    matcher = structure.matcher()
    for i, token in enumerate(sequence):
        assert in_mask(matcher, trigger) == (i <= len(text)), i
        matcher.advance(token)
    assert not in_mask(matcher, trigger) and matcher.is_accepting()
    # the spelled name is plain text: the structure may end after it, and nothing after it is calls
    assert accepted(structure, text)
    assert accepted(structure, [*spelled, *calls])  # text that looks like calls
    assert not accepted(structure, [*text, trigger])  # the trigger opens calls


def test_after_the_special_trigger_only_calls(special):
    vocab, encode, fmt, _, trigger, _ = special
    structure = compile_tools(TOOLS, vocab, format=fmt)
    matcher = structure.matcher()
    matcher.advance([*encode("Hi"), trigger])
    allowed = matcher.allowed_tokens().tolist()
    assert allowed and all(vocab.token_bytes(t)[:1] in (b"{", b"[") for t in allowed)
    for text in ["Hello", " ", "\n", fmt.trigger]:
        assert not accepted(structure, [trigger, *encode(text)])
    assert not accepted(structure, [trigger, trigger])
    assert not accepted(structure, [trigger, *encode(fmt.write([CALLS[0]])), trigger])
    assert accepted(structure, [trigger, *encode(fmt.write([CALLS[0], CALLS[4]]))])


def test_special_delimiters_in_the_block(special):
    vocab, encode, _, block, opening, closing = special
    structure = compile_tools(TOOLS, vocab, format=block)
    one, two = (
        encode(json.dumps({"name": n, "arguments": a}, separators=(",", ":"), ensure_ascii=False)) for n, a in CALLS[:2]
    )
    newline = encode("\n")
    calls = [opening, *newline, *one, *newline, closing, *newline, opening, *newline, *two, *newline, closing]
    assert accepted(structure, [*encode("Text."), *calls])
    assert accepted(structure, calls)
    assert not accepted(
        structure, [*encode("Text."), *calls[:-1], *encode(block.call_close)]
    )  # the name is not the token
    assert not accepted(structure, [*encode("Text."), *calls, *newline])
    matcher = structure.matcher()
    matcher.advance([opening, *newline, *one, *newline])
    assert in_mask(matcher, closing) and not in_mask(matcher, opening)


def test_random_token_sequences_with_the_special_trigger_agree_with_the_reference(special):
    """Pieces of text (the trigger's name spelled among them) and the trigger token, at random: accepted iff the
    trigger token does not occur, or it occurs once, after text, followed by calls exactly as written."""
    vocab, encode, fmt, _, trigger, _ = special
    structure = compile_tools(TOOLS, vocab, format=fmt)
    rng = random.Random(7)
    pieces = [encode(p) for p in [*PIECES, fmt.trigger, fmt.trigger[:3], fmt.trigger[3:]]]
    pieces += [encode(fmt.write(rng.sample(CALLS, rng.randint(1, 3)))) for _ in range(10)]
    pieces = [p for p in pieces if p is not None] + [[trigger]] * 4
    seen = collections.Counter()
    for _ in range(300):
        tokens = [t for _ in range(rng.randint(0, 6)) for t in rng.choice(pieces)]
        if rng.random() < 0.4:
            tokens += [trigger, *encode(fmt.write(rng.sample(CALLS, rng.randint(1, 3))))]
        if trigger in tokens:
            at = tokens.index(trigger)
            rest = tokens[at + 1 :]
            text = vocab.decode(rest).decode("utf-8", "replace")
            expected = trigger not in rest and reference(fmt.trigger + text, fmt)
        else:
            expected = True
        assert accepted(structure, tokens) == expected, vocab.text_with_specials(tokens)
        seen[trigger in tokens, expected] += 1
    assert seen[False, True] >= 25 and seen[True, True] >= 25 and seen[True, False] >= 25, seen


def test_the_special_trigger_is_refused_by_every_other_structure(special):
    vocab, encode, fmt, block, trigger, closing = special
    others = [
        compile_regex("(?s:.*)", vocab),
        compile_json_schema({"type": "string"}, vocab),
        compile_gbnf("root ::= [^x]*", vocab),
        compile_tools(TOOLS, vocab, format=fmt, tool_choice="required"),  # no trigger before calls alone
        compile_tools(TOOLS, vocab, format=fmt, tool_choice="none"),
        compile_tools(TOOLS, vocab, format="json"),
        compile_gbnf(f"root ::= <[{closing}]> [a-z]*", vocab),  # another special token named
    ]
    for structure in others:
        matcher = structure.matcher()
        for text in ["", "Hi ", '"x', fmt.write([CALLS[0]])[:-1]]:
            probe = matcher.copy()
            tokens = encode(text)
            if text and probe.validate_tokens(tokens) < len(tokens):
                continue
            probe.advance(tokens)
            assert not in_mask(probe, trigger) and not probe.accepts(trigger), (structure, text)
    assert not others[0].vocab.matchable[trigger]
    # while the structure of a format that names it allows it where the calls may open
    assert in_mask(compile_tools(TOOLS, vocab, format=block).matcher(), trigger)


def test_the_spelled_trigger_name_in_content_reads_back_as_content(special):
    vocab, encode, fmt, _, trigger, _ = special
    structure = compile_tools(TOOLS, vocab, format=fmt)
    tokens = [*encode("The token " + fmt.trigger + " opens calls. "), trigger, *encode(fmt.write([CALLS[0]]))]
    assert accepted(structure, tokens)
    content, calls = read_tool_calls(tokens, structure.vocab, TOOLS, format=fmt)
    assert content == "The token " + fmt.trigger + " opens calls. " and [c.name for c in calls] == ["add"]
    # in the text alone the spelled name and the token read the same: the text reader takes the first
    with pytest.raises(ToolCallError):
        parse_tool_calls(structure.vocab.text_with_specials(tokens), TOOLS, format=fmt)
