"""A Python ``output_type`` -> what to compile, and how to read the finished text back into a value.

``llm.generate(prompt, output_type=T)`` returns a validated ``T``; :func:`output_type` says what that means for
each ``T``:

- ``None`` or ``str``: free text, no structure (kind ``"text"``); the text.
- A ``BaseModel``, dataclass, ``TypedDict``, ``NamedTuple``, ``list[...]``, ``dict[...]``, ``tuple[...]``, a
  ``Union`` or ``Optional`` of such, or any other type pydantic reads: JSON through pydantic's schema (``"pydantic"``,
  the spec is the type); ``TypeAdapter(T).validate_json(text)``.
- ``int``: a bare integer ``-?(0|[1-9][0-9]*)`` (``"regex"``); an ``int``.
- ``float``: a bare JSON number (``"regex"``); a ``float``.
- ``bool``: ``true`` or ``false`` (``"choices"``); a ``bool``.
- ``Literal[...]`` of ``str``, ``int`` and ``bool`` values: one of the values' texts, a str as it is, an int in
  decimal, a bool as ``true`` / ``false`` (``"choices"``); the ``Literal``'s own value.
- An ``Enum`` whose values are ``str`` or ``int``: one of the values' texts (``"choices"``); the member.
- A JSON Schema (a ``dict`` or a ``bool``): JSON (``"json_schema"``); ``json.loads(text)``, checked by
  ``jsonschema`` in the schema's dialect as the JSON compiler reads it, formats included.
- A list or tuple of ``str``: one of them (``"choices"``); the text.
- :class:`~constrain.compilers.specs.Regex`, :class:`~constrain.compilers.specs.Lark`,
  :class:`~constrain.compilers.specs.GBNF`: the wrapped spec (``"regex"``, ``"lark"``, ``"gbnf"``); the text.
- A :class:`~constrain.grammar.ir.Grammar` (``"grammar"``) or a
  :class:`~constrain.runtime.matcher.CompiledStructure`, used as it is (``"structure"``); the text.

Scalars are bare text, not JSON, because that is what a model writes after ``Answer:``. A constrained scalar
(``Annotated[...]``, ``conint``, ``PositiveInt``...) goes through pydantic's JSON instead, which honours its
constraints: for numbers the text is the same bare number, for strings it is a quoted JSON string.

A bare answer (``int``, ``float``, ``bool``, a ``Literal``, an ``Enum``, a list of choices) may end with one
newline, and the value leaves it out. A base model ends an answer line that way; without the newline, an integer
could only end where the model picks the end-of-sequence token, and a model that wants a newline after ``4``
would be pushed into writing ``40000...`` instead.

Refused: anything else (an instance of an arbitrary class, a function, a module, a ``bytes`` value...) raises
:class:`~constrain.errors.OutputTypeError`, as does a ``Literal`` or ``Enum`` with a value of another type, or with
two values written the same. A type pydantic cannot write a JSON Schema for raises
:class:`~constrain.errors.PydanticSchemaError` from :func:`output_type` itself, before any model runs; a type whose
validation goes beyond its schema (an ``email`` format...) is refused by :meth:`OutputType.compile` in strict mode
only, since ``strict`` is a compile option. A text that the structure accepts but the validation refuses (a
pydantic ``field_validator``) makes :meth:`OutputType.parse` raise :class:`~constrain.errors.OutputValidationError`
with the text.
"""

from __future__ import annotations

import enum
import functools
import json
import re
import typing
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar, overload

import pydantic_core
import typing_extensions
from pydantic import TypeAdapter, ValidationError

from constrain.compilers import api
from constrain.compilers.json_schema.document import _Document
from constrain.compilers.pydantic import pydantic_schema
from constrain.errors import ArgumentError, OutputTypeError, OutputValidationError, VocabularyError
from constrain.grammar.ir import Grammar
from constrain.runtime.matcher import CompiledStructure
from constrain.vocab.vocabulary import Vocabulary

__all__ = ["FLOAT_PATTERN", "INT_PATTERN", "OutputType", "output_type"]

T = TypeVar("T")

#: What a bare ``int`` and ``float`` are written as: JSON's integers and numbers.
INT_PATTERN = "-?(0|[1-9][0-9]*)"
FLOAT_PATTERN = r"-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?"

#: Most pydantic resolutions kept (each holds a TypeAdapter); the only ones that cost enough to keep.
RESOLUTION_CACHE_ENTRIES = 256

_ACCEPTED = (
    "an output type is None or str (free text), a type pydantic reads (a BaseModel, dataclass, TypedDict, "
    "list[...]...), int, float, bool, a Literal or an Enum of str or int values, a JSON Schema (dict or bool), "
    "a list of str choices, Regex, Lark, GBNF, a Grammar or a CompiledStructure"
)


@dataclass(frozen=True, eq=False)
class OutputType(Generic[T]):
    """What to compile for a Python output type, and how to read the finished text back; made by
    :func:`output_type` (the module docstring says what each type means).

    ``python_type`` is what was given; ``spec`` what :func:`constrain.compile` takes (None: free text) with
    ``kind`` as its ``kind=`` (``"text"``: no structure, ``"structure"``: already compiled); ``is_json``: the text
    is JSON, so :meth:`partial` reads its prefixes.
    """

    python_type: Any
    spec: Any | None
    kind: str
    is_json: bool
    _read: Callable[[str], T] = field(repr=False)

    def compile(self, vocab: Vocabulary, **options: Any) -> CompiledStructure | None:
        """The structure for ``vocab``, through :func:`constrain.compile` (so cached; ``options`` are its keyword
        options), or None for free text. A ``CompiledStructure`` given as the output type is returned as it is,
        once its vocabulary is checked (VocabularyError for another). No option applies to those two: one given
        (``strict`` aside, which every kind takes) is refused, as :func:`constrain.compile` refuses one that does
        not apply."""
        if self.kind in ("text", "structure"):
            for name, value in options.items():
                if value is not None and name != "strict":
                    raise ArgumentError(name, value, f"no compile option applies to a {self.kind} output")
        if self.kind == "text":
            return None
        if self.kind != "structure":
            return api.compile(self.spec, vocab, kind=self.kind, **options)
        if not isinstance(vocab, Vocabulary):
            raise ArgumentError("vocab", vocab, "a constrain.Vocabulary")
        if self.spec.vocab.fingerprint != vocab.fingerprint:
            raise VocabularyError("the output_type structure was compiled for another vocabulary than this one")
        return self.spec

    def parse(self, text: str) -> T:
        """The value of a finished ``text``, validated; OutputValidationError (with the text) when refused."""
        if not isinstance(text, str):
            raise ArgumentError("text", text, "the decoded output (a str)")
        return self._read(text)

    def partial(self, text: str) -> Any | None:
        """For streaming: the JSON value an unfinished JSON ``text`` parses to so far, as plain data (dict, list,
        str, number...), with a string cut short kept and a key or literal cut short left out; None when nothing
        parses yet, or when the output is not JSON."""
        if not self.is_json:
            return None
        try:
            return pydantic_core.from_json(text, allow_partial="trailing-strings")
        except ValueError:
            return None


@overload
def output_type(python_type: type[T]) -> OutputType[T]: ...


@overload
def output_type(python_type: Any) -> OutputType[Any]: ...


def output_type(python_type: Any) -> OutputType[Any]:
    """Resolve ``python_type`` into what to compile and how to parse (the table in the module docstring).

    Raises :class:`~constrain.errors.OutputTypeError` for what cannot be an output type, and
    :class:`~constrain.errors.PydanticSchemaError` for a type pydantic cannot write a JSON Schema for. Resolutions
    through pydantic are cached per hashable type.
    """
    t = python_type
    if t is None or t is str:
        return OutputType(t, None, "text", False, _as_is)
    if isinstance(t, CompiledStructure):
        return OutputType(t, t, "structure", False, _as_is)
    if isinstance(t, Grammar):
        return OutputType(t, t, "grammar", False, _as_is)
    if type(t) in api.WRAPPER_KINDS:
        return OutputType(t, t, api.WRAPPER_KINDS[type(t)], False, _as_is)
    if isinstance(t, (dict, bool)):
        return _json_schema(t)
    if isinstance(t, (list, tuple)):
        if not t or not all(isinstance(choice, str) for choice in t):
            raise OutputTypeError("a list of choices must be a non-empty list of str", t)
        return _choices(t, {choice: choice for choice in t})
    if t is int or t is float:
        pattern = INT_PATTERN if t is int else FLOAT_PATTERN
        read = functools.partial(_read_number, t, re.compile(pattern))
        return OutputType(t, f"({pattern})\n?", "regex", False, read)
    if t is bool:
        return _choices(t, {"true": True, "false": False})
    if typing.get_origin(t) is typing.Literal:
        return _choices(t, _texts(t, typing.get_args(t), lambda value: value))
    if isinstance(t, type) and issubclass(t, enum.Enum):
        return _choices(t, _texts(t, t, lambda member: member.value))
    if (
        isinstance(t, (type, typing.NewType, typing_extensions.TypeAliasType))
        or typing.get_origin(t) is not None  # list[int], Optional[...], Annotated[...]...
    ):
        try:
            hash(t)
        except TypeError:
            return _pydantic(t)
        return _pydantic_cached(t)
    raise OutputTypeError(f"a value of type {type(t).__name__} is not an output type; {_ACCEPTED}", t)


# -- what each output type reads ----------------------------------------------------------------------------------


def _as_is(text: str) -> str:
    return text


def _read_number(number_type: type, pattern: re.Pattern[str], text: str) -> int | float:
    """``text`` as ``number_type``, when it is written as the structure writes one (``int()`` and ``float()``
    alone would also take spaces, ``_`` and ``nan``)."""
    if pattern.fullmatch(_line(text)) is not None:
        try:
            return number_type(_line(text))
        except ValueError:  # an int of more digits than sys.get_int_max_str_digits()
            pass
    raise OutputValidationError(f"the output is not a bare {number_type.__name__}", text)


def _choices(python_type: Any, values: Mapping[str, Any]) -> OutputType[Any]:
    """An output that is one of the texts of ``values``, read back as the value of that text."""

    def read(text: str) -> Any:
        try:
            return values[_line(text)]
        except KeyError:
            raise OutputValidationError(f"the output is none of {list(values)}", text) from None

    ended = tuple(f"{text}\n" for text in values if f"{text}\n" not in values)  # "a" and "a\n" both given: once
    return OutputType(python_type, (*values, *ended), "choices", False, read)


def _line(text: str) -> str:
    """A bare answer without the one newline that may end it."""
    return text[:-1] if text.endswith("\n") else text


def _texts(python_type: Any, values: Iterable[Any], value_of: Callable[[Any], Any]) -> dict[str, Any]:
    """The text each of ``values`` is written as (``value_of(value)``: a str as is, an int in decimal, a bool as
    JSON writes it) -> the value; refused when one is of another type or two are written the same."""
    texts: dict[str, Any] = {}
    for value in values:
        written = value_of(value)
        if type(written) is bool:
            text = "true" if written else "false"
        elif type(written) in (str, int):
            text = str(written)
        else:
            raise OutputTypeError(
                f"{_name(python_type)} has the value {written!r}: not a str, an int or a bool", python_type
            )
        if text in texts:
            raise OutputTypeError(
                f"{_name(python_type)} writes both {texts[text]!r} and {value!r} as {text!r}", python_type
            )
        texts[text] = value
    if not texts:
        raise OutputTypeError(f"{_name(python_type)} has no values to choose from", python_type)
    return texts


def _json_schema(schema: Any) -> OutputType[Any]:
    """JSON checked against ``schema`` by jsonschema, formats included, in the dialect the JSON compiler reads it
    in (a schema without ``$schema`` that only draft-07 reads, with ``items`` a list say, is draft-07)."""
    validator = functools.cache(lambda: _Document(schema).validator())  # made at the first parse

    def read(text: str) -> Any:
        from jsonschema.exceptions import best_match

        try:
            value = json.loads(text)
        except ValueError as exc:
            raise OutputValidationError(f"the output is not JSON: {exc}", text) from None
        errors = list(validator().iter_errors(value))
        if errors:
            best = best_match(errors)
            message = f"the JSON Schema refuses the output at {best.json_path}: {best.message}"
            raise OutputValidationError(message, text, errors)
        return value

    return OutputType(schema, schema, "json_schema", True, read)


def _pydantic(python_type: Any) -> OutputType[Any]:
    """JSON through pydantic. The schema is written now, so that a type pydantic cannot describe is refused before
    any model runs rather than at the first compile."""
    pydantic_schema(python_type)
    adapter = TypeAdapter(python_type)
    name = _name(python_type)

    def read(text: str) -> Any:
        try:
            return adapter.validate_json(text)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(map(str, first["loc"])) or "the value"
            message = f"{name} refuses the output: {exc.error_count()} error(s), first at {where}: {first['msg']}"
            raise OutputValidationError(message, text, exc.errors()) from None

    return OutputType(python_type, python_type, "pydantic", True, read)


def _name(python_type: Any) -> str:
    return python_type.__qualname__ if isinstance(python_type, type) else repr(python_type)


_pydantic_cached = functools.lru_cache(maxsize=RESOLUTION_CACHE_ENTRIES)(_pydantic)
