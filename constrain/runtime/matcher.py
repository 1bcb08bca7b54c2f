"""Compiled structures and the per-sequence Matcher.

Compile once per (structure, vocabulary) into a :class:`CompiledStructure`, which owns the automaton, the
shared mask cache and the shared cache of transitions; create one cheap :class:`Matcher` per sequence. A
matcher's history is a persistent linked list of states, so ``copy()`` (beam search, speculation) is O(1) and
``rollback(n)`` is O(n).

Reading a token is a pure function of (state, token), so every structure keeps the transitions its matchers
have made (:class:`TransitionCache`): a transition seen before costs one dictionary look-up, whatever the
automaton, and only a first visit reads the token's bytes.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import Any

import numpy as np

from constrain.automata.dfa import ByteDFA
from constrain.cache import PROCESS_BUDGET, CacheBudget
from constrain.errors import ArgumentError, ShapeError, TokenError
from constrain.runtime.masks import (
    DEFAULT_CACHE_BYTES,
    MaskCache,
    StateMasks,
    check_cache_bytes,
)
from constrain.vocab.vocabulary import Vocabulary

#: The state a matcher is in after it accepted an end-of-sequence token.
FINISHED = -2
#: ``forced_tokens`` stops after this many tokens.
MAX_FORCED_TOKENS = 1024
#: A structure's transition cache is bounded by this fraction of its ``cache_bytes``, on top of the masks' (16 MiB at
#: the default 256 MiB, some 50,000 transitions of a JSON Schema); a grammar's caches of runs and local steps
#: (:class:`~constrain.runtime.pushdown.GrammarStructure`) share another such fraction. All count against the
#: process's cache budget (:func:`constrain.cache.set_cache_budget`).
TRANSITION_CACHE_SHARE = 16


class TransitionCache:
    """The transitions ``(state, token) -> next state`` that matchers of one structure have made (or another map of
    a structure's pure functions), bounded in bytes, thread-safe, shared by every matcher of the structure.

    Reading a token is a pure function of the state and the token (the structure never changes), so a cached
    transition is exactly what reading the token again would give. Only transitions that succeeded are kept, so a
    hit also says that every check of the token passed. Look-ups and insertions are each one operation on a
    dictionary, atomic under the GIL, so they take no lock: a look-up moves nothing, and neither keeps an order.
    When an insertion would pass the bound, the cache is emptied first (under a lock, so that two threads do not
    both empty it): what a structure's matchers use again soon comes back in one read each. ``max_bytes`` 0
    keeps nothing. The byte count is an estimate: on a build without the GIL, two insertions at the same instant
    may count one.

    The cache counts against ``budget`` (the process's :class:`~constrain.cache.CacheBudget` by default; None:
    none) as one entry, whose bytes it reports each time they grew by :attr:`REPORT_BYTES` (so that an insertion
    seldom waits on the budget's lock); when the budget evicts that entry, the cache is emptied.
    """

    __slots__ = ("max_bytes", "get", "_map", "_bytes", "_lock", "_budget", "_number", "_reported", "__weakref__")

    #: What one entry costs besides what its key and value hold: the dictionary's slot and the key tuple.
    ENTRY_BYTES = 160
    #: The cache tells its budget its bytes again each time they grew by this much since it last did.
    REPORT_BYTES = 64 * 1024

    def __init__(self, max_bytes: int, *, budget: CacheBudget | None = PROCESS_BUDGET):
        self.max_bytes = int(max_bytes)
        self._map: dict[Hashable, Any] = {}
        #: ``get(key)``: the value, or None when the key is not cached.
        self.get = self._map.get
        self._bytes = 0
        self._reported = 0
        self._lock = threading.Lock()
        self._budget = budget if self.max_bytes > 0 else None
        self._number = -1  # its number in the budget, given when it first reports its bytes (-1 until then)

    def put(self, key: Hashable, value: Any, nbytes: int) -> None:
        """Keep ``value`` (never None) for ``key``; ``nbytes``: what the key and the value hold (for a transition,
        :func:`state_bytes` of its state and next state, or twice the next state's: the state is most often an
        earlier transition's next state, shared)."""
        nbytes += self.ENTRY_BYTES
        if self._bytes + nbytes > self.max_bytes:
            if nbytes > self.max_bytes:
                return
            self._empty()
        self._map[key] = value
        self._bytes += nbytes
        if self._bytes - self._reported >= self.REPORT_BYTES:
            self._report()

    def _report(self) -> None:
        with self._lock:
            self._reported = reported = self._bytes
            if self._number < 0 and self._budget is not None:
                self._number = self._budget.join(self)
        if self._number >= 0:
            self._budget.added(self._number, None, reported)

    def _empty(self) -> None:
        with self._lock:
            self._map.clear()
            self._bytes = self._reported = 0
        if self._number >= 0:
            self._budget.removed(self._number, None)

    def _drop(self, key: Hashable) -> None:
        """The budget evicted the cache (its one entry): empty it."""
        with self._lock:
            self._map.clear()
            self._bytes = self._reported = 0

    def clear(self) -> None:
        self._empty()

    @property
    def nbytes(self) -> int:
        """The bytes the cached entries are estimated to hold."""
        return self._bytes

    def __len__(self) -> int:
        return len(self._map)


def state_bytes(state: Hashable) -> int:
    """About what a state holds in memory: an int (a DFA's), or a tuple of tuples of ints (a pushdown state's
    stacks: 56 bytes a tuple, 8 a slot, 28 an int)."""
    if type(state) is tuple:
        return 56 + 72 * len(state) + 36 * sum(map(len, state))
    return 28


class CompiledStructure:
    """A structure compiled for one vocabulary; thread-safe and shared by all the matchers made from it.

    Subclasses hold the automaton: they give the start state, read a token's bytes from a state, say whether a
    state may end the text, and own the mask cache (``masks``).
    """

    masks: MaskCache
    #: The transitions its matchers made (:class:`TransitionCache`), bounded by ``cache_bytes / 16``.
    transitions: TransitionCache
    #: Called after :attr:`nbytes` grew (a lazily built structure adding rules as matchers reach them), so that
    #: a cache holding the structure counts its bytes again; None: nobody is told.
    on_grown: Callable[[], None] | None = None

    def __init__(self, vocab: Vocabulary, *, source: str = "", cache_bytes: int = DEFAULT_CACHE_BYTES):
        check_cache_bytes(cache_bytes)
        self.vocab = vocab
        self.source = source
        self.eos_ids = vocab.eos_set
        self.transitions = TransitionCache(cache_bytes // TRANSITION_CACHE_SHARE)
        self._readable = vocab.readable  # per token id: 1 when its bytes are read
        self._size = vocab.size

    start: Hashable

    def read(self, state: Hashable, token: int) -> Hashable | None:
        """The state after the (matchable) ``token``'s bytes, or None when the structure rejects them."""
        raise NotImplementedError

    def transition(self, state: Hashable, token: int) -> Hashable | None:
        """:meth:`read`, for a transition that :attr:`transitions` does not hold: what matchers call. Keeps the
        transition when it is allowed; a subclass may serve it from a cache of its own instead."""
        nxt = self.read(state, token)
        if nxt is not None:
            self.transitions.put((state, token), nxt, 2 * state_bytes(nxt))
        return nxt

    def can_end(self, state: Hashable) -> bool:
        """Whether the text read up to ``state`` is a complete match."""
        raise NotImplementedError

    def forced_bytes(self, state: Hashable, limit: int) -> bytes:
        """The bytes that must follow ``state`` (at most ``limit``): each the only byte the structure allows, up to
        the first state that may end the text or allows more than one byte."""
        raise NotImplementedError

    @property
    def nbytes(self) -> int:
        """The bytes of its automata: what keeping it costs however little it is used (what the compile cache
        counts). Its mask cache, bounded by ``cache_bytes``, grows on top as masks are asked for."""
        raise NotImplementedError

    @property
    def bitmask_width(self) -> int:
        """Words per bitmask row needed for this vocabulary: ``ceil(vocab.size / 32)``."""
        return self.masks.width

    def matcher(self) -> Matcher:
        """A new matcher at the start of the structure."""
        return Matcher(self)


class DFAStructure(CompiledStructure):
    """A regular structure: one byte DFA (a regex, or anything without recursion)."""

    def __init__(self, dfa: ByteDFA, vocab: Vocabulary, *, source: str = "", cache_bytes: int = DEFAULT_CACHE_BYTES):
        super().__init__(vocab, source=source, cache_bytes=cache_bytes)
        self.dfa = dfa
        self.start = 0
        self.masks = StateMasks(dfa, vocab, cache_bytes=cache_bytes)
        # Flat views whose items index as Python ints: a token's few bytes are read in Python in less time than a
        # kernel call takes to start (about a microsecond: the whole budget of a first visit).
        self._trans = memoryview(np.ascontiguousarray(dfa.trans, dtype=np.int32)).cast("B").cast("i")
        self._data = memoryview(vocab.data)
        self._offsets = memoryview(vocab.offsets).cast("B").cast("q")

    def read(self, state: int, token: int) -> int | None:
        trans = self._trans
        for byte in self._data[self._offsets[token] : self._offsets[token + 1]]:
            state = trans[(state << 8) | byte]
            if state < 0:
                return None
        return state

    def can_end(self, state: int) -> bool:
        return bool(self.dfa.accepting[state])

    def forced_bytes(self, state: int, limit: int) -> bytes:
        trans, accepting = self.dfa.trans, self.dfa.accepting
        out = bytearray()
        while len(out) < limit and not accepting[state]:
            live = np.flatnonzero(trans[state] >= 0)
            if len(live) != 1:
                break
            out.append(int(live[0]))
            state = int(trans[state, live[0]])
        return bytes(out)

    @property
    def nbytes(self) -> int:
        return self.dfa.nbytes

    def __repr__(self) -> str:
        return f"DFAStructure({self.source!r}, states={self.dfa.num_states}, vocab={self.vocab.size:,})"


# A matcher's history is a chain of steps, each a plain tuple ``(state, parent step or None, tokens read)``
# (a named tuple took longer to make than the rest of a cached advance).
_STATE, _PARENT, _DEPTH = 0, 1, 2


class Matcher:
    """The state of one sequence inside a structure: which tokens may come next, and what was read."""

    __slots__ = ("structure", "_step")

    def __init__(self, structure: CompiledStructure):
        self.structure = structure
        self._step = (structure.start, None, 0)

    # -- reading tokens ----------------------------------------------------------------------------------------

    def _next_state(self, state: Hashable, token: int) -> Hashable:
        """The state after ``token`` (an int), or raise TokenError saying why it is not allowed."""
        nxt = self.structure.transitions.get((state, token))
        if nxt is not None:
            return nxt
        return self._read(state, token)

    def _read(self, state: Hashable, token: int) -> Hashable:
        """:meth:`_next_state` without the transition cache: check ``token``, read it, and cache the transition."""
        s = self.structure
        if 0 <= token < s._size and s._readable[token] and state != FINISHED:  # what the checks below let through
            nxt = s.transition(state, token)
            if nxt is not None:
                return nxt
        return self._read_checked(state, token)

    def _read_checked(self, state: Hashable, token: int) -> Hashable:
        """:meth:`_read`, each check in turn, so that the error says which failed."""
        s = self.structure
        vocab = s.vocab
        if not 0 <= token < vocab.size:
            raise TokenError(f"token id {token} is out of range for a vocabulary of {vocab.size:,} tokens")
        if state == FINISHED:
            raise TokenError(f"token {token} comes after the end of sequence")
        if token in s.eos_ids:
            if s.can_end(state):
                s.transitions.put((state, token), FINISHED, state_bytes(state) + 28)
                return FINISHED
            raise TokenError(f"end-of-sequence token {token} is not allowed: the structure is not complete")
        if not vocab.matchable[token]:
            raise TokenError(f"special token {token} is never allowed inside a structure")
        nxt = s.transition(state, token)
        if nxt is None:
            raise TokenError(f"token {token} ({vocab.token_bytes(token)!r}) is not allowed here")
        return nxt

    def advance(self, tokens: int | Iterable[int]) -> None:
        """Read one token, or several in order. A disallowed token raises TokenError and changes nothing.

        A token is a Python int, a numpy integer, or a 0-d / one-element integer array or tensor (what
        :meth:`~constrain.decoding.sampling.Sampler.sample` returns for one row); several are any iterable of those.
        Anything else (a bool, a float, a str, bytes, None) raises TokenError."""
        step = self._step
        if type(tokens) is int:  # the common case first: one token, a transition made before
            s = self.structure
            key = (step[0], tokens)
            nxt = s.transitions.get(key)
            if nxt is None:  # _read, inlined: a first visit is the next most common case
                state = step[0]
                if 0 <= tokens < s._size and s._readable[tokens] and state != FINISHED:
                    nxt = s.transition(state, tokens)
                    if nxt is None:
                        nxt = self._read_checked(state, tokens)
                else:
                    nxt = self._read_checked(state, tokens)
            self._step = (nxt, step, step[2] + 1)
            return
        single = _single_token(tokens)
        if single is not None:
            self._step = (self._next_state(step[_STATE], single), step, step[_DEPTH] + 1)
            return
        for i, token in enumerate(_token_sequence(tokens)):
            try:
                step = (self._next_state(step[_STATE], as_token_id(token)), step, step[_DEPTH] + 1)
            except TokenError as exc:
                raise TokenError(f"at position {i} of the tokens given: {exc}") from None
        self._step = step

    def accepts(self, token: int) -> bool:
        """Whether ``token`` is allowed now (nothing changes). TokenError if ``token`` is not a token id."""
        token = as_token_id(token)
        try:
            self._next_state(self._step[_STATE], token)
        except TokenError:
            return False
        return True

    def validate_tokens(self, tokens: Sequence[int]) -> int:
        """How many leading tokens of ``tokens`` the structure accepts in order (nothing changes): the part of a
        speculative draft worth verifying."""
        state = self._step[_STATE]
        ids = [as_token_id(token) for token in _token_sequence(tokens)]
        for i, token in enumerate(ids):
            try:
                state = self._next_state(state, token)
            except TokenError:
                return i
        return len(ids)

    def fill_draft_bitmasks(self, tokens: Sequence[int], bitmask: np.ndarray, start_row: int = 0) -> int:
        """One mask row per position of a speculative draft: row ``start_row + j`` gets the tokens allowed after
        the first ``j`` drafts, for ``j`` in ``0..len(tokens)`` (the last row is the bonus position). Reading stops
        at the first draft the structure rejects; the rows after it get 0 (nothing may be drawn there: the draft
        that leads to them is rejected). Nothing changes in the matcher. Returns how many drafts were read."""
        ids = [as_token_id(token) for token in _token_sequence(tokens)]
        _check_rows(bitmask, start_row, len(ids) + 1)
        probe = self.copy()
        read = 0
        for j in range(len(ids) + 1):
            if j == read:
                probe.fill_bitmask(bitmask, start_row + j)
                if j < len(ids):
                    try:
                        probe.advance(ids[j])
                        read += 1
                    except TokenError:
                        pass
            else:
                bitmask[start_row + j] = 0
        return read

    def fill_tree_bitmasks(
        self, tokens: Sequence[int], parents: Sequence[int], bitmask: np.ndarray, start_row: int = 0
    ) -> np.ndarray:
        """Masks for a tree of draft tokens. Node ``i`` holds ``tokens[i]`` and hangs below node ``parents[i]``
        (``-1``: below the current state); a parent comes before its children. Row ``start_row`` gets the mask
        here, row ``start_row + 1 + i`` the mask after the path to node ``i``. A node the structure rejects is
        pruned with its subtree: its row gets 0. Nothing changes in the matcher. Returns, per node, whether it
        was kept (bool array)."""
        ids = [as_token_id(token) for token in _token_sequence(tokens)]
        parents = [int(p) for p in parents]
        if len(parents) != len(ids):
            raise ShapeError(f"{len(ids)} draft tokens but {len(parents)} parent indices")
        for i, parent in enumerate(parents):
            if not -1 <= parent < i:
                raise ArgumentError(f"parents[{i}]", parent, f"-1 or the index of an earlier node (0..{i - 1})")
        _check_rows(bitmask, start_row, len(ids) + 1)
        self.fill_bitmask(bitmask, start_row)
        nodes: list[Matcher | None] = []
        for token, parent in zip(ids, parents):
            base = self if parent == -1 else nodes[parent]
            node = base.copy() if base is not None else None
            if node is not None:
                try:
                    node.advance(token)
                    node.fill_bitmask(bitmask, start_row + 1 + len(nodes))
                except TokenError:
                    node = None
            if node is None:
                bitmask[start_row + 1 + len(nodes)] = 0
            nodes.append(node)
        return np.array([node is not None for node in nodes], dtype=bool)

    def rollback(self, num_tokens: int = 1) -> None:
        """Undo the last ``num_tokens`` tokens."""
        if isinstance(num_tokens, bool) or not isinstance(num_tokens, (int, np.integer)):
            raise ArgumentError("num_tokens", num_tokens, "how many tokens to undo, an int")
        if not 0 <= num_tokens <= self._step[_DEPTH]:
            raise TokenError(f"cannot roll back {num_tokens} tokens: {self._step[_DEPTH]} have been read")
        step = self._step
        for _ in range(num_tokens):
            step = step[_PARENT]
        self._step = step

    def reset(self) -> None:
        """Back to the start of the structure."""
        self._step = (self.structure.start, None, 0)

    def copy(self) -> Matcher:
        """An independent matcher in the same state (O(1): histories are shared, never mutated)."""
        cls = type(self)  # a structure's own kind of matcher (GrammarStructure's) stays one
        other = cls.__new__(cls)
        other.structure = self.structure
        other._step = self._step
        return other

    # -- state -------------------------------------------------------------------------------------------------

    @property
    def num_tokens(self) -> int:
        """Tokens read since the start."""
        return self._step[_DEPTH]

    def is_accepting(self) -> bool:
        """Whether the text so far is a complete match (end of sequence is allowed now, or was read)."""
        state = self._step[_STATE]
        return state == FINISHED or self.structure.can_end(state)

    def is_finished(self) -> bool:
        """Whether an end-of-sequence token has been read."""
        return self._step[_STATE] == FINISHED

    # -- masks -------------------------------------------------------------------------------------------------

    def mask(self) -> np.ndarray:
        """The read-only int32 bitmask (``ceil(vocab.size / 32)`` words) of the tokens allowed now.

        After the end of sequence only the end-of-sequence tokens are allowed, so finished rows of a batch
        stay valid.
        """
        state = self._step[_STATE]
        masks = self.structure.masks
        return masks.eos_mask if state == FINISHED else masks.get(state)

    def fill_bitmask(self, bitmask: np.ndarray, row: int = 0) -> None:
        """Write the allowed tokens into ``bitmask[row]``; words past the vocabulary (padded logits) get 0.

        ``bitmask`` is int32 ``(batch, >= ceil(vocab.size / 32))``: a numpy array or a CPU torch tensor.
        """
        if type(bitmask) is not np.ndarray:
            bitmask = _as_numpy_bitmask(bitmask)
        width = self.structure.masks.width
        shape = bitmask.shape
        if bitmask.dtype != np.int32 or len(shape) != 2 or shape[1] < width:
            raise ShapeError(f"bitmask must be int32 of shape (batch, >= {width}), got {bitmask.dtype} {shape}")
        if type(row) is not int and (isinstance(row, (bool, np.bool_)) or not isinstance(row, np.integer)):
            raise ArgumentError("row", row, "an int index of the bitmask's rows")
        if not 0 <= row < shape[0]:
            raise ShapeError(f"row {row} is out of range for a bitmask of {shape[0]} rows")
        try:
            if shape[1] == width:
                bitmask[row] = self.mask()
            else:
                out = bitmask[row]
                out[:width] = self.mask()
                out[width:] = 0
        except ValueError:
            if not bitmask.flags.writeable:  # looked at only on failure: the write is the per-token hot path
                raise ShapeError("bitmask is read-only: fill_bitmask writes into it") from None
            raise

    def allowed_tokens(self) -> np.ndarray:
        """The ids of the tokens allowed now, ascending."""
        bits = np.unpackbits(self.mask().view(np.uint8), bitorder="little")
        return np.flatnonzero(bits[: self.structure.vocab.size])

    def forced_bytes(self, limit: int = 256) -> bytes:
        """The text that must come next whatever the tokens (at most ``limit`` bytes): empty where the structure
        may end, allows more than one byte, or has ended. :func:`~constrain.decoding.forcing.forced_continuation`
        tokenises it."""
        state = self._step[_STATE]
        return b"" if state == FINISHED else self.structure.forced_bytes(state, limit)

    def forced_tokens(self) -> list[int]:
        """The tokens that must come next because each is the only one allowed (for jump-forward decoding).

        Stops where more than one token is allowed or the end of sequence is possible.
        """
        forced: list[int] = []
        probe = self.copy()
        while len(forced) < MAX_FORCED_TOKENS and not probe.is_accepting():
            mask = probe.mask()
            nonzero = np.flatnonzero(mask)
            if len(nonzero) != 1:
                break
            word = int(mask[nonzero[0]]) & 0xFFFFFFFF
            if word & (word - 1):
                break
            token = int(nonzero[0]) * 32 + word.bit_length() - 1
            probe.advance(token)
            forced.append(token)
        return forced

    def __repr__(self) -> str:
        state = "finished" if self.is_finished() else f"state {self._step[_STATE]}"
        return f"<Matcher {state} after {self.num_tokens} tokens of {self.structure!r}>"


def _check_rows(bitmask: Any, start_row: Any, count: int) -> None:
    """ShapeError unless rows ``start_row .. start_row + count - 1`` exist in the 2-D ``bitmask``."""
    shape = tuple(getattr(bitmask, "shape", ()))
    if len(shape) != 2:
        raise ShapeError(f"bitmask must be int32 of shape (rows, words), got shape {shape}")
    if isinstance(start_row, bool) or not isinstance(start_row, (int, np.integer)):
        raise ArgumentError("start_row", start_row, "an int index of the bitmask's rows")
    if start_row < 0 or start_row + count > shape[0]:
        raise ShapeError(f"{count} rows from row {start_row} do not fit a bitmask of {shape[0]} rows")


def _as_numpy_bitmask(bitmask) -> np.ndarray:
    """A CPU torch bitmask viewed as numpy without a copy."""
    if type(bitmask).__module__.startswith("torch"):
        if bitmask.device.type != "cpu":
            raise ShapeError("fill_bitmask writes into a CPU bitmask; copy it to the device afterwards")
        return bitmask.numpy()
    raise ShapeError(f"bitmask must be a numpy array or a CPU torch tensor, got {type(bitmask).__name__}")


_INTEGER_TENSOR_TYPES = frozenset({"torch.int64", "torch.int32", "torch.int16", "torch.int8", "torch.uint8"})


def as_token_id(value: Any) -> int:
    """``value`` as a token id: a Python int, a numpy integer, or a 0-d / one-element integer array or tensor.
    TokenError for anything else, so that a bool, a float or a string is never read as a token."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.ndarray) and value.size == 1 and value.dtype.kind in "iu":
        return int(value.reshape(()))
    if type(value).__module__.startswith("torch") and hasattr(value, "numel"):
        if value.numel() == 1 and str(value.dtype) in _INTEGER_TENSOR_TYPES:
            return int(value.reshape(()).item())
    raise TokenError(f"a token id must be an integer, got {type(value).__name__} {value!r:.80}")


def _single_token(tokens: Any) -> int | None:
    """The id when ``tokens`` is one token (a scalar, or a 0-d array or tensor), else None."""
    if isinstance(tokens, (int, np.integer)) and not isinstance(tokens, (bool, np.bool_)):
        return int(tokens)
    if getattr(tokens, "ndim", None) == 0:
        return as_token_id(tokens)
    return None


def _token_sequence(tokens: Any) -> Iterable[Any]:
    """``tokens`` as an iterable of tokens; TokenError for what is not a sequence of token ids."""
    if isinstance(tokens, (str, bytes, bytearray, bool, np.bool_, float)) or tokens is None:
        raise TokenError(
            f"tokens must be a token id or a sequence of token ids, got {type(tokens).__name__} {tokens!r:.80}"
        )
    if type(tokens).__module__.startswith("torch") and hasattr(tokens, "tolist"):
        return tokens.reshape(-1).tolist() if str(tokens.dtype) in _INTEGER_TENSOR_TYPES else [tokens]
    if isinstance(tokens, np.ndarray):
        return tokens.reshape(-1).tolist() if tokens.dtype.kind in "iu" else [tokens]
    try:
        return list(tokens)
    except TypeError:
        raise TokenError(f"tokens must be a token id or a sequence of token ids, got {type(tokens).__name__}") from None
