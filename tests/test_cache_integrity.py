"""Fault injection into the cache folder: a damaged, swapped or hostile cache file never changes a mask or crashes
the process. It is reported once through the ``constrain`` logger, deleted, and rebuilt.

Each test fills a cache folder of its own (the cl100k vocabulary and the lexical walks of a few JSON schemas), damages
it, then loads again as a new process would (the in-memory stores emptied) and compares every mask with those of a
run without any cache. The hostile cases, arrays out of range under a correct checksum, run in a child process, so a
kernel reading out of bounds fails the test instead of killing pytest.
"""

from __future__ import annotations

import io
import json
import logging
import os
import stat
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

import constrain
from constrain import cache
from constrain.cache import HEADER_BYTES, write_cache_file
from constrain.runtime import lexical
from constrain.runtime.lexical import LexicalMasks
from constrain.vocab.vocabulary import Vocabulary, _cache_owner, _fingerprint

#: (schema, text forced before the mask): masks inside strings, whose walks are large enough to be saved.
CASES = [
    ({"type": "string"}, '"ab'),
    ({"type": "string", "pattern": "^[a-z ]*$"}, '"ab c'),
    ({"type": "object", "additionalProperties": {"type": "string", "pattern": "^[A-Z0-9 ]+$"}}, '{"a":"B'),
    ({"type": "object", "properties": {"name": {"type": "string"}}}, '{"name":"x'),
]
ROOT = Path(__file__).resolve().parents[1]


def masks_of(tokenizer) -> list[np.ndarray]:
    """The mask after each case's text, computed as by a new process: the vocabulary read from the cache folder,
    the lexical walks from disk or walked again."""
    LexicalMasks._stores.clear()
    constrain.clear_compile_cache()
    return _masks(tokenizer, Vocabulary.from_tokenizer(tokenizer))


def _masks(tokenizer, vocab: Vocabulary) -> list[np.ndarray]:
    found = []
    for schema, text in CASES:
        matcher = constrain.compile(schema, vocab, cache=False).matcher()
        for token in tokenizer.encode(text):
            matcher.advance(token)
        found.append(np.array(matcher.mask()))
    return found


@pytest.fixture(scope="module")
def reference(cl100k) -> list[np.ndarray]:
    """The masks of a run with no cache at all: the vocabulary built, every walk walked."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(LexicalMasks, "_stores", {})
        mp.setattr(lexical, "cache_dir", lambda *parts: None)
        found = _masks(cl100k, Vocabulary.from_tokenizer(cl100k, cache=False))
    assert int(np.unpackbits(found[0].view(np.uint8)).sum()) > 90_000  # inside a string: nearly every token
    return found


@pytest.fixture
def folder(cl100k, tmp_path, monkeypatch) -> Path:
    """A cache folder of this test's own, filled by one run: the vocabulary and at least three walk files."""
    monkeypatch.setenv("CONSTRAIN_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(LexicalMasks, "_stores", {})
    monkeypatch.setattr(cache, "_WARNED", set())
    monkeypatch.setattr(cache, "_REPORTED", set())
    masks_of(cl100k)
    assert len(vocab_files(tmp_path)) == 1
    assert len(walk_files(tmp_path)) >= 3, "the cases' walks were not written"
    yield tmp_path
    constrain.clear_compile_cache()


def vocab_files(folder: Path) -> list[Path]:
    return sorted((folder / "vocab").glob("*.vocab"))


def walk_files(folder: Path) -> list[Path]:
    """The walk files, largest first."""
    return sorted(folder.glob("masks/*/*/*.walk"), key=lambda p: (-p.stat().st_size, p.name))


def damage_warnings(records: list[logging.LogRecord] | list[str]) -> list[str]:
    messages = [r if isinstance(r, str) else r.getMessage() for r in records]
    return [m for m in messages if "is damaged" in m]


def check_fresh_run(cl100k, reference, caplog, damaged: list[Path]) -> None:
    """A new run gives the reference masks, warns once per damaged file, naming it, and rewrites it good: a second
    run warns no more."""
    with caplog.at_level(logging.WARNING, logger="constrain"):
        got = masks_of(cl100k)
    for k, (a, b) in enumerate(zip(got, reference)):
        assert np.array_equal(a, b), f"case {k}: the mask differs from a run without cache"
    warnings = damage_warnings(caplog.records)
    assert len(warnings) == len(damaged), warnings
    for path in damaged:
        assert sum(str(path) in w for w in warnings) == 1, (path, warnings)
        assert path.exists(), "the damaged file was not rebuilt"
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="constrain"):
        again = masks_of(cl100k)
    assert not damage_warnings(caplog.records)
    assert all(np.array_equal(a, b) for a, b in zip(again, reference))


def test_cache_files_are_written_whole_and_readable_by_every_user(folder):
    files = [p for p in folder.rglob("*") if p.is_file()]
    assert set(files) == {*vocab_files(folder), *walk_files(folder)}  # no temporary file left behind
    for path in files:
        assert path.read_bytes()[:16] == cache.CACHE_MAGIC
        assert stat.S_IMODE(path.stat().st_mode) == cache.CACHE_FILE_MODE


# ------------------------------------------------------------------------------------------------ accidental damage


def truncate_to(size: int | Callable[[int], int]) -> Callable[[Path], None]:
    def fault(path: Path) -> None:
        data = path.read_bytes()
        path.write_bytes(data[: size(len(data)) if callable(size) else size])

    return fault


def zero_fill(path: Path) -> None:
    path.write_bytes(bytes(path.stat().st_size))


#: The bytes of a cl100k walk's mask words (100,277 tokens), which end its file (after its pop ranges).
WORDS_BYTES = 4 * ((100_277 + 31) // 32)


def flip_at(where: Callable[[int], int]) -> Callable[[Path], None]:
    """Flip one byte, at ``where(file size)``."""

    def fault(path: Path) -> None:
        data = bytearray(path.read_bytes())
        data[where(len(data))] ^= 0x5A
        path.write_bytes(bytes(data))

    return fault


#: Each fault, applied to a walk file and to the vocabulary's (where the payload is an .npz).
FAULTS = {
    "truncated to half": truncate_to(lambda n: n // 2),
    "truncated to its header": truncate_to(HEADER_BYTES),
    "truncated inside its header": truncate_to(11),
    "emptied": truncate_to(0),
    "zero-filled": zero_fill,
    "flipped in the magic": flip_at(lambda n: 3),
    "flipped in the format": flip_at(lambda n: 16),
    "flipped in the owner": flip_at(lambda n: 25),
    "flipped in the length": flip_at(lambda n: 38),
    "flipped in the checksum": flip_at(lambda n: 45),
    "flipped in the payload's first byte": flip_at(lambda n: HEADER_BYTES),
    "flipped in the payload, in a walk's pop ranges": flip_at(lambda n: HEADER_BYTES + 13),
    "flipped in the payload, in a walk's mask words": flip_at(lambda n: n - WORDS_BYTES // 3),
    "flipped in the last byte": flip_at(lambda n: n - 1),
}


@pytest.mark.parametrize("fault", list(FAULTS))
def test_a_damaged_walk_file_is_rebuilt(cl100k, reference, folder, caplog, fault):
    target = walk_files(folder)[0]
    assert target.stat().st_size > HEADER_BYTES + WORDS_BYTES + 24, "the walk has no pop ranges to damage"
    FAULTS[fault](target)
    check_fresh_run(cl100k, reference, caplog, [target])


def test_walk_files_swapped_between_keys_are_refused(cl100k, reference, folder, caplog):
    a, b = walk_files(folder)[:2]
    tmp = a.with_suffix(".swap")
    a.rename(tmp)
    b.rename(a)
    tmp.rename(b)
    check_fresh_run(cl100k, reference, caplog, [a, b])


def test_a_walk_file_of_another_vocabulary_is_refused(cl100k, reference, folder, caplog):
    """A walk file under its own key, but written for another vocabulary: the owner names the fingerprint too."""
    target = walk_files(folder)[0]
    payload = target.read_bytes()[HEADER_BYTES:]
    assert write_cache_file(target, f"constrain.LexicalMasks/{LexicalMasks.FORMAT}/{'0' * 64}/{target.stem}", payload)
    check_fresh_run(cl100k, reference, caplog, [target])


@pytest.mark.parametrize("fault", list(FAULTS))
def test_a_damaged_vocabulary_file_is_rebuilt(cl100k, reference, folder, caplog, fault):
    (target,) = vocab_files(folder)
    FAULTS[fault](target)
    check_fresh_run(cl100k, reference, caplog, [target])


def test_vocabulary_files_swapped_between_keys_are_refused(cl100k, reference, folder, caplog):
    """Two vocabularies of one tokenizer (other end-of-sequence ids), each file moved under the other's key."""
    (default,) = vocab_files(folder)
    other = Vocabulary.from_tokenizer(cl100k, eos_ids=[100_276])
    (other_path,) = set(vocab_files(folder)) - {default}
    parked = default.with_suffix(".swap")
    default.rename(parked)
    other_path.rename(default)
    parked.rename(other_path)
    with caplog.at_level(logging.WARNING, logger="constrain"):
        again = Vocabulary.from_tokenizer(cl100k, eos_ids=[100_276])
    assert again.fingerprint == other.fingerprint
    warnings = damage_warnings(caplog.records)
    assert len(warnings) == 1 and str(other_path) in warnings[0], warnings
    caplog.clear()
    check_fresh_run(cl100k, reference, caplog, [default])


def test_a_damaged_file_that_cannot_be_deleted_is_reported_once(cl100k, reference, folder, caplog, monkeypatch):
    """A shared cache folder this user cannot write: the damaged file stays, and each process reports it once."""
    target = walk_files(folder)[0]
    zero_fill(target)
    monkeypatch.setattr(cache, "_unlink", lambda path: False)
    monkeypatch.setattr(lexical, "write_cache_file", lambda *args: False)
    with caplog.at_level(logging.WARNING, logger="constrain"):
        first = masks_of(cl100k)
        second = masks_of(cl100k)
    assert all(np.array_equal(a, b) for a, b in zip(first + second, reference + reference))
    warnings = damage_warnings(caplog.records)
    assert len(warnings) == 1 and str(target) in warnings[0] and "cannot be deleted" in warnings[0], warnings
    assert target.read_bytes() == bytes(target.stat().st_size)


def test_an_unreadable_cache_file_is_rebuilt(cl100k, reference, folder, caplog, monkeypatch):
    target = walk_files(folder)[0]
    real_open = open

    def failing_open(path, *args, **kwargs):
        if Path(path) == target:
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(cache, "open", failing_open, raising=False)
    with caplog.at_level(logging.WARNING, logger="constrain"):
        got = masks_of(cl100k)
    assert all(np.array_equal(a, b) for a, b in zip(got, reference))
    warnings = damage_warnings(caplog.records)
    assert len(warnings) == 1 and str(target) in warnings[0] and "Permission denied" in warnings[0], warnings


# ------------------------------------------------------------------------------------- hostile files, in a child


CHILD = """
import json, logging, sys
from pathlib import Path
import numpy as np
from constrain.models.tokenizers import load_cl100k
from tests import test_cache_integrity as t
messages = []
handler = logging.Handler()
handler.emit = lambda record: messages.append(record.getMessage())
logging.getLogger("constrain").addHandler(handler)
kind, target, want = sys.argv[1], Path(sys.argv[2]), np.load(sys.argv[3])
changes = t.HOSTILE_WALKS if kind == "walk" else t.HOSTILE_VOCABS
tokenizer = load_cl100k()
for name, change in changes.items():
    if kind == "walk":
        t.rewrite_walk(target, t.Vocabulary.from_tokenizer(tokenizer), change)
    else:
        t.rewrite_vocab(target, change)
    messages.clear()
    print(json.dumps({"started": name}), flush=True)
    got = t.masks_of(tokenizer)
    same = [bool(np.array_equal(g, want[f"m{k}"])) for k, g in enumerate(got)]
    print(json.dumps({"name": name, "same": same, "log": messages, "rebuilt": target.exists()}), flush=True)
"""


def run_child(kind: str, target: Path, folder: Path, reference: list[np.ndarray]) -> list[dict]:
    """In a new process, each hostile change of ``kind`` in turn: the file rewritten, then the masks computed as
    by a new process. Its return code must be 0 (a kernel reading out of bounds ends it with SIGSEGV or SIGABRT)."""
    want = folder / "reference.npz"
    np.savez(want, **{f"m{k}": m for k, m in enumerate(reference)})
    env = dict(os.environ, CONSTRAIN_CACHE_DIR=str(folder), PYTHONPATH=str(ROOT))
    done = subprocess.run(
        [sys.executable, "-c", CHILD, kind, str(target), str(want)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    started = [line["started"] for line in lines if "started" in line]
    assert done.returncode == 0, (
        f"the child process ended with {done.returncode} during {started[-1:]}:\n{done.stderr[-3000:]}"
    )
    return [line for line in lines if "name" in line]


def check_hostile(results: list[dict], names: list[str], target: Path) -> None:
    """Each change gave the reference masks, one warning naming the file, and the file rebuilt."""
    assert [r["name"] for r in results] == names
    for r in results:
        warnings = damage_warnings(r["log"])
        assert all(r["same"]), r
        assert len(warnings) == 1 and str(target) in warnings[0], r
        assert r["rebuilt"], r


def rewrite_walk(path: Path, vocab: Vocabulary, change: Callable[[np.ndarray, np.ndarray], tuple]) -> None:
    """Rewrite a walk file with ``change(words, ranges)``, under a correct header and checksum: a writer who means
    harm, or a bug in another version that writes the same format."""
    payload = np.frombuffer(path.read_bytes()[HEADER_BYTES:], dtype=np.uint8)
    cut = payload.size - 4 * ((vocab.size + 31) // 32)
    ranges = payload[:cut].view(np.int64).reshape(-1, 3).copy()
    words = payload[cut:].view(np.uint32).copy()
    assert len(ranges), "the walk has no pop ranges to damage"
    words, ranges = change(words, ranges)
    owner = f"constrain.LexicalMasks/{LexicalMasks.FORMAT}/{vocab.fingerprint}/{path.stem}"
    assert write_cache_file(path, owner, np.ascontiguousarray(ranges, dtype=np.int64), words)


def _set(column: int, value: int) -> Callable:
    def change(words, ranges):
        ranges[len(ranges) // 2, column] = value
        return words, ranges

    return change


def _leaf_range(words, ranges):
    """A row below a trie node without children (no walk records one)."""
    return words, np.vstack([ranges, [[2, 2, 1]]])


def _repeated_range(words, ranges):
    return words, np.vstack([ranges] + [ranges[:1]] * 64)


def _past_the_vocabulary(words, ranges):
    words[-1] |= np.uint32(1) << np.uint32(31)  # id 100,287: past the last of 100,277
    return words, ranges


def _special_token(words, ranges):
    eos = 100_257  # <|endoftext|>: in the vocabulary, never in the trie
    words[eos >> 5] |= np.uint32(1) << np.uint32(eos & 31)
    return words, ranges


HOSTILE_WALKS = {
    "first node huge": _set(0, 2**62),
    "first node negative": _set(0, -(2**40)),
    "first node zero": _set(0, 0),
    "end node huge": _set(1, 2**31 + 7),
    "end node before the start": _set(1, 3),
    "depth huge": _set(2, 10**9),
    "depth negative": _set(2, -1),
    "a leaf's range": _leaf_range,
    "a range repeated": _repeated_range,
    "a token past the vocabulary": _past_the_vocabulary,
    "a special token": _special_token,
}


def test_hostile_walk_files_are_refused_in_a_fresh_process(cl100k, reference, folder):
    target = walk_files(folder)[0]
    check_hostile(run_child("walk", target, folder, reference), list(HOSTILE_WALKS), target)


def rewrite_vocab(path: Path, change: Callable[[dict[str, np.ndarray]], None]) -> None:
    """Rewrite the vocabulary file with ``change`` applied to its arrays, its fingerprint recomputed, under a
    correct header and checksum."""
    with np.load(io.BytesIO(path.read_bytes()[HEADER_BYTES:]), allow_pickle=False) as z:
        arrays = {k: z[k].copy() for k in z.files}
    change(arrays)
    arrays["fingerprint"] = np.asarray(
        _fingerprint(arrays["data"], arrays["offsets"], arrays["matchable"], arrays["eos_ids"])
    )
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    assert write_cache_file(path, _cache_owner(path.stem), buffer.getbuffer())


def _at(name: str, index: int, value: int) -> Callable[[dict[str, np.ndarray]], None]:
    def change(arrays):
        arrays[name][index] = value

    return change


def _skip_a_sibling(arrays):
    """A leaf's node_next moved one node on, past its sibling (a leaf too): every bound holds, only the sum of
    the subtrees' sizes is wrong."""
    depth, nxt = arrays["trie_node_depth"], arrays["trie_node_next"]
    i = np.arange(len(depth) - 2)
    (found,) = np.nonzero(
        (nxt[i] == i + 1) & (depth[i + 1] == depth[i]) & (nxt[i + 1] == i + 2) & (depth[i + 2] <= depth[i])
    )
    nxt[found[len(found) // 2]] += 1


def _int64_depths(arrays):
    arrays["trie_node_depth"] = arrays["trie_node_depth"].astype(np.int64)


HOSTILE_VOCABS = {
    "node_next past the trie": _at("trie_node_next", 5, 2**31 - 1),
    "node_next backwards": _at("trie_node_next", 1000, 3),
    "node_next into its own subtree": _at("trie_node_next", 0, 2),
    "node_next past a sibling": _skip_a_sibling,
    "node depth jumping": _at("trie_node_depth", 10, 100),
    "node depth zero": _at("trie_node_depth", 10, 0),
    "token id huge": _at("trie_token_ids", 7, 2**30),
    "token id negative": _at("trie_token_ids", 7, -3),
    "token id repeated": _at("trie_token_ids", 7, 8),
    "token pointer falling": _at("trie_node_token_ptr", 1000, 0),
    "token pointer past the tokens": _at("trie_node_token_ptr", 1000, 2**31 - 1),
    "offset past the bytes": _at("offsets", 500, 2**40),
    "offset negative": _at("offsets", 500, -(2**62)),
    "trie depths as int64": _int64_depths,
}


def test_hostile_vocabulary_files_are_refused_in_a_fresh_process(cl100k, reference, folder):
    (target,) = vocab_files(folder)
    check_hostile(run_child("vocab", target, folder, reference), list(HOSTILE_VOCABS), target)
