"""Where derived artefacts (vocabularies, tries, converted weights) are kept between runs, the verified files they
are kept in, and a bounded in-memory cache for what is rebuilt within one."""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import struct
import tempfile
import threading
import weakref
import zlib
from collections import OrderedDict
from collections.abc import Callable, Hashable
from pathlib import Path
from typing import Any, BinaryIO, TypeVar

import numpy as np


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
# Damaged files already reported, by (path, inode, mtime, size): one that cannot be deleted is reported once.
_REPORTED: set[tuple[str, int, int, int]] = set()
logger = logging.getLogger("constrain")

# ------------------------------------------------------------------------------------------------ verified files

#: The first bytes of every verified cache file.
CACHE_MAGIC = b"constrain-cache\n"
#: The layout of the header below; a file of another version is treated as damaged (and rebuilt).
CACHE_FORMAT = 1
# magic, format, blake2b-128 of the owner, payload bytes, then the CRC-32 of the header's first fields and the
# payload. 48 bytes: a payload of int64 rows read in place stays aligned.
_HEADER = struct.Struct("<16sI16sQ")
_CHECKSUM = struct.Struct("<I")
HEADER_BYTES = _HEADER.size + _CHECKSUM.size


def _owner_digest(owner: str) -> bytes:
    return hashlib.blake2b(owner.encode("utf-8", "surrogatepass"), digest_size=16).digest()


def write_cache_file(path: Path, owner: str, *chunks: Any) -> bool:
    """Write ``chunks`` (bytes-like, concatenated) as the payload of a verified cache file for ``owner``, atomically
    (a temporary file in the same folder, then renamed over ``path``), readable by every user. False when the
    folder cannot be written: the caller keeps what it built in memory.

    ``owner`` names what the payload belongs to, all of it: the format of the payload, the vocabulary's
    fingerprint, the file's own key. A reader passes the owner it expects, so a file copied or renamed under
    another key, or written for another vocabulary or format, is refused rather than read."""
    views = [memoryview(c) for c in chunks]  # C-contiguous: written and summed as raw bytes
    length = sum(v.nbytes for v in views)
    head = _HEADER.pack(CACHE_MAGIC, CACHE_FORMAT, _owner_digest(owner), length)
    crc = zlib.crc32(head)
    for view in views:
        crc = zlib.crc32(view, crc)
    try:
        fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    except OSError:
        return False
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(head)
            handle.write(_CHECKSUM.pack(crc))
            for view in views:
                handle.write(view)
        os.chmod(tmp, CACHE_FILE_MODE)
        os.replace(tmp, path)
    except OSError:
        _unlink(tmp)
        return False
    return True


def open_cache_file(path: Path, owner: str, max_bytes: int | None = None) -> BinaryIO | None:
    """The file written by :func:`write_cache_file` for ``owner``, open at its payload once its header and checksum
    have passed; None when there is none. A damaged file (cut, zeroed, bytes changed, another owner's, unreadable,
    or a payload over ``max_bytes``) is reported once, deleted if possible, and read as missing, so the caller
    rebuilds it. The caller closes the file.

    The checksum is read in chunks, so a parser that reads the payload from the file (``np.load``) holds no copy
    of it. It is a CRC-32 (1.3 ms for 4.8 MB where blake2b takes 5.9 ms and sha256 3.1 ms, on the 2-core machine
    of BENCHMARKS.md): it detects damage, not forgery. A writer who means harm can recompute it, or change the file
    in place between the check and the read (constrain's writers never do, they replace files whole), so callers
    still check that every index in the payload is in range before a kernel reads it."""
    try:
        handle = open(path, "rb")  # noqa: SIM115 - handed to the caller open
    except FileNotFoundError:
        return None
    except OSError as exc:
        reject_cache_file(path, f"unreadable: {type(exc).__name__}: {exc}")
        return None
    stat = None
    try:
        stat = os.fstat(handle.fileno())
        reason = _damage(handle, stat.st_size, owner, max_bytes)
        if reason is None:
            handle.seek(HEADER_BYTES)
            return handle
    except (OSError, MemoryError) as exc:
        reason = f"unreadable: {type(exc).__name__}: {exc}"
    handle.close()
    reject_cache_file(path, reason, stat)
    return None


def read_cache_file(path: Path, owner: str, max_bytes: int | None = None) -> np.ndarray | None:
    """The payload of :func:`open_cache_file` (read-only uint8, 16-byte aligned for in-place views), or None."""
    handle = open_cache_file(path, owner, max_bytes)
    if handle is None:
        return None
    with handle:
        return np.frombuffer(handle.read(), dtype=np.uint8)


#: Bytes read at a time to check a payload's checksum.
_CHUNK = 1 << 18


def _damage(handle: BinaryIO, size: int, owner: str, max_bytes: int | None) -> str | None:
    """What is wrong with a verified file of ``size`` bytes, read from its start, or None."""
    if max_bytes is not None and size > HEADER_BYTES + max_bytes:
        return f"{size} bytes, more than such a file holds"
    head = handle.read(HEADER_BYTES)
    if len(head) < HEADER_BYTES:
        return f"{len(head)} bytes, shorter than its header"
    magic, version, digest, length = _HEADER.unpack_from(head)
    if magic != CACHE_MAGIC:
        return "not a constrain cache file (wrong magic bytes)"
    if version != CACHE_FORMAT:
        return f"cache format {version}, this version reads {CACHE_FORMAT}"
    if digest != _owner_digest(owner):
        return "written for another key or vocabulary"
    if length != size - HEADER_BYTES:
        return f"{size - HEADER_BYTES} payload bytes where its header says {length}"
    crc = zlib.crc32(head[: _HEADER.size])
    chunk = memoryview(bytearray(min(length, _CHUNK)))
    left = length
    while left:
        got = handle.readinto(chunk[: min(left, _CHUNK)])
        if not got:
            return f"cut while read ({length - left} of {length} payload bytes)"
        crc = zlib.crc32(chunk[:got], crc)
        left -= got
    if crc != _CHECKSUM.unpack_from(head, _HEADER.size)[0]:
        return "checksum mismatch"
    return None


def reject_cache_file(path: Path, reason: str, stat: os.stat_result | None = None) -> None:
    """Report a damaged cache file once through the ``constrain`` logger and delete it, so that the caller's
    rebuild replaces it. ``stat``, that of the file as it was read: a file another process has put in its place
    since is kept."""
    try:
        now = os.stat(path)
        if stat is not None and (now.st_ino, now.st_dev) != (stat.st_ino, stat.st_dev):
            return  # replaced since it was read: the new file is judged when it is read
        signature = (os.fspath(path), now.st_ino, now.st_mtime_ns, now.st_size)
    except OSError:
        signature = (os.fspath(path), 0, 0, 0)
    removed = _unlink(path)
    with _WARNED_LOCK:
        if signature in _REPORTED:
            return
        _REPORTED.add(signature)
    logger.warning(
        "constrain: the cache file %s is damaged (%s); it is %s and rebuilt",
        path,
        reason,
        "deleted" if removed else "left in place (it cannot be deleted)",
    )


def _unlink(path: Path | str) -> bool:
    try:
        os.unlink(path)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return True


#: Bytes that all of constrain's in-memory caches of one process may hold together (:class:`CacheBudget`); each
#: cache has its own bound besides. :func:`set_cache_budget` changes it.
DEFAULT_CACHE_BUDGET = 512 << 20


def _check_bytes(max_bytes: Any) -> int:
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 0:
        raise ValueError(f"max_bytes must be a number of bytes (an int, 0 or more), not {max_bytes!r}")
    return max_bytes


class CacheBudget:
    """Bytes that many :class:`BoundedCache` objects share: when their sum passes ``max_bytes``, entries go, least
    recently used first, whichever cache holds them. Each cache's own bound still holds.

    Entries come in two kinds. A *costly* cache's (automata, compiled structures: milliseconds each to build
    again) go only after the cheap ones (masks, walks and rule DFAs: microseconds each), as long as the cheap ones hold
    at least half the budget: a server that reads many texts keeps the automata its next compiles will need,
    rather than trading them for walks it can redo at once, and neither kind is starved of half the budget.

    Every cache joins the process's budget (:data:`PROCESS_BUDGET`) by default, so the memory constrain keeps
    between compiles (automata, rule DFAs, compiled structures, each structure's masks, lexical walks) levels off
    below one documented figure however many structures a server sees. A cache that is garbage-collected leaves
    the budget with its bytes."""

    def __init__(self, max_bytes: int):
        self.max_bytes = _check_bytes(max_bytes)
        #: Per kind (cheap, costly): (cache number, key) -> bytes, least recently used first.
        self._orders: tuple[OrderedDict[tuple[int, Hashable], int], ...] = (OrderedDict(), OrderedDict())
        self._kind_bytes = [0, 0]
        self._caches: dict[int, weakref.ref[BoundedCache]] = {}
        self._costly: dict[int, int] = {}  # cache number -> its kind (1: costly)
        self._held: dict[int, int] = {}  # cache number -> bytes
        self._keys: dict[int, set[Hashable]] = {}  # cache number -> its keys in the order
        self._bytes = 0
        self._next = 0
        self._forgotten: list[int] = []  # caches collected since the lock was last taken (see _forget)
        self._lock = threading.Lock()

    @property
    def used_bytes(self) -> int:
        """The bytes the member caches hold now."""
        with self._lock:
            self._settle_forgotten()
            return self._bytes

    def join(self, cache: Any, *, costly: bool = False) -> int:
        """Count ``cache``'s entries from now on; ``costly``: they take milliseconds to build again."""
        with self._lock:
            number = self._next
            self._next += 1
            # the reference's callback, rather than a weakref.finalize (several times its cost), tells of the
            # cache's end; the reference lives in _caches until that end is settled
            self._caches[number] = weakref.ref(cache, lambda _, number=number: self._forget(number))
            self._costly[number] = int(costly)
            self._held[number] = 0
            self._keys[number] = set()
        return number

    def _forget(self, number: int) -> None:
        """A member cache was collected: noted now, settled at the next call that takes the lock. The callback
        runs wherever the cache is freed, possibly inside :meth:`added` on this thread, whose lock it would wait
        on forever."""
        self._forgotten.append(number)

    def _settle_forgotten(self) -> None:
        """Drop what collected caches held (under the lock)."""
        while self._forgotten:
            number = self._forgotten.pop()
            self._caches.pop(number, None)
            kind = self._costly.pop(number, 0)
            self._bytes -= self._held.pop(number, 0)
            for key in self._keys.pop(number, ()):
                freed = self._orders[kind].pop((number, key), None)
                if freed is not None:
                    self._kind_bytes[kind] -= freed

    def _release(self, number: int, key: Hashable, nbytes: int) -> None:
        """Take an entry's bytes off the totals (under the lock), once it is out of its order."""
        keys = self._keys.get(number)
        if keys is not None:
            keys.discard(key)
        if number in self._held:
            self._held[number] -= nbytes
            self._bytes -= nbytes
            self._kind_bytes[self._costly[number]] -= nbytes

    def _evict_one(self, keep: tuple[int, Hashable] | None) -> tuple[int, Hashable] | None:
        """Take the next victim out (under the lock): the least recently used cheap entry while cheap ones hold
        half the budget or no costly one is left, else the least recently used costly one; never ``keep``."""
        cheap, costly = self._orders
        first = 0 if cheap and (self._kind_bytes[0] * 2 >= self.max_bytes or not costly) else 1
        for kind in (first, 1 - first):
            order = self._orders[kind]
            if not order:
                continue
            victim = next(iter(order))
            if victim == keep:  # put last, so alone in its kind
                continue
            freed = order.pop(victim)
            self._release(victim[0], victim[1], freed)
            return victim
        return None

    def added(self, number: int, key: Hashable, nbytes: int) -> None:
        """A cache put ``key``; evict across caches while over budget (the entry just put stays)."""
        victims: list[tuple[int, Hashable]] = []
        with self._lock:
            self._settle_forgotten()
            if number not in self._held:
                return
            kind = self._costly[number]
            order = self._orders[kind]
            old = order.pop((number, key), None)
            if old is not None:
                self._release(number, key, old)
            order[(number, key)] = nbytes
            self._keys[number].add(key)
            self._bytes += nbytes
            self._held[number] += nbytes
            self._kind_bytes[kind] += nbytes
            while self._bytes > self.max_bytes:
                victim = self._evict_one((number, key))
                if victim is None:
                    break
                victims.append(victim)
            refs = [(self._caches.get(v), k) for v, k in victims]
        for ref, victim_key in refs:  # outside the budget's lock: a cache never waits on it while holding its own
            cache = ref() if ref is not None else None
            if cache is not None:
                cache._drop(victim_key)

    def used(self, number: int, key: Hashable) -> None:
        with self._lock:
            order = self._orders[self._costly.get(number, 0)]
            if (number, key) in order:
                order.move_to_end((number, key))

    def removed(self, number: int, key: Hashable) -> None:
        with self._lock:
            freed = self._orders[self._costly.get(number, 0)].pop((number, key), None)
            if freed is not None:
                self._release(number, key, freed)

    def shrink(self) -> None:
        """Evict down to ``max_bytes`` now (after the bound was lowered)."""
        with self._lock:
            self._settle_forgotten()
            victims = []
            while self._bytes > self.max_bytes:
                victim = self._evict_one(None)
                if victim is None:
                    break
                victims.append((self._caches.get(victim[0]), victim[1]))
        for ref, key in victims:
            cache = ref() if ref is not None else None
            if cache is not None:
                cache._drop(key)


#: The budget every :class:`BoundedCache` joins unless given another.
PROCESS_BUDGET = CacheBudget(DEFAULT_CACHE_BUDGET)


def set_cache_budget(max_bytes: int) -> None:
    """Bound the bytes all of constrain's in-memory caches hold together (default :data:`DEFAULT_CACHE_BUDGET`,
    512 MiB); what is over goes at once, least recently used first."""
    PROCESS_BUDGET.max_bytes = _check_bytes(max_bytes)
    PROCESS_BUDGET.shrink()


class BoundedCache:
    """A thread-safe LRU map bounded in bytes: what each value costs is given when it is put. Its entries also
    count against ``budget`` (the process's :class:`CacheBudget` by default; None: none), which evicts them after
    cheaper ones when ``costly`` (see :class:`CacheBudget`)."""

    def __init__(self, max_bytes: int, *, budget: CacheBudget | None = PROCESS_BUDGET, costly: bool = False):
        self.max_bytes = max_bytes
        #: Whether its entries take milliseconds to build again: the budget evicts cheap entries first.
        self.costly = costly
        #: key -> (value, bytes, the key itself): a key equal to the one asked for is found by identity in the
        #: moves that follow a hit, rather than compared again (an expression key compares its whole tree).
        self._entries: OrderedDict[Hashable, tuple[Any, int, Hashable]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self._budget = budget
        #: The cache's number in the budget, given at its first entry (None until then): many caches (those of a
        #: structure never used) hold nothing in their whole life, and joining costs microseconds.
        self._number: int | None = None

    def get(self, key: Hashable) -> Any | None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return None
            key = entry[2]
            self._entries.move_to_end(key)
        if self._budget is not None:
            self._budget.used(self._number, key)
        return entry[0]

    def put(self, key: Hashable, value: Any, nbytes: int) -> None:
        evicted = []
        with self._lock:
            if self._number is None and self._budget is not None:
                self._number = self._budget.join(self, costly=self.costly)
            old = self._entries.pop(key, None)
            if old is not None:
                self._bytes -= old[1]
            self._entries[key] = (value, nbytes, key)
            self._bytes += nbytes
            while self._bytes > self.max_bytes and len(self._entries) > 1:
                gone, (_, freed, _) = self._entries.popitem(last=False)
                self._bytes -= freed
                evicted.append(gone)
        if self._budget is not None:
            for gone in evicted:
                self._budget.removed(self._number, gone)
            self._budget.added(self._number, key, nbytes)

    def reprice(self, key: Hashable, nbytes: int) -> None:
        """Count ``nbytes`` for ``key``'s entry from now on (an entry that grew since it was put), evicting as
        :meth:`put` does; nothing when ``key`` is not held (evicted already)."""
        with self._lock:
            entry = self._entries.get(key)
        if entry is not None:
            self.put(key, entry[0], nbytes)

    def pop(self, key: Hashable) -> Any | None:
        """Take ``key``'s value out (None when it is not held)."""
        with self._lock:
            entry = self._entries.pop(key, None)
            if entry is None:
                return None
            self._bytes -= entry[1]
        if self._budget is not None:
            self._budget.removed(self._number, entry[2])
        return entry[0]

    def _drop(self, key: Hashable) -> None:
        """Forget ``key`` (the budget evicted it)."""
        with self._lock:
            entry = self._entries.pop(key, None)
            if entry is not None:
                self._bytes -= entry[1]

    @property
    def nbytes(self) -> int:
        """The bytes its entries cost."""
        return self._bytes

    def clear(self) -> None:
        with self._lock:
            keys = list(self._entries)
            self._entries.clear()
            self._bytes = 0
        if self._budget is not None and self._number is not None:
            for key in keys:
                self._budget.removed(self._number, key)

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: Hashable) -> bool:
        """Whether ``key`` is held (its place in the order unchanged)."""
        with self._lock:
            return key in self._entries


_F = TypeVar("_F", bound=Callable[..., Any])


def memoized(max_bytes: int, cost: Callable[..., int]) -> Callable[[_F], _F]:
    """A per-process memo of a function of hashable positional arguments, as :func:`functools.lru_cache` keeps
    one, but bounded in bytes rather than entries (an automaton can take a hundred megabytes): ``cost(result,
    *args)`` estimates what an entry holds, and the least recently used go first. What raises is not kept. The
    wrapper's ``cache_clear()`` empties the memo, and its ``cached(*args)`` says whether it holds ``args``."""

    def decorate(function: _F) -> _F:
        cache = BoundedCache(max_bytes, costly=True)  # what is memoized is built in milliseconds

        @functools.wraps(function)
        def memo(*args: Hashable) -> Any:
            hit = cache.get(args)
            if hit is not None:
                return hit[0]
            result = function(*args)
            cache.put(args, (result,), cost(result, *args))  # in a tuple: a result of None is kept too
            return result

        memo.cache_clear = cache.clear  # type: ignore[attr-defined]
        memo.cached = lambda *args: args in cache  # type: ignore[attr-defined]
        return memo  # type: ignore[return-value]

    return decorate
