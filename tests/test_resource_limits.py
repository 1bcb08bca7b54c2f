"""Hostile input is compiled or refused with a typed error within twice its time limit (wall-clock), and what the
caches keep stays bounded in bytes (peak RSS of a fresh process, measured in a subprocess)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time

import pytest

import constrain
from constrain.compilers.choices import compile_choices
from constrain.compilers.gbnf import compile_gbnf
from constrain.compilers.json_schema import compile_json_schema, schema_to_grammar
from constrain.compilers.lark import compile_lark
from constrain.compilers.pydantic import compile_pydantic
from constrain.compilers.regex import compile_regex
from constrain.errors import AutomatonTooLarge, CompileTimeout, JsonSchemaError, StructureError
from constrain.grammar import Grammar, Literal, Repeat
from constrain.grammar.rules import build_pushdown
from constrain.testing import byte_vocabulary

LIMIT = 1.0


@pytest.fixture(scope="module")
def vocab():
    vocab = byte_vocabulary()
    constrain.compile("a", vocab, cache=False)  # kernels loaded: no first-use cost in the timed calls
    return vocab


def within_twice_the_limit(compile_it) -> StructureError | None:
    """Run ``compile_it``; the typed error it raised, or None when it compiled. Fails past ``2 * LIMIT`` wall
    seconds, or on any error that is not a StructureError."""
    started = time.perf_counter()
    try:
        compile_it()
        error = None
    except StructureError as exc:
        error = exc
    wall = time.perf_counter() - started
    assert wall < 2 * LIMIT, f"{wall:.2f} s: {error!r}"
    return error


# -- each compiler honours time_limit ---------------------------------------------------------------------------

NESTED_COUNTS = "((a{1,50}){1,50}){1,50}"  # ran past 150 s with memory growing


@pytest.mark.parametrize(
    "compile_it",
    [
        lambda v: compile_regex(NESTED_COUNTS, v, time_limit=LIMIT),
        lambda v: compile_choices([NESTED_COUNTS.replace("a", str(i)) for i in range(200_000)], v, time_limit=LIMIT),
        lambda v: compile_lark(f"start: A\nA: /{NESTED_COUNTS}/\n", v, time_limit=LIMIT),
        lambda v: compile_gbnf('root ::= ((("a"){1,50}){1,50}){1,50}', v, time_limit=LIMIT),
        lambda v: constrain.compile(NESTED_COUNTS, v, time_limit=LIMIT, cache=False),
    ],
    ids=["compile_regex", "compile_choices", "compile_lark", "compile_gbnf", "constrain.compile"],
)
def test_each_compiler_called_directly_is_refused_within_twice_its_time_limit(vocab, compile_it):
    error = within_twice_the_limit(lambda: compile_it(vocab))
    assert isinstance(error, (CompileTimeout, AutomatonTooLarge)) or "time limit" in str(error), repr(error)


@pytest.mark.parametrize(
    "compile_it",
    [
        lambda v, limit: compile_regex("[a-z]{1,40}@[a-z]{1,40}", v, time_limit=limit),
        lambda v, limit: compile_choices(["yes", "no"], v, time_limit=limit),
        lambda v, limit: compile_lark('start: "a" B\nB: /[0-9]+/\n', v, time_limit=limit),
        lambda v, limit: compile_gbnf('root ::= "a" [0-9]+', v, time_limit=limit),
        lambda v, limit: compile_json_schema({"type": "array", "items": {"type": "integer"}}, v, time_limit=limit),
        lambda v, limit: compile_pydantic(list[int], v, time_limit=limit),
    ],
    ids=["regex", "choices", "lark", "gbnf", "json_schema", "pydantic"],
)
def test_time_limit_zero_refuses_and_none_lifts_it(vocab, compile_it):
    """The keyword means the same for every compiler: CPU seconds from the call, None for no limit."""
    from constrain.automata.regex import regex_to_dfa
    from constrain.grammar import rules

    # what a cache holds costs no time to compile again, so the caches must not answer
    regex_to_dfa.cache_clear()
    rules.terminal_dfa.cache_clear()
    rules._RULE_DFAS.clear()
    with pytest.raises(StructureError, match="time.limit"):
        compile_it(vocab, 0.0)
    compile_it(vocab, None)


def test_a_compiler_inside_another_keeps_the_callers_limit():
    """compile_choices compiles a regex under its own limit; the regex's own (later) limit does not extend it."""
    from constrain.automata.limits import check_deadline, time_limited

    with pytest.raises(CompileTimeout, match="the outer"), time_limited(0.0, "the outer"), time_limited(60.0, "inner"):
        check_deadline()


# -- JSON Schema: string lengths and objects --------------------------------------------------------------------


@pytest.mark.parametrize("bound", [10**18, 2**31 - 1])
def test_a_max_length_no_automaton_can_count_is_refused_at_its_pointer_at_once(vocab, bound):
    """maxLength 10**18 never finished (a loop per block of 256 characters); 2**31 - 1 took 5.4 s to run out
    of time. A state per block would pass MAX_DFA_STATES, so the bound is refused before anything is built."""
    schema = {"type": "string", "maxLength": bound}
    error = within_twice_the_limit(lambda: compile_json_schema(schema, vocab, time_limit=LIMIT))
    assert isinstance(error, JsonSchemaError) and (error.pointer, error.keyword) == ("/maxLength", "maxLength")
    grammar, relaxed = schema_to_grammar(schema, strict=False)
    assert relaxed and "maxLength" in relaxed[0] and "ignored" in relaxed[0]


def test_a_length_bound_of_millions_still_compiles(vocab):
    structure = compile_json_schema({"type": "string", "minLength": 3, "maxLength": 3_000_000}, vocab)
    assert structure.matcher().accepts(ord('"'))


@pytest.mark.parametrize("count", [40_000, 100_000])
def test_tens_of_thousands_of_required_properties_finish_within_twice_the_limit(vocab, count):
    """40,000 took 16 s under a 5 s limit (a membership test in a list per name), 100,000 over 150 s."""
    properties = {f"p{i}": {"type": "integer"} for i in range(count)}
    schema = {"type": "object", "properties": properties, "required": list(properties)}
    error = within_twice_the_limit(lambda: compile_json_schema(schema, vocab, time_limit=LIMIT))
    assert error is None or isinstance(error, JsonSchemaError), repr(error)


def test_an_object_of_thousands_of_properties_is_read_without_nesting_past_the_stack_bound(vocab):
    """Past 4,096 members, the chain of rules of 16 members each nested deeper than MAX_STACK_DEPTH calls; the
    members are now a tree of rules of 16."""
    count = 5_000
    properties = {f"p{i}": {"type": "integer"} for i in range(count)}
    schema = {"type": "object", "properties": properties, "required": list(properties)[::2]}
    structure = compile_json_schema(schema, vocab, time_limit=None)
    value = {f"p{i}": i for i in range(count) if i % 2 == 0 or i % 7 == 0}
    text = json.dumps(value, separators=(",", ":")).encode()
    state = structure.machine.read(structure.start, text)
    assert state and structure.machine.can_end(state)
    assert not structure.machine.read(structure.start, text.replace(b'"p2":', b'"p2x":'))


def test_a_property_name_of_a_megabyte_is_refused_at_its_pointer(vocab):
    name = "a" * 1_000_000
    error = within_twice_the_limit(
        lambda: compile_json_schema({"type": "object", "properties": {name: {}}}, vocab, time_limit=LIMIT)
    )
    assert isinstance(error, JsonSchemaError) and error.pointer == f"/properties/{name}"


def test_a_grammar_repetition_that_cannot_fit_is_refused_before_it_is_built():
    started = time.perf_counter()
    with pytest.raises(AutomatonTooLarge, match="MAX_NFA_STATES") as info:
        build_pushdown(Grammar({"s": Repeat(Literal("ab"), 0, 10**12)}, "s"))
    assert info.value.rule == "s"
    assert time.perf_counter() - started < 0.5


# -- memory: peak RSS of a fresh process ------------------------------------------------------------------------


def peak_rss_mb(code: str) -> int:
    """Run ``code`` in a fresh interpreter (``vocab`` is the byte vocabulary) and return its peak RSS in MiB.

    The peak is the process's own (``VmHWM``): ``ru_maxrss`` of a child started by ``subprocess`` (vfork, then
    exec) counts the parent's peak too, which here is this test process's."""
    script = (
        textwrap.dedent(
            """
        import resource
        import constrain
        from constrain.testing import byte_vocabulary
        vocab = byte_vocabulary()
        """
        )
        + textwrap.dedent(code)
        + textwrap.dedent(
            """
        from constrain.testing.memory import status_mib
        peak = status_mib("VmHWM")  # None when not Linux: no parent's peak is counted there
        print(int(peak) if peak is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024)
        """
        )
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return int(done.stdout.split()[-1])


def test_distinct_regexes_compiled_and_dropped_keep_memory_bounded():
    """14 regexes of ~50 MB automata each, compiled and dropped, peaked at 1.2 GB when the regex cache held 256
    of them; bounded in bytes (AUTOMATON_CACHE_BYTES), 314 MB measured."""
    code = """
        for i in range(14):
            constrain.compile(f"(?:[0-9]{{1000}}){{{50 + i}}}", vocab, cache=False)
    """
    assert peak_rss_mb(code) < 600


def test_distinct_lark_grammars_keep_memory_bounded():
    """30 grammars whose terminal automata take ~12 MB each peaked at 765 MB when the terminal cache held 4,096
    of them; 445 MB measured."""
    code = """
        for i in range(30):
            constrain.compile(f'start: A "x"\\nA: /[a-z\\u00e9]{{1,{6000 + i}}}/\\n', vocab, kind="lark", cache=False)
    """
    assert peak_rss_mb(code) < 600


def test_a_property_name_of_a_megabyte_keeps_memory_bounded():
    """It peaked at 2.2 GB with time_limit=1 (the automaton of the keys other than it); 176 MB measured."""
    code = """
        try:
            constrain.compile({"type": "object", "properties": {"a" * 1_000_000: {}}}, vocab, time_limit=1)
        except constrain.JsonSchemaError:
            pass
    """
    assert peak_rss_mb(code) < 400
