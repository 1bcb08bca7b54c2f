"""Hostile schemas: each compiles within the time limit or is refused with a typed error naming the place;
nothing runs unbounded. (Speed itself is measured in benchmarks/, not here: the bounds are generous.)"""

from __future__ import annotations

import time

import pytest

from constrain.compilers.json_schema import DEFAULT_TIME_LIMIT, compile_json_schema, schema_to_grammar
from constrain.errors import JsonSchemaError


def nested(depth: int) -> dict:
    schema: dict = {"type": "integer"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"a": schema}, "required": ["a"]}
    return schema


HOSTILE = {
    "huge enum": {"enum": [f"value-{i}" for i in range(50_000)]},
    "deep nesting": nested(400),
    "repetition of repetitions": {"type": "string", "pattern": "^(a{1,100}){1,100}$"},
    "long pattern strings": {"type": "string", "pattern": "^[a-z]{2,8}@[a-z]+\\.(com|org)$", "maxLength": 2000},
    "many patterned properties": {
        "type": "object",
        "properties": {
            f"p{i}": {"type": "string", "pattern": f"^x{{{i}}}[0-9]+$", "maxLength": 60} for i in range(400)
        },
    },
    "exponential oneOf": {
        "oneOf": [{"type": "object", "properties": {f"k{i}": {"type": "integer"}}} for i in range(24)]
    },
    "allOf of ranges": {"allOf": [{"type": "integer", "multipleOf": m} for m in (7, 11, 13, 17, 19, 23, 29)]},
    "wide number range": {"type": "number", "minimum": -1e300, "exclusiveMaximum": 1e300, "multipleOf": 0.001},
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_schemas_compile_in_time_or_are_refused_with_a_pointer(name, gemma_vocab):
    started = time.monotonic()
    try:
        compile_json_schema(HOSTILE[name], gemma_vocab)
    except JsonSchemaError as exc:
        assert exc.pointer == "" or exc.pointer.startswith("/"), exc
    except Exception as exc:  # noqa: BLE001 - the point: no other kind of failure
        pytest.fail(f"{name}: {type(exc).__name__}: {exc}")
    # A guard against a hang, not a speed test: the limit is checked between steps of any size, and this
    # machine may be loaded.
    assert time.monotonic() - started < 12 * DEFAULT_TIME_LIMIT, name


def test_the_time_limit_refuses_with_a_pointer_and_can_be_lifted():
    schema = {
        "type": "object",
        "properties": {f"p{i}": {"type": "string", "pattern": f"^[a-z]{{2,{5 + i % 7}}}@x\\.org$"} for i in range(200)},
    }
    with pytest.raises(JsonSchemaError, match="time_limit") as info:
        schema_to_grammar(schema, time_limit=0.0)
    assert info.value.pointer == "" or info.value.pointer.startswith("/")
    grammar, _ = schema_to_grammar({"type": "integer"}, time_limit=None)
    assert grammar.rules


@pytest.mark.parametrize(
    "schema",
    [
        {"enum": ["a", "bb", 3], "pattern": "^b"},  # a pattern: the values go to jsonschema
        {"type": "object", "properties": {"a": {}}, "propertyNames": {"minLength": 1}},
        {"type": "string", "pattern": "^[a-z]+$"},
    ],
    ids=["enum values", "property names", "pattern text"],
)
def test_the_time_limit_running_out_inside_a_guarded_call_is_reported_as_the_time_limit(schema, monkeypatch):
    """The deadline passing while jsonschema evaluates enum values or property names, or while a pattern's own
    text is compared with its automaton, used to come out as "cannot evaluate ..." or a silent fallback: the
    handlers there caught every Exception (or every StructureError, which CompileTimeout is). A pattern's search
    automaton is built where regex errors become refusals: the time limit must not become one."""
    from constrain.automata.limits import deadline
    from constrain.compilers.json_schema import compiler, document, strings

    def expired(call):
        def late(*args, **kwargs):
            with deadline(0.0):  # CPU time is past 0 s: the limit has run out
                return call(*args, **kwargs)

        return late

    monkeypatch.setattr(document._Document, "is_valid", expired(document._Document.is_valid))
    monkeypatch.setattr(compiler._Compiler, "search", expired(compiler._Compiler.search))
    monkeypatch.setattr(compiler._Compiler, "supported", expired(compiler._Compiler.supported))
    strings._searched.cache_clear()  # built by an earlier test, it would be found without a look at the clock
    strings._search_text.cache_clear()
    with pytest.raises(JsonSchemaError, match=r"takes longer than time_limit=60 s"):
        schema_to_grammar(schema, time_limit=60)


# -- constructs that used to run past the time limit: compiled in time, and exactly ---------------------------


def _accepts(m, text: str) -> bool:
    configs = m.read(m.start, text.encode())
    return bool(configs) and m.can_end(configs)


def _check_against_jsonschema(schema: dict, instances: list) -> None:
    import json

    import jsonschema

    from constrain.grammar.rules import build_pushdown
    from constrain.runtime.pushdown import Machine

    started = time.process_time()
    grammar, _ = schema_to_grammar(schema)
    assert time.process_time() - started < DEFAULT_TIME_LIMIT / 2
    m = Machine(build_pushdown(grammar))
    validator = jsonschema.validators.validator_for(schema)(schema)
    for value in instances:
        text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
        assert _accepts(m, text) == validator.is_valid(value), (value, validator.is_valid(value))


def test_a_pattern_with_a_long_length_bound_is_exact():
    """Github_medium---o17563: the pattern's automaton times 200 characters took seconds as code-point blocks
    (5 s on a loaded machine); it is now one byte automaton counted at the byte level."""
    schema = {"type": "string", "pattern": ".+[@].+[.]___", "minLength": 10, "maxLength": 200}
    tail = "a@b.___"
    _check_against_jsonschema(
        schema,
        [
            "xx" + tail, "xxx" + tail, "x" * 193 + tail, "x" * 194 + tail, "é" * 193 + tail, "😀" * 194 + tail,
            '"\\\n' * 64 + "\u0001" + tail, '"\\\n' * 65 + tail, "\n" * 10 + tail, "\n" * 9 + "a" + tail,
            "x" * 20 + "a@b.__", "@" * 30, "x@" + "\n" + ".___" * 3, 3,
        ],
    )  # fmt: skip


def test_a_pattern_with_only_a_minimum_length_is_exact():
    """A pattern with minLength and no maxLength was refused whenever the product passed 400 states; the counter
    now saturates at the bound."""
    schema = {"type": "string", "pattern": "^[a-z\\n]+[0-9]$", "minLength": 300}
    _check_against_jsonschema(
        schema,
        ["a" * 298 + "1", "a" * 299 + "1", "\n" * 299 + "1", "a" * 1000 + "9", "é" * 299 + "1", "a" * 300, ""],
    )


def test_an_unsatisfiable_pattern_and_length_names_the_bound():
    with pytest.raises(JsonSchemaError) as info:
        schema_to_grammar({"type": "string", "pattern": "^a{5}$", "maxLength": 3})
    assert info.value.pointer == "/maxLength"


def test_a_repeated_class_of_many_code_points_sorts_its_ranges_once(monkeypatch):
    """Github_hard---o79409: a class spelled with ~14,000 code points repeated {1,200} sorted them once per
    copy, most of the time limit."""
    from constrain.automata import regex

    original = regex.code_point_ranges
    calls = []

    def counted(code_points):
        calls.append(1)
        return original(code_points)

    monkeypatch.setattr(regex, "code_point_ranges", counted)
    dfa = regex.regex_to_dfa.__wrapped__("[\u00c0-\u024f\u4e00-\u9fd5a-z]{1,120}")
    assert len(calls) == 1
    data = ("é" * 60 + "中" * 60).encode()
    state = 0
    for byte in data:
        state = dfa.trans[state, byte]
    assert dfa.accepting[state] and dfa.trans[state, ord("a")] == -1


def test_enum_values_in_a_bundled_schema_are_validated_once_per_subschema_text(monkeypatch):
    """JsonSchemaStore---cityjson.min: a bundle inlines its definitions, so one subschema text recurs at hundreds
    of pointers, and each enum value was validated at each through a ``$ref`` walk of the whole document. A part
    without references is now validated directly, once per text; one with a reference still goes through it."""
    from constrain.compilers.json_schema import document

    evaluated = []
    original = document._Document.validator

    def counting(self):
        validator = original(self)

        class Counting:
            def evolve(self, schema):
                inner = validator.evolve(schema=schema)

                class Checked:
                    def is_valid(self, value):
                        evaluated.append(value)
                        return inner.is_valid(value)

                return Checked()

        return Counting()

    monkeypatch.setattr(document._Document, "validator", counting)
    member = {"type": "string", "enum": ["a", "bb", "ccc", "dddd"], "pattern": "^.{2,}$"}
    schema = {
        "type": "object",
        "properties": {f"p{i}": dict(member) for i in range(30)},
        "$defs": {"short": {"pattern": "^.{0,3}$"}},
    }
    schema["properties"]["r"] = {"enum": ["a", "bb", "ccc", "dddd"], "$ref": "#/$defs/short"}
    values = [{"p0": v, "p29": w, "r": x} for v in ("a", "bb", "dddd") for w in ("ccc", "e") for x in ("a", "dddd")]
    _check_against_jsonschema(schema, values)
    # 4 values for the 30 equal texts together (120 before); for "r", 4 through its own node (it holds a $ref, so
    # goes through the document) and 3 against /$defs/short (what the first check let through)
    assert len(evaluated) == 4 + 4 + 3


def test_compiling_numba_kernels_is_not_charged_to_the_time_limit():
    """The first compile on a fresh machine JIT-compiles the kernels (seconds); that is no schema's cost, so the
    clock time limits read leaves it out (a first compile used to be refused past ``time_limit``)."""
    from numba import njit

    from constrain.automata.limits import CompileTimeout, check_deadline, compile_clock, deadline

    @njit  # not cached: compiled on its first call, inside the limit below
    def fresh(x):
        return x * 2 + 1

    limit = 0.01
    with deadline(compile_clock() + limit):
        started = time.process_time()
        assert fresh(20) == 41
        assert time.process_time() - started > limit  # the compile took longer than the limit...
        check_deadline()  # ...and is not charged
        with pytest.raises(CompileTimeout):  # work that is the schema's own still is
            while True:
                check_deadline()


def test_a_time_limit_that_runs_out_is_noticed_within_a_millisecond_or_so():
    """The CPU clock is read at most once a millisecond of wall-clock time (each read is a system call); a limit
    that has run out is still noticed at the next look, and one already past at the first."""
    from constrain.automata.limits import CompileTimeout, check_deadline, compile_clock, deadline

    with deadline(compile_clock() - 1.0), pytest.raises(CompileTimeout):
        check_deadline()
    at = compile_clock() + 0.02
    with deadline(at), pytest.raises(CompileTimeout):
        while True:
            check_deadline()
    assert compile_clock() - at < 0.01
