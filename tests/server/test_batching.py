"""The scheduler on the embedded Gemma 3 270M: concurrent requests share forward passes, each row's output is the
one it gets alone, structures, stop strings, log-probabilities, errors and cancellation per request."""

from __future__ import annotations

import asyncio
import json
import re
import threading

import jsonschema
import pytest

import constrain
from constrain.decoding.params import SamplingParams
from constrain.errors import ArgumentError, ContextLengthError, DeadEndError
from constrain.generation.batching import Choice, Delta, Scheduler

pytestmark = pytest.mark.slow

DATE = r"\d{4}-\d{2}-\d{2}"
CITY = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 12}, "country": {"type": "string", "maxLength": 12}},
    "required": ["city", "country"],
    "additionalProperties": False,
}
CITY_PROMPT = 'Paris: {"city":"Paris","country":"France"}\nRome: '
DATE_PROMPT = "The Moon landing happened on (YYYY-MM-DD): "
FREE_PROMPT = "The three primary colours are"


def _requests(llm):
    """(prompt text, output type, submit keywords) for three rows of different kinds."""
    return [
        (CITY_PROMPT, CITY, {"structure": llm.structure(CITY), "fast_forward": "text", "max_new_tokens": 24}),
        (DATE_PROMPT, constrain.Regex(DATE), {"structure": llm.structure(constrain.Regex(DATE)), "max_new_tokens": 12}),
        (FREE_PROMPT, None, {"max_new_tokens": 8}),
    ]


def test_concurrent_requests_share_forward_passes_and_give_what_each_gives_alone(llm):
    requests = _requests(llm)
    alone = [llm.complete(p, t, max_new_tokens=kw["max_new_tokens"]) for p, t, kw in requests]
    with Scheduler(llm, window=0.0) as scheduler:  # one at a time: each request's own passes
        solo_passes = []
        for prompt, _, kw in requests:
            before = scheduler.stats.forward_passes
            scheduler.submit(llm.backend.encode(prompt), **kw).result(timeout=120)
            solo_passes.append(scheduler.stats.forward_passes - before)
    with Scheduler(llm, window=1.0) as scheduler:  # submitted from three threads at once: one batch
        jobs = [None] * len(requests)

        def submit(i):
            prompt, _, kw = requests[i]
            jobs[i] = scheduler.submit(llm.backend.encode(prompt), **kw)

        threads = [threading.Thread(target=submit, args=(i,)) for i in range(len(requests))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        choices = [job.result(timeout=120)[0] for job in jobs]
        assert scheduler.stats.batches == 1 and scheduler.stats.rows == 3
        # one pass per step for all rows: as many as the longest row needs alone
        assert scheduler.stats.forward_passes == max(solo_passes) < sum(solo_passes)
    for choice, completion in zip(choices, alone):
        assert choice.tokens == completion.tokens and choice.text == completion.text
        assert choice.prompt_tokens == completion.prompt_tokens
    jsonschema.validate(json.loads(choices[0].text), CITY)
    assert re.fullmatch(DATE, choices[1].text) and choices[1].complete
    assert choices[2].finish_reason == "length" and len(choices[2].tokens) == 8


def test_deltas_make_the_text_and_logprobs_come_with_the_tokens(llm):
    with Scheduler(llm) as scheduler:
        job = scheduler.submit(llm.backend.encode(FREE_PROMPT), max_new_tokens=6, logprobs=2)
        events = list(job.events(timeout=120))
    deltas = [e for e in events if isinstance(e, Delta)]
    (choice,) = [e for e in events if isinstance(e, Choice)]
    assert isinstance(events[-1], Choice) and len(deltas) >= 2
    assert "".join(d.text for d in deltas) == choice.text
    assert [t for d in deltas for t in d.tokens] == choice.tokens
    assert [e for d in deltas for e in d.logprobs] == choice.logprobs
    assert [e.token for e in choice.logprobs] == choice.tokens
    assert all(e.top[0][0] == e.token and len(e.top) == 2 for e in choice.logprobs)  # greedy: the most likely


def test_a_stop_string_cuts_the_text_and_ends_the_row(llm):
    full = llm.complete(FREE_PROMPT, max_new_tokens=12)
    stop = full.text[6:9]  # a piece of the greedy text, found where it first occurs
    at = full.text.find(stop)
    with Scheduler(llm) as scheduler:
        job = scheduler.submit(llm.backend.encode(FREE_PROMPT), max_new_tokens=12, stop=["no such text", stop])
        events = list(job.events(timeout=120))
    choice = events[-1]
    assert choice.text == full.text[:at] and choice.stop == stop and choice.finish_reason == "stop"
    assert "".join(e.text for e in events[:-1]) == choice.text  # the stream never showed the stop string
    assert len(choice.tokens) < len(full.tokens)


def test_a_failing_request_fails_alone_and_the_worker_goes_on(llm):
    digit = llm.structure(constrain.Regex("[0-9]"))
    digits = [t for t in range(llm.vocab.size) if re.fullmatch(rb"[0-9]", llm.vocab.token_bytes(t))]
    banned = SamplingParams(temperature=0.0, logit_bias=dict.fromkeys(digits, float("-inf")))
    with Scheduler(llm, window=1.0) as scheduler:
        good = scheduler.submit(llm.backend.encode("2 + 2 = "), structure=digit, max_new_tokens=3)
        bad = scheduler.submit(llm.backend.encode("3 + 4 = "), structure=digit, sampling=banned, max_new_tokens=3)
        with pytest.raises(DeadEndError):
            bad.result(timeout=120)
        assert re.fullmatch("[0-9]", good.result(timeout=120)[0].text)
        assert scheduler.stats.errors == 1 and scheduler.stats.retried == 2  # the batch failed: each alone
        after = scheduler.submit(llm.backend.encode("1 + 1 = "), structure=digit, max_new_tokens=3)
        assert re.fullmatch("[0-9]", after.result(timeout=120)[0].text)
        # a bad request is refused at once, before it reaches the model
        with pytest.raises(ContextLengthError):
            scheduler.submit([2] * 32_760, max_new_tokens=20)
        with pytest.raises(ArgumentError, match="logit_bias"):
            scheduler.submit([2, 3], sampling=SamplingParams(logit_bias={10**7: 1.0}))
        with pytest.raises(ArgumentError, match="stop"):
            scheduler.submit([2, 3], stop="x")


def test_n_rows_with_a_seed_and_asyncio(llm):
    async def run(scheduler):
        loop = asyncio.get_running_loop()
        sampling = SamplingParams(temperature=1.0, seed=5)
        job = scheduler.submit(llm.backend.encode(FREE_PROMPT), sampling=sampling, max_new_tokens=6, n=2, loop=loop)
        deltas = {0: "", 1: ""}
        async for event in job.aevents():
            if isinstance(event, Delta):
                deltas[event.index] += event.text
        return job.choices, deltas

    with Scheduler(llm) as scheduler:
        choices, deltas = asyncio.run(run(scheduler))
        again, _ = asyncio.run(run(scheduler))
    assert [c.index for c in choices] == [0, 1]
    assert {i: c.text for i, c in enumerate(choices)} == deltas
    assert [c.tokens for c in choices] == [c.tokens for c in again]  # the seed fixes both choices
    assert choices[0].tokens != choices[1].tokens  # each choice draws from its own generator


def test_a_cancelled_job_stops_and_the_next_is_served(llm):
    with Scheduler(llm) as scheduler:
        job = scheduler.submit(llm.backend.encode(FREE_PROMPT), max_new_tokens=200)
        next(job.events(timeout=120))  # the first delta, then the client goes away
        job.cancel()
        passes = scheduler.stats.forward_passes
        after = scheduler.submit(llm.backend.encode(FREE_PROMPT), max_new_tokens=2).result(timeout=120)
        assert len(after[0].tokens) == 2
        assert scheduler.stats.forward_passes - passes <= 3  # the cancelled row stopped early
