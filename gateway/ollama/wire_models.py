"""What the Ollama routes answer, declared for the OpenAPI schema only.

The bodies are built as dicts in :mod:`gateway.ollama.views` and sent as orjson bytes; these
models only feed the route decorators' ``responses=`` (no run-time validation), so
``/openapi.json`` states each route's statuses and bodies and the fuzz tier checks real answers
against them. Streams (the default for generate, chat, pull, push and create) are
``application/x-ndjson``: one object per line, the last one ``done: true`` (or ``{"error": ...}``
when the backend fails after the first line).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from gateway.wire_docs import TokenLogprob, error_responses, ndjson_content

__all__ = ["ChatChunk", "ChatFinal", "EmbedResponse", "EmbeddingsResponse", "OllamaError", "GenerateChunk",
           "GenerateFinal", "ListResponse", "ProcessResponse", "ProgressResponse", "ShowResponse",
           "VersionResponse"]

Nanoseconds = Field(ge=0, description="nanoseconds")


class OllamaError(BaseModel):
    """Every error of an ``/api`` route."""

    error: str


class _Record(BaseModel):
    model: str = Field(description="the model name as the request gave it")
    created_at: str = Field(description="RFC 3339 UTC with nanoseconds")


class _Metrics(BaseModel):
    done_reason: Literal["stop", "length"]
    total_duration: int = Nanoseconds
    load_duration: int = Nanoseconds
    prompt_eval_count: int = Field(ge=0)
    prompt_eval_duration: int = Nanoseconds
    eval_count: int = Field(ge=0)
    eval_duration: int = Nanoseconds
    truncated_messages: int | None = Field(default=None, description="old messages dropped to fit (\"truncate\": true)")
    draft_count: int | None = Field(default=None, ge=0, description="speculative decoding: draft tokens verified")
    draft_accepted_count: int | None = Field(default=None, ge=0, description="speculative decoding: drafts accepted")
    logprobs: list[TokenLogprob] | None = None


class GenerateChunk(_Record):
    response: str
    done: Literal[False]
    logprobs: list[TokenLogprob] | None = None


class GenerateFinal(_Record, _Metrics):
    """The last line of a stream, or the whole answer with ``"stream": false`` (then with the text)."""

    response: str
    done: Literal[True]
    context: list[int] | None = Field(default=None, description="prompt and output token ids; absent with raw")


class GenerateLoad(_Record):
    """An empty prompt loads the model (``keep_alive: 0`` unloads it)."""

    response: Literal[""]
    done: Literal[True]
    done_reason: Literal["load", "unload"]


class ToolCallFunction(BaseModel):
    index: int = Field(ge=0)
    name: str
    arguments: dict[str, Any] = Field(description="an object (OpenAI's API sends JSON text)")


class ToolCall(BaseModel):
    id: str
    function: ToolCallFunction


class AssistantMessage(BaseModel):
    role: Literal["assistant"]
    content: str
    tool_calls: list[ToolCall] | None = Field(default=None, description="the model's calls, in a chunk of their own "
                                                                        "when streaming (content is then empty)")


class ChatChunk(_Record):
    message: AssistantMessage = Field(description="content is never empty in a chunk, except one carrying tool_calls")
    done: Literal[False]
    logprobs: list[TokenLogprob] | None = None


class ChatFinal(_Record, _Metrics):
    message: AssistantMessage
    done: Literal[True]


class ChatLoad(_Record):
    message: AssistantMessage
    done: Literal[True]
    done_reason: Literal["load", "unload"]


class EmbedResponse(BaseModel):
    model: str
    embeddings: list[list[float]] = Field(description="one vector per input; [] for a load request")
    total_duration: int | None = Field(default=None, ge=0, description="nanoseconds; absent for a load request")
    load_duration: int | None = Field(default=None, ge=0, description="nanoseconds")
    prompt_eval_count: int | None = Field(default=None, ge=0)


class EmbeddingsResponse(BaseModel):
    embedding: list[float] = Field(description="[] for a load request (empty prompt)")


class Details(BaseModel):
    parent_model: str
    format: str
    family: str
    families: list[str] | None
    parameter_size: str
    quantization_level: str


class ListModel(BaseModel):
    name: str
    model: str
    modified_at: str = Field(description="RFC 3339, local time")
    size: int = Field(ge=0)
    digest: str
    details: Details
    remote_host: str | None = Field(default=None, description="the remote backend serving it")


class ListResponse(BaseModel):
    models: list[ListModel]


class Runner(BaseModel):
    """infer's addition: the process serving a local model (absent for a remote backend's model)."""

    pid: int
    engine: str
    memory: int = Field(ge=0, description="resident bytes of the runner's processes")
    state: Literal["loading", "ready", "stopping"]
    requests: int = Field(ge=0, description="requests in flight")
    tensor_parallel: int = Field(default=1, ge=1, description="ranks the model is split over, one process each")
    pids: list[int] = Field(default_factory=list, description="every process of the runner, rank 0 (pid) first")


class ProcessModel(BaseModel):
    name: str
    model: str
    size: int = Field(ge=0)
    digest: str
    details: Details
    expires_at: str = Field(description="RFC 3339, local time")
    size_vram: int = Field(ge=0)
    context_length: int | None = None
    runner: Runner | None = None


class RunnerFailure(BaseModel):
    """infer's addition: a local model whose runner crashed and has not finished a request since."""

    name: str
    engine: str
    crashes: int = Field(ge=1, description="crashes in a row")
    error: str = Field(description="why the last one stopped")
    at: str = Field(description="RFC 3339, local time, of the last crash")
    retry_at: str = Field(description="RFC 3339, local time: requests before it get a 503")


class ProcessResponse(BaseModel):
    models: list[ProcessModel]
    failures: list[RunnerFailure] = []


class ShowResponse(BaseModel):
    license: str
    modelfile: str
    parameters: str
    template: str
    system: str
    details: Details
    messages: list[dict[str, Any]]
    model_info: dict[str, Any]
    capabilities: list[str]
    modified_at: str


class ProgressResponse(BaseModel):
    status: str
    digest: str | None = None
    total: int | None = Field(default=None, ge=0)
    completed: int | None = Field(default=None, ge=0)


class VersionResponse(BaseModel):
    version: str


# -- the ``responses=`` of each route -------------------------------------------------------------

Responses = dict[int | str, dict[str, Any]]
_BACKEND = (400, 404, 429, 502, 503, 504)  # a model answers: bad request, unknown model, backend failures


def errors(*statuses: int, guarded: bool = True) -> Responses:
    return error_responses(OllamaError, statuses, guarded=guarded)


def generate_responses() -> Responses:
    return {200: {"model": GenerateFinal | GenerateLoad,
                  "description": "the answer (\"stream\": false, or a load/unload request), or an NDJSON stream",
                  "content": ndjson_content(GenerateChunk, GenerateFinal, OllamaError)},
            **errors(*_BACKEND)}


def chat_responses() -> Responses:
    return {200: {"model": ChatFinal | ChatLoad,
                  "description": "the answer (\"stream\": false, or a load/unload request), or an NDJSON stream",
                  "content": ndjson_content(ChatChunk, ChatFinal, OllamaError)},
            **errors(*_BACKEND)}


def embed_responses() -> Responses:
    return {200: {"model": EmbedResponse, "description": "one vector per input"}, **errors(*_BACKEND)}


def embeddings_responses() -> Responses:
    return {200: {"model": EmbeddingsResponse, "description": "the prompt's vector"}, **errors(*_BACKEND)}


def progress_responses(*statuses: int) -> Responses:
    """pull, push, create: status lines as NDJSON, or ``{"status": "success"}`` with ``"stream": false``."""
    return {200: {"model": ProgressResponse, "description": "done (\"stream\": false), or NDJSON status lines "
                                                            "(the last one an error if the job failed)",
                  "content": ndjson_content(ProgressResponse, OllamaError)},
            **errors(400, *statuses)}


def empty(description: str, *statuses: int) -> Responses:
    """Routes that answer with a status and no body (delete, copy, blob uploads)."""
    return {200: {"description": description}, **errors(400, *statuses)}


def blob_exists_responses() -> Responses:
    return {200: {"description": "the blob is stored"}, 404: {"description": "no such blob"}, **errors(400)}


def blob_upload_responses() -> Responses:
    return {201: {"description": "stored"}, **empty("already stored (the body is not read)", 507)}
