"""Draft sources for speculative decoding (:mod:`constrain.decoding.speculative`).

- :class:`PromptLookup`: the tokens that followed the latest earlier occurrence of the sequence's last n-gram, in
  the prompt or the text so far (outputs that copy spans of their prompt draft themselves).
- :class:`ForcedDrafts`: what the structure forces next; as tokens that are each the only one allowed they are
  always accepted (``p = q = 1``), as the tokenizer's split of the forced text they usually are, and either way the
  output is exactly the one without speculation.
- :class:`ModelDraft`: a smaller model (any model of the loop that can roll back) sampling drafts from its own
  distribution under the same mask and transforms; :func:`early_exit_model` makes one from the target itself by
  running only its first layers (self-speculation).
- :class:`ChainedDrafts`: one source after another, each continuing where the previous stopped.
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np

from constrain.decoding.forcing import Tokenize, forced_continuation
from constrain.decoding.speculative import Draft, DraftContext
from constrain.errors import ArgumentError
from constrain.kernels.bitmask import few_allowed_ids


class PromptLookup:
    """Drafts by n-gram lookup: find the latest earlier place where the last ``n`` tokens (``max_ngram`` down to
    ``min_ngram``) occurred, and propose the tokens that followed it."""

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1):
        for name, value in (("max_ngram", max_ngram), ("min_ngram", min_ngram)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ArgumentError(name, value, "an int >= 1")
        if min_ngram > max_ngram:
            raise ArgumentError("min_ngram", min_ngram, f"<= max_ngram ({max_ngram})")
        self.max_ngram, self.min_ngram = max_ngram, min_ngram

    def propose(self, context: DraftContext) -> Draft:
        tokens = np.asarray(context.tokens, dtype=np.int64)
        for n in range(min(self.max_ngram, len(tokens) - 1), self.min_ngram - 1, -1):
            tail = tokens[-n:]
            # windows[i] = tokens[i : i + n]; a match must end before the last token, so something follows it
            windows = np.lib.stride_tricks.sliding_window_view(tokens[:-1], n)
            hits = np.flatnonzero((windows == tail).all(axis=1))
            if len(hits):
                start = int(hits[-1]) + n
                return Draft(tokens[start : start + context.k].tolist())
        return Draft([])


class ForcedDrafts:
    """Drafts what the structure forces: the forced tokens, or with ``tokenize`` the tokenizer's split of the forced
    text (see :mod:`constrain.decoding.forcing`). Proposes nothing for free text."""

    def __init__(self, tokenize: Tokenize | None = None):
        self.tokenize = tokenize

    def propose(self, context: DraftContext) -> Draft:
        if context.matcher is None:
            return Draft([])
        mode = "text" if self.tokenize is not None else "tokens"
        return Draft(forced_continuation(context.matcher, mode, tokenize=self.tokenize)[: context.k])


class ChainedDrafts:
    """Several sources in turn: each proposes from where the drafts so far end, until ``k`` tokens are drafted or
    every source has had its turn. Drafts proposed outright get ``q = 1``."""

    def __init__(self, *sources: Any):
        if not sources or any(not callable(getattr(s, "propose", None)) for s in sources):
            raise ArgumentError("sources", sources, "one or more draft sources")
        self.sources = sources

    @property
    def vocab(self) -> Any:
        """The vocabulary of the first source that has one (a draft model's)."""
        return next((v for v in (getattr(s, "vocab", None) for s in self.sources) if v is not None), None)

    def propose(self, context: DraftContext) -> Draft:
        tokens: list[int] = []
        rows: list[np.ndarray | None] = []
        for source in self.sources:
            room = context.k - len(tokens)
            if room <= 0:
                break
            matcher = context.matcher.copy() if context.matcher is not None else None
            if matcher is not None and matcher.validate_tokens(tokens) < len(tokens):
                break
            if matcher is not None:
                matcher.advance(tokens)
            sub = DraftContext(
                [*context.tokens, *tokens], context.prompt_length, matcher, room, context.params, context.width,
                context.rng,
            )  # fmt: skip
            draft = source.propose(sub)
            new = [int(t) for t in draft.tokens[:room]]
            tokens += new
            rows += list(draft.probs[: len(new)]) if draft.probs is not None else [None] * len(new)
        if all(r is None for r in rows):
            return Draft(tokens)
        probs = np.zeros((len(tokens), context.width))
        for j, (token, row) in enumerate(zip(tokens, rows)):
            if row is None:
                probs[j, token] = 1.0
            else:
                probs[j] = row
        return Draft(tokens, probs)


class ModelDraft:
    """Drafts sampled from a draft model under the same mask and sampling transforms as the target.

    ``model``: a model of the loop (``prefill``, ``extend``, ``rollback``, ``logits_width``) over the target's
    vocabulary, such as a :class:`~constrain.integrations.transformers_model.TransformersModel` of a smaller model
    (or of :func:`early_exit_model`). It keeps its own cache of what it read and rolls back to the sequence's
    accepted prefix at the next round. A model with a sparse output layer (``sparse_limit``) computes only the
    allowed tokens' logits at draft positions that allow few.
    """

    def __init__(self, model: Any):
        for name in ("prefill", "extend", "rollback"):
            if not callable(getattr(model, name, None)):
                raise ArgumentError("model", model, f"a model of the loop with {name}()")
        self.model = model
        self.vocab = getattr(model, "vocab", None)
        self.logits_width = getattr(model, "logits_width", None)
        self._read: list[int] = []

    def propose(self, context: DraftContext) -> Draft:
        tokens, probs = [], []
        matcher = context.matcher.copy() if context.matcher is not None else None
        logits = self._sync(list(context.tokens), self._allowed(matcher))
        for j in range(context.k):
            q = context.probs(_row(logits), matcher, tokens)
            token = context.draw(q)
            tokens.append(token)
            probs.append(q)
            if matcher is not None:
                matcher.advance(token)
                if matcher.is_finished():
                    break
            if j + 1 < context.k:
                logits = self.model.extend([[token]], self._allowed(matcher))
                self._read.append(token)
        return Draft(tokens, np.stack(probs) if probs else None)

    def _allowed(self, matcher: Any) -> list[np.ndarray] | None:
        """The allowed ids at ``matcher`` when the draft model projects so few sparsely, for its ``allowed``."""
        limit = getattr(self.model, "sparse_limit", 0)
        if not limit or matcher is None:
            return None
        size = matcher.structure.vocab.size
        mask = matcher.mask()
        ids = few_allowed_ids(mask, size, limit)
        return [ids] if ids is not None else None

    def _sync(self, sequence: list[int], allowed: list[np.ndarray] | None) -> Any:
        """Bring the draft model's cache to ``sequence`` (rolling back what differs); the logits after it."""
        keep = 0
        limit = min(len(self._read), len(sequence) - 1)  # the last token is read again: its logits are needed
        while keep < limit and self._read[keep] == sequence[keep]:
            keep += 1
        if keep == 0:
            logits = self.model.prefill([sequence], allowed)
        else:
            self.model.rollback(len(self._read) - keep)
            logits = self.model.extend([sequence[keep:]], allowed)
        self._read = list(sequence)
        return logits


def _row(logits: Any) -> Any:
    return logits[0] if getattr(logits, "ndim", 1) == 2 else logits


def early_exit_model(model: Any, layers: int) -> Any:
    """A view of a transformers causal LM that runs only its first ``layers`` decoder layers, then its final norm
    and output layer: a draft model sharing the target's weights (self-speculative decoding). The target is not
    changed."""
    decoder = model.get_decoder()
    total = len(decoder.layers)
    if isinstance(layers, bool) or not isinstance(layers, int) or not 1 <= layers < total:
        raise ArgumentError("layers", layers, f"an int in 1..{total - 1}: fewer layers than the model's {total}")
    shallow_decoder = copy.copy(decoder)
    shallow_decoder._modules = dict(decoder._modules)  # nn.Module keeps submodules in a dict a shallow copy shares
    config = copy.deepcopy(decoder.config)
    config.num_hidden_layers = layers
    if isinstance(getattr(config, "layer_types", None), list):
        config.layer_types = config.layer_types[:layers]
    shallow_decoder.config = config
    shallow_decoder.layers = type(decoder.layers)(list(decoder.layers)[:layers])
    shallow = copy.copy(model)
    shallow._modules = dict(model._modules)
    name = next(n for n, m in model.named_children() if m is decoder)
    setattr(shallow, name, shallow_decoder)
    shallow.config = config
    return shallow
