"""``constrain.LLM``: a model handle that returns typed, validated outputs in one call.

::

    llm = constrain.LLM()                                   # the embedded Gemma 3 270M; or LLM(model, tokenizer),
                                                            # LLM(llama), LLM("path/to/model.gguf" or a folder)
    person = llm.generate("Extract: Ada Lovelace, 36.\\n", output_type=Person)   # a validated Person
    for chunk in llm.stream("Say hi: "):                    # text chunks as they come
        print(chunk, end="")

The handle holds the model, its vocabulary and (through :func:`constrain.compile`) the compiled structures, so a
type compiles once however often it is asked for. Decoding runs in constrain's own loop
(:class:`~constrain.decoding.loop.Decoding`) with :class:`~constrain.decoding.params.SamplingParams`; the default
is greedy. Calls on one handle run one at a time (a lock): the model's cache holds one batch.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from constrain.compilers.output_types import OutputType, output_type
from constrain.decoding import selection
from constrain.decoding.forcing import FastForward
from constrain.decoding.loop import DecodedRow, Decoding, FinishReason
from constrain.decoding.params import SamplingParams
from constrain.decoding.selection import Candidate, Score, Selection, Utility, Weights, row_seeds
from constrain.decoding.speculative import Speculation
from constrain.errors import ArgumentError, IncompleteOutputError, OutputValidationError
from constrain.generation.backends import Backend, open_backend
from constrain.generation.prompts import PLAIN_CHAT_STOP, render, split_batch
from constrain.generation.streaming import TextStream
from constrain.runtime.matcher import CompiledStructure
from constrain.vocab.vocabulary import Vocabulary

if TYPE_CHECKING:
    from constrain.compilers.tools import ToolCall, ToolChoice, ToolFormat
    from constrain.generation.agent import ToolResponse, ToolRun

#: The sampling of a call that names none: greedy.
GREEDY = SamplingParams(temperature=0.0)
#: The sampling of the candidates of best-of-n, self-consistency and MBR when a call names none: the model's
#: distribution under the structure.
SEARCH_SAMPLING = SamplingParams(temperature=1.0)


@dataclass(frozen=True)
class Completion:
    """One generated output with what was spent on it."""

    #: The generated text (end-of-sequence tokens left out).
    text: str
    #: The validated value of the output type (the text itself for free text, regexes and grammars).
    value: Any
    #: The generated token ids.
    tokens: list[int]
    #: ``"stop"``: the model or the structure ended it; ``"length"``: ``max_new_tokens`` did (free text only).
    finish_reason: FinishReason
    #: Tokens of the prompt as the model read it.
    prompt_tokens: int
    #: Wall-clock seconds of the decoding (shared by the rows of a batch).
    seconds: float


class LLM:
    """A language model that generates inside structures. See the module docstring."""

    def __init__(self, model: Any = None, tokenizer: Any = None):
        self.backend: Backend = open_backend(model, tokenizer)
        self.vocab = self.backend.vocab
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"LLM({type(self.backend).__name__}, vocab={self.vocab.size:,})"

    # -- compiling -----------------------------------------------------------------------------------------------

    def structure(self, output_type: Any = None, *, strict: bool = True) -> CompiledStructure | None:
        """The compiled structure of ``output_type`` for this model (None for free text), cached."""
        return self._resolve(output_type, strict)[1]

    def _resolve(self, python_type: Any, strict: bool) -> tuple[OutputType, CompiledStructure | None]:
        resolved = output_type(python_type)
        options = {"strict": strict} if resolved.kind in ("json_schema", "pydantic") else {}
        return resolved, resolved.compile(self.vocab, **options)

    # -- generating ----------------------------------------------------------------------------------------------

    def complete(
        self,
        prompt: Any,
        output_type: Any = None,
        *,
        sampling: SamplingParams | None = None,
        max_new_tokens: int = 256,
        strict: bool = True,
        fast_forward: FastForward | None = None,
        speculation: Speculation | None = None,
        stop: str | Sequence[str] | None = None,
        **sampling_fields: Any,
    ) -> Completion | list[Completion]:
        """Like :meth:`generate`, but returns :class:`Completion` objects (text, value, tokens, finish reason)."""
        prompts, batch = split_batch(prompt)
        resolved, structure = self._resolve(output_type, strict)
        params = _sampling(sampling, sampling_fields)
        template = self._chat_template()
        ids = [self.backend.encode(render(p, template)) for p in prompts]
        stops = _stop_strings(stop, any(not isinstance(p, str) for p in prompts) and template is None)
        completions: list[Completion] = []
        step = 1 if speculation is not None else self.backend.max_batch or len(ids)
        for start in range(0, len(ids), step):
            chunk = ids[start : start + step]
            with self._lock:
                begun = time.perf_counter()
                decoding = self._decoding(chunk, resolved, structure, params, max_new_tokens, fast_forward, speculation)
                rows = self._run(decoding, stops)
                seconds = time.perf_counter() - begun
            completions.extend(self._finish(row, resolved, seconds) for row in rows)
        return completions if batch else completions[0]

    def _run(self, decoding: Decoding, stops: list[str]) -> list[DecodedRow]:
        """Run ``decoding``; a row whose text comes to hold a stop string ends there, its tokens cut before it."""
        if not stops:
            return decoding.run()
        longest = max(map(len, stops))
        for step in decoding:
            for i in {i for i, _ in step}:
                row = decoding.rows[i]
                tail = self.vocab.decode(row.tokens[-longest - 1 :]).decode("utf-8", errors="replace")
                if any(s in tail for s in stops):
                    decoding.stop_row(i)
        for row in decoding.rows:
            _cut_at_stop(row, stops, self.vocab)
        return decoding.rows

    def generate(
        self,
        prompt: Any,
        output_type: Any = None,
        *,
        sampling: SamplingParams | None = None,
        max_new_tokens: int = 256,
        strict: bool = True,
        fast_forward: FastForward | None = None,
        speculation: Speculation | None = None,
        stop: str | Sequence[str] | None = None,
        **sampling_fields: Any,
    ) -> Any:
        """Generate one output for ``prompt`` (a string or a chat), or one per prompt of a list.

        ``output_type``: what to return (see :mod:`constrain.compilers.output_types`): a Pydantic model, a
        dataclass, a TypedDict, ``Literal[...]``, an ``Enum``, ``int``/``float``/``bool``, ``list[...]``, a
        :class:`~constrain.Regex`, a grammar, a JSON Schema dict (returns parsed JSON), or None for text.
        ``sampling``: a :class:`~constrain.SamplingParams`, or its fields as keywords (``temperature=0.7,
        seed=1``); the default is greedy. ``strict=False`` relaxes what a schema says that cannot be honoured
        exactly (with a warning) instead of refusing it. ``fast_forward``: what the structure forces is appended
        without sampling (see :mod:`constrain.decoding.forcing`): ``"tokens"`` (the output is unchanged),
        ``"text"`` (the forced text in the tokenizer's own split; the default for JSON output types) or ``"off"``.
        ``speculation``: a :class:`~constrain.decoding.speculative.Speculation` (drafts verified by the model, the
        output distributed as without it; a batch then runs one prompt at a time). ``stop``: strings that end the
        output, left out of it; a chat read in the plain format (a model without a chat template) also stops at
        the next ``User:`` turn the model would write. A stop inside an unfinished structure raises
        :class:`~constrain.errors.IncompleteOutputError`.

        Raises :class:`~constrain.errors.IncompleteOutputError` when ``max_new_tokens`` runs out before the
        structure is complete, :class:`~constrain.errors.ContextLengthError` when the prompt does not fit.
        """
        completions = self.complete(
            prompt,
            output_type,
            sampling=sampling,
            max_new_tokens=max_new_tokens,
            strict=strict,
            fast_forward=fast_forward,
            speculation=speculation,
            stop=stop,
            **sampling_fields,
        )
        if isinstance(completions, list):
            return [c.value for c in completions]
        return completions.value

    def stream(
        self,
        prompt: Any,
        output_type: Any = None,
        *,
        partial: bool = False,
        sampling: SamplingParams | None = None,
        max_new_tokens: int = 256,
        strict: bool = True,
        fast_forward: FastForward | None = None,
        speculation: Speculation | None = None,
        **sampling_fields: Any,
    ) -> Iterator[Any]:
        """Generate for one prompt, yielding text chunks as they come; they concatenate to the output's text.

        With ``partial=True`` and a JSON output type, yield instead the partial value each time it grows (plain
        data: dicts, lists, strings, numbers, as :mod:`pydantic_core` reads unfinished JSON), and last the
        validated value. The generation holds the handle's lock until the iterator is exhausted or closed.
        """
        prompts, batch = split_batch(prompt)
        if batch:
            raise ArgumentError("prompt", prompt, "one prompt or chat: stream() does not take a batch")
        resolved, structure = self._resolve(output_type, strict)
        if partial and not resolved.is_json:
            raise ArgumentError("partial", partial, "False unless the output type is JSON")
        params = _sampling(sampling, sampling_fields)
        ids = [self.backend.encode(render(prompts[0], self._chat_template()))]
        with self._lock:
            begun = time.perf_counter()
            decoding = self._decoding(ids, resolved, structure, params, max_new_tokens, fast_forward, speculation)
            text = TextStream(self.vocab)
            shown = None
            for step in decoding:
                chunk = "".join(text.push(token) for _, token in step)
                if not chunk:
                    continue
                if not partial:
                    yield chunk
                    continue
                value = resolved.partial(text.text)
                if value is not None and value != shown:
                    shown = value
                    yield value
            tail = text.close()
            if tail and not partial:
                yield tail
            completion = self._finish(decoding.rows[0], resolved, time.perf_counter() - begun)
        if partial:
            yield completion.value

    async def agenerate(self, prompt: Any, output_type: Any = None, **kwargs: Any) -> Any:
        """:meth:`generate` in a worker thread, so an event loop keeps running."""
        return await asyncio.to_thread(self.generate, prompt, output_type, **kwargs)

    async def astream(self, prompt: Any, output_type: Any = None, **kwargs: Any) -> AsyncIterator[Any]:
        """:meth:`stream` in a worker thread; the chunks arrive as they are generated."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()

        def produce() -> None:
            try:
                for item in self.stream(prompt, output_type, **kwargs):
                    loop.call_soon_threadsafe(queue.put_nowait, ("item", item))
            except BaseException as exc:  # handed to the consumer, which raises it
                loop.call_soon_threadsafe(queue.put_nowait, ("error", exc))
            else:
                loop.call_soon_threadsafe(queue.put_nowait, ("end", None))

        worker = loop.run_in_executor(None, produce)
        try:
            while True:
                kind, item = await queue.get()
                if kind == "end":
                    break
                if kind == "error":
                    raise item
                yield item
        finally:
            await worker

    # -- choosing among candidates -------------------------------------------------------------------------------

    def candidates(
        self,
        prompt: Any,
        output_type: Any = None,
        *,
        n: int = 8,
        sampling: SamplingParams | None = None,
        max_new_tokens: int = 256,
        strict: bool = True,
        fast_forward: FastForward | None = None,
        **sampling_fields: Any,
    ) -> list[Candidate]:
        """Sample ``n`` outputs of one prompt in one batch, each with its tokens' log-probabilities under the
        structure (the model's distribution, untempered): :class:`~constrain.decoding.selection.Candidate` objects.

        The sampling defaults to temperature 1.0 (under greedy decoding the n outputs are equal). Row ``i`` draws
        with the seed ``row_seeds(seed, n)[i]`` (:func:`~constrain.decoding.selection.row_seeds`), so it is what
        :meth:`complete` gives alone with that seed, and a call with a ``seed`` is reproducible. A row that
        ``max_new_tokens`` cut before its structure was complete has ``excluded="length"``, one whose value a
        validator refused ``excluded="invalid"``; both have ``value`` None. Other options: those of :meth:`generate`.
        """
        prompts, batch = split_batch(prompt)
        if batch:
            raise ArgumentError("prompt", prompt, "one prompt or chat: the candidates are n samples of it")
        resolved, structure = self._resolve(output_type, strict)
        params = _sampling(sampling if sampling is not None else SEARCH_SAMPLING, sampling_fields)
        rows = [params.replace(seed=seed) for seed in row_seeds(params.seed, n)]
        ids = self.backend.encode(render(prompts[0], self._chat_template()))
        step = self.backend.max_batch or n
        found: list[Candidate] = []
        for start in range(0, n, step):
            chunk = rows[start : start + step]
            with self._lock:
                decoding = self._decoding(
                    [ids] * len(chunk), resolved, structure, chunk, max_new_tokens, fast_forward, None, logprobs=0
                )
                found.extend(self._candidate(row, resolved) for row in decoding.run())
        return found

    def best_of(
        self,
        prompt: Any,
        output_type: Any = None,
        *,
        n: int = 8,
        score: Score = "mean",
        sampling: SamplingParams | None = None,
        max_new_tokens: int = 256,
        strict: bool = True,
        fast_forward: FastForward | None = None,
        **sampling_fields: Any,
    ) -> Selection:
        """Sample ``n`` candidates (:meth:`candidates`) and return the best by ``score``: ``"mean"`` log-probability
        per token, ``"sum"`` of log-probabilities, or a function of a Candidate (higher is better). See
        :func:`constrain.decoding.selection.best_of`; ``.value`` is the chosen validated value."""
        selection.scorer(score)
        found = self.candidates(
            prompt, output_type, n=n, sampling=sampling, max_new_tokens=max_new_tokens, strict=strict,
            fast_forward=fast_forward, **sampling_fields,
        )  # fmt: skip
        return selection.best_of(_usable(found), score)

    def self_consistency(
        self,
        prompt: Any,
        output_type: Any = None,
        *,
        n: int = 8,
        by: Literal["object", "field"] = "object",
        sampling: SamplingParams | None = None,
        max_new_tokens: int = 256,
        strict: bool = True,
        fast_forward: FastForward | None = None,
        **sampling_fields: Any,
    ) -> Selection:
        """Sample ``n`` candidates (:meth:`candidates`) and return the majority: the most frequent whole value
        (``by="object"``), or for a JSON output type each field's most frequent value (``by="field"``, validated
        again; a combination the type refuses falls back to the whole-value winner). ``.confidence`` is the share
        of votes of the winning value, ``.fields`` the vote on each field. See
        :func:`constrain.decoding.selection.self_consistency`."""
        if by not in ("object", "field"):
            raise ArgumentError("by", by, "'object' (whole values) or 'field' (each field of a JSON object)")
        resolved = self._resolve(output_type, strict)[0]
        if by == "field" and not resolved.is_json:
            raise ArgumentError("by", by, "'object' unless the output type is JSON")
        found = self.candidates(
            prompt, output_type, n=n, sampling=sampling, max_new_tokens=max_new_tokens, strict=strict,
            fast_forward=fast_forward, **sampling_fields,
        )  # fmt: skip
        return selection.self_consistency(_usable(found), by, validate=lambda data: resolved.parse(json.dumps(data)))

    def mbr(
        self,
        prompt: Any,
        output_type: Any = None,
        *,
        n: int = 8,
        utility: Utility = "f1",
        weights: Weights = "uniform",
        sampling: SamplingParams | None = None,
        max_new_tokens: int = 256,
        strict: bool = True,
        fast_forward: FastForward | None = None,
        **sampling_fields: Any,
    ) -> Selection:
        """Sample ``n`` candidates (:meth:`candidates`, at most
        :data:`~constrain.decoding.selection.MAX_MBR_CANDIDATES`) and return the one of highest expected
        ``utility`` against the others (minimum Bayes risk): ``"f1"`` (token F1 of the texts), ``"exact"``,
        ``"edit"`` (normalised edit similarity), ``"fields"`` (agreement of JSON fields) or a function ``(a, b) ->
        float`` of two Candidates; ``weights``: ``"uniform"`` or ``"probability"``. See
        :func:`constrain.decoding.selection.mbr`."""
        selection.check_mbr_size(n)
        selection.utility_function(utility)
        if weights not in ("uniform", "probability"):
            raise ArgumentError("weights", weights, "'uniform' or 'probability'")
        found = self.candidates(
            prompt, output_type, n=n, sampling=sampling, max_new_tokens=max_new_tokens, strict=strict,
            fast_forward=fast_forward, **sampling_fields,
        )  # fmt: skip
        return selection.mbr(_usable(found), utility, weights)

    # -- tools ---------------------------------------------------------------------------------------------------

    def respond(
        self,
        messages: Any,
        tools: Iterable[Any],
        *,
        tool_choice: ToolChoice = "auto",
        parallel: bool | int = True,
        format: str | ToolFormat = "json",  # noqa: A002 - the name OpenAI-style callers use
        max_new_tokens: int = 256,
        **options: Any,
    ) -> ToolResponse:
        """One assistant turn with ``tools`` offered: text, or calls whose arguments are valid (the structure of
        :func:`~constrain.compilers.tools.compile_tools`), read back by
        :func:`~constrain.compilers.tools.parse_tool_calls`.

        ``messages``: a string or a chat, which may hold earlier calls (``tool_calls``) and results (``tool``
        messages). ``tools``: functions, Pydantic models, OpenAI tool dicts. ``tool_choice``: ``"auto"`` (text or
        calls), ``"required"``, ``"none"`` or a tool by name; ``parallel``: several calls (True), one (False) or
        at most N; ``format``: how calls are written (``"json"``, ``"hermes"``, ``"llama3_json"``, a
        :class:`~constrain.compilers.tools.ToolFormat`). ``options``: those of :meth:`generate`."""
        from constrain.generation.agent import respond

        return respond(
            self, messages, tools, tool_choice=tool_choice, parallel=parallel, format=format,
            max_new_tokens=max_new_tokens, **options,
        )  # fmt: skip

    def run_tools(
        self,
        messages: Any,
        tools: Iterable[Any],
        *,
        max_steps: int = 8,
        tool_choice: ToolChoice = "auto",
        on_call: Callable[[ToolCall, Any], None] | None = None,
        **options: Any,
    ) -> ToolRun:
        """Answer ``messages`` with Python functions as tools: generate (:meth:`respond`), run the calls, append
        the results as tool messages, and repeat until the model answers in text. The last of ``max_steps`` turns
        is asked for text (``tool_choice="none"``), so the run always ends with an answer. A function that raises
        hands the model ``error: ...`` as its result. ``on_call(call, result)`` sees each call as it runs;
        ``options``: those of :meth:`respond`. Returns a :class:`~constrain.generation.agent.ToolRun`."""
        from constrain.generation.agent import run_tools

        return run_tools(
            self, messages, tools, max_steps=max_steps, tool_choice=tool_choice, on_call=on_call, **options
        )

    # -- decorators ----------------------------------------------------------------------------------------------

    def function(self, fn: Callable[..., Any] | None = None, **options: Any) -> Any:
        """Decorate a function whose docstring is a prompt template and whose return annotation is the output type:
        calling it fills the template and returns the generated value. See :func:`constrain.generation.
        decorators.llm_function`."""
        from constrain.generation.decorators import llm_function

        if fn is None:
            return lambda f: llm_function(self, f, **options)
        return llm_function(self, fn, **options)

    # -- internals -----------------------------------------------------------------------------------------------

    def _chat_template(self) -> Callable[[list[dict[str, Any]]], str] | None:
        return self.backend.render_chat if self.backend.chat_template() else None

    def _decoding(
        self,
        ids: list[list[int]],
        resolved: OutputType,
        structure: CompiledStructure | None,
        params: SamplingParams | Sequence[SamplingParams],
        max_new_tokens: int,
        fast_forward: FastForward | None,
        speculation: Speculation | None,
        logprobs: int | None = None,
    ) -> Decoding:
        if fast_forward is None:
            fast_forward = "text" if resolved.is_json else "tokens"
        return Decoding(
            self.backend,
            ids,
            structures=structure,
            sampling=params,
            max_new_tokens=max_new_tokens,
            eos_ids=[int(t) for t in self.vocab.eos_ids],
            fast_forward=fast_forward,
            tokenize=self.backend.tokenize,
            speculation=speculation,
            logprobs=logprobs,
        )

    def _candidate(self, row: DecodedRow, resolved: OutputType) -> Candidate:
        """A decoded row as a candidate: its value and plain data read from the text, or why it is excluded."""
        text = self.vocab.decode(row.tokens).decode("utf-8", errors="replace")
        logprobs = [t.logprob for t in row.logprobs or ()]
        if not row.complete:
            return Candidate(text, None, row.tokens, logprobs, data=None, excluded="length")
        try:
            value = resolved.parse(text)
        except OutputValidationError:
            return Candidate(text, None, row.tokens, logprobs, data=None, excluded="invalid")
        if resolved.is_json:  # the data as written, so that a combination of fields parses as the text did
            return Candidate(text, value, row.tokens, logprobs, data=json.loads(text))
        return Candidate(text, value, row.tokens, logprobs)

    def _finish(self, row: DecodedRow, resolved: OutputType, seconds: float) -> Completion:
        text = self.vocab.decode(row.tokens).decode("utf-8", errors="replace")
        if not row.complete:
            raise IncompleteOutputError(
                f"generation stopped after {len(row.tokens)} tokens (max_new_tokens) before the structure was "
                "complete; raise max_new_tokens",
                text,
                list(row.tokens),
            )
        value = resolved.parse(text)
        return Completion(text, value, list(row.tokens), row.finish_reason or "stop", row.prompt_tokens, seconds)


def _usable(found: list[Candidate]) -> list[Candidate]:
    """``found``, when one candidate at least takes part; otherwise the error :meth:`LLM.generate` would raise."""
    if any(c.excluded is None for c in found):
        return found
    first = found[0]
    if first.excluded == "length":
        message = f"all {len(found)} candidates stopped at max_new_tokens before the structure was complete"
        raise IncompleteOutputError(f"{message}; raise max_new_tokens", first.text, list(first.tokens))
    raise OutputValidationError(f"the type's validation refused all {len(found)} candidates", first.text)


def _stop_strings(stop: str | Sequence[str] | None, plain_chat: bool) -> list[str]:
    """The stop strings of a call: those given, and the next user turn of the plain chat format."""
    stops = [stop] if isinstance(stop, str) else list(stop or [])
    if any(not isinstance(s, str) or not s for s in stops):
        raise ArgumentError("stop", stop, "a non-empty string or a list of them")
    if plain_chat:
        stops.append(PLAIN_CHAT_STOP)
    return stops


def _cut_at_stop(row: DecodedRow, stops: list[str], vocab: Vocabulary) -> None:
    """Cut ``row``'s tokens before the first stop string of its text (a token holding its start goes too)."""
    text = vocab.decode(row.tokens)
    found = [at for at in (text.find(s.encode()) for s in stops) if at >= 0]
    if not found:
        return
    cut, length = min(found), 0
    for k, token in enumerate(row.tokens):
        length += len(vocab.token_bytes(token))
        if length > cut:
            del row.tokens[k:]
            break
    row.finish_reason = "stop"
    if row.matcher is not None:
        row.matcher = row.matcher.structure.matcher()
        row.matcher.advance(row.tokens)


def _sampling(sampling: SamplingParams | None, fields: dict[str, Any]) -> SamplingParams:
    """The call's sampling: ``sampling`` (greedy when None) with the fields given as keywords replaced."""
    if sampling is not None and not isinstance(sampling, SamplingParams):
        raise ArgumentError("sampling", sampling, "a constrain.SamplingParams")
    known = {f.name for f in dataclasses.fields(SamplingParams)}
    unknown = sorted(set(fields) - known)
    if unknown:
        options = ", ".join(sorted(known))
        raise ArgumentError(unknown[0], fields[unknown[0]], f"not a generation option; SamplingParams has {options}")
    if sampling is None:
        return SamplingParams(**{"temperature": 0.0, **fields}) if fields else GREEDY
    return dataclasses.replace(sampling, **fields) if fields else sampling
