"""The signals the JSON Schema compiler's parts raise and catch among themselves (unsatisfiable, too large, not
negatable, out of time). What a caller sees is :class:`~constrain.errors.JsonSchemaError`.
"""

from __future__ import annotations

from constrain.automata.limits import CompileTimeout, check_deadline
from constrain.errors import JsonSchemaError


class _Unsatisfiable(JsonSchemaError):
    """No JSON value satisfies the (sub)schema."""


def _verdict(exc: _Unsatisfiable) -> _Unsatisfiable:
    """A copy of ``exc`` that was never raised: what the compiler keeps of a verdict, and what it raises again.
    A raised exception holds the frames it went through, and a frame that keeps it (the compiler's memo, a local
    list of failures) closes a reference cycle around the whole compile that only the cyclic collector frees."""
    return _Unsatisfiable(exc.reason, exc.pointer, exc.keyword)


class _OutOfTime(Exception):
    """The schema's time limit ran out (at the JSON pointer given); no handler relaxes this."""


#: What the time limit raises; a handler that turns errors into refusals or fallbacks lets these through first.
_TIME_LIMIT = (_OutOfTime, CompileTimeout)


def _check_time(ptr: str = "") -> None:
    try:
        check_deadline()
    except CompileTimeout:
        raise _OutOfTime(ptr) from None


#: Most dependencies (``dependentRequired``, ``dependentSchemas``, ``dependencies``) one subschema may have where
#: they split its value into an alternative per trigger present or absent.
MAX_DEPENDENCIES = 10


def _check_dependencies(count: int, pointer: str, keyword: str) -> None:
    """Refuse ``count`` dependencies past :data:`MAX_DEPENDENCIES` (each doubles the alternatives)."""
    if count > MAX_DEPENDENCIES:
        raise JsonSchemaError(f"{keyword!r} has too many conditional properties ({count})", pointer, keyword)


class _TooLarge(Exception):
    """A derived automaton or regex exceeds its budget."""


class _NotNegatable(Exception):
    """A schema whose negation (or an exclusive oneOf) cannot be written exactly."""
