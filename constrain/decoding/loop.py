"""The decoding loop: prompts in, tokens out, each row inside its structure, on any model that gives logits.

A model plugs in through :class:`LogitsModel`: it reads prompts (``prefill``) and the new tokens of every row
(``extend``), keeps its own cache of what it read, and returns the logits of the next token of every row. The loop
owns everything else, the same way for every backend:

- each row's :class:`~constrain.runtime.matcher.Matcher` writes its allowed tokens into one shared bitmask
  *before* the forward pass, so a model with a sparse output layer (``sparse_limit``) computes the logits of
  only those tokens for rows that allow few;
- :class:`~constrain.decoding.sampling.Sampler` applies the sampling pipeline under that mask and draws a token;
- the matcher reads the token, then the tokens the structure forces after it (:mod:`constrain.decoding.forcing`)
  are appended without sampling, and the next forward pass reads them all at once;
- a row ends on an end-of-sequence token, or as soon as its structure is complete and allows nothing but the
  end of sequence (no forward pass is spent on a token that has no choice), or at its ``max_new_tokens`` (one
  for every row or one per row), or when the caller ends it (:meth:`Decoding.stop_row`: a stop string found in
  its text);
- with a :class:`~constrain.decoding.speculative.Speculation` (one row), each forward pass after the first also
  verifies draft tokens (see :mod:`constrain.decoding.speculative`);
- with a :class:`~constrain.decoding.contrastive.Contrastive`, an amateur model reads the same tokens as the model
  in every pass (its own cache in step, forced tokens included), and the sampler draws from the contrastive scores
  instead of the logits (see :mod:`constrain.decoding.contrastive`).

The penalties of :class:`~constrain.decoding.params.SamplingParams` count the generated tokens, forced ones
included (OpenAI's convention), not the prompt.

With ``logprobs=k``, each generated token comes with a :class:`TokenLogprob`: its log-probability and the ``k``
most likely alternatives under the model's distribution *under the structure* (the log-softmax of the logits after
the penalties, the logit bias and the structure mask, before temperature and top-k/p/min-p: OpenAI reports the
model's distribution, not the sampler's) and that distribution's entropy; its log-probability under the raw model
(the log-softmax of the logits as the model gave them; None at a step where a sparse output layer computed the
allowed tokens' logits only); and under the distribution the sampler drew it from. A token the structure forces
(fast-forward) had probability 1 under the structure: log-probability 0.0, itself as its only alternative,
entropy 0.0, and its raw log-probability is unknown (None: the pass that reads forced tokens gives logits after
the last of them only). Under speculative decoding the records of the accepted tokens come from the verifying
pass's logits and are those plain decoding gives.

:class:`Decoding` is iterable: each step yields the tokens appended in that step, so a caller can stream them; the
rows (:class:`DecodedRow`) hold the tokens and why each row stopped. Finished rows of a batch keep being fed an
end-of-sequence token until every row is done (their logits are ignored).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import numpy as np

from constrain.decoding.contrastive import Contrastive, contrastive_scores
from constrain.decoding.forcing import FAST_FORWARD_MODES, FastForward, Tokenize, forced_continuation
from constrain.decoding.params import SamplingParams
from constrain.decoding.sampling import Sampler, next_token_probs
from constrain.decoding.speculative import DraftContext, Speculation, SpeculationStats, Timer, accept
from constrain.decoding.transforms import apply_logit_bias, apply_penalties, apply_structure_mask, entropy, log_softmax
from constrain.errors import ArgumentError, ContextLengthError, ShapeError, TokenError, VocabularyError
from constrain.kernels.bitmask import allocate_token_bitmask, few_allowed_ids
from constrain.runtime.matcher import CompiledStructure, Matcher

FinishReason = Literal["stop", "length"]
#: Most alternatives a token's :class:`TokenLogprob` lists (OpenAI's bound on ``top_logprobs``).
MAX_TOP_LOGPROBS = 20
#: Per row, the ids its next token may take when the loop asks for a sparse output layer; None: all logits.
Allowed = Sequence[np.ndarray | None]


class LogitsModel(Protocol):
    """What the loop needs from a model. It keeps the cache of the rows it has read since the last ``prefill``.

    ``allowed``, when given, holds per row the ascending ids the next token may take, or None: a model may compute
    the logits of those ids only (the others are never drawn, whatever their value); one that cannot ignores it.
    """

    #: Width of a row of logits (may exceed the vocabulary: padded output layers).
    logits_width: int
    #: Most tokens one row may hold (prompt and generated), or None when unbounded.
    context_length: int | None
    #: Most rows one ``prefill`` may take, or None when unbounded.
    max_batch: int | None
    #: Largest allowed set the model projects sparsely; 0 when it always computes every logit.
    sparse_limit: int

    def prefill(self, prompts: Sequence[Sequence[int]], allowed: Allowed | None = None) -> Any:
        """Read new prompts (forgetting earlier rows); the logits of each row's next token, ``(batch, width)``."""
        ...

    def extend(self, tokens: Sequence[Sequence[int]], allowed: Allowed | None = None) -> Any:
        """Read one or more new tokens per row; the logits of each row's next token, ``(batch, width)``."""
        ...


class VerifyingModel(LogitsModel, Protocol):
    """A model that speculative decoding can run on (one row): it returns the logits after each of the last tokens
    read, and forgets tokens read."""

    def verify(self, tokens: Sequence[int], keep: int, allowed: Allowed | None = None) -> Any:
        """Read ``tokens`` (one row); the logits after each of the last ``keep`` of them, ``(keep, width)``;
        ``allowed`` holds one entry per kept position."""
        ...

    def rollback(self, num_tokens: int) -> None:
        """Forget the last ``num_tokens`` tokens read."""
        ...


@dataclass(frozen=True)
class TokenLogprob:
    """A generated token's log-probabilities at its position, the most likely alternatives there, and the entropy.

    ``logprob``: under the model's distribution *under the structure*: the log-softmax of the logits after the
    penalties, the logit bias and the structure mask, before temperature and top-k/p/min-p.
    ``top``: ``(token, logprob)`` pairs of that distribution by decreasing log-probability (ties by token id), at
    most the ``logprobs`` asked for; tokens the structure rules out (log-probability ``-inf``) are never listed, so
    a position that allows fewer tokens lists fewer.
    ``model_logprob``: under the raw model: the log-softmax of its logits before the penalties, the bias and the
    mask (over the model's whole row of logits). None where the model did not compute them all at the position:
    a forced token, or a step its sparse output layer projected to the allowed tokens only.
    ``sampled_logprob``: under the distribution the token was drawn from, after temperature and top-k/p/min-p (0.0
    for greedy's arg-max; under contrastive decoding, the distribution of the contrastive scores). None where
    nothing was drawn (beam search).
    ``entropy``: of the distribution under the structure (the one of ``logprob``), in nats.

    A forced token (fast-forward) has ``logprob`` 0.0, ``top == [(token, 0.0)]``, ``sampled_logprob`` 0.0,
    ``entropy`` 0.0 and ``model_logprob`` None."""

    token: int
    logprob: float
    top: list[tuple[int, float]]
    model_logprob: float | None = None
    sampled_logprob: float | None = None
    entropy: float | None = None


@dataclass
class DecodedRow:
    """One row of a :class:`Decoding`: the generated tokens (end-of-sequence tokens left out) and how it ended.

    ``forced``: how many of ``tokens`` were appended without sampling (fast-forward). ``logprobs``: one
    :class:`TokenLogprob` per token of ``tokens`` when the decoding asked for them for this row, else None.
    ``max_new_tokens``: the row's budget."""

    prompt_tokens: int
    matcher: Matcher | None
    tokens: list[int] = field(default_factory=list)
    finish_reason: FinishReason | None = None
    forced: int = 0
    logprobs: list[TokenLogprob] | None = None
    max_new_tokens: int = 256

    @property
    def complete(self) -> bool:
        """Whether the text is a whole match of the row's structure (always true without one)."""
        return self.matcher is None or self.matcher.is_accepting()


class Decoding:
    """One batch of rows decoded together; iterate to run it step by step.

    ``prompts``: token ids per row. ``structures``: None (free text), one structure for every row, or one per row
    (None for a free row). ``sampling``: one :class:`SamplingParams` for every row or one per row.
    ``eos_ids``: the tokens that end a row; a structured row also ends on its vocabulary's end-of-sequence ids.
    ``fast_forward``: ``"tokens"``, ``"text"`` or ``"off"`` (see :mod:`constrain.decoding.forcing`), for every row
    or one per row; ``"text"`` needs ``tokenize``, the tokenizer's split of a text without special tokens.
    ``speculation``: draft tokens verified by the model, for one row on a :class:`VerifyingModel`; its figures are
    in ``speculation_stats``. ``max_new_tokens``: one budget for every row or one per row. ``logprobs``: None (no
    log-probabilities, no cost), or how many alternatives (0 to 20) each generated token lists in its
    :class:`TokenLogprob` (``row.logprobs``), for every row or one per row (None for a row that wants none).
    ``contrastive``: draw from contrastive scores against an amateur (:class:`Contrastive`, whose amateur is a
    :class:`LogitsModel` or a temperature); not combined with speculation.
    """

    def __init__(
        self,
        model: LogitsModel,
        prompts: Sequence[Sequence[int]],
        *,
        structures: CompiledStructure | Sequence[CompiledStructure | None] | None = None,
        sampling: SamplingParams | Sequence[SamplingParams] | None = None,
        max_new_tokens: int | Sequence[int] = 256,
        eos_ids: Sequence[int] = (),
        fast_forward: FastForward | Sequence[FastForward] = "tokens",
        tokenize: Tokenize | None = None,
        speculation: Speculation | None = None,
        logprobs: int | Sequence[int | None] | None = None,
        contrastive: Contrastive | None = None,
    ):
        prompts = [list(p) for p in prompts]
        if not prompts or any(not p for p in prompts):
            raise ArgumentError("prompts", prompts, "one or more non-empty lists of token ids")
        limits = _row_limits(max_new_tokens, len(prompts))
        self._top = _row_logprobs(logprobs, len(prompts))
        if model.max_batch is not None and len(prompts) > model.max_batch:
            raise ArgumentError("prompts", f"{len(prompts)} rows", f"this model decodes at most {model.max_batch}")
        if model.context_length is not None:
            for p, limit in zip(prompts, limits):
                if len(p) + limit > model.context_length:
                    raise ContextLengthError(len(p), limit, model.context_length)
        per_row = _per_row(structures, len(prompts))
        vocab_sizes = {s.vocab.size for s in per_row if s is not None}
        if any(size > model.logits_width for size in vocab_sizes):
            raise VocabularyError(
                f"the structure's vocabulary has {max(vocab_sizes):,} tokens but the model's logits have "
                f"{model.logits_width:,} columns: tokenizer and model do not match"
            )
        self.modes = _fast_forward_modes(fast_forward, len(prompts), tokenize)
        if speculation is not None:
            if not isinstance(speculation, Speculation):
                raise ArgumentError("speculation", speculation, "a Speculation(source, k)")
            if len(prompts) != 1:
                raise ArgumentError("prompts", f"{len(prompts)} rows", "one row under speculative decoding")
            if contrastive is not None:
                raise ArgumentError("contrastive", contrastive, "None under speculative decoding")
            if not callable(getattr(model, "verify", None)) or not callable(getattr(model, "rollback", None)):
                raise ArgumentError("model", model, "a model with verify() and rollback() for speculative decoding")
            _check_draft_vocabulary(speculation.source, model)
        self.speculation = speculation
        self.contrastive = _check_contrastive(contrastive, model, len(prompts))
        self._amateur_logits: Any = None
        #: The allowed ids the last pass projected each row to (None: every logit), as :meth:`_fill_masks` gave them.
        self._projected: list[np.ndarray | None] | None = None
        #: Rounds, acceptance per position and time of speculative decoding (None without it).
        self.speculation_stats = SpeculationStats(speculation.k) if speculation is not None else None
        self.model = model
        self.prompts = prompts
        #: The largest budget of a row (each row's own is ``rows[i].max_new_tokens``).
        self.max_new_tokens = max(limits)
        self.eos_ids = frozenset(int(t) for t in eos_ids)
        self.tokenize = tokenize
        self.rows = [
            DecodedRow(
                len(p), s.matcher() if s is not None else None, logprobs=[] if top is not None else None,
                max_new_tokens=limit,
            )
            for p, s, limit, top in zip(prompts, per_row, limits, self._top)
        ]  # fmt: skip
        self._want_logprobs = any(top is not None for top in self._top)
        self.sampler = Sampler(sampling if sampling is not None else SamplingParams(temperature=0.0))
        self._constrained = any(s is not None for s in per_row)
        self._bitmask = allocate_token_bitmask(len(prompts), model.logits_width) if self._constrained else None
        self._pad = min(self.eos_ids) if self.eos_ids else 0
        self._started = False
        #: Forward passes run, rows of logits asked of them (a row per live or finished row of a plain pass, a
        #: row per verified position of a speculative one), and those asked sparsely.
        self.forward_passes = 0
        self.logit_rows = 0
        self.sparse_row_steps = 0

    @property
    def done(self) -> bool:
        return all(row.finish_reason is not None for row in self.rows)

    def stop_row(self, i: int) -> None:
        """End row ``i`` now with finish reason ``"stop"`` (a caller that found a stop string in its text): its
        tokens stay as they are and the loop feeds it nothing more. Call it between steps (while iterating); a
        row already ended keeps its reason. When every row has ended, the iteration ends without another pass."""
        if isinstance(i, bool) or not isinstance(i, int) or not -len(self.rows) <= i < len(self.rows):
            raise ArgumentError("i", i, f"a row index in 0..{len(self.rows) - 1}")
        row = self.rows[i]
        if row.finish_reason is None:
            row.finish_reason = "stop"

    def __iter__(self) -> Iterator[list[tuple[int, int]]]:
        """Run the batch; each step yields ``(row, token)`` for every token appended in it."""
        if self._started:
            raise ArgumentError("Decoding", "iterated twice", "a decoding runs once; make a new one")
        self._started = True
        appended: list[tuple[int, int]] = []
        chunks = [self._fast_forward(i, appended) for i in range(len(self.rows))]  # forced from the start
        if appended:
            yield appended
        if self.done:
            return
        logits = self._forward("prefill", [p + c for p, c in zip(self.prompts, chunks)])
        while True:
            appended, chunks = self._step(logits)
            if appended:
                yield appended
            while self.speculation is not None and not self.done:
                appended, chunks, verified = self._speculate(chunks[0])
                if not verified:
                    break  # no draft worth a pass: a plain step
                if appended:
                    yield appended
            if self.done:
                return
            logits = self._forward("extend", self._feeds(chunks))

    def _feeds(self, chunks: list[list[int]]) -> list[list[int]]:
        """Each row's feed of the next pass: a row the caller stopped (:meth:`stop_row`) gets the padding token."""
        return [c if row.finish_reason is None else [self._pad] for c, row in zip(chunks, self.rows)]

    def run(self) -> list[DecodedRow]:
        """Decode to the end; the rows."""
        for _ in self:
            pass
        return self.rows

    def _forward(self, call: str, tokens: list[list[int]]) -> Any:
        """Fill the masks of the next step, then run the model (``"prefill"`` or ``"extend"``) on ``tokens`` with
        the rows' allowed ids; a model amateur reads the same tokens."""
        allowed = self._fill_masks()
        self._projected = allowed
        self.forward_passes += 1
        self.logit_rows += len(tokens)
        amateur = self.contrastive.amateur if self.contrastive is not None else None
        if amateur is not None:
            sparse = allowed is not None and getattr(amateur, "sparse_limit", 0)
            self._amateur_logits = getattr(amateur, call)(tokens, allowed) if sparse else getattr(amateur, call)(tokens)
        if allowed is None:
            return getattr(self.model, call)(tokens)
        self.sparse_row_steps += sum(a is not None for a in allowed)
        return getattr(self.model, call)(tokens, allowed)

    def _fill_masks(self) -> list[np.ndarray | None] | None:
        """Write each live structured row's mask into the bitmask; the allowed ids of the rows the model may
        project sparsely (a finished row needs one logit at most: its draw is ignored)."""
        mask = self._bitmask
        if mask is None:
            return None
        limit = getattr(self.model, "sparse_limit", 0)
        allowed: list[np.ndarray | None] = [None] * len(self.rows)
        for i, row in enumerate(self.rows):
            if row.finish_reason is not None:
                mask[i] = -1
                if limit:
                    allowed[i] = np.array([self._pad], dtype=np.int64)
            elif row.matcher is not None:
                row.matcher.fill_bitmask(mask, i)
                size = row.matcher.structure.vocab.size
                if limit:
                    allowed[i] = few_allowed_ids(mask[i], size, limit)
            else:
                mask[i] = -1  # a free row: every token
        return allowed if any(a is not None for a in allowed) else None

    def _step(self, logits: Any) -> tuple[list[tuple[int, int]], list[list[int]]]:
        """Draw a token per live row, append it and what it forces; the tokens appended, and each row's feed."""
        rows = self.rows
        if logits.shape[0] != len(rows) or logits.shape[-1] < self.model.logits_width:
            raise ShapeError(f"the model returned logits of shape {tuple(logits.shape)} for {len(rows)} rows")
        history = [np.asarray(row.tokens, dtype=np.int64) for row in rows]
        scores = logits if self.contrastive is None else self._contrastive_scores(logits)
        logprobs: dict[int, TokenLogprob] = {}
        if self._want_logprobs:
            drawn, probs = self.sampler.sample_with_probs(scores, history=history, mask=self._bitmask)
            drawn = drawn.tolist() if hasattr(drawn, "tolist") else list(drawn)
            logprobs = self._step_records(logits, history, probs, drawn)
        else:
            drawn = self.sampler.sample(scores, history=history, mask=self._bitmask)
            drawn = drawn.tolist() if hasattr(drawn, "tolist") else list(drawn)
        appended: list[tuple[int, int]] = []
        chunks: list[list[int]] = []
        for i, (row, token) in enumerate(zip(rows, drawn)):
            if row.finish_reason is None:
                if row.matcher is not None:
                    row.matcher.advance(token)
                if token in self.eos_ids or (row.matcher is not None and row.matcher.is_finished()):
                    row.finish_reason = "stop"
                else:
                    if i in logprobs:
                        row.logprobs.append(logprobs[i])
                    self._append(row, token, i, appended)
                    if row.finish_reason is None:
                        chunks.append([token] + self._fast_forward(i, appended))
                        continue
            chunks.append([self._pad])
        return appended, chunks

    def _contrastive_scores(self, logits: Any) -> np.ndarray:
        """The contrastive scores of every row (the sampler draws from them in place of the logits)."""
        c = self.contrastive
        amateur = c.amateur_logits(logits) if c.amateur is None else self._amateur_logits
        if amateur.shape[0] != len(self.rows) or amateur.shape[-1] < self.model.logits_width:
            raise ShapeError(f"the amateur returned logits of shape {tuple(amateur.shape)} for {len(self.rows)} rows")
        width = self.model.logits_width
        return contrastive_scores(logits[:, :width], amateur[:, :width], alpha=c.alpha, mask=self._bitmask)

    def _step_records(
        self, logits: Any, history: list[np.ndarray], probs: Any, drawn: list[int]
    ) -> dict[int, TokenLogprob]:
        """Per live row that asked for log-probabilities, the record of its drawn token."""
        rows = [i for i, row in enumerate(self.rows) if row.finish_reason is None and self._top[i] is not None]
        if not rows:
            return {}
        projected = self._projected
        records = token_records(
            logits[rows], [drawn[i] for i in rows], [self._top[i] for i in rows],
            history=[history[i] for i in rows], params=[self.sampler.row_params(i) for i in rows],
            mask=self._bitmask[rows] if self._bitmask is not None else None, probs=probs[rows],
            whole=[projected is None or projected[i] is None for i in rows],
        )  # fmt: skip
        return dict(zip(rows, records))

    def _speculate(self, chunk: list[int]) -> tuple[list[tuple[int, int]], list[list[int]], bool]:
        """One round of speculative decoding on the single row: drafts, one verifying pass, acceptance. Returns the
        tokens appended, the next feed, and whether a pass ran (False when no draft survived the structure)."""
        spec, stats, row = self.speculation, self.speculation_stats, self.rows[0]
        rng, params = self.sampler.generator(0), self.sampler.row_params(0)
        with Timer(stats, "draft_seconds"):
            block, forced, q, proposed = self._draft_block(rng, params)
        drafted = len(block) - sum(forced)
        if not block:
            if proposed:
                stats.record(proposed, 0, 0, 0)
            return [], [chunk], False
        mask = allocate_token_bitmask(len(block) + 1, self.model.logits_width)
        allowed = None
        if row.matcher is not None:
            row.matcher.fill_draft_bitmasks(block, mask, 0)
            allowed = self._sparse_rows(mask, row.matcher.structure.vocab.size)
        else:
            mask[:] = -1
        with Timer(stats, "verify_seconds"):
            logits = self.model.verify(chunk + block, len(block) + 1, allowed)
            self.forward_passes += 1
            self.logit_rows += len(block) + 1
            self.sparse_row_steps += sum(a is not None for a in allowed) if allowed is not None else 0
            history = [np.asarray(row.tokens + block[:j], dtype=np.int64) for j in range(len(block) + 1)]
            target = next_token_probs(logits, params, history=history, mask=mask)
            target = target.detach().cpu().numpy() if hasattr(target, "detach") else np.asarray(target)
            kept, token = accept(target.astype(np.float64), block, q, rng, forced=forced)
            self.model.rollback(len(block) - kept)
        observe = getattr(spec.source, "observe", None)
        if callable(observe):
            observe(block, kept, logits)
        records = self._verified_records(logits, history, mask, target, [*block[:kept], token], forced, allowed)
        appended: list[tuple[int, int]] = []
        for j, t in enumerate([*block[:kept], token]):
            if row.matcher is not None:
                row.matcher.advance(t)
            if t in self.eos_ids or (row.matcher is not None and row.matcher.is_finished()):
                row.finish_reason = "stop"
            else:
                if records is not None:
                    row.logprobs.append(records[j])
                self._append(row, t, 0, appended)
            if row.finish_reason is not None:
                break
        row.forced += sum(forced[:kept])
        stats.record(proposed, drafted, kept - sum(forced[:kept]), len(appended))
        chunk = [token] + self._fast_forward(0, appended) if row.finish_reason is None else [self._pad]
        return appended, [chunk], True

    def _verified_records(
        self,
        logits: Any,
        history: list[np.ndarray],
        mask: np.ndarray,
        target: np.ndarray,
        tokens: list[int],
        forced: list[bool],
        allowed: list[np.ndarray | None] | None,
    ) -> list[TokenLogprob] | None:
        """The records of a round's kept tokens (None when the row wants none): a forced draft's is a forced
        token's, the others' come from the verifying pass's logits at their positions and the target's sampling
        distribution there (the one plain decoding draws from)."""
        top = self._top[0]
        if top is None:
            return None
        n = len(tokens)
        records = token_records(
            logits[:n], tokens, [top] * n, history=history[:n], params=[self.sampler.row_params(0)] * n,
            mask=mask[:n], probs=target[:n], whole=[allowed is None or allowed[j] is None for j in range(n)],
        )  # fmt: skip
        return [
            _forced_record(t, top) if j < len(forced) and forced[j] else record
            for j, (t, record) in enumerate(zip(tokens, records))
        ]

    def _draft_block(
        self, rng: np.random.Generator, params: SamplingParams
    ) -> tuple[list[int], list[bool], list[np.ndarray | None], int]:
        """The block one round verifies: the source's drafts cut at the first the structure rejects, with what the
        structure forces after a draft inserted the way fast-forward appends it (so the output is the one without
        speculation), the source asked again after each insertion. Returns the tokens, which were forced, each
        draft's distribution (None: proposed outright), and how many tokens the source proposed."""
        spec, row = self.speculation, self.rows[0]
        room = min(spec.k, row.max_new_tokens - len(row.tokens) - 1)  # the token drawn after them needs room too
        probe = row.matcher.copy() if row.matcher is not None else None
        block: list[int] = []
        forced: list[bool] = []
        q: list[np.ndarray | None] = []
        proposed = 0
        while len(block) < room:
            context = DraftContext(
                self.prompts[0] + row.tokens + block, len(self.prompts[0]), probe.copy() if probe else None,
                room - len(block), params, self.model.logits_width, rng,
            )  # fmt: skip
            draft = spec.source.propose(context)
            tokens = [int(t) for t in draft.tokens[: context.k]]
            proposed += len(tokens)
            inserted = False
            for j, token in enumerate(tokens):
                if probe is not None:
                    try:
                        probe.advance(token)
                    except TokenError:
                        break
                block.append(token)
                forced.append(False)
                q.append(draft.probs[j] if draft.probs is not None else None)
                if token in self.eos_ids or (probe is not None and probe.is_finished()):
                    break
                extra = self._forced_after(probe, room - len(block))
                if extra:
                    block += extra
                    forced += [True] * len(extra)
                    q += [None] * len(extra)
                    inserted = True
                    break
            if not inserted:
                break
        return block, forced, q, proposed

    def _forced_after(self, probe: Matcher | None, room: int) -> list[int]:
        """What fast-forward would append at ``probe`` (moved past it), within ``room`` tokens."""
        if probe is None or room <= 0:
            return []
        extra = forced_continuation(probe, self.modes[0], tokenize=self.tokenize)[:room]
        probe.advance(extra)
        return extra

    def _sparse_rows(self, mask: np.ndarray, size: int) -> list[np.ndarray | None] | None:
        """Per mask row, its allowed ids when the model projects so few sparsely (else None); None when no row."""
        limit = getattr(self.model, "sparse_limit", 0)
        if not limit:
            return None
        rows = [few_allowed_ids(r, size, limit) for r in mask]
        return rows if any(r is not None for r in rows) else None

    def _fast_forward(self, i: int, appended: list[tuple[int, int]]) -> list[int]:
        """Append the tokens row ``i``'s structure forces now (within its token budget); those tokens."""
        row = self.rows[i]
        if row.matcher is None or row.finish_reason is not None:
            return []
        forced = forced_continuation(row.matcher, self.modes[i], tokenize=self.tokenize)
        forced = forced[: row.max_new_tokens - len(row.tokens)]
        row.matcher.advance(forced)
        for token in forced:
            if row.logprobs is not None:  # probability 1 under the structure
                row.logprobs.append(_forced_record(token, self._top[i]))
            self._append(row, token, i, appended)
        row.forced += len(forced)
        return forced

    def _append(self, row: DecodedRow, token: int, i: int, appended: list[tuple[int, int]]) -> None:
        """Append a token the row's matcher has read; end the row on its budget or a structure left complete."""
        row.tokens.append(token)
        appended.append((i, token))
        if len(row.tokens) >= row.max_new_tokens:
            row.finish_reason = "length"
        elif row.matcher is not None and self._only_end_left(row.matcher):
            row.finish_reason = "stop"

    @staticmethod
    def _only_end_left(matcher: Matcher) -> bool:
        """Whether the structure is complete and allows nothing but the end of sequence."""
        if not matcher.is_accepting():
            return False
        ends = matcher.structure.eos_ids
        allowed = matcher.allowed_tokens()
        return len(allowed) <= len(ends) and all(int(t) in ends for t in allowed)


def _row_limits(max_new_tokens: int | Sequence[int], batch: int) -> list[int]:
    """One token budget per row."""
    if isinstance(max_new_tokens, (int, np.integer)) and not isinstance(max_new_tokens, bool):
        limits = [int(max_new_tokens)] * batch
    elif isinstance(max_new_tokens, Sequence) and not isinstance(max_new_tokens, str):
        limits = list(max_new_tokens)
    else:
        limits = []
    ints = all(isinstance(n, (int, np.integer)) and not isinstance(n, bool) for n in limits)
    if len(limits) != batch or not ints or any(n < 1 for n in limits):
        raise ArgumentError("max_new_tokens", max_new_tokens, f"an int >= 1, or one per prompt ({batch})")
    return [int(n) for n in limits]


def _row_logprobs(logprobs: int | Sequence[int | None] | None, batch: int) -> list[int | None]:
    """Per row, how many alternatives its tokens' log-probabilities list (None: none computed)."""

    def valid(n: Any) -> bool:
        is_int = isinstance(n, (int, np.integer)) and not isinstance(n, bool)
        return n is None or (is_int and 0 <= n <= MAX_TOP_LOGPROBS)

    if logprobs is None or (isinstance(logprobs, (int, np.integer)) and not isinstance(logprobs, bool)):
        per_row = [logprobs] * batch
    elif isinstance(logprobs, Sequence) and not isinstance(logprobs, str):
        per_row = list(logprobs)
    else:
        per_row = []
    if len(per_row) != batch or not all(valid(n) for n in per_row):
        requirement = f"None, an int in 0..{MAX_TOP_LOGPROBS}, or one of those per prompt ({batch})"
        raise ArgumentError("logprobs", logprobs, requirement)
    return [None if n is None else int(n) for n in per_row]


def token_records(
    logits: Any,
    tokens: Sequence[int],
    tops: Sequence[int],
    *,
    history: Sequence[np.ndarray] | None = None,
    params: Sequence[SamplingParams] | None = None,
    mask: Any = None,
    probs: Any = None,
    whole: Sequence[bool] | None = None,
) -> list[TokenLogprob]:
    """One :class:`TokenLogprob` per row of ``logits`` (``(n, width)``, as the model gave them) for the chosen
    ``tokens``, each listing ``tops[r]`` alternatives. ``history`` and ``params``: the penalties' and the logit
    bias's inputs (none when None); ``mask``: the structure's bitmask rows (free text when None); ``probs``: the
    distributions the tokens were drawn from (``sampled_logprob`` None when None); ``whole``: per row, whether the
    model computed every logit (``model_logprob`` None where not: a sparse output layer's row). Costs a few passes
    over each row."""
    z = _host(logits)
    model = log_softmax(z)
    if params is not None:
        apply_penalties(z, list(history) if history is not None else None, list(params), inplace=True)
        apply_logit_bias(z, list(params), inplace=True)
    if mask is not None:
        apply_structure_mask(z, mask, inplace=True)
    structured = log_softmax(z)
    spread = entropy(structured)
    drawn = _host(probs) if probs is not None else None
    out = []
    for r, (token, top) in enumerate(zip(tokens, tops)):
        sampled = None
        if drawn is not None:
            p = float(drawn[r, token])
            sampled = math.log(p) if p > 0 else -math.inf
        raw = float(model[r, token]) if whole is None or whole[r] else None
        out.append(_token_logprob(structured[r], token, top, raw, sampled, float(spread[r])))
    return out


def _host(logits: Any) -> np.ndarray:
    """A float64 numpy copy of a block of logits or probabilities (a torch tensor comes to the host)."""
    if hasattr(logits, "detach"):
        logits = logits.detach().double().cpu().numpy()
    return np.array(logits, dtype=np.float64)


def _forced_record(token: int, top: int) -> TokenLogprob:
    """The record of a token the structure forced: certain under the structure, its raw log-probability unknown."""
    return TokenLogprob(token, 0.0, [(token, 0.0)][:top], model_logprob=None, sampled_logprob=0.0, entropy=0.0)


def _token_logprob(
    logprobs: np.ndarray, token: int, top: int, model: float | None, sampled: float | None, spread: float
) -> TokenLogprob:
    """``token``'s entry in a row of log-probabilities, with the ``top`` most likely tokens (finite ones only)."""
    alternatives: list[tuple[int, float]] = []
    if top:
        k = min(top, logprobs.shape[0])
        ids = np.argpartition(-logprobs, k - 1)[:k] if k < logprobs.shape[0] else np.arange(logprobs.shape[0])
        # a tie at the k-th value: argpartition picks among the tied arbitrarily; take the lowest ids
        cut = logprobs[ids].min()
        if np.isfinite(cut):
            tied = np.flatnonzero(logprobs == cut)
            ids = np.concatenate([ids[logprobs[ids] > cut], tied])
        ids = ids[np.isfinite(logprobs[ids])]
        order = np.lexsort((ids, -logprobs[ids]))[:k]
        alternatives = [(int(t), float(logprobs[t])) for t in ids[order]]
    return TokenLogprob(int(token), float(logprobs[token]), alternatives, model, sampled, spread)


def _per_row(
    structures: CompiledStructure | Sequence[CompiledStructure | None] | None, batch: int
) -> list[CompiledStructure | None]:
    if structures is None or isinstance(structures, CompiledStructure):
        return [structures] * batch
    per_row = list(structures)
    if len(per_row) != batch:
        raise ShapeError(f"{len(per_row)} structures for {batch} prompts: give one, or one per prompt")
    return per_row


def _check_contrastive(contrastive: Contrastive | None, model: LogitsModel, batch: int) -> Contrastive | None:
    """The settings, checked against the model: a model amateur must read the same batch and give as many
    logits."""
    if contrastive is None:
        return None
    if not isinstance(contrastive, Contrastive):
        raise ArgumentError("contrastive", contrastive, "a Contrastive(amateur=..., alpha=...)")
    amateur = contrastive.amateur
    if amateur is None:
        return contrastive
    if not callable(getattr(amateur, "prefill", None)) or not callable(getattr(amateur, "extend", None)):
        raise ArgumentError("contrastive", amateur, "an amateur with prefill() and extend() (a LogitsModel)")
    width = getattr(amateur, "logits_width", None)
    if width != model.logits_width:
        raise VocabularyError(f"the amateur's logits have {width} columns, the model's {model.logits_width:,}")
    if amateur.max_batch is not None and batch > amateur.max_batch:
        raise ArgumentError("prompts", f"{batch} rows", f"the amateur decodes at most {amateur.max_batch}")
    return contrastive


def _check_draft_vocabulary(source: Any, model: LogitsModel) -> None:
    """VocabularyError when a draft source's vocabulary or logits width differs from the target model's."""
    mine, theirs = getattr(model, "vocab", None), getattr(source, "vocab", None)
    if mine is not None and theirs is not None and mine.fingerprint != theirs.fingerprint:
        raise VocabularyError(
            f"the draft source's vocabulary ({theirs.size:,} tokens) is not the target model's ({mine.size:,}): "
            "drafts must be token ids of the target"
        )
    width = getattr(source, "logits_width", None)
    if width is not None and width != model.logits_width:
        raise VocabularyError(f"the draft model's logits have {width:,} columns, the target's {model.logits_width:,}")


def _fast_forward_modes(
    fast_forward: FastForward | Sequence[FastForward], batch: int, tokenize: Tokenize | None
) -> list[FastForward]:
    modes = [fast_forward] * batch if isinstance(fast_forward, str) else list(fast_forward)
    if len(modes) != batch or any(m not in FAST_FORWARD_MODES for m in modes):
        raise ArgumentError("fast_forward", fast_forward, f"one of {FAST_FORWARD_MODES}, or one per prompt")
    if "text" in modes and tokenize is None:
        raise ArgumentError("tokenize", None, "the tokenizer's split of a text, for fast_forward='text'")
    return modes
