"""Tools and tool calls: what a model may call, from a Python function, a Pydantic model or an OpenAI tool dict.

A tool's arguments are one JSON object described by a JSON Schema (``parameters``). From a function, the schema is
that of a Pydantic model made from its signature (type hints, defaults) with the argument descriptions of its
docstring (Google ``Args:`` or Sphinx ``:param x:``); the docstring's first paragraph describes the tool. A call's
arguments are validated against the schema with ``jsonschema`` and converted to the function's parameter types
(or into the Pydantic model) by pydantic.
"""

from __future__ import annotations

import inspect
import json
import re
import typing
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import jsonschema
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, create_model

from constrain.compilers.pydantic import pydantic_schema
from constrain.errors import ToolCallError, ToolError

#: What OpenAI accepts as a function name.
_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
_GOOGLE_ARGS = re.compile(r"^\s*(?:Args|Arguments|Parameters):\s*$", re.MULTILINE)
_GOOGLE_ARG = re.compile(r"^\s+(\*{0,2}\w+)(?:\s*\([^)]*\))?:\s*(.*)$")
_SPHINX_ARG = re.compile(r":param\s+(?:[^:]*\s)?(\w+):\s*(.*)")


@dataclass(frozen=True, eq=False)
class Tool:
    """A tool the model may call: its name, what it does, and the JSON Schema of its arguments object.

    ``function``: the Python callable that runs a call (None for a tool defined by its schema only).
    ``model``: the Pydantic type the arguments are converted into (a function's signature model, or the model a
    tool was made from). ``strict``: compile the arguments exactly, refusing what the compiler cannot honour (an
    OpenAI tool's ``"strict": false`` relaxes it instead, with a warning)."""

    name: str
    description: str
    parameters: dict[str, Any]
    function: Callable[..., Any] | None = None
    model: type[BaseModel] | None = None
    strict: bool = True
    _validator: Any = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME.fullmatch(self.name):
            raise ToolError(f"tool name {self.name!r}: letters, digits, '_' and '-', 1 to 64 characters")
        params = self.parameters
        if not isinstance(params, Mapping) or params.get("type", "object") != "object":
            raise ToolError(f"tool {self.name!r}: parameters must be a JSON Schema of an object, not {params!r}")
        try:
            validator_type = jsonschema.validators.validator_for(params, default=jsonschema.Draft202012Validator)
            validator_type.check_schema(params)
        except jsonschema.SchemaError as exc:
            pointer = "/" + "/".join(map(str, exc.absolute_path))
            raise ToolError(
                f"tool {self.name!r}: parameters at {pointer} are not valid JSON Schema: {exc.message}"
            ) from None
        object.__setattr__(self, "_validator", validator_type(params))

    @classmethod
    def from_function(cls, fn: Callable[..., Any], *, name: str | None = None, strict: bool = True) -> Tool:
        """A tool that calls ``fn``; its parameters' schema from the type hints, its description from the docstring."""
        signature = inspect.signature(fn)
        try:
            hints = typing.get_type_hints(fn, include_extras=True)  # annotations written as strings resolved
        except Exception as exc:  # a name in an annotation that does not resolve
            raise ToolError(f"function {fn.__name__}: its type hints do not resolve ({exc})") from exc
        docs = _argument_docs(inspect.getdoc(fn) or "")
        fields: dict[str, Any] = {}
        for pname, param in signature.parameters.items():
            if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
                raise ToolError(f"function {fn.__name__}: *{pname} / **{pname} have no JSON Schema")
            annotation = hints.get(pname, Any)
            default = ... if param.default is inspect.Parameter.empty else param.default
            fields[pname] = (annotation, Field(default, description=docs.get(pname)))
        try:
            model = create_model(f"{fn.__name__}_arguments", __config__=ConfigDict(extra="forbid"), **fields)
            parameters = pydantic_schema(model)
        except Exception as exc:  # pydantic's errors for types it cannot describe
            raise ToolError(f"function {fn.__name__}: its parameters have no JSON Schema ({exc})") from exc
        parameters.pop("title", None)
        return cls(name or fn.__name__, _summary(fn), parameters, function=fn, model=model, strict=strict)

    @classmethod
    def from_model(cls, model: type[BaseModel], *, name: str | None = None, strict: bool = True) -> Tool:
        """A tool whose arguments are ``model``'s fields; a call's arguments become a ``model`` instance."""
        parameters = pydantic_schema(model)
        parameters.pop("title", None)
        description = parameters.pop("description", None) or _summary(model)
        return cls(name or model.__name__, description, parameters, model=model, strict=strict)

    @classmethod
    def from_openai(cls, definition: Mapping[str, Any]) -> Tool:
        """From OpenAI's ``{"type": "function", "function": {"name", "description", "parameters", "strict"}}``
        (or the inner ``function`` object alone)."""
        if not isinstance(definition, Mapping):
            raise ToolError(f"a tool definition must be an object, not {definition!r}")
        if "function" in definition:
            if definition.get("type", "function") != "function":
                raise ToolError(f"tool type {definition.get('type')!r}: only 'function' tools are supported")
            definition = definition["function"]
            if not isinstance(definition, Mapping):
                raise ToolError(f"a tool's 'function' must be an object, not {definition!r}")
        if "name" not in definition:
            raise ToolError(f"a tool definition needs a 'name': {dict(definition)!r}")
        parameters = definition.get("parameters") or {"type": "object", "properties": {}}
        strict = definition.get("strict")
        return cls(
            definition["name"],
            str(definition.get("description") or ""),
            dict(parameters) if isinstance(parameters, Mapping) else parameters,  # anything else: refused below
            strict=True if strict is None else bool(strict),
        )

    def to_openai(self) -> dict[str, Any]:
        """OpenAI's tool definition of this tool."""
        function = {"name": self.name, "description": self.description, "parameters": self.parameters}
        return {"type": "function", "function": {**function, "strict": self.strict}}

    def arguments(self, raw: str | Mapping[str, Any]) -> Any:
        """Validate a call's arguments (JSON text or parsed) and convert them: keyword arguments of the function's
        types, an instance of the model, or the parsed object for a tool defined by its schema only."""
        value = json.loads(raw) if isinstance(raw, str) else dict(raw)
        text = raw if isinstance(raw, str) else json.dumps(value)
        error = jsonschema.exceptions.best_match(self._validator.iter_errors(value))
        if error is not None:
            pointer = "/" + "/".join(map(str, error.absolute_path))
            raise ToolCallError(f"the arguments of {self.name!r} at {pointer}: {error.message}", text)
        if self.model is None:
            return value
        try:
            converted = TypeAdapter(self.model).validate_python(value)
        except ValidationError as exc:
            raise ToolCallError(f"the arguments of {self.name!r} do not validate: {exc}", text) from None
        if self.function is None:
            return converted
        return {name: getattr(converted, name) for name in type(converted).model_fields}


@dataclass(frozen=True)
class ToolCall:
    """One call of a tool: its name, the validated and converted ``arguments`` (see :meth:`Tool.arguments`), the
    arguments' JSON text as generated (``raw``), and an id (as OpenAI's ``tool_calls`` carry)."""

    name: str
    arguments: Any
    raw: str
    id: str = field(default_factory=lambda: f"call_{uuid.uuid4().hex[:24]}")

    def to_openai(self) -> dict[str, Any]:
        """OpenAI's ``tool_calls`` entry for this call."""
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.raw}}


def as_tool(tool: Any) -> Tool:
    """A :class:`Tool` from a Tool, a function, a Pydantic model or an OpenAI tool dict."""
    if isinstance(tool, Tool):
        return tool
    if isinstance(tool, Mapping):
        return Tool.from_openai(tool)
    if isinstance(tool, type) and issubclass(tool, BaseModel):
        return Tool.from_model(tool)
    if callable(tool):
        return Tool.from_function(tool)
    raise ToolError(f"a tool is a function, a Pydantic model, an OpenAI tool dict or a constrain Tool, not {tool!r}")


def as_tools(tools: Iterable[Any]) -> list[Tool]:
    """The tools of ``tools`` (see :func:`as_tool`), with distinct names."""
    if isinstance(tools, (str, bytes, Mapping)) or not isinstance(tools, Iterable):
        raise ToolError(f"tools must be a list of tools, not {tools!r}")
    out = [as_tool(t) for t in tools]
    if not out:
        raise ToolError("no tools given")
    seen: set[str] = set()
    for tool in out:
        if tool.name in seen:
            raise ToolError(f"two tools are named {tool.name!r}")
        seen.add(tool.name)
    return out


def _summary(obj: Any) -> str:
    """The first paragraph of an object's docstring, on one line."""
    doc = inspect.getdoc(obj) or ""
    if isinstance(obj, type) and issubclass(obj, BaseModel) and doc == inspect.getdoc(BaseModel):
        return ""
    return " ".join(doc.split("\n\n", 1)[0].split())


def _argument_docs(doc: str) -> dict[str, str]:
    """Argument descriptions from a docstring's Google ``Args:`` section or Sphinx ``:param x:`` lines."""
    found = {m.group(1): m.group(2).strip() for m in _SPHINX_ARG.finditer(doc)}
    section = _GOOGLE_ARGS.search(doc)
    if section:
        for line in doc[section.end() :].splitlines()[1:] if doc[section.end() :].startswith("\n") else []:
            if line.strip() and not line.startswith((" ", "\t")):
                break
            match = _GOOGLE_ARG.match(line)
            if match:
                found[match.group(1).lstrip("*")] = match.group(2).strip()
    return found
