"""OpenAI-style completion/chat bodies and SSE chunks, as vLLM (§1), trtllm-serve (§3.1) and TGI's
Messages API (§2.9) write them; a :class:`Style` carries what differs between the three."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from . import logprobs as wire_logprobs
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
    body: dict[str, Any] = field(default_factory=dict)  # the request: logprobs, echo, n, ... (fakes/logprobs.py)

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
        completion = gen.completion_tokens * self.n
        return {"prompt_tokens": gen.prompt_tokens, "completion_tokens": completion,
                "total_tokens": gen.prompt_tokens + completion, **self.usage_extra}

    @property
    def n(self) -> int:
        return int(self.body.get("n") or 1)

    @property
    def top(self) -> int | None:
        """How many alternatives each logprobs entry lists; None: no logprobs asked."""
        if self.chat:
            return int(self.body.get("top_logprobs") or 0) if self.body.get("logprobs") else None
        value = self.body.get("logprobs")
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    @property
    def echo(self) -> bool:
        return not self.chat and bool(self.body.get("echo"))

    @property
    def continuous_usage(self) -> bool:
        return bool((self.body.get("stream_options") or {}).get("continuous_usage_stats"))

    def logprobs(self, gen: Generation, first: int, count: int) -> dict[str, Any] | None:
        """The logprobs of reply tokens ``first .. first+count`` (with the echoed prompt before token 0)."""
        top = self.top
        if top is None:
            return None
        tokens = [t for _, t in gen.tokens[first:first + count]]
        if self.chat:
            return wire_logprobs.chat_logprobs(tokens, first, top)
        prompt = wire_logprobs.prompt_tokens(self.body.get("prompt", "")) if self.echo else []
        if first == 0:
            return wire_logprobs.legacy_logprobs(prompt + tokens, 0, top, 0, echoed=len(prompt))
        offset = len("".join(prompt)) + len("".join(t for _, t in gen.tokens[:first]))
        return wire_logprobs.legacy_logprobs(tokens, first + len(prompt), top, offset)

    def prompt_fields(self) -> dict[str, Any]:
        """``prompt_logprobs`` of a completion choice, when asked."""
        if self.chat or self.body.get("prompt_logprobs") is None:
            return {}
        return {"prompt_logprobs": wire_logprobs.prompt_logprobs(self.body.get("prompt", ""))}

    def running_usage(self, gen: Generation, produced: int) -> dict[str, Any]:
        """``continuous_usage_stats``: the usage so far on every chunk."""
        if not self.continuous_usage:
            return {}
        return {"usage": {"prompt_tokens": gen.prompt_tokens, "total_tokens": gen.prompt_tokens + produced,
                          "completion_tokens": produced}}

    def event(self, value: Any) -> bytes:
        return self.prefix + dumps(value).encode() + b"\n\n"

    def chunk(self, choice: dict[str, Any], usage: dict[str, Any] | None = None) -> bytes:
        return self.event({**self.head(True), "choices": [choice], **({"usage": None} if self.tgi else {}),
                           **(usage or {})})

    def finish_fields(self, gen: Generation, finished: bool, logprobs: dict[str, Any] | None = None) -> dict[str, Any]:
        reason = gen.finish_reason if finished else None
        if self.tgi:
            return {"logprobs": logprobs, "finish_reason": reason}
        return {"logprobs": logprobs, "finish_reason": reason, "stop_reason": gen.stop_sequence if finished else None}

    def choice(self, gen: Generation, text: str, finished: bool, index: int = 0,
               logprobs: dict[str, Any] | None = None) -> dict[str, Any]:
        if not self.chat:
            return {"index": index, "text": text, **self.finish_fields(gen, finished, logprobs)}
        delta = {"role": "assistant", "content": text} if self.tgi else {"content": text}
        return {"index": index, "delta": delta, **self.finish_fields(gen, finished, logprobs)}


def role_chunk(style: Style, gen: Generation) -> bytes:
    """vLLM/trtllm open a chat stream with ``delta: {"role": "assistant", "content": ""}`` (one per choice)."""
    if not style.chat or style.tgi:
        return b""
    return b"".join(style.chunk({"index": i, "delta": {"role": "assistant", "content": ""},
                                 **style.finish_fields(gen, False)}, style.running_usage(gen, 0))
                    for i in range(style.n))


def stream_wire(style: Style, gen: Generation, include_usage: bool, error: Any, malformed: bytes) -> Wire:
    """One chunk per token and choice, ``finish_reason`` on the last; then the usage chunk (``"choices": []``)
    when asked for (§1.1); then ``[DONE]``. With ``echo`` the prompt opens the first chunk."""
    total, done = len(gen.tokens), style.prefix + b"[DONE]\n\n"
    echoed = style.body.get("prompt", "") if style.echo else ""

    def token(i: int) -> bytes:
        head = role_chunk(style, gen) if i == 0 else b""
        text = (echoed if i == 0 else "") + gen.tokens[i][1]
        extra = style.prompt_fields() if i == 0 else {}
        return head + b"".join(
            style.chunk({**style.choice(gen, text, i == total - 1, index, style.logprobs(gen, i, 1)), **extra},
                        style.running_usage(gen, i + 1))
            for index in range(style.n))

    def finish() -> bytes:
        out = b""
        if total == 0:
            out = role_chunk(style, gen) + b"".join(style.chunk(style.choice(gen, echoed, True, index))
                                                    for index in range(style.n))
        if include_usage:
            out += style.event({**style.head(True), "choices": [], "usage": style.usage(gen)})
        return out + done

    return Wire(token, finish, error, malformed, tail=done)


def full_body(style: Style, gen: Generation, report_usage: bool) -> dict[str, Any]:
    """The non-streaming response; ``usage`` is null when ``report_usage`` is off (a deliberate
    departure: the real servers always report it here)."""
    logprobs = style.logprobs(gen, 0, len(gen.tokens))
    if style.chat:
        message = {"role": "assistant", "content": gen.text}
        choices = [{"index": i, "message": message, **style.finish_fields(gen, True, logprobs)}
                   for i in range(style.n)]
    else:
        text = (style.body.get("prompt", "") if style.echo else "") + gen.text
        choices = [{"index": i, "text": text, **style.finish_fields(gen, True, logprobs), **style.prompt_fields()}
                   for i in range(style.n)]
    return {**style.head(False), "choices": choices, "usage": style.usage(gen) if report_usage else None}
