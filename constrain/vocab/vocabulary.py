"""The vocabulary: token id -> bytes, which tokens a structure may match, the end-of-sequence ids, and the byte trie.

A :class:`Vocabulary` is built once per tokenizer (:meth:`Vocabulary.from_tokenizer`, ~0.6 s for Gemma 3's 262,144
tokens) and kept on disk in ``cache_dir("vocab")``, so later runs load it in about 0.1 s. Everything in it is a
numpy array, ready for numba.

How each kind of tokenizer is read, and which tokens are matchable: :mod:`constrain.vocab.readers`.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import zipfile
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from constrain.cache import CACHE_FILE_MODE, cache_dir
from constrain.errors import TokenError, VocabularyError
from constrain.vocab.readers import (
    FORMAT_VERSION,
    TokenBytes,
    _as_id,
    _read_tokenizer,
)
from constrain.vocab.trie import TokenTrie, _build_trie, _trie_arrays

# --------------------------------------------------------------------------------------------------- vocabulary


def _fingerprint(data: np.ndarray, offsets: np.ndarray, matchable: np.ndarray, eos_ids: np.ndarray) -> str:
    h = hashlib.sha256(b"constrain.Vocabulary/1\0")
    for arr, dtype in ((data, "u1"), (offsets, "<i8"), (matchable, "u1"), (eos_ids, "<i4")):
        a = np.ascontiguousarray(arr, dtype=dtype)
        h.update(len(a).to_bytes(8, "little"))
        h.update(a.data)
    return h.hexdigest()


class Vocabulary:
    """Token id -> bytes for one tokenizer, which ids a structure may match, the EOS ids and the byte trie.

    Attributes (all read-only by convention):

    - ``size``: number of token ids, ``max id + 1`` (ids without a token, holes, are allowed);
    - ``data`` (uint8) / ``offsets`` (int64, ``size + 1``): token ``i``'s bytes are ``data[offsets[i]:offsets[i+1]]``;
      non-matchable tokens have ``b""``;
    - ``matchable`` (bool, ``size``): False for special/control tokens, EOS, holes and empty tokens;
    - ``eos_ids`` (int32, sorted unique): the end-of-sequence ids (Gemma 3: 1 and 106);
    - ``fingerprint``: hex sha256 over data, offsets, matchable and eos_ids, identifying the vocabulary;
    - ``trie``: the :class:`TokenTrie` of the matchable tokens;
    - ``kind``: ``"byte_level"``, ``"sentencepiece"``, ``"tiktoken"`` or ``"synthetic"``;
    - ``special_names``: ``{id: text}`` of the non-matchable tokens that have a name (for messages only).

    See the module docstring for how bytes are read and which tokens are matchable.
    """

    __slots__ = (
        "size",
        "data",
        "offsets",
        "matchable",
        "eos_ids",
        "fingerprint",
        "trie",
        "kind",
        "special_names",
        "_blob",
    )

    def __init__(
        self,
        data: np.ndarray,
        offsets: np.ndarray,
        matchable: np.ndarray,
        eos_ids: np.ndarray,
        trie: TokenTrie,
        *,
        kind: str = "synthetic",
        special_names: dict[int, str] | None = None,
        fingerprint: str | None = None,
    ):
        self.data = np.ascontiguousarray(data, dtype=np.uint8)
        self.offsets = np.ascontiguousarray(offsets, dtype=np.int64)
        self.matchable = np.ascontiguousarray(matchable, dtype=np.bool_)
        self.eos_ids = np.ascontiguousarray(eos_ids, dtype=np.int32)
        self.size = int(self.offsets.shape[0] - 1)
        if self.size < 0 or self.matchable.shape != (self.size,):
            raise VocabularyError(
                f"inconsistent vocabulary arrays: offsets has {self.offsets.shape[0]} entries, "
                f"matchable has shape {self.matchable.shape}"
            )
        if self.eos_ids.size and (self.eos_ids.min() < 0 or self.eos_ids.max() >= self.size):
            raise VocabularyError(f"eos ids {self.eos_ids.tolist()} out of range 0..{self.size - 1}")
        self.trie = trie
        self.kind = kind
        self.special_names = dict(special_names or {})
        self._blob = self.data.tobytes()
        self.fingerprint = fingerprint or _fingerprint(self.data, self.offsets, self.matchable, self.eos_ids)
        for arr in (self.data, self.offsets, self.matchable, self.eos_ids, *_trie_arrays(trie)):
            arr.flags.writeable = False

    # ------------------------------------------------------------------------------------------ accessors

    def __len__(self) -> int:
        return self.size

    def __repr__(self) -> str:
        return (
            f"Vocabulary(kind={self.kind!r}, size={self.size:,}, matchable={int(self.matchable.sum()):,}, "
            f"eos_ids={self.eos_ids.tolist()}, fingerprint={self.fingerprint[:12]})"
        )

    def _check_id(self, token_id: Any) -> int:
        try:
            if isinstance(token_id, (bool, np.bool_)):
                raise TypeError
            i = int(np.int64(token_id)) if isinstance(token_id, np.integer) else token_id.__index__()
        except (TypeError, AttributeError):
            raise TokenError(f"token id must be an integer, got {type(token_id).__name__} {token_id!r}") from None
        if not 0 <= i < self.size:
            raise TokenError(f"token id {i} is out of range: this vocabulary has ids 0..{self.size - 1}")
        return i

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes of one token (``b""`` for special tokens and holes). Raises TokenError when out of range."""
        i = self._check_id(token_id)
        return self._blob[self.offsets[i] : self.offsets[i + 1]]

    def decode(self, ids: Iterable[int]) -> bytes:
        """The concatenated bytes of ``ids`` (special tokens contribute ``b""``). Raises TokenError for an id out of
        range or not an integer."""
        if isinstance(ids, (int, np.integer)):
            ids = [ids]
        arr = np.asarray(ids)
        if arr.size == 0:
            return b""
        if arr.ndim != 1 or arr.dtype.kind not in "iu":
            return b"".join([self.token_bytes(t) for t in list(ids)])  # checks each item, raises TokenError
        arr = arr.astype(np.int64, copy=False)
        bad = (arr < 0) | (arr >= self.size)
        if bad.any():
            raise TokenError(f"token id {int(arr[bad][0])} is out of range: this vocabulary has ids 0..{self.size - 1}")
        blob, off = self._blob, self.offsets
        return b"".join([blob[s:e] for s, e in zip(off[arr].tolist(), off[arr + 1].tolist())])

    def token_text(self, token_id: int) -> str:
        """A readable form of a token for messages: its bytes decoded with replacement, or its special name."""
        i = self._check_id(token_id)
        if i in self.special_names:
            return self.special_names[i]
        return self.token_bytes(i).decode("utf-8", errors="replace")

    # -------------------------------------------------------------------------------------------- builders

    @classmethod
    def from_token_bytes(
        cls,
        tokens: Sequence[bytes | None],
        *,
        eos_ids: Iterable[int],
        special_ids: Iterable[int] = (),
        kind: str = "synthetic",
        special_names: dict[int, str] | None = None,
    ) -> Vocabulary:
        """A vocabulary from each id's bytes (``None`` = hole). ``eos_ids`` and ``special_ids`` are never matchable;
        they may lie past the end of ``tokens`` (the vocabulary then grows to hold them)."""
        eos = sorted({_as_id(t, "eos id") for t in eos_ids})
        special = {_as_id(t, "special id") for t in special_ids}
        size = max([len(tokens), *(t + 1 for t in eos), *(t + 1 for t in special)])
        names = dict(special_names or {})
        byte_list: list[bytes] = [b""] * size
        blocked = special.union(eos)
        for i, tok in enumerate(tokens):
            if tok is None:
                continue
            if not isinstance(tok, (bytes, bytearray, memoryview)):
                raise VocabularyError(f"token {i} must be bytes or None, got {type(tok).__name__} {tok!r}")
            tok = bytes(tok)
            if i in blocked:
                if tok and i not in names:
                    names[i] = tok.decode("utf-8", errors="replace")
                continue
            byte_list[i] = tok
        return cls._from_byte_list(byte_list, np.asarray(eos, np.int32), kind=kind, special_names=names)

    @classmethod
    def _from_token_bytes(cls, t: TokenBytes) -> Vocabulary:
        return cls._assemble(t.size, t.ids, t.lengths, t.blob, t.eos, kind=t.kind, special_names=t.special_names)

    @classmethod
    def _assemble(
        cls,
        size: int,
        ids: np.ndarray,
        lengths: np.ndarray,
        blob: bytes,
        eos_ids: np.ndarray,
        *,
        kind: str,
        special_names: dict[int, str],
    ) -> Vocabulary:
        """From the matchable ``ids`` (ascending), their byte ``lengths`` and their bytes concatenated in that order."""
        ids = np.asarray(ids, np.int64)
        all_lengths = np.zeros(size, np.int64)
        all_lengths[ids] = lengths
        if int(all_lengths.sum()) != len(blob) or (ids.size and int(np.min(lengths)) <= 0):
            raise VocabularyError("internal error: token byte lengths do not add up")  # pragma: no cover
        offsets = np.zeros(size + 1, np.int64)
        np.cumsum(all_lengths, out=offsets[1:])
        matchable = np.zeros(size, np.bool_)
        matchable[ids] = True
        data = np.frombuffer(blob, np.uint8)
        trie = _build_trie(data, offsets, matchable)
        return cls(data, offsets, matchable, eos_ids, trie, kind=kind, special_names=special_names)

    @classmethod
    def _from_byte_list(
        cls, byte_list: Sequence[bytes], eos_ids: np.ndarray, *, kind: str, special_names: dict[int, str]
    ) -> Vocabulary:
        ids = [i for i, b in enumerate(byte_list) if b]
        toks = [byte_list[i] for i in ids]
        lengths = np.fromiter(map(len, toks), np.int64, count=len(toks))
        return cls._assemble(
            len(byte_list),
            np.asarray(ids, np.int64),
            lengths,
            b"".join(toks),
            eos_ids,
            kind=kind,
            special_names=special_names,
        )

    @classmethod
    def from_tokenizer(cls, tokenizer: Any, *, eos_ids: Iterable[int] | None = None, cache: bool = True) -> Vocabulary:
        """The vocabulary of a transformers tokenizer (fast or slow), a ``tokenizers.Tokenizer`` or a
        ``tiktoken.Encoding``; anything else raises VocabularyError, as does a tokenizer whose decoder says neither
        byte-level BPE nor SentencePiece style.

        Special / control tokens, EOS ids and holes are not matchable. Non-special added tokens are matchable text
        (Gemma: ``"\\n"`` 107, tab and newline runs, HTML tags), except the multimodal placeholders of
        :data:`NON_TEXT_ADDED_TOKENS` (Gemma's ``<start_of_image>``, ``<end_of_image>``, ``[multimodal]``).

        ``eos_ids=None`` takes the tokenizer's own end-of-sequence id(s) plus its end-of-turn tokens (Gemma 3:
        ``{1, 106}``; see the module docstring); otherwise exactly the given ids. With ``cache=True`` the built
        vocabulary (trie included) is kept in ``cache_dir("vocab")`` as one ``.npz``, under a key computed from
        the tokenizer's decoder, size, every added and special token, the EOS ids and a sample of the base
        vocabulary (all of it for tiktoken), and loaded from there next time (Gemma 3: ~0.1 s against ~0.6 s to
        build). A tokenizer whose base vocabulary was edited in place at ids outside that sample would hit a stale
        entry: pass ``cache=False`` for such hand-edited tokenizers, or clear ``cache_dir("vocab")``.
        """
        source = _read_tokenizer(tokenizer, eos_ids)
        if not cache:
            return cls._from_token_bytes(source.token_bytes())
        folder = cache_dir("vocab")
        if folder is None:
            return cls._from_token_bytes(source.token_bytes())
        path = folder / f"{source.key()}.npz"
        if path.exists():
            try:
                return cls.load(path)
            except VocabularyError:
                pass  # unreadable, corrupt or from another format version: rebuild and overwrite
        vocab = cls._from_token_bytes(source.token_bytes())
        try:
            vocab.save(path)
        except OSError:
            pass  # a read-only cache must not stop the build from being used
        return vocab

    # ------------------------------------------------------------------------------------------ save / load

    def save(self, path: str | os.PathLike) -> Path:
        """Write one uncompressed ``.npz`` (atomically: a reader never sees a half-written file)."""
        path = Path(path)
        if path.suffix != ".npz":
            path = path.with_name(path.name + ".npz")
        names = sorted(self.special_names.items())
        name_bytes = [s.encode("utf-8", errors="surrogatepass") for _, s in names]
        name_offsets = np.zeros(len(names) + 1, np.int64)
        np.cumsum([len(b) for b in name_bytes], out=name_offsets[1:])
        arrays = {
            "format_version": np.asarray(FORMAT_VERSION, np.int64),
            "kind": np.asarray(self.kind),
            "fingerprint": np.asarray(self.fingerprint),
            "data": self.data,
            "offsets": self.offsets,
            "matchable": self.matchable,
            "eos_ids": self.eos_ids,
            "special_ids": np.asarray([i for i, _ in names], np.int32),
            "special_names_data": np.frombuffer(b"".join(name_bytes), np.uint8),
            "special_names_offsets": name_offsets,
            "trie_node_byte": self.trie.node_byte,
            "trie_node_depth": self.trie.node_depth,
            "trie_node_next": self.trie.node_next,
            "trie_node_token_ptr": self.trie.node_token_ptr,
            "trie_token_ids": self.trie.token_ids,
        }
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "wb") as f:
                np.savez(f, **arrays)
            os.chmod(tmp, CACHE_FILE_MODE)
            os.replace(tmp, path)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
        return path

    @classmethod
    def load(cls, path: str | os.PathLike) -> Vocabulary:
        """Read a file written by :meth:`save`; the fingerprint is checked against the arrays."""
        try:
            with np.load(path, allow_pickle=False) as z:
                a = {k: z[k] for k in z.files}
        except (OSError, ValueError, EOFError, zipfile.BadZipFile) as e:
            raise VocabularyError(f"cannot read a vocabulary from {os.fspath(path)!r}: {e}") from e
        try:
            version = int(a["format_version"])
            if version != FORMAT_VERSION:
                raise VocabularyError(
                    f"{os.fspath(path)!r} holds vocabulary format {version}, this version reads {FORMAT_VERSION}"
                )
            trie = TokenTrie(
                a["trie_node_byte"],
                a["trie_node_depth"],
                a["trie_node_next"],
                a["trie_node_token_ptr"],
                a["trie_token_ids"],
            )
            n = trie.node_byte.shape[0]
            shapes_ok = (
                trie.node_byte.dtype == np.uint8
                and trie.node_depth.dtype == np.int32
                and trie.node_next.dtype == np.int32
                and trie.node_token_ptr.dtype == np.int32
                and trie.token_ids.dtype == np.int32
                and trie.node_depth.shape == (n,)
                and trie.node_next.shape == (n,)
                and trie.node_token_ptr.shape == (n + 1,)
                and trie.token_ids.shape == (int(a["matchable"].sum()),)
            )
            if not shapes_ok:
                raise VocabularyError(f"{os.fspath(path)!r} is corrupt: its trie arrays have the wrong shapes or types")
            blob = a["special_names_data"].tobytes()
            noff = a["special_names_offsets"].tolist()
            names = {
                int(i): blob[noff[k] : noff[k + 1]].decode("utf-8", errors="surrogatepass")
                for k, i in enumerate(a["special_ids"].tolist())
            }
            stored = str(a["fingerprint"])
            vocab = cls(
                a["data"], a["offsets"], a["matchable"], a["eos_ids"], trie, kind=str(a["kind"]), special_names=names
            )
        except KeyError as e:
            raise VocabularyError(f"{os.fspath(path)!r} is not a saved vocabulary: missing {e}") from e
        if vocab.fingerprint != stored:
            raise VocabularyError(
                f"{os.fspath(path)!r} is corrupt: its arrays hash to {vocab.fingerprint[:12]}, "
                f"the file says {stored[:12]}"
            )
        return vocab
