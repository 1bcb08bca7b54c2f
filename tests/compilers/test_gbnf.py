"""GBNF grammars: the parser against Python's ``re`` (regular grammars), lark (recursive ones) and
``json.loads`` (the bundled JSON grammar), masks on the real Gemma vocabulary, and errors with positions."""

from __future__ import annotations

import itertools
import json
import random
import re

import lark
import numpy as np
import pytest

from constrain import grammars
from constrain.compilers.gbnf import compile_gbnf, gbnf_to_grammar
from constrain.errors import GrammarError, GrammarSyntaxError
from constrain.integrations.vllm import RequestType, compile_structure
from constrain.testing import accepts_text, brute_force_mask, byte_vocabulary, token_length_weights

BYTES = byte_vocabulary()


def json_ok(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


# A regular grammar using every construct, next to the Python regex for the same language.
REGULAR = r"""
# a comment line
root ::= word (sep word){0,2} tail?   # a trailing comment
word ::= [a-c]+ | "\x41\u00e9" | [^a-c\n ,;A\u00e9] |
         "(" ( "x" | [0-9]{2,} )* ")"
sep  ::= "," | " "+
tail ::= ";" . {1}
"""
REGULAR_RE = (
    r"(?s)(?:[a-c]+|A\u00e9|[^a-c\n ,;A\u00e9]|\((?:x|[0-9]{2,})*\))"
    r"(?:(?:,| +)(?:[a-c]+|A\u00e9|[^a-c\n ,;A\u00e9]|\((?:x|[0-9]{2,})*\))){0,2}(?:;.)?"
)


def test_a_regular_grammar_equals_its_regex_on_every_short_string():
    structure = compile_gbnf(REGULAR, BYTES)
    for n in range(5):
        for chars in itertools.product("abA\u00e9 ,;(x1\n", repeat=n):
            s = "".join(chars)
            assert accepts_text(structure, s) == bool(re.fullmatch(REGULAR_RE, s)), s


def test_escapes_in_strings_and_classes():
    structure = compile_gbnf(r'root ::= "\n\t\r\\\"\[\]\-\x41\u00e9\U0001F600" [\x00-\x1F\]\-a-c\u00e9-\u00ea]', BYTES)
    head = '\n\t\r\\"[]-A\u00e9\U0001f600'
    members = {chr(c) for c in range(0x20)} | set("]-abc\u00e9\u00ea")
    for code in list(range(0x300)) + [0x1F600, 0x10FFFF]:
        assert accepts_text(structure, head + chr(code)) == (chr(code) in members), hex(code)


def test_classes_are_exact_over_unicode():
    cases = {
        r"[^a]": lambda c: c != "a",
        r".": lambda c: True,
        r"[\u0100-\U0010FFFF]": lambda c: ord(c) >= 0x100,
        r"[^\x00-\x7F\u00e9]": lambda c: ord(c) > 0x7F and c != "\u00e9",
        r"[\uD7FF-\uE000]": lambda c: ord(c) in (0xD7FF, 0xE000),  # the surrogates between are left out
    }
    probes = [
        chr(c)
        for c in [
            0,
            0x41,
            0x61,
            0x7F,
            0x80,
            0xE9,
            0xFF,
            0x100,
            0x7FF,
            0x800,
            0xD7FF,
            0xE000,
            0xFFFF,
            0x10000,
            0x1F600,
            0x10FFFF,
        ]
    ]
    for body, member in cases.items():
        structure = compile_gbnf(f"root ::= {body}", BYTES)
        for c in probes:
            assert accepts_text(structure, c) == member(c), (body, hex(ord(c)))
        assert not accepts_text(structure, "") and not accepts_text(structure, "aa")
    # bytes that are not UTF-8 never pass, not even through "."
    matcher = compile_gbnf("root ::= .", BYTES).matcher()
    assert matcher.validate_tokens([0xED, 0xA0, 0x80]) == 1 and matcher.validate_tokens([0xFF]) == 0


ARITHMETIC_GBNF = r"""
root   ::= expr
expr   ::= term (("+" | "-") term)*
term   ::= factor (("*" | "/") factor)*
factor ::= [0-9]+ ("." [0-9]+)? | "-" factor | "(" expr ")"
"""
ARITHMETIC_LARK = r"""
start: expr
expr: term (("+" | "-") term)*
term: factor (("*" | "/") factor)*
factor: /[0-9]+(\.[0-9]+)?/ | "-" factor | "(" expr ")"
"""


def test_a_recursive_grammar_equals_lark_on_every_short_string():
    structure = compile_gbnf(ARITHMETIC_GBNF, BYTES)
    parser = lark.Lark(ARITHMETIC_LARK, parser="earley", lexer="dynamic_complete")
    for n in range(5):
        for chars in itertools.product("1.+-*()", repeat=n):
            s = "".join(chars)
            try:
                parser.parse(s)
                expected = True
            except lark.exceptions.LarkError:
                expected = False
            assert accepts_text(structure, s) == expected, s


def test_quantifiers_counts_and_stacking():
    structure = compile_gbnf('root ::= "a"{2} "b"{1,} "c"{0,2} ("d" "e")+ "f"*? ', BYTES)
    pattern = r"aab+c{0,2}(de)+f*"
    for n in range(6):
        for chars in itertools.product("abcdef", repeat=n):
            s = "aa" + "".join(chars)
            assert accepts_text(structure, s) == bool(re.fullmatch(pattern, s)), s
    assert not accepts_text(structure, "abde")


# ---------------------------------------------------------------------------------------------------------------
# the bundled JSON grammar against json.loads


def random_json(rng: random.Random, depth: int = 0):
    kind = rng.choice(["obj", "arr", "str", "num", "lit"] if depth < 3 else ["str", "num", "lit"])
    if kind == "obj":
        return {random_string(rng): random_json(rng, depth + 1) for _ in range(rng.randint(0, 3))}
    if kind == "arr":
        return [random_json(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    if kind == "str":
        return random_string(rng)
    if kind == "num":
        return rng.choice([0, -1, 17, 3.25, -0.5e-7, 1e21, rng.randint(-(10**6), 10**6)])
    return rng.choice([True, False, None])


def random_string(rng: random.Random) -> str:
    return "".join(rng.choice('ab "\\/\n\t\u00e9\u2028\U0001f600\x01') for _ in range(rng.randint(0, 5)))


def spaced(text: str, rng: random.Random) -> str:
    """``text`` (compact JSON) with random whitespace between tokens, outside strings."""
    out, in_string, escaped = [], False, False
    for c in text:
        if not in_string and c in "{}[],:" and rng.random() < 0.5:
            out.append(rng.choice([" ", "\n", "\t", "\r\n "]))
        out.append(c)
        if in_string:
            in_string = escaped or c != '"'
            escaped = not escaped and c == "\\"
        elif c == '"':
            in_string = True
    return "".join(out)


def test_json_gbnf_accepts_exactly_what_json_loads_accepts():
    structure = compile_gbnf(grammars.load("json.gbnf"), BYTES)
    for n in range(4):
        for chars in itertools.product('{}[]",:1 -.e', repeat=n):
            s = "".join(chars)
            assert accepts_text(structure, s) == json_ok(s), s
    rng = random.Random(0)
    for _ in range(150):
        text = spaced(json.dumps(random_json(rng), ensure_ascii=rng.random() < 0.5), rng)
        assert accepts_text(structure, text), text
        for _ in range(4):
            chars = list(text)
            i = rng.randrange(len(chars) + 1)
            op = rng.choice("idr")
            if op == "i":
                chars.insert(i, rng.choice('{}[]",:1 -.e\\u0atr'))
            elif i < len(chars):
                chars[i : i + 1] = [] if op == "d" else [rng.choice('{}[]",:1 -.e\\u0atr')]
            mutated = "".join(chars)
            assert accepts_text(structure, mutated) == json_ok(mutated), mutated


def test_gemma_random_walks_under_the_mask_produce_json(gemma_vocab):
    structure = compile_gbnf(grammars.load("json.gbnf"), gemma_vocab)
    rng = np.random.default_rng(0)
    short = token_length_weights(gemma_vocab)  # short tokens close strings and brackets sooner
    is_eos = np.zeros(gemma_vocab.size, dtype=bool)
    is_eos[list(gemma_vocab.eos_ids)] = True
    finished = 0
    for _ in range(6):
        matcher = structure.matcher()
        tokens: list[int] = []
        for _step in range(80):
            allowed = matcher.allowed_tokens()
            assert len(allowed), "dead end"
            # the mask agrees with reading each token, on a sample of allowed and other tokens
            sample = np.union1d(
                rng.choice(allowed, min(40, len(allowed)), replace=False),
                rng.choice(gemma_vocab.size, 40, replace=False),
            )
            in_mask = np.isin(sample, allowed)
            read = brute_force_mask(matcher, sample.tolist())
            for token, expected in zip(sample.tolist(), in_mask.tolist()):
                if gemma_vocab.matchable[token]:
                    assert read[token] == expected, token
            if matcher.is_accepting() and rng.random() < 0.3:
                break
            allowed = allowed[~is_eos[allowed]]
            weights = short[allowed]
            token = int(rng.choice(allowed, p=weights / weights.sum()))
            matcher.advance(token)
            tokens.append(token)
        if matcher.is_accepting():
            finished += 1
            text = gemma_vocab.decode(tokens).decode()
            assert json_ok(text), text
    assert finished >= 2


# ---------------------------------------------------------------------------------------------------------------
# errors


@pytest.mark.parametrize(
    "text, line, column, message",
    [
        ('root ::= "a', 1, 10, "unterminated string"),
        ('root ::= "a"\nitem ::= [a-', 2, 10, "unterminated character class"),
        ('root ::= "\\q"', 1, 11, "unknown escape '\\q'"),
        ('root ::= "\\x4"', 1, 11, "'\\x' needs 2 hex digits"),
        ('root ::= "\\U00110000"', 1, 11, "beyond U+10FFFF"),
        ('root ::= "\\uD800"', 1, 11, "surrogate"),
        ('root ::= (\n  "a"\n', 3, 1, "expecting ')' for the '(' at line 1, column 10"),
        ('root := "a"', 1, 6, "expecting '::='"),
        ("::= x", 1, 1, "expecting a rule name"),
        ('root ::= * "a"', 1, 10, "'*' needs an item before it"),
        ('root ::= "a" )', 1, 14, "expecting a line break"),
        ('root ::= "a"\n  "b"', 2, 3, "expecting a rule name"),
        ("root ::= []", 1, 10, "matches no character"),
        ("root ::= [^\\x00-\\U0010FFFF]", 1, 10, "matches no character"),
        ("root ::= [b-a]", 1, 11, "ends before it starts"),
        ('root ::= "a"{3000}', 1, 13, "counts above 2000"),
        ('root ::= "a"{3,2}', 1, 13, "below the minimum"),
        ('root ::= "a"{,2}', 1, 13, "expecting {m}, {m,} or {m,n}"),
        ("root ::= !<[12]>", 1, 10, "negated token reference reads exactly one token"),
        ('root ::= "a" (!<[12]>){2,3}', 1, 23, "negated token reference"),
        ("root ::= <[12]", 1, 10, "expecting a token reference"),
        ('root ::= "a"\n# note\nroot ::= "b"', 3, 1, "rule 'root' is defined twice"),
    ],
)
def test_syntax_errors_give_lines_and_columns(text, line, column, message):
    with pytest.raises(GrammarSyntaxError) as info:
        gbnf_to_grammar(text)
    assert (info.value.line, info.value.column) == (line, column)
    assert message in str(info.value) and f"line {line}, column {column}" in str(info.value)


def test_multi_line_rules_and_comments():
    text = 'root ::= "a" |  # first\n  "b" (\n  "c"\n  | "d" ) # last\n\n# done\n'
    structure = compile_gbnf(text, BYTES)
    assert [accepts_text(structure, s) for s in ["a", "bc", "bd", "b", "ab"]] == [True, True, True, False, False]
    crlf = compile_gbnf('root ::= x\r\nx ::= "y"\r\n', BYTES)
    assert accepts_text(crlf, "y")


def test_rule_errors_name_the_rule():
    with pytest.raises(GrammarError, match="undefined rule 'nope'"):
        compile_gbnf("root ::= nope", BYTES)
    with pytest.raises(GrammarError, match="left recursion: root -> root"):
        compile_gbnf('root ::= root "a" | "b"', BYTES)
    with pytest.raises(GrammarError, match="start rule 'root'"):
        compile_gbnf('main ::= "a"', BYTES)
    assert accepts_text(compile_gbnf('main ::= "a"', BYTES, start="main"), "a")
    with pytest.raises(TypeError):
        gbnf_to_grammar(b'root ::= "a"')


def test_vllm_grammar_requests_in_gbnf_syntax_compile():
    structure = compile_structure(RequestType.GRAMMAR, 'root ::= "ok"+', BYTES)
    assert accepts_text(structure, "okok") and not accepts_text(structure, "o")
