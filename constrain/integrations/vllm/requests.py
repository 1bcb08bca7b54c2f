"""vLLM requests: which structure a request asks for, and compiling it.

The structure comes either from vLLM's own structured-output request types (JSON, regex, choice, grammar,
structural tag) or from ``SamplingParams.extra_args`` keys (see :func:`structure_request`).
"""

from __future__ import annotations

import enum
import functools
import json
from collections.abc import Mapping
from typing import Any

from constrain.compilers import api
from constrain.compilers.choices import choice_regex
from constrain.compilers.json_schema import schema_to_grammar
from constrain.errors import StructureError
from constrain.runtime.matcher import CompiledStructure
from constrain.vocab.vocabulary import Vocabulary


class RequestType(enum.Enum):
    """The kinds of structured-output request; the member names are those of vLLM's ``StructuredOutputOptions``."""

    JSON = "json"
    JSON_OBJECT = "json_object"
    REGEX = "regex"
    GRAMMAR = "grammar"
    CHOICE = "choice"
    STRUCTURAL_TAG = "structural_tag"


def _request_type(request_type: Any) -> RequestType:
    """Our RequestType for vLLM's ``StructuredOutputOptions`` member, our own, or a name such as ``"regex"``."""
    if isinstance(request_type, RequestType):
        return request_type
    name = getattr(request_type, "name", request_type)  # an enum member of vLLM's: look at its name
    if isinstance(name, str):
        try:
            return RequestType[name.upper()]
        except KeyError:
            pass
    known = ", ".join(t.value for t in RequestType)
    raise StructureError(f"unknown structured-output request type {request_type!r}; known: {known}")


# ----------------------------------------------------------------------------------------------------------------
# structures from requests
# ----------------------------------------------------------------------------------------------------------------


def _load_json(spec: Any, request_type: str) -> Any:
    if not isinstance(spec, (str, bytes, bytearray)):
        return spec  # already parsed
    try:
        return json.loads(spec)
    except ValueError as exc:
        raise StructureError(f"{request_type} request: the spec is not valid JSON: {exc}") from None


def _is_gbnf(grammar: str) -> bool:
    """GBNF (llama.cpp) writes its rules with ``::=``; Lark with ``:``."""
    return "::=" in grammar


def compile_structure(
    request_type: Any, grammar_spec: Any, vocab: Vocabulary, *, cache: bool = True
) -> CompiledStructure:
    """Compile one structured-output request for ``vocab`` through :func:`constrain.compile` (with its cache unless
    ``cache=False``: :class:`~constrain.integrations.vllm.backend.ConstrainBackend` keeps its own, per engine).

    ``grammar_spec`` is what vLLM's ``StructuredOutputKey`` carries: a JSON Schema as JSON text (or already
    parsed), ``""`` for a JSON object, a regex, a grammar in Lark or GBNF syntax, or the choices as a JSON list.
    Raises StructureError (a ValueError) for a malformed or unsupported request.
    """
    kind = _request_type(request_type)
    name = kind.name
    if kind in (RequestType.REGEX, RequestType.GRAMMAR) and not isinstance(grammar_spec, str):
        raise StructureError(f"a {name} request needs the spec as a string, got {type(grammar_spec).__name__}")
    if kind is RequestType.REGEX:
        return api.compile(grammar_spec, vocab, kind="regex", cache=cache)
    if kind is RequestType.CHOICE:
        return api.compile(_choices(_load_json(grammar_spec, name)), vocab, kind="choices", cache=cache)
    if kind is RequestType.JSON:
        return api.compile(_load_json(grammar_spec, name), vocab, kind="json_schema", cache=cache)
    if kind is RequestType.JSON_OBJECT:
        return api.compile({"type": "object"}, vocab, kind="json_schema", cache=cache)
    if kind is RequestType.GRAMMAR:
        return api.compile(grammar_spec, vocab, kind="gbnf" if _is_gbnf(grammar_spec) else "lark", cache=cache)
    raise StructureError(f"{name} requests are not supported by constrain")


def _choices(value: Any) -> list[str]:
    """The list of choices, checked (StructureError for anything but a non-empty list of strings)."""
    choice_regex(value)
    return list(value)


# ----------------------------------------------------------------------------------------------------------------
# the logits-processor plug-in
# ----------------------------------------------------------------------------------------------------------------

#: The structure keys the plug-in reads from ``SamplingParams.extra_args``, each either flat with the prefix
#: ``constrain_`` (what the OpenAI server's ``vllm_xargs`` can carry) or nested under ``"constrain"``.
EXTRA_ARGS_KEYS: dict[str, RequestType] = {
    "regex": RequestType.REGEX,
    "json": RequestType.JSON,
    "json_object": RequestType.JSON_OBJECT,
    "choice": RequestType.CHOICE,
    "grammar": RequestType.GRAMMAR,
}


def structure_request(extra_args: Mapping[str, Any] | None) -> tuple[RequestType, str] | None:
    """The structure a request asks for in its ``extra_args``, as (type, spec text), or None.

    ``{"constrain_regex": r"\\d+"}`` or ``{"constrain": {"regex": r"\\d+"}}``; likewise ``json`` (a schema, as a
    dict or JSON text), ``json_object`` (true), ``choice`` (a list of strings) and ``grammar`` (Lark or GBNF).
    Raises StructureError for an unknown key, a wrong value or more than one structure.
    """
    if not extra_args:
        return None
    found: dict[str, Any] = {}
    nested = extra_args.get("constrain")
    if nested is not None:
        if not isinstance(nested, Mapping):
            raise StructureError(f"extra_args['constrain'] must be a dict such as {{'regex': ...}}, got {nested!r}")
        for key, value in nested.items():
            if key not in EXTRA_ARGS_KEYS:
                raise StructureError(
                    f"unknown key {key!r} in extra_args['constrain']; known: {sorted(EXTRA_ARGS_KEYS)}"
                )
            found[key] = value
    for key in EXTRA_ARGS_KEYS:
        if f"constrain_{key}" in extra_args:
            if key in found:
                raise StructureError(f"{key!r} is given both flat and under extra_args['constrain']")
            found[key] = extra_args[f"constrain_{key}"]
    if "json_object" in found:
        flag = found["json_object"]
        if isinstance(flag, str):
            flag = {"true": True, "1": True, "false": False, "0": False, "": False}.get(flag.strip().lower(), flag)
        if flag is None or flag is False or flag == 0:
            del found["json_object"]
        elif flag is not True and flag != 1:
            raise StructureError(f"constrain json_object must be true or false, got {found['json_object']!r}")
    if not found:
        return None
    if len(found) > 1:
        raise StructureError(f"one structure per request, got {sorted(found)}")
    key, value = found.popitem()
    kind = EXTRA_ARGS_KEYS[key]
    if kind is RequestType.JSON_OBJECT:
        return kind, ""
    if kind in (RequestType.REGEX, RequestType.GRAMMAR):
        if not isinstance(value, str):
            raise StructureError(f"constrain {key} must be a string, got {type(value).__name__}")
        return kind, value
    if kind is RequestType.CHOICE:
        choices = _load_json(value, "CHOICE") if isinstance(value, str) else value
        choice_regex(choices)  # checks the list
        return kind, json.dumps(list(choices))
    # JSON: the schema as text
    if isinstance(value, str):
        _load_json(value, "JSON")
        return kind, value
    if not isinstance(value, (Mapping, bool)):
        raise StructureError(f"constrain json must be a JSON Schema (a dict or JSON text), got {type(value).__name__}")
    return kind, json.dumps(value)


@functools.lru_cache(maxsize=256)
def _check_json_schema(spec: str) -> None:
    """Lower a JSON request's schema to a grammar (no vocabulary needed): JsonSchemaError, a StructureError, for a
    schema the compile would refuse. Cached per schema text: admission sees the same schemas again and again."""
    schema_to_grammar(_load_json(spec, "JSON"))
