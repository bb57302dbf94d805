"""The one protocol every backend implements, in-process or remote.

A backend streams a request as :class:`Chunk` events followed by exactly one :class:`Done`
(usage + timings + finish reason): the ``Done`` is the only way a backend reports a request's end.

- Errors raised before the first event are request errors (``core.errors``); the gateway waits
  for the first event before it sends response headers, so those become proper 4xx answers.
- A failure after the first event raises the mapped error with ``partial`` set to the ``Done`` of
  what was generated (``BackendError.partial``).
- ``request.cancel.cancel()`` (the client went away) makes the backend stop generating, free its
  slot and end the stream with ``Done(finish_reason="cancelled")`` counting what it generated.
- Closing the iterator early also stops generation and frees the slot, but reports nothing.
- Consumers read events without awaiting anything else in between (the gateway's pump task does):
  a backend may keep one deadline running across its yields.

    router = Router(local=LocalEngines(...), remotes={...})
    backend = router.resolve(request)            # once per request
    async for event in backend.stream(request):  # Chunk, Chunk, ..., Done
        ...

Local engines (llama.cpp, native) also implement :class:`LocalBackend`: ``details``, ``load``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import suppress
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, TypeVar, runtime_checkable

T = TypeVar("T")

FinishReason = Literal["stop", "length", "cancelled", "error"]


class CancelToken:
    """Set once when the consumer of a stream gives up (client gone, shutdown).

    Backends register what stops their work (``on_cancel``); callbacks run on the event loop
    thread at the moment of cancellation, or at once when registered after it.
    """

    __slots__ = ("_cancelled", "_callbacks")

    def __init__(self) -> None:
        self._cancelled = False
        self._callbacks: list[Callable[[], None]] = []

    @property
    def cancelled(self) -> bool:
        return self._cancelled

    def cancel(self) -> None:
        if self._cancelled:
            return
        self._cancelled = True
        callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback()

    def on_cancel(self, callback: Callable[[], None]) -> None:
        if self._cancelled:
            callback()
        else:
            self._callbacks.append(callback)


async def until_cancelled(events: AsyncIterator[T], token: CancelToken) -> AsyncIterator[T]:
    """``events`` until ``token`` fires; then ``events`` is closed (which aborts its work) and this ends.

    For backends whose inner stream has no cheaper way to be interrupted (the native engine).
    """
    fired = asyncio.get_running_loop().create_future()
    token.on_cancel(lambda: fired.done() or fired.set_result(None))
    step: asyncio.Future | None = None
    try:
        while not fired.done():
            step = asyncio.ensure_future(anext(events))
            await asyncio.wait((step, fired), return_when=asyncio.FIRST_COMPLETED)
            if not step.done():
                return
            try:
                item = step.result()
            except StopAsyncIteration:
                return
            yield item
    finally:
        if step is not None and not step.done():
            step.cancel()
            with suppress(asyncio.CancelledError, StopAsyncIteration):
                await step
        await events.aclose()


@dataclass
class GenerationRequest:
    """A chat (``messages``) or completion (``prompt``) request in one normalised shape.

    ``options`` holds request-level Ollama option overrides (already mapped from OpenAI names by
    the API layer); the backend applies the model's own params layer underneath them. ``engine``
    picks the in-process engine for a store model (None = the server's default); it is routing,
    not sampling, so it is not an option.
    """

    model: str
    engine: str | None = None  # llamacpp | native; checked by the router
    messages: list[dict[str, Any]] | None = None
    prompt: str | None = None
    # A completion prompt given as token ids (OpenAI ``/v1/completions``, as vLLM takes it): the
    # in-process engines feed them to the model as they are, an OpenAI-compatible remote gets them as
    # they are, other backends refuse them (400). ``prompt`` is then "".
    prompt_tokens: list[int] | None = None
    system: str | None = None
    template: str | None = None  # Ollama /api/generate "template" override
    raw: bool = False
    tools: list[dict[str, Any]] | None = None  # passed to the chat template (.Tools / tools)
    # None/"auto", "none", "required", or {"type": "function", "function": {"name": ...}} (frontend/tools/wire.py)
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool = True  # False: at most one call per answer
    suffix: str | None = None
    # Thinking (Ollama's ``think``): None = the model's default, True/False, or a level "low"/"medium"/"high".
    # A model whose template thinks gets it as ``.Think``/``.ThinkLevel`` (Go) or ``enable_thinking`` and
    # ``reasoning_effort`` (Jinja); its output is split into thinking and text (frontend/reasoning.py).
    think: bool | str | None = None
    options: dict[str, Any] = field(default_factory=dict)
    format: str | dict | None = None  # "json" or a JSON schema
    logprobs: bool = False
    top_logprobs: int = 0
    truncate: bool = False  # drop the oldest messages instead of failing when over context
    # OpenAI semantics: num_predict that cannot fit after the prompt is a 400 (vLLM), not a clamp.
    strict_max_tokens: bool = False
    keep_alive: float | None = None  # seconds; None = server default, < 0 = forever
    stream: bool = True  # whether the client reads a stream (a remote adapter may ask for one reply)
    # What the client's API needs beyond text and final usage, for a remote adapter to ask its server:
    # ``timed``: per-token timings (Ollama's eval_duration), so it streams even for one reply;
    # ``early_usage``: the prompt's size with the first chunk (Anthropic's message_start).
    timed: bool = False
    early_usage: bool = False
    # An Ollama /api/generate prompt without ``raw``: the model's chat template wraps it (with ``system``
    # as the system message). In-process engines render it; a remote chat server gets it as a chat.
    templated: bool = False
    # Fields of the client's body the gateway does not act on (vLLM's top_k, min_p, repetition_penalty,
    # echo, prompt_logprobs, ...): passed as given to a backend that takes them (``passes_fields``).
    extra: dict[str, Any] = field(default_factory=dict)
    source: str = "gateway"  # who asked: "gateway", "cli", "bench"
    client: str | None = None
    arrival: float = field(default_factory=time.perf_counter)
    cancel: CancelToken = field(default_factory=CancelToken, repr=False, compare=False)
    # Routes with SLOs (``routing/``): a client may tighten the route's SLO and set a priority
    # (headers x-slo-ttft-ms, x-slo-tpot-ms, x-priority); negative priorities are shed first.
    priority: int = 0
    slo_ttft_ms: float | None = None
    slo_tpot_ms: float | None = None
    # API keys (``gateway/policy/admission.py``): who sent it (the gateway's access principal), the ledger
    # key's name for its row, and, for a request with a ledger key, ``admit``: a backend that sets
    # ``admits = True`` awaits ``admit(prompt_tokens, context, served_by)`` once it has counted the
    # prompt and before it generates anything (``served_by``: the name its cost is priced under); the
    # answer is the most tokens it may generate (None: no bound), which it enforces, or an error
    # (429/503) it raises as the request's. The gateway admits a request itself, with an upper bound
    # of its prompt, before starting a backend without ``admits``.
    # Prefill/decode disaggregation (``routing/disagg.py``): the one id both legs carry (vLLM's
    # ``X-Request-Id``), and the fields the orchestrator adds to an OpenAI-compatible body (vLLM's
    # ``kv_transfer_params``, SGLang's ``bootstrap_host``/``bootstrap_port``/``bootstrap_room``).
    request_id: str | None = None
    disagg_fields: dict[str, Any] | None = None
    caller: Any = field(default=None, repr=False, compare=False)
    key_name: str | None = None
    admit: Callable[[int, int | None, str | None], Awaitable[int | None]] | None = field(
        default=None, repr=False, compare=False)

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
class ToolCall:
    """One function call the model made; ``arguments`` is the JSON text of an object (OpenAI's wire form)."""

    name: str
    arguments: str
    id: str = ""


@dataclass(slots=True)
class Chunk:
    """A piece of generated text; ``token_ids`` when the backend knows them; ``tool_calls`` completed
    in this piece (each call arrives whole, in one chunk); ``thinking``: reasoning text generated in
    this piece (a reasoning model's ``<think>`` part, or a backend's ``reasoning_content``), never in ``text``."""

    text: str
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] | None = None
    tool_calls: list[ToolCall] = field(default_factory=list)
    thinking: str = ""
    input_tokens: int | None = None  # the prompt's size, when the backend says it early (request.early_usage)


UsageSource = Literal["engine", "backend", "estimated"]


@dataclass
class Usage:
    """Token counts; ``source`` says who counted: an in-process engine, a remote backend's own report,
    or our estimate with a tokenizer (a remote backend that reported nothing)."""

    input_tokens: int = 0
    output_tokens: int = 0
    cached_input_tokens: int | None = None
    source: UsageSource = "engine"
    # Of ``output_tokens``, those spent thinking (OpenAI's completion_tokens_details.reasoning_tokens);
    # None: the backend neither reported nor generated any thinking.
    reasoning_tokens: int | None = None


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
    draft_tokens: int = 0  # speculative decoding: draft tokens the target verified (llama-server's draft_n)
    accepted_tokens: int = 0  # of which it accepted (draft_n_accepted)

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
    stop_sequence: str | None = None  # the request's stop string that ended it, when the backend says which
    # Set by a route (``routing/``): which of its backends served, after how many attempts, and the
    # SLO parts missed (None: no SLO; empty: met).
    route: str | None = None
    served_by: str | None = None
    attempts: int = 1
    slo_missed: tuple[str, ...] | None = None
    expected_cached_tokens: int | None = None  # the prompt tokens the route's prefix index expected cached there
    # Fields of the backend's choice the gateway does not build itself (vLLM's prompt_logprobs with a
    # request's ``extra``), for the OpenAI routes to return as they came.
    choice_fields: dict[str, Any] = field(default_factory=dict)
    # Disaggregated (``routing/disagg.py``): the worker that prefilled the prompt (``served_by`` decoded
    # it) and the prefill leg's seconds.
    prefill_by: str | None = None
    prefill_s: float | None = None
    # A prefill leg's answer (the native engine's ``kv_transfer_params``: where its KV blocks are), which
    # the OpenAI API returns as vLLM does.
    kv_transfer_params: dict[str, Any] | None = None


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
    parent: str | None = None  # a LoRA adapter's base model (vLLM's /v1/models `parent`); None: not an adapter


@dataclass
class LoadedModel:
    name: str
    backend: str
    size: int
    digest: str
    expires_at: float | None  # wall-clock epoch seconds; None = never
    context_length: int
    # A runner's: its process (``infer run --local``: the CLI's own), resident bytes, "loading" | "ready" |
    # "stopping", requests in flight.
    pid: int | None = None
    memory: int | None = None
    state: str = "ready"
    active: int = 0
    pids: list[int] = field(default_factory=list)  # every process of the runner, rank 0 first
    tensor_parallel: int = 1  # ranks the model is split over


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

    async def embed(self, model: str, inputs: list[str] | list[list[int]], *, truncate: bool = True,
                    keep_alive: float | None = None) -> EmbedResult:
        """One vector per input; inputs are texts, or token-id lists (``/v1/embeddings``) which a
        backend embeds as they are, passes on, or refuses with InvalidRequest."""
        ...

    async def health(self) -> Health: ...

    async def list_models(self) -> list[ModelInfo]: ...

    async def loaded_models(self) -> list[LoadedModel]: ...

    async def unload(self, model: str) -> bool: ...

    async def aclose(self) -> None: ...


@runtime_checkable
class LocalBackend(Backend, Protocol):
    """A local engine serving the local store (``RunnerBackend``: its models in runners, processes of
    ``infer serve`` or threads of ``infer run --local``): it knows each model's details and can load a
    model without generating (Ollama's preload)."""

    def details(self, model: str) -> Any: ...  # registry.details.ModelDetails; ModelNotFound if absent

    async def load(self, model: str, options: dict[str, Any] | None = None,
                   keep_alive: float | None = None) -> None: ...
