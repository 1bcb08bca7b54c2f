"""vLLM's V1 structured-output protocol: :class:`ConstrainBackend` and :class:`ConstrainGrammar`.

They import nothing from vLLM; :func:`vllm_structured_output_classes` gives subclasses of vLLM's abstract classes
when vLLM is installed.
"""

from __future__ import annotations

import functools
import json
import logging
import threading
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from constrain.errors import ShapeError, TokenError, VocabularyError
from constrain.extras import require
from constrain.integrations.vllm.requests import RequestType, _request_type, compile_structure
from constrain.runtime.matcher import CompiledStructure
from constrain.vocab.vocabulary import Vocabulary

logger = logging.getLogger(__name__)


# ----------------------------------------------------------------------------------------------------------------
# the protocol classes
# ----------------------------------------------------------------------------------------------------------------


def _numpy_bitmask(bitmask: Any) -> np.ndarray:
    """A writable numpy view of an int32 ``(rows, words)`` bitmask (numpy array or CPU torch tensor)."""
    if not isinstance(bitmask, np.ndarray):
        if not type(bitmask).__module__.startswith("torch"):
            raise ShapeError(f"bitmask must be a numpy array or a CPU torch tensor, got {type(bitmask).__name__}")
        if bitmask.device.type != "cpu":
            raise ShapeError("the bitmask must be on the CPU: fill it there, then copy it to the device")
        bitmask = bitmask.detach().numpy()
    if bitmask.dtype != np.int32 or bitmask.ndim != 2:
        raise ShapeError(f"bitmask must be int32 of shape (rows, words), got {bitmask.dtype} {bitmask.shape}")
    return bitmask


def _word_bits(ids: Iterable[int]) -> tuple[np.ndarray, np.ndarray]:
    """Token ids as (unique word indices, uint32 bits of those ids in each word)."""
    words: dict[int, int] = {}
    for t in ids:
        words[t >> 5] = words.get(t >> 5, 0) | (1 << (t & 31))
    order = sorted(words)
    return np.asarray(order, dtype=np.int64), np.asarray([words[w] for w in order], dtype=np.uint32)


class ConstrainGrammar:
    """One request's structure: vLLM's ``StructuredOutputGrammar`` protocol over a constrain :class:`Matcher`.

    ``stop_token_ids`` end the structure (default: the vocabulary's end-of-sequence ids); see the module docstring.
    Methods are not thread-safe for one object; different objects (of one compiled structure or not) may be used
    from different threads at once, as vLLM's batched bitmask fill does.
    """

    def __init__(
        self,
        structure: CompiledStructure,
        *,
        stop_token_ids: Iterable[int] | None = None,
    ):
        self.structure = structure
        self.vocab = structure.vocab
        self.matcher = structure.matcher()
        eos = {int(t) for t in self.vocab.eos_ids}
        stops = {int(t) for t in stop_token_ids} if stop_token_ids else set(eos)
        if any(t < 0 for t in stops):
            raise TokenError(f"stop token ids must be >= 0, got {sorted(stops)}")
        self.stop_token_ids = frozenset(stops)
        #: Tokens that are never read as text: the stop tokens and the vocabulary's end-of-sequence ids.
        self._end_ids = frozenset(stops | eos)
        self._stop_bits = _word_bits(self.stop_token_ids)
        self._end_bits = _word_bits(self._end_ids)
        self._terminated = False
        #: Tokens accepted so far, the stop token included.
        self.num_processed_tokens = 0

    # -- reading ---------------------------------------------------------------------------------------------------

    def _read(self, matcher, token: int) -> bool | None:
        """Read one token into ``matcher``: True if it was read as text, None if it is an accepted stop token,
        False if the structure does not allow it here (``matcher`` unchanged)."""
        if token in self.stop_token_ids:
            return None if matcher.is_accepting() else False
        if token in self._end_ids or not 0 <= token < self.vocab.size:
            return False
        try:
            matcher.advance(token)
        except TokenError:
            return False
        return True

    def accept_tokens(self, request_id: str, tokens: list[int]) -> bool:
        """Read ``tokens`` in order. True if all were allowed; False if one was not, and then nothing changes.

        Reading a stop token where the structure is complete terminates the grammar; tokens after it, and tokens
        given once terminated, are ignored (True), as vLLM's own backends do.
        """
        if self._terminated:
            return True
        read = 0
        accepted = 0
        for token in tokens:
            outcome = self._read(self.matcher, int(token))
            if outcome is False:
                if read:
                    self.matcher.rollback(read)
                logger.debug("request %s: token %s is not allowed by %r", request_id, token, self.structure)
                return False
            accepted += 1
            if outcome is None:
                self._terminated = True
                break
            read += 1
        self.num_processed_tokens += accepted
        return True

    def validate_tokens(self, tokens: list[int]) -> list[int]:
        """The longest prefix of ``tokens`` the structure accepts from here (up to and including a stop token
        where one may end it); changes nothing. Empty once terminated."""
        if self._terminated:
            return []
        probe = self.matcher.copy()
        out: list[int] = []
        for token in tokens:
            outcome = self._read(probe, int(token))
            if outcome is False:
                break
            out.append(int(token))
            if outcome is None:
                break
        return out

    def rollback(self, num_tokens: int) -> None:
        """Undo the last ``num_tokens`` accepted tokens (a stop token included). TokenError past the start."""
        num_tokens = int(num_tokens)
        if not 0 <= num_tokens <= self.num_processed_tokens:
            raise TokenError(f"cannot roll back {num_tokens} tokens: {self.num_processed_tokens} have been accepted")
        if num_tokens == 0:
            return
        text_tokens = num_tokens
        if self._terminated:
            self._terminated = False
            text_tokens -= 1
        self.matcher.rollback(text_tokens)
        self.num_processed_tokens -= num_tokens

    def is_terminated(self) -> bool:
        """Whether a stop token has been accepted."""
        return self._terminated

    def is_accepting(self) -> bool:
        """Whether the structure is complete here (a stop token is allowed, or was read)."""
        return self._terminated or self.matcher.is_accepting()

    def reset(self) -> None:
        """Back to the start of the structure."""
        self.matcher.reset()
        self._terminated = False
        self.num_processed_tokens = 0

    # -- masks -----------------------------------------------------------------------------------------------------

    @staticmethod
    def _or_bits(row: np.ndarray, bits: tuple[np.ndarray, np.ndarray]) -> None:
        words, values = bits
        inside = words < row.shape[0]
        row[words[inside]] |= values[inside]

    def fill_bitmask(self, bitmask: Any, batch_index: int) -> None:
        """Write the tokens allowed next into row ``batch_index`` of ``bitmask`` (int32 ``(rows, words)``, numpy or
        CPU torch, any width: ids past the vocabulary get 0, a narrower row gets the leading words).

        Stop tokens are set exactly where the structure may end; once terminated only the stop tokens are set.
        """
        arr = _numpy_bitmask(bitmask)
        if not 0 <= batch_index < arr.shape[0]:
            raise ShapeError(f"row {batch_index} is out of range for a bitmask of {arr.shape[0]} rows")
        row = arr[batch_index].view(np.uint32)
        if self._terminated:
            row[:] = 0
            self._or_bits(row, self._stop_bits)
            return
        mask = self.matcher.mask().view(np.uint32)
        n = min(mask.shape[0], row.shape[0])
        row[:n] = mask[:n]
        row[n:] = 0
        words, values = self._end_bits
        inside = words < n
        row[words[inside]] &= ~values[inside]
        if self.matcher.is_accepting():
            self._or_bits(row, self._stop_bits)

    def __repr__(self) -> str:
        state = "terminated" if self._terminated else f"{self.num_processed_tokens} tokens"
        return f"<{type(self).__name__} {state} of {self.structure!r}>"


def fill_draft_bitmasks(
    grammar: ConstrainGrammar,
    bitmask: Any,
    row: int,
    draft_tokens: Sequence[int],
    *,
    request_id: str = "",
) -> int:
    """Fill ``len(draft_tokens) + 1`` rows from ``row`` the way vLLM's engine does under speculative decoding.

    Row ``row + j`` gets the mask after the first ``j`` draft tokens: the last row is the bonus position. Drafts
    are read with ``accept_tokens`` and rolled back at the end, so the grammar ends where it started. At a ``-1``
    sentinel (padding) or a draft the structure rejects, reading stops and every later row repeats the last row
    filled; no token is ever sampled from those rows, since the draft that leads to them is rejected (by the
    mask of the row before it, or as padding). Once a draft stop token terminates the grammar, the rows allow
    every token, as vLLM's manager leaves them: the request ends at that stop token.

    Returns how many drafts were read (the valid prefix).
    """
    arr = _numpy_bitmask(bitmask)
    read = 0
    stopped = False
    for j in range(len(draft_tokens) + 1):
        if j:
            token = int(draft_tokens[j - 1])
            if not stopped:
                if token < 0 or grammar.is_terminated() or not grammar.accept_tokens(request_id, [token]):
                    stopped = True
                else:
                    read += 1
            if stopped:
                arr[row + j] = arr[row + j - 1]
                continue
        if grammar.is_terminated():
            arr[row + j] = -1
        else:
            grammar.fill_bitmask(arr, row + j)
    if read:
        grammar.rollback(read)
    return read


def _speculative_tokens(vllm_config: Any) -> int:
    spec = getattr(vllm_config, "speculative_config", None)
    return int(getattr(spec, "num_speculative_tokens", 0) or 0) if spec is not None else 0


class ConstrainBackend:
    """vLLM's ``StructuredOutputBackend`` protocol: compiles requests into :class:`ConstrainGrammar` objects.

    ``tokenizer``: a transformers / ``tokenizers`` / tiktoken tokenizer (read once with
    :meth:`Vocabulary.from_tokenizer`, cached on disk) or a :class:`Vocabulary`. ``vocab_size``: the model's logits
    width, which may be wider than the tokenizer (the extra ids are always masked); default the vocabulary's size.
    ``vllm_config`` is kept as vLLM's backends keep it (only its speculative config is read); it may be None.

    Compiled structures are shared by every request with the same (type, spec) and kept in an LRU of
    ``max_structures`` entries. ``compile_grammar`` may be called from several threads.
    """

    grammar_class: type[ConstrainGrammar] = ConstrainGrammar

    def __init__(
        self,
        vllm_config: Any = None,
        tokenizer: Any = None,
        vocab_size: int | None = None,
        *,
        eos_ids: Iterable[int] | None = None,
        max_structures: int = 64,
    ):
        if tokenizer is None:
            raise VocabularyError("ConstrainBackend needs a tokenizer or a constrain Vocabulary")
        if isinstance(tokenizer, Vocabulary):
            vocab = tokenizer
        else:
            vocab = Vocabulary.from_tokenizer(tokenizer, eos_ids=eos_ids)
        self.vllm_config = vllm_config
        self.tokenizer = tokenizer
        self.vocab = vocab
        self.vocab_size = int(vocab_size) if vocab_size is not None else vocab.size
        if self.vocab_size <= 0:
            raise ShapeError(f"vocab_size must be > 0, got {vocab_size}")
        self.num_speculative_tokens = _speculative_tokens(vllm_config)
        self.max_structures = int(max_structures)
        self._structures: OrderedDict[tuple[RequestType, str], CompiledStructure] = OrderedDict()
        self._lock = threading.Lock()

    def compile_structure(self, request_type: Any, grammar_spec: Any) -> CompiledStructure:
        """The compiled structure of a request, from the cache when the same request was compiled before."""
        kind = _request_type(request_type)
        key = (kind, grammar_spec if isinstance(grammar_spec, str) else json.dumps(grammar_spec, sort_keys=True))
        with self._lock:
            structure = self._structures.get(key)
            if structure is not None:
                self._structures.move_to_end(key)
                return structure
        structure = compile_structure(kind, grammar_spec, self.vocab, cache=False)  # outside the lock: in parallel
        with self._lock:
            structure = self._structures.setdefault(key, structure)
            self._structures.move_to_end(key)
            while len(self._structures) > self.max_structures:
                self._structures.popitem(last=False)
        return structure

    def compile_grammar(
        self,
        request_type: Any,
        grammar_spec: Any,
        stop_token_ids: set[int] | None = None,
    ) -> ConstrainGrammar:
        """A new grammar object for one request. ``request_type``: vLLM's ``StructuredOutputOptions`` member, a
        :class:`RequestType` or its name; ``stop_token_ids``: the request's stop tokens (vLLM passes
        ``SamplingParams.all_stop_token_ids``). Raises StructureError for a bad or unsupported request."""
        return self.grammar_class(self.compile_structure(request_type, grammar_spec), stop_token_ids=stop_token_ids)

    def allocate_token_bitmask(self, max_num_seqs: int) -> Any:
        """A CPU int32 torch tensor ``(max_num_seqs, ceil(vocab_size / 32))``, every token allowed. vLLM asks for
        ``max_num_seqs * (1 + num_speculative_tokens)`` rows. (A numpy array where torch is missing.)"""
        words = (self.vocab_size + 31) // 32
        try:
            import torch
        except ImportError:  # pragma: no cover - torch is a dependency of constrain
            return np.full((int(max_num_seqs), words), -1, dtype=np.int32)
        return torch.full((int(max_num_seqs), words), -1, dtype=torch.int32)

    def destroy(self) -> None:
        """Drop the compiled structures (grammar objects already made keep theirs)."""
        with self._lock:
            self._structures.clear()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(vocab={self.vocab!r}, vocab_size={self.vocab_size:,})"


@functools.cache
def vllm_structured_output_classes() -> tuple[type[ConstrainBackend], type[ConstrainGrammar]]:
    """(backend, grammar) classes that also subclass vLLM's ``StructuredOutputBackend`` / ``StructuredOutputGrammar``
    (the backend's ``compile_grammar`` makes the grammar class). ImportError without vLLM."""
    types = require("vllm.v1.structured_output.backend_types", "vllm", feature="vllm_structured_output_classes")
    StructuredOutputBackend, StructuredOutputGrammar = types.StructuredOutputBackend, types.StructuredOutputGrammar
    grammar = type("VllmConstrainGrammar", (ConstrainGrammar, StructuredOutputGrammar), {"__module__": __name__})
    backend = type(
        "VllmConstrainBackend",
        (ConstrainBackend, StructuredOutputBackend),
        {"__module__": __name__, "grammar_class": grammar, "__eq__": object.__eq__, "__hash__": object.__hash__},
    )
    return backend, grammar
