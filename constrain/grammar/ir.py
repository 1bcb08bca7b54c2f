"""The grammar IR: named rules whose bodies combine terminals with sequences, alternatives, repetitions and calls.

Every structure compiler (JSON Schema, Lark, GBNF, tools) lowers to a :class:`Grammar`. Composite nodes hash once and
compare by value; equal bodies from different schemas share one rule DFA (:mod:`constrain.grammar.rules` keys its
cache by a plain-tuple form of the body).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence, Set
from dataclasses import dataclass, field

from constrain.automata.dfa import ByteDFA
from constrain.errors import GrammarError


@dataclass(frozen=True)
class Literal:
    """Exactly these bytes (a ``str`` is taken as its UTF-8 encoding)."""

    value: bytes | str


@dataclass(frozen=True)
class Regex:
    """Any full match of a regex (the subset of :mod:`constrain.automata.regex`, without anchors)."""

    pattern: str


@dataclass(frozen=True)
class Token:
    """Exactly one token, named by id or by its text (a special token's name such as ``<tool_call>``).

    Resolved against the vocabulary when the grammar is compiled (:mod:`constrain.grammar.tokens`): special tokens
    stay unmatchable everywhere else, so this is the only way a structure lets one through."""

    ref: int | str


@dataclass(frozen=True)
class TokensExcept:
    """One token other than these (GBNF's ``!<[id]>``). Over bytes, only a repetition of it is exact: ``Repeat(
    TokensExcept(...), 0 or 1, None)`` is any text in which the named tokens do not occur; anything else is
    refused when the grammar is compiled."""

    refs: tuple[int | str, ...]


@dataclass(frozen=True)
class Ref:
    """One match of another rule."""

    rule: str


class _CachedHash:
    """Composite expressions are deep trees used as dictionary keys (a rule's shared suffixes while its automaton
    is built, a compile's caches): their hash is computed once, not walked again on every lookup.

    What a composite keeps about itself once computed lives in slots, not in an instance dictionary: a compile
    leaves tens of thousands of these nodes alive, and a dictionary each would be as many more objects for every
    collection of the cyclic garbage collector to walk. Only the fields and the :func:`shared` mark are pickled
    (hashes of str differ by process)."""

    __slots__ = ("_hash", "_refs", "_terminals", "_hoisted", "_dfa", "_shared")

    def __hash__(self) -> int:
        cached = getattr(self, "_hash", None)
        if cached is None:
            if type(self) is Repeat:
                cached = hash(("Repeat", self.item, self.min, self.max))
            else:
                cached = hash((type(self).__name__, self.items))
            object.__setattr__(self, "_hash", cached)
        return cached

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)  # the fields
        if getattr(self, "_shared", False):
            state["_shared"] = True
        return state

    def __setstate__(self, state: dict) -> None:
        for key, value in state.items():
            object.__setattr__(self, key, value)


@dataclass(frozen=True, eq=True)
class Seq(_CachedHash):
    items: tuple[Expr, ...]

    __hash__ = _CachedHash.__hash__


@dataclass(frozen=True, eq=True)
class Alt(_CachedHash):
    items: tuple[Expr, ...]

    __hash__ = _CachedHash.__hash__


@dataclass(frozen=True, eq=True)
class Repeat(_CachedHash):
    """``item`` between ``min`` and ``max`` times (``max=None``: unbounded)."""

    item: Expr
    min: int = 0
    max: int | None = None

    __hash__ = _CachedHash.__hash__


class Automaton:
    """Any string a call-free :class:`~constrain.automata.dfa.ByteDFA` accepts: what a compiler that combines
    constraints as automata (a pattern with a length bound, keys other than some names) hands over directly,
    instead of writing the automaton back as a regex to be parsed again. Equal when the automata are equal state
    for state (they are minimised, so equal languages compare equal up to state numbering).

    :meth:`later` makes one whose DFA is built when first asked for: a lazily built pushdown then builds it only
    when a matcher first calls its rule."""

    __slots__ = ("_dfa", "_build", "_later_key", "_bound")

    def __init__(self, dfa: ByteDFA):
        if dfa.callees:
            raise GrammarError("an Automaton must not call rules")
        self._dfa, self._build, self._later_key, self._bound = dfa, None, None, dfa.num_states

    @classmethod
    def later(cls, build: Callable[[], ByteDFA], key: str, bound: int) -> Automaton:
        """An automaton whose DFA ``build()`` makes when it is first asked for. ``key`` names its language (equal
        keys: equal languages; it never equals a built automaton's key); ``bound`` is at least its number of
        states, which the size checks read before it is built. ``build`` must not fail: a compiler that could
        refuse the automaton builds it now."""
        out = cls.__new__(cls)
        out._dfa, out._build, out._later_key, out._bound = None, build, key, bound
        return out

    @property
    def dfa(self) -> ByteDFA:
        dfa = self._dfa
        if dfa is None:
            dfa = self._build()
            if dfa.callees:
                raise GrammarError("an Automaton must not call rules")
            self._dfa, self._build, self._bound = dfa, None, dfa.num_states
        return dfa

    @property
    def built(self) -> bool:
        """Whether its DFA is built."""
        return self._dfa is not None

    @property
    def bound(self) -> int:
        """Its number of states, or a bound on it before it is built."""
        return self._bound

    @property
    def _key(self) -> bytes | tuple[str, str]:
        """The table's digest, kept on the DFA (:attr:`~constrain.automata.dfa.ByteDFA.digest`): the automata compilers
        share per process (keys other than some names, patterns) are wrapped anew by every grammar using them. For
        one built later, the key it was given."""
        return ("later", self._later_key) if self._later_key is not None else self._dfa.digest

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Automaton) and self._key == other._key

    def __hash__(self) -> int:
        return hash(self._key)

    def __repr__(self) -> str:
        if self._later_key is not None:
            return f"Automaton(built later: {self._later_key})"
        return f"Automaton({self._dfa.num_states} states, {self._key.hex()[:12]})"


Expr = Literal | Regex | Ref | Seq | Alt | Repeat | Automaton | Token | TokensExcept


def shared(expr: Seq | Alt) -> Seq | Alt:
    """Mark ``expr`` as one that a rule body reaches in several ways (a DAG, not a tree): its automaton is built
    once per target state and entered from each of them, rather than built again for each. The mark changes
    neither the language nor equality; it only keeps such a body's automaton, and its determinisation, small."""
    object.__setattr__(expr, "_shared", True)
    return expr


@dataclass(frozen=True)
class Grammar:
    """Named rules; the text must be one match of ``start``. ``origins`` maps a rule to where its source wrote it
    (a JSON pointer, a line): how a refusal that names a rule points the caller back at their own text."""

    rules: Mapping[str, Expr]
    start: str
    origins: Mapping[str, str] = field(default_factory=dict, compare=False)
    #: Whether some rule names tokens (:class:`Token`, :class:`TokensExcept`): compiling it then resolves them
    #: against the vocabulary (:func:`~constrain.grammar.tokens.resolve_tokens`).
    names_tokens: bool = False
    #: Rules that are called but not written yet: ``write_later`` writes one when a matcher first reaches it
    #: (:func:`~constrain.grammar.rules.build_pushdown`). Each must complete, read a byte before it completes and
    #: call no rule before it reads one: what its writer certified when it put the rule off.
    deferred: frozenset[str] = field(default=frozenset(), compare=False)
    #: ``write_later(name, known)``: the grammar whose start rule is deferred rule ``name``, holding it and every
    #: rule it brings that ``known`` (the names a pushdown already has) lacks; its own ``deferred`` names the
    #: rules it puts off in turn.
    write_later: Callable[[str, Set[str]], Grammar] | None = field(default=None, compare=False)
    #: Rules whose writer vouches for what the checks of :func:`~constrain.grammar.rules.build_pushdown` would
    #: establish: each completes, reads a byte before it completes, and calls before reading a byte only rules of
    #: this set, which none of them can call again before a byte (rules a compiler writes the same way in every
    #: grammar, or whose language it knows, checked by its tests rather than in every compile).
    settled: frozenset[str] = field(default=frozenset(), compare=False)


class Pushdown:
    """A compiled grammar: rule ``i`` is named ``names[i]`` (rule 0 is the start) and read by a DFA whose call
    edges name rules by index. Runtime configurations are stacks of (rule, state) frames; see
    :mod:`constrain.runtime.pushdown`.

    A pushdown built lazily (:func:`~constrain.grammar.rules.build_pushdown`) holds only some DFAs: :meth:`rule`
    builds the others when first asked for, so a matcher determinises only the rules its text reaches. Building a
    rule of a grammar whose rules are written later (:attr:`Grammar.deferred`) may add rules: their numbers come
    after every rule there was (:meth:`extend`), so numbers already handed out keep their meaning."""

    __slots__ = ("names", "calling", "_rules", "_build", "__weakref__")

    def __init__(
        self,
        names: Sequence[str],
        rules: Sequence[ByteDFA | None],
        *,
        calling: Sequence[bool] | None = None,
        build: Callable[[int], ByteDFA] | None = None,
    ):
        if build is None and any(dfa is None for dfa in rules):
            raise GrammarError("a Pushdown with rules left to build needs a build function")
        self.names = list(names)
        #: Per rule: whether it calls other rules (known before its DFA is built).
        self.calling = list(calling) if calling is not None else [bool(dfa.callees) for dfa in rules]
        self._rules = list(rules)
        self._build = build

    def rule(self, index: int) -> ByteDFA:
        """Rule ``index``'s DFA, built now if it was not yet."""
        dfa = self._rules[index]
        if dfa is None:
            dfa = self._rules[index] = self._build(index)
        return dfa

    def is_built(self, index: int) -> bool:
        return self._rules[index] is not None

    def extend(self, names: Sequence[str], calling: Sequence[bool]) -> None:
        """Add rules, numbered from the present count on, whose DFAs :meth:`rule` builds when asked for."""
        self.names.extend(names)
        self.calling.extend(calling)
        self._rules.extend([None] * len(names))

    @property
    def rules(self) -> tuple[ByteDFA, ...]:
        """Every rule's DFA (those not built yet are built now, with the rules they add)."""
        i = 0
        while i < len(self.names):
            self.rule(i)
            i += 1
        return tuple(self._rules)

    @property
    def built(self) -> list[ByteDFA]:
        """The DFAs built so far."""
        return [dfa for dfa in self._rules if dfa is not None]

    @property
    def num_states(self) -> int:
        """States of the rules built so far."""
        return sum(dfa.num_states for dfa in self.built)


def collect_refs(expr: Expr, out: dict[str, int]) -> dict[str, int]:
    """Add the rules ``expr`` calls to ``out`` (name -> order of first appearance); returns ``out``."""
    for rule in calls_of(expr):
        out.setdefault(rule, len(out))
    return out


def calls_of(expr: Expr) -> tuple[str, ...]:
    """The rules ``expr`` calls, in order of first appearance. Kept on a composite expression: the rules every
    schema shares are the same objects in every grammar, and a subtree met again costs a lookup."""
    if isinstance(expr, Ref):
        return (expr.rule,)
    if not isinstance(expr, (Seq, Alt, Repeat)):
        return ()
    refs = getattr(expr, "_refs", None)
    if refs is None:
        refs = _scan(expr)
    return refs


def _has_terminals(expr: Expr) -> bool:
    """Whether ``expr`` reads a regex or an automaton anywhere (kept on a composite, found with its calls)."""
    if isinstance(expr, (Regex, Automaton)):
        return True
    if not isinstance(expr, (Seq, Alt, Repeat)):
        return False
    terminals = getattr(expr, "_terminals", None)
    if terminals is None:
        _scan(expr)
        terminals = expr._terminals
    return terminals


def _scan(expr: Seq | Alt | Repeat) -> tuple[str, ...]:
    """Find and keep on ``expr`` its calls (:func:`calls_of`) and whether it has terminals (:func:`_has_terminals`).

    One left-to-right walk of the expression's DAG, each node once: an object's optional members each go on with
    the shared rest, and a tuple of calls kept per node would grow with that rest (quadratic). Leaves are looked
    at where their parent lists them; only composites are descended into."""
    found: dict[str, None] = {}
    terminals = False
    seen: set[int] = set()
    pending = [iter((expr.item,) if isinstance(expr, Repeat) else expr.items)]
    while pending:
        for item in pending[-1]:
            kind = type(item)
            if kind is Ref:
                found[item.rule] = None
            elif kind is Regex or kind is Automaton:
                terminals = True
            elif (kind is Seq or kind is Alt or kind is Repeat) and id(item) not in seen:
                seen.add(id(item))
                known = getattr(item, "_refs", None)
                if known is not None:
                    found.update(dict.fromkeys(known))
                    terminals = terminals or item._terminals
                else:
                    pending.append(iter((item.item,) if kind is Repeat else item.items))
                    break
        else:
            pending.pop()
    refs = tuple(found)
    object.__setattr__(expr, "_refs", refs)
    object.__setattr__(expr, "_terminals", terminals)
    return refs
