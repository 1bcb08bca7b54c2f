"""Which model a :class:`~constrain.generation.llm.LLM` runs: the embedded default, a transformers model, a local
folder, a GGUF file, or a llama-cpp-python ``Llama``."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Protocol

from constrain.decoding.loop import LogitsModel
from constrain.errors import ArgumentError, ConstrainError
from constrain.vocab.vocabulary import Vocabulary

#: Context window of a ``Llama`` that :class:`LLM` opens from a GGUF path.
GGUF_CONTEXT = 4096


class Backend(LogitsModel, Protocol):
    """A model for the decoding loop that also reads text: what :class:`LLM` needs."""

    vocab: Vocabulary

    def encode(self, text: str) -> list[int]: ...

    def tokenize(self, text: str) -> list[int]: ...

    def chat_template(self) -> str | None: ...

    def render_chat(self, messages: list[dict[str, Any]]) -> str: ...


def open_backend(model: Any = None, tokenizer: Any = None) -> Backend:
    """The backend for ``LLM(model, tokenizer)``."""
    if model is None:
        if tokenizer is not None:
            raise ArgumentError("tokenizer", tokenizer, "None when no model is given (the default model has its own)")
        from constrain.integrations.transformers_model import TransformersModel
        from constrain.models.gemma import load_default_model

        return TransformersModel(*load_default_model())
    if isinstance(model, (str, os.PathLike)):
        return _open_path(Path(model), tokenizer)
    if _is_llama(model):
        from constrain.integrations.llamacpp_model import LlamaCppModel

        if tokenizer is not None:
            raise ArgumentError("tokenizer", tokenizer, "None for a llama.cpp model (it has its own)")
        return LlamaCppModel(model)
    if all(hasattr(model, name) for name in ("prefill", "extend", "encode", "tokenize", "vocab")):
        return model  # already a backend
    if tokenizer is None:
        raise ArgumentError("tokenizer", tokenizer, "the model's tokenizer (a transformers model needs one)")
    from constrain.integrations.transformers_model import TransformersModel

    return TransformersModel(model, tokenizer)


def _is_llama(model: Any) -> bool:
    return any(cls.__module__.startswith("llama_cpp") and cls.__name__ == "Llama" for cls in type(model).__mro__)


def _open_path(path: Path, tokenizer: Any) -> Backend:
    """A local transformers folder (``config.json``) or a GGUF file; nothing is fetched from a model hub."""
    if path.is_file() and path.suffix.lower() == ".gguf":
        from constrain.extras import require

        llama_cpp = require("llama_cpp", "llamacpp", feature="a GGUF model")
        from constrain.integrations.llamacpp_model import LlamaCppModel

        return LlamaCppModel(llama_cpp.Llama(model_path=str(path), n_ctx=GGUF_CONTEXT, verbose=False))
    if path.is_dir() and (path / "config.json").is_file():
        from constrain.extras import require

        require("transformers", "transformers", feature="a transformers model folder")
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from constrain.integrations.transformers_model import TransformersModel

        try:
            model = AutoModelForCausalLM.from_pretrained(str(path), local_files_only=True)
            tokenizer = tokenizer or AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        except (OSError, ValueError) as exc:
            raise ConstrainError(f"cannot load a transformers model from {path}: {exc}") from exc
        model.eval()
        return TransformersModel(model, tokenizer)
    raise ArgumentError("model", str(path), "a GGUF file or a local transformers folder (with a config.json)")
