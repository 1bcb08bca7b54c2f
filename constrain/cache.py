"""Where derived artefacts (vocabularies, tries, converted weights) are kept between runs."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir(*parts: str) -> Path:
    """The cache folder (created on demand): ``$CONSTRAIN_CACHE_DIR``, else ``$XDG_CACHE_HOME/constrain``,
    else ``~/.cache/constrain``; ``parts`` name a sub-folder."""
    root = os.environ.get("CONSTRAIN_CACHE_DIR")
    if root:
        base = Path(root)
    else:
        base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "constrain"
    path = base.joinpath(*parts)
    path.mkdir(parents=True, exist_ok=True)
    return path
