"""Tokenizers: byte-level BPE rebuilt from GGUF metadata the way llama.cpp reads it, or tokenizer.json.

GGUF: tokens + merges -> ``tokenizers`` BPE, no normalizer (llama.cpp does not
normalise), the split regexes llama.cpp picks for ``tokenizer.ggml.pre``,
CONTROL/UNKNOWN tokens as special added tokens and USER_DEFINED tokens as
ordinary added tokens (both matched in text, as llama.cpp does).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from gguf import GGUFReader, TokenType
from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer

from .gguf_file import open_gguf
from .metadata import gguf_eos_token_ids, gguf_value, hf_chat_template, hf_eos_token_ids, read_json


@dataclass(frozen=True, slots=True)
class PreTokenizer:
    regexes: tuple[str, ...]
    ignore_merges: bool = False
    add_bos: bool = False


def _chars(ranges: Iterable[tuple[int, int] | int]) -> str:
    """Regex character-class body from code point ranges."""
    items = [(r, r) if isinstance(r, int) else r for r in ranges]
    return "".join(chr(a) if a == b else f"{chr(a)}-{chr(b)}" for a, b in items)


# Split regexes as in llama.cpp's llm_tokenizer_bpe (src/llama-vocab.cpp).
_CONTRACTIONS = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
_TAIL = r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
_LLAMA3 = _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}" + _TAIL
_QWEN2 = _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}" + _TAIL
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_CJK = "[" + _chars([(0x4E00, 0x9FA5), (0x0800, 0x4E00), (0xAC00, 0xD7FF)]) + "]+"
_CASED = _chars(
    [(0x41, 0x5A), (0x61, 0x7A), 0xB5, (0xC0, 0xD6), (0xD8, 0xF6), (0xF8, 0x1BA), (0x1BC, 0x1BF), (0x1C4, 0x293),
     (0x295, 0x2AF), (0x370, 0x373), (0x376, 0x377), (0x37B, 0x37D), 0x37F, 0x386, (0x388, 0x38A), 0x38C,
     (0x38E, 0x3A1), (0x3A3, 0x3F5), (0x3F7, 0x481), (0x48A, 0x52F), (0x531, 0x556), (0x10A0, 0x10C5),
     (0x13A0, 0x13F5), (0x13F8, 0x13FD), (0x1C90, 0x1CBA), (0x1CBD, 0x1CBF), (0x1D00, 0x1D2B), (0x1D6B, 0x1D77),
     (0x1D79, 0x1D9A), (0x1E00, 0x1F15), (0x1F18, 0x1F1D), (0x1F20, 0x1F45), (0x1F48, 0x1F4D), (0x1F50, 0x1F57),
     0x1F59, 0x1F5B, 0x1F5D, (0x1F5F, 0x1F7D), (0x1F80, 0x1FB4), (0x1FB6, 0x1FBC), 0x1FBE, (0x1FC2, 0x1FC4),
     (0x1FC6, 0x1FCC), (0x1FD0, 0x1FD3), (0x1FD6, 0x1FDB), (0x1FE0, 0x1FEC), (0x1FF2, 0x1FF4), (0x1FF6, 0x1FFC),
     0x2102, 0x2107, (0x210A, 0x2113), 0x2115, (0x2119, 0x211D), 0x2124, 0x2126, 0x2128, (0x212A, 0x212D),
     (0x212F, 0x2134), 0x2139, (0x213C, 0x213F), (0x2145, 0x2149), 0x214E, (0x2183, 0x2184), (0x2C00, 0x2C7B),
     (0x2C7E, 0x2CE4), (0x2CEB, 0x2CEE), (0x2CF2, 0x2CF3), (0xA640, 0xA66D), (0xA680, 0xA69B), (0xA722, 0xA76F),
     (0xA771, 0xA787), (0xA78B, 0xA78E), (0xAB70, 0xABBF), (0xFB00, 0xFB06), (0xFB13, 0xFB17), (0xFF21, 0xFF3A),
     (0xFF41, 0xFF5A), (0x10400, 0x1044F), (0x104B0, 0x104D3), (0x104D8, 0x104FB), (0x10C80, 0x10CB2),
     (0x10CC0, 0x10CF2), (0x118A0, 0x118DF), (0x1E900, 0x1E943)]
)  # fmt: skip
_PUNCT = _chars([(0x21, 0x2F), (0x3A, 0x7E), (0xFF01, 0xFF0F), (0xFF1A, 0xFF5E), (0x2018, 0x201F), (0x3000, 0x3002)])
_DEFAULT = PreTokenizer((r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", "[0-9][0-9][0-9]"))
_GROUPS: list[tuple[tuple[str, ...], PreTokenizer]] = [
    (("default",), _DEFAULT),
    (("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2"),
     PreTokenizer((_LLAMA3,), ignore_merges=True, add_bos=True)),
    (("dbrx", "smaug-bpe", "glm4", "chatglm-bpe"), PreTokenizer((_LLAMA3,))),
    (("qwen2", "deepseek-r1-qwen", "megrez", "stablelm2", "hunyuan", "kormo"), PreTokenizer((_QWEN2,))),
    (("gpt-2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v2-es", "jina-v2-de", "a.x-4.0", "mellum", "mpt",
      "olmo", "jais", "trillion", "exaone4", "roberta-bpe", "jina-v1-en", "jina-v2-code"), PreTokenizer((_GPT2,))),
    (("starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva-7b"),
     PreTokenizer((r"\p{N}", _GPT2))),
    (("falcon",), PreTokenizer((r"[\p{P}\$\+<=>\^~\|`]+", _GPT2, "[0-9][0-9][0-9]"))),
    (("deepseek-llm",),
     PreTokenizer(("[\r\n]", rf"\s?[{_CASED}]+", rf"\s?[{_PUNCT}]+", r"\s+$", _CJK, r"\p{N}+"))),
    (("deepseek-coder",), PreTokenizer(("[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", _CJK, r"\p{N}"))),
]  # fmt: skip
PRE_TOKENIZERS: dict[str, PreTokenizer] = {name: pre for names, pre in _GROUPS for name in names}
_SPECIAL_TYPES = frozenset({TokenType.CONTROL, TokenType.UNKNOWN})


def pre_tokenizer(name: str | None) -> PreTokenizer:
    """llama.cpp's pre-tokenizer for a tokenizer.ggml.pre value (missing -> "default", as llama.cpp)."""
    if not name:
        return _DEFAULT
    if name not in PRE_TOKENIZERS:
        raise ValueError(f"unknown GGUF pre-tokenizer {name!r}; supported: {', '.join(sorted(PRE_TOKENIZERS))}")
    return PRE_TOKENIZERS[name]


def _byte_decoder() -> dict[str, int]:
    """Inverse of GPT-2's bytes_to_unicode table."""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    others = [b for b in range(256) if b not in printable]
    table = {chr(b): b for b in printable}
    table.update({chr(256 + n): b for n, b in enumerate(others)})
    return table


_BYTE_DECODER = _byte_decoder()
# str.translate table: each table character to the latin-1 character of its byte; the other characters
# below 256 to one that latin-1 cannot encode, so a token with any character outside the table fails.
_TO_LATIN1 = {**dict.fromkeys(range(256), 0xFFFF), **{ord(c): b for c, b in _BYTE_DECODER.items()}}


def byte_level_bytes(token: str) -> bytes:
    """Raw bytes of a byte-level BPE token (a character outside the table stands for itself)."""
    try:
        return token.translate(_TO_LATIN1).encode("latin-1")  # one C pass; a whole vocabulary in ~10 ms
    except UnicodeEncodeError:
        return token.encode("utf-8")


def _gguf_vocab(reader: GGUFReader) -> tuple[list[str], list[int]]:
    model = gguf_value(reader, "tokenizer.ggml.model")
    if model != "gpt2":
        raise ValueError(
            f"GGUF tokenizer model {model!r} is not supported (only 'gpt2', byte-level BPE; "
            "'llama' SentencePiece vocabularies are not implemented)"
        )
    tokens = [t or f"[EMPTY_{i}]" for i, t in enumerate(gguf_value(reader, "tokenizer.ggml.tokens") or [])]
    types = gguf_value(reader, "tokenizer.ggml.token_type") or [TokenType.NORMAL] * len(tokens)
    return tokens, types


def _merge_pairs(merges: list[str], vocab: dict[str, int]) -> list[tuple[str, str]]:
    """'a b' -> ('a', 'b') split at the first space after index 0 (as llama.cpp); unusable merges dropped."""
    pairs = []
    for merge in merges:
        pos = merge.find(" ", 1)
        left, right = merge[:pos], merge[pos + 1 :]
        if pos > 0 and left in vocab and right in vocab and left + right in vocab:
            pairs.append((left, right))
    return pairs


def tokenizer_from_gguf(reader: GGUFReader) -> HFTokenizer:
    """A ``tokenizers.Tokenizer`` equivalent to llama.cpp's for this GGUF vocabulary."""
    return _build(reader, *_gguf_vocab(reader))


def _build(reader: GGUFReader, tokens: list[str], types: list[int]) -> HFTokenizer:
    pre = pre_tokenizer(gguf_value(reader, "tokenizer.ggml.pre"))
    vocab: dict[str, int] = {}
    for i, token in enumerate(tokens):
        vocab.setdefault(token, i)
    merges = _merge_pairs(gguf_value(reader, "tokenizer.ggml.merges") or [], vocab)
    tok = HFTokenizer(models.BPE(vocab, merges, ignore_merges=pre.ignore_merges, fuse_unk=False, byte_fallback=False))
    splits = [pre_tokenizers.Split(Regex(r), behavior="isolated", invert=False) for r in pre.regexes]
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    tok.pre_tokenizer = pre_tokenizers.Sequence([*splits, byte_level])
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([_added(t) for t, k in zip(tokens, types) if k in _SPECIAL_TYPES])
    tok.add_tokens([_added(t, special=False) for t, k in zip(tokens, types) if k == TokenType.USER_DEFINED])
    return tok


def _added(content: str, special: bool = True) -> AddedToken:
    return AddedToken(content, special=special, normalized=False, lstrip=False, rstrip=False, single_word=False)


def _gguf_piece(token: str, kind: int) -> bytes:
    """llama.cpp's token_to_piece for BPE vocabularies (special tokens rendered)."""
    if kind in _SPECIAL_TYPES or kind == TokenType.USER_DEFINED:
        return token.encode("utf-8")
    return byte_level_bytes(token) if kind == TokenType.NORMAL else b""


def _spm_piece(token: str) -> bytes:
    if len(token) == 6 and token.startswith("<0x") and token.endswith(">"):
        return bytes([int(token[3:5], 16)])
    return token.replace("\u2581", " ").encode("utf-8")


class Tokenizer:
    """Encode/decode plus the per-token raw bytes an incremental detokenizer needs."""

    __slots__ = ("_byte_level", "_pieces", "_plain", "_special", "_tok",
                 "add_bos_token", "bos_token_id", "chat_template", "eos_token_ids")  # fmt: skip

    def __init__(
        self,
        tokenizer: HFTokenizer,
        pieces: list[bytes],
        special_ids: Iterable[int],
        *,
        eos_token_ids: list[int],
        bos_token_id: int | None = None,
        add_bos_token: bool = False,
        byte_level: bool = True,
        chat_template: str | None = None,
    ) -> None:
        self._tok, self._plain, self._pieces = tokenizer, None, pieces
        self._special = frozenset(special_ids)
        self._byte_level = byte_level
        self.eos_token_ids, self.bos_token_id = list(eos_token_ids), bos_token_id
        self.add_bos_token, self.chat_template = add_bos_token, chat_template

    @classmethod
    def from_gguf(cls, source: GGUFReader | str | os.PathLike[str]) -> Tokenizer:
        reader = open_gguf(source)
        tokens, types = _gguf_vocab(reader)
        pre = pre_tokenizer(gguf_value(reader, "tokenizer.ggml.pre"))
        return cls(
            _build(reader, tokens, types),
            [_gguf_piece(t, k) for t, k in zip(tokens, types)],
            [i for i, k in enumerate(types) if k in _SPECIAL_TYPES],
            eos_token_ids=gguf_eos_token_ids(reader, tokens),
            bos_token_id=gguf_value(reader, "tokenizer.ggml.bos_token_id"),
            add_bos_token=bool(gguf_value(reader, "tokenizer.ggml.add_bos_token", pre.add_bos)),
            chat_template=gguf_value(reader, "tokenizer.chat_template"),
        )

    @classmethod
    def from_hf(cls, path: str | os.PathLike[str]) -> Tokenizer:
        root = Path(path)
        raw = (root / "tokenizer.json").read_text(encoding="utf-8")
        tok = HFTokenizer.from_str(raw)
        byte_level = "ByteLevel" in json.dumps(json.loads(raw).get("decoder"))
        added = tok.get_added_tokens_decoder()
        pieces = [_hf_piece(tok, i, added, byte_level) for i in range(tok.get_vocab_size(with_added_tokens=True))]
        config = read_json(root / "config.json") if (root / "config.json").exists() else {}
        bos = config.get("bos_token_id")
        return cls(
            tok,
            pieces,
            [i for i, a in added.items() if a.special],
            eos_token_ids=hf_eos_token_ids(root, config),
            bos_token_id=bos,
            add_bos_token=bos is not None and tok.encode("", add_special_tokens=True).ids[:1] == [bos],
            byte_level=byte_level,
            chat_template=hf_chat_template(root),
        )

    @property
    def vocab_size(self) -> int:
        return len(self._pieces)

    def encode(self, text: str, *, parse_special: bool = True, add_bos: bool = False) -> list[int]:
        """Token ids; parse_special=False leaves special tokens as text (added ordinary tokens still match)."""
        ids = (self._tok if parse_special else self._raw_tokenizer()).encode(text, add_special_tokens=False).ids
        return [self.bos_token_id, *ids] if add_bos and self.bos_token_id is not None else ids

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = True) -> str:
        ids = [i for i in ids if not (skip_special_tokens and i in self._special)]
        if not self._byte_level:
            return self._tok.decode(ids, skip_special_tokens=skip_special_tokens)
        return b"".join(self.token_bytes(i) for i in ids).decode("utf-8", errors="replace")

    def token_bytes(self, token_id: int) -> bytes:
        """Raw bytes of one token (special and added tokens: their UTF-8 text; unknown ids: b"")."""
        return self._pieces[token_id] if 0 <= token_id < len(self._pieces) else b""

    def is_special(self, token_id: int) -> bool:
        return token_id in self._special

    def _raw_tokenizer(self) -> HFTokenizer:
        if self._plain is None:
            plain = HFTokenizer.from_str(self._tok.to_str())
            plain.encode_special_tokens = True
            self._plain = plain
        return self._plain


def _hf_piece(tok: HFTokenizer, i: int, added: dict[int, AddedToken], byte_level: bool) -> bytes:
    if i in added:
        return added[i].content.encode("utf-8")
    text = tok.id_to_token(i)
    if text is None:
        return b""
    return byte_level_bytes(text) if byte_level else _spm_piece(text)


def load_tokenizer(path: str | os.PathLike[str]) -> Tokenizer:
    """Tokenizer of a .gguf file or a Hugging Face checkpoint directory."""
    return Tokenizer.from_hf(path) if Path(path).is_dir() else Tokenizer.from_gguf(path)
