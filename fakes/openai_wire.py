"""OpenAI-style completion/chat bodies and SSE chunks, as vLLM (§1), trtllm-serve (§3.1) and TGI's
Messages API (§2.9) write them; a :class:`Style` carries what differs between the three."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from .common import Wire, dumps
from .engine import Generation


@dataclass
class Style:
    """``tgi``: ``data:`` without a space, ``id: ""``, ``system_fingerprint``, ``"usage": null`` on every
    chunk and the role in every delta (§2.9). Otherwise vLLM/trtllm: ``data: ``, the role in a first
    chunk of its own, ``stop_reason`` next to ``finish_reason``."""

    chat: bool
    model: str
    tgi: bool = False
    usage_extra: dict[str, Any] = field(default_factory=dict)
    id: str = ""
    created: int = field(default_factory=lambda: int(time.time()))

    def __post_init__(self) -> None:
        if not self.tgi:
            self.id = f"{'chatcmpl' if self.chat else 'cmpl'}-{uuid.uuid4().hex}"

    @property
    def prefix(self) -> bytes:
        return b"data:" if self.tgi else b"data: "

    def head(self, chunk: bool) -> dict[str, Any]:
        kind = ("chat.completion.chunk" if chunk else "chat.completion") if self.chat else "text_completion"
        if self.tgi:
            return {"object": kind, "id": "", "created": self.created, "model": self.model,
                    "system_fingerprint": "3.3.6-native"}
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model}

    def usage(self, gen: Generation) -> dict[str, Any]:
        return {"prompt_tokens": gen.prompt_tokens, "completion_tokens": gen.completion_tokens,
                "total_tokens": gen.prompt_tokens + gen.completion_tokens, **self.usage_extra}

    def event(self, value: Any) -> bytes:
        return self.prefix + dumps(value).encode() + b"\n\n"

    def chunk(self, choice: dict[str, Any]) -> bytes:
        return self.event({**self.head(True), "choices": [choice], **({"usage": None} if self.tgi else {})})

    def finish_fields(self, gen: Generation, finished: bool) -> dict[str, Any]:
        reason = gen.finish_reason if finished else None
        if self.tgi:
            return {"logprobs": None, "finish_reason": reason}
        return {"logprobs": None, "finish_reason": reason, "stop_reason": gen.stop_sequence if finished else None}

    def choice(self, gen: Generation, text: str, finished: bool) -> dict[str, Any]:
        if not self.chat:
            return {"index": 0, "text": text, **self.finish_fields(gen, finished)}
        delta = {"role": "assistant", "content": text} if self.tgi else {"content": text}
        return {"index": 0, "delta": delta, **self.finish_fields(gen, finished)}


def role_chunk(style: Style, gen: Generation) -> bytes:
    """vLLM/trtllm open a chat stream with ``delta: {"role": "assistant", "content": ""}``."""
    if not style.chat or style.tgi:
        return b""
    choice = {"index": 0, "delta": {"role": "assistant", "content": ""}, **style.finish_fields(gen, False)}
    return style.chunk(choice)


def stream_wire(style: Style, gen: Generation, include_usage: bool, error: Any, malformed: bytes) -> Wire:
    """One chunk per token, ``finish_reason`` on the last; then the usage chunk (``"choices": []``)
    when asked for (§1.1); then ``[DONE]``."""
    total, done = len(gen.tokens), style.prefix + b"[DONE]\n\n"

    def token(i: int) -> bytes:
        head = role_chunk(style, gen) if i == 0 else b""
        return head + style.chunk(style.choice(gen, gen.tokens[i][1], i == total - 1))

    def finish() -> bytes:
        out = role_chunk(style, gen) + style.chunk(style.choice(gen, "", True)) if total == 0 else b""
        if include_usage:
            out += style.event({**style.head(True), "choices": [], "usage": style.usage(gen)})
        return out + done

    return Wire(token, finish, error, malformed, tail=done)


def full_body(style: Style, gen: Generation, report_usage: bool) -> dict[str, Any]:
    """The non-streaming response; ``usage`` is null when ``report_usage`` is off (a deliberate
    departure: the real servers always report it here)."""
    if style.chat:
        message = {"role": "assistant", "content": gen.text}
        choice = {"index": 0, "message": message, **style.finish_fields(gen, True)}
    else:
        choice = {"index": 0, "text": gen.text, **style.finish_fields(gen, True)}
    return {**style.head(False), "choices": [choice], "usage": style.usage(gen) if report_usage else None}
