"""The per-vocabulary store of lexical walks: walks shared between structures and reloaded from disk, and walks
composed from other states' subtrees, each equal to one whole walk (on Gemma)."""

from __future__ import annotations

import numpy as np
import pytest

from constrain.compilers.json_schema import compile_json_schema
from constrain.compilers.json_schema.strings import _key_except_dfa
from constrain.compilers.json_schema.values import _STRING as STRING_PATTERN
from constrain.grammar.rules import terminal_dfa
from constrain.runtime.lexical import LexicalMasks
from constrain.runtime.masks import walk_bytes, walk_trie
from constrain.runtime.pushdown import compile_grammar
from constrain.testing import random_vocabulary
from tests.runtime.test_pushdown import JSONISH

pytestmark = pytest.mark.usefixtures("fresh_lexical_store")


def test_lexical_walks_are_shared_and_reloaded_from_disk(tmp_path):
    vocab = random_vocabulary('{}[],:"ab1-0truexé\\', count=4000, all_bytes=True)
    first = compile_grammar(JSONISH, vocab)
    configs = first.machine.read(first.machine.start, b'{"a')
    mask = first.masks.get(configs)
    files = sorted(tmp_path.glob("masks/*/*/*.walk"))
    assert files, "the string rule's walks were not written"
    LexicalMasks._stores.clear()  # as in a new process: only the disk is left
    second = compile_grammar(JSONISH, vocab)
    assert np.array_equal(second.masks.get(configs), mask)
    assert sorted(tmp_path.glob("masks/*/*/*.walk")) == files


SCHEMA_WITH_KEYS = {
    "type": "object",
    "properties": {"deliveryRoundID": {"type": "string"}, "name": {"type": "string", "maxLength": 40}},
    "additionalProperties": {"type": "integer"},
}


@pytest.mark.parametrize("prefix", ['{"', '{"deliveryR', '{"deliveryRoundID":"x","na', '{"name":"ab', '{"zz":1,"d'])
def test_composed_lexical_walks_equal_a_whole_walk_on_gemma(gemma_vocab, prefix):
    """Walks composed from other states' subtrees (a property name the schema excludes borrows the plain
    string's walk) give exactly the mask of one whole walk of the configurations."""
    structure = compile_json_schema(SCHEMA_WITH_KEYS, gemma_vocab)
    machine = structure.machine
    warm = machine.read(machine.start, b'{"q')  # a plain key string: its walk becomes a lender
    structure.masks.get(warm)
    configs = machine.read(machine.start, prefix.encode())
    assert configs, prefix
    got = structure.masks.get(configs).view(np.uint32).copy()
    want = np.zeros_like(got)
    machine.walk(configs, gemma_vocab.trie, want)
    assert not machine.can_end(configs)  # inside an object: no end-of-sequence bits to add
    assert np.array_equal(got, want), prefix


def test_masks_along_a_whole_object_equal_whole_walks_on_gemma(gemma_vocab):
    """Typing property names and values in one structure: prefix states of names borrow the plain string's
    subtrees, stack masks are cached by their lexical top's language and reused at later positions; each mask
    must still equal one whole walk of its configurations."""
    structure = compile_json_schema(SCHEMA_WITH_KEYS, gemma_vocab)
    machine = structure.machine
    structure.masks.get(machine.read(machine.start, b'{"q'))  # the plain key string lends
    text = '{"deliveryRoundID":"x","name":"y","nab":1,"deliv'
    for end in range(2, len(text) + 1):
        configs = machine.read(machine.start, text[:end].encode())
        assert configs, text[:end]
        got = structure.masks.get(configs).view(np.uint32).copy()
        want = np.zeros_like(got)
        machine.walk(configs, gemma_vocab.trie, want)
        assert np.array_equal(got, want), text[:end]


MANY_NAMES = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet", "kilo",
              "lima"]  # fmt: skip


def test_two_byte_subtrees_are_borrowed_and_walks_equal_whole_walks_on_gemma(gemma_vocab):
    """A string automaton whose states differ from a plain string's below a few first bytes (here "any string but
    these names", walked by the store itself as it walks any call-free automaton) walks those letters' subtrees but
    borrows the two-byte nodes below them from the plain string's walk; its tokens still equal a whole walk's."""
    store = LexicalMasks.of(gemma_vocab)
    depth = store.depth
    plain = terminal_dfa(STRING_PATTERN)
    store.walk(plain.trans, plain.accepting, plain.language_hashes(depth), int(plain.trans[0, ord('"')]))
    assert store._deep_lenders  # the plain string's body: a deep lender
    names = _key_except_dfa(tuple(MANY_NAMES))
    hashes = names.language_hashes(depth)
    trie = gemma_vocab.trie
    before = store.deep_borrowed_nodes
    for prefix in [b'"', b'"a', b'"al', b'"alp', b'"c', b'"ch', b'"k', b'"li', b'"lim', b'"ab']:
        state = walk_bytes(names.trans, 0, np.frombuffer(prefix, dtype=np.uint8), 0, len(prefix))
        words, _ = store.walk(names.trans, names.accepting, hashes, int(state))
        want = np.zeros_like(words)
        walk_trie(
            np.ascontiguousarray(names.trans).reshape(-1), int(state), trie.node_key, trie.node_next,
            trie.node_token_ptr, trie.token_ids, trie.root_children, np.empty(trie.max_depth + 1, dtype=np.int32),
            want,
        )  # fmt: skip
        assert np.array_equal(words, want), prefix
    assert store.deep_borrowed_nodes - before > 12 * 10  # most two-byte nodes under each declared first letter


@pytest.mark.parametrize(
    "names", [MANY_NAMES, ["a", "ab", "abc", "b"], ["key"], ["é", "naïve", 'say "hi"', "back\\slash", "tab\t", "日本"]]
)
def test_walks_of_keys_other_than_the_properties_equal_the_stores_own_on_gemma(gemma_vocab, names):
    """The keys of an object other than its properties: each state's walk, made from the plain string's walk less
    the tokens that end exactly at the end of a property's name (and the returns after them), equals the walk the
    store composes for that state itself, tokens and returns alike."""
    structure = compile_json_schema({"type": "object", "properties": {n: {} for n in names}}, gemma_vocab)
    rule = next(i for i, n in enumerate(structure.pushdown.names) if n.startswith("json_key_except:"))
    dfa = structure.pushdown.rules[rule]
    assert dfa.states_before_removal is not None
    store = LexicalMasks.of(gemma_vocab)
    hashes = dfa.language_hashes(store.depth)
    base = dfa.words_removed_from
    base_hashes = base.language_hashes(store.depth)
    fewer = 0
    for state in range(dfa.num_states):
        if not (dfa.trans[state] >= 0).any():
            continue  # the closing quote's state: nothing to walk
        fast = store.walk_without_words(dfa, state)
        assert fast is not None, state
        words, ranges = store.walk(dfa.trans, dfa.accepting, hashes, state)
        assert np.array_equal(fast[0], words), state
        assert sorted(map(tuple, fast[1].tolist())) == sorted(map(tuple, ranges.tolist())), state
        paired = int(dfa.states_before_removal[state])
        fewer += not np.array_equal(words, store.walk(base.trans, base.accepting, base_hashes, paired)[0])
    assert fewer  # some state's walk left tokens out: one that ends a name with its closing quote


def test_a_subtree_copied_from_a_deep_lender_drops_the_two_byte_nodes_it_does_not_lend_on_gemma(gemma_vocab):
    """A name that starts with "a" must not go on with "z": below the first byte "a", every two-byte node but
    "az" has the plain name's language, so the walk copies the plain name's tokens of the whole "a" subtree and
    must then drop the tokens under "az" (there are hundreds: "azure", "az", ...)."""
    plain = compile_json_schema({"type": "object"}, gemma_vocab)
    store = LexicalMasks.of(gemma_vocab)
    plain.masks.get(plain.machine.read(plain.machine.start, b'{"'))  # the plain name: a deep lender
    assert store._deep_lenders
    structure = compile_json_schema({"type": "object", "propertyNames": {"pattern": "^(?:a[^z]|[^a])"}}, gemma_vocab)
    machine = structure.machine
    before = store.deep_borrowed_nodes
    az = [i for i in range(gemma_vocab.size) if gemma_vocab.token_bytes(i).startswith(b"az")]
    assert len(az) > 50
    for prefix in ['{"', '{"b":1,"']:
        configs = machine.read(machine.start, prefix.encode())
        got = structure.masks.get(configs).view(np.uint32).copy()
        want = np.zeros_like(got)
        machine.walk(configs, gemma_vocab.trie, want)
        assert np.array_equal(got, want), prefix
        assert not any(got[i >> 5] & (1 << (i & 31)) for i in az)
    assert store.deep_borrowed_nodes > before


def test_walks_borrow_from_several_lenders_and_drop_the_main_lenders_other_tokens_on_gemma(gemma_vocab):
    """A name state borrows most subtrees from the plain name's walk (its main lender) and the subtree of "a"
    from an earlier walk that excluded the same names under "a". A name that must start with a lowercase ASCII
    letter borrows those subtrees from the plain name and must drop every token the plain name allows under the
    other first bytes (a dense pass for the large subtree of words after a space, token by token for the
    others)."""

    def mask(structure, prefix):
        configs = structure.machine.read(structure.machine.start, prefix)
        got = structure.masks.get(configs).view(np.uint32).copy()
        want = np.zeros_like(got)
        structure.machine.walk(configs, gemma_vocab.trie, want)
        assert np.array_equal(got, want), prefix
        return got

    plain = compile_json_schema({"type": "object"}, gemma_vocab)
    mask(plain, b'{"')
    mask(compile_json_schema({"type": "object", "properties": {"alpha": {}}}, gemma_vocab), b'{"')
    mask(compile_json_schema({"type": "object", "properties": {"alpha": {}, "bravo": {}}}, gemma_vocab), b'{"')
    lowercase = compile_json_schema({"type": "object", "propertyNames": {"pattern": "^[a-z]"}}, gemma_vocab)
    got = mask(lowercase, b'{"')
    word = next(i for i in range(gemma_vocab.size) if gemma_vocab.token_bytes(i) == b" the")
    assert not got[word >> 5] & (1 << (word & 31))


def test_a_lenders_pop_ranges_are_indexed_as_the_lender_lists_them_now_on_gemma(gemma_vocab):
    """A walk evicted and composed again lists the same pop ranges in another order (its lenders differ then).
    The first-byte subtree of each range, which says which rows a borrower takes, must be that of the ranges as
    listed now: an index kept from the old order picked other subtrees' rows (on the whole dev set that lost
    pops, and then tokens of valid instances)."""
    structure = compile_json_schema({"type": "object"}, gemma_vocab)
    machine = structure.machine
    structure.masks.get(machine.read(machine.start, b'{"'))
    store = LexicalMasks.of(gemma_vocab)
    key, (_, ranges) = next((k, v[0]) for k, v in store._entries._entries.items() if len(v[0][1]) > 10)
    again = ranges[np.roll(np.arange(len(ranges)), 7)]
    for listed in (ranges, again, ranges):
        got = [bytes([store.first_bytes[j]]) for j in store._ranges_by_subtree(key, listed)]
        assert got == [gemma_vocab.trie.node_path(int(first) - 1)[:1] for first in listed[:, 0]]


def test_the_lender_index_grows_keeping_each_keys_walk(monkeypatch):
    """The index of lenders starts small and doubles while more than half full; every key still finds the walk it
    was recorded with, and walks composed through a grown index equal whole walks."""
    from constrain.runtime.lexical import _index_find, _index_put

    vocab = random_vocabulary(['"', "ab", "a", "b", "c", "12", "x"], count=400, seed=3, all_bytes=True)
    store = LexicalMasks(vocab)
    rng = np.random.default_rng(0)
    keys = np.unique(rng.integers(1, 2**63, size=3 * store.FIRST_LENDER_SLOTS, dtype=np.uint64))
    walks = rng.integers(1, 50, size=len(keys)).astype(np.uint64)
    for start in range(0, len(keys), 200):
        chunk = slice(start, start + 200)
        while 2 * (store._num_lenders + 200) > len(store._lender_keys):
            store._grow_lender_index()
        for walk in np.unique(walks[chunk]):
            mine = keys[chunk][walks[chunk] == walk]
            store._num_lenders += _index_put(store._lender_keys, store._lender_walks, mine, walk)
    assert len(store._lender_keys) >= 8 * store.FIRST_LENDER_SLOTS
    assert store._num_lenders == len(keys)
    found, got = _index_find(store._lender_keys, store._lender_walks, keys)
    assert found.all() and (got == walks).all()

    monkeypatch.setattr(LexicalMasks, "FIRST_LENDER_SLOTS", 4)
    monkeypatch.setattr(LexicalMasks, "MIN_BORROWED_TOKENS", 4)  # so that this small vocabulary's subtrees lend
    schema = {"type": "object", "additionalProperties": {"type": "string", "pattern": "^[abc]+$"}}
    structure = compile_json_schema(schema, vocab)
    machine, masks = structure.machine, structure.masks
    for text in (b'{"', b'{"a', b'{"ab":"', b'{"x":"a', b'{"c":"ab'):
        configs = machine.read(machine.start, text)
        words = masks.get(configs)
        expected = np.zeros_like(words)
        machine.walk(configs, vocab.trie, expected)
        assert (words == expected).all(), text
    assert len(LexicalMasks.of(vocab)._lender_keys) > 4
