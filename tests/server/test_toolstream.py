"""Tool calls streamed in OpenAI's delta shape from text that arrives in arbitrary pieces, and the hold-back of
text that may begin a stop string or a trigger."""

from __future__ import annotations

import json
import random

import pytest

from constrain.generation.batching import safe_text_end
from constrain.server.toolstream import ToolCallStream
from constrain.tools import FORMATS

CALLS = [("get_weather", {"city": "Rome", "note": 'a "quoted" {brace} [x]'}), ("get_time", {"city": "Oslo"})]


def _assemble(deltas):
    """(content, [(id, name, arguments text)]) from the deltas, as a client joins them."""
    content, calls = "", {}
    for delta in deltas:
        content += delta.get("content", "")
        for call in delta.get("tool_calls", []):
            entry = calls.setdefault(call["index"], {"id": call.get("id"), "name": None, "arguments": ""})
            function = call["function"]
            if "name" in function:
                assert call["id"].startswith("call_") and call["type"] == "function" and entry["name"] is None
                entry["name"] = function["name"]
            entry["arguments"] += function.get("arguments", "")
    return content, [(c["id"], c["name"], c["arguments"]) for _, c in sorted(calls.items())]


def _pieces(text, seed):
    rng = random.Random(seed)
    out, at = [], 0
    while at < len(text):
        step = rng.randint(1, 6)
        out.append(text[at : at + step])
        at += step
    return out


@pytest.mark.parametrize("name", ["json", "hermes", "llama3_json"])
@pytest.mark.parametrize("seed", range(5))
def test_calls_after_text_stream_as_openai_deltas(name, seed):
    fmt = FORMATS[name]
    text = "Let me check <tool the weather." + fmt.write(CALLS, after_text=True)
    stream = ToolCallStream(fmt, required=False)
    deltas = [d for piece in _pieces(text, seed) for d in stream.push(piece)] + stream.close()
    content, calls = _assemble(deltas)
    assert content == "Let me check <tool the weather."
    assert [(n, json.loads(a)) for _, n, a in calls] == CALLS
    assert [a for _, _, a in calls] == [json.dumps(args, separators=(",", ":")) for _, args in CALLS]
    assert len({i for i, _, _ in calls}) == 2 and stream.calls == [(i, n) for i, n, _ in calls]


def test_required_calls_have_no_trigger_and_text_without_one_is_content():
    fmt = FORMATS["json"]
    stream = ToolCallStream(fmt, required=True)
    deltas = [d for piece in _pieces(fmt.write(CALLS[:1]), 3) for d in stream.push(piece)] + stream.close()
    assert _assemble(deltas)[0] == "" and [n for _, n, _ in _assemble(deltas)[1]] == ["get_weather"]
    plain = ToolCallStream(fmt, required=False)
    deltas = [d for piece in _pieces("Just text <tool_ca", 1) for d in plain.push(piece)]
    assert _assemble(deltas)[0] == "Just text "  # what may begin the trigger is held back ...
    assert _assemble(deltas + plain.close()) == ("Just text <tool_ca", [])  # ... and shown at the end


def test_safe_text_end():
    assert safe_text_end("hello wor", ["world"]) == 6
    assert safe_text_end("hello", ["xyz"]) == 5
    assert safe_text_end("ab\n", ["\n\nUser:", "b\nx"]) == 1
    assert safe_text_end("", ["a"]) == 0
