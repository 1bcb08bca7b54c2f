"""Optional dependencies. ``pip install constrain`` installs the engine and its compilers; each integration, the
embedded demo model and the real tokenizers need an extra (``pip install "constrain[transformers]"``, ...).
:func:`require` imports such a dependency, or raises :class:`MissingExtraError` naming the extra that installs it."""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType

from constrain.errors import ConstrainError, MissingExtraError

__all__ = ["EXTRAS", "MissingExtraError", "check_installed", "require"]

#: The extras of ``pyproject.toml`` and what each one is for.
EXTRAS = {
    "transformers": "Hugging Face transformers (torch, transformers, tokenizers)",
    "llamacpp": "llama.cpp through llama-cpp-python",
    "vllm": "vLLM (a CUDA build)",
    "server": "the OpenAI-compatible server (FastAPI, uvicorn)",
    "demo": "the embedded Gemma 3 270M model and the real tokenizers (Gemma 3, cl100k_base)",
    "all": "every extra that installs on a CPU machine",
}


def require(module: str, extra: str, *, feature: str | None = None) -> ModuleType:
    """Import ``module`` and return it; if it, or a module it imports, is not installed, raise
    :class:`MissingExtraError` naming ``extra``. ``feature`` names what needs it, for the message
    (e.g. ``"constrain.integrations.transformers"``)."""
    if extra not in EXTRAS:
        raise ConstrainError(f"unknown extra {extra!r}; the extras are {', '.join(EXTRAS)}")
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        raise MissingExtraError(module, extra, missing=e.name, feature=feature) from e


def check_installed(*modules: str, extra: str, feature: str | None = None) -> None:
    """Raise :class:`MissingExtraError` naming ``extra`` unless every one of ``modules`` can be imported; imports
    nothing (an integration checks this when it is imported, and imports the heavy module when it is used)."""
    if extra not in EXTRAS:
        raise ConstrainError(f"unknown extra {extra!r}; the extras are {', '.join(EXTRAS)}")
    for module in modules:
        if importlib.util.find_spec(module) is None:
            raise MissingExtraError(module, extra, feature=feature)
