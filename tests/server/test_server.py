"""The OpenAI-compatible server end to end: the real server (uvicorn, FastAPI) on 127.0.0.1 with the embedded
Gemma 3 270M, and OpenAI's own client talking to it.

Greedy decoding and small ``max_tokens`` keep it short; prompts carry a worked example (a base model of 270M
parameters copies well and reasons little). What the tests check is the API's promise: OpenAI's shapes, outputs
that follow the structure, streams that make the same text, errors in OpenAI's shape, and a server that goes on.
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import jsonschema
import pytest

import constrain.compilers.api

openai = pytest.importorskip("openai")
pytestmark = pytest.mark.slow

FREE_PROMPT = "The three primary colours are"
HELLO = [{"role": "user", "content": "Say hello."}]
CITY = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 12}, "country": {"type": "string", "maxLength": 12}},
    "required": ["city", "country"],
    "additionalProperties": False,
}
CITY_CHAT = [{"role": "user", "content": 'Paris: {"city":"Paris","country":"France"}\nRome:'}]


def _format(schema, *, strict=True, name="city"):
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": strict}}


def _post(server, path, data: bytes, content_type="application/json"):
    """A raw POST: (status, parsed JSON body or the text)."""
    request = urllib.request.Request(
        f"http://{server.host}:{server.port}{path}", data=data, headers={"Content-Type": content_type}
    )
    try:
        with urllib.request.urlopen(request, timeout=300) as response:
            status, body = response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        status, body = exc.code, exc.read().decode()
    try:
        return status, json.loads(body)
    except json.JSONDecodeError:
        return status, body


def _stats(server):
    with urllib.request.urlopen(f"http://{server.host}:{server.port}/constrain/stats", timeout=30) as response:
        return json.loads(response.read())


# -- the basic shapes ----------------------------------------------------------------------------------------------


def test_models_lists_the_model(client):
    models = client.models.list()
    assert [m.id for m in models.data] == ["gemma3-270m"]
    assert models.data[0].object == "model"


def test_chat_completion(client):
    response = client.chat.completions.create(model="gemma3-270m", messages=HELLO, max_tokens=8, temperature=0)
    assert response.object == "chat.completion" and response.id.startswith("chatcmpl-")
    assert response.model == "gemma3-270m" and response.created > 0
    (choice,) = response.choices
    assert choice.index == 0 and choice.message.role == "assistant"
    assert isinstance(choice.message.content, str) and choice.message.content.strip()
    assert choice.finish_reason in ("stop", "length")
    usage = response.usage
    assert usage.completion_tokens >= 1 and usage.total_tokens == usage.prompt_tokens + usage.completion_tokens


def test_completion_is_what_llm_complete_gives_with_logprobs(client, llm):
    expected = llm.complete(FREE_PROMPT, max_new_tokens=8)
    response = client.completions.create(model="x", prompt=FREE_PROMPT, max_tokens=8, temperature=0, logprobs=2)
    assert response.object == "text_completion" and response.id.startswith("cmpl-")
    (choice,) = response.choices
    assert choice.text == expected.text and choice.finish_reason == "length"
    assert response.usage.completion_tokens == 8 and response.usage.prompt_tokens == expected.prompt_tokens
    logprobs = choice.logprobs
    assert "".join(logprobs.tokens) == choice.text and len(logprobs.token_logprobs) == 8
    assert logprobs.text_offset[0] == 0 and logprobs.text_offset == sorted(logprobs.text_offset)
    for token, value, top in zip(logprobs.tokens, logprobs.token_logprobs, logprobs.top_logprobs):
        assert value <= 0 and len(top) == 2 and max(top.values()) == pytest.approx(value)  # greedy: the best
        assert top[token] == pytest.approx(value)


def test_a_strict_json_schema_response_validates(client):
    response = client.chat.completions.create(
        model="x", messages=CITY_CHAT, max_tokens=30, temperature=0, response_format=_format(CITY)
    )
    choice = response.choices[0]
    value = json.loads(choice.message.content)
    jsonschema.validate(value, CITY)
    assert choice.finish_reason == "stop" and value["city"] == "Rome"


def test_json_object_response(client):
    messages = [{"role": "user", "content": 'Answer in JSON. Paris: {"country":"France"}\nRome:'}]
    response = client.chat.completions.create(
        model="x", messages=messages, max_tokens=30, temperature=0, response_format={"type": "json_object"}
    )
    assert isinstance(json.loads(response.choices[0].message.content), dict)


def test_a_second_identical_schema_is_not_compiled_again(client, monkeypatch):
    schema = {"type": "object", "properties": {"year": {"type": "integer", "minimum": 1000, "maximum": 2999}}}
    schema["required"] = ["year"]
    compiled = []
    original = constrain.compilers.api._compile

    def counting(*args, **kwargs):
        compiled.append(args[0])
        return original(*args, **kwargs)

    monkeypatch.setattr(constrain.compilers.api, "_compile", counting)
    messages = [{"role": "user", "content": 'Moon landing: {"year":1969}\nBerlin Wall fell:'}]
    answers = [
        client.chat.completions.create(
            model="x", messages=messages, max_tokens=12, temperature=0, response_format=_format(schema, name="y")
        ).choices[0]
        for _ in range(2)
    ]
    assert compiled == [schema]  # the second request found the first one's structure in the compile cache
    assert answers[0].message.content == answers[1].message.content
    jsonschema.validate(json.loads(answers[0].message.content), schema)


# -- streaming -----------------------------------------------------------------------------------------------------


def test_streamed_deltas_make_the_text_and_the_usage(client):
    whole = client.chat.completions.create(model="x", messages=HELLO, max_tokens=10, temperature=0)
    stream = client.chat.completions.create(
        model="x", messages=HELLO, max_tokens=10, temperature=0, stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    assert all(c.object == "chat.completion.chunk" and c.id == chunks[0].id for c in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert content == whole.choices[0].message.content
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == whole.choices[0].finish_reason and not any(finishes[:-1])
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_the_stream_is_server_sent_events_in_openai_shape(server):
    body = {"messages": HELLO, "max_tokens": 4, "temperature": 0, "stream": True}
    request = urllib.request.Request(
        f"{server.url}/chat/completions", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=300) as response:
        assert response.headers["Content-Type"].startswith("text/event-stream")
        raw = response.read().decode()
    events = raw.split("\n\n")
    assert events[-1] == "" and events[-2] == "data: [DONE]"
    chunks = [json.loads(e.removeprefix("data: ")) for e in events[:-2]]
    assert all(e.startswith("data: {") for e in events[:-2])
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert chunks[-1]["choices"][0]["delta"] == {} and chunks[-1]["choices"][0]["finish_reason"]


def test_streamed_completion(client):
    whole = client.completions.create(model="x", prompt=FREE_PROMPT, max_tokens=6, temperature=0)
    chunks = list(client.completions.create(model="x", prompt=FREE_PROMPT, max_tokens=6, temperature=0, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == whole.choices[0].text
    assert chunks[-1].choices[0].finish_reason == "length"


def test_completions_of_several_prompts_and_echo(client):
    prompts = [FREE_PROMPT, "The capital of France is"]
    several = client.completions.create(model="x", prompt=prompts, max_tokens=3, temperature=0, n=2)
    assert [c.index for c in several.choices] == [0, 1, 2, 3]
    texts = [c.text for c in several.choices]
    assert texts[0] == texts[1] and texts[2] == texts[3]  # greedy: n identical choices per prompt
    alone = client.completions.create(model="x", prompt=prompts[1], max_tokens=3, temperature=0)
    assert texts[2] == alone.choices[0].text
    echoed = client.completions.create(model="x", prompt=FREE_PROMPT, max_tokens=3, temperature=0, echo=True)
    assert echoed.choices[0].text == FREE_PROMPT + texts[0]


# -- sampling options ----------------------------------------------------------------------------------------------


def test_n_choices_with_a_seed(client):
    def ask():
        return client.chat.completions.create(
            model="x", messages=HELLO, max_tokens=6, temperature=1.0, seed=11, n=2
        ).choices

    first, again = ask(), ask()
    assert [c.index for c in first] == [0, 1]
    assert [c.message.content for c in first] == [c.message.content for c in again]  # the seed fixes both


def test_chat_logprobs(client):
    response = client.chat.completions.create(
        model="x", messages=HELLO, max_tokens=5, temperature=0, logprobs=True, top_logprobs=3
    )
    choice = response.choices[0]
    entries = choice.logprobs.content
    assert "".join(e.token for e in entries).startswith(choice.message.content)
    for e in entries:
        assert e.logprob <= 0 and bytes(e.bytes).decode() == e.token
        values = [t.logprob for t in e.top_logprobs]
        assert len(values) == 3 and values == sorted(values, reverse=True)
        assert e.top_logprobs[0].token == e.token  # greedy: the most likely token under the structure


def test_a_stop_string_cuts_the_text(client):
    whole = client.completions.create(model="x", prompt=FREE_PROMPT, max_tokens=12, temperature=0).choices[0].text
    stop = whole[6:9]
    cut = client.completions.create(model="x", prompt=FREE_PROMPT, max_tokens=12, temperature=0, stop=[stop])
    assert cut.choices[0].text == whole[: whole.find(stop)] and cut.choices[0].finish_reason == "stop"


def test_penalties_and_logit_bias_change_the_output(client, llm):
    plain = client.completions.create(model="x", prompt=FREE_PROMPT, max_tokens=3, temperature=0)
    first = llm.backend.tokenize(plain.choices[0].text)[0]
    banned = client.completions.create(
        model="x", prompt=FREE_PROMPT, max_tokens=3, temperature=0, logit_bias={str(first): -100}
    )
    assert llm.backend.tokenize(banned.choices[0].text)[0] != first
    penalised = client.completions.create(
        model="x", prompt=FREE_PROMPT, max_tokens=3, temperature=0, frequency_penalty=2.0, presence_penalty=2.0
    )
    assert penalised.choices[0].text


# -- concurrency ---------------------------------------------------------------------------------------------------


def test_concurrent_requests_share_forward_passes_and_answer_as_one_at_a_time(client, server):
    prompts = [FREE_PROMPT, "The capital of France is", "One, two, three,", "Water boils at"]
    before = _stats(server)
    alone = [client.completions.create(model="x", prompt=p, max_tokens=8, temperature=0) for p in prompts]
    alone = [a.choices[0].text for a in alone]
    middle = _stats(server)
    answers = [None] * len(prompts)

    def ask(i):
        answers[i] = client.completions.create(model="x", prompt=prompts[i], max_tokens=8, temperature=0)

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    after = _stats(server)
    assert [a.choices[0].text for a in answers] == alone
    assert middle["batches"] - before["batches"] == len(prompts)
    assert after["batches"] - middle["batches"] < len(prompts)  # batched
    assert after["forward_passes"] - middle["forward_passes"] < middle["forward_passes"] - before["forward_passes"]


# -- errors --------------------------------------------------------------------------------------------------------


def test_errors_are_openai_error_bodies_and_the_server_goes_on(client, server):
    bad_schema = {"type": "object", "properties": {"a": {"type": "nope"}}}
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model="x", messages=HELLO, response_format=_format(bad_schema))
    assert "/properties/a/type" in refused.value.message and refused.value.status_code == 400
    assert refused.value.body["type"] == "invalid_request_error"
    assert refused.value.body["param"] == "response_format.json_schema.schema"

    unique = {"type": "array", "items": {"type": "string", "maxLength": 4}, "uniqueItems": True, "maxItems": 3}
    with pytest.raises(openai.BadRequestError, match="uniqueItems"):  # strict: refused, naming the keyword
        client.chat.completions.create(model="x", messages=HELLO, response_format=_format(unique, strict=True))
    relaxed = client.chat.completions.create(
        model="x", messages=HELLO, max_tokens=3, response_format=_format(unique, strict=False)
    )
    assert relaxed.choices[0].message.content.startswith("[")

    status, body = _post(server, "/v1/chat/completions", b'{"messages": [{"role": "user", "content": "hi"}')
    assert status == 400 and body["error"]["type"] == "invalid_request_error"
    assert "not valid JSON" in body["error"]["message"]
    status, body = _post(server, "/v1/chat/completions", b"[1, 2]")
    assert status == 400 and "JSON object" in body["error"]["message"]

    with pytest.raises(openai.BadRequestError) as unknown:
        client.chat.completions.create(model="x", messages=HELLO, extra_body={"temprature": 0.5})
    assert unknown.value.body["param"] == "temprature" and "temprature" in unknown.value.message
    with pytest.raises(openai.BadRequestError) as many:
        client.chat.completions.create(model="x", messages=HELLO, n=100)
    assert many.value.body["param"] == "n"
    with pytest.raises(openai.BadRequestError) as role:
        client.chat.completions.create(model="x", messages=[{"role": "robot", "content": "hi"}])
    assert role.value.body["param"] == "messages[0].role"
    with pytest.raises(openai.BadRequestError) as long:
        client.completions.create(model="x", prompt=[1000] * 32_760, max_tokens=20)
    assert long.value.code == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError, match="logit_bias"):
        client.completions.create(model="x", prompt="a", logit_bias={"not a token": 1})
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("no-such-model")

    after = client.chat.completions.create(model="x", messages=HELLO, max_tokens=3, temperature=0)
    assert after.choices[0].message.content


# -- tools ---------------------------------------------------------------------------------------------------------


def _tool(name, description):
    parameters = {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 20}},
        "required": ["city"],
        "additionalProperties": False,
    }
    return {"type": "function", "function": {"name": name, "description": description, "parameters": parameters}}


TOOLS = [_tool("get_weather", "The weather in a city."), _tool("get_time", "The time in a city.")]


def _call(i, name, city):
    return {"id": f"call_{i}", "type": "function", "function": {"name": name, "arguments": json.dumps({"city": city})}}


def _turn(question, calls, results, answer):
    return [
        {"role": "user", "content": question},
        {"role": "assistant", "content": None, "tool_calls": calls},
        *({"role": "tool", "tool_call_id": c["id"], "content": r} for c, r in zip(calls, results)),
        {"role": "assistant", "content": answer},
    ]


#: Worked examples: a call, a plain answer, another call, two calls at once.
HISTORY = [
    *_turn("What is the weather in Paris?", [_call(1, "get_weather", "Paris")], ["sunny"], "It is sunny in Paris."),
    {"role": "user", "content": "Say hello."},
    {"role": "assistant", "content": "Hello!"},
    *_turn("What is the weather in Berlin?", [_call(2, "get_weather", "Berlin")], ["rain"], "It rains in Berlin."),
]
PARALLEL = _turn(
    "What is the weather and the time in Oslo?",
    [_call(3, "get_weather", "Oslo"), _call(4, "get_time", "Oslo")],
    ["snow", "10:00"],
    "It snows in Oslo and it is 10:00.",
)


def _ask(question, history=HISTORY):
    return [*history, {"role": "user", "content": question}]


def test_a_named_tool_is_called(client):
    response = client.chat.completions.create(
        model="x", messages=_ask("What time is it in Rome?"), tools=TOOLS, max_tokens=30, temperature=0,
        tool_choice={"type": "function", "function": {"name": "get_time"}},
    )  # fmt: skip
    choice = response.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_") and call.function.name == "get_time"
    assert json.loads(call.function.arguments) == {"city": "Rome"}


def test_auto_answers_in_text_or_calls_a_tool(client):
    called = client.chat.completions.create(
        model="x", messages=_ask("What is the weather in Rome?"), tools=TOOLS, max_tokens=30, temperature=0
    ).choices[0]
    assert called.finish_reason == "tool_calls"
    assert [(c.function.name, json.loads(c.function.arguments)) for c in called.message.tool_calls] == [
        ("get_weather", {"city": "Rome"})
    ]
    text = client.chat.completions.create(
        model="x", messages=_ask("Say goodbye."), tools=TOOLS, max_tokens=30, temperature=0
    ).choices[0]
    assert text.finish_reason == "stop" and not text.message.tool_calls and "Goodbye" in text.message.content
    none = client.chat.completions.create(
        model="x", messages=_ask("What is the weather in Rome?"), tools=TOOLS, max_tokens=8, temperature=0,
        tool_choice="none",
    ).choices[0]  # fmt: skip
    assert not none.message.tool_calls and none.finish_reason in ("stop", "length")


def test_parallel_tool_calls(client):
    messages = _ask("What is the weather and the time in Rome?", HISTORY + PARALLEL)
    response = client.chat.completions.create(
        model="x", messages=messages, tools=TOOLS, tool_choice="required", max_tokens=40, temperature=0
    )
    calls = response.choices[0].message.tool_calls
    assert response.choices[0].finish_reason == "tool_calls"
    assert sorted(c.function.name for c in calls) == ["get_time", "get_weather"]
    assert len({c.id for c in calls}) == 2
    single = client.chat.completions.create(
        model="x", messages=messages, tools=TOOLS, tool_choice="required", max_tokens=40, temperature=0,
        parallel_tool_calls=False,
    )  # fmt: skip
    assert len(single.choices[0].message.tool_calls) == 1


def test_streamed_tool_call_deltas(client):
    kwargs = {"model": "x", "messages": _ask("What is the weather in Rome?"), "tools": TOOLS, "max_tokens": 30}
    whole = client.chat.completions.create(**kwargs, temperature=0).choices[0].message.tool_calls
    chunks = list(client.chat.completions.create(**kwargs, temperature=0, stream=True))
    calls: dict[int, dict] = {}
    for chunk in chunks:
        for delta in chunk.choices[0].delta.tool_calls or []:
            entry = calls.setdefault(delta.index, {"id": delta.id, "name": delta.function.name, "arguments": ""})
            if delta.id is not None:
                assert entry["id"] == delta.id and delta.type == "function"
            entry["arguments"] += delta.function.arguments or ""
    assert [(c["name"], c["arguments"]) for c in calls.values()] == [
        (c.function.name, c.function.arguments) for c in whole
    ]
    assert all(c["id"].startswith("call_") for c in calls.values())
    assert sum(bool(chunk.choices[0].delta.tool_calls) for chunk in chunks) > 2  # arguments in pieces
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_tool_errors(client):
    with pytest.raises(openai.BadRequestError, match="get_date") as unknown:
        client.chat.completions.create(
            model="x", messages=HELLO, tools=TOOLS, tool_choice={"type": "function", "function": {"name": "get_date"}}
        )
    assert unknown.value.body["param"] == "tool_choice"
    with pytest.raises(openai.BadRequestError, match="tool"):
        client.chat.completions.create(model="x", messages=HELLO, tool_choice="required")
    bad = _tool("get_weather", "x")
    bad["function"]["parameters"] = {"type": "object", "properties": {"city": {"type": "nope"}}}
    with pytest.raises(openai.BadRequestError, match="/properties/city/type"):
        client.chat.completions.create(model="x", messages=HELLO, tools=[bad])


# -- the command line ----------------------------------------------------------------------------------------------


def test_constrain_serve_on_the_command_line():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [sys.executable, "-c", "from constrain.cli import main; raise SystemExit(main())"]
    process = subprocess.Popen(
        [*command, "serve", "--port", str(port), "--max-batch", "4", "--model-id", "tiny"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0)
        deadline = time.monotonic() + 180
        while True:
            try:
                models = client.models.list()
                break
            except openai.APIConnectionError:
                assert process.poll() is None and time.monotonic() < deadline, process.stdout.read()
                time.sleep(0.5)
        assert [m.id for m in models.data] == ["tiny"]
        text = client.completions.create(model="tiny", prompt=FREE_PROMPT, max_tokens=2, temperature=0)
        assert text.choices[0].text
    finally:
        process.terminate()
        output, _ = process.communicate(timeout=60)
    assert re.search(r"serving on http://127\.0\.0\.1:\d+/v1", output)
