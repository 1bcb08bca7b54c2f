"""A pushdown built lazily: rules are determinised when a matcher first calls them, with the same masks and reads.

``build_pushdown(lazy=True)`` (what JSON Schema compiles use) builds the start rule and the call-free rules; the
machine appends any other rule when a closure, a mask walk or a cached step first follows a call into it. The
reference here is the same grammar built eagerly: every mask and every read must be equal, token by token, over
real schemas (MaskBench) with the Gemma vocabulary, and the lazy structure must have left rules unbuilt.
"""

from __future__ import annotations

import gzip
import hashlib
import json

import numpy as np
import pytest

from constrain.automata.limits import compile_clock
from constrain.compilers.json_schema import compile_json_schema
from constrain.compilers.json_schema.compiler import schema_to_grammar
from constrain.errors import AutomatonTooLarge, CompileTimeout, GrammarError, JsonSchemaError, TokenError
from constrain.grammar.ir import Alt, Grammar, Literal, Ref, Repeat, Seq
from constrain.grammar.rules import build_pushdown
from constrain.runtime.pushdown import Machine, compile_grammar
from constrain.testing import byte_vocabulary
from tests.shared_data import MASKBENCH_DEV as DATA

#: Schemas of the dev set with definitions (where laziness matters), the first by a fixed hash order.
SAMPLE = 24


def _sample() -> list[dict]:
    if not DATA.is_file():
        pytest.skip(f"MaskBench data not found at {DATA}")
    entries = []
    with gzip.open(DATA, "rt", encoding="utf-8") as f:
        for line in f:
            if '"definitions"' in line or '"$defs"' in line:
                entries.append(json.loads(line))
    entries.sort(key=lambda e: hashlib.sha256(("lazy:" + e["name"]).encode()).digest())
    return entries[: SAMPLE * 2]


def _masks_and_reads_agree(lazy, eager, tokens: list[int]) -> int:
    """Walk ``tokens`` through both structures with a mask before each; returns how many were read."""
    a, b = lazy.matcher(), eager.matcher()
    width = (lazy.vocab.size + 31) // 32
    mask_a, mask_b = np.zeros((1, width), np.int32), np.zeros((1, width), np.int32)
    for i, token in enumerate(tokens):
        a.fill_bitmask(mask_a, 0)
        b.fill_bitmask(mask_b, 0)
        assert np.array_equal(mask_a, mask_b), f"masks differ before token {i}"
        errors = []
        for m in (a, b):
            try:
                m.advance(token)
                errors.append(None)
            except TokenError:
                errors.append("rejected")
        assert errors[0] == errors[1], f"token {i}: {errors}"
        if errors[0]:
            return i
    assert a.is_accepting() == b.is_accepting()
    return len(tokens)


def test_lazy_and_eager_structures_give_the_same_masks_and_reads_on_real_schemas(gemma_tokenizer, gemma_vocab):
    compared = left_unbuilt = grown = 0
    for entry in _sample():
        try:
            grammar, _ = schema_to_grammar(entry["schema"])
            lazy = compile_grammar(grammar, gemma_vocab, lazy=True)
        except Exception:  # refused (the golden file pins which): nothing to compare
            continue
        eager = compile_grammar(grammar, gemma_vocab)
        total = len(lazy.pushdown.names)
        first = lazy.matcher()
        first.fill_bitmask(np.zeros((1, (gemma_vocab.size + 31) // 32), np.int32), 0)
        built_at_start = sum(lazy.pushdown.is_built(i) for i in range(total))
        left_unbuilt += built_at_start < total
        for test in entry["tests"][:3]:
            text = json.dumps(test["data"], separators=(",", ":"), ensure_ascii=False)
            tokens = gemma_tokenizer.encode(text, add_special_tokens=False)
            _masks_and_reads_agree(lazy, eager, tokens)
        grown += lazy.machine.version > 1
        assert lazy.machine.num_states <= eager.machine.num_states
        compared += 1
        if compared == SAMPLE:
            break
    assert compared >= SAMPLE // 2
    assert left_unbuilt >= compared // 2, "a lazy compile should leave most such schemas' rules unbuilt"
    assert grown, "no machine replaced its arrays: the growth path went untested"


def _nested(depth: int) -> Grammar:
    """Rule i reads "(" then calls rule i+1 or reads "x", then ")": each rule is reached only by nesting."""
    rules = {
        f"r{i}": Seq((Literal("("), Alt((Ref(f"r{i + 1}"), Literal("x"))), Literal(")"))) for i in range(depth - 1)
    }
    rules[f"r{depth - 1}"] = Literal("x")
    return Grammar(rules, "r0")


def test_a_rule_is_added_when_first_reached_and_states_keep_their_numbers(monkeypatch):
    monkeypatch.setattr(Machine, "INITIAL_STATES", 1)  # no room to spare: adding rules replaces the arrays
    pushdown = build_pushdown(_nested(12), lazy=True)
    machine = Machine(pushdown)
    assert [pushdown.is_built(i) for i in range(12)].count(True) == 2  # the start rule and the call-free one
    configs = machine.read(machine.start, b"((")
    assert configs
    reached = {machine.locate(stack[-1])[0] for stack in configs}
    before = {rule: machine.rule_states(rule) for rule in range(12) if machine.rule_start[rule] >= 0}
    configs = machine.read(configs, b"((((((x))))))))")
    assert configs and machine.can_end(configs)
    assert reached and all(machine.rule_states(rule) == states for rule, states in before.items())
    assert machine.version > 1  # the arrays were replaced by larger ones
    assert not machine.read(machine.start, b"(((((((((((x))))))))))))")  # one level more than the grammar has


def test_lazy_builds_refuse_what_eager_builds_refuse():
    never = Grammar({"s": Seq((Literal("a"), Ref("t"))), "t": Seq((Literal("b"), Ref("t")))}, "s")
    left = Grammar({"s": Alt((Seq((Ref("t"), Literal("a"))), Literal("b"))), "t": Seq((Ref("s"),))}, "s")
    undefined = Grammar({"s": Seq((Literal("a"), Ref("nowhere")))}, "s")
    for grammar, message in ((never, "never complete"), (left, "left recursion"), (undefined, "undefined rule")):
        for lazy in (False, True):
            with pytest.raises(GrammarError, match=message):
                build_pushdown(grammar, lazy=lazy)


def test_a_rule_too_large_for_the_bounds_is_refused_when_reached_naming_it():
    """A lazy build defers a small rule's bounds to its first call: the step that reaches it raises, naming it and
    where its source wrote it (a JSON pointer for a schema's rule). (a|b)*a(a|b){17} has a body of a few dozen NFA
    states and a DFA of 2^18, past MAX_DFA_STATES; an eager build refuses the grammar at compile time."""
    vocab = byte_vocabulary()
    ab = Alt((Literal("a"), Literal("b")))
    big = Seq((Repeat(ab, 0, None), Literal("a"), Repeat(ab, 17, 17), Ref("s")))
    rules = {"s": Seq((Literal("a"), Alt((Ref("big"), Literal("c"))))), "big": big}
    grammar = Grammar(rules, "s", {"big": "/properties/big"})
    structure = compile_grammar(grammar, vocab, lazy=True)  # "big" is not needed before the first byte
    matcher = structure.matcher()
    matcher.advance(ord("a"))
    with pytest.raises(AutomatonTooLarge, match="big.*from /properties/big") as info:
        matcher.fill_bitmask(np.zeros((1, (vocab.size + 31) // 32), np.int32), 0)
    assert info.value.rule == "big" and info.value.origin == "/properties/big"
    unnamed = compile_grammar(Grammar(rules, "s"), vocab, lazy=True).matcher()
    unnamed.advance(ord("a"))
    with pytest.raises(AutomatonTooLarge) as info:
        unnamed.fill_bitmask(np.zeros((1, (vocab.size + 31) // 32), np.int32), 0)
    assert info.value.rule == "big" and info.value.origin is None
    with pytest.raises(AutomatonTooLarge):
        compile_grammar(grammar, vocab)  # eagerly: refused at compile time


def test_a_lazy_machine_has_room_to_grow_and_counts_only_the_states_it_holds():
    pushdown = build_pushdown(_nested(12), lazy=True)
    machine = Machine(pushdown)
    assert machine.trans.shape[0] >= Machine.INITIAL_STATES > machine.num_states
    held = machine.nbytes
    assert held < machine.trans.nbytes  # the room is not counted
    states = machine.num_states
    assert machine.read(machine.start, b"((((((x))))))")
    assert machine.num_states > states and machine.version == 1  # rules added, in the room it had
    assert machine.nbytes - held >= (machine.num_states - states) * machine.trans.itemsize * 256
    eager = Machine(build_pushdown(_nested(12)))
    assert eager.trans.shape[0] == eager.num_states  # a machine built whole has no room to spare


def test_a_rule_built_later_is_held_to_the_time_the_compile_was_allowed():
    """(a|b)*a(a|b){16} before a call: a small body whose DFA has 2^17 states. Built when first reached, it gets
    the time the compile had, and is refused with a CompileTimeout naming it past that."""
    ab = Alt((Literal("a"), Literal("b")))
    hard = Seq((Repeat(ab, 0, None), Literal("a"), Repeat(ab, 16, 16), Ref("late:end")))
    grammar = Grammar(
        {"s": Seq((Literal("x"), Alt((Ref("late:hard"), Literal("y"))))), "late:hard": hard, "late:end": Literal("!")},
        "s",
    )
    pushdown = build_pushdown(grammar, lazy=True, deadline=compile_clock() + 0.05)
    hard_rule = pushdown.names.index("late:hard")
    assert not pushdown.is_built(hard_rule)
    with pytest.raises(CompileTimeout, match="late:hard") as info:
        pushdown.rule(hard_rule)
    assert info.value.rule == "late:hard" and info.value.origin is None


def test_a_rule_too_large_to_defer_is_built_or_refused_at_compile_time():
    """A counted array inside an object calls its items' rule: its NFA bound passes EAGER_NFA_STATES, so it is
    built with the compile (within its time limit) and, past the automaton bounds, refused there, not in a mask."""
    vocab = byte_vocabulary()

    def schema(n: int) -> dict:
        items = {"type": "array", "items": {"type": "integer"}, "minItems": n, "maxItems": n}
        return {"type": "object", "properties": {"a": items}}

    structure = compile_json_schema(schema(8_000), vocab)
    built = {name for i, name in enumerate(structure.pushdown.names) if structure.pushdown.is_built(i)}
    assert "schema:/properties/a" in built
    small = compile_json_schema(schema(3), vocab)
    assert not small.pushdown.is_built(small.pushdown.names.index("schema:/properties/a"))
    with pytest.raises(JsonSchemaError, match="DFA states") as info:
        compile_json_schema(schema(150_000), vocab)
    assert info.value.pointer == "/properties/a"
