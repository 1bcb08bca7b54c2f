"""Where derived artefacts (vocabularies, tries, converted weights) are kept between runs, and a bounded
in-memory cache for what is rebuilt within one."""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Hashable
from pathlib import Path
from typing import Any


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


class BoundedCache:
    """A thread-safe LRU map bounded in bytes: what each value costs is given when it is put."""

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self._entries: OrderedDict[Hashable, tuple[Any, int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, key: Hashable) -> Any | None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return None
            self._entries.move_to_end(key)
            return entry[0]

    def put(self, key: Hashable, value: Any, nbytes: int) -> None:
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._bytes -= old[1]
            self._entries[key] = (value, nbytes)
            self._bytes += nbytes
            while self._bytes > self.max_bytes and len(self._entries) > 1:
                _, (_, freed) = self._entries.popitem(last=False)
                self._bytes -= freed

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._bytes = 0

    def __len__(self) -> int:
        return len(self._entries)
