"""A reasoning model's output split into thinking and text, as vLLM's reasoning parsers split it.

Which models think is read from their chat template (Ollama's ``thinking`` capability): an Ollama Go
template that uses ``.Think`` or writes ``<think>``, or a Jinja template (``tokenizer.chat_template``)
that writes ``<think>`` (Qwen3, QwQ, DeepSeek-R1 and their distills). The thinking is what the model
writes between ``<think>`` and ``</think>``:

- a template whose generation prompt already ends with ``<think>`` (DeepSeek-R1's) leaves the model
  inside the thinking from its first token (vLLM's ``deepseek_r1`` parser);
- otherwise thinking starts only where the output itself opens the tag before any other text (vLLM's
  ``qwen3``); the first ``</think>`` ends it, and everything after is text (a later ``<think>`` is text).

Tags split across pieces are held back until they are known, and the blank text after each tag is
dropped (as Ollama trims it).

    parser = ReasoningParser(thinking=starts_thinking(spec, think))
    thinking, text = parser.feed(piece)   # repeatedly
    thinking, text = parser.finish()      # at the end of generation

:func:`reasoning` wraps a local backend's ``stream`` (inside ``@tool_calling``, so a call written
while thinking is not a call): ``think: false`` and models whose template does not think pass
through, and so does constrained output (a ``format``: JSON has no thinking part); ``think: true``
(or a level) on such a model is Ollama's 400 ``"<model>" does not support
thinking``. Reasoning tokens are the output tokens less those of the chunks after the thinking: the
tags count as thinking (Anthropic's ``thinking_tokens`` counts the delimiters too), and so does a token
that never reached a chunk while the model was thinking (held back as a possible stop string).
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing
from functools import lru_cache
from typing import Any

from core.base import Chunk, Done, GenerationRequest, StreamEvent
from core.errors import InvalidRequest

__all__ = ["LEVELS", "ReasoningParser", "reasoning", "starts_thinking", "thinks"]

START, END = "<think>", "</think>"
LEVELS = ("low", "medium", "high")
_PROBE = [{"role": "user", "content": "?"}]

Stream = Callable[[Any, GenerationRequest], AsyncIterator[StreamEvent]]


def thinks(details) -> bool:
    """Whether a model's template thinks (Ollama's ``thinking`` capability)."""
    if details.template:
        return _go_thinks(details.template)
    return START in (details.chat_template or "")


@lru_cache(maxsize=64)
def _go_thinks(source: str) -> bool:
    from registry.templates import GoTemplate

    return START in source or GoTemplate(source).uses("Think")


def starts_thinking(spec, think: bool | str | None) -> bool:
    """Whether the template's generation prompt leaves the model inside ``<think>``."""
    return _ends_open(spec.template, spec.jinja_template, think)


@lru_cache(maxsize=128)
def _ends_open(template: str | None, jinja_template: str | None, think: bool | str | None) -> bool:
    from frontend.chat_format import PromptSpec, render_chat

    try:
        prompt = render_chat(PromptSpec(template=template, jinja_template=jinja_template), _PROBE, think=think)
    except Exception:  # a template that cannot render a probe fails the real request later, with its message
        return False
    return prompt.rstrip().endswith(START)


class ReasoningParser:
    def __init__(self, *, thinking: bool = False, start: str = START, end: str = END):
        self.start, self.end = start, end
        self.state = "thinking" if thinking else "opening"  # opening: the tag may still come; text: it is over
        self.thought = thinking  # whether the output had a thinking part
        self._held = ""
        self._trim = thinking  # drop the blank text that follows a tag

    @property
    def thinking(self) -> bool:
        return self.state == "thinking"

    def feed(self, piece: str) -> tuple[str, str]:
        """(thinking, text) that can be shown now."""
        if self.state == "text" and not self._held:
            return "", self._trimmed(piece)
        self._held += piece
        thinking = ""
        if self.state == "opening":
            self._open()
        if self.state == "thinking":
            thinking = self._think()
        text = ""
        if self.state == "text":
            text, self._held = self._trimmed(self._held), ""
        return thinking, text

    def finish(self) -> tuple[str, str]:
        held, self._held = self._held, ""
        return (held, "") if self.state == "thinking" else ("", held)

    def _open(self) -> None:
        head = self._held.lstrip()
        if head.startswith(self.start):
            self._held, self.state, self.thought, self._trim = head[len(self.start):], "thinking", True, True
        elif not head or self.start.startswith(head):
            return  # blank so far, or maybe the tag: wait
        else:
            self.state = "text"

    def _think(self) -> str:
        at = self._held.find(self.end)
        if at >= 0:
            out, self._held = self._held[:at], self._held[at + len(self.end):]
            out = self._trimmed(out)
            self.state, self._trim = "text", True
            return out
        keep = _overlap(self._held, self.end)
        cut = len(self._held) - keep
        out, self._held = self._held[:cut], self._held[cut:]
        return self._trimmed(out)

    def _trimmed(self, text: str) -> str:
        """``text`` without the blank start of a part; the trim lasts until the part shows something."""
        if not self._trim:
            return text
        text = text.lstrip()
        if text:
            self._trim = False
        return text


def _overlap(text: str, tag: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of ``tag``."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0


# -- the local backends' stream ---------------------------------------------------------------------

def reasoning(stream: Stream) -> Stream:
    """Decorate a local backend's ``stream`` (a :class:`~core.base.LocalBackend`: it has ``details``)."""
    @functools.wraps(stream)
    def with_reasoning(self, request: GenerationRequest) -> AsyncIterator[StreamEvent]:
        if request.raw or request.prompt_tokens is not None or request.think is False or request.format is not None:
            return stream(self, request)
        return _split(stream, self, request)
    return with_reasoning


async def _split(stream: Stream, backend, request: GenerationRequest) -> AsyncIterator[StreamEvent]:
    details = backend.details(request.model)
    if not thinks(details):
        if request.think is not None:
            raise InvalidRequest(f'"{request.model}" does not support thinking', param="think")
        async with aclosing(stream(backend, request)) as plain:
            async for event in plain:
                yield event
        return
    from frontend.chat_format import PromptSpec

    spec = PromptSpec(template=details.template, jinja_template=details.gguf.chat_template if details.gguf else None)
    parser = ReasoningParser(thinking=starts_thinking(spec, request.think))
    async with aclosing(stream(backend, request)) as events:
        async for event in split_events(events, parser):
            yield event


async def split_events(events: AsyncIterator[StreamEvent], parser: ReasoningParser) -> AsyncIterator[StreamEvent]:
    """``events`` with each chunk's text split by ``parser``; the Done counts the reasoning tokens."""
    answer_tokens = 0  # tokens of the chunks after the thinking (a token held back by a stop string has no chunk)
    async for event in events:
        if isinstance(event, Done):
            thinking, text = parser.finish()
            if thinking or text:
                yield Chunk(text, thinking=thinking)
            if parser.thought:
                event.usage.reasoning_tokens = max(0, event.usage.output_tokens - answer_tokens)
            yield event
            return
        was = parser.thinking
        thinking, text = parser.feed(event.text)
        if not (was or parser.thinking):
            answer_tokens += len(event.token_ids)
        if text or thinking or event.token_ids or event.logprobs or event.tool_calls:
            yield Chunk(text, event.token_ids, event.logprobs, event.tool_calls, thinking=event.thinking + thinking)
