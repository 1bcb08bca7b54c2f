"""The hostile-input suite: inputs built to make a compiler run long, take memory or fail untyped, each run in a
fresh process that reports the outcome, the wall time and the peak memory.

Each case compiles (or is refused) under a CPU time limit of ``time_limit`` seconds. A case passes when it
compiles or raises an error of :mod:`constrain.errors` within twice that limit of wall time, and its process's
peak resident memory stays under :data:`MEMORY_BOUND_MB`. ``tests/test_hostile_suite.py`` asserts exactly that;
``benchmarks/hostile.py`` prints the table kept in ``BENCHMARKS.md``. Run one case by hand with::

    python -m constrain.testing.hostile regex-nested-counts --time-limit 1
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from constrain.testing.memory import status_mib

#: Peak resident memory (MB) a case's process may reach: the library and its kernels loaded (about 250 MB), the
#: caches at their byte budgets, and one automaton at the state caps of :mod:`constrain.automata.limits`.
MEMORY_BOUND_MB = 1536


@dataclass(frozen=True)
class CaseResult:
    """What one case did: ``compiles`` is how many compile calls it makes; ``outcome`` is ``"compiled"``,
    ``"refused"`` or ``"failed"`` (an error outside :mod:`constrain.errors`, a crash, or no answer in time);
    ``error`` names the error; ``seconds`` is the wall time of the compile calls alone, ``cpu_seconds`` their
    thread's CPU time; the memory figures are the process's peak resident set, before the case (library loaded,
    kernels warm) and after."""

    name: str
    compiles: int
    outcome: str
    error: str
    seconds: float
    cpu_seconds: float
    baseline_mb: float
    peak_mb: float

    def passed(self, time_limit: float) -> bool:
        """Compiled or refused with a typed error, within twice ``time_limit`` per compile call and under
        :data:`MEMORY_BOUND_MB`."""
        return (
            self.outcome in ("compiled", "refused")
            and self.seconds <= 2 * time_limit * self.compiles
            and self.peak_mb <= MEMORY_BOUND_MB
        )


_CASES: dict[str, tuple[str, int, Callable[[Any, float], None]]] = {}


def _case(name: str, description: str, compiles: int = 1):
    """Register a case that makes ``compiles`` compile calls, each under the time limit."""

    def register(run: Callable[[Any, float], None]) -> Callable[[Any, float], None]:
        _CASES[name] = (description, compiles, run)
        return run

    return register


def cases() -> dict[str, str]:
    """The cases by name, with what each one tries."""
    return {name: description for name, (description, _, _) in _CASES.items()}


_SPECS: dict[str, tuple[str, Callable[[], Any], dict[str, Any]]] = {}


def _spec_case(name: str, description: str, kind: str = "json_schema", **options: Any):
    """Register a case that compiles, with :func:`constrain.compile`, the spec of ``kind`` its function
    returns, with ``options``."""

    def register(make: Callable[[], Any]) -> Callable[[], Any]:
        def run(vocab, limit: float) -> None:
            import constrain

            constrain.compile(make(), vocab, kind=kind, time_limit=limit, cache=False, **options)

        _case(name, description)(run)
        _SPECS[name] = (kind, make, options)
        return make

    return register


def json_schema_of(name: str) -> tuple[Any, dict[str, Any]] | None:
    """The JSON Schema case ``name`` compiles and its options (None for a case of another kind): what
    ``benchmarks/hostile.py`` hands the other engines."""
    kind, make, options = _SPECS.get(name, (None, None, None))
    return (make(), options) if kind == "json_schema" else None


# -- time ---------------------------------------------------------------------------------------------------------


@_spec_case("string-max-length-1e18", 'JSON Schema {"type": "string", "maxLength": 10**18}')
def _():
    return {"type": "string", "maxLength": 10**18}


@_spec_case("string-max-length-2e9", 'JSON Schema {"type": "string", "maxLength": 2147483647}')
def _():
    return {"type": "string", "maxLength": 2147483647}


def _required_properties(count: int) -> dict[str, Any]:
    names = [f"p{i}" for i in range(count)]
    return {"type": "object", "properties": {n: {"type": "integer"} for n in names}, "required": names}


_spec_case("required-40k", "JSON Schema object with 40,000 required properties")(lambda: _required_properties(40_000))
_spec_case("required-100k", "JSON Schema object with 100,000 required properties")(
    lambda: _required_properties(100_000)
)
_spec_case("regex-nested-counts", "regex ((a{1,50}){1,50}){1,50}", "regex")(lambda: "((a{1,50}){1,50}){1,50}")
_spec_case("lark-nested-counts", "Lark grammar with the terminal /((a{1,50}){1,50}){1,50}/", "lark")(
    lambda: "start: /((a{1,50}){1,50}){1,50}/\n"
)
_spec_case("gbnf-nested-counts", 'GBNF grammar root ::= (("a"{1,50}){1,50}){1,50}', "gbnf")(
    lambda: 'root ::= (("a"{1,50}){1,50}){1,50}\n'
)
_spec_case("regex-exponential", "a regex whose DFA doubles per character: (a|b)*a(a|b){25}", "regex")(
    lambda: "(a|b)*a(a|b){25}"
)


@_spec_case("pattern-exponential", "JSON Schema pattern (a|b)*a(a|b){25} on a property")
def _():
    return {"type": "object", "properties": {"x": {"type": "string", "pattern": "(a|b)*a(a|b){25}"}}}


@_spec_case("min-items-100k", "JSON Schema array with minItems 100,000, indented", whitespace="indent")
def _():
    return {"type": "array", "items": {"type": "integer"}, "minItems": 100_000}


@_spec_case("bounds-1e308", "JSON Schema number with minimum 1e308 and exclusiveMaximum 1.5e308")
def _():
    return {"type": "number", "minimum": 1e308, "exclusiveMaximum": 1.5e308}


@_spec_case("enum-100k", "JSON Schema enum of 100,000 strings")
def _():
    return {"enum": [f"value-{i}" for i in range(100_000)]}


@_spec_case("any-of-10k", "JSON Schema anyOf of 10,000 objects with distinct consts")
def _():
    branches = [{"type": "object", "properties": {"k": {"const": i}}, "required": ["k"]} for i in range(10_000)]
    return {"anyOf": branches}


@_spec_case("any-of-objects-2000", "JSON Schema anyOf of 2,000 objects of 6 optional properties each")
def _():
    branches = [
        {"type": "object", "properties": {f"{name}{i}": {"type": "integer"} for name in "abcdef"}} for i in range(2000)
    ]
    return {"anyOf": branches}


@_spec_case(
    "any-order-objects-1000",
    'JSON Schema object of 1,000 required objects of 6 properties each, property_order="any"',
    property_order="any",
)
def _():
    inner = {"type": "object", "properties": {name: {"type": "integer"} for name in "abcdef"}}
    names = [f"o{i}" for i in range(1000)]
    return {"type": "object", "properties": {n: {**inner, "title": n} for n in names}, "required": names}


@_spec_case("nested-properties-5000", "JSON Schema objects nested 5,000 deep")
def _():
    schema: dict[str, Any] = {"type": "integer"}
    for _ in range(5000):
        schema = {"type": "object", "properties": {"a": schema}, "required": ["a"]}
    return schema


_spec_case("regex-nesting-5000", "a regex of 5,000 nested groups", "regex")(lambda: "(" * 5000 + "a" + ")" * 5000)


@_spec_case("ref-to-itself", 'JSON Schema {"$ref": "#"}')
def _():
    return {"$ref": "#"}


# -- memory -------------------------------------------------------------------------------------------------------


@_case("regexes-14-dropped", "14 distinct regexes with large DFAs, each dropped after compiling", compiles=14)
def _(vocab, limit):
    from constrain.compilers.regex import compile_regex

    for k in range(3, 17):
        compile_regex(f"(a|b)*a(a|b){{{k}}}c", vocab, time_limit=limit)


@_case("lark-grammars-10", "10 distinct Lark grammars, each dropped after compiling", compiles=10)
def _(vocab, limit):
    from constrain.compilers.lark import compile_lark

    for k in range(10):
        grammar = f'start: item ("," item)*\nitem: /[a-z]{{1,{k + 8}}}/ | NUMBER{k}\nNUMBER{k}: /[0-9]+x{k}/\n'
        compile_lark(grammar, vocab, time_limit=limit)


@_spec_case("property-name-1mb", "JSON Schema with a required property whose name is 1 MB long")
def _():
    name = "a" * 1_000_000
    return {"type": "object", "properties": {name: {"type": "integer"}}, "required": [name]}


@_spec_case("enum-string-1mb", "JSON Schema enum of one 1 MB string")
def _():
    return {"enum": ["b" * 1_000_000]}


@_case(
    "any-order-64-names-read",
    'JSON Schema object of 64 names under property_order="any", read in reverse order: a rule written per name read',
)
def _(vocab, limit):
    import json

    import constrain
    from constrain.testing.walks import accepts_text

    names = [f"n{i:011d}" for i in range(64)]  # 14 bytes each as JSON: within MAX_ANY_ORDER_LATER_NAME_BYTES
    schema = {"type": "object", "properties": {name: {"type": "integer"} for name in names}}
    structure = constrain.compile(schema, vocab, time_limit=limit, cache=False, property_order="any")
    text = json.dumps({name: i for i, name in enumerate(reversed(names))}, separators=(",", ":"))
    if not accepts_text(structure, text):
        raise AssertionError("the object's names were not accepted in reverse order")


# -- running ------------------------------------------------------------------------------------------------------


def _peak_mb() -> float:
    """This process's peak resident memory: ``VmHWM`` on Linux, since the ``ru_maxrss`` of a process started by
    ``subprocess`` counts its parent's peak too; ``ru_maxrss`` elsewhere."""
    peak = status_mib("VmHWM")
    return peak if peak is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _run_here(name: str, time_limit: float) -> dict[str, Any]:
    """Run case ``name`` in this process (a fresh one: the peak memory is the process's)."""
    import constrain
    import constrain.errors
    from constrain.testing import byte_vocabulary

    vocab = byte_vocabulary()
    # Warm: each compiler's kernels loaded, as in a server that has answered a request of each kind.
    constrain.compile({"type": "object", "properties": {"a": {"type": "string"}}}, vocab, cache=False)
    constrain.compile("(a|b)*a(a|b){3}[0-9]{2,5}", vocab, cache=False)
    constrain.compile('root ::= ("a"{1,3})+ [0-9]', vocab, kind="gbnf", cache=False)
    constrain.compile("start: /[a-z]{1,5}/ NUMBER\n%import common.NUMBER\n", vocab, kind="lark", cache=False)
    baseline = _peak_mb()
    run = _CASES[name][2]
    started, cpu_started = time.perf_counter(), time.thread_time()
    try:
        run(vocab, time_limit)
    except constrain.errors.ConstrainError as exc:
        outcome, error = "refused", f"{type(exc).__name__}: {exc}"
    except BaseException as exc:  # the suite's finding: anything else is a failure
        outcome, error = "failed", f"{type(exc).__module__}.{type(exc).__name__}: {exc}"
    else:
        outcome, error = "compiled", ""
    seconds, cpu_seconds = time.perf_counter() - started, time.thread_time() - cpu_started
    return {
        "compiles": _CASES[name][1],
        "outcome": outcome,
        "error": error[:300],
        "seconds": seconds,
        "cpu_seconds": cpu_seconds,
        "baseline_mb": baseline,
        "peak_mb": _peak_mb(),
    }


def run_case(name: str, time_limit: float = 1.0, *, timeout: float = 120.0) -> CaseResult:
    """Run case ``name`` in a fresh Python process; a crash or no answer within ``timeout`` seconds is a
    ``"failed"`` outcome."""
    if name not in _CASES:
        raise KeyError(f"no hostile case {name!r}; the cases: {', '.join(_CASES)}")
    command = [sys.executable, "-m", "constrain.testing.hostile", name, "--time-limit", str(time_limit), "--json"]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return CaseResult(name, 1, "failed", f"no answer within {timeout:g} s", timeout, timeout, 0.0, 0.0)
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        error = f"exit status {done.returncode}: {done.stderr[-300:]}"
        return CaseResult(name, 1, "failed", error, 0.0, 0.0, 0.0, 0.0)
    return CaseResult(name, **json.loads(lines[-1]))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("case", choices=list(_CASES))
    parser.add_argument("--time-limit", type=float, default=1.0, help="CPU seconds per compile (default 1)")
    parser.add_argument("--json", action="store_true", help="print one JSON line (what run_case reads)")
    args = parser.parse_args(argv)
    result = _run_here(args.case, args.time_limit)
    if args.json:
        print(json.dumps(result))
    else:
        print(
            f"{args.case}: {result['outcome']} in {result['seconds']:.2f} s ({result['cpu_seconds']:.2f} s CPU), "
            f"peak {result['peak_mb']:.0f} MB"
        )
        if result["error"]:
            print(f"  {result['error']}")


if __name__ == "__main__":
    main()
