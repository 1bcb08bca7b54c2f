"""The vocabulary: token id -> bytes, which tokens a structure may match, the end-of-sequence ids, and the byte trie.

A :class:`Vocabulary` is built once per tokenizer (:meth:`Vocabulary.from_tokenizer`, ~0.6 s for Gemma 3's 262,144
tokens) and kept on disk in ``cache_dir("vocab")``, so later runs load it in about 0.1 s. Everything in it is a
numpy array, ready for numba.

How a token's bytes are read, by kind of tokenizer (the kind is read from the tokenizer's decoder, never guessed):

- ``byte_level`` (GPT-2, Llama 3, Qwen; decoder ``ByteLevel``): tokens are spelled in the GPT-2 byte-to-unicode
  alphabet (``Ġ`` is a space); each character maps back to its byte. A token with a character outside that
  alphabet (an added token such as ``"hi there"``) is its UTF-8, exactly as the ``tokenizers`` decoder does.
- ``sentencepiece`` (Llama 2, Gemma; decoder ``Replace("▁", " ")`` or ``Metaspace``, usually with
  ``ByteFallback``): ``▁`` (U+2581) is a space, ``<0xNN>`` is the single byte NN when the tokenizer has byte
  fallback, any other text is its UTF-8.
- ``tiktoken``: ``_mergeable_ranks`` gives the exact bytes, ``_special_tokens`` are special, ids in neither are holes.

Which tokens are *matchable* (a structure may emit them for their bytes):

- never: special and control tokens (added tokens marked special, ``all_special_ids``, SentencePiece control /
  unknown / unused pieces, tiktoken special tokens), the end-of-sequence ids, holes (ids with no token), and
  tokens with no bytes. They keep ``b""`` as their bytes, so :meth:`Vocabulary.decode` skips them; their text is
  kept in :attr:`Vocabulary.special_names` for messages.
- Gemma's non-special added tokens (SentencePiece "user-defined" pieces: ``"\\n"`` (107) and the other runs of
  newlines, runs of tabs, runs of spaces, HTML tags such as ``<table>`` or ``</s>``) ARE matchable, with their
  literal text as bytes. The tokenizer emits them whenever the text contains them (``"\\n"`` is always token 107)
  and decodes them back to that text, so a structure must be able to read them: without them, tokenised valid
  output such as ``"a\\nb"`` or a JSON string holding ``<b>`` would be rejected.
- Exception: the multimodal placeholders in :data:`NON_TEXT_ADDED_TOKENS` (Gemma's ``[multimodal]``,
  ``<start_of_image>``, ``<end_of_image>``) are not matchable although they are not marked special. They mark
  where image embeddings go, not text a model should write; their bytes stay reachable through ordinary tokens
  (``<``, ``start``, ...), so excluding them costs a structure nothing it could express.

End of sequence (``eos_ids=None``): the tokenizer's own EOS id(s), plus the end-of-turn tokens of
:data:`END_OF_TURN_TOKENS` when the vocabulary has them as special tokens (Gemma's ``<end_of_turn>`` 106, Llama 3's
``<|eot_id|>``, Qwen's ``<|im_end|>``): chat models stop on them, and a structure allows EOS only where it accepts,
so an extra end token can only end a finished output. Gemma 3 gives ``{1, 106}``. A raw ``tokenizers.Tokenizer``
carries no EOS setting: its EOS is the first special token named in :data:`EOS_TOKEN_NAMES`; pass ``eos_ids`` when
there is none. EOS ids are never matchable (EOS is allowed when the structure accepts, not for its bytes).

Sequence-level decoder steps (``Strip`` of the first leading space, ``Metaspace`` prepend schemes) are not part of a
single token's bytes and are ignored: a token's bytes are what it contributes in the middle of a text.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import zipfile
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np
from numba import njit

from constrain.cache import cache_dir
from constrain.errors import TokenError, VocabularyError

__all__ = [
    "Vocabulary",
    "TokenTrie",
    "bytes_to_unicode",
    "EOS_TOKEN_NAMES",
    "END_OF_TURN_TOKENS",
    "NON_TEXT_ADDED_TOKENS",
]

#: Bump when the saved layout or the byte-extraction rules change: it is part of the cache key and of each file.
FORMAT_VERSION = 1

#: At most this many base-vocabulary tokens are read to compute a cache key (see ``_Source``).
KEY_SAMPLE = 32768
#: Names a raw ``tokenizers.Tokenizer``'s end-of-sequence token may have (the first special one found is used).
EOS_TOKEN_NAMES = ("<eos>", "</s>", "<|endoftext|>", "<|end_of_text|>")
#: Special tokens that also end a sequence by default when the vocabulary has them (chat end-of-turn markers).
END_OF_TURN_TOKENS = ("<end_of_turn>", "<|eot_id|>", "<|im_end|>")
#: Added tokens that are not marked special but are placeholders for other modalities, never text: not matchable.
NON_TEXT_ADDED_TOKENS = frozenset({"[multimodal]", "<start_of_image>", "<end_of_image>"})

_SPIECE_SPACE = "\u2581"


def bytes_to_unicode() -> dict[int, str]:
    """The GPT-2 byte-to-unicode alphabet: printable latin-1 bytes stand for themselves, the 68 others (controls,
    space, 0x7F-0xA0, 0xAD) are shifted to U+0100 onwards in byte order, so ``Ġ`` (U+0120) is the space."""
    keep = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table = {b: chr(b) for b in keep}
    shifted = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(0x100 + shifted)
            shifted += 1
    return table


_BYTE_TO_CHAR = bytes_to_unicode()
# str.translate tables: alphabet char -> the latin-1 char of its byte; and "delete every alphabet char".
_ALPHABET_TO_LATIN1 = {ord(c): chr(b) for b, c in _BYTE_TO_CHAR.items()}
_DELETE_ALPHABET = {ord(c): None for c in _BYTE_TO_CHAR.values()}


# --------------------------------------------------------------------------------------------------------- trie


@dataclass(frozen=True, eq=False)
class TokenTrie:
    """The byte trie of all matchable tokens, packed in numpy arrays.

    Nodes (the root excluded) are in preorder with children sorted by byte. Node ``i`` is reached from its parent
    by byte ``node_byte[i]``; it is ``node_depth[i]`` bytes deep (1 for children of the root); ``node_next[i]`` is
    the first node after its whole subtree, so a walk skips a rejected subtree in O(1). The tokens whose bytes end
    exactly at node ``i`` are ``token_ids[node_token_ptr[i]:node_token_ptr[i + 1]]`` (ascending; several ids can
    share bytes, e.g. Gemma's ``<0x41>`` and ``A``). Every matchable token appears exactly once in ``token_ids``.
    """

    node_byte: np.ndarray  # uint8[N]
    node_depth: np.ndarray  # int32[N]
    node_next: np.ndarray  # int32[N]
    node_token_ptr: np.ndarray  # int32[N + 1]
    token_ids: np.ndarray  # int32[M]

    @property
    def num_nodes(self) -> int:
        return int(self.node_byte.shape[0])

    @cached_property
    def max_depth(self) -> int:
        """The length of the longest token, in bytes."""
        return int(self.node_depth.max()) if self.num_nodes else 0

    @cached_property
    def node_key(self) -> np.ndarray:
        """``(node_depth << 8) | node_byte`` as int32: one load per node in the mask walk instead of two."""
        key = (self.node_depth.astype(np.int32) << 8) | self.node_byte
        key.flags.writeable = False
        return key

    @cached_property
    def root_children(self) -> np.ndarray:
        """int32[256]: the node of each first byte (-1 where no token starts with it). A walk that knows which
        first bytes its state accepts jumps to those subtrees instead of stepping over every child of the root,
        which are spread over the whole node array (a cache miss each)."""
        children = np.full(256, -1, dtype=np.int32)
        first = np.flatnonzero(self.node_depth == 1)
        children[self.node_byte[first]] = first
        children.flags.writeable = False
        return children

    def node_path(self, i: int) -> bytes:
        """The bytes spelled from the root to node ``i`` (a debugging aid: each ancestor is the last node before
        it one level up)."""
        i = int(i)
        if not 0 <= i < self.num_nodes:
            raise IndexError(f"node {i} is out of range 0..{self.num_nodes - 1}")
        depth = self.node_depth[: i + 1]
        out = bytearray(int(depth[i]))
        j = i
        for d in range(len(out), 0, -1):
            if d < len(out):
                j = int(np.flatnonzero(depth[:j] == d)[-1])
            out[d - 1] = self.node_byte[j]
        return bytes(out)

    def __repr__(self) -> str:
        return f"TokenTrie(nodes={self.num_nodes:,}, tokens={self.token_ids.shape[0]:,})"


@njit(cache=True)
def _prefix_keys(data, offsets, ids):
    """Each token's first 8 bytes as a big-endian integer, zero-padded: sorting by it sorts by bytes up to ties."""
    m = ids.shape[0]
    keys = np.empty(m, np.uint64)
    for k in range(m):
        s = offsets[ids[k]]
        length = offsets[ids[k] + 1] - s
        key = np.uint64(0)
        for j in range(8):
            key = key << np.uint64(8)
            if j < length:
                key = key | np.uint64(data[s + j])
        keys[k] = key
    return keys


@njit(cache=True)
def _bytes_less(data, offsets, a, b):
    """Token ``a``'s bytes sort before token ``b``'s, given equal first 8 bytes (ties: the smaller id first)."""
    sa = offsets[a]
    la = offsets[a + 1] - sa
    sb = offsets[b]
    lb = offsets[b + 1] - sb
    for j in range(min(8, la, lb), min(la, lb)):
        if data[sa + j] != data[sb + j]:
            return data[sa + j] < data[sb + j]
    if la != lb:
        return la < lb
    return a < b


@njit(cache=True)
def _sort_run(data, offsets, order, lo, hi, tmp):
    """Sort ``order[lo:hi]`` (tokens with equal prefix keys) by their full bytes: insertion or merge sort."""
    if hi - lo <= 32:
        for i in range(lo + 1, hi):
            t = order[i]
            j = i - 1
            while j >= lo and _bytes_less(data, offsets, t, order[j]):
                order[j + 1] = order[j]
                j -= 1
            order[j + 1] = t
        return
    width = 1
    n = hi - lo
    src = order[lo:hi].copy()
    dst = tmp[:n]
    while width < n:
        for a in range(0, n, 2 * width):
            mid = min(a + width, n)
            end = min(a + 2 * width, n)
            i = a
            j = mid
            k = a
            while i < mid and j < end:
                if _bytes_less(data, offsets, src[j], src[i]):
                    dst[k] = src[j]
                    j += 1
                else:
                    dst[k] = src[i]
                    i += 1
                k += 1
            while i < mid:
                dst[k] = src[i]
                i += 1
                k += 1
            while j < end:
                dst[k] = src[j]
                j += 1
                k += 1
        src, dst = dst, src
        width *= 2
    order[lo:hi] = src


@njit(cache=True)
def _trie_kernel(data, offsets, order, keys):
    """The trie of tokens ``order`` (sorted by prefix key, ids ascending within a key): finish the sort by full bytes,
    then derive the preorder nodes from the longest common prefix of each token with the previous one (token k adds
    the nodes for its bytes past that prefix)."""
    m = order.shape[0]
    tmp = np.empty(m, np.int64)
    k = 0
    while k < m:
        r = k + 1
        while r < m and keys[r] == keys[k]:
            r += 1
        if r - k > 1:
            _sort_run(data, offsets, order, k, r, tmp)
        k = r
    # common prefix with the previous token, and the node count
    lcp = np.zeros(m, np.int64)
    num_nodes = 0
    max_len = 0
    for k in range(m):
        b = offsets[order[k]]
        b_len = offsets[order[k] + 1] - b
        max_len = max(max_len, b_len)
        j = 0
        if k > 0:
            a = offsets[order[k - 1]]
            n = min(offsets[order[k - 1] + 1] - a, b_len)
            while j < n and data[a + j] == data[b + j]:
                j += 1
        lcp[k] = j
        num_nodes += b_len - j
    # nodes in preorder
    node_byte = np.empty(num_nodes, np.uint8)
    node_depth = np.empty(num_nodes, np.int32)
    node_next = np.empty(num_nodes, np.int32)
    counts = np.zeros(num_nodes + 1, np.int64)
    path = np.empty(max_len + 1, np.int64)  # path[d] = node at depth d on the current path
    top = 0
    n = 0
    for k in range(m):
        start = offsets[order[k]]
        length = offsets[order[k] + 1] - start
        shared = lcp[k]
        for d in range(shared + 1, top + 1):  # nodes below the shared prefix end here
            node_next[path[d]] = n
        for d in range(shared + 1, length + 1):
            node_byte[n] = data[start + d - 1]
            node_depth[n] = d
            path[d] = n
            n += 1
        top = length
        counts[path[length] + 1] += 1
    for d in range(1, top + 1):
        node_next[path[d]] = n
    node_token_ptr = np.cumsum(counts).astype(np.int32)
    return node_byte, node_depth, node_next, node_token_ptr, order.astype(np.int32)


def _build_trie(data: np.ndarray, offsets: np.ndarray, matchable: np.ndarray) -> TokenTrie:
    ids = np.flatnonzero(matchable).astype(np.int64)
    lengths = offsets[ids + 1] - offsets[ids]
    if int(lengths.sum()) >= 2**31 - 1:
        raise VocabularyError(f"the token trie could have {int(lengths.sum()):,} nodes, more than int32 can index")
    # Same array flags on every call (read-only views would make numba compile a second specialisation).
    data = np.frombuffer(np.ascontiguousarray(data, np.uint8).tobytes(), np.uint8) if data.flags.writeable else data
    offsets = np.array(offsets, np.int64)
    keys = _prefix_keys(data, offsets, ids)
    perm = np.argsort(keys, kind="stable")
    return TokenTrie(*_trie_kernel(data, offsets, ids[perm], keys[perm]))


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

    __slots__ = ("size", "data", "offsets", "matchable", "eos_ids", "fingerprint", "trie", "kind",
                 "special_names", "_blob")

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
            raise TokenError(
                f"token id {int(arr[bad][0])} is out of range: this vocabulary has ids 0..{self.size - 1}"
            )
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
    ) -> "Vocabulary":
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
                raise VocabularyError(
                    f"token {i} must be bytes or None, got {type(tok).__name__} {tok!r}"
                )
            tok = bytes(tok)
            if i in blocked:
                if tok and i not in names:
                    names[i] = tok.decode("utf-8", errors="replace")
                continue
            byte_list[i] = tok
        return cls._from_byte_list(byte_list, np.asarray(eos, np.int32), kind=kind, special_names=names)

    @classmethod
    def _assemble(
        cls, size: int, ids: np.ndarray, lengths: np.ndarray, blob: bytes, eos_ids: np.ndarray, *, kind: str,
        special_names: dict[int, str],
    ) -> "Vocabulary":
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
    ) -> "Vocabulary":
        ids = [i for i, b in enumerate(byte_list) if b]
        toks = [byte_list[i] for i in ids]
        lengths = np.fromiter(map(len, toks), np.int64, count=len(toks))
        return cls._assemble(len(byte_list), np.asarray(ids, np.int64), lengths, b"".join(toks), eos_ids,
                             kind=kind, special_names=special_names)

    @classmethod
    def from_tokenizer(
        cls, tokenizer: Any, *, eos_ids: Iterable[int] | None = None, cache: bool = True
    ) -> "Vocabulary":
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
            return source.build()
        path = cache_dir("vocab") / f"{source.key()}.npz"
        if path.exists():
            try:
                return cls.load(path)
            except VocabularyError:
                pass  # unreadable, corrupt or from another format version: rebuild and overwrite
        vocab = source.build()
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
            os.replace(tmp, path)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
        return path

    @classmethod
    def load(cls, path: str | os.PathLike) -> "Vocabulary":
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
                a["trie_node_byte"], a["trie_node_depth"], a["trie_node_next"], a["trie_node_token_ptr"],
                a["trie_token_ids"],
            )
            n = trie.node_byte.shape[0]
            shapes_ok = (
                trie.node_byte.dtype == np.uint8 and trie.node_depth.dtype == np.int32
                and trie.node_next.dtype == np.int32 and trie.node_token_ptr.dtype == np.int32
                and trie.token_ids.dtype == np.int32 and trie.node_depth.shape == (n,)
                and trie.node_next.shape == (n,) and trie.node_token_ptr.shape == (n + 1,)
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
            vocab = cls(a["data"], a["offsets"], a["matchable"], a["eos_ids"], trie, kind=str(a["kind"]),
                        special_names=names)
        except KeyError as e:
            raise VocabularyError(f"{os.fspath(path)!r} is not a saved vocabulary: missing {e}") from e
        if vocab.fingerprint != stored:
            raise VocabularyError(
                f"{os.fspath(path)!r} is corrupt: its arrays hash to {vocab.fingerprint[:12]}, "
                f"the file says {stored[:12]}"
            )
        return vocab


def _trie_arrays(trie: TokenTrie) -> tuple[np.ndarray, ...]:
    return (trie.node_byte, trie.node_depth, trie.node_next, trie.node_token_ptr, trie.token_ids)


def _as_id(t: Any, what: str) -> int:
    try:
        if isinstance(t, (bool, np.bool_)):
            raise TypeError
        i = int(t) if isinstance(t, np.integer) else t.__index__()
    except (TypeError, AttributeError):
        raise VocabularyError(f"{what} must be an integer, got {type(t).__name__} {t!r}") from None
    if i < 0:
        raise VocabularyError(f"{what} must be >= 0, got {i}")
    return i


# ------------------------------------------------------------------------------------------- reading tokenizers


class _Source:
    """What a tokenizer says about its tokens: read cheaply for the cache key, in full only to build.

    The cache key hashes the decoder (how tokens become bytes), the size, every added / special token, the EOS ids
    and a sample of the base vocabulary: every ``stride``-th id (at most :data:`KEY_SAMPLE` ids) plus the first and
    last 1,024. Reading all 262,144 Gemma token strings through ``tokenizers`` costs 0.15-0.25 s alone, more than a
    cached load may take. Token lists already in memory (tiktoken ranks, slow tokenizers) are hashed in full.
    """

    def __init__(
        self,
        kind: str,
        size: int,
        string_at: Any,
        special: set[int],
        eos: list[int],
        *,
        strings: list[Any] | None = None,
        pinned: Iterable[int] = (),
        byte_fallback: bool = False,
        raw_ids: set[int] | None = None,
        byte_ids: set[int] | None = None,
        detail: str = "",
    ):
        self.kind = kind  # how strings map to bytes
        self.size = size
        self.string_at = string_at  # id -> str (bytes for tiktoken), None for holes
        self._strings = strings
        self.special = special  # never matchable (EOS ids are added)
        self.eos = eos
        self.pinned = set(pinned)  # ids always part of the key (added tokens)
        self.byte_fallback = byte_fallback
        self.raw_ids = raw_ids or set()  # ids whose text is taken verbatim as UTF-8 (slow added tokens)
        self.byte_ids = byte_ids or set()  # ids known to be byte tokens (SentencePiece is_byte)
        self.detail = detail  # decoder / normaliser description, part of the key

    @property
    def strings(self) -> list[Any]:
        if self._strings is None:
            self._strings = list(map(self.string_at, range(self.size)))
        return self._strings

    def key(self) -> str:
        h = hashlib.sha256()
        head = {
            "format": FORMAT_VERSION,
            "kind": self.kind,
            "byte_fallback": self.byte_fallback,
            "detail": self.detail,
            "size": self.size,
            "special": sorted(self.special),
            "eos": self.eos,
            "raw": sorted(self.raw_ids),
            "byte_ids": sorted(self.byte_ids),
            "non_text": sorted(NON_TEXT_ADDED_TOKENS),
        }
        h.update(json.dumps(head, sort_keys=True).encode())
        if self._strings is not None:  # already in memory: hash every token
            strings = self._strings
            empty = b"" if self.kind == "tiktoken" else ""
            if strings.count(None):
                h.update(np.asarray([i for i, s in enumerate(strings) if s is None], np.int64).tobytes())
                strings = [empty if s is None else s for s in strings]
            h.update(np.fromiter(map(len, strings), np.int64, count=len(strings)).tobytes())
            joined = empty.join(strings)
            h.update(joined if isinstance(joined, bytes) else joined.encode("utf-8", errors="surrogatepass"))
            return h.hexdigest()[:40]
        n = self.size
        stride = max(1, -(-n // KEY_SAMPLE))
        ids = sorted(set(range(0, n, stride)).union(range(min(n, 1024)), range(max(0, n - 1024), n), self.pinned,
                                                    self.special))
        at = self.string_at
        parts = []
        for i in ids:
            s = at(i)
            parts.append(f"{i}:-" if s is None else f"{i}:{len(s)}:{s}")
        h.update("\x00".join(parts).encode("utf-8", errors="surrogatepass"))
        return h.hexdigest()[:40]

    def build(self) -> Vocabulary:
        strings = self.strings
        n = len(strings)
        blocked = self.special.union(self.eos)
        names: dict[int, str] = {}
        ids: list[int] = []
        for i in sorted(blocked):
            s = strings[i]
            if s is not None:
                names[i] = s.decode("utf-8", errors="replace") if isinstance(s, bytes) else s
        if blocked:
            ids = [i for i, s in enumerate(strings) if s and i not in blocked]
        else:
            ids = [i for i, s in enumerate(strings) if s]
        toks = [strings[i] for i in ids]
        eos = np.asarray(sorted(set(self.eos)), np.int32)
        if self.kind == "tiktoken":
            lengths = np.fromiter(map(len, toks), np.int64, count=len(toks))
            blob = b"".join(toks)
        elif self.kind == "byte_level":
            lengths, blob = self._byte_level(ids, toks)
        elif self.kind == "sentencepiece":
            lengths, blob = self._sentencepiece(ids, toks)
        else:  # pragma: no cover - guarded by _read_tokenizer
            raise VocabularyError(f"unknown tokenizer kind {self.kind!r}")
        return Vocabulary._assemble(n, np.asarray(ids, np.int64), lengths, blob, eos, kind=self.kind,
                                    special_names=names)

    def _per_token(self, ids: list[int], toks: list[str], one) -> tuple[np.ndarray, bytes]:
        out = [one(i, s) for i, s in zip(ids, toks)]
        return np.fromiter(map(len, out), np.int64, count=len(out)), b"".join(out)

    def _byte_level(self, ids: list[int], toks: list[str]) -> tuple[np.ndarray, bytes]:
        joined = "".join(toks)
        if not self.raw_ids and not joined.translate(_DELETE_ALPHABET):
            # Every character is in the alphabet: one translate for the whole vocabulary, one byte per character.
            return np.fromiter(map(len, toks), np.int64, count=len(toks)), joined.translate(
                _ALPHABET_TO_LATIN1).encode("latin-1")
        raw = self.raw_ids

        def one(i: int, s: str) -> bytes:
            if i in raw or s.translate(_DELETE_ALPHABET):
                return s.encode("utf-8", errors="surrogatepass")  # what the ByteLevel decoder does
            return s.translate(_ALPHABET_TO_LATIN1).encode("latin-1")

        return self._per_token(ids, toks, one)

    def _byte_token(self, i: int, s: str) -> int:
        """The byte of a ``<0xNN>`` byte-fallback token, or -1."""
        if (self.byte_fallback or i in self.byte_ids) and len(s) == 6 and s.startswith("<0x") and s.endswith(">"):
            try:
                return int(s[3:5], 16)
            except ValueError:
                return -1
        return -1

    def _sentencepiece(self, ids: list[int], toks: list[str]) -> tuple[np.ndarray, bytes]:
        if self.raw_ids:
            raw = self.raw_ids

            def one(i: int, s: str) -> bytes:
                if i in raw:
                    return s.encode("utf-8", errors="surrogatepass")
                b = self._byte_token(i, s)
                return bytes((b,)) if b >= 0 else s.replace(_SPIECE_SPACE, " ").encode("utf-8", "surrogatepass")

            return self._per_token(ids, toks, one)
        # Whole vocabulary at once: a byte token becomes one character that encodes to exactly its byte (itself
        # below 0x80, a lone surrogate U+DC80-U+DCFF that "surrogateescape" turns into the raw byte above).
        char_len = np.fromiter(map(len, toks), np.int64, count=len(toks))
        if self.byte_fallback or self.byte_ids:
            toks = list(toks)
            for k in np.flatnonzero(char_len == 6).tolist():
                b = self._byte_token(ids[k], toks[k])
                if b >= 0:
                    toks[k] = chr(b) if b < 0x80 else chr(0xDC00 + b)
                    char_len[k] = 1
        joined = "".join(toks).replace(_SPIECE_SPACE, " ")
        cps = np.frombuffer(joined.encode("utf-32-le", errors="surrogatepass"), np.uint32)
        per_char = (1 + (cps >= 0x80).astype(np.int64) + (cps >= 0x800) + (cps >= 0x10000)
                    - 2 * ((cps >= 0xDC80) & (cps <= 0xDCFF)))
        starts = np.zeros(len(toks), np.int64)
        np.cumsum(char_len[:-1], out=starts[1:])
        lengths = np.add.reduceat(per_char, starts) if len(toks) else np.zeros(0, np.int64)
        return lengths, joined.encode("utf-8", errors="surrogateescape")


_ACCEPTED = (
    "a transformers tokenizer (PreTrainedTokenizerBase, fast or slow), a tokenizers.Tokenizer or a tiktoken.Encoding"
)


def _read_tokenizer(tok: Any, eos_ids: Iterable[int] | None) -> _Source:
    if _is_instance(tok, "tiktoken", "Encoding"):
        src = _read_tiktoken(tok)
    elif _is_instance(tok, "tokenizers", "Tokenizer"):
        src = _read_backend(tok, hf=None)
    elif _is_instance(tok, "transformers", "PreTrainedTokenizerBase"):
        backend = getattr(tok, "backend_tokenizer", None) if getattr(tok, "is_fast", False) else None
        if backend is not None:
            src = _read_backend(backend, hf=tok)
        else:
            src = _read_slow(tok)
    else:
        raise VocabularyError(f"cannot read a vocabulary from a {type(tok).__module__}.{type(tok).__qualname__}: "
                              f"expected {_ACCEPTED}")
    size = src.size
    if eos_ids is not None:
        src.eos = sorted({_as_id(t, "eos id") for t in eos_ids})
    if not src.eos:
        raise VocabularyError(
            "cannot tell this tokenizer's end-of-sequence token (none of "
            f"{', '.join(EOS_TOKEN_NAMES)} is a special token): pass eos_ids=[...]"
        )
    bad = [t for t in src.eos if t >= size]
    if bad:
        raise VocabularyError(f"eos ids {bad} are out of range for a tokenizer of {size:,} ids")
    return src


def _is_instance(obj: Any, module: str, name: str) -> bool:
    import sys

    m = sys.modules.get(module)
    cls = getattr(m, name, None) if m is not None else None
    return cls is not None and isinstance(obj, cls)


def _read_tiktoken(enc: Any) -> _Source:
    ranks: dict[bytes, int] = enc._mergeable_ranks
    specials: dict[str, int] = enc._special_tokens
    size = max([-1, *ranks.values(), *specials.values()]) + 1
    strings: list[Any] = [None] * size
    for b, r in ranks.items():
        strings[r] = b
    for s, i in specials.items():
        strings[i] = s.encode("utf-8")
    eos = [specials["<|endoftext|>"]] if "<|endoftext|>" in specials else []
    return _Source("tiktoken", size, strings.__getitem__, set(specials.values()), eos, strings=strings,
                   detail=str(getattr(enc, "_pat_str", "")))


def _decoder_parts(state: Any) -> list[dict]:
    if not state:
        return []
    if state.get("type") == "Sequence":
        out: list[dict] = []
        for d in state.get("decoders", []):
            out.extend(_decoder_parts(d))
        return out
    return [state]


def _component_state(obj: Any) -> Any:
    if obj is None:
        return None
    try:
        return json.loads(obj.__getstate__())
    except Exception as e:  # custom Python components cannot be serialised
        raise VocabularyError(f"cannot read the tokenizer component {obj!r}: {e}") from e


def _detect_kind(backend: Any) -> tuple[str, bool, str]:
    """(kind, byte_fallback, description) from a tokenizers.Tokenizer's decoder (and pre-tokenizer)."""
    dec = _component_state(backend.decoder)
    parts = _decoder_parts(dec)
    types = [p.get("type") for p in parts]
    detail = json.dumps(dec, sort_keys=True)
    model_fallback = bool(getattr(backend.model, "byte_fallback", False))
    if "ByteLevel" in types:
        other = [t for t in types if t not in ("ByteLevel", "Fuse", "Strip")]
        if other:
            raise VocabularyError(f"unsupported decoder {types}: ByteLevel mixed with {other}")
        return "byte_level", False, detail
    spiece = False
    for p in parts:
        t = p.get("type")
        if t == "Replace":
            pattern = p.get("pattern", {})
            if pattern.get("String") == _SPIECE_SPACE and p.get("content") == " ":
                spiece = True
            else:
                raise VocabularyError(f"unsupported Replace step in the decoder: {p}")
        elif t == "Metaspace":
            if p.get("replacement", _SPIECE_SPACE) != _SPIECE_SPACE:
                raise VocabularyError(f"unsupported Metaspace replacement in the decoder: {p}")
            spiece = True
        elif t not in ("ByteFallback", "Fuse", "Strip"):
            raise VocabularyError(f"cannot tell how this tokenizer's tokens map to bytes: decoder step {t!r} "
                                  f"(decoder {types}); supported: byte-level BPE, SentencePiece style, tiktoken")
    if spiece:
        return "sentencepiece", "ByteFallback" in types or model_fallback, detail
    if not parts:
        pre = _component_state(backend.pre_tokenizer)
        if pre and "ByteLevel" in json.dumps(pre):
            return "byte_level", False, json.dumps(pre, sort_keys=True)
    raise VocabularyError(f"cannot tell how this tokenizer's tokens map to bytes: decoder {types or None}; "
                          "supported: byte-level BPE, SentencePiece style (▁ / <0xNN>), tiktoken")


def _default_eos(string_at: Any, special: set[int], hf: Any) -> list[int]:
    eos: set[int] = set()
    if hf is not None:
        e = getattr(hf, "eos_token_id", None)
        if isinstance(e, int):
            eos.add(e)
        elif isinstance(e, (list, tuple)):
            eos.update(int(x) for x in e)
    names = {i: string_at(i) for i in special}
    if not eos:
        for name in EOS_TOKEN_NAMES:
            ids = [i for i, s in names.items() if s == name]
            if ids:
                eos.add(min(ids))
                break
    if eos:
        eos.update(i for i, s in names.items() if s in END_OF_TURN_TOKENS)
    return sorted(eos)


def _read_backend(backend: Any, hf: Any) -> _Source:
    kind, fallback, detail = _detect_kind(backend)
    added = backend.get_added_tokens_decoder()
    size = max([backend.get_vocab_size(with_added_tokens=True), *(i + 1 for i in added)])
    special = {i for i, t in added.items() if t.special}
    special.update(i for i, t in added.items() if not t.special and t.content in NON_TEXT_ADDED_TOKENS)
    if hf is not None:
        special.update(i for i in getattr(hf, "all_special_ids", []) if i is not None and 0 <= i < size)
    string_at = backend.id_to_token
    eos = _default_eos(string_at, special, hf)
    detail = json.dumps(
        [detail, type(backend.model).__name__, _component_state(backend.normalizer),
         _component_state(backend.pre_tokenizer)],
        sort_keys=True,
    )
    return _Source(kind, size, string_at, special, eos, pinned=added, byte_fallback=fallback, detail=detail)


def _read_slow(tok: Any) -> _Source:
    """A slow (pure Python) transformers tokenizer: SentencePiece-backed ones, or byte-level ones (``byte_decoder``)."""
    sp = getattr(tok, "sp_model", None)
    added = dict(getattr(tok, "added_tokens_decoder", {}) or {})
    special: set[int] = set()
    raw: set[int] = set()
    byte_ids: set[int] = set()
    if sp is not None:
        n = sp.get_piece_size()
        size = max([n, *(i + 1 for i in added)])
        strings: list[Any] = [None] * size
        for i in range(n):
            strings[i] = sp.id_to_piece(i)
            if sp.is_control(i) or sp.is_unknown(i) or sp.is_unused(i):
                special.add(i)
            elif sp.is_byte(i):
                byte_ids.add(i)
        kind = "sentencepiece"
        detail = "slow-sentencepiece"
    elif getattr(tok, "byte_decoder", None) is not None:
        size = max([len(tok), *(i + 1 for i in added)])
        strings = list(tok.convert_ids_to_tokens(list(range(size))))
        kind = "byte_level"
        detail = "slow-byte-level"
    else:
        raise VocabularyError(
            f"cannot tell how the slow tokenizer {type(tok).__name__}'s tokens map to bytes (it has neither a "
            "SentencePiece model nor a byte-level byte_decoder); use its fast version"
        )
    for i, t in added.items():
        strings[i] = t.content
        if t.special or t.content in NON_TEXT_ADDED_TOKENS:
            special.add(i)
        else:
            raw.add(i)  # the slow decode writes added tokens verbatim
        byte_ids.discard(i)
    special.update(i for i in getattr(tok, "all_special_ids", []) if i is not None and 0 <= i < size)
    eos = _default_eos(strings.__getitem__, special, tok)
    return _Source(kind, size, strings.__getitem__, special, eos, strings=strings, pinned=added, raw_ids=raw,
                   byte_ids=byte_ids, detail=detail)
