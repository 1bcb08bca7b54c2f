"""Every script in examples/ runs as a user would run it (``python examples/NAME.py``) and says its output is valid.

Each runs in its own process on the embedded Gemma 3 270M, with one OpenMP thread (two threads that wait for each
other on a shared 2-core machine are slower than one).
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
SCRIPTS = sorted(EXAMPLES.glob("*.py"))


def _vllm_expected() -> str:
    """Without vLLM or without CUDA the engine cannot run: the example must say that it skipped the generation."""
    import torch

    engine = importlib.util.find_spec("vllm") is not None and torch.cuda.is_available()
    return "valid: vLLM's output" if engine else "SKIPPED the vLLM generation"


#: What each script prints besides "valid" when it did its job (a script missing here only needs "valid").
EXPECTED = {"vllm_plugin.py": _vllm_expected}
TIMEOUT_S = 120


def test_every_example_is_listed_in_the_readme():
    readme = (EXAMPLES / "README.md").read_text(encoding="utf-8")
    assert SCRIPTS
    assert [s.name for s in SCRIPTS if f"({s.name})" not in readme] == []


@pytest.mark.parametrize("script", SCRIPTS, ids=[s.name for s in SCRIPTS])
def test_example_runs(script: Path):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, str(script)],
        cwd=EXAMPLES.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    report = f"stdout:\n{done.stdout}\nstderr:\n{done.stderr[-4000:]}"
    assert done.returncode == 0, report
    last = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
    assert last.startswith("valid"), report
    expected = EXPECTED.get(script.name, lambda: "valid")()
    assert expected in done.stdout, report
