"""Reading a tokenizer's token bytes, by kind of tokenizer.

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
from collections.abc import Iterable
from typing import Any, NamedTuple

import numpy as np

from constrain.errors import VocabularyError

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


# ------------------------------------------------------------------------------------------- reading tokenizers


class TokenBytes(NamedTuple):
    """A tokenizer's tokens as read: the size, the matchable ids with their packed bytes, and the end ids."""

    size: int
    ids: np.ndarray
    lengths: np.ndarray
    blob: bytes
    eos: np.ndarray
    kind: str
    special_names: dict[int, str]


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
        ids = sorted(
            set(range(0, n, stride)).union(range(min(n, 1024)), range(max(0, n - 1024), n), self.pinned, self.special)
        )
        at = self.string_at
        parts = []
        for i in ids:
            s = at(i)
            parts.append(f"{i}:-" if s is None else f"{i}:{len(s)}:{s}")
        h.update("\x00".join(parts).encode("utf-8", errors="surrogatepass"))
        return h.hexdigest()[:40]

    def token_bytes(self) -> TokenBytes:
        """Every token's bytes, packed: what :meth:`Vocabulary._assemble` builds a vocabulary from."""
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
        return TokenBytes(n, np.asarray(ids, np.int64), lengths, blob, eos, self.kind, names)

    def _per_token(self, ids: list[int], toks: list[str], one) -> tuple[np.ndarray, bytes]:
        out = [one(i, s) for i, s in zip(ids, toks)]
        return np.fromiter(map(len, out), np.int64, count=len(out)), b"".join(out)

    def _byte_level(self, ids: list[int], toks: list[str]) -> tuple[np.ndarray, bytes]:
        joined = "".join(toks)
        if not self.raw_ids and not joined.translate(_DELETE_ALPHABET):
            # Every character is in the alphabet: one translate for the whole vocabulary, one byte per character.
            return np.fromiter(map(len, toks), np.int64, count=len(toks)), joined.translate(_ALPHABET_TO_LATIN1).encode(
                "latin-1"
            )
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
        per_char = (
            1
            + (cps >= 0x80).astype(np.int64)
            + (cps >= 0x800)
            + (cps >= 0x10000)
            - 2 * ((cps >= 0xDC80) & (cps <= 0xDCFF))
        )
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
        raise VocabularyError(
            f"cannot read a vocabulary from a {type(tok).__module__}.{type(tok).__qualname__}: expected {_ACCEPTED}"
        )
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
    return _Source(
        "tiktoken",
        size,
        strings.__getitem__,
        set(specials.values()),
        eos,
        strings=strings,
        detail=str(getattr(enc, "_pat_str", "")),
    )


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
            raise VocabularyError(
                f"cannot tell how this tokenizer's tokens map to bytes: decoder step {t!r} "
                f"(decoder {types}); supported: byte-level BPE, SentencePiece style, tiktoken"
            )
    if spiece:
        return "sentencepiece", "ByteFallback" in types or model_fallback, detail
    if not parts:
        pre = _component_state(backend.pre_tokenizer)
        if pre and "ByteLevel" in json.dumps(pre):
            return "byte_level", False, json.dumps(pre, sort_keys=True)
    raise VocabularyError(
        f"cannot tell how this tokenizer's tokens map to bytes: decoder {types or None}; "
        "supported: byte-level BPE, SentencePiece style (▁ / <0xNN>), tiktoken"
    )


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
        [
            detail,
            type(backend.model).__name__,
            _component_state(backend.normalizer),
            _component_state(backend.pre_tokenizer),
        ],
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
    return _Source(
        kind,
        size,
        strings.__getitem__,
        special,
        eos,
        strings=strings,
        pinned=added,
        raw_ids=raw,
        byte_ids=byte_ids,
        detail=detail,
    )


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
