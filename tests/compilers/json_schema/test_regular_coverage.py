"""What is regular and used to be refused: ``uniqueItems`` over finite item domains, lookahead in ``pattern``,
``not`` over ``patternProperties`` / ``propertyNames`` / ``additionalProperties`` (and ``oneOf`` and the dependent
keywords), ``oneOf`` whose branches overlap, and length bounds together with a pattern.

``jsonschema`` is the oracle: for generated schemas of each kind, the compiled structure accepts a serialised
instance exactly when ``jsonschema`` validates it. Objects are tried in every key order (the compiler writes the
declared properties in the schema's order, the others after them), arrays and strings as they are. The checks run
on the grammar's own pushdown machine (no vocabulary), so they are fast.
"""

from __future__ import annotations

import itertools
import json
import random
import re

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from constrain.compilers.json_schema import schema_to_grammar
from constrain.errors import JsonSchemaError
from constrain.grammar.rules import build_pushdown
from constrain.runtime.pushdown import Machine

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def compiled(schema) -> Machine | None:
    """The schema's machine, or None when it is refused as unsatisfiable (then nothing may be valid)."""
    try:
        grammar, _ = schema_to_grammar(schema)
    except JsonSchemaError as exc:
        if "unsatisfiable" in exc.reason:
            return None
        raise
    return Machine(build_pushdown(grammar))


def accepts(m: Machine | None, text: str) -> bool:
    if m is None:
        return False
    configs = m.read(m.start, text.encode())
    return bool(configs) and m.can_end(configs)


def dumps(value) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def orders(value) -> list[str]:
    """``value`` serialised with its top-level keys in every order."""
    if not isinstance(value, dict):
        return [dumps(value)]
    return [dumps(dict(p)) for p in itertools.permutations(value.items())]


def check(schema, instances) -> None:
    m = compiled(schema)
    cls = jsonschema.validators.validator_for(schema)
    validator = cls(schema, format_checker=cls.FORMAT_CHECKER)  # formats are asserted here
    for value in instances:
        want = validator.is_valid(value)
        got = any(accepts(m, text) for text in orders(value))
        assert got == want, (schema, value, want)


# -- uniqueItems over finite item domains ------------------------------------------------------------------------

_scalars = st.sampled_from([True, False, None, 0, 1, 2, 3, -1, "a", "b"])
_int_range = st.tuples(st.integers(-2, 3), st.integers(0, 5)).map(
    lambda p: {"type": "integer", "minimum": p[0], "maximum": p[0] + p[1]}
)
_finite = st.one_of(
    st.just({"type": "boolean"}),
    st.just({"type": ["boolean", "null"]}),
    _int_range,
    _int_range.map(lambda s: {**s, "not": {"const": s["minimum"]}}),
    _int_range.map(lambda s: {**s, "exclusiveMaximum": s.pop("maximum")}),
    st.lists(_scalars, min_size=1, max_size=5).map(lambda v: {"enum": v}),
    _scalars.map(lambda v: {"const": v}),
)
_finite_items = st.one_of(_finite, st.tuples(_finite, _finite).map(lambda p: {"anyOf": list(p)}))


@st.composite
def unique_schemas(draw):
    schema = {"type": "array", "uniqueItems": True}
    if draw(st.booleans()):
        schema["prefixItems"] = draw(st.lists(_finite_items, min_size=1, max_size=2))
        schema["items"] = draw(st.one_of(st.just(False), _finite_items))
    else:
        schema["items"] = draw(_finite_items)
    if draw(st.booleans()):
        schema["minItems"] = draw(st.integers(0, 3))
    if draw(st.booleans()):
        schema["maxItems"] = draw(st.integers(1, 4))
    if draw(st.integers(0, 2)) == 0 and "prefixItems" not in schema:  # contains beside prefix items: refused
        schema["contains"] = draw(_finite)
        if draw(st.booleans()):
            schema["minContains"] = draw(st.integers(0, 2))
        if draw(st.booleans()):
            schema["maxContains"] = draw(st.integers(0, 2))
    return schema


_pool = [True, False, None, -1, 0, 1, 2, 3, 4, 5, "a", "b", 1.5, [1], {}]


@SETTINGS
@given(schema=unique_schemas(), seed=st.integers(0, 2**32))
def test_unique_items_over_finite_domains_is_exact(schema, seed):
    rng = random.Random(seed)
    instances = [[], [True, False], [1, 1], [0, 1, 2], ["a", "b", "a"]]
    instances += [[rng.choice(_pool) for _ in range(rng.randint(0, 5))] for _ in range(120)]
    check(schema, instances)


def test_unique_items_refused_where_the_domain_is_infinite_or_its_sets_too_many():
    for schema in (
        {"type": "array", "items": {"type": "string"}, "uniqueItems": True},
        {"type": "array", "prefixItems": [{"type": "boolean"}], "uniqueItems": True},  # then any item
        {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 15}, "uniqueItems": True},
    ):
        with pytest.raises(JsonSchemaError) as info:
            schema_to_grammar(schema)
        assert info.value.keyword == "uniqueItems" and info.value.pointer == "/uniqueItems"
    # bounded by maxItems, the same domain needs few sets
    check(
        {
            "type": "array",
            "items": {"type": "integer", "minimum": 0, "maximum": 15},
            "uniqueItems": True,
            "maxItems": 2,
        },
        [[], [0], [0, 15], [3, 3], [1, 2, 3], [16]],
    )


# -- lookahead in pattern ----------------------------------------------------------------------------------------

_piece = st.sampled_from(["a", "b", "ab", ".", "[ab]", "[^a]", "x*", "a+", "(?:a|bx)", ".*"])


@st.composite
def lookahead_patterns(draw):
    def body():
        return "".join(draw(st.lists(_piece, min_size=1, max_size=3)))

    out = ""
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["plain", "=", "!", "tempered"]))
        if kind == "plain":
            out += body()
        elif kind == "tempered":
            out += f"(?:(?!{body()}).)*"
        else:
            out += f"(?{kind}{body()})"
    if draw(st.booleans()):
        out = "^" + out
    if draw(st.booleans()):
        out += "$"
    return out


@SETTINGS
@given(pattern=lookahead_patterns(), seed=st.integers(0, 2**32))
def test_lookahead_patterns_are_exact(pattern, seed):
    rng = random.Random(seed)
    texts = ["", "a", "ab", "ba", "xab", "abx"]
    texts += ["".join(rng.choice("abx é") for _ in range(rng.randint(0, 6))) for _ in range(150)]
    check({"type": "string", "pattern": pattern}, texts)  # no newline: Python's $ also matches before one
    check({"type": "object", "patternProperties": {pattern: {"type": "integer"}}}, [{t: 1} for t in texts[:30]])


def test_lookahead_of_real_schemas():
    check(
        {"type": "string", "pattern": "^(?!foo|bar).*"},
        ["", "foo", "foobar", "xfoo", "fo", "bar1", "barn", "baz"],
    )
    check({"type": "string", "pattern": "(?=.*\\d)"}, ["", "a", "a1", "1", "x\n1", "1\nx"])
    check(
        {"type": "string", "pattern": "^(?=.*[a-z])(?=.*[0-9]).{8,}$", "maxLength": 12},
        ["abcdefg1", "abcdefgh", "12345678", "a1", "abcdefghijk1", "abcdefghijkl1"],
    )
    check(
        {"type": "object", "propertyNames": {"pattern": "^(?!x-)"}},
        [{}, {"a": 1}, {"x-a": 1}, {"a": 1, "x-": 2}, {"xa": 1}],
    )


def test_hostile_lookahead_is_refused_with_the_keyword_and_pointer():
    schema = {"properties": {"p": {"type": "string", "pattern": "^((?!a.{14}b).)*$"}}}
    with pytest.raises(JsonSchemaError) as info:
        schema_to_grammar(schema, time_limit=5)
    assert info.value.keyword == "pattern" and info.value.pointer == "/properties/p/pattern"


# -- not over patternProperties, propertyNames, additionalProperties ---------------------------------------------

_keys = ["a", "b", "ab", "ba", "c"]
_values = st.sampled_from([{"type": "integer"}, {"type": "string"}, {"minimum": 2}, {"const": 1}, False, True])
_key_patterns = st.sampled_from(["^a", "a", "b$", "^c$", "^(?!a)"])


@st.composite
def negated_object_keywords(draw):
    kind = draw(st.sampled_from(["patternProperties", "propertyNames", "additionalProperties", "oneOf", "dep"]))
    if kind == "patternProperties":
        return {"patternProperties": draw(st.dictionaries(_key_patterns, _values, min_size=1, max_size=2))}
    if kind == "propertyNames":
        return {
            "propertyNames": draw(
                st.sampled_from([{"maxLength": 1}, {"pattern": "^a"}, {"enum": ["a", "b"]}, {"const": "c"}, False])
            )
        }
    if kind == "additionalProperties":
        out = {"additionalProperties": draw(_values)}
        if draw(st.booleans()):
            out["properties"] = {k: True for k in draw(st.lists(st.sampled_from(_keys), max_size=2))}
        if draw(st.booleans()):
            out["patternProperties"] = {draw(_key_patterns): True}
        return out
    if kind == "oneOf":
        return {
            "oneOf": [
                {"required": [k]} for k in draw(st.lists(st.sampled_from(_keys), min_size=2, max_size=3, unique=True))
            ]
        }
    return {
        "dependentRequired": {
            draw(st.sampled_from(_keys)): draw(st.lists(st.sampled_from(_keys), max_size=2, unique=True))
        }
    }


@st.composite
def object_schemas_with_not(draw):
    schema: dict = {"type": "object"}
    if draw(st.booleans()):
        schema["properties"] = {k: draw(_values) for k in draw(st.lists(st.sampled_from(_keys), max_size=2))}
    if draw(st.booleans()) and schema.get("properties"):
        schema["required"] = [draw(st.sampled_from(list(schema["properties"])))]
    if draw(st.integers(0, 3)) == 0:
        schema["additionalProperties"] = draw(_values)
    if draw(st.integers(0, 3)) == 0:
        schema["maxProperties"] = draw(st.integers(1, 3))
    negated = [draw(negated_object_keywords()) for _ in range(draw(st.integers(1, 2)))]
    schema["not"] = negated[0] if len(negated) == 1 else {draw(st.sampled_from(["anyOf", "allOf"])): negated}
    return schema


def _objects(rng: random.Random, count: int) -> list[dict]:
    values = [1, 3, "x", None, True]
    return [
        {k: rng.choice(values) for k in rng.sample(_keys, rng.randint(0, 3))} for _ in range(count)
    ]  # fmt: skip


@SETTINGS
@given(schema=object_schemas_with_not(), seed=st.integers(0, 2**32))
def test_not_over_object_keywords_is_exact(schema, seed):
    check(schema, [{}, {"a": 1}, {"c": "x"}, 1, "s"] + _objects(random.Random(seed), 100))


# -- oneOf whose branches overlap --------------------------------------------------------------------------------

_branches = st.one_of(
    st.sampled_from(_keys).map(lambda k: {"required": [k]}),
    st.tuples(st.sampled_from(_keys), _values).map(lambda p: {"properties": {p[0]: p[1]}}),
    st.sampled_from([{"minProperties": 1}, {"maxProperties": 1}]),
    st.sampled_from(_keys).map(lambda k: {"not": {"required": [k]}}),
    st.tuples(_key_patterns, _values).map(lambda p: {"patternProperties": {p[0]: p[1]}}),
    st.just({"type": "integer"}),
)


@SETTINGS
@given(branches=st.lists(_branches, min_size=2, max_size=4), seed=st.integers(0, 2**32))
def test_overlapping_one_of_is_exact(branches, seed):
    schema = {"oneOf": branches}
    try:
        m = compiled(schema)
    except JsonSchemaError as exc:  # only refusals that say so: too many combinations, counts of repeated keys
        assert (exc.keyword == "oneOf" and "exclusive" in exc.reason) or "repeating" in exc.reason, exc
        return
    validator = jsonschema.Draft202012Validator(schema)
    for value in [{}, 1, "s", None] + _objects(random.Random(seed), 80):
        assert any(accepts(m, t) for t in orders(value)) == validator.is_valid(value), (schema, value)


def test_one_of_of_many_branches_with_a_discriminator_that_not_every_object_has():
    branches = [
        {"properties": {"assert": {"enum": [name]}, "message": {"type": "string"}, extra: {"type": "integer"}}}
        for name, extra in [("A", "x"), ("B", "y"), ("C", "x"), ("D", "z"), ("E", "y"), ("F", "w")]
    ]
    schema = {"type": "array", "items": {"oneOf": branches}}
    check(
        schema,
        [[], [{}], [{"assert": "A"}], [{"assert": "A", "x": 1}], [{"assert": "A", "x": "s"}], [{"assert": "G"}],
         [{"x": 1}], [{"assert": "B", "message": "m", "y": 2}, {"assert": "F"}]],
    )  # fmt: skip


# -- lengths together with a pattern or format -------------------------------------------------------------------


@pytest.mark.parametrize(
    "schema,texts",
    [
        (
            {"type": "string", "format": "email", "maxLength": 1024},
            ["a@b.co", "a" * 1010 + "@b.co", "a" * 1020 + "@b.co", "x", "a@b"],
        ),
        (
            {"type": "string", "pattern": "^(?:\\S+\\s+){0,9}\\S+$", "maxLength": 60},
            ["a", "a b", "a " * 9 + "b", "a " * 10 + "b", "x" * 60, "x" * 61, " a", "", "é b"],
        ),
        (
            {"type": "string", "format": "email", "maxLength": 255, "minLength": 10},
            ["a@b.co", "abcdef@b.co", "a" * 240 + "@b.co", "a" * 251 + "@b.co", '"a b"@c.de'],
        ),
        (
            {
                "type": "string",
                "pattern": "^{0}{{1,32}}(\\.{0}{{1,32}}){{1,3}}$".format('[^\\.\\s\\\\/:\\*\\?"<>\\|\\x01-\\x1f]'),
                "maxLength": 128,
            },
            ["a.b", "a" * 32 + ".b", "a" * 33 + ".b", ".".join(["a" * 32] * 4), ".".join(["a" * 31] * 4), "a"],
        ),
        (
            {"type": "string", "pattern": "([0-9a-zA-Z]+)?", "maxLength": 4096},
            ["", "abc", "a" * 4096, "a" * 4097, "-" * 4096, "-" * 4097],
        ),
    ],
)
def test_length_bounds_with_a_pattern_that_used_to_need_too_large_an_automaton(schema, texts):
    check(schema, texts)


@pytest.mark.parametrize(
    "pattern,bound",
    [("^(?:\\S+\\s+){0,49}\\S+$", 500), ("^data:image/(png|svg\\+xml);base64,[0-9a-zA-Z+/=]*$", 32767)],
)
def test_length_bounds_whose_exact_automaton_is_too_large_are_refused_with_the_keyword(pattern, bound):
    with pytest.raises(JsonSchemaError) as info:
        schema_to_grammar({"properties": {"s": {"type": "string", "pattern": pattern, "maxLength": bound}}})
    assert info.value.keyword == "maxLength" and info.value.pointer == "/properties/s/maxLength"


@SETTINGS
@given(
    pattern=st.sampled_from(["^[a-c]+@[a-c]+\\.[a-c]{2,3}$", "^(?:[ab]+ )*[ab]+$", "b", "^a*(?:b|cc)$", "^(?!a)"]),
    lo=st.integers(0, 40),
    width=st.integers(0, 300),
    seed=st.integers(0, 2**32),
)
def test_length_bounds_with_a_pattern_are_exact(pattern, lo, width, seed):
    rng = random.Random(seed)
    texts = ["".join(rng.choice("abc @.") for _ in range(rng.choice([lo - 1, lo, lo + width, lo + width + 1, 5])))
             for _ in range(60)]  # fmt: skip
    check({"type": "string", "pattern": pattern, "minLength": lo, "maxLength": lo + width}, texts)


def test_the_new_kinds_keep_the_compile_time_limit():
    """Hostile versions of each new kind compile within the time limit or are refused with the keyword."""
    hostile = [
        {"type": "array", "items": {"enum": list(range(16))}, "uniqueItems": True},
        {"not": {"anyOf": [{"patternProperties": {f"^{c}": {"type": "integer"}}} for c in "abcdef"]}},
        {"oneOf": [{"required": [k]} for k in "abcdefghijklmnopqrstuvwxyz"] * 2},
        {"type": "string", "pattern": "^(?=(?:.*a){20})(?!(?:.*b){20}).*$", "maxLength": 100000},
    ]
    for schema in hostile:
        try:
            schema_to_grammar(schema, time_limit=5)
        except JsonSchemaError as exc:
            assert exc.keyword is not None or "time_limit" in exc.reason, exc
            assert re.search(r"refused|unsatisfiable|time_limit|too large|too many", exc.reason), exc
