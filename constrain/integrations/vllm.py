"""vLLM: the V1 structured-output protocol classes, and a logits-processor plug-in built on them.

vLLM picks its structured-output backend from a fixed list, so there are two routes, sharing one implementation:

- :class:`ConstrainBackend` / :class:`ConstrainGrammar` implement vLLM's structured-output protocol
  (``vllm/v1/structured_output/backend_types.py``: ``StructuredOutputBackend`` and ``StructuredOutputGrammar``),
  for vLLM's own ``StructuredOutputManager`` and for upstreaming. They import nothing from vLLM;
  :func:`vllm_structured_output_classes` gives subclasses of vLLM's abstract classes when vLLM is installed.
- :class:`StructureLogitsProcessor` is a logits-processor plug-in, registered under vLLM's entry-point group
  ``vllm.logits_processors``: the route that works today without patching vLLM. It reads the structure from
  ``SamplingParams.extra_args`` (see :func:`structure_request`), keeps one :class:`ConstrainGrammar` per request
  and masks the logits rows vLLM hands it. It implements the logits-processor interface of vLLM's V2 model runner
  (the default in vLLM 0.33: ``vllm.v1.worker.gpu.sample.logits_processor``), where under speculative decoding
  a request owns one logits row per draft position, and, so that the installed plug-in never breaks an engine,
  the legacy V1 runner's interface too (``vllm.v1.sample.logits_processor``; that runner loads no plug-in under
  speculative decoding). The class is built on first access, as a subclass of vLLM's abstract classes.

Ending: the grammar object treats the request's stop tokens (vLLM passes ``SamplingParams.all_stop_token_ids``;
without them, the vocabulary's end-of-sequence ids) as the end of the structure: they are masked until the
structure is complete, allowed once it is, and accepting one terminates the grammar. The vocabulary's other
end-of-sequence ids stay masked, since vLLM would not stop on them.
"""

from __future__ import annotations

import enum
import functools
import importlib
import json
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from constrain.errors import ShapeError, StructureError, TokenError, VocabularyError
from constrain.kernels.bitmask import apply_token_bitmask
from constrain.runtime.matcher import CompiledStructure
from constrain.vocab.vocabulary import Vocabulary

logger = logging.getLogger(__name__)

# StructureLogitsProcessor is left out of __all__: it is built from vLLM's classes on first access, and a star
# import must work without vLLM.
__all__ = [
    "COMPILERS",
    "ConstrainBackend",
    "ConstrainGrammar",
    "RequestType",
    "choice_regex",
    "compile_structure",
    "fill_draft_bitmasks",
    "find_compiler",
    "structure_request",
    "vllm_structured_output_classes",
]


class RequestType(enum.Enum):
    """The kinds of structured-output request; the member names are those of vLLM's ``StructuredOutputOptions``."""

    JSON = "json"
    JSON_OBJECT = "json_object"
    REGEX = "regex"
    GRAMMAR = "grammar"
    CHOICE = "choice"
    STRUCTURAL_TAG = "structural_tag"


def _request_type(request_type: Any) -> RequestType:
    """Our RequestType for vLLM's ``StructuredOutputOptions`` member, our own, or a name such as ``"regex"``."""
    if isinstance(request_type, RequestType):
        return request_type
    name = getattr(request_type, "name", request_type)  # an enum member of vLLM's: look at its name
    if isinstance(name, str):
        try:
            return RequestType[name.upper()]
        except KeyError:
            pass
    known = ", ".join(t.value for t in RequestType)
    raise StructureError(f"unknown structured-output request type {request_type!r}; known: {known}")


# ----------------------------------------------------------------------------------------------------------------
# structures from requests
# ----------------------------------------------------------------------------------------------------------------

#: The compilers of the structures that are not regexes, each called as ``function(spec, vocab)``:
#: ``(module, function)`` per kind. They are looked up at call time by :func:`find_compiler`.
COMPILERS: dict[str, tuple[str, str]] = {
    "json": ("constrain.compilers.json_schema", "compile_json_schema"),
    "lark": ("constrain.compilers.lark", "compile_lark"),
    "gbnf": ("constrain.compilers.gbnf", "compile_gbnf"),
}


def find_compiler(kind: str, request_type: str) -> Callable[..., CompiledStructure]:
    """The compiler function for ``kind`` (a key of :data:`COMPILERS`), or StructureError naming the request type
    when this installation of constrain does not have it yet."""
    module_name, function_name = COMPILERS[kind]
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name != module_name:
            raise  # the compiler exists but something it imports is missing: not ours to hide
        module = None
    function = getattr(module, function_name, None)
    if function is None:
        raise StructureError(
            f"{request_type} requests need {module_name}.{function_name}, which this version of constrain "
            f"does not have yet"
        )
    return function


_PLAIN = frozenset(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_")


def choice_regex(choices: Sequence[str]) -> str:
    """A regex matching exactly one of ``choices``: the alternation of the literals, every character that is not
    an ASCII letter, digit or ``_`` escaped as ``\\xNN``, ``\\uNNNN`` or ``\\UNNNNNNNN``."""
    if isinstance(choices, str) or not isinstance(choices, Sequence) or not choices:
        raise StructureError(f"a choice request needs a non-empty list of strings, got {choices!r}")
    parts = []
    for choice in choices:
        if not isinstance(choice, str):
            raise StructureError(f"every choice must be a string, got {type(choice).__name__} {choice!r}")
        escaped = []
        for ch in choice:
            cp = ord(ch)
            if cp < 128 and cp in _PLAIN:
                escaped.append(ch)
            elif cp < 0x100:
                escaped.append(f"\\x{cp:02x}")
            elif cp < 0x10000:
                escaped.append(f"\\u{cp:04x}")
            else:
                escaped.append(f"\\U{cp:08x}")
        parts.append("".join(escaped))
    return "(?:" + "|".join(parts) + ")"


def _load_json(spec: Any, request_type: str) -> Any:
    if not isinstance(spec, (str, bytes, bytearray)):
        return spec  # already parsed
    try:
        return json.loads(spec)
    except ValueError as exc:
        raise StructureError(f"{request_type} request: the spec is not valid JSON: {exc}") from None


def _is_gbnf(grammar: str) -> bool:
    """GBNF (llama.cpp) writes its rules with ``::=``; Lark with ``:``."""
    return "::=" in grammar


def compile_structure(request_type: Any, grammar_spec: Any, vocab: Vocabulary) -> CompiledStructure:
    """Compile one structured-output request for ``vocab``.

    ``grammar_spec`` is what vLLM's ``StructuredOutputKey`` carries: a JSON Schema as JSON text (or already
    parsed), ``""`` for a JSON object, a regex, a grammar in Lark or GBNF syntax, or the choices as a JSON list.
    Raises StructureError (a ValueError) for a malformed or unsupported request.
    """
    kind = _request_type(request_type)
    name = kind.name
    if kind is RequestType.REGEX:
        from constrain.compilers.regex import compile_regex

        if not isinstance(grammar_spec, str):
            raise StructureError(f"a REGEX request needs the pattern as a string, got {type(grammar_spec).__name__}")
        return compile_regex(grammar_spec, vocab)
    if kind is RequestType.CHOICE:
        from constrain.compilers.regex import compile_regex

        return compile_regex(choice_regex(_load_json(grammar_spec, name)), vocab)
    if kind is RequestType.JSON:
        return find_compiler("json", name)(_load_json(grammar_spec, name), vocab)
    if kind is RequestType.JSON_OBJECT:
        return find_compiler("json", name)({"type": "object"}, vocab)
    if kind is RequestType.GRAMMAR:
        if not isinstance(grammar_spec, str):
            raise StructureError(f"a GRAMMAR request needs the grammar as a string, got {type(grammar_spec).__name__}")
        return find_compiler("gbnf" if _is_gbnf(grammar_spec) else "lark", name)(grammar_spec, vocab)
    raise StructureError(f"{name} requests are not supported by constrain")


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
            raise TokenError(
                f"cannot roll back {num_tokens} tokens: {self.num_processed_tokens} have been accepted"
            )
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
        structure = compile_structure(kind, grammar_spec, self.vocab)  # outside the lock: compiles run in parallel
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
    from vllm.v1.structured_output.backend_types import StructuredOutputBackend, StructuredOutputGrammar

    grammar = type("VllmConstrainGrammar", (ConstrainGrammar, StructuredOutputGrammar), {"__module__": __name__})
    backend = type(
        "VllmConstrainBackend",
        (ConstrainBackend, StructuredOutputBackend),
        {"__module__": __name__, "grammar_class": grammar, "__eq__": object.__eq__, "__hash__": object.__hash__},
    )
    return backend, grammar


# ----------------------------------------------------------------------------------------------------------------
# the logits-processor plug-in
# ----------------------------------------------------------------------------------------------------------------

#: The structure keys the plug-in reads from ``SamplingParams.extra_args``, each either flat with the prefix
#: ``constrain_`` (what the OpenAI server's ``vllm_xargs`` can carry) or nested under ``"constrain"``.
EXTRA_ARGS_KEYS: dict[str, RequestType] = {
    "regex": RequestType.REGEX,
    "json": RequestType.JSON,
    "json_object": RequestType.JSON_OBJECT,
    "choice": RequestType.CHOICE,
    "grammar": RequestType.GRAMMAR,
}


def structure_request(extra_args: Mapping[str, Any] | None) -> tuple[RequestType, str] | None:
    """The structure a request asks for in its ``extra_args``, as (type, spec text), or None.

    ``{"constrain_regex": r"\\d+"}`` or ``{"constrain": {"regex": r"\\d+"}}``; likewise ``json`` (a schema, as a
    dict or JSON text), ``json_object`` (true), ``choice`` (a list of strings) and ``grammar`` (Lark or GBNF).
    Raises StructureError for an unknown key, a wrong value or more than one structure.
    """
    if not extra_args:
        return None
    found: dict[str, Any] = {}
    nested = extra_args.get("constrain")
    if nested is not None:
        if not isinstance(nested, Mapping):
            raise StructureError(f"extra_args['constrain'] must be a dict such as {{'regex': ...}}, got {nested!r}")
        for key, value in nested.items():
            if key not in EXTRA_ARGS_KEYS:
                raise StructureError(
                    f"unknown key {key!r} in extra_args['constrain']; known: {sorted(EXTRA_ARGS_KEYS)}"
                )
            found[key] = value
    for key in EXTRA_ARGS_KEYS:
        if f"constrain_{key}" in extra_args:
            if key in found:
                raise StructureError(f"{key!r} is given both flat and under extra_args['constrain']")
            found[key] = extra_args[f"constrain_{key}"]
    if "json_object" in found:
        flag = found["json_object"]
        if isinstance(flag, str):
            flag = {"true": True, "1": True, "false": False, "0": False, "": False}.get(flag.strip().lower(), flag)
        if flag is None or flag is False or flag == 0:
            del found["json_object"]
        elif flag is not True and flag != 1:
            raise StructureError(f"constrain json_object must be true or false, got {found['json_object']!r}")
    if not found:
        return None
    if len(found) > 1:
        raise StructureError(f"one structure per request, got {sorted(found)}")
    key, value = found.popitem()
    kind = EXTRA_ARGS_KEYS[key]
    if kind is RequestType.JSON_OBJECT:
        return kind, ""
    if kind in (RequestType.REGEX, RequestType.GRAMMAR):
        if not isinstance(value, str):
            raise StructureError(f"constrain {key} must be a string, got {type(value).__name__}")
        return kind, value
    if kind is RequestType.CHOICE:
        choices = _load_json(value, "CHOICE") if isinstance(value, str) else value
        choice_regex(choices)  # checks the list
        return kind, json.dumps(list(choices))
    # JSON: the schema as text
    if isinstance(value, str):
        _load_json(value, "JSON")
        return kind, value
    if not isinstance(value, (Mapping, bool)):
        raise StructureError(f"constrain json must be a JSON Schema (a dict or JSON text), got {type(value).__name__}")
    return kind, json.dumps(value)


@functools.lru_cache(maxsize=256)
def _check_json_schema(spec: str) -> None:
    """Lower a JSON request's schema to a grammar (no vocabulary needed): JsonSchemaError, a StructureError, for a
    schema the compile would refuse. Cached per schema text: admission sees the same schemas again and again."""
    from constrain.compilers.json_schema import schema_to_grammar

    schema_to_grammar(_load_json(spec, "JSON"))


class _Request:
    """The plug-in's state for one request: its grammar and how many committed output tokens it has read.

    A broken request (its structure could not be compiled, or a committed token broke it) is ended: its rows
    allow only its stop tokens (every token if it has none, rather than none at all).
    """

    __slots__ = ("grammar", "synced", "broken", "output_ids", "name", "stop_bits")

    def __init__(self, grammar: ConstrainGrammar | None, name: str, stop_token_ids: Iterable[int] = ()):
        self.grammar = grammar
        self.synced = 0
        self.broken = grammar is None
        self.output_ids: list[int] | None = None  # the legacy runner's live list of output tokens
        self.name = name
        stops = grammar.stop_token_ids if grammar is not None else frozenset(int(t) for t in stop_token_ids)
        self.stop_bits = _word_bits(stops) if stops else None

    def sync(self, tokens: Sequence[int]) -> None:
        """Read newly committed output tokens."""
        if not tokens:
            return
        self.synced += len(tokens)
        if self.broken:
            return
        if not self.grammar.accept_tokens(self.name, [int(t) for t in tokens]):
            self.broken = True
            logger.error(
                "constrain: %s: a committed token was not allowed by the structure (another stage changed the "
                "logits after the mask?); ending the request",
                self.name,
            )

    def restart(self) -> None:
        self.synced = 0
        if self.grammar is not None:
            self.grammar.reset()
            self.broken = False

    def fill(self, bitmask: np.ndarray, row: int, drafts: Sequence[int]) -> None:
        if self.broken:
            for j in range(len(drafts) + 1):
                out = bitmask[row + j].view(np.uint32)
                if self.stop_bits is None:
                    out[:] = 0xFFFFFFFF
                else:
                    out[:] = 0
                    ConstrainGrammar._or_bits(out, self.stop_bits)
            return
        fill_draft_bitmasks(self.grammar, bitmask, row, drafts, request_id=self.name)


class _StructureLogitsProcessorImpl:
    """The plug-in's logic, without vLLM base classes (see :class:`StructureLogitsProcessor`).

    Constructed by vLLM as ``cls(vllm_config, req_states)`` (V2 model runner) or
    ``cls(vllm_config, device, is_pin_memory)`` (legacy V1 runner).
    """

    def __init__(self, vllm_config: Any, req_states_or_device: Any = None, is_pin_memory: bool | None = None):
        self.vllm_config = vllm_config
        self.v2 = is_pin_memory is None and hasattr(req_states_or_device, "all_token_ids")
        if self.v2:
            self.req_states = req_states_or_device
            self.device = getattr(req_states_or_device, "device", None)
            self.vocab_size = getattr(req_states_or_device, "vocab_size", None)
        else:
            self.req_states = None
            self.device = req_states_or_device
            self.vocab_size = None
        self._requests: dict[int, _Request] = {}
        self._backend: ConstrainBackend | None = None
        self._backend_lock = threading.Lock()
        self._warned_placeholder = False

    # -- shared --------------------------------------------------------------------------------------------------

    @classmethod
    def validate_params(cls, sampling_params: Any) -> None:
        """Reject a malformed structure request at admission (StructureError is a ValueError): the keys, the
        value types, and, since they need no vocabulary, the regex / choice syntax, the JSON Schema (lowered to a
        grammar, as the compile will) and which compilers exist."""
        request = structure_request(getattr(sampling_params, "extra_args", None))
        if request is None:
            return
        kind, spec = request
        from constrain.automata.regex import regex_to_dfa

        if kind is RequestType.REGEX:
            regex_to_dfa(spec)
        elif kind is RequestType.CHOICE:
            regex_to_dfa(choice_regex(json.loads(spec)))
        elif kind in (RequestType.JSON, RequestType.JSON_OBJECT):
            find_compiler("json", kind.name)
            if kind is RequestType.JSON:
                _check_json_schema(spec)
        else:
            find_compiler("gbnf" if _is_gbnf(spec) else "lark", kind.name)

    def make_backend(self) -> ConstrainBackend:
        """The backend that compiles this engine's requests: vLLM's tokenizer for the model. Override to supply
        another (a custom tokenizer, tests)."""
        from vllm.tokenizers import cached_tokenizer_from_config

        model_config = self.vllm_config.model_config
        tokenizer = cached_tokenizer_from_config(model_config)
        if tokenizer is None:
            raise VocabularyError("constrain needs the model's tokenizer, and this engine runs without one")
        vocab_size = self.vocab_size or model_config.get_vocab_size()
        return ConstrainBackend(self.vllm_config, tokenizer=tokenizer, vocab_size=vocab_size)

    @property
    def backend(self) -> ConstrainBackend:
        if self._backend is None:
            with self._backend_lock:
                if self._backend is None:
                    self._backend = self.make_backend()
        return self._backend

    def _new_request(self, sampling_params: Any, name: str) -> _Request | None:
        request = structure_request(getattr(sampling_params, "extra_args", None))
        if request is None:
            return None
        stops = set(getattr(sampling_params, "all_stop_token_ids", None) or ())
        try:
            grammar = self.backend.compile_grammar(request[0], request[1], stop_token_ids=stops)
        except (StructureError, VocabularyError) as exc:
            logger.error("constrain: %s: cannot compile its structure, ending it: %s", name, exc)
            grammar = None
        except Exception:  # e.g. the tokenizer cannot be loaded: fail this request, not the engine
            logger.exception("constrain: %s: cannot compile its structure, ending it", name)
            grammar = None
        return _Request(grammar, name, stops)

    def is_argmax_invariant(self) -> bool:
        """A structure changes which token is the most likely."""
        return False

    def apply(self, logits: Any, ctx: Any = None) -> Any:
        """Mask ``logits`` in place: V2 runner with ``ctx``, legacy runner without."""
        if ctx is None:
            return self._apply_v1(logits)
        return self._apply_v2(logits, ctx)

    def _apply_rows(self, logits: Any, blocks: list[tuple[_Request, list[int], list[int]]]) -> Any:
        """Fill one bitmask row per logits row of each (request, rows, drafts) and mask those rows."""
        total = sum(len(rows) for _, rows, _ in blocks)
        if not total:
            return logits
        bitmask = np.empty((total, (int(logits.shape[-1]) + 31) // 32), dtype=np.int32)
        indices: list[int] = []
        at = 0
        for request, rows, drafts in blocks:
            request.fill(bitmask, at, drafts)
            indices.extend(rows)
            at += len(rows)
        apply_token_bitmask(logits, bitmask, indices=indices)
        return logits

    # -- V2 model runner -------------------------------------------------------------------------------------------

    def add_request(self, req_idx: int, sampling_params: Any) -> bool:
        """A request enters slot ``req_idx`` (the slot's previous state is dropped); True if it has a structure."""
        request = self._new_request(sampling_params, f"request in slot {req_idx}")
        if request is None:
            self._requests.pop(req_idx, None)
            return False
        self._requests[req_idx] = request
        return True

    def apply_staged_writes(self) -> None:
        """Nothing is staged: the state lives on the host."""

    def _sync_v2(self, slots: list[int]) -> None:
        """Read each slot's committed output tokens that its grammar has not read yet."""
        import torch

        rs = self.req_states
        total_gpu = rs.total_len.gpu
        index = torch.as_tensor(slots, dtype=torch.long, device=total_gpu.device)
        totals = total_gpu[index].cpu().tolist()
        prompts = np.asarray(rs.prompt_len.np)[slots].tolist()
        row_ids: list[int] = []
        col_ids: list[int] = []
        spans: list[tuple[_Request, int]] = []
        for slot, total, prompt in zip(slots, totals, prompts):
            request = self._requests[slot]
            output_len = int(total) - int(prompt)
            if output_len < request.synced:  # the slot's history was rewritten: read it again
                request.restart()
            start = int(prompt) + request.synced
            count = max(0, int(total) - start)
            if count:
                row_ids.extend([slot] * count)
                col_ids.extend(range(start, start + count))
                spans.append((request, count))
        if not spans:
            return
        tokens_gpu = rs.all_token_ids.gpu
        rows_t = torch.as_tensor(row_ids, dtype=torch.long, device=tokens_gpu.device)
        cols_t = torch.as_tensor(col_ids, dtype=torch.long, device=tokens_gpu.device)
        tokens = tokens_gpu[rows_t, cols_t].cpu().tolist()
        at = 0
        for request, count in spans:
            request.sync(tokens[at : at + count])
            at += count

    def _apply_v2(self, logits: Any, ctx: Any) -> Any:
        requests = self._requests
        if not requests:
            return logits
        slots = [int(s) for s in np.asarray(ctx.idx_mapping_np).tolist() if int(s) in requests]
        if not slots:
            return logits  # no row of this batch is ours: no device sync
        self._sync_v2(sorted(set(slots)))
        row_slots = ctx.expanded_idx_mapping.cpu().tolist()
        local_pos = ctx.expanded_local_pos.cpu().tolist()
        input_ids = ctx.input_ids.cpu().tolist()
        per_slot: dict[int, list[tuple[int, int]]] = {}
        for row, slot in enumerate(row_slots):
            if slot in requests:
                per_slot.setdefault(slot, []).append((local_pos[row], row))
        blocks = []
        for slot, entries in per_slot.items():
            entries.sort()
            rows = [row for _, row in entries]
            # the row at local position j comes after the drafts fed at local positions 1..j
            drafts = [int(input_ids[row]) for row in rows[1:]]
            blocks.append((requests[slot], rows, drafts))
        return self._apply_rows(logits, blocks)

    # -- legacy V1 runner ------------------------------------------------------------------------------------------

    def update_state(self, batch_update: Any) -> None:
        """Follow the persistent batch: removed, then added, then moved requests (vLLM's order)."""
        if batch_update is None:
            return
        requests = self._requests
        for index in batch_update.removed:
            requests.pop(index, None)
        for index, params, _prompt_ids, output_ids in batch_update.added:
            request = self._new_request(params, f"request at batch index {index}")
            if request is None:
                requests.pop(index, None)
            else:
                request.output_ids = output_ids
                requests[index] = request
        for a, b, direction in batch_update.moved:
            if getattr(direction, "name", direction) == "SWAP":
                ra, rb = requests.pop(a, None), requests.pop(b, None)
                if ra is not None:
                    requests[b] = ra
                if rb is not None:
                    requests[a] = rb
            else:
                moved = requests.pop(a, None)
                if moved is None:
                    requests.pop(b, None)
                else:
                    requests[b] = moved

    def _apply_v1(self, logits: Any) -> Any:
        blocks = []
        n_rows = int(logits.shape[0])
        for index in sorted(self._requests):
            if index >= n_rows:
                continue
            request = self._requests[index]
            output = request.output_ids if request.output_ids is not None else []
            if len(output) < request.synced:
                request.restart()
            new = output[request.synced :]
            if any(t < 0 for t in new):  # placeholders of async scheduling that vLLM did not fill in
                cut = next(i for i, t in enumerate(new) if t < 0)
                request.sync(new[:cut])
                if not request.broken:
                    request.broken = True
                    if not self._warned_placeholder:
                        self._warned_placeholder = True
                        logger.error(
                            "constrain: vLLM's legacy runner did not give the plug-in its output tokens (async "
                            "scheduling); ending the request. Use the V2 model runner, or name the processor in "
                            "--logits-processors so that vLLM keeps the output tokens for it."
                        )
            else:
                request.sync(new)
            blocks.append((request, [index], []))
        return self._apply_rows(logits, blocks)


@functools.cache
def _plugin_class() -> type:
    """:class:`_StructureLogitsProcessorImpl` subclassing vLLM's logits-processor classes (V2 runner, and V1)."""
    bases: list[type] = [_StructureLogitsProcessorImpl]
    errors = []
    for module_name in (
        "vllm.v1.worker.gpu.sample.logits_processor.interface",  # the V2 model runner
        "vllm.v1.sample.logits_processor.interface",  # the legacy V1 runner
    ):
        try:
            bases.append(importlib.import_module(module_name).LogitsProcessor)
        except ImportError as exc:
            errors.append(f"{module_name}: {exc}")
    if len(bases) == 1:
        raise ImportError(
            "constrain.integrations.vllm.StructureLogitsProcessor needs vLLM's logits-processor interface: "
            + "; ".join(errors)
        )
    cls = type(
        "StructureLogitsProcessor",
        tuple(bases),
        {"__module__": __name__, "__qualname__": "StructureLogitsProcessor", "__doc__": _PLUGIN_DOC},
    )
    return cls


_PLUGIN_DOC = """vLLM logits-processor plug-in: masks each request's rows to the structure in its ``extra_args``.

Registered under the entry-point group ``vllm.logits_processors``, so an installed constrain is loaded by every
vLLM engine; requests without a structure are not touched. See :func:`structure_request` for the keys, and the
module docstring for the two runner interfaces it implements.
"""


def __getattr__(name: str) -> Any:
    if name == "StructureLogitsProcessor":
        return _plugin_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
