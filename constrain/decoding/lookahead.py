"""Lookahead decoding as a draft source: the target proposes its own n-grams, refined by Jacobi steps.

Lookahead decoding (Fu et al., 2024) drafts without a draft model. It keeps a pool of n-grams and fills it from
Jacobi iteration: guess the next few tokens, run the target on the guesses, and take the target's argmax at each
guessed position as the new guess there. A guess conditioned on earlier guesses that were wrong is sometimes right
anyway (closing quotes, keys, repeated phrases), and the n-grams gathered along the way are drafted whenever the
text reaches their first token again.

:class:`LookaheadDrafts` does this inside :class:`~constrain.decoding.loop.Decoding`'s speculation, where a round
is one verifying pass over the drafts (:mod:`constrain.decoding.speculative`):

- **the pool** maps the last tokens (one to ``max_key`` of them) to the continuations seen after them (up to
  ``ngram - 1`` tokens), the most recent last, ``pool_size`` per key. It is fed by the n-grams of the prompt and
  the generated text, and by the target's guesses (text replaces the guesses it repeats);
- **the Jacobi step** happens in :meth:`LookaheadDrafts.observe`: the loop hands over the target's logits at
  every verified position; the argmax of row ``j`` is the target's guess of the token after the first ``j``
  drafts. The rows after the first rejected draft were computed on a prefix that is now known to be wrong; their
  argmaxes are the refined guess of the tokens after the one the loop appends (one Jacobi step). At the next
  :meth:`LookaheadDrafts.propose` that guess enters the pool keyed by the token actually appended, as do its own
  n-grams;
- **a proposal** gathers the pool's continuations of the last ``max_key`` tokens, of the last ``max_key - 1``
  and so on, keeps those whose first token the structure accepts, and takes text before guesses (a guess is the
  fallback when the text offers nothing, as the refined guess of the last round usually is), then the longest key
  (as prompt lookup takes the longest match), then the one the structure accepts furthest
  (:meth:`~constrain.runtime.matcher.Matcher.validate_tokens`), then the most recent. It continues the draft from
  the pool where the chosen continuation ends, up to ``k`` tokens.

How it differs from the paper: the paper runs two branches in the same forward pass, a lookahead branch of ``W``
Jacobi windows and a verification branch of ``G`` candidate n-grams, under a special attention mask. Our loop's
verifying pass is one causal block over one draft (the models of the loop take a sequence, not a tree), so the
Jacobi step is taken on the drafted block itself: the positions after a rejection are the lookahead, and there is
no separate lookahead branch and one candidate verified a round. The pool therefore grows only from the drafts
that were verified, and a round with nothing to draft costs a plain step and teaches the pool nothing new from the
target. The drafts are proposed outright (``q = 1``), so :func:`~constrain.decoding.speculative.accept` keeps the
output exactly that of decoding without speculation (the same tokens under greedy decoding).

Why guesses come after text: every drafted position adds a row to the verifying pass, output layer included
(with Gemma 3 270M on a CPU a pass over four drafts costs about 1.25 plain steps), and the target's guesses after a
rejection were right about a quarter of the time on JSON records (text n-grams: 60-90%), so a guess is drafted
only when the text has nothing to offer.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Any, Literal

import numpy as np

from constrain.decoding.speculative import Draft, DraftContext
from constrain.errors import ArgumentError
from constrain.runtime.matcher import Matcher

#: Where a continuation of the pool came from: the prompt or generated text, or the target's guesses.
Origin = Literal["text", "guess"]


class LookaheadDrafts:
    """Draft source of lookahead decoding: an n-gram pool fed by the text and by the target's Jacobi guesses.

    ``ngram``: length of the n-grams kept (a key token and up to ``ngram - 1`` tokens after it), >= 2.
    ``max_key``: longest key (the last tokens looked up), >= 1. ``pool_size``: continuations kept per key, the least
    recent dropped first, >= 1. ``guesses``: feed the pool with the target's guesses (False: text n-grams only, a
    pooled prompt lookup).

    One source follows one sequence: when a proposal's tokens do not continue the text it has read (a new
    decoding), it forgets the text and the pending guess but keeps the pool.
    """

    def __init__(self, ngram: int = 5, max_key: int = 4, pool_size: int = 8, *, guesses: bool = True):
        for name, value, least in (("ngram", ngram, 2), ("max_key", max_key, 1), ("pool_size", pool_size, 1)):
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ArgumentError(name, value, f"an int >= {least}")
        if not isinstance(guesses, bool):
            raise ArgumentError("guesses", guesses, "a bool")
        self.ngram, self.max_key, self.pool_size, self.guesses = ngram, max_key, pool_size, guesses
        #: Key (the last tokens) -> continuations seen after it, least recent first, with where each came from.
        self.pool: dict[tuple[int, ...], OrderedDict[tuple[int, ...], Origin]] = {}
        #: Per origin, draft tokens verified by the target and accepted by it.
        self.verified: dict[Origin, int] = {"text": 0, "guess": 0}
        self.accepted: dict[Origin, int] = {"text": 0, "guess": 0}
        self._text: list[int] = []
        self._complete = 0  # text positions whose continuation is full length (never indexed again)
        self._sequence: list[int] = []  # what the target read before the drafts of the last proposal
        self._origins: list[Origin] = []  # where each token of the last proposal came from
        self._pending: tuple[int, list[int]] | None = None  # (position of the next appended token, guesses after it)

    @property
    def size(self) -> int:
        """Continuations in the pool."""
        return sum(len(c) for c in self.pool.values())

    def count(self, origin: Origin) -> int:
        """Continuations in the pool that came from ``origin``."""
        return sum(o == origin for c in self.pool.values() for o in c.values())

    # -- the loop's calls ----------------------------------------------------------------------------------------

    def propose(self, context: DraftContext) -> Draft:
        tokens = [int(t) for t in context.tokens]
        self._read(tokens)
        self._sequence = tokens
        matcher = context.matcher.copy() if context.matcher is not None else None
        draft: list[int] = []
        origins: list[Origin] = []
        while len(draft) < context.k:
            found = self._best([*tokens[-self.max_key :], *draft][-self.max_key :], matcher)
            if found is None:
                break
            continuation, origin, valid = found
            new = list(continuation[: min(valid, context.k - len(draft))])
            draft += new
            origins += [origin] * len(new)
            if matcher is not None:
                matcher.advance(new)
                if matcher.is_finished():
                    break
            if valid < len(continuation):
                break  # the structure cut it: nothing after it can be drafted
        self._origins = origins
        return Draft(draft)

    def observe(self, drafts: Sequence[int], accepted: int, logits: Any) -> None:
        """The target's verdict on the last proposal: ``logits`` ``(len(drafts) + 1, width)``, row ``j`` after the
        first ``j`` drafts. Counts the accepted drafts by origin and keeps the target's guesses after the first
        rejected one (the Jacobi step) for the next proposal."""
        drafts = [int(t) for t in drafts]
        for j, origin in enumerate(self._origins[: len(drafts)]):
            self.verified[origin] += 1
            self.accepted[origin] += j < accepted
        if not self.guesses or accepted >= len(drafts):
            self._pending = None
            return
        guesses = _argmax(logits)
        # row ``accepted`` gives the token the loop appends; the rows after it, computed after the rejected draft,
        # are the refined guesses of the tokens that follow that one
        self._pending = (len(self._sequence) + accepted, guesses[accepted + 1 : len(drafts) + 1])

    # -- the pool ------------------------------------------------------------------------------------------------

    def _read(self, tokens: list[int]) -> None:
        """Index the text's new n-grams and the pending guesses now that the appended tokens are known."""
        known = len(self._text)
        if len(tokens) < known or tokens[:known] != self._text:
            self._text, self._complete, self._pending = [], 0, None  # another sequence
        self._text = tokens
        if self._pending is not None:
            position, guesses = self._pending
            self._pending = None
            if position < len(tokens):  # the token appended there, then the target's guesses after it
                guessed = [*tokens[max(0, position - self.max_key + 1) : position + 1], *guesses]
                for i in range(min(self.max_key - 1, position), len(guessed) - 1):
                    self._add(guessed, i, "guess")
        last = len(tokens) - 1
        for i in range(self._complete, last):
            self._add(tokens, i, "text")
        self._complete = max(self._complete, last - self.ngram + 2)

    def _add(self, sequence: Sequence[int], i: int, origin: Origin) -> None:
        """Keep ``sequence[i + 1 : i + ngram]`` after every key ending at position ``i`` (up to ``max_key`` tokens).

        A continuation replaces those it extends, and one already known (itself or a longer one) is only made the
        most recent; text replaces guesses, a guess never replaces text."""
        continuation = tuple(sequence[i + 1 : i + self.ngram])
        if not continuation:
            return
        for length in range(1, min(self.max_key, i + 1) + 1):
            key = tuple(sequence[i - length + 1 : i + 1])
            entries = self.pool.setdefault(key, OrderedDict())
            known = False
            for entry, was in list(entries.items()):
                if continuation[: len(entry)] == entry and (was == "guess" or origin == "text"):
                    del entries[entry]  # a prefix of this one (text seen before it was complete), or a guess
                elif entry[: len(continuation)] == continuation and (origin == "guess" or was == "text"):
                    entries.move_to_end(entry)
                    known = True
            if not known:
                entries[continuation] = origin
                while len(entries) > self.pool_size:
                    entries.popitem(last=False)

    def _best(self, tokens: list[int], matcher: Matcher | None) -> tuple[tuple[int, ...], Origin, int] | None:
        """The pool's best continuation of ``tokens`` among those whose first token the structure accepts: text
        before guesses, then the longest key, then the most tokens the structure accepts, then the most recent.
        With its origin and how many of its tokens the structure accepts; None when there is none."""
        best: tuple[tuple[bool, int, int, int], tuple[int, ...], Origin] | None = None
        for length in range(1, min(self.max_key, len(tokens)) + 1):
            entries = self.pool.get(tuple(tokens[-length:]))
            for recency, (continuation, origin) in enumerate((entries or {}).items()):
                valid = matcher.validate_tokens(continuation) if matcher is not None else len(continuation)
                score = (origin == "text", length, valid, recency)
                if valid and (best is None or score > best[0]):
                    best = (score, continuation, origin)
        return (best[1], best[2], best[0][2]) if best is not None else None


def _argmax(logits: Any) -> list[int]:
    """The index of the largest logit of each row (a torch tensor or an array)."""
    if hasattr(logits, "argmax") and hasattr(logits, "detach"):
        return [int(t) for t in logits.argmax(dim=-1).tolist()]
    return [int(t) for t in np.asarray(logits).argmax(axis=-1)]
