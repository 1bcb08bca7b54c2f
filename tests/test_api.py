"""The public surface: every exported name resolves, and importing the package stays light."""

from __future__ import annotations

import subprocess
import sys

import constrain


def test_every_exported_name_resolves():
    for name in constrain.__all__:
        assert getattr(constrain, name) is not None, name


def test_import_is_light():
    code = "import sys, constrain; print(sorted(m for m in ('numba', 'torch', 'transformers') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
