"""``property_order="any"``: an object's properties in any order, each at most once, additional ones anywhere.

The oracle is ``jsonschema`` on the parsed value, with one rule of our own: a text that repeats a declared name is
never accepted (a parser would keep only one of its values). Small objects are checked on every ordering of every
subset of their members; MaskBench's schemas whose valid instances come in another order than the declared one
check that the language only grows (every text the declared order accepts is still accepted, no invalid instance
is) and that instances in their own order are now accepted.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import random
import sys
from pathlib import Path

import jsonschema
import pytest

import constrain
from constrain.compilers.json_schema import (
    MAX_ANY_ORDER_LATER_NAME_BYTES,
    MAX_ANY_ORDER_LATER_PROPERTIES,
    MAX_ANY_ORDER_PROPERTIES,
    JsonSchemaError,
    compile_json_schema,
    schema_to_grammar,
)
from constrain.errors import ArgumentError
from constrain.grammar.rules import build_pushdown
from constrain.runtime.pushdown import Machine
from tests.shared_data import MASKBENCH_DEV as DATA


def machine(schema, **options) -> Machine:
    grammar, _ = schema_to_grammar(schema, **options)
    return Machine(build_pushdown(grammar))


def accepts(m: Machine, text: str) -> bool:
    configs = m.read(m.start, text.encode())
    return bool(configs) and m.can_end(configs)


def member(key: str, value) -> str:
    return json.dumps(key) + ":" + json.dumps(value, separators=(",", ":"))


def texts(members: dict[str, object], extras: dict[str, object], repeat: str | None):
    """Every ordering of every subset of ``members`` and ``extras``, with ``repeat`` (a declared name) read a second
    time when given: ``(text, parsed value, repeats a declared name)``."""
    pool = [(k, v) for k, v in members.items()] + [(k, v) for k, v in extras.items()]
    if repeat is not None:
        pool.append((repeat, members[repeat]))
    for size in range(len(pool) + 1):
        for chosen in itertools.combinations(pool, size):
            for order in itertools.permutations(chosen):
                names = [k for k, _ in order]
                text = "{" + ",".join(member(k, v) for k, v in order) + "}"
                yield text, dict(order), len(set(names)) < len(names)


def check_every_order(schema, members, extras=None, repeat=None, **options) -> int:
    """Acceptance of every text of :func:`texts` equals validity (and no repeated name); returns how many were
    accepted in an order other than the declared one."""
    m = machine(schema, property_order="any", **options)
    declared = list(schema.get("properties", {}))
    reordered = 0
    for text, value, repeated in texts(members, extras or {}, repeat):
        expected = jsonschema.validators.validator_for(schema)(schema).is_valid(value) and not repeated
        got = accepts(m, text)
        assert got == expected, (schema, text, expected)
        keys = [k for k in json.loads(text) if k in declared]
        if got and keys != sorted(keys, key=declared.index):
            reordered += 1
    return reordered


def test_every_order_of_optional_and_required_members_with_additional_ones_anywhere():
    schema = {
        "type": "object",
        "properties": {"b": {"type": "integer"}, "a": {"type": "string"}, "c": {"enum": [1, 2]}},
        "required": ["a"],
    }
    members = {"a": "x", "b": 1, "c": 2}
    assert check_every_order(schema, members, {"zz": None}) > 0
    assert check_every_order(schema, {"a": "x", "b": "not an integer", "c": 3}, {"zz": None}) == 0
    check_every_order(schema, members, repeat="b")


def test_every_order_of_a_closed_object_with_property_counts():
    schema = {
        "type": "object",
        "properties": {"p": {}, "q": {}, "r": {}, "s": {}},
        "required": ["s"],
        "additionalProperties": False,
        "minProperties": 2,
        "maxProperties": 3,
    }
    assert check_every_order(schema, {"p": 1, "q": [], "r": "x", "s": {}}, {"extra": 0}) > 0


def test_additional_properties_schema_and_pattern_properties_keep_their_values():
    schema = {
        "type": "object",
        "properties": {"id": {"type": "integer"}, "name": {"type": "string"}},
        "patternProperties": {"^x-": {"type": "boolean"}},
        "additionalProperties": {"type": "null"},
    }
    check_every_order(schema, {"id": 1, "name": "n"}, {"x-a": True, "other": None})
    check_every_order(schema, {"id": 1, "name": "n"}, {"x-a": 0, "other": 1})


def test_nested_objects_and_flexible_whitespace():
    inner = {"type": "object", "properties": {"u": {"type": "integer"}, "v": {"type": "integer"}}, "required": ["u"]}
    schema = {"type": "object", "properties": {"inner": inner, "k": {"const": "K"}}, "additionalProperties": False}
    m = machine(schema, property_order="any", whitespace="flexible")
    assert accepts(m, '{ "k" : "K" , "inner" : { "v" : 2 , "u" : 1 } }')
    assert not accepts(m, '{"inner":{"v":2},"k":"K"}')  # the inner object's required "u" is missing
    assert not accepts(m, '{"k":"K","inner":{"u":1},"k":"K"}')


def test_declared_order_is_the_default_and_larger_objects_keep_it():
    small = {"type": "object", "properties": {"a": {}, "b": {}}}
    assert not accepts(machine(small), '{"b":1,"a":2}')
    assert accepts(machine(small, property_order="any"), '{"b":1,"a":2}')
    n = MAX_ANY_ORDER_PROPERTIES + 1
    large = {"type": "object", "properties": {f"p{i}": {} for i in range(n)}}
    m = machine(large, property_order="any")
    in_order = "{" + ",".join(f'"p{i}":{i}' for i in range(n)) + "}"
    assert accepts(m, in_order)
    assert not accepts(m, "{" + ",".join(f'"p{i}":{i}' for i in reversed(range(n))) + "}")


def sampled_texts(members: dict[str, object], extras: dict[str, object], count: int, seed: int):
    """``count`` random orderings of random subsets of ``members`` and ``extras``, some with a declared name read
    twice: ``(text, parsed value, repeats a declared name)``."""
    rng = random.Random(seed)
    pool = list(members.items()) + list(extras.items())
    for _ in range(count):
        chosen = rng.sample(pool, rng.randint(0, len(pool)))
        if chosen and chosen[0][0] in members and rng.random() < 0.15:
            chosen.insert(rng.randrange(len(chosen) + 1), chosen[0])
        names = [k for k, _ in chosen]
        yield "{" + ",".join(member(k, v) for k, v in chosen) + "}", dict(chosen), len(set(names)) < len(names)


def check_sampled_orders(schema, members, extras=None, count=400, **options) -> int:
    """Acceptance of :func:`sampled_texts` equals validity (and no repeated name) with lazy rules; returns how many
    were accepted."""
    grammar, _ = schema_to_grammar(schema, property_order="any", lazy=True, **options)
    m = Machine(build_pushdown(grammar))
    validator = jsonschema.validators.validator_for(schema)(schema)
    accepted = 0
    for text, value, repeated in sampled_texts(members, extras or {}, count, seed=len(members)):
        expected = validator.is_valid(value) and not repeated
        got = accepts(m, text)
        assert got == expected, (schema, text, expected)
        accepted += got
    return accepted


def test_larger_objects_read_each_set_of_members_through_a_rule_written_when_reached():
    """Past the bounds of one rule, a lazy compile names the rule of the members after each set read and writes it
    when a text first reaches that set: the compile writes only what follows the first member."""
    n = MAX_ANY_ORDER_PROPERTIES + 4
    schema = {
        "type": "object",
        "properties": {f"p{i}": {"type": "integer", "minimum": i} for i in range(n)},
        "required": ["p3", "p7"],
        "minProperties": 3,
        "maxProperties": 9,
        "additionalProperties": False,
    }
    grammar, _ = schema_to_grammar(schema, property_order="any", lazy=True)
    assert 0 < len(grammar.deferred) <= n
    members = {f"p{i}": i for i in range(n)}
    assert check_sampled_orders(schema, members) > 20
    assert check_sampled_orders(schema, {**members, "p5": 4}) > 5  # texts holding p5 are never accepted


def test_larger_objects_with_additional_members_anywhere_and_nested_objects():
    n = MAX_ANY_ORDER_PROPERTIES + 2
    inner = {"type": "object", "properties": {f"i{j}": {"type": "boolean"} for j in range(n)}, "required": ["i0"]}
    schema = {
        "type": "object",
        "properties": {**{f"p{i}": {"type": "string"} for i in range(n)}, "inner": inner},
        "patternProperties": {"^x-": {"type": "integer"}},
        "additionalProperties": {"type": "null"},
        "required": ["inner"],
    }
    members = {f"p{i}": str(i) for i in range(n)} | {"inner": {f"i{j}": j % 2 == 0 for j in range(n)}}
    assert check_sampled_orders(schema, members, {"x-a": 1, "other": None, "x-b": "no"}) > 20
    grammar, _ = schema_to_grammar(schema, property_order="any", lazy=True, whitespace="indent")
    m = Machine(build_pushdown(grammar))
    value = {"inner": {"i3": True, "i0": False}, "x-a": 2, "p4": "s", "p1": "t"}
    assert accepts(m, json.dumps(value, indent=2))
    assert not accepts(m, json.dumps({**value, "inner": {"i3": True}}, indent=2))  # the inner object lacks i0


def test_larger_objects_past_the_lazy_bounds_keep_the_declared_order():
    """Past MAX_ANY_ORDER_LATER_PROPERTIES names, or MAX_ANY_ORDER_LATER_NAME_BYTES of names (each rule written
    for a set reads the names left)."""
    many = [f"p{i}" for i in range(MAX_ANY_ORDER_LATER_PROPERTIES + 1)]
    long = ["p0", "p1"] + [f"{i:0{MAX_ANY_ORDER_LATER_NAME_BYTES // 8}d}" for i in range(10)]
    for names in (many, long, long[:9]):
        schema = {"type": "object", "properties": {name: {} for name in names}}
        grammar, _ = schema_to_grammar(schema, property_order="any", lazy=True)
        m = Machine(build_pushdown(grammar))
        assert accepts(m, '{"p0":0,"p1":1}')
        assert accepts(m, '{"p1":1,"p0":0}') == (names is not many and names is not long)


def test_dependent_required_is_read_by_the_objects_rule_in_every_order():
    """A trigger's names are checked on the set of members read, where the object's rule can track them; where it
    cannot (a name that could be an additional member, a count of properties), the object is split into one
    alternative per trigger present or absent, read in place."""
    schema = {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {}, "c": {}, "d": {}},
        "dependentRequired": {"a": ["b", "c"], "d": ["a"]},
        "additionalProperties": False,
    }
    members = {"a": 1, "b": 2, "c": 3, "d": 4}
    assert check_every_order(schema, members, {"z": 0}) > 0
    assert check_every_order({**schema, "maxProperties": 3}, members) > 0
    assert (
        check_every_order(
            {**schema, "additionalProperties": True, "dependentRequired": {"a": ["z"]}}, members, {"z": 0}
        )
        > 0
    )
    draft7 = {"$schema": "http://json-schema.org/draft-07/schema#", **schema, "dependencies": {"b": ["d"]}}
    del draft7["dependentRequired"]
    assert check_every_order(draft7, members) > 0
    n = MAX_ANY_ORDER_PROPERTIES + 4
    large = {
        "type": "object",
        "properties": {f"p{i}": {"type": "integer"} for i in range(n)},
        "dependentRequired": {"p0": ["p5", "p9"], "p3": ["p0"], "p11": ["p1"]},
    }
    assert check_sampled_orders(large, {f"p{i}": i for i in range(n)}, {"x": None}) > 20


def test_many_dependencies_are_refused_where_they_split_the_object_and_tracked_where_they_do_not():
    names = [f"p{i}" for i in range(12)]
    schema = {
        "type": "object",
        "properties": {name: {"type": "integer"} for name in names},
        "dependentRequired": {name: ["p11"] for name in names[:11]},
    }
    for options in ({}, {"property_order": "any"}):  # x0..x10 could be additional names: split
        with pytest.raises(JsonSchemaError) as err:
            schema_to_grammar({**schema, "dependentRequired": {f"x{i}": ["p0"] for i in range(11)}}, **options)
        assert err.value.keyword == "dependentRequired" and err.value.pointer == "/dependentRequired"
    assert check_sampled_orders(schema, {name: 1 for name in names}) > 20


def nested_value(rng: random.Random, depth: int, *, ordered: bool) -> dict:
    """Objects of names ``p0``..``p9`` nested ``depth`` levels, their keys in a random order or sorted."""
    keys = rng.sample(range(10), rng.randint(0, 4 if depth else 7))
    keys = sorted(keys) if ordered else keys
    return {f"p{i}": nested_value(rng, depth - 1, ordered=ordered) if depth else {} for i in keys}


def test_larger_objects_that_are_alternatives_of_a_branch_keep_the_declared_order():
    """A branch reads its alternatives in place, so that one automaton follows them all. Larger objects' rules per
    set of members would make each alternative a parse of its own to the object's end: here a dependency's 16
    alternatives per level, multiplied at each level, more than a pushdown follows. Those alternatives that have
    at most MAX_ANY_ORDER_PROPERTIES names (their triggers absent) still take any order."""
    node = {"type": "object", "properties": {f"p{i}": {"$ref": "#"} for i in range(10)}}
    schemas = {"dependencies": {f"p{i}": {"required": [f"p{i + 4}"]} for i in range(4)}}
    # triggers that could be additional names: the object is split the same way, all its alternatives large
    names = {"dependentRequired": {f"x{i}": [f"p{i}"] for i in range(4)}}
    compact = {"separators": (",", ":")}
    for split, validator in ((schemas, jsonschema.Draft7Validator), (names, jsonschema.Draft202012Validator)):
        schema = {**node, **split}
        grammar, _ = schema_to_grammar(schema, property_order="any", lazy=True)
        m = Machine(build_pushdown(grammar))
        every = {f"p{i}": {} for i in range(10)}
        assert accepts(m, json.dumps(every, **compact))
        assert not accepts(m, json.dumps(dict(reversed(every.items())), **compact))
        rng = random.Random(0)
        for _ in range(60):
            nested = nested_value(rng, 3, ordered=split is names)  # names: every alternative in the declared order
            assert accepts(m, json.dumps(nested, **compact)) == validator(schema).is_valid(nested)


def test_a_schema_with_many_objects_stays_within_its_state_budget():
    """Each object of the same shape under another name costs its states again; past the schema's budget the
    objects keep the declared order, and the compile stays small."""
    obj = {"type": "object", "properties": {f"name_{i}": {"type": "integer"} for i in range(6)}}
    schema = {"type": "object", "properties": {f"o{j}": {**obj, "title": str(j)} for j in range(40)}}
    grammar, _ = schema_to_grammar(schema, property_order="any")
    pushdown = build_pushdown(grammar)
    assert sum(pushdown.rule(i).num_states for i in range(len(pushdown.names))) < 60_000
    m = Machine(pushdown)
    reordered = '{"name_1":1,"name_0":0}'
    answers = [accepts(m, f'{{"o{j}":{reordered}}}') for j in range(40)]
    assert answers[0] and not answers[-1]


def test_bad_property_order_is_refused_by_name():
    with pytest.raises(ArgumentError) as err:
        schema_to_grammar({"type": "object"}, property_order="sorted")
    assert err.value.parameter == "property_order"
    with pytest.raises(constrain.StructureError):
        constrain.compile(r"\d+", constrain.Vocabulary.from_token_bytes([b"1"], eos_ids=[1]), property_order="any")


def test_compile_and_pydantic_take_the_option(gemma_vocab):
    from pydantic import BaseModel

    class Point(BaseModel):
        x: int
        y: int

    schema = {"type": "object", "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}}}
    declared = constrain.compile(schema, gemma_vocab)
    any_order = constrain.compile(schema, gemma_vocab, property_order="any")
    assert declared is not any_order  # the option is part of the compile cache's key
    from constrain.testing.walks import accepts_text

    assert accepts_text(any_order, '{"y":2,"x":1}') and not accepts_text(declared, '{"y":2,"x":1}')
    model = constrain.compile(Point, gemma_vocab, property_order="any")
    assert accepts_text(model, '{"y":2,"x":1}') and not accepts_text(model, '{"y":2}')
    unsatisfiable = {"type": "object", "required": ["a"], "maxProperties": 0}
    with pytest.raises(JsonSchemaError):
        compile_json_schema(unsatisfiable, gemma_vocab, property_order="any")


# -- MaskBench ---------------------------------------------------------------------------------------------------

#: Schemas of the dev set whose valid instances come in another key order than the declared one, checked here.
MASKBENCH_SAMPLE = 40


def _reordered_entries() -> list[dict]:
    """The dev-set schemas with a valid instance whose keys are not in the declared order, the first
    :data:`MASKBENCH_SAMPLE` by a hash of their name."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benchmarks"))
    import gzip

    from maskbench_keyorder import canonical_order

    found = []
    with gzip.open(DATA, "rt") as f:
        for line in f:
            entry = json.loads(line)
            for test in entry["tests"]:
                if test["valid"]:
                    try:
                        declared = canonical_order(entry["schema"], test["data"])
                    except Exception:
                        continue
                    if json.dumps(declared) != json.dumps(test["data"]):
                        found.append(entry)
                        break
    found.sort(key=lambda e: hashlib.sha256(e["name"].encode()).hexdigest())
    return found[:MASKBENCH_SAMPLE]


@pytest.mark.slow
@pytest.mark.skipif(not DATA.is_file(), reason=f"MaskBench data not found at {DATA}")
def test_maskbench_reordered_instances_only_grow_the_language():
    sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benchmarks"))
    from maskbench_keyorder import canonical_order

    compact = {"separators": (",", ":"), "ensure_ascii": False}
    compiled = own_order_gained = 0
    for entry in _reordered_entries():
        schema = entry["schema"]
        try:
            declared_m = machine(schema)
        except JsonSchemaError:
            continue
        any_m = machine(schema, property_order="any")
        compiled += 1
        for test in entry["tests"]:
            own = json.dumps(test["data"], **compact)
            if not test["valid"]:
                assert not accepts(any_m, own), (entry["name"], own)
                continue
            in_declared = json.dumps(canonical_order(schema, test["data"]), **compact)
            for text in (own, in_declared):
                if accepts(declared_m, text):
                    assert accepts(any_m, text), (entry["name"], text)
            if accepts(any_m, own) and not accepts(declared_m, own):
                own_order_gained += 1
    assert compiled >= MASKBENCH_SAMPLE // 2
    assert own_order_gained >= compiled // 3
