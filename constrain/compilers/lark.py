"""Lark grammars to the grammar IR.

The grammar text is read by the ``lark`` library itself (``Lark(text, parser="earley", lexer="dynamic")``), so
its syntax, ``%import`` (``common.lark``: ``WS``, ``NUMBER``, ``ESCAPED_STRING``, ``CNAME``, ...), templates,
``%override`` / ``%extend``, ``?rule`` / ``_rule``, ``[]``, ``?``, ``*``, ``+`` and ``~ n..m`` are lark's. Its
``.rules`` (plain BNF: one expansion per alternative, EBNF operators already turned into helper rules) and
``.terminals`` (each one regex, terminal references inlined) are lowered here; ``?rule`` inlining, ``_rule``
filtering, aliases and priorities only shape lark's trees or pick among parses, so they do not change the
language.

Semantics. The structure's language is the context-free language in which every terminal stands for the set of
strings its regex matches as a whole (a string terminal for itself). That is
what lark's Earley parser accepts with ``lexer="dynamic_complete"``, which tries every length of a terminal's
match at each position, when each regex's preferred match is its longest, as with greedy quantifiers.
``lexer="dynamic"`` takes only the preferred match, so it rejects some texts of the language: with
``start: A "a"`` and ``A: /a+/`` it rejects ``aa``, which this structure (and ``dynamic_complete``) accept. An
alternation inside a regex whose earlier branch is a prefix of a later one (``/x|xy/``) makes lark's lexer miss
the longer branch; this structure keeps it.

``%ignore``: lark skips ignored terminals between any two terminals and at both ends of the text. The lowering
puts the optional run ``(IGNORED)*`` between consecutive symbols of every expansion and around the start rule.
Here an ignored match may end wherever its regex allows, while lark takes each ignored terminal's preferred
(for greedy regexes, longest) match whole. For whitespace (``%ignore WS``) that is the same language unless a
terminal begins with a whitespace character. For a line comment ``/#[^\\n]*/`` it is not: here a comment may stop
before the end of its line and tokens may follow on that line, where lark reads them as part of the comment;
write such a comment with its line break, ``/#[^\\n]*\\n/``, to make it exact.

Left recursion, common in lark grammars (``sum: sum "+" product | product``) and made by lark itself for
``*`` and ``+``, is rewritten when direct: ``a: a x | y`` becomes ``a: y x*``. Indirect left recursion is refused
by :func:`~constrain.grammar.rules.build_pushdown`, naming the rules of the cycle.

Refused: ``%declare``d terminals (a custom lexer makes them), lazy and possessive quantifiers in terminal regexes
(lark's lexer then stops at the shortest match, so the terminal's language is not that of its regex; write the
language itself, e.g. ``/"([^"\\\\]|\\\\.)*"/``), regex flags other than ``i s`` (``m`` and ``u`` change
nothing here and are dropped), and what the regex subset of :mod:`constrain.automata.regex` refuses. The
``common.lark`` terminals ``ESCAPED_STRING`` and ``C_COMMENT`` use lazy quantifiers; they are replaced by regexes
for exactly the strings lark's lexer takes for them. Zero-width terminals are refused by lark. The flag ``i``
folds ASCII letters only, as the regex subset does (Python's ``re``, which lark uses, also lets ``k``, ``s``
and ``i`` match U+212A, U+017F, U+0130 and U+0131), and refuses other cased letters.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

import lark
from lark.exceptions import LarkError, UnexpectedInput
from lark.grammar import Symbol
from lark.lexer import PatternStr, TerminalDef

from constrain.automata.limits import DEFAULT_TIME_LIMIT, time_limited
from constrain.automata.nfa import ByteNFA
from constrain.automata.regex import add_regex
from constrain.compilers.gbnf import escape_char
from constrain.errors import ArgumentError, GrammarError, GrammarSyntaxError, RegexError
from constrain.grammar.ir import Alt, Expr, Grammar, Literal, Ref, Regex, Repeat, Seq
from constrain.runtime.pushdown import GrammarStructure, compile_grammar
from constrain.vocab.vocabulary import Vocabulary

__all__ = ["GrammarSyntaxError", "compile_lark", "lark_to_grammar"]

#: The rule that puts ignored text around the start rule (Lark names cannot hold angle brackets).
_START = "<start>"
_FLAGS_KEPT = frozenset("is")
#: ``m`` changes only anchors, which a terminal cannot use; ``u`` is already the meaning of a str pattern.
_FLAGS_DROPPED = frozenset("mu")

#: Terminal regexes (as lark compiles them) whose lazy quantifiers make lark's lexer take only the shortest
#: match, and regexes for exactly those matches.
_LEXER_LANGUAGE = {
    # common.ESCAPED_STRING: up to the first quote after an even run of backslashes, no line break.
    r'".*?(?<!\\)(\\\\)*?"': r'"(?:[^"\\\n]|\\.)*"',
    # common.C_COMMENT: up to the first "*/".
    r"/\*(.|\n)*?\*/": r"/\*[^*]*\*+(?:[^*/][^*]*\*+)*/",
}

_QUANTIFIER_COUNT = re.compile(r"\{(?:\d+(?:,\d*)?|,\d*)\}")


def _read(text: str, start: str) -> lark.Lark:
    """Lark's reading of the grammar, its errors as :class:`GrammarSyntaxError` (with the position) or
    :class:`GrammarError`."""
    try:
        return lark.Lark(text, start=start, parser="earley", lexer="dynamic")
    except UnexpectedInput as exc:
        raise _syntax_error(str(exc), exc, text) from exc
    except LarkError as exc:
        if isinstance(exc.__context__, UnexpectedInput):
            raise _syntax_error(str(exc), exc.__context__, text) from exc
        raise GrammarError(f"lark refuses the grammar: {exc}") from exc
    except Exception as exc:  # lark lets its regex engine's errors (a bad /regex/) through
        raise GrammarError(f"lark refuses the grammar: {exc}") from exc


def _syntax_error(message: str, where: UnexpectedInput, text: str) -> GrammarSyntaxError:
    first = re.sub(r",? at line \d+,? column \d+.*$", "", message.strip().split("\n")[0])
    lines = text.splitlines()
    source_line = lines[where.line - 1] if 0 < where.line <= len(lines) else None
    return GrammarSyntaxError(first, where.line, where.column, source_line)


def _backtracking_control(pattern: str) -> int | None:
    """Where ``pattern`` has a lazy (``*?``) or possessive (``*+``) quantifier, or None."""
    i, after_quantifier = 0, False
    while i < len(pattern):
        c = pattern[i]
        if c in "?+" and after_quantifier:
            return i - 1
        if c == "\\":
            i += 2
        elif c == "[":
            i += 2 if pattern.startswith("[^", i) else 1
            i += pattern[i : i + 1] == "]"
            while i < len(pattern) and pattern[i] != "]":
                i += 2 if pattern[i] == "\\" else 1
            i += 1
        elif c == "(":
            i += 2 if pattern.startswith("(?", i) else 1
        elif c in "*+?":
            i += 1
            after_quantifier = True
            continue
        elif c == "{" and (count := _QUANTIFIER_COUNT.match(pattern, i)):
            i = count.end()
            after_quantifier = True
            continue
        else:
            i += 1
        after_quantifier = False
    return None


def _terminal_expr(terminal: TerminalDef) -> Literal | Regex:
    """The terminal's language as an IR terminal, checked against the regex subset."""
    pattern, name = terminal.pattern, terminal.name
    flags = frozenset(pattern.flags)
    unsupported = "".join(sorted(flags - _FLAGS_KEPT - _FLAGS_DROPPED))
    if unsupported:
        raise GrammarError(f"terminal {name}: the regex flags {unsupported!r} are not supported")
    kept = "".join(sorted(flags & _FLAGS_KEPT))
    if isinstance(pattern, PatternStr):
        if not kept:
            return Literal(pattern.value)
        body = "".join(escape_char(ord(c)) for c in pattern.value)
    else:
        body = pattern.value if kept else _LEXER_LANGUAGE.get(pattern.value, pattern.value)
        where = _backtracking_control(body)
        if where is not None:
            raise GrammarError(
                f"terminal {name}: the lazy or possessive quantifier at position {where} of /{body}/ changes which "
                f"match lark's lexer takes, so the terminal is not its regex's language; write the language of "
                f'the matches instead (for a quoted string: /"([^"\\\\]|\\\\.)*"/)'
            )
    regex = f"(?{kept}:{body})" if kept else body
    nfa = ByteNFA()
    try:
        add_regex(nfa, regex, nfa.new_state(), nfa.new_state(), anchors=False)
    except RegexError as exc:
        raise GrammarError(f"terminal {name}: {exc}") from exc
    return Regex(regex)


def _alt(options: Sequence[Expr]) -> Expr:
    return options[0] if len(options) == 1 else Alt(tuple(options))


def _rule_body(name: str, expansions: list[list[Symbol]], symbol: Callable[[Symbol], Expr], gap: Expr | None) -> Expr:
    """One rule's alternatives, ignored text between symbols, direct left recursion turned into a loop."""

    def factored(sequences: list[list[Symbol]]) -> Expr:
        # Lark expands each optional item into two alternatives (n of them make 2**n): alternatives that share
        # their first symbol read it once, which keeps the automaton built from them small.
        groups: dict[Symbol, list[list[Symbol]]] = {}
        for sequence in sequences:
            if sequence:
                groups.setdefault(sequence[0], []).append(sequence[1:])
        options: list[Expr] = [Seq(())] if not all(sequences) else []
        for first, rests in groups.items():
            tails = [r for r in rests if r]
            if not tails:
                options.append(symbol(first))
                continue
            tail = factored(tails) if gap is None else Seq((gap, factored(tails)))
            options.append(Seq((symbol(first), tail if len(tails) == len(rests) else Repeat(tail, 0, 1))))
        return _alt(options)

    def is_left_recursive(expansion: list[Symbol]) -> bool:
        return bool(expansion) and not expansion[0].is_term and expansion[0].name == name

    loops = [e[1:] for e in expansions if is_left_recursive(e) and len(e) > 1]  # a: a adds nothing
    bases = [e for e in expansions if not is_left_recursive(e)]
    if not bases:  # the rule can never complete, which build_pushdown reports
        return factored(expansions)
    if not loops:
        return factored(bases)
    loop = factored(loops) if gap is None else Seq((gap, factored(loops)))
    return Seq((factored(bases), Repeat(loop)))


def lark_to_grammar(text: str, start: str = "start") -> Grammar:
    """The grammar IR of a Lark grammar; ``start`` names the rule the whole text must match."""
    if not isinstance(text, str):
        raise ArgumentError("text", text, "a Lark grammar must be a str")
    parser = _read(text, start)
    definitions = {t.name: t for t in parser.terminals}
    terminals: dict[str, Literal | Regex] = {}
    rules: dict[str, Expr] = {}

    def terminal(name: str) -> Literal | Regex:
        if name not in definitions:
            raise GrammarError(
                f"terminal {name} has no definition (%declare): its tokens come from a custom lexer, which a "
                f"structure cannot follow"
            )
        if name not in terminals:
            terminals[name] = _terminal_expr(definitions[name])
        return terminals[name]

    def symbol(s: Symbol) -> Expr:
        if not s.is_term:
            return Ref(s.name)
        expr = terminal(s.name)
        if isinstance(expr, Literal):
            return expr
        rules[s.name] = expr  # a rule of its own: its DFA and masks are shared by every use
        return Ref(s.name)

    ignored = [terminal(name) for name in parser.ignore_tokens]
    gap = Repeat(_alt(ignored)) if ignored else None
    expansions: dict[str, list[list[Symbol]]] = {}
    for rule in parser.rules:
        expansions.setdefault(rule.origin.name, []).append(list(rule.expansion))
    for name, options in expansions.items():
        rules[name] = _rule_body(name, options, symbol, gap)
    if gap is None:
        return Grammar(rules, start)
    rules[_START] = Seq((gap, Ref(start), gap))
    return Grammar(rules, _START)


def compile_lark(
    text: str,
    vocab: Vocabulary,
    *,
    start: str = "start",
    time_limit: float | None = DEFAULT_TIME_LIMIT,
    **options,
) -> GrammarStructure:
    """Compile a Lark grammar for ``vocab``; ``options`` (``cache_bytes``) go to the structure. ``time_limit``:
    CPU seconds before :class:`~constrain.errors.CompileTimeout` (None: no limit)."""
    with time_limited(time_limit, "the Lark grammar"):
        return compile_grammar(lark_to_grammar(text, start), vocab, source=text, **options)
