"""Optional dependencies: an integration imported without its extra names the extra to install."""

from __future__ import annotations

import subprocess
import sys

import pytest

from constrain.errors import ConstrainError, MissingExtraError
from constrain.extras import check_installed, require


def test_require_names_the_extra_of_a_missing_module():
    with pytest.raises(MissingExtraError, match=r'pip install "constrain\[transformers\]"') as info:
        require("no_such_module_here", "transformers", feature="a test")
    assert isinstance(info.value, ImportError) and isinstance(info.value, ConstrainError)
    assert info.value.extra == "transformers" and info.value.missing == "no_such_module_here"
    assert require("json", "transformers").dumps([1]) == "[1]"


def test_check_installed_imports_nothing():
    check_installed("json", extra="demo")
    with pytest.raises(MissingExtraError, match=r"constrain\[llamacpp\]"):
        check_installed("json", "no_such_module_here", extra="llamacpp")
    with pytest.raises(ConstrainError, match="unknown extra"):
        check_installed("json", extra="nope")


_HIDE = """
import importlib.util, sys
hidden = set(sys.argv[2].split(","))
real = importlib.util.find_spec
importlib.util.find_spec = lambda name, *a: None if name.split(".")[0] in hidden else real(name, *a)
for name in hidden:
    sys.modules[name] = None  # an import of it now fails as if it were not installed
try:
    __import__(sys.argv[1])
except ImportError as exc:
    print(type(exc).__name__, exc)
"""


@pytest.mark.parametrize(
    "module, hidden, extra",
    [
        ("constrain.integrations.transformers", "torch", "transformers"),
        ("constrain.integrations.transformers", "transformers", "transformers"),
        ("constrain.integrations.llamacpp", "llama_cpp", "llamacpp"),
    ],
)
def test_importing_an_integration_without_its_extra_names_the_extra(module, hidden, extra):
    out = subprocess.run([sys.executable, "-c", _HIDE, module, hidden], capture_output=True, text=True, check=True)
    assert out.stdout.startswith("MissingExtraError"), out.stdout + out.stderr
    assert f'pip install "constrain[{extra}]"' in out.stdout


def test_the_core_imports_without_any_extra():
    code = _HIDE.replace(
        "__import__(sys.argv[1])", "import constrain.compilers.api, constrain.runtime, constrain.kernels"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, "x", "torch,transformers,llama_cpp,vllm,tiktoken,gguf"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout == "", out.stdout + out.stderr
