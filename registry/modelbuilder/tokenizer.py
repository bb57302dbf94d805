"""A small deterministic byte-level BPE tokenizer in the Qwen2 style.

Trained with the ``tokenizers`` library on ``data/corpus.txt``. Regular tokens
come first, then the ChatML special tokens, then ``<|extra_N|>`` placeholders
that pad the vocabulary up to the model's embedding size. The placeholders are
ordinary (non-special) added tokens, like the ``[PAD{i}]`` padding tokens that
``convert_hf_to_gguf.py`` writes as USER_DEFINED: both llama.cpp and
transformers match them in text and print them back as their text.
"""

from __future__ import annotations

import functools
import json
from importlib import resources

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = (ENDOFTEXT, IM_START, IM_END)

# Qwen2's pre-tokenizer split pattern (tokenizer.json of Qwen/Qwen2-0.5B).
QWEN2_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# Qwen2-Instruct's ChatML template.
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}"
    "{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def extra_token(index: int) -> str:
    """Placeholder token text for padding row ``index`` (0-based)."""
    return f"<|extra_{index}|>"


def corpus_text() -> str:
    """The training text shipped with the package (read as UTF-8 bytes, no newline translation)."""
    data = resources.files(__package__).joinpath("data", "corpus.txt").read_bytes()
    return data.decode("utf-8")


def _empty_tokenizer() -> Tokenizer:
    tok = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    # Qwen2 normalizes to NFC (and transformers' Qwen2Tokenizer always does);
    # llama.cpp does not, so the two agree on NFC text only, as for real Qwen2.
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    return tok


@functools.lru_cache(maxsize=8)
def _trained_json(vocab_size: int) -> str:
    if vocab_size < 256 + len(SPECIAL_TOKENS):
        raise ValueError(f"vocab_size must be at least {256 + len(SPECIAL_TOKENS)}, got {vocab_size}")
    tok = _empty_tokenizer()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(SPECIAL_TOKENS),
        min_frequency=2,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
    )
    tok.train_from_iterator([corpus_text()], trainer=trainer)
    tok.add_special_tokens([_special(t) for t in SPECIAL_TOKENS])
    return tok.to_str()


def _special(content: str, special: bool = True) -> AddedToken:
    return AddedToken(content, special=special, normalized=False, lstrip=False, rstrip=False, single_word=False)


def train_tokenizer(vocab_size: int = 1000) -> Tokenizer:
    """Train (once per process and size) the corpus tokenizer; returns a fresh copy.

    The result has at most ``vocab_size`` entries: byte-level BPE tokens, then
    the three ChatML special tokens. Training is deterministic.
    """
    return Tokenizer.from_str(_trained_json(vocab_size))


def padded_tokenizer(vocab_size: int, trained_vocab_size: int = 1000) -> Tokenizer:
    """The trained tokenizer padded with ``<|extra_N|>`` added tokens to exactly ``vocab_size``."""
    tok = train_tokenizer(min(vocab_size, trained_vocab_size))
    missing = vocab_size - tok.get_vocab_size(with_added_tokens=True)
    if missing > 0:
        tok.add_tokens([_special(extra_token(i), special=False) for i in range(missing)])
    return tok


def id_to_token_list(tok: Tokenizer) -> list[str]:
    """All token strings ordered by id (ids must be contiguous from 0)."""
    vocab = tok.get_vocab(with_added_tokens=True)
    tokens = [""] * len(vocab)
    for text, idx in vocab.items():
        tokens[idx] = text
    if "" in tokens:
        raise ValueError("tokenizer ids are not contiguous")
    return tokens


def merges(tok: Tokenizer) -> list[str]:
    """BPE merges as ``"left right"`` strings in rank order (both tokenizer.json layouts)."""
    raw = json.loads(tok.to_str())["model"]["merges"]
    return [m if isinstance(m, str) else f"{m[0]} {m[1]}" for m in raw]


def special_ids(tok: Tokenizer) -> dict[str, int]:
    """Ids of the ChatML special tokens."""
    return {t: tok.token_to_id(t) for t in SPECIAL_TOKENS}


def num_regular_tokens(tok: Tokenizer) -> int:
    """Count of ordinary BPE tokens (they occupy ids 0..n-1)."""
    return tok.get_vocab_size(with_added_tokens=False)
