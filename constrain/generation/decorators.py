"""Decorators: ``@constrain.structured(llm)`` on a model class, ``@llm.function`` on a prompt function.

Neither retries: the structure makes every output valid for its type, so one generation is one answer.
"""

from __future__ import annotations

import functools
import inspect
import typing
from collections.abc import Callable
from typing import Any, TypeVar

from constrain.errors import ArgumentError, OutputTypeError
from constrain.generation.prompts import template_fields

T = TypeVar("T")


def structured(llm: Any, **options: Any) -> Callable[[type[T]], type[T]]:
    """Give a Pydantic model (or dataclass, TypedDict...) ``generate``, ``agenerate`` and ``stream`` class
    methods that ask ``llm`` for an instance::

        @constrain.structured(llm)
        class City(BaseModel):
            name: str
            country: str

        city = City.generate("The capital of France, as JSON: ")   # a validated City

    ``options`` (``max_new_tokens=``, ``temperature=``...) are defaults of every call; a call's own keywords win.
    The type is compiled once, at decoration, so a schema the compiler refuses fails there.
    """

    def decorate(cls: type[T]) -> type[T]:
        if not isinstance(cls, type):
            raise ArgumentError("cls", cls, "a class: a Pydantic model, a dataclass or a TypedDict")
        llm.structure(cls, strict=options.get("strict", True))

        def generate(prompt: Any, **kwargs: Any) -> T:
            return llm.generate(prompt, cls, **{**options, **kwargs})

        async def agenerate(prompt: Any, **kwargs: Any) -> T:
            return await llm.agenerate(prompt, cls, **{**options, **kwargs})

        def stream(prompt: Any, **kwargs: Any) -> Any:
            return llm.stream(prompt, cls, **{**options, **kwargs})

        for method in (generate, agenerate, stream):
            method.__qualname__ = f"{cls.__qualname__}.{method.__name__}"
            method.__doc__ = f"{method.__name__.capitalize()} a {cls.__qualname__} with {llm!r} (constrain.structured)."
            setattr(cls, method.__name__, staticmethod(method))
        return cls

    return decorate


def llm_function(llm: Any, fn: Callable[..., Any], **options: Any) -> Callable[..., Any]:
    """``fn``'s docstring is a ``str.format`` template of its parameters (``{{``/``}}`` for literal braces); its
    return annotation is the output type. Calling the result fills the template with the call's arguments
    (defaults included) and returns ``llm.generate(prompt, output_type=<return annotation>, **options)``. The
    function's body is never run.
    """
    template = inspect.getdoc(fn)
    if not template:
        raise ArgumentError(fn.__qualname__, fn, "a docstring: it is the prompt template")
    signature = inspect.signature(fn)
    unknown = [name for name in template_fields(template) if name not in signature.parameters]
    if unknown:
        raise ArgumentError(
            fn.__qualname__, fn, f"a docstring whose fields name parameters; {{{unknown[0]}}} names none"
        )
    hints = typing.get_type_hints(fn, include_extras=True)
    if "return" not in hints:
        raise OutputTypeError("the function needs a return annotation: it is the output type", fn)
    returns = hints["return"]
    llm.structure(returns, strict=options.get("strict", True))  # refuse an unusable type at decoration

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        return llm.generate(template.format_map(bound.arguments), returns, **options)

    return call
