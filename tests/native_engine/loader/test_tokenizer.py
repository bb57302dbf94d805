"""The GGUF tokenizer matches llama.cpp's (several pre-tokenizers) and the HF tokenizer.json one."""

from __future__ import annotations

import unicodedata

import gguf
import pytest
from tokenizers import AddedToken, Regex, models, pre_tokenizers, trainers
from tokenizers import Tokenizer as HFTokenizer

from native_engine.loader import ModelConfig, Tokenizer, load_tokenizer
from registry.modelbuilder import SPECIAL_TOKENS
from registry.modelbuilder.gguf_out import token_types
from registry.modelbuilder.tokenizer import corpus_text, extra_token, id_to_token_list, merges

from .conftest import rewrite_gguf

llama_cpp = pytest.importorskip("llama_cpp")

TEXTS = [
    "Hello world",
    "The quick brown fox jumps over the lazy dog.",
    "  leading spaces, trailing   ",
    "tabs\tand\t\tmore\t tabs",
    "new\nlines\n\n\nand\r\nCRLF\r\n \n",
    "digits 1234567 and 3.14159, 42 x1000000y",
    "I'm sure you'll see they've done it; it's John's. I'D SAY WE'RE OK 'S",
    "def f(x):\n    return x ** 2  # comment\n\tif x: print('hi', {\"a\": [1, 2]})",
    "日本語のテキストと中文字符，标点。한국어",
    "emoji 🎉🚀 and 👨\u200d👩\u200d👧 family 👍🏽",
    "café naïve résumé Ångström ß ﬁ ｆｕｌｌｗｉｄｔｈ",
    "cafe\u0301 a\u0308 combining marks n\u0303",
    "Ελληνικά Кириллица العربية हिन्दी ไทย",
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n",
    "text<|endoftext|>more<|im_end|><|im_start|>",
    "pad <|extra_0|> and <|extra_12|>x<|extra_3|><|extra_3|>",
    "almost special <|im_sta rt|> <|extra_|> <|",
    "",
    " ",
    "\n",
    "   \n\t  \u00a0 nbsp\u3000ideographic",
    "a\u200bb zero\u2028width",
    "mixed123abc!!!???...---",
    "URL https://example.com/path?q=1&r=2#frag @user $100 ~x^y|z",
]
LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
PRE_TOKENIZERS = ["qwen2", "llama-bpe", "gpt-2", "default", "deepseek-llm", "deepseek-coder", "starcoder", "falcon"]


@pytest.fixture(scope="module")
def pair(build):
    """pre -> (our Tokenizer, llama.cpp vocab-only model) for the tiny-qwen2 vocabulary."""
    cache = {}

    def get(pre: str):
        if pre not in cache:
            path = build("tiny-qwen2", pre=pre)
            cache[pre] = (Tokenizer.from_gguf(path), llama_cpp.Llama(str(path), vocab_only=True, verbose=False))
        return cache[pre]

    return get


def _llama_cpp_ids(llm, text: str, special: bool = True) -> list[int]:
    return llm.tokenize(text.encode("utf-8"), add_bos=False, special=special)


@pytest.mark.parametrize("pre", PRE_TOKENIZERS)
def test_encode_matches_llama_cpp(pair, pre):
    ours, llm = pair(pre)
    for text in TEXTS:
        assert ours.encode(text) == _llama_cpp_ids(llm, text), (pre, text)
        assert ours.decode(ours.encode(text), skip_special_tokens=False) == text


def test_parse_special_false_matches_llama_cpp(pair):
    ours, llm = pair("qwen2")
    for text in TEXTS:
        assert ours.encode(text, parse_special=False) == _llama_cpp_ids(llm, text, special=False), text
    extras = ours.encode("<|extra_3|>", parse_special=False)
    assert len(extras) == 1 and not ours.is_special(extras[0])  # USER_DEFINED tokens always match


def test_missing_pre_uses_llama_cpp_default(build, tmp_path):
    path = rewrite_gguf(build("tiny-qwen2"), tmp_path / "nopre.gguf", drop_fields=("tokenizer.ggml.pre",))
    ours, llm = Tokenizer.from_gguf(path), llama_cpp.Llama(str(path), vocab_only=True, verbose=False)
    for text in TEXTS:
        assert ours.encode(text) == _llama_cpp_ids(llm, text), text


def test_token_bytes_match_llama_cpp_pieces(pair):
    ours, llm = pair("qwen2")
    assert ours.vocab_size == llm.n_vocab()
    for i in range(ours.vocab_size):
        assert ours.token_bytes(i) == llm.detokenize([i], special=True), i
    assert ours.token_bytes(ours.vocab_size) == b"" and ours.token_bytes(-1) == b""
    for text in TEXTS:  # incremental detokenization: bytes concatenate back to the text
        assert b"".join(ours.token_bytes(i) for i in ours.encode(text)) == text.encode("utf-8")


def test_matches_hf_tokenizer_json_on_nfc_text(build, pair):
    ours, _ = pair("qwen2")
    hf = Tokenizer.from_hf(build("tiny-qwen2", "hf"))
    nfc = [t for t in TEXTS if unicodedata.is_normalized("NFC", t)]
    assert len(nfc) >= len(TEXTS) - 2
    for text in nfc:
        assert hf.encode(text) == ours.encode(text), text
        assert hf.encode(text, parse_special=False) == ours.encode(text, parse_special=False), text
        assert hf.decode(hf.encode(text), skip_special_tokens=False) == text
    assert [hf.token_bytes(i) for i in range(hf.vocab_size)] == [ours.token_bytes(i) for i in range(ours.vocab_size)]
    assert (hf.eos_token_ids, hf.bos_token_id, hf.chat_template) == (
        ours.eos_token_ids,
        ours.bos_token_id,
        ours.chat_template,
    )
    assert [hf.is_special(i) for i in range(hf.vocab_size)] == [ours.is_special(i) for i in range(ours.vocab_size)]


def test_special_tokens_and_decode_skipping(build, pair):
    ours, _ = pair("qwen2")
    ids = ours.encode("<|im_start|>user\nHi<|im_end|><|extra_5|>")
    assert [ours.is_special(i) for i in ids].count(True) == 2
    assert ours.decode(ids) == "user\nHi<|extra_5|>"
    assert ours.decode(ids, skip_special_tokens=False) == "<|im_start|>user\nHi<|im_end|><|extra_5|>"
    assert ours.eos_token_ids == ModelConfig.from_gguf(build("tiny-qwen2")).eos_token_ids
    assert ours.encode("Hi", add_bos=True) == [ours.bos_token_id, *ours.encode("Hi")]
    assert not ours.add_bos_token
    assert load_tokenizer(build("tiny-qwen2")).encode("Hi") == ours.encode("Hi")


def test_unsupported_vocabularies_raise(build, tmp_path):
    spm = rewrite_gguf(
        build("tiny-qwen2"), tmp_path / "spm.gguf",
        set_fields={"tokenizer.ggml.model": ("llama", gguf.GGUFValueType.STRING)},
    )  # fmt: skip
    with pytest.raises(ValueError, match="SentencePiece"):
        Tokenizer.from_gguf(spm)
    with pytest.raises(ValueError, match="unknown GGUF pre-tokenizer 'bogus'"):
        Tokenizer.from_gguf(build("tiny-qwen2", pre="bogus"))


def _llama3_style_vocab(vocab_size: int = 1024) -> tuple[list[str], list[int], list[str]]:
    """Tokens/types/merges trained on Llama-3 splits (multi-digit tokens), minus the merge making " the"."""
    tok = HFTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(LLAMA3_SPLIT), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    trainer = trainers.BpeTrainer(
        vocab_size=900, min_frequency=2, show_progress=False, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator([corpus_text(), " ".join(str(n) for n in range(0, 5000, 7))], trainer=trainer)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    missing = vocab_size - tok.get_vocab_size()
    tok.add_tokens([AddedToken(extra_token(i), special=False, normalized=False) for i in range(missing)])
    kept = [m for m in merges(tok) if m.replace(" ", "") != "\u0120the"]
    assert len(kept) == len(merges(tok)) - 1
    return id_to_token_list(tok), [int(k) for k in token_types(tok)], kept


def test_llama3_digits_and_ignore_merges_match_llama_cpp(build, tmp_path):
    tokens, kinds, kept = _llama3_style_vocab()
    vt = gguf.GGUFValueType
    path = rewrite_gguf(
        build("tiny-qwen2"),
        tmp_path / "llama3-vocab.gguf",
        set_fields={
            "tokenizer.ggml.pre": ("llama-bpe", vt.STRING),
            "tokenizer.ggml.tokens": (tokens, vt.ARRAY, vt.STRING),
            "tokenizer.ggml.token_type": (kinds, vt.ARRAY, vt.INT32),
            "tokenizer.ggml.merges": (kept, vt.ARRAY, vt.STRING),
        },
    )
    ours, llm = Tokenizer.from_gguf(path), llama_cpp.Llama(str(path), vocab_only=True, verbose=False)
    for text in [*TEXTS, "the the there theme 1234567 2024 126 99999"]:
        assert ours.encode(text) == _llama_cpp_ids(llm, text), text
    assert len(ours.encode(" the")) == 1  # whole-word vocab hit although its merge is gone
    assert any(len(ours.token_bytes(i)) >= 2 for i in ours.encode("1234567 126"))
    assert ours.add_bos_token is False  # the file says so (llama-bpe alone would default to True)


def test_piece_bytes_helpers():
    from gguf_io.tokenizer import _BYTE_DECODER, _spm_piece, byte_level_bytes

    assert byte_level_bytes("\u0120hello\u010a") == b" hello\n"
    assert byte_level_bytes("\u00e6\u0139\u00a5") == "日".encode()  # one CJK char as three byte symbols
    assert byte_level_bytes("<|im_end|>") == b"<|im_end|>"
    assert byte_level_bytes("\u4e00") == "\u4e00".encode()  # outside the table: stands for itself
    assert byte_level_bytes("a b") == b"a b" and byte_level_bytes("\x00\u0120") == "\x00\u0120".encode()  # a space,
    assert byte_level_bytes("\u00ad\u0100") == "\u00ad\u0100".encode()  # NUL, soft hyphen: not table characters
    every_byte = "".join(sorted(_BYTE_DECODER, key=_BYTE_DECODER.get))
    assert byte_level_bytes(every_byte) == bytes(range(256))
    assert _spm_piece("\u2581hello") == b" hello" and _spm_piece("<0x0A>") == b"\n"
