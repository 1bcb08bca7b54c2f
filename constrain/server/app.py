"""The OpenAI-compatible HTTP API on FastAPI: ``/v1/models``, ``/v1/completions``, ``/v1/chat/completions``.

A request is checked and planned in a worker thread (the chat rendered, the prompt tokenised, the structure compiled:
:func:`constrain.compile` and :func:`constrain.tools.compile_tools` cache what they compile, so a schema seen
before costs nothing), then submitted to the :class:`~constrain.generation.batching.Scheduler`, which decodes the
requests that arrive together in shared forward passes. Answers are OpenAI's shapes, streamed as server-sent events
with ``stream: true``; every error is OpenAI's error body.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from constrain.errors import MissingExtraError

try:
    from fastapi import FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse, StreamingResponse
    from starlette.concurrency import run_in_threadpool
    from starlette.exceptions import HTTPException as StarletteHTTPException
except ModuleNotFoundError as exc:  # the [server] extra
    raise MissingExtraError("fastapi", "server", missing=exc.name, feature="constrain.server") from exc

from constrain.compilers.api import compile as compile_spec
from constrain.compilers.warmup import warmup
from constrain.decoding.loop import TokenLogprob
from constrain.decoding.params import SamplingParams
from constrain.errors import (
    ConstrainError,
    ContextLengthError,
    DeadEndError,
    SamplingParamsError,
    StructureError,
    ToolCallError,
    ToolError,
)
from constrain.generation.batching import DEFAULT_WINDOW, Choice, Delta, Job, Scheduler
from constrain.generation.prompts import PLAIN_CHAT_STOP, render
from constrain.runtime.matcher import CompiledStructure
from constrain.server.protocol import (
    ChatCompletionRequest,
    ChatMessage,
    CompletionRequest,
    JSONObjectFormat,
    JSONSchemaFormat,
    NamedToolChoice,
)
from constrain.server.toolstream import ToolCallStream
from constrain.tools import (
    Tool,
    ToolFormat,
    as_tools,
    compile_tools,
    parse_tool_calls,
    read_tool_calls,
    tool_format,
    tool_messages_as_text,
    tools_prompt,
)

logger = logging.getLogger("constrain.server")

#: Most choices one request may ask for (``n``; for completions, ``n`` times the prompts).
DEFAULT_MAX_N = 16
#: ``max_tokens`` of a chat request that gives none (and never more than the context leaves).
DEFAULT_MAX_TOKENS = 512
#: ``max_tokens`` of a completion request that gives none (OpenAI's default).
COMPLETION_MAX_TOKENS = 16
#: Most stop strings a request may give.
MAX_STOPS = 16


class APIError(Exception):
    """An error answered in OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}``."""

    def __init__(
        self,
        message: str,
        *,
        status: int = 400,
        param: str | None = None,
        code: str | None = None,
        kind: str = "invalid_request_error",
    ):
        super().__init__(message)
        self.message = message
        self.status = status
        self.param = param
        self.code = code
        self.kind = kind

    def response(self) -> JSONResponse:
        body = {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}
        return JSONResponse(body, status_code=self.status)


@dataclass
class Plan:
    """A checked request, ready for the scheduler."""

    chat: bool
    prompts: list[list[int]]
    prompt_texts: list[str]
    structure: CompiledStructure | None
    sampling: SamplingParams
    max_tokens: list[int]
    stop: list[str]
    fast_forward: str
    logprobs: int | None
    n: int
    stream: bool
    include_usage: bool
    echo: bool = False
    tools: list[Tool] | None = None
    tools_required: bool = False
    tool_format: ToolFormat | None = None
    id: str = field(default_factory=lambda: uuid.uuid4().hex[:24])
    created: int = field(default_factory=lambda: int(time.time()))


class Server:
    """What the routes share: the model, its scheduler and the settings. See :func:`create_app`."""

    def __init__(
        self,
        llm: Any,
        *,
        model_id: str | None,
        max_batch: int | None,
        window: float,
        max_n: int,
        default_max_tokens: int,
        tool_format: str | ToolFormat,
    ):
        self.llm = llm
        # what the first request would pay otherwise: the kernels, the vocabulary's store of lexical walks
        logger.info("kernels and the vocabulary's walks ready in %.1f s", warmup(llm.vocab))
        self.model_id = model_id or default_model_id(llm)
        self.scheduler = Scheduler(llm, max_batch=max_batch, window=window)
        self.max_n = max_n
        self.default_max_tokens = default_max_tokens
        self.tool_format = tool_format_or_error(tool_format)
        self.created = int(time.time())
        self.fingerprint = f"constrain-{_version()}"
        self._inflight: dict[str, threading.Event] = {}
        self._inflight_lock = threading.Lock()

    def _compile_once(self, key: str, build: Callable[[], Any]) -> Any:
        """``build()``, with concurrent requests for the same ``key`` waiting for the first one's compile (then
        found in the compile cache) rather than compiling it again in parallel."""
        with self._inflight_lock:
            running = self._inflight.get(key)
            if running is None:
                self._inflight[key] = threading.Event()
        if running is not None:
            running.wait()
            return build()
        try:
            return build()
        finally:
            with self._inflight_lock:
                self._inflight.pop(key).set()

    # -- planning (in a worker thread) --------------------------------------------------------------------------

    def plan_chat(self, body: ChatCompletionRequest) -> Plan:
        n = self._n(body.n, 1)
        tools, mode, tool_structure = self._tools(body)
        offered = mode in ("auto", "required")  # the model is told about the tools, and its calls are read
        messages = self._messages(body.messages, tools if offered else None)
        template = self.llm.backend.render_chat if self.llm.backend.chat_template() else None
        try:
            text = render(messages, template)
        except ConstrainError as exc:
            raise APIError(str(exc), param="messages") from None
        except Exception as exc:  # a chat template that refuses the messages (jinja's own errors)
            raise APIError(f"the model's chat template cannot render these messages: {exc}", param="messages") from None
        prompt = self.llm.backend.encode(text)
        structure, fast_forward = self._response_format(body.response_format)
        if offered or (tool_structure is not None and structure is None):  # "none": text that cannot call
            structure, fast_forward = tool_structure, "text" if offered else "tokens"
        top = None
        if body.logprobs:
            top = body.top_logprobs or 0
        elif body.top_logprobs is not None:
            raise APIError("top_logprobs needs logprobs: true", param="top_logprobs")
        stop = self._stops(body.stop)
        if template is None and PLAIN_CHAT_STOP not in stop:
            stop.append(PLAIN_CHAT_STOP)
        limit = body.max_completion_tokens or body.max_tokens
        return Plan(
            chat=True,
            prompts=[prompt],
            prompt_texts=[text],
            structure=structure,
            sampling=self._sampling(body),
            max_tokens=[self._max_tokens(limit, len(prompt), self.default_max_tokens, "messages")],
            stop=stop,
            fast_forward=body.fast_forward or fast_forward,
            logprobs=top,
            n=n,
            stream=bool(body.stream),
            include_usage=bool(body.stream_options and body.stream_options.include_usage),
            tools=tools if offered else None,
            tools_required=mode == "required",
            tool_format=self.tool_format,
        )

    def plan_completion(self, body: CompletionRequest) -> Plan:
        if body.suffix:
            raise APIError("suffix is not supported", param="suffix")
        if body.best_of is not None and body.best_of != (body.n or 1):
            raise APIError("best_of other than n is not supported", param="best_of")
        if body.echo and body.logprobs is not None:
            raise APIError("echo with logprobs is not supported", param="echo")
        prompts, texts = self._completion_prompts(body.prompt)
        n = self._n(body.n, len(prompts))
        structure, fast_forward = self._response_format(body.response_format)
        limit = body.max_tokens
        return Plan(
            chat=False,
            prompts=prompts,
            prompt_texts=texts,
            structure=structure,
            sampling=self._sampling(body),
            max_tokens=[self._max_tokens(limit, len(p), COMPLETION_MAX_TOKENS, "prompt") for p in prompts],
            stop=self._stops(body.stop),
            fast_forward=body.fast_forward or fast_forward,
            logprobs=body.logprobs,
            n=n,
            stream=bool(body.stream),
            include_usage=bool(body.stream_options and body.stream_options.include_usage),
            echo=bool(body.echo),
        )

    def _n(self, n: int | None, prompts: int) -> int:
        n = 1 if n is None else n
        if not 1 <= n * prompts <= self.max_n:
            most = f"{self.max_n} choices" + (f" in all ({prompts} prompts)" if prompts > 1 else "")
            raise APIError(f"n={n} is out of range: this server answers at most {most}", param="n")
        return n

    def _completion_prompts(self, prompt: Any) -> tuple[list[list[int]], list[str]]:
        vocab = self.llm.vocab
        if isinstance(prompt, str):
            items: list[Any] = [prompt]
        elif prompt and all(isinstance(t, int) for t in prompt):
            items = [list(prompt)]
        else:
            items = list(prompt)
        if not items:
            raise APIError("prompt is empty", param="prompt")
        ids, texts = [], []
        for item in items:
            if isinstance(item, str):
                ids.append(self.llm.backend.encode(item))
                texts.append(item)
                continue
            if not item or any(not 0 <= t < vocab.size for t in item):
                raise APIError(f"a prompt of token ids must be non-empty ids below {vocab.size:,}", param="prompt")
            ids.append(list(item))
            texts.append(vocab.decode(item).decode("utf-8", errors="replace"))
        return ids, texts

    def _messages(self, messages: Sequence[ChatMessage], tools: list[Tool] | None) -> list[dict[str, Any]]:
        """The messages as the chat template (or the plain format) reads them: text content, tool calls and
        results as text (:func:`constrain.tools.tool_messages_as_text`), and the tools described in the system
        message (:func:`constrain.tools.tools_prompt`)."""
        plain: list[dict[str, Any]] = []
        for i, message in enumerate(messages):
            content = message.content
            if isinstance(content, list):
                parts = []
                for j, part in enumerate(content):
                    if part.type != "text" or part.text is None:
                        raise APIError(
                            f"messages[{i}].content[{j}]: only text content is supported, not {part.type!r}",
                            param=f"messages[{i}].content",
                        )
                    parts.append(part.text)
                content = "".join(parts)
            role = "system" if message.role == "developer" else message.role
            entry: dict[str, Any] = {"role": role, "content": content or ""}
            if message.tool_calls:
                entry["tool_calls"] = [call.model_dump() for call in message.tool_calls]
            elif content is None and role != "assistant":
                raise APIError(f"messages[{i}].content is missing", param=f"messages[{i}].content")
            if message.tool_call_id is not None:
                entry["tool_call_id"] = message.tool_call_id
            if message.name is not None:
                entry["name"] = message.name
            plain.append(entry)
        if any(m["role"] == "tool" or m.get("tool_calls") for m in plain):
            try:
                plain = tool_messages_as_text(plain, format=self.tool_format)
            except (ValueError, KeyError, TypeError) as exc:
                raise APIError(f"messages: tool calls that cannot be read: {exc}", param="messages") from None
        if tools:
            described = tools_prompt(tools, format=self.tool_format)
            if plain and plain[0]["role"] == "system":
                plain[0] = {**plain[0], "content": f"{plain[0]['content']}\n\n{described}"}
            else:
                plain.insert(0, {"role": "system", "content": described})
        return [{"role": m["role"], "content": m["content"]} for m in plain]

    def _tools(self, body: ChatCompletionRequest) -> tuple[list[Tool] | None, str | None, CompiledStructure | None]:
        """The tools offered; ``"auto"``, ``"required"`` (calls only: ``"required"`` or a named tool), ``"none"``,
        or None without tools; and the structure of what the model may write (text without the trigger for
        ``"none"``)."""
        choice = body.tool_choice
        if not body.tools:
            if choice is not None and choice != "none":
                raise APIError("tool_choice needs tools", param="tool_choice")
            return None, None, None
        definitions = []
        for tool in body.tools:
            function = tool.function.model_dump(exclude_none=True)
            function.setdefault("strict", False)  # OpenAI's default: relaxed, not refused
            definitions.append({"type": "function", "function": function})
        try:
            tools = as_tools(definitions)
        except ToolError as exc:
            raise APIError(str(exc), param="tools") from None
        choice_value: Any = choice.model_dump() if isinstance(choice, NamedToolChoice) else (choice or "auto")
        if choice_value == "auto" and body.response_format is not None and body.response_format.type != "text":
            raise APIError(
                "response_format with tools and tool_choice 'auto' is not supported: use tool_choice 'none' "
                "for a formatted answer, or 'required'",
                param="response_format",
            )
        parallel = True if body.parallel_tool_calls is None else body.parallel_tool_calls
        key = json.dumps(["tools", definitions, choice_value, parallel], sort_keys=True)
        try:
            structure = self._compile_once(
                key,
                lambda: compile_tools(
                    tools, self.llm.vocab, tool_choice=choice_value, parallel=parallel, format=self.tool_format
                ),
            )
        except ToolError as exc:
            param = "tool_choice" if "tool_choice" in str(exc) else "tools"
            raise APIError(str(exc), param=param, code="invalid_value") from None
        except StructureError as exc:
            raise APIError(f"tools: {exc}", param="tools", code="invalid_value") from None
        return tools, choice_value if choice_value in ("auto", "none") else "required", structure

    def _response_format(self, response_format: Any) -> tuple[CompiledStructure | None, str]:
        if response_format is None or response_format.type == "text":
            return None, "tokens"
        if isinstance(response_format, JSONObjectFormat):
            schema: Any = {"type": "object"}
            strict = True
            param = "response_format"
        else:
            assert isinstance(response_format, JSONSchemaFormat)
            schema = response_format.json_schema.schema_
            strict = bool(response_format.json_schema.strict)
            param = "response_format.json_schema.schema"
        key = json.dumps(["schema", schema, strict])
        try:
            structure = self._compile_once(key, lambda: compile_spec(schema, self.llm.vocab, strict=strict))
        except StructureError as exc:
            raise APIError(f"the JSON Schema cannot be used: {exc}", param=param, code="invalid_json_schema") from None
        relaxed = getattr(structure, "relaxations", None)
        if relaxed:
            logger.warning("strict is false: relaxed in the response format's schema: %s", "; ".join(relaxed))
        return structure, "text"

    def _sampling(self, body: ChatCompletionRequest | CompletionRequest) -> SamplingParams:
        bias: dict[int, float] = {}
        for key, value in (body.logit_bias or {}).items():
            try:
                token = int(key)
            except ValueError:
                raise APIError(f"logit_bias keys are token ids, not {key!r}", param="logit_bias") from None
            if not 0 <= token < self.llm.vocab.size:
                raise APIError(f"logit_bias: token {token} is not in the vocabulary", param="logit_bias")
            if not -100 <= value <= 100:
                raise APIError(f"logit_bias values are -100 to 100, not {value}", param="logit_bias")
            bias[token] = value
        fields = {
            "temperature": 1.0 if body.temperature is None else body.temperature,
            "top_p": 1.0 if body.top_p is None else body.top_p,
            "frequency_penalty": body.frequency_penalty or 0.0,
            "presence_penalty": body.presence_penalty or 0.0,
            "logit_bias": bias,
            "seed": body.seed,
            "top_k": body.top_k or 0,
            "min_p": body.min_p or 0.0,
            "repetition_penalty": 1.0 if body.repetition_penalty is None else body.repetition_penalty,
        }
        try:
            return SamplingParams(**fields)
        except SamplingParamsError as exc:
            raise APIError(str(exc), param=exc.parameter) from None

    def _stops(self, stop: str | list[str] | None) -> list[str]:
        stops = [] if stop is None else [stop] if isinstance(stop, str) else list(stop)
        if len(stops) > MAX_STOPS or not all(stops):
            raise APIError(f"stop: at most {MAX_STOPS} non-empty strings", param="stop")
        return stops

    def _max_tokens(self, asked: int | None, prompt: int, default: int, param: str) -> int:
        context = self.llm.backend.context_length
        room = None if context is None else context - prompt
        if room is not None and room < 1:
            raise APIError(
                f"the prompt has {prompt:,} tokens, which leaves no room in the model's context of {context:,}",
                param=param,
                code="context_length_exceeded",
            )
        if asked is not None:
            return asked
        return default if room is None else min(default, room)

    # -- running ------------------------------------------------------------------------------------------------

    def submit(self, plan: Plan) -> list[Job]:
        loop = asyncio.get_running_loop()
        jobs: list[Job] = []
        try:
            for prompt, limit in zip(plan.prompts, plan.max_tokens):
                jobs.append(
                    self.scheduler.submit(
                        prompt,
                        structure=plan.structure,
                        sampling=plan.sampling,
                        max_new_tokens=limit,
                        stop=plan.stop,
                        fast_forward=plan.fast_forward,
                        logprobs=plan.logprobs,
                        n=plan.n,
                        loop=loop,
                    )
                )
        except ContextLengthError as exc:
            for job in jobs:
                job.cancel()
            param = "messages" if plan.chat else "prompt"
            raise APIError(str(exc), param=param, code="context_length_exceeded") from None
        except ConstrainError as exc:
            for job in jobs:
                job.cancel()
            raise APIError(str(exc)) from None
        return jobs

    async def answer(self, plan: Plan, jobs: list[Job]) -> dict[str, Any]:
        try:
            results = [await job.aresult() for job in jobs]
        except asyncio.CancelledError:  # the client went away
            for job in jobs:
                job.cancel()
            raise
        except Exception as exc:
            raise _decoding_error(exc) from None
        choices: list[dict[str, Any]] = []
        completion_tokens = 0
        for p, result in enumerate(results):
            for choice in result:
                completion_tokens += len(choice.tokens)
                index = p * plan.n + choice.index
                if plan.chat:
                    choices.append(self._chat_choice(plan, choice, index))
                else:
                    choices.append(self._text_choice(plan, choice, index, plan.prompt_texts[p]))
        prompt_tokens = sum(len(p) for p in plan.prompts)
        usage = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        }
        return {
            "id": ("chatcmpl-" if plan.chat else "cmpl-") + plan.id,
            "object": "chat.completion" if plan.chat else "text_completion",
            "created": plan.created,
            "model": self.model_id,
            "system_fingerprint": self.fingerprint,
            "choices": choices,
            "usage": usage,
        }

    def _chat_choice(self, plan: Plan, choice: Choice, index: int) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": choice.text, "refusal": None}
        finish = choice.finish_reason
        if plan.tools is not None:
            read = dict(tools=plan.tools, format=plan.tool_format, required=plan.tools_required)
            try:
                if choice.stop is not None:  # cut at a stop string: the text is what is left
                    content, calls = parse_tool_calls(choice.text, **read)
                else:
                    content, calls = read_tool_calls(choice.tokens, self.llm.vocab, **read)
            except ToolCallError as exc:
                if finish == "stop":
                    logger.warning("the model's tool calls do not parse: %s", exc)
            else:
                if calls:
                    message["content"] = content if content.strip() else None
                    message["tool_calls"] = [call.to_openai() for call in calls]
                    finish = "tool_calls"
        return {
            "index": index,
            "message": message,
            "logprobs": self._chat_logprobs(choice.logprobs) if choice.logprobs is not None else None,
            "finish_reason": finish,
        }

    def _text_choice(self, plan: Plan, choice: Choice, index: int, prompt_text: str) -> dict[str, Any]:
        offset = len(prompt_text) if plan.echo else 0
        return {
            "index": index,
            "text": (prompt_text if plan.echo else "") + choice.text,
            "logprobs": self._text_logprobs(choice.logprobs, offset) if choice.logprobs is not None else None,
            "finish_reason": choice.finish_reason,
        }

    # -- logprobs -----------------------------------------------------------------------------------------------

    def _entry(self, token: int, logprob: float) -> dict[str, Any]:
        vocab = self.llm.vocab
        return {"token": vocab.token_text(token), "logprob": logprob, "bytes": list(vocab.token_bytes(token))}

    def _chat_logprobs(self, entries: list[TokenLogprob]) -> dict[str, Any]:
        content = []
        for e in entries:
            item = self._entry(e.token, e.logprob)
            item["top_logprobs"] = [self._entry(t, lp) for t, lp in e.top]
            content.append(item)
        return {"content": content, "refusal": None}

    def _text_logprobs(self, entries: list[TokenLogprob], offset: int) -> dict[str, Any]:
        vocab = self.llm.vocab
        tokens, values, tops, offsets = [], [], [], []
        position = offset
        for e in entries:
            text = vocab.token_text(e.token)
            tokens.append(text)
            values.append(e.logprob)
            top: dict[str, float] = {}
            for t, lp in e.top:
                top.setdefault(vocab.token_text(t), lp)
            tops.append(top)
            offsets.append(position)
            position += len(vocab.token_bytes(e.token).decode("utf-8", errors="ignore"))
        return {"tokens": tokens, "token_logprobs": values, "top_logprobs": tops, "text_offset": offsets}

    # -- streaming ----------------------------------------------------------------------------------------------

    async def stream(self, plan: Plan, jobs: list[Job]) -> AsyncIterator[str]:
        kind = "chat.completion.chunk" if plan.chat else "text_completion"
        base = {
            "id": ("chatcmpl-" if plan.chat else "cmpl-") + plan.id,
            "object": kind,
            "created": plan.created,
            "model": self.model_id,
            "system_fingerprint": self.fingerprint,
        }

        def chunk(choices: list[dict[str, Any]], **extra: Any) -> str:
            body = {**base, "choices": choices, **extra}
            if plan.include_usage and "usage" not in extra:
                body["usage"] = None
            return f"data: {json.dumps(body, ensure_ascii=False, separators=(',', ':'))}\n\n"

        completion_tokens = 0
        try:
            for p, job in enumerate(jobs):
                offset = p * plan.n
                tool_streams: dict[int, ToolCallStream] = {}
                held: dict[int, list[TokenLogprob]] = {}
                if plan.chat:
                    for i in range(plan.n):
                        first = {"role": "assistant", "content": ""}
                        yield chunk([{"index": offset + i, "delta": first, "logprobs": None, "finish_reason": None}])
                        if plan.tools is not None:
                            tool_streams[i] = ToolCallStream(plan.tool_format, required=plan.tools_required)
                elif plan.echo:
                    for i in range(plan.n):
                        text = plan.prompt_texts[p]
                        yield chunk([{"index": offset + i, "text": text, "logprobs": None, "finish_reason": None}])
                async for event in job.aevents():
                    i = event.index
                    if isinstance(event, Delta):
                        if event.logprobs:
                            held.setdefault(i, []).extend(event.logprobs)
                        for piece in self._pieces(plan, tool_streams.get(i), event.text):
                            yield chunk([self._chunk_choice(plan, offset + i, piece, held.pop(i, None))])
                        continue
                    assert isinstance(event, Choice)
                    completion_tokens += len(event.tokens)
                    finish = event.finish_reason
                    stream = tool_streams.get(i)
                    if stream is not None:
                        for piece in stream.close():
                            yield chunk([self._chunk_choice(plan, offset + i, piece, held.pop(i, None))])
                        if stream.calls and finish == "stop":
                            finish = "tool_calls"
                    last = self._chunk_choice(plan, offset + i, {} if plan.chat else "", held.pop(i, None))
                    last["finish_reason"] = finish
                    yield chunk([last])
            if plan.include_usage:
                prompt_tokens = sum(len(p) for p in plan.prompts)
                usage = {
                    "prompt_tokens": prompt_tokens,
                    "completion_tokens": completion_tokens,
                    "total_tokens": prompt_tokens + completion_tokens,
                }
                yield chunk([], usage=usage)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # after the first byte, an error can only be an event of the stream
            error = _decoding_error(exc)
            body = {"error": {"message": error.message, "type": error.kind, "param": error.param, "code": error.code}}
            yield f"data: {json.dumps(body)}\n\n"
        finally:
            for job in jobs:
                job.cancel()
        yield "data: [DONE]\n\n"

    def _pieces(self, plan: Plan, tools: ToolCallStream | None, text: str) -> list[Any]:
        if not plan.chat:
            return [text] if text else []
        if tools is None:
            return [{"content": text}] if text else []
        return tools.push(text) if text else []

    def _chunk_choice(self, plan: Plan, index: int, piece: Any, logprobs: list[TokenLogprob] | None) -> dict[str, Any]:
        if plan.chat:
            shown = self._chat_logprobs(logprobs) if logprobs else None
            return {"index": index, "delta": piece, "logprobs": shown, "finish_reason": None}
        shown = self._text_logprobs(logprobs, 0) if logprobs else None
        return {"index": index, "text": piece, "logprobs": shown, "finish_reason": None}


def _decoding_error(exc: BaseException) -> APIError:
    """The API error of a request whose decoding failed."""
    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, DeadEndError):
        return APIError(f"no token is allowed: {exc} (a logit_bias that bans every token the format allows?)")
    logger.error("decoding failed: %r", exc)
    return APIError(f"decoding failed: {exc}", status=500, kind="server_error")


def tool_format_or_error(fmt: str | ToolFormat) -> ToolFormat:
    try:
        return tool_format(fmt)
    except ToolError as exc:
        raise ConstrainError(str(exc)) from None


def default_model_id(llm: Any) -> str:
    """The model's name for ``/v1/models``: the folder or file it was read from, or the class of its backend."""
    backend = llm.backend
    model = getattr(backend, "model", None)
    path = getattr(getattr(model, "config", None), "_name_or_path", None) or getattr(model, "model_path", None)
    if isinstance(path, str) and path:
        return path.rstrip("/").rsplit("/", 1)[-1].removesuffix(".gguf")
    return type(backend).__name__


def _version() -> str:
    from constrain import __version__

    return __version__


def _param(loc: Sequence[Any]) -> str | None:
    """A validation error's location as OpenAI names a parameter: ``messages[0].content``."""
    out = ""
    for part in loc[1:] if loc and loc[0] == "body" else loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif out:
            out += f".{part}"
        else:
            out = str(part)
    return out or None


def _validation_message(errors: Sequence[dict[str, Any]]) -> tuple[str, str | None]:
    first = errors[0]
    kind, loc = first.get("type", ""), first.get("loc", ())
    param = _param(loc)
    if kind == "json_invalid":
        detail = (first.get("ctx") or {}).get("error", "")
        return f"the request body is not valid JSON: {detail}".rstrip(": "), None
    if kind == "extra_forbidden":
        return f"unrecognized request argument supplied: {param}", param
    if kind == "missing":
        return f"missing required parameter: {param}", param
    if param is None or kind == "model_attributes_type":
        return f"the request body must be a JSON object: {first.get('msg', '')}", param
    more = f" (and {len(errors) - 1} more problems)" if len(errors) > 1 else ""
    return f"invalid value for {param}: {first.get('msg', '')}{more}", param


def create_app(
    llm: Any,
    *,
    model_id: str | None = None,
    max_batch: int | None = None,
    window: float = DEFAULT_WINDOW,
    max_n: int = DEFAULT_MAX_N,
    default_max_tokens: int = DEFAULT_MAX_TOKENS,
    tool_format: str | ToolFormat = "json",
) -> FastAPI:
    """The FastAPI application serving ``llm`` (a :class:`constrain.LLM`) with OpenAI's API.

    ``model_id``: the name ``/v1/models`` lists (default: the model's folder or file name). ``max_batch`` and
    ``window``: the scheduler's (see :class:`~constrain.generation.batching.Scheduler`). ``max_n``: most choices
    per request. ``default_max_tokens``: a chat's budget when the request gives none. ``tool_format``: how the
    model writes tool calls (see :mod:`constrain.tools`; ``"json"`` for base models)."""
    server = Server(
        llm,
        model_id=model_id,
        max_batch=max_batch,
        window=window,
        max_n=max_n,
        default_max_tokens=default_max_tokens,
        tool_format=tool_format,
    )

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        await run_in_threadpool(server.scheduler.close)

    app = FastAPI(title="constrain", version=_version(), lifespan=lifespan)
    app.state.server = server

    @app.exception_handler(APIError)
    async def api_error(request: Request, exc: APIError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
        message, param = _validation_message(exc.errors())
        return APIError(message, param=param, code="invalid_value").response()

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        kind = "invalid_request_error" if exc.status_code < 500 else "server_error"
        return APIError(str(exc.detail), status=exc.status_code, kind=kind).response()

    @app.exception_handler(Exception)
    async def server_error(request: Request, exc: Exception) -> JSONResponse:
        logger.exception("unexpected error", exc_info=exc)
        return APIError(f"internal error: {exc}", status=500, kind="server_error").response()

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        card = {"id": server.model_id, "object": "model", "created": server.created, "owned_by": "constrain"}
        return {"object": "list", "data": [card]}

    @app.get("/v1/models/{model}")
    async def model(model: str) -> dict[str, Any]:
        if model != server.model_id:
            raise APIError(f"the model {model!r} does not exist", status=404, param="model", code="model_not_found")
        return {"id": server.model_id, "object": "model", "created": server.created, "owned_by": "constrain"}

    @app.get("/constrain/stats")
    async def stats() -> dict[str, Any]:
        return server.scheduler.stats.as_dict()

    async def respond(plan: Plan) -> Any:
        jobs = server.submit(plan)
        if plan.stream:
            headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
            return StreamingResponse(server.stream(plan, jobs), media_type="text/event-stream", headers=headers)
        return JSONResponse(await server.answer(plan, jobs))

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest) -> Any:
        return await respond(await run_in_threadpool(server.plan_chat, body))

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest) -> Any:
        return await respond(await run_in_threadpool(server.plan_completion, body))

    return app
