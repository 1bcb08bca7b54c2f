"""Load or compile, once per process, every numba kernel that a compile, a mask or an advance can reach.

numba compiles a kernel the first time it is called with a new signature, or loads it from its on-disk cache
(``cache=True``) when an earlier process compiled it: seconds to a minute on a fresh machine, a second or two from
the cache. Without a warm-up that cost lands on the first request that happens to reach each kernel, in the middle
of a compile or of a decoding step. :func:`warmup` pays it up front by compiling one structure of each kind (regex,
choices, JSON Schema, Lark, GBNF) for a small synthetic vocabulary and walking tokens through them with masks: the
kernels' signatures depend on array types only, never on the vocabulary, so a real tokenizer's structures find them
ready. It also builds the automata of every supported JSON Schema ``format``, alone and as the language a
pattern or a length is intersected with (up to tens of milliseconds each the first time, then kept per process).
The vocabulary is built here rather than taken from :mod:`constrain.testing`, which the library never imports.

Given the vocabulary that requests will use, :func:`warmup` also pays what the first structure for a vocabulary
pays once per process: its store of lexical walks (:class:`~constrain.runtime.lexical.LexicalMasks`), and the
walks of the pieces most JSON schemas share (a string's body, a number, a key), by compiling one schema for that
vocabulary and reading a text through it with masks.
"""

from __future__ import annotations

import json
import threading
import time

import numpy as np

from constrain.automata.nfa import compile_kernels
from constrain.compilers.api import compile as compile_structure
from constrain.compilers.json_schema.formats import FORMAT_EXAMPLES
from constrain.compilers.json_schema.strings import build_format_languages
from constrain.compilers.specs import GBNF, Lark, Regex
from constrain.errors import ArgumentError
from constrain.kernels.bitmask import allocate_token_bitmask, apply_token_bitmask, bitmask_to_bool, bool_to_bitmask
from constrain.runtime.matcher import CompiledStructure
from constrain.vocab.vocabulary import Vocabulary

#: Characters of the synthetic vocabulary's multi-byte tokens: what JSON, numbers, dates and words are made of.
_ALPHABET = b'abcdefghijklmnopqrstuvwxyz0123456789":,{}[] .-'
#: First bytes under which the synthetic vocabulary has more tokens than the lexical walks' borrowing threshold
#: (:attr:`~constrain.runtime.lexical.LexicalMasks.MIN_BORROWED_TOKENS`), so that the borrowing paths run too.
_WIDE_FIRST_BYTES = b'"a 1'
_WORDS = (b'{"', b'":', b'","', b'"}', b"],", b"true", b"false", b"null", "é".encode(), "中文".encode())

_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "score": {"type": "number"},
        "kind": {"enum": ["a", "b", "c1"]},
        "tags": {"type": "array", "items": {"type": "string", "pattern": "^[a-z]{1,4}$"}, "maxItems": 3},
        "when": {"type": "string", "format": "date"},
        "code": {"type": "string", "pattern": "^[a-z]+$", "minLength": 2, "maxLength": 6},
        "address": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
            "required": ["city"],
        },
        "extra": {"anyOf": [{"type": "null"}, {"type": "boolean"}, {"type": "object"}]},
        "mail": {"type": "string", "format": "email", "pattern": "^[a-z]"},  # languages intersected
        "nick": {"type": "string", "pattern": "^(?!ab)[a-z]+$"},  # a lookahead
        "levels": {"type": "array", "items": {"enum": ["low", "high"]}},  # an enum as a rule of its own
    },
    "required": ["name", "age"],
}
#: Every supported ``format``, each the first time a process meets it a regex automaton of 1 to 30 milliseconds
#: (a URI's the largest), kept per process once built.
_FORMATS_SCHEMA = {
    "type": "object",
    "properties": {name: {"type": "string", "format": name} for name in FORMAT_EXAMPLES},
    "required": list(FORMAT_EXAMPLES),
    "additionalProperties": False,
}
_FORMATS_TEXT = json.dumps(FORMAT_EXAMPLES, separators=(",", ":"))
_SCHEMA_TEXT = (
    '{"name":"Ada","age":36,"score":-1.5e3,"kind":"c1","tags":["ab","c"],"when":"2024-01-31","code":"xyz",'
    '"address":{"city":"London","zip":"12345"},"extra":{"k":[1,"v",null,{"x":true}]},'
    '"levels":["high","low"]}'
)
#: The JSON schemas whose pieces most schemas share, with texts they accept: walked on the synthetic vocabulary
#: and, by :func:`_warm_vocabulary`, on the one requests use.
_JSON_CASES: tuple[tuple[dict, tuple[str, ...]], ...] = (
    (_SCHEMA, (_SCHEMA_TEXT,)),
    (_FORMATS_SCHEMA, (_FORMATS_TEXT,)),
)
_LARK = Lark(
    """
    ?start: sum
    ?sum: product | sum "+" product
    ?product: atom | product "*" atom
    ?atom: NUMBER | "-" atom | "(" sum ")"
    %import common.NUMBER
    %import common.WS_INLINE
    %ignore WS_INLINE
    """
)
_GBNF = GBNF(
    """
    root ::= list
    list ::= "[" ws (item ("," ws item)*)? "]"
    item ::= [a-z]+ | [0-9]+ | list
    ws ::= [ ]?
    """
)

#: Each structure, with texts it accepts (walked token by token with a mask at each step).
_CASES: tuple[tuple[object, tuple[str, ...]], ...] = (
    (Regex(r"[a-z]{2,8}@[a-z]+\.(com|org)|\d{4}-\d{2}-\d{2}|-?\d+(\.\d+)?"), ("ada@x.org", "2024-01-31", "-1.5")),
    (["yes", "no", "maybe"], ("maybe",)),
    *_JSON_CASES,
    (_LARK, ("1 + 2 * (3 + -4.5)",)),
    (_GBNF, ("[ab, 12, [c, []]]",)),
)

#: The keys of an open object read before any plain string: their walk is then derived from a plain string's
#: walk not known yet (:meth:`~constrain.runtime.lexical.LexicalMasks.walk_without_words`), which reaches the
#: lexical kernels' variants for read-only arrays. Walked on a vocabulary of its own, whose store of walks is
#: empty, since in :data:`_CASES` plain strings come first.
_OPEN_OBJECT = ({"type": "object", "properties": {"id": {"type": "integer"}}}, ('{"id":1,"name":"x"}',))

_lock = threading.Lock()


def warmup(vocab: Vocabulary | None = None) -> float:
    """Load (or, the first time on a machine, compile into numba's on-disk cache) every kernel a compile, a mask
    or an advance reaches, and the bitmask kernels; with ``vocab``, also that vocabulary's store of lexical walks
    and the walks most JSON schemas share (see the module's docstring). Returns the seconds it took: about a minute
    the first time on a machine (2 cores), one to two seconds in a new process after that, tens of milliseconds
    when called again in the same process. Idempotent and thread-safe; a server calls it with its vocabulary at
    start-up, ``scripts/setup.sh`` calls it once per install."""
    if vocab is not None and not isinstance(vocab, Vocabulary):
        raise ArgumentError("vocab", vocab, "a constrain.Vocabulary, or None")
    begun = time.perf_counter()
    with _lock:
        compile_kernels()  # the determinisation kernels only a large automaton reaches
        synthetic = _synthetic_vocabulary()
        for spec, texts in _CASES:
            _compile_and_walk(spec, texts, synthetic)
        _compile_and_walk(*_OPEN_OBJECT, _synthetic_vocabulary(holes=1))
        build_format_languages()
        _bitmask_kernels(synthetic.size)
        if vocab is not None and vocab.fingerprint not in _warm_vocabularies:
            _warm_vocabulary(vocab)
            _warm_vocabularies.add(vocab.fingerprint)
    return time.perf_counter() - begun


#: The fingerprints of the vocabularies :func:`warmup` has prepared in this process.
_warm_vocabularies: set[str] = set()


def _warm_vocabulary(vocab: Vocabulary) -> None:
    """The lexical walks of :data:`_JSON_CASES`' pieces for ``vocab``, each text read with a mask before every
    token (split greedily into ``vocab``'s longest tokens; a text the vocabulary cannot spell is left out)."""
    bitmask = allocate_token_bitmask(1, vocab.size)
    for schema, texts in _JSON_CASES:
        structure = compile_structure(schema, vocab, strict=False, cache=False, time_limit=None)
        for text in texts:
            try:
                tokens = _tokens(vocab, text.encode())
            except ValueError:
                continue
            matcher = structure.matcher()
            for token in tokens:
                matcher.fill_bitmask(bitmask, 0)
                matcher.advance(token)
            matcher.fill_bitmask(bitmask, 0)


def _synthetic_vocabulary(holes: int = 0) -> Vocabulary:
    """Every byte, a few hundred two- and three-byte tokens under each of a few first bytes, JSON punctuation and
    multi-byte characters; then ``holes`` ids without a token (another fingerprint: a store of walks of its own),
    and the end of sequence."""
    tokens = [bytes([b]) for b in range(256)]
    for first in _WIDE_FIRST_BYTES:
        tokens += [bytes([first, c]) for c in _ALPHABET]
        tokens += [bytes([first, c, d]) for c in _ALPHABET[:16] for d in _ALPHABET[:16]]
    tokens += [w for w in _WORDS if w not in tokens]
    return Vocabulary.from_token_bytes(tokens, eos_ids=[len(tokens) + holes])


def _compile_and_walk(spec: object, texts: tuple[str, ...], vocab: Vocabulary) -> None:
    structure = compile_structure(spec, vocab, strict=False, cache=False, time_limit=None)
    for text in texts:
        _walk(structure, text)


def _tokens(vocab: Vocabulary, text: bytes) -> list[int]:
    """``text`` split greedily into the longest tokens of ``vocab``, read off its trie (a dictionary of every
    token's bytes would cost a large vocabulary tens of megabytes that the allocator keeps); ValueError when a
    byte starts no token (the synthetic vocabulary has every byte)."""
    trie = vocab.trie
    node_byte, node_next = trie.node_byte.tolist(), trie.node_next.tolist()
    token_ptr, token_ids = trie.node_token_ptr, trie.token_ids
    out, at = [], 0
    while at < len(text):
        best, node, end, depth = None, 0, trie.num_nodes, 0
        while at + depth < len(text):
            while node < end and node_byte[node] != text[at + depth]:  # the children of the node reached, in turn
                node = node_next[node]
            if node >= end:
                break
            depth += 1
            if token_ptr[node + 1] > token_ptr[node]:
                best = (int(token_ids[token_ptr[node]]), depth)
            node, end = node + 1, node_next[node]
        if best is None:
            raise ValueError(f"no token of the vocabulary starts with {text[at : at + 1]!r}")
        out.append(best[0])
        at += best[1]
    return out


def _walk(structure: CompiledStructure, text: str) -> None:
    """Read ``text`` through a matcher as a decoding loop does, a mask before each token, then the matcher's other
    queries; AssertionError if the structure refuses the text (a broken warm-up case)."""
    vocab = structure.vocab
    tokens = _tokens(vocab, text.encode())
    matcher = structure.matcher()
    bitmask = allocate_token_bitmask(1, vocab.size)
    for token in tokens:
        matcher.fill_bitmask(bitmask, 0)
        assert bitmask[0, token >> 5] >> (token & 31) & 1, f"the warm-up structure refuses {text!r}"
        matcher.advance(token)
    matcher.fill_bitmask(bitmask, 0)
    assert matcher.is_accepting(), f"the warm-up structure does not end after {text!r}"
    matcher.advance(int(vocab.eos_ids[0]))
    matcher.rollback(len(tokens) + 1)
    matcher.validate_tokens(tokens)
    matcher.allowed_tokens()
    matcher.forced_tokens()


def _bitmask_kernels(vocab_size: int) -> None:
    """The kernels that apply a mask to logits (one per float width) and convert masks."""
    bitmask = allocate_token_bitmask(1, vocab_size)
    bitmask[0, 0] = 1
    for dtype in (np.float16, np.float32, np.float64):
        apply_token_bitmask(np.zeros((1, vocab_size), dtype=dtype), bitmask)
    bool_to_bitmask(bitmask_to_bool(bitmask, vocab_size))
