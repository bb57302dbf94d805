"""The one protocol every backend implements, in-process or remote.

A backend streams a request as :class:`Chunk` events followed by exactly one :class:`Done`
(usage + timings + finish reason). Errors raised before the first event are request errors
(``adapters.errors``); the gateway waits for the first event before it sends response headers,
so those become proper 4xx answers. Closing the iterator early (client gone) cancels generation
and frees the slot; the backend still reports what it generated through ``request.on_done``.

    backend = registry.create("llamacpp", settings)
    async for event in backend.stream(GenerationRequest(model="qwen2:0.5b", messages=[...])):
        ...
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

FinishReason = Literal["stop", "length", "cancelled", "error"]


@dataclass
class GenerationRequest:
    """A chat (``messages``) or completion (``prompt``) request in one normalised shape.

    ``options`` holds request-level Ollama option overrides (already mapped from OpenAI names by
    the API layer); the backend applies the model's own params layer underneath them.
    """

    model: str
    messages: list[dict[str, Any]] | None = None
    prompt: str | None = None
    system: str | None = None
    template: str | None = None  # Ollama /api/generate "template" override
    raw: bool = False
    tools: list[dict[str, Any]] | None = None  # passed to the chat template (.Tools / tools)
    suffix: str | None = None
    options: dict[str, Any] = field(default_factory=dict)
    format: str | dict | None = None  # "json" or a JSON schema
    logprobs: bool = False
    top_logprobs: int = 0
    truncate: bool = False  # drop the oldest messages instead of failing when over context
    # OpenAI semantics: num_predict that cannot fit after the prompt is a 400 (vLLM), not a clamp.
    strict_max_tokens: bool = False
    keep_alive: float | None = None  # seconds; None = server default, < 0 = forever
    stream: bool = True  # whether the client reads a stream (a remote adapter may ask for one reply)
    source: str = "gateway"  # who asked: "gateway", "cli", "bench"
    client: str | None = None
    arrival: float = field(default_factory=time.perf_counter)
    # Called once with the final record, even when the consumer stopped reading mid-stream
    # (a client disconnect): the ledger counts the tokens generated for abandoned requests.
    on_done: Callable[["Done"], None] | None = field(default=None, repr=False, compare=False)

    @property
    def is_chat(self) -> bool:
        return self.messages is not None


@dataclass
class TokenLogprob:
    token: str
    logprob: float
    bytes: list[int]
    top_logprobs: list["TokenLogprob"] = field(default_factory=list)


@dataclass
class Chunk:
    """A piece of generated text; ``token_ids`` when the backend knows them."""

    text: str
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] | None = None


UsageSource = Literal["engine", "backend", "estimated"]


@dataclass
class Usage:
    """Token counts; ``source`` says who counted: an in-process engine, a remote backend's own report,
    or our estimate with a tokenizer (a remote backend that reported nothing)."""

    input_tokens: int = 0
    output_tokens: int = 0
    cached_input_tokens: int | None = None
    source: UsageSource = "engine"


@dataclass
class Timings:
    """Seconds, measured by the backend on ``time.perf_counter``.

    ``prompt_eval`` runs from the start of prompt processing to the first token; ``eval`` from the
    first to the last token. ``token_times`` are the arrival times of each output token relative to
    ``GenerationRequest.arrival``.
    """

    queue: float = 0.0
    load: float = 0.0
    prompt_eval: float = 0.0
    eval: float = 0.0
    ttft: float | None = None
    total: float = 0.0
    token_times: list[float] = field(default_factory=list)

    @property
    def tpot(self) -> float | None:
        n = len(self.token_times)
        if n < 2 or self.ttft is None:
            return None
        return (self.token_times[-1] - self.token_times[0]) / (n - 1)


@dataclass
class Done:
    finish_reason: FinishReason
    usage: Usage
    timings: Timings
    prompt_tokens: list[int] | None = None  # the prompt as tokenized (Ollama's "context")
    output_tokens: list[int] | None = None
    truncated_messages: int = 0  # messages dropped because the request allowed truncation


StreamEvent = Chunk | Done


@dataclass
class ModelInfo:
    name: str
    backend: str
    size: int = 0
    digest: str = ""
    modified: float = 0.0
    family: str = ""
    parameter_size: str = ""
    quantization_level: str = ""
    context_length: int | None = None
    owned_by: str | None = None  # a remote backend's type; None = the local store (namespace)


@dataclass
class LoadedModel:
    name: str
    backend: str
    size: int
    digest: str
    expires_at: float | None  # wall-clock epoch seconds; None = never
    context_length: int


@dataclass
class Health:
    ok: bool
    detail: str = ""
    latency_ms: float | None = None
    # Load signals a router can use, when the backend exposes them (vLLM's /metrics and the like):
    # requests_running, requests_waiting, kv_cache_usage (0-1).
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass
class EmbedResult:
    embeddings: list[list[float]]
    input_tokens: int
    load: float = 0.0
    total: float = 0.0


@runtime_checkable
class Backend(Protocol):
    """What the gateway and the CLI call. One module per implementation under ``adapters/``."""

    name: str
    can_stream: bool
    supports_embeddings: bool

    def stream(self, request: GenerationRequest) -> AsyncIterator[StreamEvent]: ...

    async def embed(self, model: str, inputs: list[str], *, truncate: bool = True,
                    keep_alive: float | None = None) -> EmbedResult: ...

    async def health(self) -> Health: ...

    async def list_models(self) -> list[ModelInfo]: ...

    async def loaded_models(self) -> list[LoadedModel]: ...

    async def unload(self, model: str) -> bool: ...

    async def aclose(self) -> None: ...


BackendFactory = Callable[..., Backend]
_REGISTRY: dict[str, BackendFactory] = {}


def register_backend(name: str, factory: BackendFactory) -> None:
    _REGISTRY[name] = factory


def create_backend(name: str, **kwargs: Any) -> Backend:
    _load_builtins()
    try:
        factory = _REGISTRY[name]
    except KeyError:
        known = ", ".join(sorted(_REGISTRY)) or "none"
        raise ValueError(f"unknown backend '{name}' (known: {known})") from None
    return factory(**kwargs)


def _load_builtins() -> None:
    """Built-in adapters register through the same call third-party ones use."""
    from importlib.metadata import entry_points

    from . import llamacpp  # noqa: F401  (registers itself)

    for ep in entry_points(group="infer.adapters"):
        if ep.name not in _REGISTRY:
            register_backend(ep.name, ep.load())


def serving_backend(backend: Backend, options: dict[str, Any] | None = None, *, embedding: bool = False,
                    model: str | None = None) -> Backend:
    """The backend that serves a request: a composite backend (one with ``for_request``) picks one of its own."""
    pick = getattr(backend, "for_request", None)
    return pick(options, embedding=embedding, model=model) if pick is not None else backend
