"""One entry point from a spec to a compiled structure: :func:`compile`.

A spec is a regex (``str``), a JSON Schema (``dict`` or ``bool``, or JSON text with ``kind="json_schema"``), a type
pydantic can read (a ``BaseModel``, dataclass, ``TypedDict``, ``list[int]``...), a Lark or GBNF grammar (``str``
with ``kind="lark"`` / ``kind="gbnf"``, or wrapped as :class:`~constrain.compilers.specs.Regex`,
:class:`~constrain.compilers.specs.Lark` or :class:`~constrain.compilers.specs.GBNF`, which say it without ``kind``),
a list of choices (``list[str]``), or a :class:`~constrain.grammar.ir.Grammar`.
Compiled structures are kept in a bounded cache keyed by the spec, the options and the vocabulary's fingerprint, so
a server that sees the same schema twice compiles it once; the structure is shared, matchers are per sequence.
"""

from __future__ import annotations

import json
import typing
import warnings
import weakref
from collections.abc import Callable, Hashable
from typing import Any, Literal

from constrain.automata.limits import COMPILE_CACHE_BYTES, DEFAULT_TIME_LIMIT, time_limited
from constrain.cache import BoundedCache
from constrain.compilers.choices import compile_choices
from constrain.compilers.gbnf import compile_gbnf
from constrain.compilers.json_schema import compile_json_schema
from constrain.compilers.lark import compile_lark
from constrain.compilers.pydantic import compile_pydantic
from constrain.compilers.regex import compile_regex
from constrain.compilers.specs import GBNF, Lark, Regex
from constrain.errors import StructureError
from constrain.grammar.ir import Grammar
from constrain.runtime.masks import DEFAULT_CACHE_BYTES
from constrain.runtime.matcher import CompiledStructure
from constrain.runtime.pushdown import compile_grammar
from constrain.vocab.vocabulary import Vocabulary

Kind = Literal["auto", "regex", "json_schema", "pydantic", "lark", "gbnf", "choices", "grammar"]
Whitespace = Literal["compact", "flexible", "indent"]
PropertyOrder = Literal["declared", "any"]

#: Most compiled structures :func:`compile` keeps. The cache is bounded in the bytes of their automata
#: (:data:`~constrain.automata.limits.COMPILE_CACHE_BYTES`, least recently used first out), a structure counting
#: at least 1/64 of it: each keeps its own mask cache too, which grows as it is used, bounded by its
#: ``cache_bytes``.
COMPILE_CACHE_ENTRIES = 64

_COMPILED = BoundedCache(COMPILE_CACHE_BYTES, costly=True)
_JSON_KINDS = ("json_schema", "pydantic")
#: The kind of text each wrapper of :mod:`constrain.compilers.specs` holds.
WRAPPER_KINDS: dict[type, str] = {Regex: "regex", Lark: "lark", GBNF: "gbnf"}


class RelaxationWarning(UserWarning):
    """``strict=False`` relaxed part of a JSON Schema or Pydantic type that cannot be honoured exactly: the output
    may break what the listed keywords say. Warned once per compile (a structure from the cache is not warned
    about again); ``structure.relaxations`` keeps the list."""


def compile(  # noqa: A001 - the package's entry point, read as constrain.compile
    spec: Any,
    vocab: Vocabulary,
    *,
    kind: Kind = "auto",
    strict: bool = True,
    whitespace: Whitespace | None = None,
    max_whitespace: int | None = None,
    additional_properties_default: bool | None = None,
    property_order: PropertyOrder | None = None,
    start: str | None = None,
    time_limit: float | None = DEFAULT_TIME_LIMIT,
    cache_bytes: int = DEFAULT_CACHE_BYTES,
    cache: bool = True,
) -> CompiledStructure:
    """Compile ``spec`` for ``vocab`` (see the module docstring for what a spec can be).

    ``kind`` says how to read ``spec`` when its type does not (a ``str`` is a regex unless ``kind`` is ``"lark"``,
    ``"gbnf"`` or ``"json_schema"``). ``strict`` (default): a JSON Schema or Pydantic keyword that cannot be honoured
    exactly is refused with its JSON pointer; ``strict=False`` relaxes it, lists it in ``structure.relaxations``
    and warns (:class:`RelaxationWarning`) when it compiles anew. ``whitespace`` (``"compact"``, ``"flexible"``,
    ``"indent"``), ``max_whitespace``, ``additional_properties_default`` and ``property_order`` (``"declared"``,
    the default: properties in the order of the schema; ``"any"``: in any order) apply to JSON Schema and Pydantic;
    ``start`` names a grammar's start rule (Lark: ``"start"``, GBNF: ``"root"``). ``time_limit`` bounds the compile
    in CPU seconds (None: no bound). ``cache_bytes`` bounds the structure's mask cache. ``cache=False`` neither
    reads nor fills the compile cache.

    Raises :class:`~constrain.errors.StructureError` (or a subclass naming the place: ``RegexError``,
    ``JsonSchemaError``, ``GrammarSyntaxError``...) for a spec that is malformed, unsupported, or not compiled
    within ``time_limit``.
    """
    if not isinstance(vocab, Vocabulary):
        raise StructureError(f"vocab must be a constrain.Vocabulary, got {type(vocab).__name__}")
    kind = _kind_of(spec, kind)
    options = _options(
        kind,
        strict=strict,
        whitespace=whitespace,
        max_whitespace=max_whitespace,
        additional_properties_default=additional_properties_default,
        property_order=property_order,
        start=start,
    )
    key = _cache_key(spec, kind, options, time_limit, cache_bytes, vocab) if cache else None
    if key is not None:
        hit = _COMPILED.get(key)
        if hit is not None:
            return hit
    structure = _compile(spec, vocab, kind, options, time_limit, cache_bytes)
    relaxations = getattr(structure, "relaxations", None)
    if relaxations:
        warnings.warn(_relaxation_message(relaxations), RelaxationWarning, stacklevel=2)
    if key is not None:
        _COMPILED.put(key, structure, _cached_bytes(structure))
        structure.on_grown = _repricer(key, weakref.ref(structure))
    return structure


def _cached_bytes(structure: CompiledStructure) -> int:
    return max(structure.nbytes, COMPILE_CACHE_BYTES // COMPILE_CACHE_ENTRIES)


def _repricer(key: tuple, ref: weakref.ref[CompiledStructure]) -> Callable[[], None]:
    """What a cached structure calls when it grows (a JSON Schema's rules are built as matchers reach them): its
    entry is counted at its new size. A weak reference, so the structure does not keep itself alive."""

    def grown() -> None:
        structure = ref()
        if structure is not None:
            _COMPILED.reprice(key, _cached_bytes(structure))

    return grown


def _relaxation_message(relaxations: list[str]) -> str:
    listed = "; ".join(relaxations)
    return f"lenient mode (strict=False) relaxed {len(relaxations)} part(s) of the schema: {listed}"


def clear_compile_cache() -> None:
    """Forget every structure :func:`compile` kept."""
    _COMPILED.clear()


def _kind_of(spec: Any, kind: str) -> str:
    if kind not in typing.get_args(Kind):
        raise StructureError(f"unknown kind {kind!r}; known: {', '.join(typing.get_args(Kind))}")
    wrapped = WRAPPER_KINDS.get(type(spec))
    if wrapped is not None:
        if kind not in ("auto", wrapped):
            raise StructureError(f"a {type(spec).__name__} spec is a {wrapped} structure, not kind={kind!r}")
        return wrapped
    if kind != "auto":
        return kind
    if isinstance(spec, str):
        return "regex"
    if isinstance(spec, (dict, bool)):
        return "json_schema"
    if isinstance(spec, (list, tuple)):
        return "choices"
    if isinstance(spec, Grammar):
        return "grammar"
    if isinstance(spec, type) or typing.get_origin(spec) is not None:
        return "pydantic"
    raise StructureError(
        f"cannot tell what structure a {type(spec).__name__} is: pass a regex (str), a JSON Schema (dict), a type, "
        "a list of choices, a Grammar, or say kind="
    )


def _options(kind: str, **given: Any) -> dict[str, Any]:
    """The options that apply to ``kind``; one given for another kind is refused rather than ignored."""
    json_options = ("strict", "whitespace", "max_whitespace", "additional_properties_default", "property_order")
    applies = {
        "json_schema": json_options,
        "pydantic": json_options,
        "lark": ("start",),
        "gbnf": ("start",),
    }.get(kind, ())
    options = {}
    for name, value in given.items():
        if name in applies:
            if value is not None:
                options[name] = value
        elif name == "strict":
            continue  # True is every other kind's only mode
        elif value is not None:
            raise StructureError(f"the option {name}= does not apply to a {kind} structure")
    return options


def _cache_key(
    spec: Any, kind: str, options: dict[str, Any], time_limit: float | None, cache_bytes: int, vocab: Vocabulary
) -> Hashable | None:
    """A key that identifies the compiled structure, or None for a spec that has no stable key."""
    try:
        if kind == "json_schema" and not isinstance(spec, str):
            spec_key: Hashable = json.dumps(spec)  # key order matters: properties come out in their order
        elif kind == "choices":
            spec_key = tuple(spec)
        else:
            hash(spec)
            spec_key = spec
    except (TypeError, ValueError):
        return None
    return (kind, spec_key, tuple(sorted(options.items())), time_limit, cache_bytes, vocab.fingerprint)


def _compile(
    spec: Any, vocab: Vocabulary, kind: str, options: dict[str, Any], time_limit: float | None, cache_bytes: int
) -> CompiledStructure:
    if type(spec) in WRAPPER_KINDS:
        spec, options = _unwrapped(spec, options)
    if kind in _JSON_KINDS:
        if kind == "json_schema" and isinstance(spec, str):
            spec = _json_text(spec)
        compiler = compile_json_schema if kind == "json_schema" else compile_pydantic
        return compiler(spec, vocab, time_limit=time_limit, cache_bytes=cache_bytes, **options)
    if kind in ("regex", "lark", "gbnf") and not isinstance(spec, str):
        raise StructureError(f"a {kind} spec must be a string, got {type(spec).__name__}")
    common = {"time_limit": time_limit, "cache_bytes": cache_bytes}
    if kind == "regex":
        return compile_regex(spec, vocab, **common)
    if kind == "choices":
        return compile_choices(spec, vocab, **common)
    if kind == "lark":
        return compile_lark(spec, vocab, **common, **options)
    if kind == "gbnf":
        return compile_gbnf(spec, vocab, **common, **options)
    if not isinstance(spec, Grammar):
        raise StructureError(f"a grammar spec must be a constrain.grammar.Grammar, got {type(spec).__name__}")
    with time_limited(time_limit, "the grammar"):
        return compile_grammar(spec, vocab, cache_bytes=cache_bytes)


def _unwrapped(spec: Regex | Lark | GBNF, options: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The wrapped text, and the options with the wrapper's start rule as ``start``."""
    if isinstance(spec, Regex):
        return spec.pattern, options
    if spec.start is None:
        return spec.text, options
    given = options.get("start")
    if given is not None and given != spec.start:
        raise StructureError(f"start={given!r} conflicts with the {type(spec).__name__}'s start={spec.start!r}")
    return spec.text, {**options, "start": spec.start}


def _json_text(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as exc:
        raise StructureError(f"the JSON Schema text is not valid JSON: {exc}") from None
