"""JSON Schema on the real Gemma vocabulary, with hypothesis: random JSON values, schemas derived from them.

For each example: a random JSON value, a schema it satisfies (``type``, ``properties``/``required``/
``additionalProperties``, ``items``/``prefixItems``/``minItems``/``maxItems``, ``enum``, ``const``,
``minimum``/``maximum`` and their exclusive forms, ``multipleOf``, ``minLength``/``maxLength``, simple ``pattern``;
sometimes behind a ``$ref``, in an ``anyOf`` or with the properties split over ``allOf``), compiled with
``compile_json_schema(schema, gemma_vocab)``. Then

- the value itself, in the compiler's key order (``tests/maskbench_golden.py``'s ``canonical_order``) and
  serialised compactly, tokenised with Gemma (no BOS), is accepted token by token and may end there;
- a few seeded random walks over the allowed tokens (the matcher's mask on the 262,144-token vocabulary), each
  stopping when end of sequence is allowed (with some probability) or after a bounded number of tokens, produce
  texts that parse as JSON and validate with ``jsonschema`` (formats asserted). Walks that hit the bound without
  being complete are dropped (``test_walks_finish_often_enough`` checks that most end).

Values are drawn in the canonical number form the compiler writes (integral numbers as integers, other numbers
with at most two decimals, no exponent), so their compact serialisation is the compiler's text.
"""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path

import jsonschema
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from constrain.compilers.json_schema import compile_json_schema

_spec = importlib.util.spec_from_file_location("maskbench_golden", Path(__file__).parents[2] / "maskbench_golden.py")
mg = sys.modules.get("maskbench_golden") or importlib.util.module_from_spec(_spec)
if "maskbench_golden" not in sys.modules:
    sys.modules["maskbench_golden"] = mg
    _spec.loader.exec_module(mg)

pytestmark = pytest.mark.slow

MAX_TOKENS = 48
WALKS = 3

# -- values and schemas ------------------------------------------------------------------------------------------

_text = st.text(st.characters(exclude_categories=["Cs"]), max_size=6) | st.text("abcxyz019 _-", max_size=6)
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**6), 10**6),
    st.integers(-(10**6), 10**6).map(lambda n: n / 100).filter(lambda f: not f.is_integer()),
    _text,
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(_text, inner, max_size=4)),
    max_leaves=10,
)


@st.composite
def value_and_schema(draw):
    value = draw(values)

    def derive(v):
        choice = draw(st.integers(0, 11))
        if choice == 0:
            return {}
        if choice == 1:
            return {"enum": [draw(scalars), v]}
        if choice == 2:
            return {"const": v}
        if v is None:
            return {"type": "null"}
        if isinstance(v, bool):
            return {"type": draw(st.sampled_from(["boolean", ["boolean", "null"]]))}
        if isinstance(v, int):
            s: dict = {"type": draw(st.sampled_from(["integer", "number"]))}
            if draw(st.booleans()):
                s["minimum"] = v - draw(st.integers(0, 100))
            elif draw(st.booleans()):
                s["exclusiveMinimum"] = v - draw(st.integers(1, 100))
            if draw(st.booleans()):
                s["maximum"] = v + draw(st.integers(0, 100))
            elif draw(st.booleans()):
                s["exclusiveMaximum"] = v + draw(st.integers(1, 100))
            if draw(st.booleans()):
                m = draw(st.sampled_from([2, 3, 5, 7]))
                if v % m == 0:
                    s["multipleOf"] = m
            return s
        if isinstance(v, float):
            s = {"type": "number"}
            if draw(st.booleans()):
                s["minimum"] = round(v - draw(st.integers(0, 300)) / 100, 2)
            if draw(st.booleans()):
                s["exclusiveMaximum"] = round(v + draw(st.integers(1, 300)) / 100, 2)
            return s
        if isinstance(v, str):
            s = {"type": "string"}
            n = len(v)
            if draw(st.booleans()):
                s["minLength"] = max(0, n - draw(st.integers(0, 2)))
            if draw(st.booleans()):
                s["maxLength"] = n + draw(st.integers(0, 3))
            pat = draw(st.integers(0, 3))
            if pat == 1 and v and v[0].isascii() and v[0].isalnum():
                s["pattern"] = "^" + v[0]
            elif pat == 2 and re.fullmatch(r"[a-z0-9 _-]*", v):
                s["pattern"] = "^[a-z0-9 _-]*$"
            elif pat == 3 and v and v[-1].isascii() and v[-1].isalnum():
                s["pattern"] = v[-1] + "$"
            return s
        if isinstance(v, list):
            s = {"type": "array"}
            how = draw(st.integers(0, 2))
            if v and how == 1:
                s["prefixItems"] = [derive(x) for x in v]
                s["items"] = draw(st.sampled_from([False, {}, {"type": "integer"}]))
            elif v and how == 2:
                s["items"] = {"anyOf": [derive(x) for x in v]}
            if draw(st.booleans()):
                s["minItems"] = max(0, len(v) - draw(st.integers(0, 1)))
            if draw(st.booleans()):
                s["maxItems"] = len(v) + draw(st.integers(0, 2))
            return s
        s = {"type": "object", "properties": {k: derive(x) for k, x in v.items() if draw(st.booleans())}}
        s["required"] = [k for k in v if draw(st.booleans())]
        if set(s["properties"]) == set(v) and draw(st.booleans()):
            s["additionalProperties"] = False
        elif draw(st.booleans()) and all(isinstance(x, int) and not isinstance(x, bool) for x in v.values()):
            s["additionalProperties"] = {"type": "integer"}
        if draw(st.booleans()):
            s["maxProperties"] = len(v) + draw(st.integers(0, 2))
        return s

    schema = derive(value)
    wrap = draw(st.integers(0, 5))
    if wrap == 1:  # through a reference
        schema = {"$defs": {"d": schema}, "$ref": "#/$defs/d"}
    elif wrap == 2:  # a union with a schema of another kind
        schema = {"anyOf": [schema, draw(st.sampled_from([{"type": "null"}, {"type": "boolean"}, {"const": "x"}]))]}
    elif wrap == 3 and schema.get("type") == "object":  # properties split over allOf
        props = list(schema.get("properties", {}).items())
        schema = {
            "allOf": [
                {**schema, "properties": dict(props[: len(props) // 2])},
                {"properties": dict(props[len(props) // 2 :])},
            ]
        }
        schema["allOf"][0].pop("additionalProperties", None)
    return value, schema


# -- walks -------------------------------------------------------------------------------------------------------


class _Walker:
    """Seeded random walks under the mask, preferring short tokens, and tokens that close a string, array or
    object in the second half of the budget (so walks tend to finish)."""

    def __init__(self, vocab):
        self.vocab = vocab
        offsets = np.asarray(vocab.offsets)
        lengths = np.diff(offsets).astype(np.float64)
        data = np.asarray(vocab.data)
        closing = np.concatenate([[0], np.cumsum(np.isin(data, np.frombuffer(b'"]}', np.uint8)))])
        self.closes = (closing[offsets[1:]] - closing[offsets[:-1]]) > 0
        self.base = 1.0 / (1.0 + lengths) ** 2
        self.finishing = self.base * np.where(self.closes, 1000.0, 1.0) / (1.0 + lengths) ** 2
        self.is_eos = np.zeros(vocab.size, dtype=bool)
        self.is_eos[np.asarray(vocab.eos_ids)] = True

    def walk(self, structure, rng: np.random.Generator) -> bytes | None:
        matcher = structure.matcher()
        tokens: list[int] = []
        for step in range(MAX_TOKENS):
            if matcher.is_accepting() and rng.random() < (0.4 if step < MAX_TOKENS // 2 else 0.9):
                break
            allowed = matcher.allowed_tokens()
            allowed = allowed[~self.is_eos[allowed]]
            if len(allowed) == 0:
                assert matcher.is_accepting(), ("dead end", self.vocab.decode(tokens))
                break
            weights = (self.base if step < MAX_TOKENS // 2 else self.finishing)[allowed]
            token = int(rng.choice(allowed, p=weights / weights.sum()))
            matcher.advance(token)
            tokens.append(token)
        if not matcher.is_accepting():
            return None
        matcher.advance(int(self.vocab.eos_ids[0]))  # end of sequence is allowed exactly here
        return self.vocab.decode(tokens)


@pytest.fixture(scope="module")
def walker(gemma_vocab):
    return _Walker(gemma_vocab)


def _validator(schema):
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    return cls(schema, format_checker=cls.FORMAT_CHECKER)


STATS = {"examples": 0, "walks": 0, "finished": 0}


@settings(
    max_examples=80,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture],
)
@given(value_and_schema(), st.integers(0, 2**32 - 1))
def test_generated_instances_validate_and_the_source_value_is_accepted(
    gemma_vocab, gemma_tokenizer, walker, pair, seed
):
    value, schema = pair
    validator = _validator(schema)
    assert validator.is_valid(value), (schema, value)
    STATS["examples"] += 1
    structure = compile_json_schema(schema, gemma_vocab)  # strict: the derived schemas avoid what is refused
    text = mg.instance_text(schema, value)
    tokens = mg.tokenise(text, gemma_tokenizer, gemma_vocab)
    if not isinstance(tokens, str):
        assert mg.run_tokens(structure, tokens) == "A", (schema, text)
    rng = np.random.default_rng(seed)
    for _ in range(WALKS):
        STATS["walks"] += 1
        raw = walker.walk(structure, rng)
        if raw is None:
            continue
        STATS["finished"] += 1
        generated = json.loads(raw.decode("utf-8"))
        errors = [e.message for e in validator.iter_errors(generated)]
        assert not errors, (schema, raw, errors)


def test_walks_finish_often_enough():
    """The walks above must mostly end (otherwise they check little); runs after them in file order."""
    if STATS["walks"] == 0:
        pytest.skip("the hypothesis test did not run")
    print(STATS)
    assert STATS["finished"] >= 0.5 * STATS["walks"], STATS
