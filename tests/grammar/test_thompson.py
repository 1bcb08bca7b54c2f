"""The kernel that builds a calling rule's NFA from its cache key (constrain.grammar.thompson) against the
construction node by node in Python (constrain.grammar.rules._build): the same minimal DFA, state for state, for
generated bodies (shared subtrees, marked members, bounded and unbounded repetitions, empty literals and
sequences) and for every rule of real schemas; the same errors at the same bounds."""

from __future__ import annotations

import gzip
import json
from itertools import islice

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from constrain.automata.limits import MAX_NFA_STATES
from constrain.errors import AutomatonTooLarge, GrammarError
from constrain.grammar.ir import Alt, Expr, Grammar, Literal, Ref, Regex, Repeat, Seq, collect_refs, shared
from constrain.grammar.rules import _body_key, _build_rule_dfa, build_pushdown
from constrain.grammar.thompson import flat_body
from tests.shared_data import MASKBENCH_DEV


def _both(body: Expr):
    """The body's DFA and call names by the kernel (from its key) and by the construction in Python."""
    return _build_rule_dfa(body, _body_key(body)), _build_rule_dfa(body, None)


def _assert_same(body: Expr) -> None:
    (kernel, kernel_calls), (python, python_calls) = _both(body)
    assert kernel_calls == python_calls
    assert kernel.callees == python.callees
    assert np.array_equal(kernel.trans, python.trans)
    assert np.array_equal(kernel.accepting, python.accepting)
    assert np.array_equal(kernel.calls, python.calls)


_LEAVES = (Literal("a"), Literal("ab"), Literal(""), Literal(b"\xff\x00"), Literal("é{"), Ref("r0"), Ref("r1"))


@st.composite
def bodies(draw):
    """A body of literals and calls made bottom up from a pool, so that later composites reach earlier ones more
    than once (a DAG), some Seq and Alt marked shared."""
    pool: list[Expr] = list(_LEAVES)
    for _ in range(draw(st.integers(1, 10))):
        kind = draw(st.sampled_from(["seq", "alt", "repeat"]))
        if kind == "repeat":
            low, extra = draw(st.integers(0, 3)), draw(st.one_of(st.none(), st.integers(0, 3)))
            expr: Expr = Repeat(draw(st.sampled_from(pool)), low, None if extra is None else low + extra)
        else:
            items = tuple(draw(st.lists(st.sampled_from(pool), min_size=0 if kind == "seq" else 1, max_size=4)))
            expr = Seq(items) if kind == "seq" else Alt(items)
            if draw(st.booleans()):
                expr = shared(expr)
        pool.append(expr)
    return pool[-1]


@given(bodies())
@settings(max_examples=400, deadline=None)
def test_the_kernel_builds_the_rule_dfa_the_python_construction_builds(body):
    _assert_same(body)


def _object_rule(required: list[bool]) -> Expr:
    """An object's rule as the JSON Schema compiler writes it: members marked shared, each option a member and the
    rest after commas, the optional ones repeated at most once."""
    members = [shared(Seq((Literal(f'"k{j}"'), Literal(":"), Ref("v")))) for j in range(len(required))]
    following = [Seq((Literal(","), m)) for m in members]
    following = [f if r else Repeat(f, 0, 1) for f, r in zip(following, required)]
    last = required.index(True) if True in required else len(required) - 1
    options = [Seq((members[j], *following[j + 1 :])) for j in range(last + 1)]
    return Seq((Literal("{"), Alt(tuple(options)) if len(options) > 1 else options[0], Literal("}")))


@pytest.mark.parametrize("required", [[False] * 12, [True] * 5, [False, True, False, False, True, False]])
def test_an_objects_rule_joins_its_members_and_rests_as_the_python_construction_does(required):
    """The kernel's NFA of an object's rule stays as small as the construction in Python makes it: each member is
    built once per target, and options that end alike join."""
    from constrain.automata.nfa import ByteNFA
    from constrain.grammar.rules import _build
    from constrain.grammar.thompson import thompson_nfa

    body = _object_rule(required)
    _assert_same(body)
    called: dict[str, int] = {}
    collect_refs(body, called)
    nfa = ByteNFA()
    start, accept = nfa.new_state(), nfa.new_state()
    _build(nfa, body, start, accept, called, {})
    status, size, *_ = thompson_nfa(*flat_body(_body_key(body), called), MAX_NFA_STATES)
    assert status == 0 and size <= nfa.size


def test_bodies_with_terminals_or_alone_are_left_to_the_construction_in_python():
    assert flat_body(_body_key(Seq((Literal("a"), Regex("[0-9]+")))), {}) is None
    assert flat_body(_body_key(Literal("a")), {}) is None
    assert flat_body(_body_key(Ref("r")), {"r": 0}) is None


@pytest.mark.parametrize(
    ("body", "error", "message"),
    [
        (Seq((Literal("a"), Alt(()))), GrammarError, "has an alternative with no options"),
        (Seq((Literal("a"), Repeat(Literal("b"), 3, 1))), GrammarError, "repeats between 3 and 1 times"),
        (Seq((Literal("a"), Repeat(Literal("b"), -1, None))), GrammarError, "repeats between -1 and None times"),
        (Seq((Ref("s"), Repeat(Literal("bc"), 0, MAX_NFA_STATES + 5))), AutomatonTooLarge, "repeats .* times"),
        (
            Seq((Ref("s"), Repeat(Literal("bc" * 1000), 0, MAX_NFA_STATES // 1000))),
            AutomatonTooLarge,
            "more than .* NFA states",
        ),
    ],
)
def test_the_kernel_refuses_what_the_python_construction_refuses_with_the_same_words(body, error, message):
    for key in (_body_key(body), None):
        with pytest.raises(error, match=message):
            _build_rule_dfa(body, key)
    with pytest.raises(error, match=f"rule 'start'.*{message}|{message}"):
        build_pushdown(Grammar({"start": body, "s": Literal("x")}, "start"))


def test_every_rule_of_real_schemas_is_built_alike_by_the_kernel_and_in_python(gemma_vocab):
    """Every rule of a sample of MaskBench dev schemas (built all, lazily written values included) comes out of
    the kernel as the construction in Python builds it."""
    from constrain.compilers.json_schema import compile_json_schema
    from constrain.grammar import rules

    built: list[Expr] = []
    original = rules._build_rule_dfa

    def recording(body, key=None):
        if key is not None:
            built.append(body)
        return original(body, key)

    rules._build_rule_dfa = recording
    try:
        with gzip.open(MASKBENCH_DEV, "rt") as lines:
            for line in islice(lines, 0, None, 97):
                try:
                    structure = compile_json_schema(json.loads(line)["schema"], gemma_vocab)
                except Exception:  # a refused schema has no rules to compare
                    continue
                pushdown = structure.pushdown
                i = 0
                while i < len(pushdown.names):  # writing a value adds rules at the end
                    pushdown.rule(i)
                    i += 1
    finally:
        rules._build_rule_dfa = original
    programs = [body for body in built if flat_body(_body_key(body), collect_refs(body, {})) is not None]
    assert len(programs) > 100
    for body in programs:
        _assert_same(body)
