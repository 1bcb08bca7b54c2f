"""Regular expressions to byte-level automata.

Parsing is interegular's (a well-kept pure-Python parser of Python regex syntax); this module extends its
parser where its own behaviour would be wrong or silent, and builds the automaton itself, over bytes, so that
Unicode classes become exact UTF-8 byte sequences.

Supported subset (the whole string must match, as with :func:`re.fullmatch`):

- literals, escapes (``\\n \\t \\xNN \\uNNNN \\UNNNNNNNN`` and escaped punctuation), ``.`` (any character but
  ``\\n``; any character at all under ``(?s)``), classes ``[...]`` and ``[^...]`` with ranges;
- ``\\d \\w \\s`` and their negations with ASCII meaning (``[0-9]``, ``[A-Za-z0-9_]``, ``[ \\t\\n\\r\\f\\v]``), as in
  ECMAScript, the dialect of JSON Schema patterns, and Python's ``re.ASCII``;
- groups ``(...)``, ``(?:...)``, ``(?P<name>...)``, alternation, ``* + ? {n} {n,} {n,m} {,m}`` and their lazy forms
  (laziness does not change which strings match);
- anchors ``^ $ \\A \\Z`` anywhere (``$`` means the end of the text, as in ECMAScript);
- inline flags ``(?s)`` and ``(?i)`` (ASCII letters only; ``(?i)`` over a cased non-ASCII letter is refused),
  also scoped as ``(?i:...)``.

Refused with a :class:`~constrain.errors.RegexError` that gives the position: lookahead and lookbehind,
backreferences, conditionals, word boundaries ``\\b \\B``, Unicode properties ``\\p{..}``, the flags ``m x u L``,
surrogate code points, and any syntax error.

"""

from __future__ import annotations

import re
from dataclasses import dataclass

from interegular.patterns import (
    InvalidSyntax,
    NoMatch,
    Pattern,
    REFlags,
    Unsupported,
    _CharGroup,
    _combine_char_groups,
    _Concatenation,
    _NonCapturing,
    _ParsePattern,
    _Repeated,
    nomatch,
)

from constrain.automata.dfa import ByteDFA
from constrain.automata.limits import AUTOMATON_CACHE_BYTES, check_deadline
from constrain.automata.nfa import BEGIN, END, ByteNFA
from constrain.automata.utf8 import MAX_CODE_POINT, code_point_ranges, complement_ranges
from constrain.cache import memoized
from constrain.errors import ArgumentError, RegexError

# Anchors travel through interegular's parse tree as lone surrogates, which no text can contain.
_BEGIN_CHAR = "\ud800"
_END_CHAR = "\ud801"
_MARKERS = {_BEGIN_CHAR: BEGIN, _END_CHAR: END}

_LITERAL_RUN = re.compile(r"[^\\\[\](){}.*+?^$|#]+")
_INLINE_FLAGS = re.compile(r"[a-zA-Z]*(?:-[a-zA-Z]*)?[:)]")

#: The largest counted repetition accepted (``a{0,N}``); more is refused as hostile.
MAX_REPEAT = 10_000


@dataclass(frozen=True)
class _Literal:
    """A run of plain characters (a parse-tree node of ours, next to interegular's)."""

    text: str


class _Parser(_ParsePattern):
    """interegular's parser, with anchors, ``\\u`` escapes and exact error positions."""

    def __init__(self, data: str):
        super().__init__(data)
        self.pattern_text = data

    def fail(self, message: str, position: int) -> RegexError:
        return RegexError(message, self.pattern_text, position)

    def conc(self):
        # Runs of plain characters are by far the commonest input; take them in one step instead of one parser
        # call per character (a quantified last character stays for the general path).
        parts = []
        while True:
            check_deadline()
            run = _LITERAL_RUN.match(self.data, self.index)
            if run:
                text = run.group(0)
                if run.end() < len(self.data) and self.data[run.end()] in "*+?{":
                    text = text[:-1]
                if text:
                    parts.append(_Literal(text))
                    self.index += len(text)
            try:
                parts.append(self.obj())
            except nomatch:
                break
        return _Concatenation(tuple(parts))

    def atom(self):
        if self.static_b("^"):
            return self.repetition(_CharGroup(frozenset({_BEGIN_CHAR}), False))
        if self.static_b("$"):
            return self.repetition(_CharGroup(frozenset({_END_CHAR}), False))
        return super().atom()

    def repetition(self, base):
        at = self.index
        node = super().repetition(base)
        if isinstance(node, _Repeated):
            if node.max is not None and node.max < node.min:
                raise self.fail("min repeat greater than max repeat", at + 1)
            if max(node.min, node.max or 0) > MAX_REPEAT:
                raise self.fail(f"a counted repetition above {MAX_REPEAT:,} is refused", at)
        return node

    def escaped(self, inner=False):
        at = self.index - 1
        for letter, digits in (("u", 4), ("U", 8)):
            if self.static_b(letter):
                try:
                    code = self.multiple("0123456789abcdefABCDEF", digits, digits)
                except nomatch:
                    raise self.fail(f"\\{letter} needs {digits} hex digits", at) from None
                cp = int(code, 16)
                if cp > MAX_CODE_POINT:
                    raise self.fail("code point beyond U+10FFFF", at)
                if 0xD800 <= cp <= 0xDFFF:
                    raise self.fail("surrogate code points cannot appear in UTF-8 text", at)
                return _CharGroup(frozenset({chr(cp)}), False)
        if not inner:
            if self.static_b("A"):
                return _CharGroup(frozenset({_BEGIN_CHAR}), False)
            if self.static_b("Z"):
                return _CharGroup(frozenset({_END_CHAR}), False)
            for letter in "bB":
                if self.peek_static(letter):
                    raise self.fail(f"word boundary \\{letter} is not supported", at)
            if self.data[self.index : self.index + 1].isdigit() and self.data[self.index] != "0":
                if not re.match(r"[0-7]{3}", self.data[self.index : self.index + 3]):
                    raise self.fail("backreferences are not supported", at)
        for letter in "pPN":
            if self.peek_static(letter):
                raise self.fail(f"\\{letter} (Unicode properties and names) is not supported", at)
        return super().escaped(inner)

    def chargroup(self):
        # As in Python, "]" right after "[" or "[^" is a literal; interegular would end the class there.
        negate = self.static_b("^")
        groups = [_CharGroup(frozenset("]"), False)] if self.static_b("]") else []
        while True:
            try:
                groups.append(self.chargroup_inner())
            except nomatch:
                break
        self.static("]")
        return _combine_char_groups(*groups, negate=negate)

    def extension_group(self):
        at = self.index - 2
        ahead = self.data[self.index : self.index + 2]
        if ahead[:1] in ("=", "!") or ahead in ("<=", "<!"):
            raise self.fail("lookaround is not supported", at)
        if ahead[:1] == "(":
            raise self.fail("conditional groups are not supported", at)
        if ahead[:2] == "P=":
            raise self.fail("backreferences are not supported", at)
        if ahead[:1] == ">":
            raise self.fail("atomic groups are not supported", at)
        flags = _INLINE_FLAGS.match(self.data, self.index)  # not a slice of the rest: a copy per group
        if flags:
            for letter in flags.group(0):
                if letter in "mxuL":
                    raise self.fail(f"the inline flag {letter!r} is not supported", at)
        try:
            return super().extension_group()
        except Unsupported as exc:
            raise self.fail(str(exc) or "unsupported group", at) from None


@memoized(AUTOMATON_CACHE_BYTES, lambda dfa, pattern: dfa.nbytes + len(pattern))
def regex_to_dfa(pattern: str) -> ByteDFA:
    """Compile ``pattern`` to a minimal byte DFA whose language is the UTF-8 encodings of its full matches. Kept
    per process, bounded in bytes: one automaton may take a hundred megabytes."""
    nfa = ByteNFA()
    start, accept = nfa.new_state(), nfa.new_state()
    add_regex(nfa, pattern, start, accept)
    dfa = nfa.determinize(start, accept)
    if dfa.is_empty:
        raise RegexError("the regex matches no string", pattern)
    return dfa


def add_regex(nfa: ByteNFA, pattern: str, src: int, dst: int, *, anchors: bool = True) -> None:
    """Add to ``nfa`` a path from ``src`` to ``dst`` for each full match of ``pattern`` (a grammar terminal, or a
    whole regex structure). ``anchors=False`` refuses ``^ $ \\A \\Z``, which mean nothing inside a grammar."""
    if not isinstance(pattern, str):
        raise ArgumentError("pattern", pattern, "a regex must be a str")
    surrogate = re.search("[\ud800-\udfff]", pattern)
    if surrogate:
        raise RegexError("surrogate code points cannot appear in UTF-8 text", pattern, surrogate.start())
    parser = _Parser(pattern)
    try:
        tree = parser.parse()
    except RecursionError:
        raise RegexError("groups nest too deeply", pattern, deep_nesting_offset(pattern)) from None
    except (NoMatch, InvalidSyntax, Unsupported) as exc:
        try:  # Python's own parser gives the better message and position for plain syntax errors
            re.compile(pattern)
        except re.error as syntax:
            raise RegexError(syntax.msg, pattern, syntax.pos) from None
        position = exc.index if isinstance(exc, NoMatch) else parser.index
        raise RegexError(str(exc) if not isinstance(exc, NoMatch) else "cannot parse", pattern, position) from None
    try:
        _Builder(nfa, pattern, anchors).build(tree, src, dst, REFlags(0))
    except RecursionError:
        raise RegexError("groups nest too deeply", pattern, deep_nesting_offset(pattern)) from None


#: The group depth past which :func:`deep_nesting_offset` points: deeper nesting than any real pattern needs.
NESTING_HINT = 100


def deep_nesting_offset(text: str) -> int | None:
    """Where ``text`` first opens a parenthesis deeper than :data:`NESTING_HINT` (for the error's position)."""
    depth = 0
    for i, ch in enumerate(text):
        if ch == "(":
            depth += 1
            if depth > NESTING_HINT:
                return i
        elif ch == ")":
            depth -= 1
    return None


class _Builder:
    """Thompson construction from interegular's parse tree into a :class:`ByteNFA`."""

    def __init__(self, nfa: ByteNFA, pattern: str, anchors: bool):
        self.nfa = nfa
        self.pattern = pattern
        self.anchors = anchors
        #: A class's code-point ranges by (chars, negated, case-insensitive): a counted repeat such as ``[...]{1,200}``
        #: builds the same class once per copy, and a class spelled with thousands of code points is slow to sort.
        self._ranges: dict[tuple[frozenset[str], bool, bool], list[tuple[int, int]]] = {}

    def build(self, node, src: int, dst: int, flags: REFlags) -> None:
        nfa = self.nfa
        if isinstance(node, Pattern):
            inner = (flags | node.added_flags) & ~node.removed_flags
            for option in node.options:
                self.build(option, src, dst, inner)
        elif isinstance(node, _Concatenation):
            parts = node.parts
            if not parts:
                nfa.add_epsilon(src, dst)
                return
            state = src
            for i, part in enumerate(parts):
                if isinstance(part, _NonCapturing):
                    raise RegexError("lookaround is not supported", self.pattern)
                nxt = dst if i == len(parts) - 1 else nfa.new_state()
                self.build(part, state, nxt, flags)
                state = nxt
        elif isinstance(node, _Repeated):
            self._repeat(node, src, dst, flags)
        elif isinstance(node, _Literal):
            if flags & REFlags.CASE_INSENSITIVE:
                self.build(_Concatenation(tuple(_CharGroup(frozenset(c), False) for c in node.text)), src, dst, flags)
            else:
                self._literal(node.text.encode(), src, dst)
        elif isinstance(node, _CharGroup):
            self._char_group(node, src, dst, flags)
        elif type(node).__name__ == "__DotCls":
            chars = set() if flags & REFlags.SINGLE_LINE else {"\n"}
            self._char_group(_CharGroup(frozenset(chars), True), src, dst, REFlags(0))
        elif type(node).__name__ == "__EmptyCls":
            nfa.add_epsilon(src, dst)
        else:  # pragma: no cover - a parse-tree node interegular added after this was written
            raise RegexError(f"unsupported construct {type(node).__name__}", self.pattern)

    def _repeat(self, node: _Repeated, src: int, dst: int, flags: REFlags) -> None:
        lo, hi = node.min, node.max
        nfa = self.nfa
        state = src
        for _ in range(lo):
            nxt = nfa.new_state()
            self.build(node.base, state, nxt, flags)
            state = nxt
        if hi is None:
            loop = nfa.new_state()
            nfa.add_epsilon(state, loop)
            body_end = nfa.new_state()
            self.build(node.base, loop, body_end, flags)
            nfa.add_epsilon(body_end, loop)
            nfa.add_epsilon(loop, dst)
            return
        for _ in range(hi - lo):
            nxt = nfa.new_state()
            nfa.add_epsilon(state, dst)
            self.build(node.base, state, nxt, flags)
            state = nxt
        nfa.add_epsilon(state, dst)

    def _literal(self, encoded: bytes, src: int, dst: int) -> None:
        state = src
        for byte in encoded[:-1]:
            nxt = self.nfa.new_state()
            self.nfa.add_bytes(state, byte, byte, nxt)
            state = nxt
        self.nfa.add_bytes(state, encoded[-1], encoded[-1], dst)

    def _char_group(self, group: _CharGroup, src: int, dst: int, flags: REFlags) -> None:
        if not group.negated and len(group.chars) == 1 and next(iter(group.chars)) in _MARKERS:
            if not self.anchors:
                raise RegexError("anchors (^ $ \\A \\Z) have no meaning inside a grammar terminal", self.pattern)
            self.nfa.add_marker(src, _MARKERS[next(iter(group.chars))], dst)
            return
        if len(group.chars) == 1 and not group.negated and not flags & REFlags.CASE_INSENSITIVE:
            self._literal(next(iter(group.chars)).encode(), src, dst)
            return
        key = (group.chars, bool(group.negated), bool(flags & REFlags.CASE_INSENSITIVE))
        ranges = self._ranges.get(key)
        if ranges is None:
            ranges = self._ranges[key] = self._class_ranges(group, flags)
        self.nfa.add_code_points(src, ranges, dst)

    def _class_ranges(self, group: _CharGroup, flags: REFlags) -> list[tuple[int, int]]:
        chars = set(group.chars) - _MARKERS.keys()  # a range over the surrogates, which UTF-8 cannot hold
        if flags & REFlags.CASE_INSENSITIVE:
            for ch in list(chars):
                if ch.isascii():
                    chars.update((ch.lower(), ch.upper()))
                elif ch.lower() != ch or ch.upper() != ch:
                    raise RegexError(f"(?i) over the non-ASCII letter {ch!r} is not supported", self.pattern)
        ranges = code_point_ranges(ord(c) for c in chars)
        return complement_ranges(ranges) if group.negated else ranges
