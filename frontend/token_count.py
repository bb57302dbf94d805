"""Counting tokens for usage a remote backend did not report.

``load_counter(path)`` reads a Hugging Face ``tokenizer.json`` or a GGUF file's vocabulary; with
no path it falls back to a byte estimate (about 4 UTF-8 bytes per token, the usual figure for
English BPE vocabularies). Either way the ledger marks such usage ``estimated``.

Prompt tokens are counted from the text the client sent plus a small per-message overhead for the
chat template's role markers (OpenAI's published rule of thumb: 3 per message and 3 to prime the reply).

``prompt_bound(request, counter)`` is an *upper bound* of a prompt's tokens, for a budget's hold
before a remote backend has counted anything: the configured tokenizer's count (or, without one,
the UTF-8 bytes: every token of a byte-level or byte-fallback vocabulary covers at least one byte)
plus generous template overheads: ``BOUND_PER_MESSAGE`` per message, ``BOUND_FIXED`` for the
template's own text (a default system prompt, the reply's header) and ``BOUND_TOOLS`` more with
tools (their JSON counted too).
"""

from __future__ import annotations

import json
import math
from functools import lru_cache
from pathlib import Path
from typing import Any, Protocol

from core.errors import InvalidRequest

PER_MESSAGE = 3
REPLY_PRIMER = 3
BOUND_PER_MESSAGE = 16
BOUND_FIXED = 128
BOUND_TOOLS = 512


class TokenCounter(Protocol):
    def count(self, text: str) -> int: ...

    def prompt_tokens(self, request: Any) -> int: ...


class _Counter:
    def count(self, text: str) -> int:
        raise NotImplementedError

    def prompt_tokens(self, request: Any) -> int:
        """Tokens of a ``GenerationRequest``'s input: its prompt, or its messages with template overhead."""
        if not request.is_chat:
            if request.prompt_tokens is not None:
                return len(request.prompt_tokens) + self.count(request.system or "")
            return self.count((request.system or "") + (request.prompt or ""))
        total = REPLY_PRIMER
        for message in request.messages or []:
            total += PER_MESSAGE + self.count(_text(message.get("content")))
        return total


class ByteEstimate(_Counter):
    """No tokenizer configured: ceil(bytes / 4)."""

    def count(self, text: str) -> int:
        return math.ceil(len(text.encode("utf-8")) / 4) if text else 0


class TokenizerCounter(_Counter):
    """Counts with a real vocabulary (``tokenizers.Tokenizer``)."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def count(self, text: str) -> int:
        return len(self.tokenizer.encode(text, add_special_tokens=False).ids) if text else 0


class ByteBound(_Counter):
    """No tokenizer, an upper bound: one token per UTF-8 byte at most."""

    def count(self, text: str) -> int:
        return len(text.encode("utf-8", "replace")) if text else 0


def prompt_bound(request: Any, counter: TokenCounter | None = None) -> int:
    """At least as many tokens as ``request``'s prompt has once a chat template has wrapped it."""
    counter = counter or ByteBound()
    if request.prompt_tokens is not None:
        return len(request.prompt_tokens) + counter.count(request.system or "") + BOUND_FIXED
    texts = [request.system or "", request.prompt or "", request.suffix or ""]
    texts += [_text(m.get("content")) + json.dumps(m.get("tool_calls") or "") for m in request.messages or []]
    total = sum(counter.count(text) for text in texts) + BOUND_FIXED
    total += BOUND_PER_MESSAGE * len(request.messages or [])
    if request.tools:
        total += counter.count(json.dumps(request.tools)) + BOUND_TOOLS
    return total


def load_counter(path: str | None) -> TokenCounter:
    return _load(str(Path(path).expanduser())) if path else ByteEstimate()


@lru_cache(maxsize=16)
def _load(path: str) -> TokenCounter:
    source = Path(path)
    if not source.is_file():
        raise InvalidRequest(f"tokenizer file {path} does not exist")
    if source.suffix == ".gguf":
        from gguf_io.gguf_file import GGUFFile
        from gguf_io.tokenizer import tokenizer_from_gguf

        return TokenizerCounter(tokenizer_from_gguf(GGUFFile(path)))
    from tokenizers import Tokenizer

    try:
        return TokenizerCounter(Tokenizer.from_file(path))
    except Exception as exc:  # tokenizers raises its own Exception subclass
        raise InvalidRequest(f"cannot read tokenizer {path}: {exc}") from None


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI content parts
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""
