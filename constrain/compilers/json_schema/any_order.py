"""Objects whose properties may come in any order (``property_order="any"``): the rules that keep the set of names
read, in one rule for small objects and a rule per set, written when a matcher reaches it, for larger ones; and the
dependencies (``dependentRequired``) checked on that set, or split into alternatives where it cannot be.

A mixin of :class:`~constrain.compilers.json_schema.compiler._Compiler`, beside
:class:`~constrain.compilers.json_schema.objects._ObjectRules`, whose ``object_expr`` chooses among these.
"""

from __future__ import annotations

import copy
import functools
import itertools
from collections.abc import Callable

from constrain.compilers.json_schema.document import _clean_pointer
from constrain.compilers.json_schema.errors import _check_dependencies, _Unsatisfiable, _verdict
from constrain.compilers.json_schema.keywords import _BRANCHING, _Part, _Shape
from constrain.compilers.json_schema.layout import _Layout
from constrain.compilers.json_schema.rules import _options, _then
from constrain.compilers.json_schema.values import _json_string
from constrain.grammar.ir import Alt, Expr, Literal, Ref, Repeat, Seq, shared

#: Most properties an object may declare for ``property_order="any"`` to read them in one rule, which keeps a
#: state per set of properties read, up to 2 ** this.
MAX_ANY_ORDER_PROPERTIES = 8
#: Most NFA states the members of an object may take in that one rule (each member's name is read in place once
#: per set of members that may precede it, ``2 ** (n - 1)`` times).
MAX_ANY_ORDER_STATES = 4_096
#: Most such states all the objects of one schema may take.
MAX_ANY_ORDER_STATES_TOTAL = 16_384
#: Most properties an object past the bounds above may declare for ``property_order="any"``: each set of members
#: read is then a rule of its own, written when a matcher first reaches it, reading up to this many names. A larger
#: object, or one met where rules cannot be written later, keeps the declared order.
MAX_ANY_ORDER_LATER_PROPERTIES = 64
#: Most bytes the names of such an object may take in all: each rule written for a set of names read reads the names
#: left in place (an automaton state per byte, 1 KiB in a pushdown), so a text holding the object adds at most
#: this many states per name it reads.
MAX_ANY_ORDER_LATER_NAME_BYTES = 1_024


class _AnyOrderRules:
    """The any-order members of an object and its dependencies: a mixin of the compiler (its ``rules``,
    ``deferred``, ``object_branches``, ``object_expr`` and ``extra_rule``)."""

    def dependents_split(self, sh: _Shape, depth: int | None, name: str) -> Expr:
        """The object of ``sh`` with its dependencies (:attr:`_Shape.dependents`) read as a branch reads them:
        one object per trigger present (with the names it needs required) or absent (excluded), read in place, so
        that one automaton follows them all. For an object whose rule cannot track them (see
        :func:`_dependent_bits`)."""
        choices = []
        for trigger, needs, at in sh.dependents:
            present = (trigger, needs, at, True)
            choices.append([present] if trigger in sh.required else [(trigger, needs, at, False), present])
        at = sh.dependents[0][2]
        _check_dependencies(len(choices), _clean_pointer(at), at.rpartition("/")[2])
        combos = list(itertools.product(*choices))
        options: list[Expr] = []
        failure: _Unsatisfiable | None = None
        for k, combo in enumerate(combos):
            shape = copy.copy(sh)
            shape.dependents = []
            shape.required, shape.forbidden = dict(sh.required), dict(sh.forbidden)
            for trigger, needs, at, present in combo:
                if present:
                    for key in (trigger, *needs):
                        shape.required.setdefault(key, at)
                else:
                    shape.forbidden.setdefault(trigger, at)
            try:
                expr = self.object_expr(shape, depth, f"{name}/dependents{k}", alternative=len(combos) > 1)
            except _Unsatisfiable as exc:
                failure = failure or _verdict(exc)
                continue
            options.extend(_options(expr))
        if not options:
            assert failure is not None
            raise failure
        unique = tuple(dict.fromkeys(options))
        return unique[0] if len(unique) == 1 else Alt(unique)

    def among_objects(self, parts: tuple[_Part, ...]) -> bool:
        """Whether the conjunction ``parts`` is one of several alternatives of a branching keyword that may be
        objects (:attr:`object_branches`). A branch reads its alternatives' bodies in place, so that one automaton
        follows them all; objects whose sets of members read are rules of their own would each be a parse of its
        own after their first member, open until the text tells them apart (maybe only at the object's end), and
        each level of a recursive schema would multiply them."""
        branches = self.object_branches
        return bool(branches) and any(
            (part.ptr, kw) in branches for part in parts for kw in part.skip.intersection(_BRANCHING)
        )

    def members_any_order(self, order: _AnyOrder) -> tuple[Expr | None, bool]:
        """The members ``items`` in any order, each at most once, the ``extra`` ones anywhere between them
        (``property_order="any"``). The rule is in one state per set of members read, so it knows which may still
        come and whether the required ones are all there. Names are read in place, so the rule alone tells the
        members apart (calls for whole members would leave one parse open per member after each comma); values
        other than a call or a literal are rules of their own, read once however many sets precede them. Property
        counts are the size of the set: the caller keeps the declared order where they must also count extra
        members."""
        return order.top(_Following(order))

    def members_any_order_later(self, order: _AnyOrder, sh: _Shape, name: str) -> tuple[Expr | None, bool]:
        """:meth:`members_any_order`'s language for an object too large to read in one rule: the members that may
        follow a set of members read are a rule of their own, written when a matcher first reaches that set
        (:attr:`~constrain.grammar.ir.Grammar.deferred`). A text then writes one rule per member it reads, out of
        the ``2 ** n`` sets, and the compile writes only the first member's options."""
        later = _FollowingLater(order, name, sh.object_parts[0].ptr if sh.object_parts else "")
        return order.top(functools.partial(later.rest, self))


class _AnyOrder:
    """What :meth:`_AnyOrderRules.members_any_order` and :meth:`_AnyOrderRules.members_any_order_later` share: the
    members as read in place, the bounds on how many are read, and what may begin and end the object's members.
    Sets of members read are bit sets over ``items``."""

    def __init__(
        self,
        rules: _AnyOrderRules,
        items,
        values: dict[str, Expr],
        extra,
        dependents: list[tuple[int, int]],
        sh: _Shape,
        lay: _Layout,
        name: str,
    ):
        self.n = len(items)
        self.comma = lay.comma
        #: (trigger, the members it needs), as bit sets: a set with the trigger completes only with those.
        self.dependents = dependents
        self.members: list[Expr] = []
        for i, (key, _, _) in enumerate(items):
            value = values[key]
            if type(value) is not Ref and type(value) is not Literal:
                rules.rules[f"{name}/value{i}"] = value
                value = Ref(f"{name}/value{i}")
            self.members.append(_then(Literal(_json_string(key)), lay.colon, value))
        self.extra = rules.extra_rule(extra, name)
        self.required = sum(1 << i for i, item in enumerate(items) if item[2])
        self.lo = sh.min_props if extra is None else 0
        self.hi = self.n if extra is not None or sh.max_props is None else min(self.n, sh.max_props)
        self.extras = Repeat(Seq((lay.comma, self.extra))) if self.extra is not None else None

    def completes(self, read: int) -> bool:
        """Whether some set of members that holds ``read`` completes the object: the required ones, and a count
        within the bounds (the members a dependency needs are counted by the caller, which keeps the declared
        order where both apply)."""
        return max((read | self.required).bit_count(), self.lo) <= self.hi

    def following(self, read: int) -> list[int]:
        """The members that may follow the set ``read``: those not read that leave a way to complete."""
        if read.bit_count() >= self.hi:
            return []
        return [i for i in range(self.n) if not read >> i & 1 and self.completes(read | 1 << i)]

    def then(self, options: list[Expr], read: int) -> Expr | None:
        """What may follow the set ``read``: ``options`` (the next members), the end where ``read`` completes
        the object, extra members before either; None when nothing may."""
        if (
            read & self.required == self.required
            and read.bit_count() >= self.lo
            and all(not read & trigger or read & needs == needs for trigger, needs in self.dependents)
        ):
            options.append(Seq(()))
        if not options:
            return None
        body = options[0] if len(options) == 1 else shared(Alt(tuple(options)))
        return body if self.extras is None else shared(Seq((self.extras, body)))

    def top(self, rest: Callable[[int], Expr | None]) -> tuple[Expr | None, bool]:
        """The object's members (None when there can be none) and whether it may be empty, given ``rest``."""
        first: list[Expr] = []
        if self.hi > 0:
            for i in range(self.n):
                tail = rest(1 << i)
                if tail is not None:
                    first.append(Seq((self.members[i], tail)))
        if self.extra is not None:
            tail = rest(0)
            if tail is not None:
                first.append(Seq((self.extra, tail)))
        nonempty = None if not first else first[0] if len(first) == 1 else Alt(tuple(first))
        return nonempty, self.required == 0 and self.lo == 0


def _dependent_bits(sh: _Shape, items, names: list[str], extra) -> list[tuple[int, int]] | None:
    """``sh.dependents`` as (trigger, needed members) bit sets over ``items``; None where a trigger or a name it
    needs could be an additional member (whose presence the object's rule does not track). A trigger that can
    never be present (declared but excluded, or neither declared nor allowed as an additional member) needs
    nothing."""
    index = {key: i for i, (key, _, _) in enumerate(items)}
    bits = []
    for trigger, needs, _ in sh.dependents:
        if trigger not in index:
            if trigger in names or extra is None:
                continue
            return None
        if any(key not in index for key in needs):
            return None
        bits.append((1 << index[trigger], sum(1 << index[key] for key in needs)))
    return bits


def _any_order_states(items, values: dict[str, Expr]) -> int:
    """About how many NFA states :meth:`_AnyOrderRules.members_any_order` makes for ``items``: each member's name
    (and a literal value) once per set of the other members, a few states for the punctuation and the call."""
    size = 0
    for key, _, _ in items:
        value = values[key]
        size += len(_json_string(key).encode()) + 4 + (len(str(value.value)) if type(value) is Literal else 0)
    return size << (len(items) - 1)


class _Following:
    """What may follow each set of members read (a bit set), in the one rule of
    :meth:`_AnyOrderRules.members_any_order`; None where nothing completes. Kept per set, as an object rather than
    a recursive closure, which would be a reference cycle that waits for the garbage collector."""

    __slots__ = ("order", "after")

    def __init__(self, order: _AnyOrder):
        self.order = order
        self.after: dict[int, Expr | None] = {}

    def __call__(self, read: int) -> Expr | None:
        if read in self.after:
            return self.after[read]
        order = self.order
        options: list[Expr] = []
        for i in order.following(read):
            tail = self(read | 1 << i)
            if tail is not None:
                options.append(Seq((order.comma, order.members[i], tail)))
        self.after[read] = found = order.then(options, read)
        return found


class _FollowingLater:
    """What may follow each set of members read in :meth:`_AnyOrderRules.members_any_order_later`: a comma and the
    rule of the next member, named now and written when a matcher reaches it. The writers the compiler keeps hold
    this object, which holds no compiler (it is passed in), so they close no reference cycle through it."""

    __slots__ = ("order", "name", "ptr")

    def __init__(self, order: _AnyOrder, name: str, ptr: str):
        self.order = order
        self.name = name
        self.ptr = ptr

    def next_member(self, read: int, compiler: _AnyOrderRules) -> Expr:
        """The body of the rule of the members after ``read``: each that leaves a way to complete, then what may
        follow it."""
        order = self.order
        options = [Seq((order.members[i], self.rest(compiler, read | 1 << i))) for i in order.following(read)]
        return options[0] if len(options) == 1 else Alt(tuple(options))

    def rest(self, compiler: _AnyOrderRules, read: int) -> Expr | None:
        """What may follow once the members in ``read`` are read: a comma and the rule of the next member, or the
        end where the set completes the object."""
        order = self.order
        options: list[Expr] = []
        if order.following(read):
            rule = f"{self.name}/after{read:x}"
            if rule not in compiler.rules and rule not in compiler.deferred:
                compiler.deferred[rule] = (self.ptr, functools.partial(self.next_member, read))
            options.append(Seq((order.comma, Ref(rule))))
        return order.then(options, read)
