"""Typed errors. Each says what is wrong and where, so a caller can fix the input without a debugger."""

from __future__ import annotations

from typing import Any


class ConstrainError(Exception):
    """Base class of every error this library raises on purpose."""


class StructureError(ConstrainError, ValueError):
    """A structure (regex, schema, grammar) is malformed or cannot be honoured exactly."""


class RegexError(StructureError):
    """A regular expression is malformed or uses a construct outside the supported subset.

    ``position`` is the 0-based character offset in ``pattern`` where the problem starts (or None when the
    whole pattern is at fault); ``reason`` is the message without the place.
    """

    def __init__(self, message: str, pattern: str, position: int | None = None):
        self.reason = message
        self.pattern = pattern
        self.position = position
        where = f" at position {position}" if position is not None else ""
        pointer = ""
        if position is not None and len(pattern) <= 200:
            pointer = f"\n  {pattern}\n  {' ' * position}^"
        super().__init__(f"{message}{where} in regex {pattern!r}{pointer}")


class ArgumentError(ConstrainError, ValueError, TypeError):
    """An argument of a public function has the wrong type or a value outside what it takes. ``parameter`` names
    it, ``value`` holds what was given. Both a ValueError and a TypeError, as Python's own checks raise either."""

    what = "argument"

    def __init__(self, parameter: str, value: Any, requirement: str):
        self.parameter = parameter
        self.value = value
        shown = repr(value)
        if len(shown) > 80:
            shown = f"{shown[:77]}..."
        super().__init__(f"invalid {self.what} {parameter}={shown}: {requirement}")


class VocabularyError(ConstrainError, ValueError):
    """A tokenizer cannot be read, or a structure meets a vocabulary it was not compiled for."""


class TokenError(ConstrainError, ValueError):
    """A token id is out of range or not allowed by the structure at this point."""


class ShapeError(ConstrainError, ValueError):
    """An array (logits, bitmask) has the wrong shape, dtype or width."""


class DeadEndError(ConstrainError, RuntimeError):
    """No token is allowed: the structure cannot continue from here. ``text`` holds the output so far."""

    def __init__(self, message: str, text: str | bytes | None = None):
        self.text = text
        super().__init__(message if text is None else f"{message} (output so far: {text!r})")


class AutomatonTooLarge(StructureError):
    """The structure needs more automaton states than the configured limit. ``rule``: the grammar rule whose
    automaton it is, when a grammar's; ``origin``: where its source wrote that rule (a JSON pointer), when known."""

    def __init__(self, message: str, rule: str | None = None, origin: str | None = None):
        self.rule = rule
        self.origin = origin
        super().__init__(message)


class CompileTimeout(StructureError):
    """Building a structure's automata ran past the time limit its caller set (see :func:`deadline`). ``rule``:
    the grammar rule being built then, when a grammar's; ``origin``: where its source wrote that rule (a JSON
    pointer), when known."""

    def __init__(self, message: str, rule: str | None = None, origin: str | None = None):
        self.rule = rule
        self.origin = origin
        super().__init__(message)


class GrammarError(StructureError):
    """A grammar is malformed (an undefined rule, left recursion, a rule that can never complete)."""


class GrammarSyntaxError(GrammarError):
    """The text of a grammar (GBNF or Lark) cannot be parsed. ``line`` and ``column`` are 1-based."""

    def __init__(self, message: str, line: int, column: int, source_line: str | None = None):
        self.line = line
        self.column = column
        pointer = ""
        if source_line is not None and len(source_line) <= 200:
            pointer = f"\n  {source_line}\n  {' ' * (column - 1)}^"
        super().__init__(f"{message} at line {line}, column {column}{pointer}")

    @classmethod
    def at(cls, message: str, text: str, offset: int) -> GrammarSyntaxError:
        """The error at character ``offset`` of ``text``."""
        line_start = text.rfind("\n", 0, offset) + 1
        line_end = text.find("\n", offset)
        source_line = text[line_start : None if line_end < 0 else line_end].rstrip("\r")
        return cls(message, text.count("\n", 0, offset) + 1, offset - line_start + 1, source_line)


class DepthError(StructureError):
    """The text nests deeper than :data:`~constrain.runtime.pushdown.MAX_STACK_DEPTH` rule calls: following it
    further is refused rather than followed inexactly."""


class AmbiguityError(StructureError):
    """The grammar allows too many parses of the text so far to follow them all."""


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


class PydanticSchemaError(StructureError):
    """Pydantic cannot write a JSON Schema for ``type``, or (strict mode) it validates more than the schema says."""

    def __init__(self, message: str, model_type: Any):
        self.type = model_type
        self.reason = message
        name = model_type.__qualname__ if isinstance(model_type, type) else repr(model_type)
        super().__init__(f"{name}: {message}")


class LogitsError(ConstrainError, ValueError):
    """The logits cannot be sampled from (NaN entries, wrong dtype)."""


class SamplingParamsError(ArgumentError):
    """A sampling parameter is out of range. ``parameter`` names it, ``value`` holds what was given."""

    what = "sampling parameter"


class BeamSearchError(ArgumentError):
    """A beam-search argument is out of range. ``parameter`` names it."""

    what = "beam search argument"


class OutputTypeError(StructureError):
    """An ``output_type`` that constrain cannot generate: neither a type pydantic reads, nor a spec
    :func:`constrain.compile` takes. ``type`` holds what was given."""

    def __init__(self, message: str, output_type: Any):
        self.type = output_type
        name = getattr(output_type, "__qualname__", None) or repr(output_type)
        super().__init__(f"output_type {name}: {message}")


class OutputValidationError(ConstrainError, ValueError):
    """A finished output that the structure accepted was still refused by its type's validation: a check the
    schema cannot express (a pydantic ``field_validator``, say). ``text`` holds the output, ``errors`` the
    validator's own report."""

    def __init__(self, message: str, text: str, errors: Any = None):
        self.text = text
        self.errors = errors
        super().__init__(f"{message} (output: {text!r})")


class IncompleteOutputError(ConstrainError, RuntimeError):
    """Generation stopped (``max_new_tokens`` or the model's context) before the structure was complete, so the
    text is not a valid output. ``text`` and ``tokens`` hold what was generated, ``reason`` why it stopped."""

    def __init__(self, message: str, text: str, tokens: list[int], reason: str = "length"):
        self.text = text
        self.tokens = tokens
        self.reason = reason
        super().__init__(f"{message} (output so far: {text!r})")


class ContextLengthError(ConstrainError, ValueError):
    """A prompt, with the ``max_new_tokens`` asked for, does not fit the model's context window."""

    def __init__(self, prompt_tokens: int, max_new_tokens: int, context_length: int):
        self.prompt_tokens = prompt_tokens
        self.max_new_tokens = max_new_tokens
        self.context_length = context_length
        super().__init__(
            f"the prompt has {prompt_tokens:,} tokens and max_new_tokens={max_new_tokens:,}, but the model's context "
            f"holds {context_length:,} tokens: shorten the prompt or ask for fewer tokens"
        )


class MissingExtraError(ConstrainError, ImportError):
    """An optional dependency is not installed. ``extra`` names the extra of ``constrain`` that installs it,
    ``missing`` the module that could not be found."""

    def __init__(self, module: str, extra: str, missing: str | None = None, feature: str | None = None):
        self.module = module
        self.extra = extra
        self.missing = missing or module
        what = f"{feature} needs {module}" if feature else f"{module} is needed"
        detail = f" ({self.missing} is not installed)" if self.missing != module else " and is not installed"
        super().__init__(f'{what}{detail}: pip install "constrain[{extra}]"', name=self.missing)


class ToolError(ConstrainError, ValueError):
    """A tool definition that cannot be used (a bad name, parameters that are not an object schema, a function
    whose parameters have no JSON Schema), or a ``tool_choice`` that names no offered tool."""


class ToolCallError(ConstrainError, ValueError):
    """Text that is not valid tool calls: not in the format, an unknown tool, or arguments their schema refuses.
    ``text`` holds the text, ``position`` the character offset where reading failed (None when the arguments
    were read but refused)."""

    def __init__(self, message: str, text: str, position: int | None = None):
        self.text = text
        self.position = position
        where = f" at character {position}" if position is not None else ""
        super().__init__(f"{message}{where} (text: {text[:200]!r})")
