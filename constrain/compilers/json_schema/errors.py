"""The errors of the JSON Schema compiler: :class:`JsonSchemaError`, what a caller sees, and the signals its parts
raise and catch among themselves (unsatisfiable, too large, not negatable, out of time).
"""

from __future__ import annotations

from constrain.automata.limits import CompileTimeout, check_deadline
from constrain.errors import StructureError


class JsonSchemaError(StructureError):
    """A schema is invalid, unresolvable, unsatisfiable, or (in strict mode) cannot be honoured exactly.

    ``pointer`` is the JSON pointer of the keyword at fault (``/properties/age/minimum``), ``keyword`` its name.
    """

    def __init__(self, message: str, pointer: str = "", keyword: str | None = None):
        self.pointer = pointer
        self.keyword = keyword
        self.reason = message
        where = f"keyword {keyword!r} at {pointer!r}" if keyword else f"schema at {pointer or '/'!r}"
        super().__init__(f"{where}: {message}")


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


class _TooLarge(Exception):
    """A derived automaton or regex exceeds its budget."""


class _NotNegatable(Exception):
    """A schema whose negation (or an exclusive oneOf) cannot be written exactly."""
