"""The target's tokenizer for prompt building and output counting: a GGUF file's vocabulary or a
Hugging Face ``tokenizer.json``, read by ``gguf_io`` (the tokenizer the native engine uses too)."""

from __future__ import annotations

from pathlib import Path

from gguf_io.tokenizer import Tokenizer


class TokenCounter:
    """Counts tokens the way the server does (no BOS, special tokens not parsed from text)."""

    def __init__(self, tokenizer: Tokenizer, source: str) -> None:
        self._tok, self.source = tokenizer, source

    @classmethod
    def load(cls, path: Path) -> TokenCounter:
        """``path``: a .gguf file, a tokenizer.json file, or a directory holding tokenizer.json."""
        if not path.exists():
            raise ValueError(f"tokenizer {path} does not exist")
        try:
            if path.is_dir() or path.name.endswith(".json"):
                return cls(Tokenizer.from_hf(path if path.is_dir() else path.parent), str(path))
            return cls(Tokenizer.from_gguf(path), str(path))
        except (OSError, ValueError, KeyError) as exc:
            raise ValueError(f"cannot load a tokenizer from {path}: {exc}") from None

    @property
    def vocab_size(self) -> int:
        return self._tok.vocab_size

    def token_bytes(self, token_id: int) -> bytes:
        return self._tok.token_bytes(token_id)

    def count(self, text: str) -> int:
        return len(self._tok.encode(text, parse_special=False))
