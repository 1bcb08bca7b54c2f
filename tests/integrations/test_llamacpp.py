"""The llama-cpp-python integration: the processor on synthetic data, and end to end with the real Gemma 3 270M GGUF.

The synthetic tests need only numpy. The end-to-end tests need llama-cpp-python (the ``llamacpp`` extra, which
``scripts/setup.sh`` installs) and are skipped, with that reason, only when ``llama_cpp`` cannot be imported.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from constrain.compilers.regex import compile_regex
from constrain.errors import ConstrainError, DeadEndError, ShapeError, TokenError, VocabularyError
from constrain.integrations.llamacpp import (
    LlamaCppLogitsProcessor,
    check_vocabulary,
    create_completion,
    logits_processor_list,
    processor_for_llama,
    vocabulary_from_llama,
)
from constrain.vocab.vocabulary import Vocabulary

# ------------------------------------------------------------------------------------------ synthetic processor

# ids: 0 <eos>, 1 <eot> (both end the sequence), 2.. one byte each, then two longer tokens
_BYTES = b"0123456789-abx"
_TOKENS: list[bytes | None] = [None, None, *(bytes([c]) for c in _BYTES), b"12", b"-0", b"ab"]
_ID = {t: i for i, t in enumerate(_TOKENS) if t is not None}


@pytest.fixture(scope="module")
def small_vocab() -> Vocabulary:
    return Vocabulary.from_token_bytes(_TOKENS, eos_ids=[0, 1])


def llama_scores(n: int, fill: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """The candidate array llama-cpp-python builds (id, logit, p; 12 bytes a row) and its strided logit column."""
    rec = np.zeros(n, dtype=np.dtype([("id", np.intc), ("logit", np.single), ("p", np.single)], align=True))
    rec["id"] = np.arange(n)
    rec["logit"] = fill
    return rec, rec["logit"]


def allowed(scores: np.ndarray) -> list[int]:
    return np.flatnonzero(np.isfinite(scores)).tolist()


def ids(*parts: bytes | int) -> np.ndarray:
    return np.asarray([p if isinstance(p, int) else _ID[p] for p in parts], np.int32)


PROMPT = (b"x", b"a", b"b")


def test_masks_the_strided_view_in_place(small_vocab):
    proc = LlamaCppLogitsProcessor(compile_regex(r"\d{2}-\d", small_vocab))
    rec, scores = llama_scores(small_vocab.size, 1.5)
    assert not scores.flags.c_contiguous and scores.strides == (12,)
    out = proc(ids(*PROMPT), scores)
    assert out is scores
    assert allowed(rec["logit"]) == sorted(_ID[bytes([c])] for c in b"0123456789") + [_ID[b"12"]]
    assert np.all(rec["logit"][allowed(scores)] == 1.5)  # allowed logits untouched
    assert rec["id"].tolist() == list(range(small_vocab.size))  # the other fields untouched
    assert proc.prompt_length == 3 and proc.generated_tokens == []


def test_follows_input_ids_and_allows_only_eos_at_the_end(small_vocab):
    proc = LlamaCppLogitsProcessor(compile_regex(r"\d{2}-\d", small_vocab))
    _, scores = llama_scores(small_vocab.size)
    proc(ids(*PROMPT), scores)
    _, scores = llama_scores(small_vocab.size)
    proc(ids(*PROMPT, b"12"), scores)
    assert allowed(scores) == [_ID[b"-"], _ID[b"-0"]]
    _, scores = llama_scores(small_vocab.size)
    proc(ids(*PROMPT, b"12", b"-0"), scores)
    assert allowed(scores) == [0, 1]  # complete, nothing may follow: only the end-of-sequence ids
    assert proc.is_complete() and proc.output_bytes() == b"12-0"
    assert proc.generated_tokens == [_ID[b"12"], _ID[b"-0"]]


def test_rolls_back_and_restarts_on_a_new_prompt(small_vocab):
    proc = LlamaCppLogitsProcessor(compile_regex(r"\d{2}-\d", small_vocab))
    _, scores = llama_scores(small_vocab.size)
    proc(ids(*PROMPT, b"1", b"2"), scores)  # first call: all of it is the prompt
    assert proc.prompt_length == 5 and proc.output_bytes() == b""
    proc(ids(*PROMPT, b"1", b"2", b"3", b"4"), llama_scores(small_vocab.size)[1])  # two new tokens at once
    assert proc.output_bytes() == b"34"
    proc(ids(*PROMPT, b"1", b"2", b"3"), llama_scores(small_vocab.size)[1])  # rolled back one
    assert proc.output_bytes() == b"3"
    # the same prompt again: a new generation at the start of the structure
    _, scores = llama_scores(small_vocab.size)
    proc(ids(*PROMPT, b"1", b"2"), scores)
    assert proc.output_bytes() == b"" and proc.prompt_length == 5
    assert _ID[b"12"] in allowed(scores)
    # another prompt: a new generation
    proc(ids(*PROMPT, b"1", b"2", b"1"), llama_scores(small_vocab.size)[1])
    _, scores = llama_scores(small_vocab.size)
    proc(ids(b"a", b"b"), scores)
    assert proc.prompt_length == 2 and proc.output_bytes() == b""
    # a longer prompt that starts with the old history but is not readable by the structure: a new generation
    proc(ids(b"a", b"b", b"1"), llama_scores(small_vocab.size)[1])
    proc(ids(b"a", b"b", b"1", b"x", b"a", b"b"), llama_scores(small_vocab.size)[1])
    assert proc.prompt_length == 6 and proc.output_bytes() == b""
    # an explicit reset
    proc.reset()
    proc(ids(b"a", b"b", b"1"), llama_scores(small_vocab.size)[1])
    assert proc.prompt_length == 3


def test_a_token_the_structure_refuses_is_an_error(small_vocab):
    proc = LlamaCppLogitsProcessor(compile_regex(r"\d{2}-\d", small_vocab))
    proc(ids(*PROMPT), llama_scores(small_vocab.size)[1])
    _, scores = llama_scores(small_vocab.size)
    with pytest.raises(TokenError, match="sampled although the structure does not allow it"):
        proc(ids(*PROMPT, b"a"), scores)
    # where the exception cannot propagate (llama-cpp-python's ctypes callback), generation still stops
    assert allowed(scores) == [0] and isinstance(proc.error, TokenError)
    proc.reset()
    assert proc.error is None


def test_dead_end_raises_or_stops(small_vocab):
    structure = compile_regex(r"1z", small_vocab)  # no token spells "z"
    proc = LlamaCppLogitsProcessor(structure)
    proc(ids(*PROMPT), llama_scores(small_vocab.size)[1])
    _, scores = llama_scores(small_vocab.size)
    with pytest.raises(DeadEndError, match="no token") as info:
        proc(ids(*PROMPT, b"1"), scores)
    assert info.value.text == "1" and proc.error is info.value and allowed(scores) == [0]
    proc = LlamaCppLogitsProcessor(structure, on_dead_end="stop")
    proc(ids(*PROMPT), llama_scores(small_vocab.size)[1])
    _, scores = llama_scores(small_vocab.size)
    proc(ids(*PROMPT, b"1"), scores)
    assert allowed(scores) == [0] and proc.dead_end
    proc.reset()
    assert not proc.dead_end
    with pytest.raises(ValueError, match="on_dead_end"):
        LlamaCppLogitsProcessor(structure, on_dead_end="ignore")


def test_padded_and_narrow_logits(small_vocab):
    proc = LlamaCppLogitsProcessor(compile_regex(r"a", small_vocab))
    _, scores = llama_scores(small_vocab.size + 40)  # wider than the vocabulary: the extra ids are always masked
    proc(ids(*PROMPT), scores)
    assert allowed(scores) == [_ID[b"a"]]
    with pytest.raises(ShapeError, match="do not match"):
        proc(ids(*PROMPT), np.zeros(small_vocab.size - 1, np.float32))
    with pytest.raises(ShapeError, match="1-D"):
        proc(ids(*PROMPT), np.zeros((1, small_vocab.size), np.float32))


# ----------------------------------------------------------------------------------- the real model, end to end


@pytest.fixture(scope="module")
def llm():
    import llama_cpp as lc

    from constrain.models.gemma import gguf_model_path

    return lc.Llama(model_path=str(gguf_model_path()), n_ctx=1024, seed=0, verbose=False)


@pytest.fixture(scope="module")
def llama_vocab(llm) -> Vocabulary:
    return vocabulary_from_llama(llm)


@pytest.fixture(scope="module")
def tokenizer_vocab(llm, gemma_tokenizer) -> Vocabulary:
    return vocabulary_from_llama(llm, gemma_tokenizer)


pytest_slow = pytest.mark.slow


@pytest_slow
def test_llama_vocabulary_equals_the_gemma_tokenizer_vocabulary(llm, llama_vocab, tokenizer_vocab):
    assert llama_vocab.size == tokenizer_vocab.size == llm.n_vocab() == 262_144
    # llama.cpp ends generation on <eos>, <end_of_turn> and also "</s>" (212), which it re-types as a control token
    assert llama_vocab.eos_ids.tolist() == tokenizer_vocab.eos_ids.tolist() == [1, 106, 212]
    assert np.array_equal(llama_vocab.matchable, tokenizer_vocab.matchable)
    assert np.array_equal(llama_vocab.offsets, tokenizer_vocab.offsets)
    assert np.array_equal(llama_vocab.data, tokenizer_vocab.data)
    assert llama_vocab.token_bytes(107) == b"\n" and llama_vocab.token_bytes(238 + 0x41) == b"A"
    assert vocabulary_from_llama(llm) is llama_vocab  # kept per model


SAMPLE_TEXTS = [
    '{"name": "Ada Lovelace", "age": 36, "tags": ["math", "poetry"]}',
    "2024-02-29T23:59:07Z and 1999-12-31",
    "def f(x):\n\treturn x ** 2  # squares\n\n\nprint(f(3))",
    "Café naïve résumé — 東京 🙂 <b>bold</b> <table>",
    "   leading spaces, trailing tabs\t\t",
]


@pytest_slow
@pytest.mark.parametrize("text", SAMPLE_TEXTS)
def test_gemma_tokenizer_and_llama_cpp_agree_on_ids_and_bytes(llm, gemma_tokenizer, tokenizer_vocab, text):
    ours = gemma_tokenizer.encode(text, add_special_tokens=False)
    theirs = llm.tokenize(text.encode(), add_bos=False, special=False)
    assert ours == theirs
    assert tokenizer_vocab.decode(ours) == text.encode()
    short = [t for t in ours if len(tokenizer_vocab.token_bytes(t)) <= 32]  # llama-cpp-python's buffer limit
    assert llm.detokenize(short) == tokenizer_vocab.decode(short)


@pytest_slow
def test_end_of_sequence_tokens_follow_llama_cpp(llm, gemma_tokenizer, llama_vocab):
    # "</s>" is text for the Hugging Face tokenizer, an end-of-generation control token for llama.cpp: llama.cpp's
    # tokenizer never produces it from text, so the structure treats it as end of sequence, never as text
    assert gemma_tokenizer.encode("</s>", add_special_tokens=False) == [212]
    assert Vocabulary.from_tokenizer(gemma_tokenizer).matchable[212]
    assert 212 not in llm.tokenize(b"</s>", add_bos=False, special=False)
    assert not llama_vocab.matchable[212] and llama_vocab.decode(llm.tokenize(b"</s>", add_bos=False)) == b"</s>"
    structure = compile_regex(r"(ab|</s>)", llama_vocab)
    m = structure.matcher()
    assert not m.accepts(212) and m.accepts(llm.tokenize(b"</", add_bos=False)[0])


@pytest_slow
def test_check_vocabulary_catches_a_mismatch(llm, tokenizer_vocab, gemma_tokenizer):
    assert check_vocabulary(llm, tokenizer_vocab, sample=20_000) > 20_000
    tokens = [tokenizer_vocab.token_bytes(i) or None for i in range(tokenizer_vocab.size)]
    tokens[1000], tokens[1001] = tokens[1001], tokens[1000]
    special = np.flatnonzero(~tokenizer_vocab.matchable).tolist()
    swapped = Vocabulary.from_token_bytes(tokens, eos_ids=[1, 106, 212], special_ids=special)
    with pytest.raises(VocabularyError, match="id 1000"):
        check_vocabulary(llm, swapped, ids=[999, 1000, 1001])
    only_eos = Vocabulary.from_token_bytes(tokens, eos_ids=[1, 106], special_ids=special)
    with pytest.raises(VocabularyError, match="end-of-generation"):
        check_vocabulary(llm, only_eos)


CASES = [
    (r"\d{4}-\d{2}-\d{2}", "Today's date: "),
    (r"(yes|no)", "Is the sky blue? Answer: "),
    (r'\{"name": "[a-zA-Z ]{1,20}", "age": \d{1,3}\}', "Here is a person as JSON: "),
    (r"\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])T([01]\d|2[0-3]):[0-5]\d:[0-5]\dZ", "Timestamp (ISO 8601): "),
    (r"[a-z]{3,8}@[a-z]{3,8}\.(com|org)", "Contact email: "),
    (r"(caf\u00e9|na\u00efve|r\u00e9sum\u00e9) [a-z]{2,10}", "A French word: "),
    (r"[A-Z][a-z]{1,9}\n[A-Z][a-z]{1,9}", "Two names, one per line:\n"),
]


def complete(llm, pattern, prompt, lp, **kwargs):
    out = llm(prompt, max_tokens=80, logits_processor=lp, **kwargs)
    choice = out["choices"][0]
    return choice["text"], choice["finish_reason"], out["usage"]["completion_tokens"]


@pytest_slow
@pytest.mark.parametrize("pattern,prompt", CASES, ids=[c[1].strip(": \n") for c in CASES])
def test_generation_matches_and_stops_at_the_end(llm, llama_vocab, pattern, prompt):
    structure = compile_regex(pattern, llama_vocab)
    for kwargs in ({"temperature": 0.0}, {"temperature": 1.2, "seed": 7}):
        lp = logits_processor_list(llm, structure)
        text, finish, n = complete(llm, pattern, prompt, lp, **kwargs)
        assert re.fullmatch(pattern, text), (pattern, kwargs, text)
        assert finish == "stop" and n < 80, (finish, n, text)  # stopped at the end of the structure
        proc = lp[0]
        assert proc.is_complete() and proc.output_bytes() == text.encode()


@pytest_slow
def test_one_list_reused_across_calls_and_the_tokenizer_route(llm, tokenizer_vocab, gemma_tokenizer):
    pattern = r"(red|green|blue|[a-z]{3,6})"
    lp = logits_processor_list(llm, pattern, tokenizer=gemma_tokenizer)
    assert lp[0].vocab.fingerprint == tokenizer_vocab.fingerprint
    for prompt in ("My favourite colour is ", "The sky is ", "My favourite colour is "):
        text, finish, _ = complete(llm, pattern, prompt, lp, temperature=0.0)
        assert re.fullmatch(pattern, text) and finish == "stop", (prompt, text, finish)
    # a streamed completion goes through the same processor
    chunks = llm(
        "Year of the moon landing: ",
        max_tokens=20,
        temperature=0.0,
        stream=True,
        logits_processor=logits_processor_list(llm, r"19[0-9]{2}"),
    )
    assert re.fullmatch(r"19[0-9]{2}", "".join(c["choices"][0]["text"] for c in chunks))


@pytest_slow
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # the ctypes callback's print
def test_dead_end_with_the_real_model(llm, llama_vocab):
    # Gemma's byte tokens spell every byte, so a dead end needs a vocabulary that lacks one: the real one without
    # any token containing "~". After "ok", nothing can continue r"ok~".
    tokens = [llama_vocab.token_bytes(i) or None for i in range(llama_vocab.size)]
    special = np.flatnonzero(~llama_vocab.matchable).tolist()
    special += [i for i, t in enumerate(tokens) if t is not None and b"~" in t]
    vocab = Vocabulary.from_token_bytes(tokens, eos_ids=llama_vocab.eos_ids.tolist(), special_ids=special)
    structure = compile_regex(r"ok~", vocab)
    # create_completion raises the typed error in the caller
    with pytest.raises(DeadEndError) as info:
        create_completion(llm, "Say ok: ", structure, max_tokens=10, temperature=0.0)
    assert info.value.text == "ok"
    with pytest.raises(DeadEndError):
        for _ in create_completion(llm, "Say ok: ", structure, max_tokens=10, temperature=0.0, stream=True):
            pass
    # a bare processor list: the exception cannot leave llama-cpp-python's ctypes callback, but generation stops
    # right there and the error is kept; its stopping criteria raise it
    lp = logits_processor_list(llm, structure)
    out = llm("Say ok: ", max_tokens=10, temperature=0.0, logits_processor=lp)
    assert out["choices"][0]["text"] == "ok" and isinstance(lp[0].error, DeadEndError)
    lp = logits_processor_list(llm, structure)
    with pytest.raises(DeadEndError):
        llm(
            "Say ok: ", max_tokens=10, temperature=0.0, logits_processor=lp, stopping_criteria=lp[0].stopping_criteria()
        )
    # on_dead_end="stop": end of sequence where the structure cannot go on, no error
    out = create_completion(llm, "Say ok: ", structure, on_dead_end="stop", max_tokens=10, temperature=0.0)
    assert out["choices"][0]["text"] == "ok" and out["choices"][0]["finish_reason"] == "stop"


@pytest_slow
def test_create_completion_passes_other_processors_and_options(llm, llama_vocab):
    seen = []

    def spy(input_ids, scores):
        seen.append(int(np.isfinite(scores).sum()))
        return scores

    out = create_completion(llm, "Year: ", r"(19|20)\d{2}", logits_processor=[spy], max_tokens=12, temperature=0.0)
    assert re.fullmatch(r"(19|20)\d{2}", out["choices"][0]["text"])
    assert seen and 0 < seen[0] <= 8  # constrain ran first: only ways to spell "1" or "2" (and "19", "20") are left


@pytest_slow
def test_draft_models_and_foreign_vocabularies_are_refused(llm):
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    too_big = Vocabulary.from_token_bytes([b"a"], eos_ids=[300_000])
    with pytest.raises(VocabularyError, match="not this model's vocabulary"):
        check_vocabulary(llm, too_big)
    with pytest.raises(VocabularyError, match="not this model's vocabulary"):
        processor_for_llama(llm, compile_regex("a", too_big))
    saved = llm.draft_model
    llm.draft_model = LlamaPromptLookupDecoding(num_pred_tokens=4)  # llama-cpp-python's own prompt-lookup drafts
    try:
        with pytest.raises(ConstrainError, match="draft_model"):
            processor_for_llama(llm, "a")
    finally:
        llm.draft_model = saved
