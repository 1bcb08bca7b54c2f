"""constrain.compile(..., strict=False) warns once, with the pointers, when it relaxes a schema."""

from __future__ import annotations

import warnings

import pytest
from pydantic import BaseModel, Field

import constrain
from constrain.compilers.api import RelaxationWarning
from constrain.testing import byte_vocabulary

SCHEMA = {"type": "object", "properties": {"tags": {"type": "array", "items": {"type": "string"}, "uniqueItems": True}}}


@pytest.fixture(scope="module")
def vocab():
    return byte_vocabulary()


def test_lenient_compile_warns_with_the_pointers(vocab):
    constrain.clear_compile_cache()
    with pytest.warns(RelaxationWarning, match="relaxed 1 part") as caught:
        structure = constrain.compile(SCHEMA, vocab, strict=False)
    assert len(caught) == 1
    assert "/properties/tags/uniqueItems: uniqueItems" in str(caught[0].message)
    assert caught[0].filename == __file__  # points at the caller of constrain.compile
    assert structure.relaxations and issubclass(RelaxationWarning, UserWarning)


def test_a_cache_hit_does_not_warn_again(vocab):
    constrain.clear_compile_cache()
    with pytest.warns(RelaxationWarning):
        first = constrain.compile(SCHEMA, vocab, strict=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert constrain.compile(SCHEMA, vocab, strict=False) is first


def test_nothing_relaxed_nothing_warned(vocab):
    class Item(BaseModel):
        name: str = Field(max_length=5)

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        constrain.compile({"type": "integer"}, vocab, strict=False, cache=False)
        constrain.compile(Item, vocab, strict=False, cache=False)
        with pytest.raises(constrain.JsonSchemaError):
            constrain.compile(SCHEMA, vocab, cache=False)  # strict: refused, not warned
