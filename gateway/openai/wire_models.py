"""What the OpenAI routes answer, declared for the OpenAPI schema only.

The routes build their bodies as dicts (``gateway/openai/responses.py``, ``stream.py``) and send
them as orjson bytes; these models are never instantiated on the request path. They are used in
the route decorators' ``responses=`` (documentation, no ``response_model`` re-serialization), so
``/openapi.json`` states every status a route answers and the body of each, and the fuzz tier
(``tests/gateway/test_fuzz.py``) checks real answers against them.

Streams (``"stream": true``) are ``text/event-stream``: one event per chunk whose ``data`` is a
:class:`ChatCompletionChunk` (or :class:`TextCompletionChunk`), an error event
(:class:`OpenAIError`) if the backend fails after the stream started, then ``data: [DONE]``.
They are declared with OpenAPI 3.2's ``itemSchema`` (one event), as FastAPI declares its own SSE routes.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from gateway.wire_docs import TokenLogprob, error_responses, named_sse_content, sse_content

__all__ = ["ChatCompletion", "ChatCompletionChunk", "Embedding", "EmbeddingList", "OpenAIError", "Model",
           "ModelList", "TextCompletion", "TextCompletionChunk", "Usage", "chat_responses", "completion_responses",
           "embedding_responses", "model_responses", "models_responses"]

FinishReason = Literal["stop", "length", "tool_calls"]


class ErrorDetail(BaseModel):
    message: str
    type: str = Field(description="invalid_request_error, not_found_error, rate_limit_error, api_error, …")
    param: str | None = Field(description="the request field at fault, when there is one")
    code: str | int | None = Field(description="e.g. context_length_exceeded; a remote backend's own code as it "
                                               "sent it (vLLM: the status, 400)")


class OpenAIError(BaseModel):
    """Every error of a ``/v1`` route."""

    error: ErrorDetail


class PromptTokensDetails(BaseModel):
    cached_tokens: int = Field(ge=0)


class CompletionTokensDetails(BaseModel):
    reasoning_tokens: int = Field(ge=0, description="of completion_tokens, those spent thinking")


class Usage(BaseModel):
    prompt_tokens: int = Field(ge=0)
    completion_tokens: int = Field(ge=0)
    total_tokens: int = Field(ge=0)
    prompt_tokens_details: PromptTokensDetails | None = Field(
        default=None, description="present when the backend reports prompt-cache hits")
    completion_tokens_details: CompletionTokensDetails | None = Field(
        default=None, description="present when the model thought (a reasoning model)")


class ChoiceLogprobs(BaseModel):
    content: list[TokenLogprob]


class LegacyLogprobs(BaseModel):
    """``/v1/completions``' logprobs: parallel lists, ``text_offset`` in characters of the completion."""

    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: list[dict[str, float]]
    text_offset: list[int]


class _Envelope(BaseModel):
    id: str
    created: int = Field(description="Unix time (seconds)")
    model: str = Field(description="the model name as the request gave it")
    system_fingerprint: str


class FunctionCall(BaseModel):
    name: str
    arguments: str = Field(description="the arguments object as JSON text")


class ToolCall(BaseModel):
    id: str = Field(description="call_…; a tool message answers it with this tool_call_id")
    type: Literal["function"]
    function: FunctionCall


class ToolCallDelta(ToolCall):
    index: int = Field(ge=0, description="the call's position among the choice's calls")


class AssistantMessage(BaseModel):
    role: Literal["assistant"]
    reasoning_content: str | None = Field(default=None, description="a thinking model's reasoning, when it thought")
    content: str | None = Field(description="null when the model only called tools")
    tool_calls: list[ToolCall] | None = Field(default=None, description="present when the model called tools "
                                                                        "(finish_reason tool_calls)")


class ChatChoice(BaseModel):
    index: int = Field(ge=0)
    message: AssistantMessage
    logprobs: ChoiceLogprobs | None
    finish_reason: FinishReason


class ChatCompletion(_Envelope):
    """``POST /v1/chat/completions`` without ``stream``."""

    object: Literal["chat.completion"]
    choices: list[ChatChoice]
    usage: Usage


class Delta(BaseModel):
    role: Literal["assistant"] | None = Field(default=None, description="in the first chunk of each choice")
    content: str | None = Field(default=None, description="never empty; absent in a choice's last chunk")
    reasoning_content: str | None = Field(default=None, description="a piece of a thinking model's reasoning")
    tool_calls: list[ToolCallDelta] | None = Field(default=None, description="one whole call per chunk")


class ChunkChoice(BaseModel):
    index: int = Field(ge=0)
    delta: Delta
    logprobs: ChoiceLogprobs | None
    finish_reason: FinishReason | None


class ChatCompletionChunk(_Envelope):
    """One event of a chat stream; with ``stream_options.include_usage`` every chunk has ``usage: null``
    and one last chunk with ``choices: []`` carries the usage."""

    object: Literal["chat.completion.chunk"]
    choices: list[ChunkChoice]
    usage: Usage | None = None


class TextChoice(BaseModel):
    index: int = Field(ge=0)
    text: str
    logprobs: LegacyLogprobs | None
    finish_reason: FinishReason | None


class TextCompletion(_Envelope):
    """``POST /v1/completions`` without ``stream`` (``finish_reason`` is never null here)."""

    object: Literal["text_completion"]
    choices: list[TextChoice]
    usage: Usage


class TextCompletionChunk(_Envelope):
    object: Literal["text_completion"]
    choices: list[TextChoice]
    usage: Usage | None = None


class Embedding(BaseModel):
    object: Literal["embedding"]
    embedding: list[float] | str = Field(description="floats, or little-endian float32 in base64 "
                                                     "with \"encoding_format\": \"base64\"")
    index: int = Field(ge=0)


class EmbeddingUsage(BaseModel):
    prompt_tokens: int = Field(ge=0)
    total_tokens: int = Field(ge=0)


class EmbeddingList(BaseModel):
    object: Literal["list"]
    model: str
    data: list[Embedding]
    usage: EmbeddingUsage


class Model(BaseModel):
    id: str
    object: Literal["model"]
    created: int = Field(description="the manifest's mtime (Unix seconds)")
    owned_by: str = Field(description="the model's namespace (library for tiny:latest) or its backend")
    parent: str | None = Field(default=None, description="a LoRA adapter's base model (absent for other models)")


class ModelList(BaseModel):
    object: Literal["list"]
    data: list[Model]


class ResponseUsage(BaseModel):
    input_tokens: int = Field(ge=0)
    input_tokens_details: dict[str, int]
    output_tokens: int = Field(ge=0)
    output_tokens_details: dict[str, int] = Field(description="reasoning_tokens: of output_tokens, those spent "
                                                              "thinking")
    total_tokens: int = Field(ge=0)


class OutputItem(BaseModel):
    id: str
    type: Literal["message", "function_call", "reasoning"]
    status: str | None = None
    role: Literal["assistant"] | None = None
    content: list[dict[str, Any]] | None = Field(default=None, description="message: one output_text part")
    call_id: str | None = Field(default=None, description="function_call: a function_call_output answers it")
    name: str | None = None
    arguments: str | None = Field(default=None, description="function_call: the arguments object as JSON text")
    summary: list[dict[str, Any]] | None = Field(default=None, description="reasoning: the thinking")


class ResponseObject(BaseModel):
    """``POST /v1/responses`` without ``stream``, and ``GET /v1/responses/{id}``."""

    id: str
    object: Literal["response"]
    created_at: int
    status: Literal["completed", "incomplete", "in_progress", "failed"]
    model: str
    output: list[OutputItem]
    usage: ResponseUsage | None
    previous_response_id: str | None
    store: bool


class ResponseEvent(BaseModel):
    """One event of a Responses stream: ``response.created`` … ``response.completed``."""

    type: str
    sequence_number: int = Field(ge=0)


class ResponseDeleted(BaseModel):
    id: str
    object: Literal["response.deleted"]
    deleted: bool


# -- the ``responses=`` of each route -------------------------------------------------------------

def _errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    return error_responses(OpenAIError, statuses)


_BACKEND = (400, 404, 429, 502, 503, 504)  # a model answers: bad request, unknown model, backend failures


def _generation(model: type[BaseModel], chunk: type[BaseModel], what: str) -> dict[int | str, dict[str, Any]]:
    return {200: {"model": model, "description": f"the {what}; with \"stream\": true an SSE stream of chunks "
                                                 "ending with data: [DONE]",
                  "content": sse_content(chunk, OpenAIError)},
            **_errors(*_BACKEND)}


def chat_responses() -> dict[int | str, dict[str, Any]]:
    return _generation(ChatCompletion, ChatCompletionChunk, "chat completion")


def completion_responses() -> dict[int | str, dict[str, Any]]:
    return _generation(TextCompletion, TextCompletionChunk, "text completion")


def embedding_responses() -> dict[int | str, dict[str, Any]]:
    return {200: {"model": EmbeddingList, "description": "one embedding per input, in order"}, **_errors(*_BACKEND)}


def models_responses() -> dict[int | str, dict[str, Any]]:
    return {200: {"model": ModelList, "description": "the models this server answers for"}, **_errors()}


def model_responses() -> dict[int | str, dict[str, Any]]:
    return {200: {"model": Model, "description": "the model"}, **_errors(404)}


def responses_responses() -> dict[int | str, dict[str, Any]]:
    return {200: {"model": ResponseObject, "description": "the response; with \"stream\": true a stream of named "
                                                         "events ending with response.completed (or .incomplete, "
                                                         ".failed)",
                  "content": named_sse_content([ResponseEvent], OpenAIError)},
            **_errors(*_BACKEND)}


def stored_response_responses(*, deleted: bool = False) -> dict[int | str, dict[str, Any]]:
    model = ResponseDeleted if deleted else ResponseObject
    return {200: {"model": model, "description": "the stored response" if not deleted else "it is gone"},
            **_errors(404)}
