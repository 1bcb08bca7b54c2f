"""Strings: the languages of string constraints (patterns, formats, excluded values, lengths) as automata, and
their rules. A length bound beside a pattern or a format is counted at the byte level by
:mod:`~constrain.compilers.json_schema.counted`.
"""

from __future__ import annotations

from collections.abc import Iterable, Set
from enum import Enum
from functools import lru_cache
from typing import NamedTuple

import numpy as np

from constrain.automata.dfa import DEAD, ByteDFA
from constrain.automata.limits import AUTOMATON_CACHE_BYTES, MAX_DFA_STATES
from constrain.automata.regex import search_dfa
from constrain.cache import BoundedCache, memoized
from constrain.compilers.json_schema.cdfa import _CDFA
from constrain.compilers.json_schema.cdfa_kernels import _IS_SPECIAL, _SPECIAL_CODES
from constrain.compilers.json_schema.counted import (
    MAX_COUNTED_STATES,
    _counted_chars,
    _counted_dfa,
    _counted_walk,
    _folded,
)
from constrain.compilers.json_schema.errors import _TooLarge
from constrain.compilers.json_schema.formats import _FORMATS, _FORMATS_ENCODED
from constrain.compilers.json_schema.keywords import _Shape
from constrain.compilers.json_schema.regex_ast import _FULL, _merge_ranges
from constrain.compilers.json_schema.values import _STRING, _json_string
from constrain.errors import AutomatonTooLarge, RegexError
from constrain.grammar.ir import Alt, Automaton, Expr, Literal, Ref, Repeat, Seq
from constrain.grammar.rules import terminal_dfa

#: States of one byte automaton handed to the grammar (a string's pattern with its bounds, keys, number forms).
MAX_BYTE_STATES = 8_000
#: ``maxLength`` above this is written as blocks of fixed-length rules rather than one counted automaton. Long
#: blocks keep the states where a token can cross into the next block (the last ~48 characters, the longest
#: token) a small share of the string: those masks depend on the caller and are walked, not shared.
LENGTH_BLOCK_THRESHOLD = 256
LENGTH_BLOCK = 256


def _quoted(body_regex: str) -> str:
    return f'"(?:{body_regex})"'


def _cdfa_bytes(d: _CDFA | None) -> int:
    """About what a code-point automaton holds once its lists of tuples are written out (~100 bytes an edge or
    state), for the memos; counted from its flat arrays, so that memoising a result does not write them out."""
    return 64 if d is None else 100 * (d.n + d.num_edges)


@memoized(AUTOMATON_CACHE_BYTES, lambda dfa, names: dfa.nbytes + sum(map(len, names)))
def _key_except_dfa(names: tuple[str, ...]) -> ByteDFA:
    """JSON strings (quotes included) other than ``names``: the automaton of any JSON string less the names'
    canonical encodings, built minimal in one kernel (:meth:`~constrain.automata.dfa.ByteDFA.without_words`).
    Linear in the names' length; shared per process, since the same objects recur across schemas."""
    words = []
    for name in names:
        try:
            words.append(_json_string(name).encode())
        except UnicodeEncodeError:  # a lone surrogate: no JSON text spells it, nothing to exclude
            continue
    return terminal_dfa(_STRING).without_words(words)


#: Most states of a pattern/format automaton with a length bound handed to the grammar as one automaton: as many
#: as the blocks of fixed-length rules (``blocks_of``) may use together, which one automaton beats on compile and
#: mask time alike, its states far from the bound sharing their walks (measured on ``.+[@].+[.]___`` up to 200).
MAX_COUNTED_BYTE_STATES = 4 * MAX_BYTE_STATES


class _StringKey(NamedTuple):
    """A string's constraints on its decoded text: the patterns it matches and does not, the formats it has and
    has not (by name), the values it may not take."""

    patterns: tuple[str, ...]
    formats: tuple[str, ...]
    excluded: tuple[str, ...]
    neg_patterns: tuple[str, ...]
    neg_formats: tuple[str, ...]


class _StringOutcome(Enum):
    """Why :func:`_string_automaton` gave no automaton; the compiler reports it at its own pointers."""

    EMPTY = "no string satisfies the patterns and formats"
    EMPTY_AT_LENGTHS = "no string of the allowed lengths does"
    TOO_LARGE = "the constraints need too large an automaton"
    NEEDS_BLOCKS = "with the length bound, one automaton would be too large"
    ANY_TEXT = "the patterns and formats allow every string: only the lengths constrain it"


@memoized(AUTOMATON_CACHE_BYTES, lambda dfa, pattern: (0 if dfa is None else dfa.nbytes) + len(pattern))
def _search_text(pattern: str) -> ByteDFA | None:
    """The UTF-8 texts in which ``pattern`` matches somewhere, as a minimal byte DFA (None: it matches no
    string); raises RegexError (naming its place in ``pattern``) or _TooLarge. Shared per process: a few patterns
    (identifiers, hex ids, versions) recur across most schemas."""
    try:
        return search_dfa(pattern)
    except RegexError as exc:
        if "matches no string" in str(exc):
            return None
        raise
    except AutomatonTooLarge as exc:  # a budget like the compiler's own: refused or relaxed where it is used
        raise _TooLarge(str(exc)) from None


@memoized(AUTOMATON_CACHE_BYTES, lambda d, pattern: _cdfa_bytes(d) + len(pattern))
def _searched(pattern: str) -> _CDFA:
    """:func:`_search_text` over code points, minimal: what patterns are combined with (formats, lengths,
    other patterns, names)."""
    text = _search_text(pattern)
    return _CDFA.empty() if text is None else _CDFA.of_text(text).minimized()


@memoized(AUTOMATON_CACHE_BYTES, lambda d, key: _cdfa_bytes(d) + sum(len(text) for texts in key for text in texts))
def _string_language(key: _StringKey) -> _CDFA | None:
    """The decoded strings ``key`` allows, minimal (None: too large). The patterns must be supported (their
    :func:`_searched` succeeds)."""
    d: _CDFA | None = None
    try:
        for pattern in key.patterns:
            d = _meet(d, _searched(pattern))
        for name in key.formats:
            d = _meet(d, _format_language(name))
        if d is None:
            d = _CDFA.universal()
        if key.excluded:
            d = d.minus(_CDFA.literals(key.excluded)).minimized()
        for pattern in key.neg_patterns:
            d = d.minus(_searched(pattern)).minimized()
        for name in key.neg_formats:
            d = d.minus(_format_language(name)).minimized()
    except _TooLarge:
        return None
    return d


def _meet(d: _CDFA | None, other: _CDFA) -> _CDFA:
    """The strings of both, minimal; ``d=None`` stands for every string, which leaves ``other`` itself (it must be
    minimal: the product would give the same automaton, numbered the same)."""
    return other if d is None else d.intersect(other).minimized()


# The formats' automata are kept for the life of the process, outside the memos bounded in bytes, whose least
# recently used entries a long-running process evicts: they are a fixed set (1.4 MB for all of them over bytes,
# half as much over code points), built by warmup, and each takes up to 30 ms to build again.


@lru_cache(maxsize=64)  # by a name of _FORMATS: as many entries at most, whatever the schemas
def _format_language(name: str) -> _CDFA:
    """The texts of format ``name`` over code points: what a format beside a pattern, a length or a negation is
    read through, and what enum values are checked against."""
    return _CDFA.from_regex(_FORMATS[name]).minimized()


@lru_cache(maxsize=64)  # by a name of _FORMATS
def _format_string(name: str) -> Automaton:
    """The JSON strings (quotes included) of format ``name``: a string that says nothing else."""
    return Automaton(terminal_dfa(_quoted(_FORMATS_ENCODED[name])))


def build_format_languages() -> None:
    """Build now every supported ``format``'s automata (0.3 to 30 milliseconds each the first time in a process)."""
    for name in _FORMATS:
        _format_language(name)
        _format_string(name)


#: String automata by (constraints, lengths), shared by every schema compiled in this process.
_STRING_AUTOMATA = BoundedCache(AUTOMATON_CACHE_BYTES, costly=True)


def _string_automaton(key: _StringKey, lo: int, hi: int | None) -> Automaton | _StringOutcome:
    """The JSON strings (quotes included) whose decoded text ``key`` allows with ``lo`` to ``hi`` code points, as
    one grammar automaton, or why there is none. Built once per process for each constraint set."""
    cache_key = (key, lo, hi)
    found = _STRING_AUTOMATA.get(cache_key)
    if found is None:
        found = _build_string_automaton(key, lo, hi)
        nbytes = found.dfa.trans.nbytes if isinstance(found, Automaton) else 64
        _STRING_AUTOMATA.put(cache_key, found, nbytes)
    return found


def _build_string_automaton(key: _StringKey, lo: int, hi: int | None) -> Automaton | _StringOutcome:
    if _pattern_alone(key, lo, hi):
        return _pattern_automaton(key.patterns[0])
    d = _string_language(key)
    outcome = _language_outcome(d)
    if outcome is not None:
        return outcome
    if lo > 0 or hi is not None:
        if _lengths_redundant(d, lo, hi):
            return _string_automaton(key, 0, None)
        try:
            walk = _WALKS.pop((key, lo, hi)) or _counted_walk(d, lo, hi, MAX_COUNTED_STATES)
        except _TooLarge:
            return _StringOutcome.NEEDS_BLOCKS
        counted = _folded(walk, quoted=True)
        if counted.is_empty:
            return _StringOutcome.EMPTY_AT_LENGTHS
        if counted.num_states > MAX_COUNTED_BYTE_STATES:
            return _StringOutcome.NEEDS_BLOCKS
        return Automaton(counted)
    try:
        return _automaton_of(d.encode_json().minimized(), quoted=True)
    except _TooLarge:
        return _StringOutcome.TOO_LARGE


def _pattern_alone(key: _StringKey, lo: int, hi: int | None) -> bool:
    """Whether a string's only constraint is one pattern (:func:`_pattern_automaton` lowers it)."""
    return lo == 0 and hi is None and len(key.patterns) == 1 and key == (key.patterns, (), (), (), ())


def _language_outcome(d: _CDFA | None) -> _StringOutcome | None:
    """What a string language settles before its lengths are read (too large to build, empty, every text), or None
    when its automaton is to be built: the first decision of :func:`_build_string_automaton` and of
    :func:`_string_holds` alike."""
    if d is None:
        return _StringOutcome.TOO_LARGE
    if d.is_empty():
        return _StringOutcome.EMPTY
    if _is_universal(d):  # a pattern any string has somewhere, such as "([0-9a-z]+)?"
        return _StringOutcome.ANY_TEXT
    return None


def _pattern_automaton(pattern: str) -> Automaton | _StringOutcome:
    """The JSON strings in which ``pattern`` matches somewhere: its text automaton with the bytes a JSON string
    escapes written as their escapes (:func:`_json_string_dfa`). A pattern alone, the commonest string constraint,
    needs no round trip through code points (the same minimal automaton as :meth:`_CDFA.encode_json` gives)."""
    try:
        text = _search_text(pattern)
    except _TooLarge:
        return _StringOutcome.TOO_LARGE
    if text is None:
        return _StringOutcome.EMPTY
    universal = _search_text("")
    if text.num_states == universal.num_states and text.digest == universal.digest:
        return _StringOutcome.ANY_TEXT
    dfa = _json_string_dfa(text)
    if dfa.num_states > MAX_BYTE_STATES:
        return _StringOutcome.TOO_LARGE
    return Automaton(dfa)


#: The bytes a JSON string escapes, and each one's escape after the backslash (``n`` for a newline, ``u001f``).
_ESCAPED_BYTES = np.flatnonzero(_IS_SPECIAL)
_ESCAPES = tuple(bytes(int(c) for c in _SPECIAL_CODES[b] if c >= 0) for b in _ESCAPED_BYTES)


def _json_string_dfa(text: ByteDFA) -> ByteDFA:
    """The canonical JSON strings (quotes included) whose decoded text ``text`` accepts, minimal. The bytes a
    string escapes are ASCII, so in a UTF-8 text automaton they are whole characters: each such edge becomes a
    backslash into a trie of the escapes, one trie for the states whose escaped bytes lead to the same targets."""
    trans = text.trans
    n = trans.shape[0]
    targets = trans[:, _ESCAPED_BYTES]
    escaping = np.flatnonzero((targets >= 0).any(axis=1))
    # the distinct rows, told apart by their bytes (np.unique over rows sorts a structured view: a hundred times
    # slower here)
    rows: list[np.ndarray] = []
    trie_by_row: dict[bytes, int] = {}
    trie_of = np.empty(len(escaping), dtype=np.int64)
    for k, row in enumerate(targets[escaping]):
        trie = trie_by_row.setdefault(row.tobytes(), len(rows))
        if trie == len(rows):
            rows.append(row)
        trie_of[k] = trie
    first = n + 1  # row 0 reads the opening quote; the text's states follow, then the tries
    tries: list[np.ndarray] = []

    def new_state() -> int:
        tries.append(np.full(256, DEAD, dtype=np.int32))
        return first + len(tries) - 1

    roots = np.empty(len(rows), dtype=np.int32)
    for r, row in enumerate(rows):
        roots[r] = new_state()
        for escape, target in zip(_ESCAPES, row.tolist()):
            if target < 0:
                continue
            at = roots[r]
            for byte in escape[:-1]:
                if tries[at - first][byte] < 0:
                    tries[at - first][byte] = new_state()
                at = tries[at - first][byte]
            tries[at - first][escape[-1]] = target + 1
    total = first + len(tries) + 1  # the last state, after the closing quote
    table = np.full((total, 256), DEAD, dtype=np.int32)
    table[0, 0x22] = 1
    body = np.where(trans >= 0, trans + 1, DEAD)
    body[:, _ESCAPED_BYTES] = DEAD
    body[escaping, 0x5C] = roots[trie_of]
    body[text.accepting, 0x22] = total - 1
    table[1:first] = body
    if tries:
        table[first : total - 1] = np.array(tries)
    accepting = np.zeros(total, dtype=np.bool_)
    accepting[-1] = True
    return ByteDFA(table, accepting).reduced()


def _lengths_redundant(d: _CDFA, lo: int, hi: int | None) -> bool:
    """Whether every string of ``d`` has ``lo`` to ``hi`` characters already."""
    shortest, longest = d.length_range()
    return shortest >= lo and (hi is None or (longest is not None and longest <= hi))


#: A length bound from which a counted string's automaton (about 14 states a character) takes a millisecond or
#: more to build: such a string is worth lowering when a matcher first reaches it, if this process has not built
#: its automaton yet (:mod:`~constrain.compilers.json_schema.deferral`).
MIN_COSTLY_LENGTH = 64


#: The counted walks :func:`_string_holds` made, by (constraints, lengths), each until the string is lowered and
#: folds it (:func:`_build_string_automaton`).
_WALKS = BoundedCache(AUTOMATON_CACHE_BYTES, costly=True)


def _costly_string(key: _StringKey, lo: int, hi: int | None) -> bool:
    """Whether lowering the strings of ``key`` with ``lo`` to ``hi`` characters would build a counted automaton of
    at least :data:`MIN_COSTLY_LENGTH` characters that this process has not built yet."""
    top = lo if hi is None else hi
    if top < MIN_COSTLY_LENGTH:
        return False
    if key == _NO_TEXT_CONSTRAINTS:
        return top <= LENGTH_BLOCK_THRESHOLD and not _counted_chars.cached(lo, hi, True, True)
    return (key, lo, hi) not in _STRING_AUTOMATA


#: At most how many states :func:`_json_string_dfa` makes per state of the text automaton: the state itself, and
#: a trie of the escapes (its root and the prefixes ``u``, ``u0``, ``u00``, ``u000``, ``u001``) when it reads a
#: byte that JSON escapes; two more for the quotes.
_JSON_STATES_PER_TEXT_STATE = 7


def _string_holds(key: _StringKey, lo: int, hi: int | None) -> bool:
    """Whether the strings of ``key`` with ``lo`` to ``hi`` characters lower to one automaton that matches
    something (neither empty nor too large, nor cut into blocks), decided without folding a counted automaton:
    its states are walked, and the automaton is built when the string is lowered. A pattern alone is decided on its
    text automaton when that is small enough that its JSON strings' automaton cannot pass the bound; its escapes are
    written when the string is lowered. Raises RegexError or _TooLarge as :func:`_searched` does."""
    found = _STRING_AUTOMATA.get((key, lo, hi))
    if found is None and (lo > 0 or hi is not None):
        d = _string_language(key)
        outcome = _language_outcome(d)
        if outcome is not None:
            return outcome is _StringOutcome.ANY_TEXT
        if not _lengths_redundant(d, lo, hi):
            walk = _WALKS.get((key, lo, hi))  # walked for an earlier compile, whose string was never lowered
            if walk is None:
                try:  # two states more once quoted, which minimising cannot add
                    walk = _counted_walk(d, lo, hi, MAX_COUNTED_BYTE_STATES - 2)
                except _TooLarge:
                    return False
                _WALKS.put((key, lo, hi), walk, sum(part.nbytes for part in walk))
            return bool(walk[1].any())
    if found is None and _pattern_alone(key, lo, hi):
        text = _search_text(key.patterns[0])  # what _pattern_automaton decides, short of writing the escapes
        if text is None:
            return False
        if _JSON_STATES_PER_TEXT_STATE * text.num_states + 2 <= MAX_BYTE_STATES:
            return True
    if found is None:
        found = _string_automaton(key, lo, hi)  # no counted automaton: the lengths hold for every string
    return found is _StringOutcome.ANY_TEXT or isinstance(found, Automaton)


_NO_TEXT_CONSTRAINTS = _StringKey((), (), (), (), ())
_FULL_RANGES = _merge_ranges(_FULL)


def _is_universal(d: _CDFA) -> bool:
    """Whether the minimal ``d`` accepts every string."""
    return d.n == 1 and bool(d.accept[0]) and _merge_ranges([(lo, hi) for lo, hi, _ in d.edges[0]]) == _FULL_RANGES


def _automaton_of(d: _CDFA, quoted: bool = False, budget: int = MAX_BYTE_STATES) -> Automaton:
    """The language of ``d`` as a grammar automaton (quoted: a JSON string); raises _TooLarge when empty or past
    ``budget`` byte states."""
    dfa = d.to_byte_dfa(quoted)
    if dfa.is_empty:
        raise _TooLarge("empty")
    if dfa.num_states > budget:
        raise _TooLarge("states")
    return Automaton(dfa)


#: Why :func:`_build_key` has no automaton: the key language, or its JSON encoding, needs too large an automaton.
_KEYS_TOO_LARGE = "the keys need too large an automaton"
_ENCODING_TOO_LARGE = "the encoded keys need too large an automaton"
#: What :func:`_build_key` gives: the keys' automaton, None when no key is left, or why it cannot be built.
_Key = Expr | str | None


def _key_language(order: Iterable[str], chosen: Set[str], names: Iterable[str], allowed: _CDFA | None) -> _CDFA:
    """The decoded keys of an additional member when, of the ``patternProperties`` patterns ``order`` (all
    supported), exactly those in ``chosen`` match it somewhere, it is none of ``names``, and it is in ``allowed``
    (``propertyNames``) when given; raises _TooLarge."""
    d: _CDFA | None = None
    for p in order:
        if p in chosen:
            d = _meet(d, _searched(p))
        else:
            d = (_CDFA.universal() if d is None else d).minus(_searched(p)).minimized()
    if d is None:
        d = _CDFA.universal()
    names = list(names)
    if names:
        d = d.minus(_CDFA.literals(names)).minimized()
    if allowed is not None:
        d = d.intersect(allowed).minimized()
    return d


def _build_key(order: tuple[str, ...], chosen: frozenset[str], names: Iterable[str], allowed: _CDFA | None) -> _Key:
    """The JSON strings of :func:`_key_language`, as one automaton."""
    try:
        d = _key_language(order, chosen, names, allowed)
    except _TooLarge:
        return _KEYS_TOO_LARGE
    if d.is_empty():
        return None
    try:
        return _automaton_of(d.encode_json().minimized(), quoted=True)
    except _TooLarge:
        return _ENCODING_TOO_LARGE


@memoized(
    AUTOMATON_CACHE_BYTES,
    lambda key, order, chosen, names: (
        (key.dfa.nbytes if isinstance(key, Automaton) else 64) + sum(map(len, order)) + sum(map(len, names))
    ),
)
def _pattern_key(order: tuple[str, ...], chosen: frozenset[str], names: frozenset[str]) -> _Key:
    """:func:`_build_key` without ``propertyNames``, shared per process: the keys of the same
    ``patternProperties`` beside the same names recur across schemas (and across compiles of one)."""
    return _build_key(order, chosen, names, None)


def _length_groups(lo: int, hi: int, b: int) -> list[tuple[int, int, int, int]]:
    """How ``lo`` to ``hi`` characters split into whole blocks of ``b`` and a shorter rest: runs ``(k_first,
    k_last, r_lo, r_hi)``, each ``k`` blocks of that run followed by ``r_lo`` to ``r_hi`` more characters. The rest's
    range changes only at ``lo // b``, the count after it and ``hi // b``, so it is read there alone, not at every
    count (there are ``hi // b`` of them)."""
    last = hi // b
    cuts = sorted({k for k in (0, lo // b, lo // b + 1, last) if k <= last}) + [last + 1]
    groups: list[tuple[int, int, int, int]] = []
    for k, after in zip(cuts, cuts[1:]):
        r_lo, r_hi = max(0, lo - k * b), min(b - 1, hi - k * b)  # the same for every count up to `after`
        if r_lo > r_hi:
            continue
        if groups and groups[-1][1] == k - 1 and groups[-1][2:] == (r_lo, r_hi):
            groups[-1] = (groups[-1][0], after - 1, r_lo, r_hi)
        else:
            groups.append((k, after - 1, r_lo, r_hi))
    return groups


class _StringRules:
    """The rules of the strings a shape allows: lengths, patterns, formats and excluded values (negated patterns
    and formats too), as automata shared per process or as blocks of fixed-length rules.

    A mixin of :class:`~constrain.compilers.json_schema.compiler._Compiler`. It relies on the compiler's ``rules``
    (the rules being built) and on its methods ``shared``, ``refuse`` and ``unsatisfiable``."""

    def string_expr(self, sh: _Shape) -> Expr:
        if sh.max_len is not None and sh.min_len > sh.max_len:
            raise self.unsatisfiable(f"minLength {sh.min_len} is above maxLength {sh.max_len}", *sh.min_len_at)
        decoded = sh.patterns or sh.formats or sh.str_excluded or sh.neg_patterns or sh.neg_formats
        if not decoded:
            lo, hi = self.countable_lengths(sh)
            if lo == 0 and hi is None:
                return self.shared("json_string")
            return self.length_expr(lo, hi)
        if (
            len(sh.formats) == 1 and not sh.patterns and not sh.str_excluded and not sh.neg_patterns
            and not sh.neg_formats and sh.min_len == 0 and sh.max_len is None
        ):  # fmt: skip
            return _format_string(sh.formats[0][0])
        at = (sh.patterns or sh.formats or sh.neg_patterns or sh.neg_formats or [("", "")])[0][1]
        keyword = "pattern" if sh.patterns or sh.neg_patterns else "format"
        key = self.string_key(sh)
        found = _string_automaton(key, sh.min_len, sh.max_len)
        length_at = sh.max_len_at if sh.max_len is not None else sh.min_len_at
        if found is _StringOutcome.ANY_TEXT:
            lo, hi = self.countable_lengths(sh)
            return self.shared("json_string") if lo == 0 and hi is None else self.length_expr(lo, hi)
        if found is _StringOutcome.EMPTY:
            raise self.unsatisfiable("no string satisfies the pattern/format constraints together", *self.string_at(sh))
        if found is _StringOutcome.EMPTY_AT_LENGTHS:
            raise self.unsatisfiable("no string of the allowed lengths satisfies the pattern/format", *length_at)
        if found is _StringOutcome.NEEDS_BLOCKS:
            if sh.max_len is not None:
                try:
                    return self.length_blocks(_string_language(key), sh.min_len, sh.max_len)
                except _TooLarge:
                    pass
            self.refuse(
                *length_at,
                "a length bound together with a pattern or format needs too large an automaton",
                "the length bound ignored",
            )  # fmt: skip
            found = _string_automaton(key, 0, None)
        if found is _StringOutcome.TOO_LARGE:
            self.refuse(at, keyword, "the string constraints need too large an automaton", "any string allowed")
            return self.shared("json_string")
        assert isinstance(found, Automaton)
        return found

    def length_blocks(self, d: _CDFA, lo: int, hi: int) -> Expr:
        """See :meth:`blocks_of`; tries shorter blocks while the block regexes are too large."""
        for size in (32, 16, 8, 4):
            if hi // size > 64:
                break
            saved = dict(self.rules)
            try:
                return self.blocks_of(d, lo, hi, size)
            except _TooLarge:
                self.rules = saved
        raise _TooLarge("blocks")

    def blocks_of(self, d: _CDFA, lo: int, hi: int, size: int) -> Expr:
        """Strings of ``d`` with lo <= length <= hi when the product automaton would be too large: a string is cut
        into blocks of ``size`` characters and a shorter remainder. One regex per (state, state) for
        a block, one rule per (state, blocks so far): deterministic (a block's end state is fixed by the DFA) and
        the stack grows by one call per block."""
        d = d.minimized()
        if d.n > 12:
            raise _TooLarge("pattern states")
        prefix = f"blocks{len(self.rules)}."
        while any(name.startswith(prefix) for name in self.rules):
            prefix += "x"
        budget = [MAX_COUNTED_BYTE_STATES]

        def counted_rule(name: str, lang: _CDFA, a: int, b: int) -> str | None:
            """A rule for the strings of ``lang`` with ``a`` to ``b`` characters (None when there are none)."""
            if name in self.rules:
                return name
            dfa = _counted_dfa(lang, a, b)
            if dfa.is_empty:
                return None
            budget[0] -= dfa.num_states
            if budget[0] < 0:
                raise _TooLarge("blocks")
            self.rules[name] = Automaton(dfa)
            return name

        def block(p: int, q: int) -> str | None:
            return counted_rule(f"{prefix}b{p}.{q}", d.from_state(p, q), size, size)

        def remainder(p: int, a: int, b: int) -> str | None:
            return counted_rule(f"{prefix}r{p}.{a}.{b}", d.from_state(p), a, b)

        made: dict[tuple[int, int], bool] = {}

        def rule(p: int, j: int) -> bool:
            """Define M(p, j): the rest of a string from state p after j blocks; False when empty."""
            key = (p, j)
            if key in made:
                return made[key]
            made[key] = False
            options: list[Expr] = []
            if (j + 1) * size <= hi:
                for q in range(d.n):
                    b = block(p, q)
                    if b is not None and rule(q, j + 1):
                        options.append(Seq((Ref(b), Ref(f"{prefix}m{q}.{j + 1}"))))
            a, c = max(0, lo - j * size), min(size - 1, hi - j * size)
            if a <= c:
                r = remainder(p, a, c)
                if r is not None:
                    options.append(Ref(r))
            if options:
                self.rules[f"{prefix}m{p}.{j}"] = options[0] if len(options) == 1 else Alt(tuple(options))
                made[key] = True
            return made[key]

        if not rule(0, 0):
            raise _TooLarge("empty")
        return Seq((Literal('"'), Ref(f"{prefix}m0.0"), Literal('"')))

    def search(self, pattern: str, ptr: str) -> _CDFA | None:
        """Strings in which ``pattern`` matches somewhere (ECMAScript ``pattern`` semantics); None, with the
        pattern refused, when it is not supported."""
        return _searched(pattern) if self.supported(pattern, ptr) else None

    def supported(self, pattern: str, ptr: str) -> bool:
        """Whether ``pattern`` is supported (its text automaton can be built); refused when it is not."""
        try:
            _search_text(pattern)
        except (RegexError, _TooLarge) as exc:
            kw = ptr.rsplit("/", 2)[-2] if "/patternProperties/" in ptr else "pattern"
            self.refuse(ptr, kw, f"unsupported regex {pattern!r}: {exc}", "ignored")
            return False
        return True

    def string_key(self, sh: _Shape) -> _StringKey:
        """What ``sh`` says of a string's decoded text, the patterns that cannot be honoured left out (and
        refused): the key of the languages shared per process."""
        return _StringKey(
            tuple(p for p, ptr in sh.patterns if self.supported(p, ptr)),
            tuple(name for name, _ in sh.formats),
            tuple(sorted(sh.str_excluded)),
            tuple(p for p, ptr in sh.neg_patterns if self.supported(p, ptr)),
            tuple(name for name, _ in sh.neg_formats),
        )

    def string_cdfa(self, sh: _Shape) -> _CDFA | None:
        """The decoded strings ``sh`` allows, or None when the string constraints are only lengths."""
        if not (sh.patterns or sh.formats or sh.str_excluded or sh.neg_patterns or sh.neg_formats):
            return None
        d = _string_language(self.string_key(sh))
        if d is None:
            raise _TooLarge("string constraints")
        if d.is_empty():
            raise self.unsatisfiable("no string satisfies the pattern/format constraints together", *self.string_at(sh))
        return d

    def string_at(self, sh: _Shape) -> tuple[str, str]:
        """The pointer and keyword an unsatisfiable string constraint is reported at."""
        for pattern, ptr in sh.patterns:
            if self.supported(pattern, ptr):
                return ptr, "pattern"
        if sh.formats:
            return sh.formats[0][1], "format"
        return (sh.neg_patterns or sh.neg_formats or [("", "")])[0][1], "pattern"

    def encoded(self, d: _CDFA, ptr: str, keyword: str) -> Expr | None:
        """The JSON strings (quotes included) whose canonical bodies decode to the language ``d`` (None when
        refused)."""
        try:
            return _automaton_of(d.encode_json().minimized(), quoted=True)
        except _TooLarge:
            self.refuse(ptr, keyword, "the string constraints need too large an automaton", "any string allowed")
            return None

    def countable_lengths(self, sh: _Shape) -> tuple[int, int | None]:
        """``sh``'s length bounds, each refused (lenient: ignored) when it counts more blocks of
        :data:`LENGTH_BLOCK` characters than one automaton may have states (``maxLength: 2147483647``): its
        automaton would need a state per block, so it is refused here, before any is built."""
        lo, hi = sh.min_len, sh.max_len
        if hi is not None and hi // LENGTH_BLOCK >= MAX_DFA_STATES:
            self.refuse(*sh.max_len_at, self.uncountable(hi), "ignored")
            hi = None
        if lo // LENGTH_BLOCK >= MAX_DFA_STATES:
            self.refuse(*sh.min_len_at, self.uncountable(lo), "ignored")
            lo = 0
        return lo, hi

    @staticmethod
    def uncountable(bound: int) -> str:
        return (
            f"a length bound of {bound:,} characters needs an automaton of more than MAX_DFA_STATES = "
            f"{MAX_DFA_STATES:,} states (one per {LENGTH_BLOCK} characters)"
        )

    def length_expr(self, lo: int, hi: int | None) -> Expr:
        quote_ = Literal('"')
        top = hi if hi is not None else lo
        if top <= LENGTH_BLOCK_THRESHOLD:
            name = f"json_string_{lo}_{'' if hi is None else hi}"
            if name not in self.rules:
                self.rules[name] = _counted_chars(lo, hi, True, True)
            return Ref(name)
        # Blocks of characters and the tail with the closing quote are rules of their own that call nothing: the
        # wide states of a long string are then lexical, and their walks are shared (see LexicalMasks).
        b = LENGTH_BLOCK
        block = self.shared(f"json_chars_{b}")
        if hi is None:
            q, r = divmod(lo, b)
            return Seq((quote_, Repeat(block, q, q), self.string_tail(r, None)))
        options = tuple(
            Seq((Repeat(block, k1, k2), self.string_tail(r1, r2))) for k1, k2, r1, r2 in _length_groups(lo, hi, b)
        )
        return Seq((quote_, options[0] if len(options) == 1 else Alt(options)))

    def string_tail(self, lo: int, hi: int | None) -> Ref:
        """A shared rule: between ``lo`` and ``hi`` characters, then the closing quote."""
        name = f"json_tail_{lo}_{'' if hi is None else hi}"
        if name not in self.rules:
            self.rules[name] = _counted_chars(lo, hi, False, True)
        return Ref(name)
