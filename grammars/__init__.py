"""Bundled grammars, shipped inside the wheel as the package ``constrain.grammars``.

``load("json.lark")`` returns a grammar's text for :func:`constrain.compile_lark` or, for ``.gbnf`` files,
:func:`constrain.compile_gbnf`.
"""

from __future__ import annotations

from importlib.resources import files


def names() -> list[str]:
    """The file names of the bundled grammars."""
    return sorted(p.name for p in files(__name__).iterdir() if p.name.endswith((".lark", ".gbnf")))


def load(name: str) -> str:
    """The text of the bundled grammar ``name``, a file name such as ``"json.lark"`` or ``"json.gbnf"``."""
    if name not in names():
        raise ValueError(f"no bundled grammar {name!r}; the bundled ones are {names()}")
    return (files(__name__) / name).read_text(encoding="utf-8")
