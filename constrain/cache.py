"""Where derived artefacts (vocabularies, tries, converted weights) are kept between runs, and a bounded
in-memory cache for what is rebuilt within one."""

from __future__ import annotations

import logging
import os
import tempfile
import threading
from collections import OrderedDict
from collections.abc import Hashable
from pathlib import Path
from typing import Any


def cache_dir(*parts: str) -> Path | None:
    """The cache folder (created on demand): ``$CONSTRAIN_CACHE_DIR``, else ``$XDG_CACHE_HOME/constrain``,
    else ``~/.cache/constrain``; ``parts`` name a sub-folder.

    None when that folder cannot be created or written (a read-only disk, a path that is a file): callers then keep
    what they build in memory only, and the ``constrain`` logger warns once per folder."""
    root = os.environ.get("CONSTRAIN_CACHE_DIR")
    if root:
        base = Path(root)
    else:
        base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "constrain"
    path = base.joinpath(*parts)
    try:
        path.mkdir(parents=True, exist_ok=True)
        writable = os.access(path, os.W_OK | os.X_OK)
    except OSError as exc:
        writable, reason = False, f"{type(exc).__name__}: {exc}"
    else:
        reason = "not writable"
    if writable:
        return path
    with _WARNED_LOCK:
        if path not in _WARNED:
            _WARNED.add(path)
            logger.warning(
                "constrain: the cache folder %s cannot be used (%s); keeping results in memory", path, reason
            )
    return None


def disk_dir(*parts: str) -> Path:
    """:func:`cache_dir`, or when it cannot be used, a folder of this process's own under the system's temporary
    folder: for what must be on disk to be used at all (converted tokenizers and model weights)."""
    path = cache_dir(*parts)
    if path is not None:
        return path
    global _PROCESS_DIR
    with _WARNED_LOCK:
        if _PROCESS_DIR is None:
            _PROCESS_DIR = Path(tempfile.mkdtemp(prefix="constrain-"))
    path = _PROCESS_DIR.joinpath(*parts)
    path.mkdir(parents=True, exist_ok=True)
    return path


_PROCESS_DIR: Path | None = None

#: Files in the cache folder are readable by every user (who may share a cache), writable by their owner.
CACHE_FILE_MODE = 0o644

_WARNED: set[Path] = set()
_WARNED_LOCK = threading.Lock()
logger = logging.getLogger("constrain")


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
