"""Requests from many callers decoded together: a :class:`Scheduler` batches them into shared forward passes.

::

    scheduler = Scheduler(llm)                        # a worker thread that owns the model while it decodes
    job = scheduler.submit(llm.backend.encode("Say hi:"), max_new_tokens=20, stop=["\\n"])
    for event in job.events():                        # Delta(index, text, tokens, logprobs) as they come,
        ...                                           # then Choice(index, text, tokens, finish_reason, ...)
    choices = job.result()                            # or wait for the choices only

Requests are submitted from any thread (``submit``), or from an event loop (``submit(..., loop=loop)``, then
``async for event in job.aevents()``). A worker thread takes the first request waiting, gathers every other that
arrives within ``window`` seconds (and everything queued while the previous batch ran), up to ``max_batch`` rows,
and decodes them as one :class:`~constrain.decoding.loop.Decoding`: one forward pass per step for all of them, each
row with its own structure, sampling, budget and fast-forward mode. A request with ``n`` choices is ``n`` rows. The
worker holds the :class:`~constrain.generation.llm.LLM`'s lock while it decodes, so calls on the handle and the
scheduler never use the model at once.

Stop strings are found in each row's decoded text: the text is cut before the stop string, the row is ended
(:meth:`Decoding.stop_row <constrain.decoding.loop.Decoding.stop_row>`), and a stream never shows text that a stop
string could still begin in (it is held back until it cannot).

A batch whose decoding raises is not lost: each of its rows that had not yet delivered anything runs again on its
own, so only the request at fault gets the error (a row that had delivered text gets the error too: its stream
cannot be taken back). The worker keeps serving.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from constrain.decoding.forcing import FAST_FORWARD_MODES, FastForward
from constrain.decoding.loop import MAX_TOP_LOGPROBS, Decoding, TokenLogprob
from constrain.decoding.params import SamplingParams
from constrain.errors import ArgumentError, ConstrainError, ContextLengthError, VocabularyError
from constrain.generation.streaming import TextStream
from constrain.runtime.matcher import CompiledStructure

#: Seconds the worker waits for more requests after the first one of a batch.
DEFAULT_WINDOW = 0.005
#: Most rows one batch decodes when neither the caller nor the model bounds it.
DEFAULT_MAX_BATCH = 16
#: The sampling of a request that names none: greedy.
GREEDY = SamplingParams(temperature=0.0)


class SchedulerClosed(ConstrainError, RuntimeError):
    """The scheduler was closed before the request finished."""


@dataclass(frozen=True)
class Delta:
    """New output of one choice: the text released since the last delta (possibly empty: held back for a stop
    string, or a character not yet complete), the tokens it came from and their log-probabilities (None when the
    request asked for none)."""

    index: int
    text: str
    tokens: list[int]
    logprobs: list[TokenLogprob] | None


@dataclass(frozen=True)
class Choice:
    """One finished choice.

    ``text``: the output, cut before the stop string that ended it (``stop``); ``tokens``: every generated token
    (the usage counts them all, the stop string's included); ``logprobs``: one entry per token whose text starts
    before the cut (None when not asked for). ``finish_reason``: ``"stop"`` (an end token, the structure, or a
    stop string) or ``"length"`` (``max_new_tokens``). ``complete``: whether the text is a whole match of the
    request's structure (true without one).
    """

    index: int
    text: str
    tokens: list[int]
    finish_reason: str
    logprobs: list[TokenLogprob] | None
    prompt_tokens: int
    complete: bool
    stop: str | None = None


@dataclass
class SchedulerStats:
    """What the worker has done: batches decoded, rows in them, forward passes, tokens generated, seconds
    spent decoding; rows that got an error, and rows run again alone after their batch failed."""

    batches: int = 0
    rows: int = 0
    forward_passes: int = 0
    generated_tokens: int = 0
    seconds: float = 0.0
    errors: int = 0
    retried: int = 0

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class Request:
    """What one row decodes (a request with ``n`` choices makes ``n`` of these)."""

    prompt: list[int]
    structure: CompiledStructure | None = None
    sampling: SamplingParams = GREEDY
    max_new_tokens: int = 256
    stop: tuple[str, ...] = ()
    fast_forward: FastForward = "tokens"
    logprobs: int | None = None


class Job:
    """A submitted request: its events (:class:`Delta` and :class:`Choice`) as they come, then its choices.

    Consume it one way: :meth:`events` / :meth:`result` for a job submitted without a loop, :meth:`aevents` /
    :meth:`aresult` for one submitted with ``loop=``. :meth:`cancel` ends its rows at the next step."""

    def __init__(self, n: int, prompt_tokens: int, loop: asyncio.AbstractEventLoop | None = None):
        self.n = n
        self.prompt_tokens = prompt_tokens
        self.choices: list[Choice | None] = [None] * n
        self.error: BaseException | None = None
        self.cancelled = False
        self._loop = loop
        self._sync: queue.Queue[Any] = queue.Queue()
        self._async: asyncio.Queue[Any] | None = asyncio.Queue() if loop is not None else None
        self._finished = threading.Event()

    @property
    def done(self) -> bool:
        return self._finished.is_set()

    def cancel(self) -> None:
        """Stop decoding this job's rows (a client that went away); no more events are delivered."""
        self.cancelled = True

    # -- the worker's side ---------------------------------------------------------------------------------------

    def _emit(self, event: Any) -> None:
        if self.done:
            return
        if isinstance(event, Choice):
            self.choices[event.index] = event
            final = all(c is not None for c in self.choices)
        else:
            final = isinstance(event, BaseException)
            if final:
                self.error = event
        if final:
            self._finished.set()
        if self._loop is None:
            self._sync.put(event)
            return
        try:
            self._loop.call_soon_threadsafe(self._async.put_nowait, event)
        except RuntimeError:  # the loop is closed: nobody is listening any more
            self.cancelled = True

    # -- the caller's side ---------------------------------------------------------------------------------------

    def events(self, timeout: float | None = None) -> Iterator[Delta | Choice]:
        """The job's deltas and choices as they come (a job submitted without a loop); raises its error."""
        if self._loop is not None:
            raise ArgumentError("Job.events", "a job submitted with loop=", "aevents() in that loop")
        finished = 0
        while finished < self.n:
            event = self._sync.get(timeout=timeout)
            if isinstance(event, BaseException):
                raise event
            finished += isinstance(event, Choice)
            yield event

    async def aevents(self) -> AsyncIterator[Delta | Choice]:
        """The job's deltas and choices as they come (a job submitted with ``loop=``); raises its error."""
        if self._async is None:
            raise ArgumentError("Job.aevents", "a job submitted without loop=", "events() in a thread")
        finished = 0
        while finished < self.n:
            event = await self._async.get()
            if isinstance(event, BaseException):
                raise event
            finished += isinstance(event, Choice)
            yield event

    def result(self, timeout: float | None = None) -> list[Choice]:
        """Wait for the job; its choices in order (raises its error)."""
        for _ in self.events(timeout):
            pass
        return list(self.choices)

    async def aresult(self) -> list[Choice]:
        """Wait for the job in an event loop; its choices in order (raises its error)."""
        async for _ in self.aevents():
            pass
        return list(self.choices)


@dataclass
class _Row:
    """One row of a job: what it decodes and how far its output has been delivered."""

    job: Job
    index: int
    request: Request
    text: TextStream | None = None
    starts: list[int] = field(default_factory=list)  # per token, where its text starts
    released: int = 0  # characters delivered
    sent: int = 0  # tokens (and log-probabilities) delivered
    cut: int | None = None  # where a stop string begins
    stop: str | None = None
    finished: bool = False


class Scheduler:
    """Batches requests on one :class:`~constrain.generation.llm.LLM` (see the module docstring).

    ``max_batch``: most rows one decoding holds (default 16, never more than the model's own bound);
    ``window``: seconds to wait for more requests after the first. The worker thread starts at once; call
    :meth:`close` (or use the scheduler as a context manager) to stop it.
    """

    def __init__(self, llm: Any, *, max_batch: int | None = None, window: float = DEFAULT_WINDOW):
        if max_batch is not None and (isinstance(max_batch, bool) or not isinstance(max_batch, int) or max_batch < 1):
            raise ArgumentError("max_batch", max_batch, "None or an int >= 1")
        if not isinstance(window, (int, float)) or isinstance(window, bool) or not 0 <= window <= 10:
            raise ArgumentError("window", window, "seconds, 0 to 10")
        self.llm = llm
        self.backend = llm.backend
        self.vocab = llm.vocab
        limit = max_batch if max_batch is not None else DEFAULT_MAX_BATCH
        model_limit = getattr(self.backend, "max_batch", None)
        self.max_batch = min(limit, model_limit) if model_limit else limit
        self.window = float(window)
        self.eos_ids = [int(t) for t in self.vocab.eos_ids]
        self.stats = SchedulerStats()
        self._queue: queue.Queue[_Row | None] = queue.Queue()
        self._retry: list[_Row] = []
        self._closed = False
        self._worker = threading.Thread(target=self._serve, name="constrain-scheduler", daemon=True)
        self._worker.start()

    def __enter__(self) -> Scheduler:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self, timeout: float | None = None) -> None:
        """Stop the worker after the batch it is decoding; requests still queued get :class:`SchedulerClosed`."""
        if self._closed:
            return
        self._closed = True
        self._queue.put(None)
        self._worker.join(timeout)

    # -- submitting ----------------------------------------------------------------------------------------------

    def submit(
        self,
        prompt: Sequence[int],
        *,
        structure: CompiledStructure | None = None,
        sampling: SamplingParams | None = None,
        max_new_tokens: int = 256,
        stop: Sequence[str] = (),
        fast_forward: FastForward = "tokens",
        logprobs: int | None = None,
        n: int = 1,
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> Job:
        """Queue a request (token ids of the prompt); its :class:`Job`. Checked here, so that a bad request fails
        alone and at once: the context, the budget, the logit bias, the structure's vocabulary. With ``n > 1``
        and a seed, choice ``i > 0`` draws from a seed derived from ``(seed, i)`` (choice 0 from the seed itself,
        as a single request would)."""
        if self._closed:
            raise SchedulerClosed("the scheduler is closed")
        request = self._checked(prompt, structure, sampling, max_new_tokens, stop, fast_forward, logprobs, n)
        job = Job(n, len(request.prompt), loop)
        for i in range(n):
            row_request = request
            if i and request.sampling.seed is not None:
                seed = int(np.random.SeedSequence([request.sampling.seed, i]).generate_state(1)[0])
                row_request = replace(request, sampling=request.sampling.replace(seed=seed))
            self._queue.put(_Row(job, i, row_request))
        return job

    def _checked(
        self,
        prompt: Sequence[int],
        structure: CompiledStructure | None,
        sampling: SamplingParams | None,
        max_new_tokens: int,
        stop: Sequence[str],
        fast_forward: FastForward,
        logprobs: int | None,
        n: int,
    ) -> Request:
        ids = [int(t) for t in prompt]
        width = self.backend.logits_width
        if not ids or any(not 0 <= t < width for t in ids):
            raise ArgumentError("prompt", list(prompt)[:8], f"a non-empty list of token ids below {width:,}")
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise ArgumentError("max_new_tokens", max_new_tokens, "an int >= 1")
        context = self.backend.context_length
        if context is not None and len(ids) + max_new_tokens > context:
            raise ContextLengthError(len(ids), max_new_tokens, context)
        if sampling is None:
            sampling = GREEDY
        if not isinstance(sampling, SamplingParams):
            raise ArgumentError("sampling", sampling, "a constrain.SamplingParams")
        bad = [t for t in sampling.logit_bias if t >= width]
        if bad:
            raise ArgumentError("logit_bias", bad[0], f"token ids below {width:,}")
        if isinstance(stop, str) or not all(isinstance(s, str) and s for s in stop):
            raise ArgumentError("stop", stop, "a sequence of non-empty strings")
        if fast_forward not in FAST_FORWARD_MODES:
            raise ArgumentError("fast_forward", fast_forward, f"one of {FAST_FORWARD_MODES}")
        if logprobs is not None and (
            isinstance(logprobs, bool) or not isinstance(logprobs, int) or not 0 <= logprobs <= MAX_TOP_LOGPROBS
        ):
            raise ArgumentError("logprobs", logprobs, f"None or an int in 0..{MAX_TOP_LOGPROBS}")
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ArgumentError("n", n, "an int >= 1")
        if structure is not None:
            if not isinstance(structure, CompiledStructure):
                raise ArgumentError("structure", structure, "a CompiledStructure or None")
            if structure.vocab.size > self.backend.logits_width:
                raise VocabularyError(
                    f"the structure's vocabulary has {structure.vocab.size:,} tokens but the model's logits have "
                    f"{self.backend.logits_width:,} columns: it was compiled for another model"
                )
        return Request(ids, structure, sampling, max_new_tokens, tuple(stop), fast_forward, logprobs)

    # -- the worker ----------------------------------------------------------------------------------------------

    def _serve(self) -> None:
        while True:
            batch = self._next_batch()
            if batch is None:
                break
            if batch:
                self._decode(batch)
        closed = SchedulerClosed("the scheduler was closed before the request finished")
        while True:  # what was still queued
            try:
                row = self._queue.get_nowait()
            except queue.Empty:
                break
            if row is not None:
                row.job._emit(closed)

    def _next_batch(self) -> list[_Row] | None:
        """The rows of the next decoding (None: closed). Rows to run again alone come first, one at a time."""
        if self._retry:
            return [self._retry.pop(0)]
        first = self._queue.get()
        if first is None:
            return None
        batch = [first]
        deadline = time.monotonic() + self.window
        while len(batch) < self.max_batch:
            wait = deadline - time.monotonic()
            try:
                row = self._queue.get(timeout=wait) if wait > 0 else self._queue.get_nowait()
            except queue.Empty:
                break
            if row is None:
                self._queue.put(None)  # close after this batch
                break
            batch.append(row)
        return [row for row in batch if not (row.job.cancelled or row.job.done)]

    def _decode(self, rows: list[_Row]) -> None:
        """Decode ``rows`` as one batch, delivering as it goes; on an error, see the module docstring."""
        try:
            with self.llm._lock:
                begun = time.perf_counter()
                decoding = Decoding(
                    self.backend,
                    [r.request.prompt for r in rows],
                    structures=[r.request.structure for r in rows],
                    sampling=[r.request.sampling for r in rows],
                    max_new_tokens=[r.request.max_new_tokens for r in rows],
                    eos_ids=self.eos_ids,
                    fast_forward=[r.request.fast_forward for r in rows],
                    tokenize=self.backend.tokenize,
                    logprobs=[r.request.logprobs for r in rows],
                )
                for row in rows:
                    row.text = TextStream(self.vocab)
                self.stats.batches += 1
                self.stats.rows += len(rows)
                counted = 0  # the stats are up to date before a choice is delivered
                try:
                    for step in decoding:
                        self.stats.forward_passes += decoding.forward_passes - counted
                        counted = decoding.forward_passes
                        for i in sorted({i for i, _ in step}):
                            self._read(rows[i], decoding, i)
                        for i, row in enumerate(rows):
                            if row.job.cancelled or row.job.done:
                                decoding.stop_row(i)
                            elif decoding.rows[i].finish_reason is not None and not row.finished:
                                self._finish(row, decoding, i)
                        if decoding.done:
                            break
                finally:
                    self.stats.forward_passes += decoding.forward_passes - counted
                    self.stats.seconds += time.perf_counter() - begun
                for i, row in enumerate(rows):
                    if not row.finished:
                        self._finish(row, decoding, i)
        except Exception as exc:
            self._failed(rows, exc)

    def _failed(self, rows: list[_Row], exc: Exception) -> None:
        alone = len(rows) == 1
        for row in rows:
            if row.finished or row.job.done:
                continue
            if alone or row.sent or row.released:
                self.stats.errors += 1
                row.job._emit(exc)
            else:  # nothing delivered yet: decode it again on its own
                self.stats.retried += 1
                self._retry.append(_Row(row.job, row.index, row.request))

    def _read(self, row: _Row, decoding: Decoding, i: int) -> None:
        """Take row ``i``'s new tokens into its text; find a stop string; deliver what is safe to show."""
        tokens = decoding.rows[i].tokens
        text = row.text
        for token in tokens[len(row.starts) :]:
            row.starts.append(len(text.text))
            text.push(token)
        if row.cut is not None:
            return
        stops = row.request.stop
        if stops:
            found = [(at, s) for s in stops if (at := text.text.find(s, row.released)) >= 0]
            if found:
                row.cut, row.stop = min(found)
                decoding.stop_row(i)
                return
        self._deliver(row, decoding, i, safe_text_end(text.text, stops))

    def _deliver(self, row: _Row, decoding: Decoding, i: int, end: int, *, final: bool = False) -> None:
        """Deliver the text up to ``end`` and the tokens that start before it (all of them when ``final``
        without a cut)."""
        text = row.text.text[row.released : end]
        row.released = max(row.released, end)
        if final and row.cut is None:
            upto = len(row.starts)
        else:
            upto = row.sent
            while upto < len(row.starts) and row.starts[upto] < row.released:
                upto += 1
        tokens = decoding.rows[i].tokens[row.sent : upto]
        entries = decoding.rows[i].logprobs
        logprobs = entries[row.sent : upto] if entries is not None else None
        row.sent = upto
        if text or tokens:
            row.job._emit(Delta(row.index, text, tokens, logprobs))

    def _finish(self, row: _Row, decoding: Decoding, i: int) -> None:
        """Deliver the rest of row ``i``'s text (up to its stop string), then its :class:`Choice`."""
        row.finished = True
        if row.job.done or row.job.cancelled:
            return
        if row.text is None:
            row.text = TextStream(self.vocab)
        self._read(row, decoding, i)
        if row.cut is None:
            row.text.close()
        end = row.cut if row.cut is not None else len(row.text.text)
        self._deliver(row, decoding, i, end, final=True)
        decoded = decoding.rows[i]
        self.stats.generated_tokens += len(decoded.tokens)
        logprobs = decoded.logprobs
        if logprobs is not None and row.cut is not None:  # the tokens whose text starts before the stop string
            logprobs = logprobs[: sum(1 for start in row.starts if start < end)]
        row.job._emit(
            Choice(
                index=row.index,
                text=row.text.text[:end],
                tokens=list(decoded.tokens),
                finish_reason="stop" if row.cut is not None else decoded.finish_reason or "stop",
                logprobs=logprobs,
                prompt_tokens=decoded.prompt_tokens,
                complete=decoded.complete,
                stop=row.stop,
            )
        )


def safe_text_end(text: str, stops: Sequence[str]) -> int:
    """Where the text that no stop string can begin in ends: before the longest suffix of ``text`` that starts
    one of ``stops``."""
    held = 0
    for stop in stops:
        for k in range(min(len(stop) - 1, len(text)), held, -1):
            if text.endswith(stop[:k]):
                held = k
                break
    return len(text) - held
