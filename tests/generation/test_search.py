"""Best-of-n, self-consistency and MBR through ``constrain.LLM`` on the embedded Gemma 3 270M: every candidate
validates, a batch of n equals n single generations with the same per-row seeds, seeded calls repeat, and
candidates cut by ``max_new_tokens`` take no part. Few calls, small n and short outputs: CI has 2 cores."""

from __future__ import annotations

import jsonschema
import pytest
from pydantic import BaseModel, Field

import constrain
from constrain.decoding.selection import Candidate, row_seeds
from constrain.errors import ArgumentError, IncompleteOutputError

pytestmark = pytest.mark.slow


class City(BaseModel):
    name: str = Field(max_length=12)
    country: str = Field(max_length=12)


CITY_PROMPT = (
    'Text: Paris is in France.\nJSON: {"name": "Paris", "country": "France"}\n\nText: Rome is in Italy.\nJSON: '
)
CITY_SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 12}, "country": {"type": "string", "maxLength": 12}},
    "required": ["name", "country"],
    "additionalProperties": False,
}


def test_a_batch_of_n_equals_n_single_generations_with_the_row_seeds(llm):
    found = llm.candidates(CITY_PROMPT, City, n=3, seed=11, max_new_tokens=24)
    assert len(found) == 3 and all(isinstance(c, Candidate) and c.excluded is None for c in found)
    for candidate in found:
        assert City.model_validate_json(candidate.text) == candidate.value
        assert len(candidate.logprobs) == len(candidate.tokens) and candidate.logprob <= 0.0
    for candidate, seed in zip(found, row_seeds(11, 3)):
        alone = llm.complete(CITY_PROMPT, City, temperature=1.0, seed=seed, max_new_tokens=24)
        assert list(candidate.tokens) == alone.tokens and candidate.value == alone.value
    again = llm.candidates(CITY_PROMPT, City, n=3, seed=11, max_new_tokens=24)
    assert [c.tokens for c in again] == [c.tokens for c in found]
    assert [c.logprobs for c in again] == [c.logprobs for c in found]


def test_under_greedy_decoding_every_candidate_is_the_greedy_output(llm):
    found = llm.candidates(CITY_PROMPT, City, n=2, temperature=0.0, max_new_tokens=24)
    greedy = llm.complete(CITY_PROMPT, City, max_new_tokens=24)
    assert [list(c.tokens) for c in found] == [greedy.tokens, greedy.tokens]
    chosen = llm.self_consistency(CITY_PROMPT, City, n=2, temperature=0.0, max_new_tokens=24)
    assert chosen.value == greedy.value and chosen.confidence == 1.0


def test_the_three_methods_return_valid_values_and_repeat_with_a_seed(llm):
    best = llm.best_of(CITY_PROMPT, City, n=3, score="sum", seed=2, max_new_tokens=24)
    assert isinstance(best.value, City) and best.value == best.candidate.value
    assert best.scores[best.index] == max(s for s in best.scores if s is not None)
    voted = llm.self_consistency(CITY_PROMPT, CITY_SCHEMA, n=3, by="field", seed=2, max_new_tokens=24)
    jsonschema.validate(voted.value, CITY_SCHEMA)
    assert set(voted.fields) == {("name",), ("country",)} and 0 < voted.confidence <= 1
    for candidate in voted.candidates:
        jsonschema.validate(candidate.value, CITY_SCHEMA)
    chosen = llm.mbr(CITY_PROMPT, City, n=3, utility="fields", seed=2, max_new_tokens=24)
    assert isinstance(chosen.value, City) and chosen.value == chosen.candidate.value
    # the same seed, the same candidates: each method only chooses differently among them
    assert [c.tokens for c in chosen.candidates] == [c.tokens for c in best.candidates]


def test_candidates_cut_by_max_new_tokens_take_no_part(llm):
    found = llm.candidates(CITY_PROMPT, City, n=2, seed=0, max_new_tokens=3)
    assert [c.excluded for c in found] == ["length", "length"] and all(c.value is None for c in found)
    with pytest.raises(IncompleteOutputError):
        llm.best_of(CITY_PROMPT, City, n=2, seed=0, max_new_tokens=3)
    for call in (
        lambda: llm.mbr(CITY_PROMPT, City, n=65),
        lambda: llm.mbr(CITY_PROMPT, City, utility="bleu"),
        lambda: llm.best_of(CITY_PROMPT, City, score="max"),
        lambda: llm.self_consistency(CITY_PROMPT, constrain.Regex("[ab]"), by="field"),
        lambda: llm.candidates([CITY_PROMPT, CITY_PROMPT], City, n=2),
    ):
        with pytest.raises(ArgumentError):
            call()
