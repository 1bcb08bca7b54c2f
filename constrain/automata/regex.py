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
  also scoped as ``(?i:...)``;
- lookahead ``(?=...)`` and ``(?!...)`` anywhere (in repetitions, alternatives, nested), in a whole-text regex
  (:func:`regex_to_dfa`; not in a grammar terminal, whose text goes on past its match). A lookahead at a
  position holds when the rest of the *whole text* from there starts with a match of its body (``$`` in the body
  is the end of the text, ``^`` its start), so the language stays regular; it is built exactly, see
  :func:`_lookaround_dfa`, within :data:`MAX_LOOKAROUND_STATES`.

Refused with a :class:`~constrain.errors.RegexError` that gives the position: lookbehind, backreferences,
conditionals, word boundaries ``\\b \\B``, Unicode properties ``\\p{..}``, the flags ``m x u L``, surrogate code
points, and any syntax error. A lookahead construction past its size bounds raises
:class:`~constrain.errors.AutomatonTooLarge`.

"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
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

from constrain.automata.algebra import any_text
from constrain.automata.dfa import ByteDFA
from constrain.automata.limits import AUTOMATON_CACHE_BYTES, check_deadline
from constrain.automata.minimize import column_classes, partial_dfa_blocks
from constrain.automata.nfa import BEGIN, END, ByteNFA
from constrain.automata.utf8 import MAX_CODE_POINT, code_point_ranges, complement_ranges
from constrain.cache import memoized
from constrain.errors import ArgumentError, AutomatonTooLarge, RegexError

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
        if type(node) is _Repeated:  # not isinstance: an ABC (see _has_lookaround)
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
        if ahead in ("<=", "<!"):
            raise self.fail("lookaround is not supported looking back (lookbehind)", at)
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
    return _whole_dfa(pattern, _parse(pattern), pattern)


def search_dfa(pattern: str) -> ByteDFA:
    """A minimal byte DFA of the texts in which ``pattern`` matches somewhere, ``(?s:.)*(?:pattern)(?s:.)*`` (each
    top-level alternative anchored only by its own ``^``/``$``, as JSON Schema's ``pattern`` searches), built
    around the pattern's own parse: an unbalanced ``)`` cannot close the group around it, and a RegexError names
    its place in ``pattern``. Not kept: its callers keep what they make of it."""
    tree = _parse(pattern)
    if _anchored_at_both_ends(tree):  # `^...$` (each alternative): a search is a match of the whole text
        return _whole_dfa(pattern, tree, pattern)
    tree = _Concatenation((_ANY_STAR, tree, _ANY_STAR))
    return _whole_dfa(pattern, tree, f"(?s:.)*(?:{pattern})(?s:.)*")


def _anchored_at_both_ends(tree) -> bool:
    """Whether every top-level alternative of ``tree`` begins with ``^`` and ends with ``$``, and no lookaround
    looks past them: the text around a match is then empty."""
    return (
        isinstance(tree, Pattern)
        and all(
            isinstance(option, _Concatenation)
            and len(option.parts) >= 2
            and option.parts[0] == _BEGIN_GROUP
            and option.parts[-1] == _END_GROUP
            for option in tree.options
        )
        and not _has_lookaround(tree)
    )


def _whole_dfa(pattern: str, tree, key: str) -> ByteDFA:
    """The minimal DFA of ``tree`` (parsed from ``pattern``) matched against the whole text; ``key`` names it
    among the lookahead constructions found too large."""
    if _has_lookaround(tree):
        refused = _LOOKAROUND_REFUSED.get(key)
        if refused is not None:  # the construction is slow to fail: a pattern met again is refused at once
            raise AutomatonTooLarge(refused)
        try:
            dfa = _tree_dfas(pattern, tree, REFlags(0), both=False)[0]
        except AutomatonTooLarge as exc:
            if len(_LOOKAROUND_REFUSED) >= 256:
                _LOOKAROUND_REFUSED.pop(next(iter(_LOOKAROUND_REFUSED)))
            _LOOKAROUND_REFUSED[key] = str(exc)
            raise
    else:
        nfa = ByteNFA()
        start, accept = nfa.new_state(), nfa.new_state()
        _build(nfa, pattern, tree, start, accept, anchors=True)
        dfa = nfa.determinize(start, accept)
    if dfa.is_empty:
        raise RegexError("the regex matches no string", pattern)
    return dfa


def add_regex(nfa: ByteNFA, pattern: str, src: int, dst: int, *, anchors: bool = True) -> None:
    """Add to ``nfa`` a path from ``src`` to ``dst`` for each full match of ``pattern`` (a grammar terminal, or a
    whole regex structure). ``anchors=False`` refuses ``^ $ \\A \\Z``, which mean nothing inside a grammar, and
    lookahead, which would look past the terminal's match; with ``anchors``, ``src`` must be the start of the text
    and ``dst`` its end (a lookahead reads the rest of the text up to ``dst``)."""
    tree = _parse(pattern)
    if anchors and _has_lookaround(tree):
        at_start, elsewhere = _tree_dfas(pattern, tree, REFlags(0))
        if at_start is elsewhere:
            nfa.add_dfa(at_start, src, dst)
            return
        begun = nfa.new_state()
        nfa.add_marker(src, BEGIN, begun)
        nfa.add_dfa(at_start, begun, dst)
        nfa.add_dfa(elsewhere, src, dst)
        return
    _build(nfa, pattern, tree, src, dst, anchors=anchors)


def _parse(pattern: str):
    """interegular's parse tree of ``pattern`` (with our extensions), or RegexError."""
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
    return tree


def _build(nfa: ByteNFA, pattern: str, tree, src: int, dst: int, *, anchors: bool, flags=None, looks=None) -> None:
    try:
        _Builder(nfa, pattern, anchors, looks).build(tree, src, dst, REFlags(0) if flags is None else flags)
    except RecursionError:
        raise RegexError("groups nest too deeply", pattern, deep_nesting_offset(pattern)) from None


# --------------------------------------------------------------------------------------------------------------
# Lookahead

#: Marker labels from this one up stand for lookaheads (``LOOK + i``: the i-th the builder met), next to the
#: anchors' BEGIN and END: an edge that starts an obligation on the rest of the text.
LOOK = END + 1
#: Most DFA states a regex with lookahead may have before it is minimised, and most (state, obligations) pairs
#: all those states may hold together: the construction runs in Python, so it is bounded well below
#: :data:`~constrain.automata.limits.MAX_DFA_STATES`; past either, AutomatonTooLarge.
MAX_LOOKAROUND_STATES = 10_000
MAX_LOOKAROUND_MEMBERS = 500_000

_ANY_STAR = _Repeated(_CharGroup(frozenset(), True), 0, None)
_BEGIN_GROUP = _CharGroup(frozenset({_BEGIN_CHAR}), False)
_END_GROUP = _CharGroup(frozenset({_END_CHAR}), False)

#: Lookahead patterns found too large, with the error: the most recent 256.
_LOOKAROUND_REFUSED: dict[str, str] = {}


def _has_lookaround(node) -> bool:
    kind = type(node)  # interegular's node classes are ABCs, whose isinstance runs Python code when it fails
    if kind is _NonCapturing:
        return True
    if kind is Pattern:
        return any(_has_lookaround(o) for o in node.options)
    if kind is _Concatenation:
        return any(_has_lookaround(p) for p in node.parts)
    if kind is _Repeated:
        return _has_lookaround(node.base)
    return False


def _tree_dfas(pattern: str, tree, flags: REFlags, both: bool = True) -> tuple[ByteDFA, ByteDFA | None]:
    """The minimal DFAs of the full matches of ``tree`` read from the start of the text (where ``^`` holds) and,
    with ``both``, from a later position (where it never does; the same object when nothing tells them apart)."""
    nfa = ByteNFA()
    start, accept = nfa.new_state(), nfa.new_state()
    looks: list = []
    _build(nfa, pattern, tree, start, accept, anchors=True, flags=flags, looks=looks)
    begins = BEGIN in nfa._markers[1::3]
    if looks:
        pairs = [(_tree_dfas(pattern, _Concatenation((inner, _ANY_STAR)), fl), negate) for inner, fl, negate in looks]
        first = _lookaround_dfa(nfa, start, accept, pairs, True)
        differs = begins or any(a is not b for (a, b), _ in pairs)
        later = None if not both else _lookaround_dfa(nfa, start, accept, pairs, False) if differs else first
        return first, later
    first = nfa.determinize(start, accept)
    if not both or not begins:
        return first, (first if both else None)
    nfa._markers = [x for i in range(0, len(nfa._markers), 3) if nfa._markers[i + 1] != BEGIN
                    for x in nfa._markers[i : i + 3]]  # fmt: skip
    return first, nfa.determinize(start, accept)


class _Look:
    """One variant of a lookahead: the DFA of its body followed by any text, whether it is negated, and which of
    the DFA's states accept every continuation (a positive lookahead there holds, a negative one fails)."""

    __slots__ = ("dfa", "negate", "universal", "trans", "accepting")

    def __init__(self, dfa: ByteDFA, negate: bool):
        self.dfa = dfa
        self.negate = negate
        self.trans = dfa.trans
        self.accepting = dfa.accepting
        text = any_text()
        n = dfa.num_states
        table = np.ascontiguousarray(np.vstack([dfa.trans, np.where(text.trans >= 0, text.trans + n, -1)]))
        blocks = partial_dfa_blocks(table.astype(np.int32), np.concatenate([dfa.accepting, text.accepting]))
        self.universal = (blocks[:n] == blocks[n]).tolist() if not dfa.is_empty else [False] * n

    def step(self, state: int) -> int | None:
        """The obligation's fate at ``state`` (-1: dead): None when it fails (the thread dies), -1 when it holds
        whatever follows (dropped), else the state to keep."""
        if state < 0 or self.dfa.is_empty:
            return -1 if self.negate else None
        if self.universal[state]:
            return None if self.negate else -1
        return state

    def holds_at_end(self, state: int) -> bool:
        return bool(self.accepting[state]) != self.negate


def _lookaround_dfa(nfa: ByteNFA, start: int, accept: int, looks: list, at_start: bool) -> ByteDFA:
    """The DFA of an NFA whose ``LOOK + i`` edges are lookaheads (``looks[i]``: the DFAs of its body followed by
    any text, from the text's start and from elsewhere, and whether it is negated), read from the text's start
    (``at_start``) or from a later position.

    A subset construction whose threads are pairs (NFA state, obligations), an obligation being a lookahead's DFA
    run over the rest of the text from where the thread took its edge: it must end accepting (negated: not). An
    obligation that can no longer fail is dropped, one that can no longer hold kills its thread, so threads stay
    few. The construction reads the byte classes of the NFA and of every lookahead's DFA together; it is bounded
    by :data:`MAX_LOOKAROUND_STATES` and :data:`MAX_LOOKAROUND_MEMBERS`, and looks at the time limit as it goes."""
    variants: list[_Look] = []
    look_of: list[tuple[int, int]] = []  # per lookahead: its variant at the start, elsewhere
    for (first, later), negate in looks:
        variants.append(_Look(first, negate))
        if later is not first:
            variants.append(_Look(later, negate))
        look_of.append((len(variants) - 1 - (later is not first), len(variants) - 1))
    n = nfa.size
    eps: list[list[int]] = [[] for _ in range(n)]
    begin: list[list[int]] = [[] for _ in range(n)]
    end: list[list[int]] = [[] for _ in range(n)]
    spawn: list[list[tuple[int, int]]] = [[] for _ in range(n)]
    for i in range(0, len(nfa._epsilon), 2):
        eps[nfa._epsilon[i]].append(nfa._epsilon[i + 1])
    for i in range(0, len(nfa._markers), 3):
        src, label, dst = nfa._markers[i : i + 3]
        if label == BEGIN:
            begin[src].append(dst)
        elif label == END:
            end[src].append(dst)
        else:
            spawn[src].append((label - LOOK, dst))
    # byte classes: bytes that no NFA edge and no lookahead DFA tell apart
    edges = np.array(nfa._bytes, dtype=np.int64).reshape(-1, 4)
    cuts = np.zeros(257, dtype=bool)
    cuts[0] = True
    cuts[edges[:, 1]] = True
    cuts[edges[:, 2] + 1] = True
    signature = [np.cumsum(cuts[:256])]
    for look in variants:
        signature.append(column_classes(np.ascontiguousarray(look.trans))[1])
    _, first_byte, class_of = np.unique(np.stack(signature, axis=1), axis=0, return_index=True, return_inverse=True)
    class_of = class_of.reshape(-1)
    num_classes = len(first_byte)
    reads: list[dict[int, list[int]]] = [{} for _ in range(n)]
    for src, lo, hi, dst in edges.tolist():
        for c in np.unique(class_of[lo : hi + 1]).tolist():
            reads[src].setdefault(c, []).append(dst)

    def finals(initial: bool) -> list[bool]:
        """Per NFA state: whether it reaches acceptance reading nothing more, every lookahead met on the way
        holding on the empty rest."""
        ok = [False] * n
        ok[accept] = True
        changed = True
        while changed:  # a few rounds: these paths are short
            changed = False
            for q in range(n):
                if ok[q]:
                    continue
                nxt = eps[q] + end[q] + (begin[q] if initial else [])
                nxt += [r for lid, r in spawn[q] if variants[look_of[lid][0 if initial else 1]].holds_at_end(0)]
                if any(ok[r] for r in nxt):
                    ok[q] = changed = True
        return ok

    final_start, final_later = finals(True), finals(False)

    def closure(seeds, initial: bool) -> frozenset:
        final = final_start if initial else final_later
        out = set()
        seen = set(seeds)
        stack = list(seeds)
        while stack:
            q, obs = stack.pop()
            if reads[q] or final[q]:
                out.add((q, obs))
            nxt = [(r, obs) for r in eps[q]]
            if initial:
                nxt += [(r, obs) for r in begin[q]]
            for lid, r in spawn[q]:
                v = look_of[lid][0 if initial else 1]
                fate = variants[v].step(0)
                if fate is None:
                    continue
                nxt.append((r, obs if fate < 0 else obs | {(v, fate)}))
            for item in nxt:
                if item not in seen:
                    seen.add(item)
                    stack.append(item)
        return frozenset(out)

    advanced: dict = {}

    def advance(obs: frozenset, byte: int):
        key = (obs, byte)
        if key in advanced:
            return advanced[key]
        out = set()
        for v, state in obs:
            look = variants[v]
            fate = look.step(int(look.trans[state, byte]))
            if fate is None:
                out = None
                break
            if fate >= 0:
                out.add((v, fate))
        result = advanced[key] = None if out is None else frozenset(out)
        return result

    def accepting(threads: frozenset, initial: bool) -> bool:
        final = final_start if initial else final_later
        return any(final[q] and all(variants[v].holds_at_end(s) for v, s in obs) for q, obs in threads)

    empty_obs: frozenset = frozenset()
    first = closure([(start, empty_obs)], at_start)
    index = {(True, first): 0}
    order = [(True, first)]
    rows: list[list[int]] = []
    accepts: list[bool] = []
    members = 0
    i = 0
    while i < len(order):
        check_deadline()
        initial, threads = order[i]
        members += len(threads)
        if len(order) > MAX_LOOKAROUND_STATES or members > MAX_LOOKAROUND_MEMBERS:
            raise AutomatonTooLarge(
                f"the regex's lookahead needs more than {MAX_LOOKAROUND_STATES:,} DFA states "
                f"(or {MAX_LOOKAROUND_MEMBERS:,} threads in all) before minimisation"
            )
        accepts.append(accepting(threads, initial and at_start))
        row = []
        for c in range(num_classes):
            byte = int(first_byte[c])
            seeds = []
            for q, obs in threads:
                targets = reads[q].get(c)
                if not targets:
                    continue
                moved = advance(obs, byte)
                if moved is None:
                    continue
                seeds.extend((r, moved) for r in targets)
            if not seeds:
                row.append(-1)
                continue
            nxt = closure(seeds, False)
            if not nxt:
                row.append(-1)
                continue
            key = (False, nxt)
            target = index.get(key)
            if target is None:
                target = index[key] = len(order)
                order.append(key)
            row.append(target)
        rows.append(row)
        i += 1
    table = np.array(rows, dtype=np.int32).reshape(len(rows), num_classes)
    trans = np.take(table, class_of, axis=1)
    return ByteDFA(trans, np.array(accepts, dtype=np.bool_)).reduced()


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

    def __init__(self, nfa: ByteNFA, pattern: str, anchors: bool, looks: list | None = None):
        self.nfa = nfa
        self.pattern = pattern
        self.anchors = anchors
        #: Where lookaheads are collected (their body and flags, and whether negated), each an edge marked
        #: ``LOOK + index``; None: a lookahead is refused.
        self.looks = looks
        #: A class's code-point ranges by (chars, negated, case-insensitive): a counted repeat such as ``[...]{1,200}``
        #: builds the same class once per copy, and a class spelled with thousands of code points is slow to sort.
        self._ranges: dict[tuple[frozenset[str], bool, bool], list[tuple[int, int]]] = {}

    def build(self, node, src: int, dst: int, flags: REFlags) -> None:
        nfa = self.nfa
        kind = type(node)  # not isinstance: interegular's node classes are ABCs (see _has_lookaround)
        if kind is Pattern:
            inner = (flags | node.added_flags) & ~node.removed_flags
            for option in node.options:
                self.build(option, src, dst, inner)
        elif kind is _Concatenation:
            parts = node.parts
            if not parts:
                nfa.add_epsilon(src, dst)
                return
            state = src
            for i, part in enumerate(parts):
                nxt = dst if i == len(parts) - 1 else nfa.new_state()
                if isinstance(part, _NonCapturing):
                    if part.backwards:  # pragma: no cover - refused by the parser
                        raise RegexError("lookbehind is not supported", self.pattern)
                    if self.looks is None:
                        found = (self.pattern.find("(?="), self.pattern.find("(?!"))
                        at = min((i for i in found if i >= 0), default=None)
                        raise RegexError(
                            "lookahead is not supported in a grammar terminal (it would look past the match)",
                            self.pattern,
                            at,
                        )
                    nfa.add_marker(state, LOOK + len(self.looks), nxt)
                    self.looks.append((part.inner, flags, part.negate))
                else:
                    self.build(part, state, nxt, flags)
                state = nxt
        elif kind is _Repeated:
            self._repeat(node, src, dst, flags)
        elif kind is _Literal:
            if flags & REFlags.CASE_INSENSITIVE:
                self.build(_Concatenation(tuple(_CharGroup(frozenset(c), False) for c in node.text)), src, dst, flags)
            else:
                self._literal(node.text.encode(), src, dst)
        elif kind is _CharGroup:
            self._char_group(node, src, dst, flags)
        elif kind.__name__ == "__DotCls":
            chars = set() if flags & REFlags.SINGLE_LINE else {"\n"}
            self._char_group(_CharGroup(frozenset(chars), True), src, dst, REFlags(0))
        elif kind.__name__ == "__EmptyCls":
            nfa.add_epsilon(src, dst)
        else:  # pragma: no cover - a parse-tree node interegular added after this was written
            raise RegexError(f"unsupported construct {kind.__name__}", self.pattern)

    def _repeat(self, node: _Repeated, src: int, dst: int, flags: REFlags) -> None:
        """``node.base`` between ``node.min`` and ``node.max`` times: a chain of copies, the last ``max - min`` of
        them optional, or a loop after ``min`` copies when unbounded. The copies are built once and replicated
        (:meth:`_copies`)."""
        lo, hi = node.min, node.max
        nfa = self.nfa
        pairs = []  # the ends of each copy
        state = src
        for i in range(lo if hi is None else hi):
            nxt = nfa.new_state()
            if i >= lo:
                nfa.add_epsilon(state, dst)
            pairs.append((state, nxt))
            state = nxt
        if hi is None:
            loop = nfa.new_state()
            nfa.add_epsilon(state, loop)
            body_end = nfa.new_state()
            pairs.append((loop, body_end))
            nfa.add_epsilon(body_end, loop)
            nfa.add_epsilon(loop, dst)
        else:
            nfa.add_epsilon(state, dst)
        self._copies(node.base, pairs, flags)

    def _copies(self, node, pairs: list[tuple[int, int]], flags: REFlags) -> None:
        """``node`` built between the two states of each pair: once, then copied edge for edge with its own states
        renumbered (:meth:`~constrain.automata.nfa.ByteNFA.replicate`), a counted repetition's copies costing an
        array operation rather than a walk of the parse tree each. A copy holding an anchor or a lookahead (both
        marker edges) is built again instead: each lookahead has an index of its own."""
        if not pairs:
            return
        nfa = self.nfa
        mark = nfa.mark()
        self.build(node, *pairs[0], flags)
        if nfa.markers_since(mark):
            for src, dst in pairs[1:]:
                self.build(node, src, dst, flags)
        elif len(pairs) > 1:
            nfa.replicate(mark, *pairs[0], pairs[1:])

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
