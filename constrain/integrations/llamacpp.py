"""llama.cpp through ``llama-cpp-python``: a logits processor that keeps generation inside a structure.

Quick use::

    from llama_cpp import Llama
    from constrain.integrations.llamacpp import create_completion, logits_processor_list
    from constrain.models import gguf_model_path

    llm = Llama(model_path=str(gguf_model_path()), n_ctx=512, verbose=False)
    out = llm("Today's date: ", max_tokens=32, temperature=0,
              logits_processor=logits_processor_list(llm, r"\\d{4}-\\d{2}-\\d{2}"))
    out["choices"][0]["text"]          # a full match of the regex; generation stopped at its end

    # the same, with the processor's errors (DeadEndError, ...) raised here rather than only recorded:
    out = create_completion(llm, "Today's date: ", r"\\d{4}-\\d{2}-\\d{2}", max_tokens=32, temperature=0)

How llama-cpp-python (0.3.x) calls a processor, and what this module does with it:

- The processor runs once per sampled token, as the first step of the sampler chain (before penalties, a
  ``grammar``, top-k / top-p and temperature). It gets ``input_ids``, every token evaluated so far, prompt
  included (int32, a view of the model's own buffer), and ``scores``, the logit column of llama.cpp's candidate
  array (float32, shape ``(n_vocab,)``, a strided view: 12 bytes between entries). Whatever it returns is copied
  back into that column. :class:`LlamaCppLogitsProcessor` writes ``-inf`` into the disallowed entries in place,
  with the numba kernel of :mod:`constrain.kernels.bitmask` (no copy), and returns the same array.
- Generation stops when llama.cpp samples an end-of-generation token (``llama_vocab_is_eog``). The vocabularies
  built here take exactly those as the end-of-sequence ids: the structure allows them where it accepts, and where
  nothing else may follow they are the only tokens allowed, so generation ends exactly at the end of the structure
  (``finish_reason == "stop"``). For the Gemma 3 GGUF they are ``<eos>`` 1, ``<end_of_turn>`` 106 and also
  ``</s>`` 212: llama.cpp re-types that token (a plain added token, text, for the Hugging Face tokenizer) as a
  control token that ends generation, and its tokenizer never produces it for the text ``"</s>"``, so here it is
  an end-of-sequence id and never text.
- The processor keeps its matcher in step with ``input_ids``: the first call fixes the prompt (all of
  ``input_ids``); later calls roll the matcher back to the longest common prefix of what it read and what
  ``input_ids`` now holds, then read the rest. A call whose ``input_ids`` no longer start with the prompt, or that
  only holds the prompt again, starts a new generation; so does an extension of several tokens that the structure
  cannot read (a new prompt that happens to begin with the old one). A single new token the structure refuses is
  a :class:`~constrain.errors.TokenError`: something changed the scores after this processor. Call
  :meth:`LlamaCppLogitsProcessor.reset` (or make a new list with :func:`logits_processor_list` per call, as the
  examples do) to start over explicitly.
- When no token is allowed (a dead end: the vocabulary cannot spell what the structure needs next), the processor
  raises :class:`~constrain.errors.DeadEndError`, or, with ``on_dead_end="stop"``, allows only the end-of-sequence
  token so generation stops there, and sets :attr:`LlamaCppLogitsProcessor.dead_end`.
- Errors and ctypes: llama-cpp-python runs processors inside a ctypes callback of llama.cpp's sampler chain, and
  Python drops an exception raised there (it prints "Exception ignored on calling ctypes callback function") and
  lets the sampler go on with the scores as they are. So before raising, the processor leaves only the
  end-of-sequence token allowed (generation stops at once instead of running on unconstrained) and keeps the
  exception in :attr:`LlamaCppLogitsProcessor.error`. To get it raised in the caller, pass
  ``stopping_criteria=processor.stopping_criteria()`` too (stopping criteria run in plain Python), or use
  :func:`create_completion`, which does both.
- Not supported: ``Llama(draft_model=...)``. llama-cpp-python then samples at positions before the end of
  ``input_ids`` and still passes the processor every evaluated draft token, so the position being sampled is
  unknown; :func:`processor_for_llama` refuses such a model. Speculative decoding on llama.cpp runs in constrain's
  own loop instead: :class:`~constrain.integrations.llamacpp_model.LlamaCppModel` with a
  :class:`~constrain.decoding.speculative.Speculation` (prompt lookup drafts the way ``draft_model`` does).

Vocabulary (:func:`vocabulary_from_llama`): a constrain :class:`~constrain.vocab.vocabulary.Vocabulary` must give
every id the bytes llama.cpp gives it. By default it is read from llama.cpp itself (``llama_token_to_piece`` without
special rendering, the token attributes, ``llama_vocab_is_eog``), which is exact for any GGUF; it is cached on disk
under a key of the GGUF file (path, size, modification time) and in memory per model. Given a ``tokenizer``
instead (for Gemma, :func:`constrain.models.load_gemma_tokenizer`), the vocabulary is built from the tokenizer
with llama.cpp's end-of-generation ids, and :func:`check_vocabulary` compares it with llama.cpp on a sample of ids
(bytes, which ids are text, which end the sequence) and with llama.cpp's own ``detokenize``; a mismatch raises
:class:`~constrain.errors.VocabularyError`.
"""

from __future__ import annotations

import ctypes
import hashlib
import threading
import weakref
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from constrain.cache import cache_dir
from constrain.compilers import api
from constrain.errors import ArgumentError, ConstrainError, DeadEndError, ShapeError, TokenError, VocabularyError
from constrain.extras import check_installed
from constrain.kernels.bitmask import apply_token_bitmask
from constrain.runtime.matcher import CompiledStructure, Matcher
from constrain.vocab.readers import NON_TEXT_ADDED_TOKENS
from constrain.vocab.vocabulary import Vocabulary, read_cached, write_cached

check_installed("llama_cpp", extra="llamacpp", feature=__name__)

if TYPE_CHECKING:
    from llama_cpp import Llama, LogitsProcessorList

__all__ = [
    "LlamaCppLogitsProcessor",
    "vocabulary_from_llama",
    "check_vocabulary",
    "processor_for_llama",
    "logits_processor_list",
    "create_completion",
]

# llama.cpp's token attributes (enum llama_token_attr).
_ATTR_UNKNOWN = 1 << 0
_ATTR_UNUSED = 1 << 1
_ATTR_NORMAL = 1 << 2
_ATTR_CONTROL = 1 << 3
_ATTR_USER_DEFINED = 1 << 4
_ATTR_BYTE = 1 << 5
#: Attributes of tokens that are text (a structure may emit them for their bytes).
_TEXT_ATTRS = _ATTR_NORMAL | _ATTR_USER_DEFINED | _ATTR_BYTE
_NON_TEXT_NAMES = frozenset(s.encode("utf-8") for s in NON_TEXT_ADDED_TOKENS)

_NEG_INF = np.float32(-np.inf)
#: At most this many masks' "is any token allowed" answers are remembered per processor.
_MAX_NONEMPTY_MEMO = 128


# ================================================================================================ the processor


class LlamaCppLogitsProcessor:
    """A llama-cpp-python logits processor: masks ``scores`` to the tokens ``structure`` allows next.

    ``structure`` must be compiled for a vocabulary with llama.cpp's token ids (see :func:`vocabulary_from_llama`);
    its end-of-sequence ids are those llama.cpp stops on. One processor follows one sequence at a time (see the
    module docstring for how it follows ``input_ids``). ``on_dead_end``: ``"raise"`` (default) raises
    :class:`DeadEndError` when no token is allowed; ``"stop"`` allows only the end-of-sequence token instead, so
    generation stops there, and sets :attr:`dead_end`.
    """

    def __init__(self, structure: CompiledStructure, *, on_dead_end: Literal["raise", "stop"] = "raise"):
        if not isinstance(structure, CompiledStructure):
            raise ArgumentError("structure", structure, "a CompiledStructure")
        if on_dead_end not in ("raise", "stop"):
            raise ArgumentError("on_dead_end", on_dead_end, "'raise' or 'stop'")
        self.structure = structure
        self.vocab = structure.vocab
        self.on_dead_end = on_dead_end
        eos = [int(t) for t in structure.vocab.eos_ids]
        if not eos:
            raise VocabularyError("the structure's vocabulary has no end-of-sequence id: generation could not stop")
        self._stop_id = eos[0]
        self._matcher: Matcher = structure.matcher()
        self._seen = np.zeros(0, np.int32)  # prompt + generated tokens the matcher read, in a growable buffer
        self._n_seen = 0
        self._prompt_length: int | None = None
        self._bitmask: np.ndarray | None = None  # only for logits wider than the vocabulary
        self._nonempty: dict[int, tuple[np.ndarray, bool]] = {}
        #: True once a dead end was met with ``on_dead_end="stop"`` (the output is then incomplete).
        self.dead_end = False
        #: The exception the last call raised in this generation, if any (see :meth:`__call__`).
        self.error: BaseException | None = None

    # -- state ---------------------------------------------------------------------------------------------------

    @property
    def matcher(self) -> Matcher:
        """The matcher of the current generation (read it, do not advance it)."""
        return self._matcher

    @property
    def prompt_length(self) -> int | None:
        """Tokens of the current generation's prompt; None before the first call."""
        return self._prompt_length

    @property
    def generated_tokens(self) -> list[int]:
        """The tokens of the current generation the matcher has read (the prompt excluded)."""
        if self._prompt_length is None:
            return []
        return self._seen[self._prompt_length : self._n_seen].tolist()

    def output_bytes(self) -> bytes:
        """The bytes the matcher has read in this generation."""
        return self.vocab.decode(self.generated_tokens)

    def is_complete(self) -> bool:
        """Whether the output so far is a complete match of the structure."""
        return self._matcher.is_accepting()

    def reset(self) -> None:
        """Forget the current generation: the next call starts a new one, its ``input_ids`` being the prompt."""
        self._matcher = self.structure.matcher()
        self._n_seen = 0
        self._prompt_length = None
        self.dead_end = False
        self.error = None

    # -- following input_ids -------------------------------------------------------------------------------------

    def _start(self, ids: np.ndarray) -> None:
        self.reset()
        self._remember(ids, 0)
        self._prompt_length = self._n_seen

    def _remember(self, ids: np.ndarray, start: int) -> None:
        """``_seen[start:] = ids[start:]`` (``_seen[:start]`` already equals ``ids[:start]``)."""
        n = ids.shape[0]
        if self._seen.shape[0] < n:
            grown = np.zeros(max(n, 2 * self._seen.shape[0], 256), np.int32)
            grown[:start] = self._seen[:start]
            self._seen = grown
        self._seen[start:n] = ids[start:]
        self._n_seen = n

    def _sync(self, input_ids: Any) -> None:
        ids = np.asarray(input_ids)
        if ids.ndim != 1:
            raise ShapeError(f"input_ids must be 1-D (one sequence), got shape {ids.shape}")
        if self._prompt_length is None:
            self._start(ids)
            return
        n, n_seen, prompt = ids.shape[0], self._n_seen, self._prompt_length
        common = _first_difference(ids, self._seen, min(n, n_seen))
        if common < prompt or n == prompt:
            self._start(ids)  # another prompt, or the same one again: a new generation
            return
        matcher = self._matcher
        if common < n_seen:
            matcher.rollback(n_seen - common)
            self._n_seen = common
        if common == n:
            return
        new = ids[common:].tolist()
        try:
            matcher.advance(new if len(new) > 1 else new[0])
        except TokenError as exc:
            if len(new) > 1:
                self._start(ids)  # several unknown tokens the structure cannot read: a new prompt
                return
            raise TokenError(
                f"token {new[0]} ({self.vocab.token_text(new[0]) if new[0] < self.vocab.size else '?'!r}) at "
                f"position {common} was sampled although the structure does not allow it ({exc}); did something "
                "change the scores after this processor?"
            ) from None
        self._remember(ids, common)

    # -- the call ------------------------------------------------------------------------------------------------

    def __call__(self, input_ids: np.ndarray, scores: np.ndarray) -> np.ndarray:
        """Mask ``scores`` in place for the position after ``input_ids``; returns ``scores``.

        On an error (a dead end with ``on_dead_end="raise"``, a token the structure refuses, a shape that does not
        fit) the scores are first reduced to the end-of-sequence token, so that generation stops even where the
        exception cannot propagate (llama-cpp-python calls processors from a ctypes callback, which prints and
        drops exceptions); the error is kept in :attr:`error` and raised. :meth:`stopping_criteria` re-raises it
        in the caller of ``create_completion``.
        """
        try:
            return self._process(input_ids, scores)
        except Exception as exc:
            self.error = exc
            _only(scores, self._stop_id)
            raise

    def _process(self, input_ids: np.ndarray, scores: np.ndarray) -> np.ndarray:
        self._sync(input_ids)
        if not isinstance(scores, np.ndarray) or scores.ndim != 1:
            raise ShapeError(
                f"scores must be a 1-D numpy array (n_vocab,), got {type(scores).__name__} "
                f"{getattr(scores, 'shape', None)}"
            )
        width = scores.shape[0]
        if width < self.vocab.size:
            raise ShapeError(
                f"the model's logits have {width:,} columns but the structure's vocabulary has "
                f"{self.vocab.size:,} tokens: vocabulary and model do not match"
            )
        mask = self._matcher.mask()
        if not self._has_tokens(mask):
            text = self.output_bytes().decode("utf-8", errors="replace")
            if self.on_dead_end == "raise":
                raise DeadEndError(
                    f"no token of the vocabulary can continue the structure {self.structure.source!r} here", text
                )
            self.dead_end = True
            _only(scores, self._stop_id)
            return scores
        if width > 32 * mask.shape[0]:  # padded logits: the extra ids are always masked
            if self._bitmask is None or self._bitmask.shape[1] != (width + 31) // 32:
                self._bitmask = np.zeros((1, (width + 31) // 32), np.int32)
            self._matcher.fill_bitmask(self._bitmask, 0)
            mask = self._bitmask[0]
        apply_token_bitmask(scores, mask)
        return scores

    def _has_tokens(self, mask: np.ndarray) -> bool:
        """``mask.any()``, remembered per mask array (the structure's mask cache hands out the same read-only array
        for a state while it holds it; the memo keeps those arrays alive, so an id is never reused)."""
        hit = self._nonempty.get(id(mask))
        if hit is not None and hit[0] is mask:
            return hit[1]
        if len(self._nonempty) >= _MAX_NONEMPTY_MEMO:
            self._nonempty.clear()
        nonempty = bool(mask.any())
        self._nonempty[id(mask)] = (mask, nonempty)
        return nonempty

    def stopping_criteria(self) -> Any:
        """A ``llama_cpp.StoppingCriteriaList`` for ``create_completion(stopping_criteria=...)`` that raises this
        processor's :attr:`error` in the caller (stopping criteria run outside the ctypes callback)."""
        from llama_cpp import StoppingCriteriaList

        return StoppingCriteriaList([self._raise_error])

    def _raise_error(self, input_ids: np.ndarray, logits: np.ndarray) -> bool:
        if self.error is not None:
            raise self.error
        return False

    def __repr__(self) -> str:
        return f"<LlamaCppLogitsProcessor {self._matcher!r}>"


def _only(scores: Any, token: int) -> None:
    """Leave only ``token`` allowed in a 1-D numpy ``scores`` (anything else is left alone)."""
    if isinstance(scores, np.ndarray) and scores.ndim == 1 and scores.shape[0] > token and scores.flags.writeable:
        scores[:] = _NEG_INF
        scores[token] = 0.0


def _first_difference(a: np.ndarray, b: np.ndarray, k: int) -> int:
    """The first index < k where a and b differ, else k."""
    if k == 0:
        return 0
    a, b = a[:k], b[:k]
    if a.dtype == b.dtype and a.tobytes() == b.tobytes():  # the common case, one memcmp
        return k
    diff = np.flatnonzero(a != b)
    return int(diff[0]) if diff.size else k


# ================================================================================================ vocabulary


class _LlamaTokens:
    """What llama.cpp says about token ids: bytes (without special rendering), attributes, text, end of generation."""

    def __init__(self, llm: Any):
        import llama_cpp

        self.lib = llama_cpp
        self.vocab_p = llama_cpp.llama_model_get_vocab(llm.model)
        self.size = int(llama_cpp.llama_vocab_n_tokens(self.vocab_p))
        self._buf = ctypes.create_string_buffer(256)

    def piece(self, token: int) -> bytes:
        """``llama_token_to_piece(token, special=False)``: a token's bytes in the middle of a text."""
        buf = self._buf
        n = self.lib.llama_token_to_piece(self.vocab_p, token, buf, len(buf), 0, False)
        if n < 0:
            self._buf = buf = ctypes.create_string_buffer(-n + 64)
            n = self.lib.llama_token_to_piece(self.vocab_p, token, buf, len(buf), 0, False)
        return buf.raw[:n]

    def attr(self, token: int) -> int:
        return int(self.lib.llama_vocab_get_attr(self.vocab_p, token))

    def is_eog(self, token: int) -> bool:
        return bool(self.lib.llama_vocab_is_eog(self.vocab_p, token))

    def text(self, token: int) -> bytes:
        return self.lib.llama_vocab_get_text(self.vocab_p, token) or b""

    def describe(self, token: int) -> tuple[bytes | None, str | None, bool]:
        """(bytes if the token is text a structure may emit else None, its name if not, whether it ends generation)."""
        eog = self.is_eog(token)
        attr = self.attr(token)
        if not eog and attr & _TEXT_ATTRS and not attr & (_ATTR_CONTROL | _ATTR_UNKNOWN | _ATTR_UNUSED):
            piece = self.piece(token)
            if piece and not (attr & _ATTR_USER_DEFINED and self.text(token) in _NON_TEXT_NAMES):
                return piece, None, False
        name = self.text(token).decode("utf-8", errors="replace")
        return None, name or None, eog

    def eog_ids(self) -> list[int]:
        """The end-of-generation ids. Only non-text tokens can be EOG in practice, but every id is checked."""
        is_eog = self.lib.llama_vocab_is_eog
        return [i for i in range(self.size) if is_eog(self.vocab_p, i)]


# Per model: the vocabulary read from llama.cpp and the regexes compiled for it (bounded).
_memo: weakref.WeakKeyDictionary[Any, dict[str, Any]] = weakref.WeakKeyDictionary()
_memo_lock = threading.Lock()


def _model_memo(llm: Any) -> dict[str, Any]:
    with _memo_lock:
        try:
            memo = _memo.get(llm)
            if memo is None:
                memo = _memo[llm] = {"vocab": None}
        except TypeError:  # not weak-referenceable: no memo
            memo = {"vocab": None}
        return memo


def _llama_key(llm: Any, tokens: _LlamaTokens) -> str | None:
    """A cache key for the vocabulary of the GGUF ``llm`` was loaded from (None if the file cannot be seen)."""
    try:
        import llama_cpp

        path = Path(llm.model_path).resolve()
        st = path.stat()
        version = getattr(llama_cpp, "__version__", "?")
    except (AttributeError, OSError, TypeError):
        return None
    h = hashlib.sha256(b"constrain.llamacpp.vocab/1\0")
    h.update(f"{path}\0{st.st_size}\0{st.st_mtime_ns}\0{tokens.size}\0{version}".encode())
    return h.hexdigest()[:32]


def _read_llama_vocabulary(tokens: _LlamaTokens) -> Vocabulary:
    pieces: list[bytes | None] = [None] * tokens.size
    special: list[int] = []
    eos: list[int] = []
    names: dict[int, str] = {}
    for i in range(tokens.size):
        piece, name, eog = tokens.describe(i)
        if piece is None:
            special.append(i)
            if name:
                names[i] = name
            if eog:
                eos.append(i)
        else:
            pieces[i] = piece
    if not eos:
        raise VocabularyError("llama.cpp names no end-of-generation token for this model: generation could not stop")
    return Vocabulary.from_token_bytes(pieces, eos_ids=eos, special_ids=special, kind="llama.cpp", special_names=names)


def vocabulary_from_llama(
    llm: Llama, tokenizer: Any = None, *, check_sample: int = 4096, cache: bool = True
) -> Vocabulary:
    """A constrain Vocabulary with ``llm``'s token ids, bytes and end-of-generation ids.

    Without ``tokenizer``: read from llama.cpp itself (exact for any GGUF; ~1-2 s for 262k tokens the first time,
    then loaded from ``cache_dir("vocab")``). With ``tokenizer`` (a transformers / ``tokenizers`` / tiktoken
    tokenizer of the same model): :meth:`Vocabulary.from_tokenizer` with llama.cpp's end-of-generation ids as
    ``eos_ids``, then :func:`check_vocabulary` on ``check_sample`` ids (``0`` skips the check). The vocabulary read
    from llama.cpp is also kept in memory per ``llm``.
    """
    tokens = _LlamaTokens(llm)
    if tokenizer is not None:
        vocab = Vocabulary.from_tokenizer(tokenizer, eos_ids=tokens.eog_ids(), cache=cache)
        if check_sample:
            check_vocabulary(llm, vocab, sample=check_sample)
        return vocab
    memo = _model_memo(llm)
    if memo["vocab"] is not None:
        return memo["vocab"]
    key = _llama_key(llm, tokens) if cache else None
    folder = cache_dir("vocab") if key else None
    name = f"llama-{key}"
    path = folder / f"{name}.vocab" if folder is not None else None
    vocab = read_cached(path, name) if path is not None else None  # None: missing, or damaged (then deleted)
    if vocab is None:
        vocab = _read_llama_vocabulary(tokens)
        if path is not None:
            write_cached(vocab, path, name)  # a read-only cache must not stop the vocabulary from being used
    memo["vocab"] = vocab
    return vocab


def _sample_ids(size: int, sample: int) -> list[int]:
    """Every id below 1,024 (specials, byte tokens), the last 256, and ``sample`` ids spread evenly over the rest."""
    ids = set(range(min(size, 1024))) | set(range(max(0, size - 256), size))
    if sample > 0 and size > 1024:
        ids.update(np.linspace(1024, size - 1, num=min(sample, size - 1024), dtype=np.int64).tolist())
    return sorted(ids)


def check_vocabulary(llm: Llama, vocab: Vocabulary, *, sample: int = 4096, ids: Iterable[int] | None = None) -> int:
    """Check that ``vocab`` gives ``llm``'s ids the bytes llama.cpp gives them; raise VocabularyError otherwise.

    For each id checked (``ids``, or every id below 1,024, the last 256 and ``sample`` more spread over the rest):
    the vocabulary's bytes equal llama.cpp's ``llama_token_to_piece`` (without special rendering) for text tokens;
    tokens llama.cpp does not treat as text are not matchable; the end-of-sequence ids are exactly llama.cpp's
    end-of-generation ids. Then ``Llama.detokenize`` of runs of matchable ids (at most 32 bytes each, the limit of
    llama-cpp-python's buffer) equals :meth:`Vocabulary.decode`. Returns how many ids were checked.
    """
    tokens = _LlamaTokens(llm)
    if vocab.size > tokens.size:
        raise VocabularyError(
            f"the vocabulary has {vocab.size:,} ids but the model only {tokens.size:,}: not this model's vocabulary"
        )
    eog = tokens.eog_ids()
    if sorted(int(t) for t in vocab.eos_ids) != eog:
        raise VocabularyError(
            f"the vocabulary's end-of-sequence ids {vocab.eos_ids.tolist()} are not llama.cpp's end-of-generation "
            f"ids {eog}"
        )
    todo = sorted({int(i) for i in ids}) if ids is not None else _sample_ids(vocab.size, sample)
    if todo and not 0 <= todo[0] <= todo[-1] < vocab.size:
        raise VocabularyError(f"ids to check must lie in 0..{vocab.size - 1}")
    bad: list[str] = []
    for i in todo:
        piece, _, _ = tokens.describe(i)
        ours = vocab.token_bytes(i) if vocab.matchable[i] else None
        if piece != ours:
            bad.append(f"id {i}: llama.cpp {piece!r}, vocabulary {ours!r}")
            if len(bad) >= 5:
                break
    if bad:
        raise VocabularyError("the vocabulary does not match llama.cpp's tokens: " + "; ".join(bad))
    # llama-cpp-python's own detokenize over runs of short text tokens (skip runs that start with BOS: it strips a
    # space after BOS).
    text_ids = [i for i in todo if vocab.matchable[i] and len(vocab.token_bytes(i)) <= 32]
    for start in range(0, len(text_ids), 64):
        run = text_ids[start : start + 64]
        theirs = llm.detokenize(run)
        if theirs != vocab.decode(run):
            raise VocabularyError(
                f"llama.cpp's detokenize of ids {run[:8]}... gives {theirs[:60]!r}, the vocabulary "
                f"{vocab.decode(run)[:60]!r}"
            )
    return len(todo)


# ================================================================================================ conveniences


def processor_for_llama(
    llm: Llama,
    structure: Any,
    *,
    tokenizer: Any = None,
    on_dead_end: Literal["raise", "stop"] = "raise",
) -> LlamaCppLogitsProcessor:
    """A processor for ``llm``: ``structure`` is a CompiledStructure (compiled for a vocabulary with this model's
    ids, e.g. :func:`vocabulary_from_llama`) or any spec :func:`constrain.compile` takes (a regex, a JSON Schema, a
    Pydantic type, choices...), compiled here for :func:`vocabulary_from_llama(llm, tokenizer)
    <vocabulary_from_llama>`. The vocabulary is kept per model and compiled structures are cached, so building a
    processor per call is cheap."""
    if getattr(llm, "draft_model", None) is not None:
        raise ConstrainError(
            "a Llama with a draft_model (speculative decoding) passes logits processors the draft tokens after the "
            "position it samples; constrain's processor cannot follow it: load the model without draft_model"
        )
    n_vocab = int(llm.n_vocab())
    if not isinstance(structure, CompiledStructure):
        structure = api.compile(structure, vocabulary_from_llama(llm, tokenizer))
    if structure.vocab.size > n_vocab:
        raise VocabularyError(
            f"the structure was compiled for a vocabulary of {structure.vocab.size:,} ids, the model has "
            f"{n_vocab:,}: not this model's vocabulary"
        )
    return LlamaCppLogitsProcessor(structure, on_dead_end=on_dead_end)


def logits_processor_list(
    llm: Llama,
    structure: Any,
    *,
    tokenizer: Any = None,
    on_dead_end: Literal["raise", "stop"] = "raise",
) -> LogitsProcessorList:
    """A ``llama_cpp.LogitsProcessorList`` holding a new :func:`processor_for_llama`, ready for
    ``llm(prompt, logits_processor=...)`` / ``llm.create_completion(..., logits_processor=...)``. Make one per call
    (cheap: the vocabulary is cached per model and a compiled structure is shared). An error inside it stops
    generation and is kept in ``lst[0].error``; pass ``stopping_criteria=lst[0].stopping_criteria()`` as well to
    have it raised (see the module docstring), or use :func:`create_completion`."""
    from llama_cpp import LogitsProcessorList

    return LogitsProcessorList([processor_for_llama(llm, structure, tokenizer=tokenizer, on_dead_end=on_dead_end)])


def create_completion(
    llm: Llama,
    prompt: str | list[int],
    structure: Any,
    *,
    tokenizer: Any = None,
    on_dead_end: Literal["raise", "stop"] = "raise",
    **kwargs: Any,
) -> Any:
    """``llm.create_completion(prompt, **kwargs)`` inside ``structure`` (a CompiledStructure or a spec), with the
    processor's errors raised here: :class:`DeadEndError` (unless ``on_dead_end="stop"``), :class:`TokenError`,
    :class:`ShapeError`. ``logits_processor`` / ``stopping_criteria`` given in ``kwargs`` run after constrain's.
    With ``stream=True`` the chunks are yielded and an error is raised while iterating."""
    from llama_cpp import LogitsProcessorList, StoppingCriteriaList

    proc = processor_for_llama(llm, structure, tokenizer=tokenizer, on_dead_end=on_dead_end)
    processors = LogitsProcessorList([proc, *(kwargs.pop("logits_processor", None) or [])])
    criteria = StoppingCriteriaList([*proc.stopping_criteria(), *(kwargs.pop("stopping_criteria", None) or [])])
    out = llm.create_completion(prompt, logits_processor=processors, stopping_criteria=criteria, **kwargs)
    if kwargs.get("stream"):
        return _raise_after(out, proc)
    if proc.error is not None:
        raise proc.error
    return out


def _raise_after(chunks: Any, proc: LlamaCppLogitsProcessor) -> Any:
    yield from chunks
    if proc.error is not None:
        raise proc.error
