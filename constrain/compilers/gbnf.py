"""GBNF (llama.cpp's grammar format) to the grammar IR.

The parser is hand-written: no maintained Python package parses GBNF (llama.cpp's own parser is C++, and
llama-cpp-python only hands the text to it). It follows llama.cpp's ``llama-grammar.cpp``:

- rules ``name ::= alternatives``; names are ASCII letters, digits and ``-``; a rule ends at a line break,
  except after ``::=``, after ``|`` and inside parentheses, where line breaks are free; ``#`` comments;
- string literals ``"..."`` and character classes ``[...]`` / ``[^...]`` with ranges ``a-z``; both take the
  escapes ``\\n \\r \\t \\\\ \\" \\[ \\] \\- \\xNN \\uNNNN \\UNNNNNNNN``; ``.`` is any character;
- grouping, ``|``, and the quantifiers ``* + ? {m} {m,} {m,n}`` (stackable, as in llama.cpp).

Characters are Unicode code points, matched as their UTF-8 bytes. Where llama.cpp is loose this module refuses
with a :class:`GrammarSyntaxError` (line and column): a rule defined twice (llama.cpp keeps the last), a class
that matches nothing, a reversed range, surrogate code points (UTF-8 text cannot hold them; classes simply
leave them out), counts above 2000 (llama.cpp refuses a larger minimum but silently turns a larger maximum
into "unbounded").

Token references match one token: ``<[id]>`` by id, ``<text>`` the token whose text is ``<text>`` (a special token's
name such as ``<think>``, or a text token's exact text), and ``!<...>`` one token other than that. They are resolved
against the vocabulary at compile time (:mod:`constrain.grammar.tokens`): a named token matches exactly where the
grammar names it. A negation is honoured repeated (``!<[id]>*``, ``!<[id]>+``: text in which the token does not
occur); a lone negation, or one counted ``{m,n}``, is refused: a byte-level matcher cannot tell where one token ends.
Undefined rules and left recursion (which llama.cpp refuses too) are reported by
:func:`~constrain.grammar.rules.build_pushdown` with the rule's name.
"""

from __future__ import annotations

import re

from constrain.automata.limits import DEFAULT_TIME_LIMIT, time_limited
from constrain.automata.regex import deep_nesting_offset
from constrain.automata.utf8 import MAX_CODE_POINT, SURROGATES, complement_ranges
from constrain.errors import ArgumentError, GrammarSyntaxError
from constrain.grammar.ir import Alt, Expr, Grammar, Literal, Ref, Regex, Repeat, Seq, Token, TokensExcept
from constrain.runtime.pushdown import GrammarStructure, compile_grammar
from constrain.vocab.vocabulary import Vocabulary

#: llama.cpp's MAX_REPETITION_THRESHOLD: the largest count accepted in ``{m,n}``.
MAX_COUNT = 2000

_NAME = re.compile(r"[A-Za-z0-9-]+")
_TOKEN_REF = re.compile(r"<\[(\d+)\]>|<[^\s<>]+>")
_ONE_TOKEN = (
    "a negated token reference reads exactly one token, which a byte-level matcher cannot honour exactly; "
    "repeat it with * or + (text without that token)"
)
_COUNT = re.compile(r"\{[ \t]*(\d+)[ \t]*(?:(,)[ \t]*(\d*)[ \t]*)?\}")
_SIMPLE_ESCAPES = {"n": "\n", "r": "\r", "t": "\t", "\\": "\\", '"': '"', "[": "[", "]": "]", "-": "-"}
_HEX_ESCAPES = {"x": 2, "u": 4, "U": 8}
_SCALAR_VALUES = MAX_CODE_POINT + 1 - (SURROGATES[1] - SURROGATES[0] + 1)


def escape_char(code: int) -> str:
    """A character for a regex: ASCII letters and digits as themselves, any other as ``\\UNNNNNNNN``."""
    char = chr(code)
    return char if char.isascii() and char.isalnum() else f"\\U{code:08x}"


def escape_code_points(ranges: list[tuple[int, int]]) -> str:
    """The inside of a regex class for inclusive code point ranges."""
    return "".join(escape_char(lo) if lo == hi else f"{escape_char(lo)}-{escape_char(hi)}" for lo, hi in ranges)


def _without_surrogates(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out = []
    for lo, hi in ranges:
        if lo < SURROGATES[0]:
            out.append((lo, min(hi, SURROGATES[0] - 1)))
        if hi > SURROGATES[1]:
            out.append((max(lo, SURROGATES[1] + 1), hi))
    return out


def class_expr(ranges: list[tuple[int, int]]) -> Expr | None:
    """One character from ``ranges`` (sorted, disjoint; surrogates excluded), or None when they are empty.

    The regex compiler enumerates a class's characters, so a class covering most of Unicode is written as
    the negation of its (smaller) complement."""
    size = sum(hi - lo + 1 for lo, hi in ranges)
    if size == 0:
        return None
    if size == 1:
        return Literal(chr(ranges[0][0]))
    if size <= _SCALAR_VALUES // 2:
        return Regex(f"[{escape_code_points(ranges)}]")
    outside = _without_surrogates(complement_ranges(ranges))
    return Regex(f"[^{escape_code_points(outside)}]") if outside else Regex("(?s:.)")


class _Parser:
    """Recursive descent over the text, in the shape of llama.cpp's parser."""

    def __init__(self, text: str):
        self.text = text
        self.pos = 0
        self.rules: dict[str, Expr] = {}
        #: Whether a token reference was read; where each negated one is (until a quantifier takes it).
        self.names_tokens = False
        self.negations: dict[int, int] = {}

    def error(self, message: str, offset: int | None = None) -> GrammarSyntaxError:
        return GrammarSyntaxError.at(message, self.text, self.pos if offset is None else offset)

    def peek(self, count: int = 1) -> str:
        return self.text[self.pos : self.pos + count]

    def space(self, newline_ok: bool) -> None:
        text = self.text
        while self.pos < len(text):
            c = text[self.pos]
            if c == "#":
                while self.pos < len(text) and text[self.pos] not in "\r\n":
                    self.pos += 1
            elif c in " \t" or (newline_ok and c in "\r\n"):
                self.pos += 1
            else:
                return

    def parse(self) -> dict[str, Expr]:
        self.space(True)
        while self.pos < len(self.text):
            self.rule()
        return self.rules

    def rule(self) -> None:
        at = self.pos
        name = self.name()
        self.space(False)
        if self.peek(3) != "::=":
            raise self.error("expecting '::='")
        self.pos += 3
        self.space(True)
        body = self.alternates(nested=False)
        if self.peek(2) == "\r\n":
            self.pos += 2
        elif self.peek() in ("\r", "\n"):
            self.pos += 1
        elif self.pos < len(self.text):
            raise self.error("expecting a line break or the end of the grammar")
        if name in self.rules:
            raise self.error(f"rule {name!r} is defined twice", at)
        self.rules[name] = body
        self.space(True)

    def name(self) -> str:
        match = _NAME.match(self.text, self.pos)
        if not match:
            raise self.error("expecting a rule name (letters, digits and '-')")
        self.pos = match.end()
        return match.group(0)

    def alternates(self, nested: bool) -> Expr:
        options = [self.sequence(nested)]
        while self.peek() == "|":
            self.pos += 1
            self.space(True)
            options.append(self.sequence(nested))
        if len(options) > 1 or not nested:
            self.refuse_lone_negation(options)
        return options[0] if len(options) == 1 else Alt(tuple(options))

    def sequence(self, nested: bool) -> Expr:
        items: list[Expr] = []
        while self.pos < len(self.text):
            c = self.text[self.pos]
            if c == '"':
                items.append(self.string())
            elif c == "[":
                items.append(self.char_class())
            elif c == ".":
                self.pos += 1
                items.append(Regex("(?s:.)"))
            elif c == "(":
                open_at = self.pos
                self.pos += 1
                self.space(True)
                items.append(self.alternates(nested=True))
                if self.peek() != ")":
                    opened = GrammarSyntaxError.at("", self.text, open_at)
                    raise self.error(f"expecting ')' for the '(' at line {opened.line}, column {opened.column}")
                self.pos += 1
            elif c in "*+?{":
                if not items:
                    raise self.error(f"{c!r} needs an item before it")
                items[-1] = self.quantifier(items[-1])
            elif c in "<!":
                items.append(self.token_reference())
            elif _NAME.match(c):
                items.append(Ref(self.name()))
            else:
                break
            self.space(nested)
        if len(items) > 1:
            self.refuse_lone_negation(items)
        return items[0] if len(items) == 1 else Seq(tuple(items))

    def refuse_lone_negation(self, items: list[Expr]) -> None:
        """A negated token reference that no quantifier repeats (a single one is left to the caller, which may)."""
        for item in items:
            if type(item) is TokensExcept:
                raise self.error(_ONE_TOKEN, self.negations[id(item)])

    def token_reference(self) -> Expr:
        """``<[id]>``, ``<text>`` (the token whose text that is) or their negation ``!<...>``: one token."""
        at = self.pos
        negated = self.peek() == "!"
        self.pos += negated
        if self.peek() != "<":
            raise self.error("expecting '<' after '!' (a negated token reference)")
        match = _TOKEN_REF.match(self.text, self.pos)
        if not match:
            raise self.error("expecting a token reference: <[id]> or <text> (no spaces, closed by '>')")
        self.pos = match.end()
        ref: int | str = int(match.group(1)) if match.group(1) is not None else match.group(0)
        self.names_tokens = True
        if not negated:
            return Token(ref)
        expr = TokensExcept((ref,))
        self.negations[id(expr)] = at
        return expr

    def quantifier(self, item: Expr) -> Repeat:
        at = self.pos
        out = self._quantified(item)
        if type(item) is TokensExcept and (out.max is not None or out.min > 1):
            raise self.error(_ONE_TOKEN, at)
        return out

    def _quantified(self, item: Expr) -> Repeat:
        c = self.text[self.pos]
        if c != "{":
            self.pos += 1
            return {"*": Repeat(item), "+": Repeat(item, 1), "?": Repeat(item, 0, 1)}[c]
        match = _COUNT.match(self.text, self.pos)
        if not match:
            raise self.error("expecting {m}, {m,} or {m,n}")
        low = int(match.group(1))
        high = low if match.group(2) is None else (int(match.group(3)) if match.group(3) else None)
        if max(low, high or 0) > MAX_COUNT:
            raise self.error(f"counts above {MAX_COUNT} are refused")
        if high is not None and high < low:
            raise self.error(f"the maximum {high} is below the minimum {low}")
        self.pos = match.end()
        return Repeat(item, low, high)

    def char(self) -> int:
        """One character of a string or class: an escape or a literal character; its code point."""
        at = self.pos
        c = self.text[self.pos]
        if c != "\\":
            self.pos += 1
            return ord(c)
        letter = self.text[self.pos + 1 : self.pos + 2]
        if letter in _SIMPLE_ESCAPES:
            self.pos += 2
            return ord(_SIMPLE_ESCAPES[letter])
        if letter not in _HEX_ESCAPES:
            raise self.error(f"unknown escape '\\{letter}'", at)
        digits = _HEX_ESCAPES[letter]
        code = self.text[self.pos + 2 : self.pos + 2 + digits]
        if len(code) != digits or not all(d in "0123456789abcdefABCDEF" for d in code):
            raise self.error(f"'\\{letter}' needs {digits} hex digits", at)
        self.pos += 2 + digits
        value = int(code, 16)
        if value > MAX_CODE_POINT:
            raise self.error("code point beyond U+10FFFF", at)
        return value

    def string(self) -> Literal:
        open_at = self.pos
        self.pos += 1
        chars = []
        while self.peek() != '"':
            if self.pos >= len(self.text):
                raise self.error("unterminated string", open_at)
            at = self.pos
            value = self.char()
            if SURROGATES[0] <= value <= SURROGATES[1]:
                raise self.error("surrogate code points cannot appear in UTF-8 text", at)
            chars.append(chr(value))
        self.pos += 1
        return Literal("".join(chars))

    def char_class(self) -> Expr:
        open_at = self.pos
        self.pos += 1
        negated = self.peek() == "^"
        self.pos += negated
        ranges = []
        while self.peek() != "]":
            if self.pos >= len(self.text):
                raise self.error("unterminated character class", open_at)
            at = self.pos
            low = high = self.char()
            if self.peek() == "-" and self.peek(2) not in ("-]", "-"):
                self.pos += 1
                high = self.char()
                if high < low:
                    raise self.error("the range ends before it starts", at)
            ranges.append((low, high))
        self.pos += 1
        merged: list[tuple[int, int]] = []
        for low, high in sorted(ranges):
            if merged and low <= merged[-1][1] + 1:
                merged[-1] = (merged[-1][0], max(merged[-1][1], high))
            else:
                merged.append((low, high))
        if negated:
            merged = complement_ranges(merged)
        expr = class_expr(_without_surrogates(merged))
        if expr is None:
            raise self.error("this character class matches no character", open_at)
        return expr


def gbnf_to_grammar(text: str, start: str = "root") -> Grammar:
    """The grammar IR of a GBNF grammar; ``start`` names the rule the whole text must match."""
    if not isinstance(text, str):
        raise ArgumentError("text", text, "a GBNF grammar must be a str")
    try:
        parser = _Parser(text)
        rules = parser.parse()
        return Grammar(rules, start, names_tokens=parser.names_tokens)
    except RecursionError:
        offset = deep_nesting_offset(text)
        raise GrammarSyntaxError.at("groups nest too deeply", text, offset if offset is not None else 0) from None


def compile_gbnf(
    text: str,
    vocab: Vocabulary,
    *,
    start: str = "root",
    time_limit: float | None = DEFAULT_TIME_LIMIT,
    **options,
) -> GrammarStructure:
    """Compile a GBNF grammar for ``vocab``; ``options`` (``cache_bytes``) go to the structure. ``time_limit``:
    CPU seconds before :class:`~constrain.errors.CompileTimeout` (None: no limit)."""
    with time_limited(time_limit, "the GBNF grammar"):
        return compile_grammar(gbnf_to_grammar(text, start), vocab, source=text, **options)
