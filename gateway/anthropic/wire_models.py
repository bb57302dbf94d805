"""What the Messages API routes answer, declared for the OpenAPI schema only (``gateway/wire_docs.py``).

The routes build their bodies as dicts (``gateway/anthropic/views.py``); these models document them and
let the fuzz tier check real answers. A stream is ``text/event-stream`` of named events
(``event: message_start`` …), each ``data`` one of the event models below, or an :class:`AnthropicError`.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from gateway.wire_docs import error_responses, named_sse_content

__all__ = ["AnthropicError", "CountTokens", "AnthropicMessage", "count_responses", "messages_responses"]


class AnthropicErrorDetail(BaseModel):
    type: str = Field(description="invalid_request_error, authentication_error, not_found_error, rate_limit_error, "
                                  "overloaded_error, api_error, …")
    message: str


class AnthropicError(BaseModel):
    """Every error of a ``/v1/messages`` route, and the ``error`` event of a stream."""

    type: Literal["error"]
    error: AnthropicErrorDetail


class ThinkingTokens(BaseModel):
    thinking_tokens: int = Field(ge=0)


class MessageUsage(BaseModel):
    input_tokens: int = Field(ge=0, description="prompt tokens the cache did not serve")
    output_tokens: int = Field(ge=0)
    cache_creation_input_tokens: int | None = None
    cache_read_input_tokens: int | None = None
    output_tokens_details: ThinkingTokens | None = None


class ContentBlock(BaseModel):
    type: Literal["text", "thinking", "tool_use"]
    text: str | None = None
    thinking: str | None = None
    signature: str | None = None
    id: str | None = None
    name: str | None = None
    input: dict[str, Any] | None = None


StopReason = Literal["end_turn", "max_tokens", "stop_sequence", "tool_use"]


class AnthropicMessage(BaseModel):
    """``POST /v1/messages`` without ``stream``."""

    id: str
    type: Literal["message"]
    role: Literal["assistant"]
    model: str
    content: list[ContentBlock]
    stop_reason: StopReason | None
    stop_sequence: str | None
    usage: MessageUsage


class MessageStart(BaseModel):
    type: Literal["message_start"]
    message: AnthropicMessage


class Ping(BaseModel):
    type: Literal["ping"]


class BlockStart(BaseModel):
    type: Literal["content_block_start"]
    index: int = Field(ge=0)
    content_block: ContentBlock


class ContentDelta(BaseModel):
    type: Literal["text_delta", "thinking_delta", "signature_delta", "input_json_delta"]
    text: str | None = None
    thinking: str | None = None
    signature: str | None = None
    partial_json: str | None = None


class BlockDelta(BaseModel):
    type: Literal["content_block_delta"]
    index: int = Field(ge=0)
    delta: ContentDelta


class BlockStop(BaseModel):
    type: Literal["content_block_stop"]
    index: int = Field(ge=0)


class StopDelta(BaseModel):
    stop_reason: StopReason
    stop_sequence: str | None


class MessageDelta(BaseModel):
    type: Literal["message_delta"]
    delta: StopDelta
    usage: MessageUsage


class MessageStop(BaseModel):
    type: Literal["message_stop"]


class CountTokens(BaseModel):
    input_tokens: int = Field(ge=0)


_BACKEND = (400, 404, 429, 502, 503, 504)


def messages_responses() -> dict[int | str, dict[str, Any]]:
    events = [MessageStart, Ping, BlockStart, BlockDelta, BlockStop, MessageDelta, MessageStop]
    return {200: {"model": AnthropicMessage,
                  "description": "the message; with \"stream\": true a stream of named events",
                  "content": named_sse_content(events, AnthropicError)},
            **error_responses(AnthropicError, _BACKEND)}


def count_responses() -> dict[int | str, dict[str, Any]]:
    return {200: {"model": CountTokens, "description": "the prompt's tokens, as the model's template and vocabulary "
                                                       "count them"},
            **error_responses(AnthropicError, (400, 404))}
