"""Lark grammars: the structure's language against lark's own Earley parser.

The oracle is ``lark.Lark(text, parser="earley", lexer="dynamic_complete")``: the lexer that tries every length
of a terminal's match, whose language is the context-free one the IR computes (see constrain/compilers/lark.py;
``lexer="dynamic"`` takes only each regex's preferred match, which the last tests pin).
"""

from __future__ import annotations

import itertools
import json
import random
import re

import lark
import pytest

from constrain import grammars
from constrain.compilers.lark import _LEXER_LANGUAGE, compile_lark, lark_to_grammar
from constrain.errors import GrammarError, GrammarSyntaxError
from constrain.integrations.vllm import RequestType, compile_structure
from constrain.testing import accepts_text, byte_vocabulary, random_vocabulary, random_walk

BYTES = byte_vocabulary()

# Most of lark's grammar features in one grammar: ?rule, _rule, [], ?, *, +, ~ n, ~ n..m, "..."i, /.../i,
# terminal references, a template, %import, two %ignore terminals, direct left recursion in a helper rule.
FEATURES = r"""
start: _items
_items: _items ";" item | item
?item: WORD
     | "x"i ~ 2
     | pair
     | "[" [item] "]"
     | _sep{NUM, "+"} "!"?
     | "<" item* ">"
pair: "(" item ~ 1..2 ")"
WORD: /b[ab]?/i
NUM: DIGIT DIGIT?
DIGIT: "1" | "2"
_sep{x, sep}: x (sep x)*
COMMENT: "#" /[^\n]/* "\n"
%import common.WS_INLINE
%ignore WS_INLINE
%ignore COMMENT
"""


def lark_parser(text: str, lexer: str = "dynamic_complete") -> lark.Lark:
    return lark.Lark(text, parser="earley", lexer=lexer)


def lark_accepts(parser: lark.Lark, text: str) -> bool:
    try:
        parser.parse(text)
    except lark.exceptions.LarkError:
        return False
    return True


def mutations(text: str, alphabet: str, rng: random.Random, count: int) -> list[str]:
    """Near misses: ``count`` copies of ``text`` with one to three characters inserted, deleted or replaced."""
    out = []
    for _ in range(count):
        chars = list(text)
        for _ in range(rng.randint(1, 3)):
            i = rng.randint(0, len(chars))
            op = rng.choice("idr") if chars else "i"
            if op == "i":
                chars.insert(i, rng.choice(alphabet))
            elif i < len(chars):
                if op == "d":
                    del chars[i]
                else:
                    chars[i] = rng.choice(alphabet)
        out.append("".join(chars))
    return out


# ---------------------------------------------------------------------------------------------------------------
# the language, against lark


@pytest.mark.parametrize(
    "name, text, alphabet, length",
    [
        ("arithmetic", grammars.load("arithmetic.lark"), "1.-*() ", 4),
        ("features", FEATURES, "xb1+[](;", 4),
        ("csv", grammars.load("csv.lark"), 'a,"\n\r', 5),
        ("json", grammars.load("json.lark"), '{}[]",:1 ', 4),
        ("strings", 'start: ESCAPED_STRING ("," ESCAPED_STRING)*\n%import common.ESCAPED_STRING', '"\\a,\n', 6),
    ],
)
def test_acceptance_equals_lark_on_every_short_string(name, text, alphabet, length):
    structure = compile_lark(text, BYTES)
    parser = lark_parser(text)
    for n in range(length + 1):
        for chars in itertools.product(alphabet, repeat=n):
            s = "".join(chars)
            assert accepts_text(structure, s) == lark_accepts(parser, s), (name, s)


SQL_UNITS = (
    "SELECT FROM WHERE AND OR NOT NULL IS IN JOIN ON AS LIMIT ORDER GROUP BY DESC select from a t x1 _ * , . = < > "
    "( ) ' ; - \n"
).split(" ")


@pytest.mark.parametrize(
    "name, text, units, alphabet",
    [
        ("arithmetic", grammars.load("arithmetic.lark"), list("12.e-+*/() \t"), "12.e-+*/() \t"),
        ("features", FEATURES, list("xXbBa12+[];()<>! #\n"), "xXbBa12+[];()<>! #\n"),
        ("csv", grammars.load("csv.lark"), list('ab ,"\n\r'), 'ab ,"\n\r'),
        ("sql", grammars.load("sql_select.lark"), SQL_UNITS + [" "] * 5, "SELCTFROMWHEabt1*,.=<>()';- \n"),
    ],
)
def test_random_walks_parse_and_near_misses_agree_with_lark(name, text, units, alphabet):
    # Each unit, each character of the units (and a two-byte one), and a few thousand random runs of units, so that
    # tokens cross rule boundaries; no other bytes, so that a walk does not wander in comments and strings.
    vocab = random_vocabulary(units, count=3000, lengths=(2, 4), extra=[*units, *"".join(units), "é"])
    walker = compile_lark(text, vocab)
    structure = compile_lark(text, BYTES)
    parser = lark_parser(text)
    rng = random.Random(0)
    walks = [random_walk(walker, rng, max_tokens=80) for _ in range(30)]
    walks = sorted((vocab.decode(w).decode() for w in walks if w is not None), key=len)
    assert len(walks) >= 8, name
    for walk in walks[:8]:  # the shortest: lark's parser is slow on long texts
        assert lark_accepts(parser, walk), (name, walk)
        assert accepts_text(structure, walk), (name, walk)
        for s in mutations(walk, alphabet, rng, 10):
            assert accepts_text(structure, s) == lark_accepts(parser, s), (name, walk, s)


def test_sql_statements():
    structure = compile_lark(grammars.load("sql_select.lark"), BYTES)
    for good in [
        "SELECT * FROM users",
        "select 1 from t;",
        "SELECT u.id, name AS n FROM users AS u LEFT JOIN orders ON u.id = orders.uid WHERE NOT a IS NULL "
        "AND (b > 2 OR c IN (1, 'x''y')) GROUP BY u.id ORDER BY n DESC, u.id LIMIT 10\n",
    ]:
        assert accepts_text(structure, good), good
    for bad in ["SELECT FROM t", "SELECT * FROM", "SELECT * FROM t LIMIT x", "SELECT 'a FROM t"]:
        assert not accepts_text(structure, bad), bad


def test_json_lark_is_json():
    structure = compile_lark(grammars.load("json.lark"), BYTES)
    rng = random.Random(1)
    for n in range(4):
        for chars in itertools.product('{}[]",:1 -.e', repeat=n):
            s = "".join(chars)
            assert accepts_text(structure, s) == _json_ok(s), s
    for value in [{"a": [1, -2.5e3, "x\\y\u00e9\n"], "b": None, "c": [True, False, {}]}, [], "", 0]:
        text = json.dumps(value, indent=rng.choice([None, 1]))
        assert accepts_text(structure, text), text
        for s in mutations(text, '{}[]",:1 -.e\\u0\t', rng, 40):
            assert accepts_text(structure, s) == _json_ok(s), s


def _json_ok(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


# ---------------------------------------------------------------------------------------------------------------
# semantics pinned in the module docstring


def test_dynamic_complete_is_the_language_dynamic_takes_only_the_preferred_match():
    text = 'start: A "a"\nA: /a+/'
    structure = compile_lark(text, BYTES)
    assert accepts_text(structure, "aa") and accepts_text(structure, "aaa")
    assert lark_accepts(lark_parser(text), "aa")
    assert not lark_accepts(lark_parser(text, "dynamic"), "aa")


def test_left_recursion_is_rewritten_and_keeps_the_language():
    text = 'start: start "-" NUM | start "+" NUM | NUM | start\nNUM: /[0-9]/'
    structure = compile_lark(text, BYTES)
    parser = lark_parser(text)
    for s in ["1", "1-2", "1-2+3-4", "", "-1", "1-", "1+-2"]:
        assert accepts_text(structure, s) == lark_accepts(parser, s) == (s in ("1", "1-2", "1-2+3-4")), s


@pytest.mark.parametrize("lark_regex, exact", list(_LEXER_LANGUAGE.items()))
def test_lazy_common_terminals_are_replaced_by_the_lexers_matches(lark_regex, exact):
    # On every text, lark's lexer takes the regex's match; exactly one prefix of the text is in the replacement's
    # language when there is a match, and none otherwise.
    alphabet = '"\\a\n' if lark_regex.startswith('"') else "/*a\n"
    for n in range(9):
        for chars in itertools.product(alphabet, repeat=n):
            text = "".join(chars)
            match = re.match(lark_regex, text)
            prefixes = [text[:i] for i in range(len(text) + 1) if re.fullmatch(exact, text[:i])]
            assert prefixes == ([match.group(0)] if match else []), text


def test_ignored_text_goes_between_tokens_and_around_the_text_only():
    text = 'start: "ab" NAME\nNAME: /[a-z]+/\n%ignore " "'
    structure = compile_lark(text, BYTES)
    parser = lark_parser(text)
    for s in ["abx", " ab x ", "ab   xy", "a b x", "ab x y"]:
        assert accepts_text(structure, s) == lark_accepts(parser, s), s
    assert not accepts_text(structure, "a b x") and not accepts_text(structure, "ab x y")


def test_an_ignored_match_may_end_early_here_where_lark_takes_the_longest():
    # The documented difference: a line comment without its line break may stop before the end of the line.
    loose = 'start: "a" "b"\n%ignore /#[^\\n]*/'
    assert accepts_text(compile_lark(loose, BYTES), "a#b") and not lark_accepts(lark_parser(loose), "a#b")
    exact = 'start: "a" "b"\n%ignore /#[^\\n]*\\n/'
    for s in ["a#b", "a#b\nb", "a#\n#x\nb", "a b#\n"]:
        assert accepts_text(compile_lark(exact, BYTES), s) == lark_accepts(lark_parser(exact), s), s


# ---------------------------------------------------------------------------------------------------------------
# errors


@pytest.mark.parametrize(
    "text, line, column, message",
    [
        ('start: "a" (\n', 1, 13, "Unclosed parenthesis"),
        ('start: "a"\nfoo bar: x\n', 2, 5, "Unexpected token"),
        ('start: "a" @ "b"\n', 1, 12, "Unexpected input"),
        ('start: "a"\n\nstart2: "abc\n', 3, 9, "Unexpected input"),
    ],
)
def test_syntax_errors_give_lines_and_columns(text, line, column, message):
    with pytest.raises(GrammarSyntaxError) as info:
        lark_to_grammar(text)
    assert (info.value.line, info.value.column) == (line, column)
    assert message in str(info.value) and f"line {line}, column {column}" in str(info.value)
    assert isinstance(info.value, GrammarError)


@pytest.mark.parametrize(
    "text, match",
    [
        ("start: foo\n", "'foo' used but not defined"),
        ("%declare FOO\nstart: FOO\n", r"FOO has no definition \(%declare\)"),
        ('start: /".*?"/\n', "lazy or possessive quantifier at position 2"),
        ("start: /ba*+/\n", "lazy or possessive"),
        ("start: /a b/x\n", "flags 'x'"),
        ("start: /(?<=a)b/\n", "lookaround is not supported"),
        ('start: "é"i\n', "non-ASCII letter"),
        ("start: A\nA: /a*/\n", "zero-width"),
        ("start: /a(/\n", "lark refuses"),
        ('start: "a"\nstart: "b"\n', "defined more than once"),
    ],
)
def test_refusals_name_the_culprit(text, match):
    with pytest.raises(GrammarError, match=match):
        lark_to_grammar(text)


def test_left_recursion_through_other_rules_is_refused_naming_them():
    text = 'start: a\na: b "x" | "y"\nb: a "z" | "w"\n'
    with pytest.raises(GrammarError, match=r"left recursion: (a -> b -> a|b -> a -> b)"):
        compile_lark(text, BYTES)
    with pytest.raises(GrammarError, match="never complete"):
        compile_lark('start: start "x"\n', BYTES)


def test_the_start_rule_must_exist():
    with pytest.raises(GrammarError, match="nope"):
        lark_to_grammar('start: "a"\n', start="nope")
    structure = compile_lark('start: "a"\nother: "b"\n', BYTES, start="other")
    assert accepts_text(structure, "b") and not accepts_text(structure, "a")


def test_text_must_be_a_string():
    with pytest.raises(TypeError):
        lark_to_grammar(b'start: "a"')


# ---------------------------------------------------------------------------------------------------------------
# bundled grammars and vLLM


def test_bundled_grammars_load_and_compile():
    assert grammars.names() == ["arithmetic.lark", "csv.lark", "json.gbnf", "json.lark", "sql_select.lark"]
    for name in grammars.names():
        if name.endswith(".lark"):
            assert compile_lark(grammars.load(name), BYTES).matcher() is not None
    with pytest.raises(ValueError, match="json.lark"):
        grammars.load("nope.lark")


def test_vllm_grammar_requests_in_lark_syntax_compile():
    structure = compile_structure(RequestType.GRAMMAR, 'start: "ok"+', BYTES)
    assert accepts_text(structure, "okok") and not accepts_text(structure, "o")
