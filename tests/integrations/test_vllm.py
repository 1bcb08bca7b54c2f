"""The vLLM integration: the structured-output protocol classes and the logits-processor plug-in.

vLLM's engine needs a GPU, so these tests drive the classes the way its engine does: a bitmask of
``max_num_seqs * (1 + num_spec_tokens)`` rows filled per draft position, ``-1`` sentinels, accept then roll back,
``validate_tokens`` on drafts, batched fills from threads; and the plug-in with the batch layout vLLM's runners
hand it. Where vLLM's Python modules import (``pip install --no-deps vllm`` plus a few light packages), the classes
are also checked against vLLM's own abstract classes, loaders and ``StructuredOutputManager``.
"""

from __future__ import annotations

import functools
import inspect
import json
import logging
import pickle
import re
import tomllib
import types
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from constrain.compilers.regex import compile_regex
from constrain.errors import RegexError, ShapeError, StructureError, TokenError
from constrain.integrations import vllm as cv
from constrain.integrations.vllm import (
    ConstrainBackend,
    ConstrainGrammar,
    RequestType,
    choice_regex,
    fill_draft_bitmasks,
    structure_request,
)
from constrain.integrations.vllm import plugin as vllm_plugin
from constrain.kernels.bitmask import allowed_token_ids
from constrain.testing import accepts_text, brute_force_mask, byte_vocabulary
from constrain.vocab.vocabulary import Vocabulary

# ------------------------------------------------------------------------------------------------------------
# a small vocabulary: every byte, a few longer tokens, two end-of-sequence ids and a special token
# ------------------------------------------------------------------------------------------------------------

MULTI = [b"ab", b"abc", b"12", b"yes", b"no", b"-1", b'{"', b"\n\n"]
TOKENS = [bytes([i]) for i in range(256)] + MULTI
EOS, EOS2, SPECIAL = len(TOKENS), len(TOKENS) + 1, len(TOKENS) + 2
SIZE = SPECIAL + 1
PADDED = 320  # the model's logits are wider than the tokenizer


def tok(text: str) -> list[int]:
    """Byte tokens of ``text`` (one token per byte)."""
    return list(text.encode())


@pytest.fixture(scope="module")
def vocab() -> Vocabulary:
    return Vocabulary.from_token_bytes(TOKENS + [None, None, b"<x>"], eos_ids=[EOS, EOS2], special_ids=[SPECIAL])


@pytest.fixture(scope="module")
def backend(vocab) -> ConstrainBackend:
    return ConstrainBackend(None, vocab, vocab_size=PADDED)


def row_set(bitmask, row: int, width: int = PADDED) -> set[int]:
    arr = bitmask.numpy() if isinstance(bitmask, torch.Tensor) else bitmask
    return set(allowed_token_ids(arr[row], width).tolist())


def expected_set(structure, tokens, stops, width: int = PADDED) -> set[int]:
    """The allowed set after ``tokens`` (read as text), by asking a fresh matcher about every id; the request's
    stop tokens take the place of the vocabulary's end-of-sequence ids."""
    m = structure.matcher()
    m.advance(tokens)
    allowed = brute_force_mask(m)
    allowed[structure.vocab.eos_ids] = False
    out = set(np.flatnonzero(allowed).tolist()) - set(stops)
    if m.is_accepting():
        out |= {t for t in stops if t < width}
    return out


# ------------------------------------------------------------------------------------------------------------
# requests -> structures
# ------------------------------------------------------------------------------------------------------------


def test_request_types_by_enum_member_or_name(backend):
    vllm_like = enum_member = SimpleNamespace(name="REGEX")  # what vLLM's StructuredOutputOptions.REGEX looks like
    for request_type in (RequestType.REGEX, "regex", "REGEX", vllm_like, enum_member):
        assert backend.compile_structure(request_type, "a+").source == "a+"
    with pytest.raises(StructureError, match="unknown structured-output request type"):
        backend.compile_grammar("yaml", "a")
    with pytest.raises(StructureError, match="STRUCTURAL_TAG requests are not supported"):
        backend.compile_grammar("structural_tag", "{}")
    with pytest.raises(RegexError, match="position"):
        backend.compile_grammar("regex", "a(b")


def test_compiled_structures_are_shared_and_bounded(vocab):
    b = ConstrainBackend(None, vocab, max_structures=2)
    first = b.compile_structure("regex", "x+")
    assert b.compile_structure(RequestType.REGEX, "x+") is first
    g1, g2 = b.compile_grammar("regex", "x+"), b.compile_grammar("regex", "x+")
    assert g1.structure is g2.structure and g1.matcher is not g2.matcher
    b.compile_structure("regex", "y+")
    b.compile_structure("regex", "z+")
    assert b.compile_structure("regex", "x+") is not first  # evicted
    b.destroy()
    assert not b._structures
    assert b.vocab_size == vocab.size


@pytest.mark.parametrize(
    "choices",
    [["yes", "no"], ["a|b", "(x)", "[y]", ".*", "\\d", "^$", "{1}", " sp ace", ""], ["été", "日本", "🙂", "\n\t"]],
)
def test_choice_is_an_alternation_of_escaped_literals(vocab, choices):
    pattern = choice_regex(choices)
    byte_vocab = byte_vocabulary()
    structure = compile_regex(pattern, byte_vocab)
    for choice in choices:
        assert accepts_text(structure, choice), (choice, pattern)
    for other in ["ye", "yes!", "a", "x", "(x", "été!", "\\", "a|", "yesno"]:
        assert accepts_text(structure, other) == (other in choices), (other, pattern)
    # through the backend, with the spec as vLLM's key carries it (JSON text)
    g = ConstrainBackend(None, byte_vocab).compile_grammar("choice", json.dumps(choices))
    assert g.accept_tokens("r", list(choices[0].encode()) + [256]) and g.is_terminated()


@pytest.mark.parametrize("spec", ["[]", "not json", "[1]", '"yes"', "{}"])
def test_bad_choices(backend, spec):
    with pytest.raises(StructureError):
        backend.compile_grammar("choice", spec)


def test_requests_compile_through_constrain_compile(backend, vocab, monkeypatch):
    """Each request type reaches constrain.compile with the kind its spec needs (and so shares its cache)."""
    from constrain.compilers import api

    calls = []
    real = api.compile

    def recording(spec, v, **options):
        calls.append((options["kind"], spec))
        assert v is vocab
        return real(spec, v, **options)

    monkeypatch.setattr(api, "compile", recording)
    backend.compile_grammar(RequestType.JSON, '{"type": "integer"}')
    backend.compile_grammar(RequestType.JSON_OBJECT, "")
    backend.compile_grammar(RequestType.GRAMMAR, 'start: "ok"')
    backend.compile_grammar(RequestType.GRAMMAR, 'root ::= "ok"')
    backend.compile_grammar(RequestType.CHOICE, '["a", "b"]')
    backend.compile_grammar(RequestType.REGEX, "q{2}z+")
    assert calls == [
        ("json_schema", {"type": "integer"}),
        ("json_schema", {"type": "object"}),
        ("lark", 'start: "ok"'),
        ("gbnf", 'root ::= "ok"'),
        ("choices", ["a", "b"]),
        ("regex", "q{2}z+"),
    ]
    with pytest.raises(StructureError, match="not valid JSON"):
        backend.compile_grammar("json", "{nope")


# ------------------------------------------------------------------------------------------------------------
# the grammar object
# ------------------------------------------------------------------------------------------------------------


def test_accept_validate_rollback_terminate(backend):
    g = backend.compile_grammar("regex", r"\d{2}-(yes|no)")
    assert not g.is_terminated() and g.num_processed_tokens == 0
    assert g.accept_tokens("r", tok("12"))
    assert g.validate_tokens(tok("-") + [MULTI.index(b"yes") + 256, EOS, 7]) == tok("-") + [259, EOS]
    assert g.num_processed_tokens == 2  # validate changed nothing
    assert g.validate_tokens(tok("-x")) == tok("-")
    # a disallowed token: False, and nothing of the call is kept
    assert not g.accept_tokens("r", tok("-") + [EOS])
    assert not g.accept_tokens("r", tok("-n") + [SPECIAL])
    assert not g.accept_tokens("r", [PADDED - 1])  # a padded id, past the tokenizer
    assert g.num_processed_tokens == 2 and g.validate_tokens(tok("-no")) == tok("-no")
    assert g.accept_tokens("r", tok("-no"))
    assert g.is_accepting() and not g.is_terminated()
    assert g.accept_tokens("r", [EOS2, 5, 6])  # a stop token ends it; what follows is ignored
    assert g.is_terminated() and g.num_processed_tokens == 6
    assert g.accept_tokens("r", [1, 2, 3]) and g.num_processed_tokens == 6
    assert g.validate_tokens(tok("12")) == []
    g.rollback(1)  # undo the stop token
    assert not g.is_terminated() and g.is_accepting()
    g.rollback(4)
    assert g.num_processed_tokens == 1 and g.validate_tokens(tok("2-yes")) == tok("2-yes")
    with pytest.raises(TokenError, match="cannot roll back 2"):
        g.rollback(2)
    g.reset()
    assert g.num_processed_tokens == 0 and g.validate_tokens(tok("34")) == tok("34")


def test_stop_tokens_override_the_vocabulary_eos(vocab):
    b = ConstrainBackend(None, vocab, vocab_size=PADDED)
    newline = ord("\n")
    g = b.compile_grammar("regex", "a(\nb)?", stop_token_ids={newline, 300})
    bm = b.allocate_token_bitmask(2)
    g.fill_bitmask(bm, 0)
    assert row_set(bm, 0) == {ord("a")}  # no stop token yet
    g.accept_tokens("r", tok("a"))
    g.fill_bitmask(bm, 1)
    # complete: the stop tokens (one of them past the tokenizer) are allowed; "\n" is a stop token, never text;
    # the vocabulary's own EOS ids stay masked
    assert row_set(bm, 1) == {newline, 300}
    assert g.validate_tokens([newline, ord("b")]) == [newline]
    assert not g.accept_tokens("r", [EOS])
    assert g.accept_tokens("r", [300]) and g.is_terminated()
    g.fill_bitmask(bm, 1)
    assert row_set(bm, 1) == {newline, 300}
    # without stop tokens: the vocabulary's EOS ids
    g = b.compile_grammar("regex", "a", stop_token_ids=set())
    g.accept_tokens("r", tok("a"))
    g.fill_bitmask(bm, 0)
    assert row_set(bm, 0) == {EOS, EOS2}


def test_fill_bitmask_any_width_numpy_or_torch(vocab):
    structure = compile_regex("[ab]+", vocab)
    g = ConstrainGrammar(structure)
    want = expected_set(structure, [], {EOS, EOS2})
    wide = np.full((3, 12), -1, dtype=np.int32)  # 384 ids
    g.fill_bitmask(wide, 2)
    assert row_set(wide, 2, 384) == want and (wide[:2] == -1).all()
    narrow = torch.full((1, 4), -1, dtype=torch.int32)  # logits narrower than the tokenizer: 128 ids
    g.fill_bitmask(narrow, 0)
    assert row_set(narrow, 0, 128) == {t for t in want if t < 128}
    with pytest.raises(ShapeError, match="out of range"):
        g.fill_bitmask(wide, 3)
    with pytest.raises(ShapeError, match="int32"):
        g.fill_bitmask(np.zeros((1, 12), np.int64), 0)
    with pytest.raises(ShapeError):
        g.fill_bitmask([[0]], 0)


# ------------------------------------------------------------------------------------------------------------
# driving it as vLLM's engine does
# ------------------------------------------------------------------------------------------------------------


def engine_fill(backend, grammars, spec_tokens, num_spec):
    """vLLM's StructuredOutputManager.grammar_bitmask, serial path, written out: each request owns 1 + num_spec rows;
    fill, then accept the draft; after a -1 sentinel the rows are left unconstrained; roll back at the end."""
    bitmask = backend.allocate_token_bitmask(len(grammars) * (1 + num_spec))
    full = torch.tensor(-1, dtype=torch.int32)
    for i, (g, drafts) in enumerate(zip(grammars, spec_tokens)):
        index = i * (1 + num_spec)
        advanced = 0
        padding = False
        for token in drafts:
            if padding or g.is_terminated():
                bitmask[index].fill_(full)
            else:
                g.fill_bitmask(bitmask, index)
            if token == -1:
                padding = True
            elif not padding:
                assert not g.is_terminated() and g.accept_tokens("r", [token])
                advanced += 1
            index += 1
        if padding or g.is_terminated():
            bitmask[index].fill_(full)
        else:
            g.fill_bitmask(bitmask, index)
        if advanced:
            g.rollback(advanced)
    return bitmask


def test_speculative_rows_like_the_engine(backend):
    num_spec = 3
    patterns = [r"\d{2}-(yes|no)", "a(bc)*", r'\{"k": [0-9]+\}']
    grammars = [backend.compile_grammar("regex", p) for p in patterns]
    histories = [tok("1"), [], tok('{"k')]
    for g, h in zip(grammars, histories):
        assert g.accept_tokens("r", h)
    drafts = [
        tok("2-") + [MULTI.index(b"no") + 256],  # all valid
        [256, ord("c"), -1],  # "ab", "c", then the sentinel
        tok('":') + [-1],
    ]
    # the scheduler first trims drafts to what the grammar accepts (vLLM strips the -1 padding first)
    for g, d in zip(grammars, drafts):
        stripped = d[: d.index(-1)] if -1 in d else d
        assert g.validate_tokens(stripped) == stripped
    bitmask = engine_fill(backend, grammars, drafts, num_spec)
    assert bitmask.shape == (len(grammars) * (1 + num_spec), (PADDED + 31) // 32)
    for i, (g, h, d) in enumerate(zip(grammars, histories, drafts)):
        assert g.num_processed_tokens == len(h)  # rolled back
        for j in range(num_spec + 1):
            row = i * (1 + num_spec) + j
            read = d[:j]
            if -1 in read:
                assert (bitmask[row] == -1).all()
                continue
            assert row_set(bitmask, row) == expected_set(g.structure, h + read, {EOS, EOS2}), (i, j)
    # the helper the plug-in uses fills the same rows; past the sentinel it repeats the last row filled
    for i, (g, d) in enumerate(zip(grammars, drafts)):
        rows = np.zeros((1 + num_spec, bitmask.shape[1]), dtype=np.int32)
        stripped = d[: d.index(-1)] if -1 in d else d
        assert fill_draft_bitmasks(g, rows, 0, d) == len(stripped)
        for j in range(num_spec + 1):
            source = i * (1 + num_spec) + min(j, len(stripped))
            assert (rows[j] == bitmask[source].numpy()).all()


def test_rejected_draft_and_stop_token_inside_drafts(backend):
    g = backend.compile_grammar("regex", "ab?")
    rows = np.zeros((4, (PADDED + 31) // 32), dtype=np.int32)
    # "a", then "c" (rejected): rows 2 and 3 repeat row 1, which excludes "c"
    assert fill_draft_bitmasks(g, rows, 0, tok("ac") + [ord("b")]) == 1
    assert ord("c") not in row_set(rows, 1) and (rows[2] == rows[1]).all() and (rows[3] == rows[1]).all()
    # "a", then a stop token: terminated after it, so the bonus row allows everything
    assert fill_draft_bitmasks(g, rows, 0, tok("a") + [EOS, ord("b")]) == 2
    assert row_set(rows, 1) == {ord("b"), EOS, EOS2} and (rows[2] == -1).all() and (rows[3] == -1).all()
    assert g.num_processed_tokens == 0 and not g.is_terminated()


def run_requests(backend, patterns, num_spec, seed, request_type="regex"):
    """A little engine: random logits, masks per draft position, drafts from a 'draft model' that guesses the
    structure's tokens (sometimes wrong), verification that keeps the target's argmax, as greedy speculation does.
    Returns the generated token lists."""
    rng = np.random.default_rng(seed)
    grammars = [backend.compile_grammar(request_type, p) for p in patterns]
    outputs: list[list[int]] = [[] for _ in patterns]
    for _step in range(60):
        live = [i for i, g in enumerate(grammars) if not g.is_terminated()]
        if not live:
            break
        drafts = []
        for i in live:
            probe = grammars[i]
            raw = []
            for _ in range(num_spec):
                options = sorted(row_set_from(probe))
                t = int(rng.choice(options)) if rng.random() < 0.8 else int(rng.integers(0, SIZE))
                raw.append(t)
                if not probe.accept_tokens("draft", [t]) or probe.is_terminated():
                    break
            probe.rollback(probe.num_processed_tokens - len(outputs[i]))
            # the scheduler keeps the drafts' valid prefix; the rest of the block is -1 padding
            valid = probe.validate_tokens(raw)
            drafts.append(valid + [-1] * (num_spec - len(valid)))
        bitmask = engine_fill(backend, [grammars[i] for i in live], drafts, num_spec)
        logits = torch.tensor(rng.normal(size=(bitmask.shape[0], PADDED)), dtype=torch.float32)
        from constrain.kernels.bitmask import apply_token_bitmask

        apply_token_bitmask(logits, bitmask)
        for k, i in enumerate(live):
            g = grammars[i]
            d = drafts[k]
            valid = [t for t in d if t != -1]
            accepted = []
            for j in range(num_spec + 1):
                target = int(torch.argmax(logits[k * (1 + num_spec) + j]))
                if j < len(valid) and valid[j] == target:
                    accepted.append(target)
                    continue
                accepted.append(target)  # the target's own token at the first mismatch (or the bonus)
                break
            for t in accepted:
                assert g.accept_tokens("r", [t]), (patterns[i], outputs[i], t)
                outputs[i].append(t)
                if g.is_terminated():
                    break
    return outputs, grammars


def row_set_from(g) -> set[int]:
    bm = np.zeros((1, (PADDED + 31) // 32), dtype=np.int32)
    g.fill_bitmask(bm, 0)
    return row_set(bm, 0)


@pytest.mark.parametrize("num_spec", [0, 1, 4])
def test_generation_with_speculation_stays_inside(backend, vocab, num_spec):
    patterns = [r"\d{2,4}-(yes|no)", r"a(bc)+", r"\{\"k\": -?[0-9]{1,3}\}", "(ab|abc)c?"]
    outputs, grammars = run_requests(backend, patterns, num_spec, seed=num_spec)
    for pattern, out, g in zip(patterns, outputs, grammars):
        assert g.is_terminated(), (pattern, out)
        assert out[-1] in (EOS, EOS2)
        assert re.fullmatch(pattern, vocab.decode(out[:-1]).decode()), (pattern, vocab.decode(out))


def greedy(backend, pattern, num_spec, seed, request_type="regex"):
    """Greedy decoding under the structure with a 'model' whose logits depend only on the history, and a draft
    model that guesses (often wrongly); verification keeps a draft exactly when it is the target's argmax."""
    from constrain.kernels.bitmask import apply_token_bitmask

    def model_logits(history):
        rng = np.random.default_rng([seed, *history])
        return rng.normal(size=PADDED)

    g = backend.compile_grammar(request_type, pattern)
    draft_rng = np.random.default_rng(seed + 1000)
    out: list[int] = []
    while not g.is_terminated() and len(out) < 40:
        raw = [int(draft_rng.choice(sorted(row_set_from(g)) or [0]))]
        while len(raw) < num_spec and g.accept_tokens("draft", raw[-1:]) and not g.is_terminated():
            raw.append(int(draft_rng.choice(sorted(row_set_from(g)) or [0])))
        g.rollback(g.num_processed_tokens - len(out))
        valid = g.validate_tokens(raw[:num_spec])
        drafts = valid + [-1] * (num_spec - len(valid))
        bitmask = engine_fill(backend, [g], [drafts], num_spec)
        rows = [model_logits(out + valid[:j]) for j in range(num_spec + 1)]
        logits = torch.tensor(np.stack(rows), dtype=torch.float32)
        apply_token_bitmask(logits, bitmask)
        for j in range(num_spec + 1):
            target = int(torch.argmax(logits[j]))
            assert g.accept_tokens("r", [target])
            out.append(target)
            if g.is_terminated() or not (j < len(valid) and valid[j] == target):
                break
    return out


@pytest.mark.parametrize("pattern", [r"\d{2,6}-(yes|no)", r"a(bc){1,5}c?", r"[a-c]{3,12}"])
def test_greedy_output_is_the_same_with_speculation(backend, pattern):
    for seed in range(3):
        plain = greedy(backend, pattern, 0, seed)
        assert plain[-1] in (EOS, EOS2)
        for num_spec in (1, 3):
            assert greedy(backend, pattern, num_spec, seed) == plain, (pattern, seed, num_spec)


# ------------------------------------------------------------------------------------------------------------
# the real Gemma tokenizer
# ------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def gemma_backend(gemma_tokenizer, gemma_vocab):
    b = ConstrainBackend(None, gemma_tokenizer, vocab_size=gemma_vocab.size + 128)  # padded embeddings
    assert b.vocab.fingerprint == gemma_vocab.fingerprint
    return b


def test_gemma_end_of_sequence_and_padding(gemma_backend, gemma_vocab):
    g = gemma_backend.compile_grammar("regex", r"(yes|no)")
    bm = gemma_backend.allocate_token_bitmask(2)
    assert bm.shape == (2, (gemma_vocab.size + 128 + 31) // 32)
    g.fill_bitmask(bm, 0)
    allowed = row_set(bm, 0, gemma_backend.vocab_size)
    assert allowed and max(allowed) < gemma_vocab.size and not allowed & {0, 1, 2, 105, 106}
    g.accept_tokens("r", gemma_vocab_ids(gemma_vocab, "yes"))
    g.fill_bitmask(bm, 1)
    assert row_set(bm, 1, gemma_backend.vocab_size) == {1, 106}  # both of Gemma's end tokens
    g2 = gemma_backend.compile_grammar("regex", r"(yes|no)", stop_token_ids={1})  # what vLLM passes
    g2.accept_tokens("r", gemma_vocab_ids(gemma_vocab, "yes"))
    g2.fill_bitmask(bm, 1)
    assert row_set(bm, 1, gemma_backend.vocab_size) == {1}
    assert g2.validate_tokens([106]) == [] and g2.validate_tokens([1, 5]) == [1]


def gemma_vocab_ids(vocab, text: str) -> list[int]:
    """Token ids spelling ``text`` one byte at a time through Gemma's <0xNN> byte tokens (ids 238-493)."""
    return [238 + b for b in text.encode()]


def test_gemma_speculative_generation(gemma_backend, gemma_vocab):
    from constrain.kernels.bitmask import apply_token_bitmask

    pattern = r"[A-Z][a-z]{2,8} \d{4}-\d{2}-\d{2}"
    num_spec = 3
    rng = np.random.default_rng(7)
    g = gemma_backend.compile_grammar("regex", pattern, stop_token_ids={1, 106})
    out: list[int] = []
    for _ in range(80):
        if g.is_terminated():
            break
        # drafts: the structure's own most likely tokens under a random 'draft model', with a wrong one now and then
        probe_logits = torch.tensor(rng.normal(size=(num_spec, gemma_backend.vocab_size)), dtype=torch.float32)
        raw = []
        for j in range(num_spec):
            bm = gemma_backend.allocate_token_bitmask(1)
            g.fill_bitmask(bm, 0)
            apply_token_bitmask(probe_logits[j : j + 1], bm)
            t = int(torch.argmax(probe_logits[j])) if rng.random() < 0.85 else int(rng.integers(500, 200_000))
            raw.append(t)
            if not g.accept_tokens("draft", [t]) or g.is_terminated():
                break
        g.rollback(g.num_processed_tokens - len(out))
        valid = g.validate_tokens(raw)  # the scheduler's check of the drafts
        assert valid == raw[: len(valid)]
        drafts = valid + [-1] * (num_spec - len(valid))
        bitmask = engine_fill(gemma_backend, [g], [drafts], num_spec)
        logits = torch.tensor(rng.normal(size=(1 + num_spec, gemma_backend.vocab_size)), dtype=torch.float32)
        apply_token_bitmask(logits, bitmask)
        for j in range(num_spec + 1):
            target = int(torch.argmax(logits[j]))
            assert target < gemma_vocab.size
            assert g.accept_tokens("r", [target])
            out.append(target)
            if g.is_terminated() or not (j < len(valid) and valid[j] == target):
                break
    assert g.is_terminated() and out[-1] in (1, 106)
    assert re.fullmatch(pattern, gemma_vocab.decode(out[:-1]).decode()), gemma_vocab.decode(out)


def test_batched_fills_from_threads_equal_sequential_fills(gemma_backend, gemma_vocab):
    patterns = [r"\d{4}-\d{2}-\d{2}", r"[a-z]+@[a-z]+\.(com|org)", r"(true|false|null)", r"[^\n]{0,40}"]
    texts = ["2024-0", "abc@exa", "fal", "hello wo"]
    grammars = []
    for i in range(48):
        g = gemma_backend.compile_grammar("regex", patterns[i % 4])
        prefix = texts[i % 4][: i % 7]
        assert g.accept_tokens("r", gemma_vocab_ids(gemma_vocab, prefix))
        grammars.append(g)
    n = len(grammars)
    sequential = gemma_backend.allocate_token_bitmask(n)
    for i, g in enumerate(grammars):
        g.fill_bitmask(sequential, i)
    for _ in range(3):
        threaded = gemma_backend.allocate_token_bitmask(n)
        with ThreadPoolExecutor(max_workers=8) as pool:
            # batches of rows, as vLLM's manager submits them
            batches = [range(k, min(k + 5, n)) for k in range(0, n, 5)]

            def fill(rows, bitmask=threaded):
                for r in rows:
                    grammars[r].fill_bitmask(bitmask, r)

            list(pool.map(fill, batches))
        assert torch.equal(threaded, sequential)


# ------------------------------------------------------------------------------------------------------------
# the logits-processor plug-in
# ------------------------------------------------------------------------------------------------------------


def params(extra_args=None, stops=(EOS,)):
    """What the plug-in reads from vLLM's SamplingParams."""
    return SimpleNamespace(extra_args=extra_args, all_stop_token_ids=set(stops))


class Plugin(vllm_plugin._StructureLogitsProcessorImpl):
    """The plug-in's logic with a backend of the small vocabulary (vLLM would load the model's tokenizer)."""

    def make_backend(self):
        return ConstrainBackend(self.vllm_config, VOCAB_HOLDER["vocab"], vocab_size=PADDED)


VOCAB_HOLDER: dict = {}


@pytest.fixture
def plugin_vocab(vocab):
    VOCAB_HOLDER["vocab"] = vocab
    return vocab


def test_structure_request_from_extra_args():
    assert structure_request(None) is None and structure_request({"other": 1}) is None
    assert structure_request({"constrain_regex": "a+"}) == (RequestType.REGEX, "a+")
    assert structure_request({"constrain": {"regex": "a+"}}) == (RequestType.REGEX, "a+")
    assert structure_request({"constrain_choice": ["x", "y"]}) == (RequestType.CHOICE, '["x", "y"]')
    assert structure_request({"constrain_choice": '["x"]'}) == (RequestType.CHOICE, '["x"]')
    assert structure_request({"constrain": {"json": {"type": "integer"}}}) == (RequestType.JSON, '{"type": "integer"}')
    assert structure_request({"constrain_json": '{"type": "integer"}'}) == (RequestType.JSON, '{"type": "integer"}')
    assert structure_request({"constrain_json_object": True}) == (RequestType.JSON_OBJECT, "")
    assert structure_request({"constrain_json_object": "true"}) == (RequestType.JSON_OBJECT, "")
    assert structure_request({"constrain_json_object": 0}) is None
    assert structure_request({"constrain_grammar": 'start: "a"'}) == (RequestType.GRAMMAR, 'start: "a"')
    for bad, message in [
        ({"constrain_regex": "a", "constrain_choice": ["a"]}, "one structure per request"),
        ({"constrain": {"regx": "a"}}, "unknown key"),
        ({"constrain": "a+"}, "must be a dict"),
        ({"constrain": {"regex": "a"}, "constrain_regex": "b"}, "both flat and"),
        ({"constrain_regex": 5}, "must be a string"),
        ({"constrain_choice": []}, "non-empty list"),
        ({"constrain_json": "{bad"}, "not valid JSON"),
        ({"constrain_json": 3}, "JSON Schema"),
        ({"constrain_json_object": "maybe"}, "true or false"),
    ]:
        with pytest.raises(StructureError, match=message):
            structure_request(bad)


def test_validate_params_rejects_bad_requests_early():
    validate = vllm_plugin._StructureLogitsProcessorImpl.validate_params
    validate(params())
    validate(params({"constrain_regex": r"\d+"}))
    validate(params({"constrain_choice": ["a", "b"]}))
    validate(params({"constrain_json": "{}"}))
    validate(params({"constrain_json_object": True}))
    validate(params({"constrain_grammar": 'root ::= "a"'}))
    for bad in [
        {"constrain_regex": "a(b"},
        {"constrain_regex": r"(?=a)"},
        {"constrain_choice": []},
        {"constrain_json": '{"type": "strin"}'},
        {"constrain_json": '{"type": "integer", "minimum": 3, "maximum": 1}'},
    ]:
        with pytest.raises(ValueError):  # vLLM turns a ValueError into an HTTP 400
            validate(params(bad))


class FakeBuffer(SimpleNamespace):
    """A vLLM model-runner buffer: ``.gpu`` (the device tensor) and, for UVA-backed ones, ``.np``."""


def make_req_states(max_reqs=4, max_len=64, vocab_size=PADDED, dataclass=None):
    fields = dict(
        device=torch.device("cpu"),
        max_num_reqs=max_reqs,
        vocab_size=vocab_size,
        all_token_ids=FakeBuffer(gpu=torch.zeros((max_reqs, max_len), dtype=torch.int32)),
        prompt_len=FakeBuffer(np=np.zeros(max_reqs, dtype=np.int32)),
        prefill_len=FakeBuffer(np=np.zeros(max_reqs, dtype=np.int32)),
        total_len=FakeBuffer(gpu=torch.zeros(max_reqs, dtype=torch.int32)),
    )
    return (dataclass or SimpleNamespace)(**fields)


class Runner:
    """The parts of vLLM's V2 model runner that the plug-in sees: request slots, committed tokens, and each step's
    logits rows (one per request, or 1 + drafts per request under speculation, in any order)."""

    def __init__(self, processor_cls, ctx_cls=None, state_cls=None):
        self.req_states = make_req_states(dataclass=state_cls)
        self.proc = processor_cls(SimpleNamespace(model_config=None), self.req_states)
        self.ctx_cls = ctx_cls or SimpleNamespace

    def add(self, slot, prompt, sampling_params):
        rs = self.req_states
        rs.prompt_len.np[slot] = len(prompt)
        rs.prefill_len.np[slot] = len(prompt)
        rs.all_token_ids.gpu[slot, : len(prompt)] = torch.tensor(prompt, dtype=torch.int32)
        rs.total_len.gpu[slot] = len(prompt)
        return self.proc.add_request(slot, sampling_params)

    def commit(self, slot, tokens):
        rs = self.req_states
        n = int(rs.total_len.gpu[slot])
        rs.all_token_ids.gpu[slot, n : n + len(tokens)] = torch.tensor(tokens, dtype=torch.int32)
        rs.total_len.gpu[slot] = n + len(tokens)

    def step(self, blocks, rng):
        """``blocks``: (slot, drafts) in batch order; returns (logits before, logits after, row ranges)."""
        rows_slot, local, input_ids, ranges = [], [], [], {}
        for slot, drafts in blocks:
            start = len(rows_slot)
            last = int(self.req_states.all_token_ids.gpu[slot, int(self.req_states.total_len.gpu[slot]) - 1])
            for j, token in enumerate([last] + list(drafts)):
                rows_slot.append(slot)
                local.append(j)
                input_ids.append(token)
            ranges[slot] = range(start, len(rows_slot))
        ctx = self.ctx_cls(
            expanded_idx_mapping=torch.tensor(rows_slot, dtype=torch.int32),
            idx_mapping=torch.tensor([s for s, _ in blocks], dtype=torch.int32),
            idx_mapping_np=np.asarray([s for s, _ in blocks], dtype=np.int32),
            expanded_local_pos=torch.tensor(local, dtype=torch.int32),
            input_ids=torch.tensor(input_ids, dtype=torch.int32),
            pos=torch.zeros(len(rows_slot), dtype=torch.int64),
            seq_lens_upper_bound_np=np.zeros(len(blocks), dtype=np.int32),
        )
        before = torch.tensor(rng.normal(size=(len(rows_slot), PADDED)), dtype=torch.float32)
        after = self.proc.apply(before.clone(), ctx)
        return before, after, ranges


def finite_set(row) -> set[int]:
    return set(torch.nonzero(torch.isfinite(row)).flatten().tolist())


def check_plugin_v2(runner, structures):
    rng = np.random.default_rng(0)
    assert runner.add(0, [5, 6, 7], params({"constrain_regex": r"\d{2}-(yes|no)"}))
    assert not runner.add(1, [5, 6], params({"temperature": 0}))  # no structure: not ours
    assert runner.add(2, [9], params({"constrain": {"choice": ["abc", "ab-1"]}}, stops=(EOS2,)))
    s0 = structures(r"\d{2}-(yes|no)")
    s2 = structures(choice_regex(["abc", "ab-1"]))

    # a plain step: one row per request
    before, after, ranges = runner.step([(1, []), (0, []), (2, [])], rng)
    assert torch.equal(after[ranges[1][0]], before[ranges[1][0]])  # untouched
    assert finite_set(after[ranges[0][0]]) == expected_set(s0, [], {EOS})
    assert finite_set(after[ranges[2][0]]) == expected_set(s2, [], {EOS2})

    # tokens are committed; then a speculative step, rows in another order, one row per draft position
    runner.commit(0, tok("1"))
    runner.commit(2, [256])  # "ab"
    drafts0 = tok("2-x")  # "x" is not allowed: the rows after it repeat the row before it
    drafts2 = [-1, -1]  # placeholder drafts
    before, after, ranges = runner.step([(2, drafts2), (1, [3, 4]), (0, drafts0)], rng)
    for row in ranges[1]:
        assert torch.equal(after[row], before[row])
    rows0 = list(ranges[0])
    assert finite_set(after[rows0[0]]) == expected_set(s0, tok("1"), {EOS})
    assert finite_set(after[rows0[1]]) == expected_set(s0, tok("12"), {EOS})
    assert finite_set(after[rows0[2]]) == expected_set(s0, tok("12-"), {EOS})
    assert ord("x") not in finite_set(after[rows0[2]])
    assert finite_set(after[rows0[3]]) == finite_set(after[rows0[2]])
    for row in ranges[2]:
        assert finite_set(after[row]) == expected_set(s2, [256], {EOS2})
    allowed = ~torch.isinf(after)
    assert torch.equal(after[allowed], before[allowed])  # allowed logits are unchanged

    # the request completes and ends
    runner.commit(0, tok("2-") + [MULTI.index(b"no") + 256])
    _, after, ranges = runner.step([(0, [EOS, 5])], rng)
    rows0 = list(ranges[0])
    assert finite_set(after[rows0[0]]) == {EOS}
    assert finite_set(after[rows0[1]]) == set(range(PADDED))  # past the end: not constrained
    # a committed token the structure does not allow ends the request (only its stop tokens remain)
    runner.commit(2, tok("z"))
    _, after, ranges = runner.step([(2, [])], rng)
    assert finite_set(after[ranges[2][0]]) == {EOS2}
    # a slot reused by a request without a structure is not touched any more
    assert not runner.add(0, [1], params(None))
    before, after, ranges = runner.step([(0, [1, 2])], rng)
    assert torch.equal(before, after)


def test_plugin_v2_rows_per_draft_position(plugin_vocab):
    structures = lambda p: compile_regex(p, plugin_vocab)  # noqa: E731
    check_plugin_v2(Runner(Plugin), structures)


def test_plugin_v2_reads_a_rewritten_history_again(plugin_vocab):
    runner = Runner(Plugin)
    rng = np.random.default_rng(2)
    structure = compile_regex(r"\d+-", plugin_vocab)
    assert runner.add(0, [1, 2], params({"constrain_regex": r"\d+-"}))
    runner.commit(0, tok("12"))
    _, after, ranges = runner.step([(0, [])], rng)
    assert finite_set(after[ranges[0][0]]) == expected_set(structure, tok("12"), {EOS})
    runner.req_states.total_len.gpu[0] = 2  # the output was dropped (e.g. a failed KV load) and regenerated
    runner.commit(0, tok("-"))
    _, after, ranges = runner.step([(0, [])], rng)
    assert finite_set(after[ranges[0][0]]) == {EOS}  # "-" read from the start: not a digit string, so ended
    assert runner.add(0, [1, 2], params({"constrain_regex": r"\d+-"}))  # re-admitted: a fresh grammar
    runner.commit(0, tok("7"))
    _, after, ranges = runner.step([(0, [])], rng)
    assert finite_set(after[ranges[0][0]]) == expected_set(structure, tok("7"), {EOS})


def test_plugin_v2_a_broken_structure_ends_the_request(plugin_vocab, caplog, monkeypatch):
    from constrain.compilers import api

    def broken(spec, vocab, **options):
        raise StructureError("this structure cannot be compiled")

    runner = Runner(Plugin)
    monkeypatch.setattr(api, "compile", broken)
    with caplog.at_level(logging.ERROR, logger="constrain.integrations.vllm"):
        assert runner.add(0, [1], params({"constrain_json_object": True}, stops=(EOS, 300)))
    assert "cannot compile" in caplog.text
    _, after, ranges = runner.step([(0, [])], np.random.default_rng(1))
    assert finite_set(after[ranges[0][0]]) == {EOS, 300}
    assert runner.add(1, [1], params({"constrain_json_object": True}, stops=()))
    before, after, ranges = runner.step([(1, [])], np.random.default_rng(1))
    assert torch.equal(before, after)  # no stop token to end it with: left alone rather than all -inf


def test_plugin_v1_batch_updates(plugin_vocab, caplog):
    from enum import Enum

    class Move(Enum):  # vLLM's MoveDirectionality
        UNIDIRECTIONAL = 1
        SWAP = 2

    proc = Plugin(SimpleNamespace(model_config=None), torch.device("cpu"), False)
    assert not proc.v2 and proc.is_argmax_invariant() is False
    out_a, out_b, out_c = [], [], []
    update = SimpleNamespace(
        batch_size=3,
        removed=[],
        added=[
            (0, params({"constrain_regex": "a+b"}), [1, 2], out_a),
            (1, params(None), [1], out_b),
            (2, params({"constrain_regex": "[0-9]+"}), None, out_c),
        ],
        moved=[],
    )
    proc.update_state(update)
    proc.update_state(None)
    s_ab, s_num = compile_regex("a+b", plugin_vocab), compile_regex("[0-9]+", plugin_vocab)
    rng = np.random.default_rng(3)

    def step(n):
        before = torch.tensor(rng.normal(size=(n, PADDED)), dtype=torch.float32)
        return before, proc.apply(before.clone())

    before, after = step(3)
    assert finite_set(after[0]) == expected_set(s_ab, [], {EOS})
    assert torch.equal(after[1], before[1])
    assert finite_set(after[2]) == expected_set(s_num, [], {EOS})
    out_a.extend(tok("aa"))
    out_c.extend(tok("4"))
    # the unconstrained request at 1 leaves; 0 and 2 swap; then 2 moves to 1
    moved = [(0, 2, Move.SWAP), (2, 1, Move.UNIDIRECTIONAL)]
    proc.update_state(SimpleNamespace(batch_size=2, removed=[1], added=[], moved=moved))
    before, after = step(2)
    assert finite_set(after[0]) == expected_set(s_num, tok("4"), {EOS})
    assert finite_set(after[1]) == expected_set(s_ab, tok("aa"), {EOS})
    # async-scheduling placeholders that vLLM never fills in: the request is ended, with one error
    out_c.extend([-1])
    with caplog.at_level(logging.ERROR, logger="constrain.integrations.vllm"):
        before, after = step(2)
    assert "did not give the plug-in its output tokens" in caplog.text
    assert finite_set(after[0]) == {EOS}
    # a list that shrank (tokens discarded) is read again from the start
    del out_a[1:]
    before, after = step(2)
    assert finite_set(after[1]) == expected_set(s_ab, tok("a"), {EOS})


# ------------------------------------------------------------------------------------------------------------
# against vLLM itself, where its Python modules import
# ------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def vllm_modules():
    """vLLM's own modules (installed by the test set-up without CUDA, see docs/vllm.md)."""
    from vllm.v1.sample.logits_processor import interface as v1_interface
    from vllm.v1.structured_output import backend_types
    from vllm.v1.worker.gpu.sample.logits_processor import interface as v2_interface

    return SimpleNamespace(backend_types=backend_types, v1=v1_interface, v2=v2_interface)


def public_signature(fn):
    params_ = list(inspect.signature(fn).parameters.values())[1:]  # without self
    return [(p.name, p.kind, p.default is inspect.Parameter.empty) for p in params_]


def test_protocol_matches_vllm_abstract_classes(vllm_modules, vocab):
    bt = vllm_modules.backend_types
    pairs = [(ConstrainBackend, bt.StructuredOutputBackend), (ConstrainGrammar, bt.StructuredOutputGrammar)]
    for ours, theirs in pairs:
        for name in theirs.__abstractmethods__:
            assert public_signature(getattr(ours, name)) == public_signature(getattr(theirs, name)), name
    backend_cls, grammar_cls = cv.vllm_structured_output_classes()
    assert issubclass(backend_cls, bt.StructuredOutputBackend) and issubclass(grammar_cls, bt.StructuredOutputGrammar)
    assert not backend_cls.__abstractmethods__ and not grammar_cls.__abstractmethods__
    b = backend_cls(SimpleNamespace(speculative_config=SimpleNamespace(num_speculative_tokens=2)), vocab, PADDED)
    assert b.num_speculative_tokens == 2 and b.vocab_size == PADDED and b.tokenizer is vocab
    g = b.compile_grammar(bt.StructuredOutputOptions.REGEX, "ab", stop_token_ids={EOS2})
    assert isinstance(g, bt.StructuredOutputGrammar)
    assert g.accept_tokens("r", tok("ab") + [EOS2]) and g.is_terminated()
    g = b.compile_grammar(bt.StructuredOutputOptions.CHOICE, json.dumps(["x", "y"]))
    assert g.validate_tokens(tok("y") + [EOS]) == tok("y") + [EOS]
    assert isinstance(hash(b), int) and b == b and b != backend_cls(None, vocab)
    b.destroy()


def vllm_manager(backend, num_spec, threshold, executor=None):
    """A stand-in for vLLM's StructuredOutputManager state, with the manager's own methods bound to it."""
    from vllm.v1.structured_output import StructuredOutputManager

    m = SimpleNamespace(
        vllm_config=SimpleNamespace(
            num_speculative_tokens=num_spec,
            model_config=SimpleNamespace(is_diffusion=False),
            scheduler_config=SimpleNamespace(max_num_seqs=8),
        ),
        backend=backend,
        _grammar_bitmask=None,
        _full_mask=torch.tensor(-1, dtype=torch.int32),
        fill_bitmask_parallel_threshold=threshold,
        fill_bitmask_parallel_batch_size=2,
        executor_for_fillmask=executor,
        enable_in_reasoning=True,
        reasoner_cls=None,
    )
    for name in ("_fill_bitmasks", "_async_submit_fill_bitmask", "_get_constraint_bounds", "accept_tokens"):
        setattr(m, name, types.MethodType(getattr(StructuredOutputManager, name), m))
    return m


def test_vllm_structured_output_manager_drives_the_backend(vllm_modules, vocab):
    """vLLM's own StructuredOutputManager.grammar_bitmask (serial path with speculation, and the threaded path)
    and accept_tokens, run on a stand-in for the manager's state."""
    from vllm.v1.structured_output import StructuredOutputManager

    backend_cls, _ = cv.vllm_structured_output_classes()
    backend = backend_cls(None, vocab, PADDED)
    manager = functools.partial(vllm_manager, backend)

    patterns = [r"\d+-x", "ab(c)?", "(yes|no)!"]
    requests = {}
    for i, p in enumerate(patterns):
        g = backend.compile_grammar("regex", p, stop_token_ids={EOS})
        requests[f"r{i}"] = SimpleNamespace(
            request_id=f"r{i}",
            use_structured_output=True,
            structured_output_request=SimpleNamespace(grammar=g, reasoning_ended=None),
        )
    ids = list(requests)
    m = manager(num_spec=2, threshold=128)
    assert StructuredOutputManager.accept_tokens(m, requests["r0"], tok("1"))
    spec = {"r0": tok("2-"), "r1": [256, -1], "r2": [ord("q")]}  # r2's draft is rejected
    bm = StructuredOutputManager.grammar_bitmask(m, requests, ids, spec)
    assert bm.shape == (9, (PADDED + 31) // 32)
    s = {rid: requests[rid].structured_output_request.grammar.structure for rid in ids}
    assert row_set(bm, 0) == expected_set(s["r0"], tok("1"), {EOS})
    assert row_set(bm, 1) == expected_set(s["r0"], tok("12"), {EOS})
    assert row_set(bm, 2) == expected_set(s["r0"], tok("12-"), {EOS})
    assert row_set(bm, 3) == expected_set(s["r1"], [], {EOS})
    assert row_set(bm, 4) == expected_set(s["r1"], [256], {EOS})  # the sentinel's own row is still filled
    assert row_set(bm, 5) == set(range(PADDED))  # after the sentinel: not constrained
    assert row_set(bm, 6) == expected_set(s["r2"], [], {EOS})
    assert ord("q") not in row_set(bm, 6)
    assert requests["r0"].structured_output_request.grammar.num_processed_tokens == 1  # rolled back
    # the threaded path (no speculation, more requests than the threshold)
    with ThreadPoolExecutor(max_workers=4) as pool:
        m2 = manager(num_spec=0, threshold=1, executor=pool)
        threaded = StructuredOutputManager.grammar_bitmask(m2, requests, ids, {}).copy()
    for i, rid in enumerate(ids):
        g = requests[rid].structured_output_request.grammar
        assert row_set(threaded, i) == expected_set(s[rid], tok("1") if rid == "r0" else [], {EOS})
        assert g.num_processed_tokens == (1 if rid == "r0" else 0)


def test_plugin_is_a_vllm_logits_processor(vllm_modules, plugin_vocab):
    cls = cv.StructureLogitsProcessor
    assert cls is cv.StructureLogitsProcessor  # built once
    assert issubclass(cls, vllm_modules.v2.LogitsProcessor) and issubclass(cls, vllm_modules.v1.LogitsProcessor)
    assert not cls.__abstractmethods__
    assert pickle.loads(pickle.dumps(cls)) is cls  # vLLM may ship the class between processes
    for name in ("apply", "add_request", "apply_staged_writes", "validate_params"):
        assert hasattr(cls, name)
    from vllm.sampling_params import SamplingParams

    cls.validate_params(SamplingParams(extra_args={"constrain_regex": r"\d+"}))
    with pytest.raises(ValueError):
        cls.validate_params(SamplingParams(extra_args={"constrain_regex": "(?<=a)b"}))
    sp = SamplingParams(extra_args={"constrain": {"choice": ["x", "y"]}}, stop_token_ids=[EOS2])
    assert EOS2 in sp.all_stop_token_ids

    class RealPlugin(cls):
        make_backend = Plugin.make_backend

    # vLLM's own request-state and context dataclasses
    runner = Runner(RealPlugin, ctx_cls=vllm_modules.v2.LogitsContext, state_cls=vllm_modules.v2.LogitsProcRequestState)
    check_plugin_v2(runner, lambda p: compile_regex(p, plugin_vocab))
    assert runner.add(3, [1], sp)
    _, after, ranges = runner.step([(3, [])], np.random.default_rng(0))
    assert finite_set(after[ranges[3][0]]) == {ord("x"), ord("y")}


def test_backend_reads_vllms_cached_tokenizer(vllm_modules, gemma_tokenizer, gemma_vocab):
    from vllm.tokenizers.hf import get_cached_tokenizer

    cached = get_cached_tokenizer(gemma_tokenizer)  # what vLLM's engine hands a backend
    b = ConstrainBackend(None, cached, vocab_size=262_144)
    assert b.vocab.fingerprint == gemma_vocab.fingerprint and b.vocab_size == 262_144


def test_plugin_is_registered_for_vllm(vllm_modules):
    pyproject = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())
    target = pyproject["project"]["entry-points"]["vllm.logits_processors"]["constrain"]
    assert target == "constrain.integrations.vllm:StructureLogitsProcessor"
    from vllm.v1.worker.gpu.sample.logits_processor.loader import _load_v2_logitsprocs_by_fqcns

    assert _load_v2_logitsprocs_by_fqcns([target]) == [cv.StructureLogitsProcessor]
    from importlib.metadata import entry_points

    installed = [ep for ep in entry_points(group="vllm.logits_processors") if ep.name == "constrain"]
    assert installed, "the installed metadata predates the entry point: reinstall constrain (pip install -e .)"
    from vllm.v1.worker.gpu.sample.logits_processor.loader import _load_v2_logitsprocs_plugins

    assert cv.StructureLogitsProcessor in _load_v2_logitsprocs_plugins()


# ------------------------------------------------------------------------------------------------------------
# JSON and JSON_OBJECT requests, through the real JSON Schema compiler
# ------------------------------------------------------------------------------------------------------------

JSON_SCHEMAS = [
    {
        "type": "object",
        "properties": {"id": {"type": "integer", "minimum": 0, "maximum": 999}, "ok": {"type": "boolean"}},
        "required": ["id", "ok"],
        "additionalProperties": False,
    },
    {"type": "array", "items": {"enum": ["yes", "no", "ab"]}, "minItems": 1, "maxItems": 3},
    {
        "anyOf": [
            {"type": "string", "maxLength": 3},
            {"type": "integer", "minimum": -1, "maximum": 12},
            {"type": "null"},
        ]
    },
    {  # a tool call
        "type": "object",
        "properties": {
            "name": {"const": "f"},
            "arguments": {
                "type": "object",
                "properties": {"x": {"type": "integer", "minimum": 0, "maximum": 9}},
                "required": ["x"],
                "additionalProperties": False,
            },
        },
        "required": ["name", "arguments"],
        "additionalProperties": False,
    },
]
OPEN = MULTI.index(b'{"') + 256  # the '{"' token


@pytest.fixture
def json_backend(vocab) -> ConstrainBackend:
    """A backend of its own: the module's ``backend`` caches structures that other tests compiled with fake
    compilers."""
    return ConstrainBackend(None, vocab, vocab_size=PADDED)


def check_json(schema, vocab, tokens) -> None:
    from jsonschema import Draft202012Validator

    Draft202012Validator(schema).validate(json.loads(vocab.decode(tokens).decode()))


def test_json_requests_go_through_the_json_schema_compiler(json_backend):
    backend = json_backend
    from constrain.errors import JsonSchemaError
    from constrain.runtime.pushdown import GrammarStructure

    schema = JSON_SCHEMAS[0]
    for spec in (json.dumps(schema), schema):  # JSON text, as vLLM's key carries it, or already parsed
        g = backend.compile_grammar("json", spec)
        assert isinstance(g.structure, GrammarStructure)
        assert g.validate_tokens([OPEN] + tok('id":1000')) == [OPEN] + tok('id":100')  # maximum 999
        assert g.accept_tokens("r", [OPEN] + tok('id":7,"ok":true}') + [EOS]) and g.is_terminated()
    with pytest.raises(JsonSchemaError, match="minimum"):
        backend.compile_grammar("json", '{"type": "integer", "minimum": 5, "maximum": 3}')
    # JSON_OBJECT: the schema {"type": "object"}; compact JSON, so the output starts with "{"
    g = backend.compile_grammar(RequestType.JSON_OBJECT, "")
    assert isinstance(g.structure, GrammarStructure)
    assert row_set_from(g) == {ord("{"), OPEN}
    assert g.validate_tokens(tok("[1]")) == [] and g.validate_tokens(tok("1")) == []
    text = '{"a":[1,{"b":null}],"c":"x"}'
    assert g.validate_tokens(tok(text) + [EOS]) == tok(text) + [EOS]
    assert g.accept_tokens("r", tok("{}")) and row_set_from(g) == {EOS, EOS2}


@pytest.mark.parametrize("num_spec", [0, 1, 4])
def test_json_generation_with_speculation_stays_inside(json_backend, vocab, num_spec):
    backend = json_backend
    specs = [json.dumps(s) for s in JSON_SCHEMAS]
    outputs, grammars = run_requests(backend, specs, num_spec, seed=10 + num_spec, request_type="json")
    for schema, out, g in zip(JSON_SCHEMAS, outputs, grammars):
        assert g.is_terminated() and out[-1] in (EOS, EOS2), (schema, vocab.decode(out))
        check_json(schema, vocab, out[:-1])


@pytest.mark.parametrize("index", range(len(JSON_SCHEMAS)))
def test_json_greedy_output_is_the_same_with_speculation(json_backend, vocab, index):
    backend = json_backend
    spec = json.dumps(JSON_SCHEMAS[index])
    for seed in range(2):
        plain = greedy(backend, spec, 0, seed, request_type="json")
        assert plain[-1] in (EOS, EOS2)
        check_json(JSON_SCHEMAS[index], vocab, plain[:-1])
        for num_spec in (1, 3):
            assert greedy(backend, spec, num_spec, seed, request_type="json") == plain, (index, seed, num_spec)


def test_json_speculative_rows_like_the_engine(json_backend):
    backend = json_backend
    num_spec = 3
    grammars = [
        backend.compile_grammar("json", json.dumps(JSON_SCHEMAS[0])),
        backend.compile_grammar("json_object", ""),
        backend.compile_grammar("json", json.dumps(JSON_SCHEMAS[3])),
    ]
    histories = [[OPEN] + tok('id":4'), tok("{"), [OPEN] + tok('name":"f","arguments":{"x":')]
    drafts = [tok("2,") + [-1], tok('"k') + [-1], tok("7}}")]
    for g, h, d in zip(grammars, histories, drafts):
        assert g.accept_tokens("r", h)
        stripped = d[: d.index(-1)] if -1 in d else d
        assert g.validate_tokens(stripped) == stripped
    bitmask = engine_fill(backend, grammars, drafts, num_spec)
    for i, (g, h, d) in enumerate(zip(grammars, histories, drafts)):
        assert g.num_processed_tokens == len(h)  # rolled back
        for j in range(num_spec + 1):
            row = i * (1 + num_spec) + j
            if -1 in d[:j]:
                assert (bitmask[row] == -1).all()
                continue
            assert row_set(bitmask, row) == expected_set(g.structure, h + d[:j], {EOS, EOS2}), (i, j)
    assert row_set(bitmask, 2 * (1 + num_spec) + 3) == {EOS, EOS2}  # the tool call is complete after "7}}"
    # a draft the schema rejects ("x" is 0-9): the plug-in's helper repeats the last valid row after it
    rows = np.zeros((1 + num_spec, bitmask.shape[1]), dtype=np.int32)
    assert fill_draft_bitmasks(grammars[2], rows, 0, tok("12}")) == 1
    assert ord("2") not in row_set(rows, 1) and (rows[2] == rows[1]).all() and (rows[3] == rows[1]).all()
    assert grammars[2].num_processed_tokens == len(histories[2])


def test_vllm_manager_with_json_requests(vllm_modules, vocab):
    from vllm.v1.structured_output import StructuredOutputManager

    backend_cls, _ = cv.vllm_structured_output_classes()
    backend = backend_cls(None, vocab, PADDED)
    specs = [("json", json.dumps(JSON_SCHEMAS[0])), ("json_object", ""), ("json", json.dumps(JSON_SCHEMAS[1]))]
    requests = {}
    for i, (kind, spec) in enumerate(specs):
        g = backend.compile_grammar(kind, spec, stop_token_ids={EOS})
        requests[f"r{i}"] = SimpleNamespace(
            request_id=f"r{i}",
            use_structured_output=True,
            structured_output_request=SimpleNamespace(grammar=g, reasoning_ended=None),
        )
    ids = list(requests)
    m = vllm_manager(backend, num_spec=2, threshold=128)
    assert StructuredOutputManager.accept_tokens(m, requests["r0"], [OPEN])
    assert not StructuredOutputManager.accept_tokens(m, requests["r2"], tok("{"))  # an array schema
    spec = {"r0": tok("id"), "r1": tok("{") + [-1], "r2": tok("[x")}  # r2's "x" is rejected
    bm = StructuredOutputManager.grammar_bitmask(m, requests, ids, spec)
    s = {rid: requests[rid].structured_output_request.grammar.structure for rid in ids}
    assert row_set(bm, 0) == expected_set(s["r0"], [OPEN], {EOS})
    assert row_set(bm, 2) == expected_set(s["r0"], [OPEN] + tok("id"), {EOS}) == {ord('"')}
    assert row_set(bm, 3) == expected_set(s["r1"], [], {EOS})
    assert row_set(bm, 4) == expected_set(s["r1"], tok("{"), {EOS})
    assert row_set(bm, 5) == set(range(PADDED))  # after the sentinel: not constrained
    assert row_set(bm, 7) == expected_set(s["r2"], tok("["), {EOS}) and ord("x") not in row_set(bm, 7)
    assert [requests[r].structured_output_request.grammar.num_processed_tokens for r in ids] == [1, 0, 0]
    with ThreadPoolExecutor(max_workers=4) as pool:
        threaded = StructuredOutputManager.grammar_bitmask(
            vllm_manager(backend, num_spec=0, threshold=1, executor=pool), requests, ids, {}
        ).copy()
    for i, rid in enumerate(ids):
        assert row_set(threaded, i) == expected_set(s[rid], [OPEN] if rid == "r0" else [], {EOS})


def test_plugin_v2_json_requests(plugin_vocab):
    runner = Runner(Plugin)
    rng = np.random.default_rng(5)
    schema = JSON_SCHEMAS[3]
    assert runner.add(0, [1, 2], params({"constrain_json": schema}))
    assert runner.add(1, [3], params({"constrain": {"json_object": True}}, stops=(EOS2,)))
    assert runner.add(2, [4], params({"constrain_json": json.dumps(JSON_SCHEMAS[1])}))
    s0 = cv.compile_structure("json", schema, plugin_vocab)
    s1 = cv.compile_structure("json_object", "", plugin_vocab)
    s2 = cv.compile_structure("json", JSON_SCHEMAS[1], plugin_vocab)
    runner.commit(0, [OPEN] + tok('name":"f"'))
    runner.commit(1, tok('{"a":'))
    drafts0 = tok(',"a')
    before, after, ranges = runner.step([(1, [ord("1"), -1]), (0, drafts0), (2, [])], rng)
    rows0 = list(ranges[0])
    history0 = [OPEN] + tok('name":"f"')
    for j, row in enumerate(rows0):
        assert finite_set(after[row]) == expected_set(s0, history0 + drafts0[:j], {EOS}), j
    rows1 = list(ranges[1])
    assert finite_set(after[rows1[0]]) == expected_set(s1, tok('{"a":'), {EOS2})
    assert finite_set(after[rows1[1]]) == expected_set(s1, tok('{"a":1'), {EOS2})
    assert finite_set(after[rows1[2]]) == finite_set(after[rows1[1]])  # after the placeholder: repeated
    assert finite_set(after[ranges[2][0]]) == expected_set(s2, [], {EOS}) == {ord("[")}
    allowed = ~torch.isinf(after)
    assert torch.equal(after[allowed], before[allowed])
    runner.commit(0, tok(',"arguments":{"x":3}}'))
    _, after, ranges = runner.step([(0, [EOS])], rng)
    assert finite_set(after[ranges[0][0]]) == {EOS}


def test_validate_params_checks_json_schemas_at_admission():
    validate = vllm_plugin._StructureLogitsProcessorImpl.validate_params
    validate(params({"constrain_json": JSON_SCHEMAS[3]}))
    validate(params({"constrain_json": json.dumps(JSON_SCHEMAS[0])}))
    validate(params({"constrain_json_object": True}))
    for bad, message in [
        ({"type": "integer", "minimum": 5, "maximum": 3}, "unsatisfiable"),
        ({"type": "strng"}, "type"),
        ({"$ref": "#/$defs/missing"}, "missing"),
    ]:
        with pytest.raises(ValueError, match=message):  # a JsonSchemaError: vLLM answers HTTP 400
            validate(params({"constrain_json": bad}))


def test_gemma_json_requests(gemma_backend, gemma_tokenizer, gemma_vocab):
    text = '{"name":"Ada Lovelace","tags":["math","poetry"],"born":1815,"meta":{"k":null,"ok":true}}'
    tokens = gemma_tokenizer.encode(text, add_special_tokens=False)
    g = gemma_backend.compile_grammar("json_object", "", stop_token_ids={1, 106})
    start = row_set_from_width(g, gemma_backend.vocab_size)
    assert start and max(start) < gemma_vocab.size and not start & {0, 1, 2, 105, 106}
    assert all(gemma_vocab.token_bytes(t).lstrip().startswith(b"{") for t in start)
    assert g.validate_tokens(tokens + [106, 5]) == tokens + [106]
    assert g.accept_tokens("r", tokens) and row_set_from_width(g, gemma_backend.vocab_size) == {1, 106}
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string"}, "tags": {"type": "array", "items": {"type": "string"}}},
        "required": ["name"],
    }
    g = gemma_backend.compile_grammar("json", json.dumps(schema), stop_token_ids={1})
    assert g.validate_tokens(tokens) == tokens  # additional properties are allowed by default
    bad = gemma_tokenizer.encode('{"tags":[]}', add_special_tokens=False)
    assert g.validate_tokens(bad) != bad  # "name" is required first
    # batched fills from threads, JSON grammars at different points, equal sequential fills
    grammars = []
    for i in range(24):
        g = gemma_backend.compile_grammar("json" if i % 2 else "json_object", json.dumps(schema) if i % 2 else "")
        assert g.accept_tokens("r", tokens[: i % 9])
        grammars.append(g)
    sequential = gemma_backend.allocate_token_bitmask(len(grammars))
    for i, g in enumerate(grammars):
        g.fill_bitmask(sequential, i)
    threaded = gemma_backend.allocate_token_bitmask(len(grammars))
    with ThreadPoolExecutor(max_workers=6) as pool:
        list(pool.map(lambda i: grammars[i].fill_bitmask(threaded, i), range(len(grammars))))
    assert torch.equal(threaded, sequential)


def row_set_from_width(g, width: int) -> set[int]:
    bm = np.zeros((1, (width + 31) // 32), dtype=np.int32)
    g.fill_bitmask(bm, 0)
    return row_set(bm, 0, width)
