"""What every remote adapter shares: settings, the HTTP client (``client.py``), deadlines, the in-flight
cap, usage accounting and the one place its failures become the project's error tree.

A concrete adapter (``adapters/remote/vllm.py``, ``tgi.py``, …) subclasses :class:`RemoteBackend` and
writes two things: ``generate(request, turn)``, an async generator of :class:`Chunk` that speaks
its protocol (recording reported usage and the finish reason on ``turn``), and, when its error
bodies differ from the common shapes, ``error_from_response``. The base class wraps ``generate``
into the :class:`~core.base.Backend` protocol:

- deadlines: ``first_byte`` from arrival to the first chunk of a stream (time queued for a slot
  included), ``total`` for the whole request, ``connect``/``read`` on every socket operation;
- ``max_inflight``: requests beyond it wait for a slot until their first-byte deadline, then get
  :class:`BackendOverloaded` (429 with ``Retry-After``);
- usage: the backend's figures when it reports them, else counted with the configured tokenizer
  (or a byte estimate) and marked ``estimated``; never zero for a stream that produced text;
- ``request.cancel`` (client gone) interrupts the read in progress and closes the HTTP response,
  so the backend sees the disconnect; the stream ends with a ``cancelled`` Done counting the
  tokens received;
- a failure after the first chunk raises the mapped error with ``partial`` set to the usage so far.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, ClassVar

import aiohttp

from .client import HTTPClient, Response
from core.base import (Chunk, Done, GenerationRequest, Health, LoadedModel, ModelInfo, StreamEvent, Timings,
                                TokenLogprob, Usage)
from core.errors import BackendError, BackendOverloaded, BackendProtocolError, BackendTimeout, InvalidRequest
from .http_errors import Timeouts, error_from_status, map_transport_error
from .metrics_scrape import scrape
from frontend.token_count import ByteBound, TokenCounter, load_counter, prompt_bound
from .wire import parse_json

LOAD_MAX_AGE_S = 0.5  # how old a backend's load figures may be when a route decides or a gauge is read

@dataclass(frozen=True)
class RemoteSettings:
    """One ``backends:`` entry of ``infer serve --config``, validated (see ``gateway/backends_config.py``)."""

    name: str                      # the public model name clients ask for
    type: str                      # vllm, tgi, trtllm, triton, ollama, llamacpp, openai
    base_url: str                  # the server's root, without a trailing /v1
    model: str                     # the backend's own model name
    api_key: str | None = None
    timeouts: Timeouts = field(default_factory=Timeouts)
    max_inflight: int | None = None
    tokenizer: str | None = None   # tokenizer.json or .gguf, for usage the backend does not report
    mode: str | None = None        # tgi: "generate" (native, default) or "messages"
    context_length: int | None = None
    parent: str | None = None      # a LoRA adapter's: the backend serving its base (the request's model is the adapter)


def make_client(settings: RemoteSettings, where: str) -> HTTPClient:
    """A pooled client for one backend: keep-alive connections up to ``max_inflight`` + 1 (no cap when
    unset), so requests never wait for a connection: past ``max_inflight`` they queue for a slot until
    their first-byte deadline and then get 429 with Retry-After, never a pool timeout."""
    size = settings.max_inflight + 1 if settings.max_inflight else 0
    return HTTPClient(settings.base_url, settings.timeouts, size, where)


class Turn:
    """One request's accounting: chunks and their times, reported usage, finish reason."""

    def __init__(self, request: GenerationRequest, counter: TokenCounter, start: float):
        self.request, self.counter, self.start = request, counter, start
        self.queue = 0.0  # waiting for a max_inflight slot, plus the backend's queue time when it reports one
        self.reported: Usage | None = None
        self.finish_reason: str = "stop"
        self.parts: list[str] = []
        self.events = 0  # chunks received, a token count when nothing else is known
        self.token_times: list[float] = []
        self.prompt_eval: float | None = None  # backend-measured, when it says (Ollama, llama.cpp)
        self.eval: float | None = None
        self.thinking: list[str] = []  # reasoning text received (reasoning_content, Ollama's thinking)
        self.new_thinking = ""  # what the last event read carried, for the adapter's next chunk
        self.stop_sequence: str | None = None  # the stop string that ended the reply, when the backend says
        self.new_logprobs: list[TokenLogprob] | None = None  # what the last event read carried
        self.choice_fields: dict[str, Any] = {}  # the backend's choice fields passed on (Done.choice_fields)

    def add(self, chunk: Chunk) -> None:
        self.events += 1
        self.parts.append(chunk.text)
        self.token_times.append(time.perf_counter() - self.request.arrival)
        if chunk.thinking:
            self.thinking.append(chunk.thinking)

    def take_thinking(self) -> str:
        out, self.new_thinking = self.new_thinking, ""
        return out

    def take_logprobs(self) -> list[TokenLogprob] | None:
        out, self.new_logprobs = self.new_logprobs, None
        return out

    @property
    def text(self) -> str:
        return "".join(self.parts)

    def usage(self) -> Usage:
        usage = self._usage()
        if usage.reasoning_tokens is None and self.thinking:  # counted here, as the output is when unreported
            usage.reasoning_tokens = min(usage.output_tokens, max(self.counter.count("".join(self.thinking)), 1))
        return usage

    def _usage(self) -> Usage:
        reported = self.reported
        if reported is not None and (reported.output_tokens > 0 or not self.text):
            if reported.input_tokens or reported.output_tokens == 0:
                return reported
            # Output reported but no input count (Ollama omits zero fields; TGI's /generate has none).
            return Usage(input_tokens=self.counter.prompt_tokens(self.request), output_tokens=reported.output_tokens,
                         cached_input_tokens=reported.cached_input_tokens, source="estimated",
                         reasoning_tokens=reported.reasoning_tokens)
        output = self.text + "".join(self.thinking)
        estimate = Usage(input_tokens=self.counter.prompt_tokens(self.request),
                         output_tokens=max(self.counter.count(output), 1) if output else 0, source="estimated")
        if reported is not None and reported.input_tokens:  # keep the backend's input count
            estimate.input_tokens = reported.input_tokens
        return estimate

    def done(self, finish_reason: str | None = None) -> Done:
        times = self.token_times
        ttft = times[0] if times else None
        timings = Timings(queue=self.queue, ttft=ttft, total=time.perf_counter() - self.request.arrival,
                          token_times=list(times))
        timings.prompt_eval = self.prompt_eval if self.prompt_eval is not None else max(0.0, (ttft or 0.0) - self.queue)
        timings.eval = self.eval if self.eval is not None else (times[-1] - times[0] if len(times) > 1 else 0.0)
        reason = finish_reason or self.finish_reason
        return Done(finish_reason=reason, usage=self.usage(), timings=timings,  # type: ignore[arg-type]
                    stop_sequence=self.stop_sequence, choice_fields=self.choice_fields)


class RemoteBackend:
    """Base of the HTTP adapters; see the module docstring."""

    type: ClassVar[str] = ""
    health_path: ClassVar[str] = "/health"
    can_stream = True
    supports_embeddings = False
    admits = True  # calls request.admit (a key's budget and limits) before sending (base.GenerationRequest)
    takes_token_ids = False  # prompts and embedding inputs given as token-id lists (OpenAI-compatible servers)

    def __init__(self, settings: RemoteSettings, client: HTTPClient | None = None,
                 counter: TokenCounter | None = None):
        self.settings = settings
        self._owns_client = client is None
        self.client = client if client is not None else make_client(settings, self.where)
        self.counter = counter if counter is not None else load_counter(settings.tokenizer)
        self.bound = self.counter if settings.tokenizer else ByteBound()  # a prompt's tokens at most
        self._slots = asyncio.Semaphore(settings.max_inflight) if settings.max_inflight else None
        self.num_waiting = 0  # requests queued in the gateway for a max_inflight slot
        # The last load figures read from the backend (load_metrics) and when (time.monotonic()).
        self.reported_load: dict[str, float] = {}
        self.reported_at = -math.inf
        self._reading: asyncio.Future | None = None
        # Tracing on: adds the current span's ``traceparent`` to a header dict (``gateway/observability/tracing.py``).
        self.inject: Callable[[dict[str, str]], None] | None = None

    @property
    def name(self) -> str:
        return self.type

    @property
    def where(self) -> str:
        return f"{self.type} backend '{self.settings.name}' at {self.settings.base_url}"

    # -- what subclasses write ------------------------------------------------------------------

    def generate(self, request: GenerationRequest, turn: Turn) -> AsyncIterator[Chunk]:
        raise NotImplementedError

    def error_from_response(self, status: int, body: bytes, headers: Mapping[str, str]) -> BackendError:
        """The one mapping of this backend's error replies; override for a different body shape."""
        return error_from_status(self.where, status, error_message(body), headers, **error_fields(body))

    def lists(self, ids: list[str]) -> bool:
        """Whether the backend's model listing ``ids`` includes the configured model."""
        return self.settings.model in ids

    async def models(self) -> list[str]:
        """The backend's own model ids (``backends check``); OpenAI-compatible servers by default."""
        body = await self.get_json("/v1/models")
        return [str(m.get("id")) for m in body.get("data", []) if isinstance(m, dict)]

    # -- the Backend protocol ---------------------------------------------------------------------

    async def stream(self, request: GenerationRequest) -> AsyncIterator[StreamEvent]:
        if request.prompt_tokens is not None and not self.takes_token_ids:
            raise InvalidRequest(f"the {self.type} backend takes prompts as text, not token ids; send the prompt "
                                 "as text", param="prompt")
        if request.admit is not None:
            await self.admit_request(request)
        turn = Turn(request, self.counter, time.perf_counter())
        deadline = request.arrival + self.settings.timeouts.total
        first_byte = request.arrival + self.settings.timeouts.first_byte
        # A one-reply call (client not streaming) has only the total deadline.
        limit = min(first_byte, deadline) if request.stream else deadline
        async with self._slot(first_byte, turn):
            events = self.generate(request, turn)
            try:
                async with asyncio.timeout_at(_loop_time(limit)) as timer:
                    # cancel: the read in progress ends now (a TimeoutError that the loop below tells apart)
                    request.cancel.on_cancel(lambda: _cut(timer))
                    async for chunk in events:
                        if not turn.events and limit != deadline:
                            timer.reschedule(_loop_time(deadline))
                        turn.add(chunk)
                        yield chunk
                        if request.cancel.cancelled:
                            break
            except TimeoutError:
                if not request.cancel.cancelled:
                    raise self._timeout(turn) from None
            except (asyncio.CancelledError, GeneratorExit):
                raise
            except Exception as exc:
                raise self._failure(exc, turn) from exc
            finally:
                await events.aclose()  # closes the HTTP response: the backend sees the disconnect
            yield turn.done("cancelled" if request.cancel.cancelled else None)

    async def admit_request(self, request: GenerationRequest) -> None:
        """A keyed request's admission before anything is sent: the prompt's upper bound (its tokenizer's
        count, else its bytes, plus template overhead) and the configured context; the answer caps the
        output the backend is asked for."""
        assert request.admit is not None
        cap = await request.admit(prompt_bound(request, self.bound), self.settings.context_length, self.settings.name)
        asked = request.options.get("num_predict")
        if cap is not None and not (isinstance(asked, int) and 0 < asked <= cap):
            request.options = {**request.options, "num_predict": cap}

    def to_error(self, exc: BaseException) -> BackendError:
        """Any failure while talking to the backend, as the project's error."""
        if isinstance(exc, BackendError):
            return exc
        if isinstance(exc, aiohttp.ClientError):
            return map_transport_error(exc, self.where, self.settings.timeouts)
        return BackendProtocolError(f"{self.where} sent a reply we cannot read ({type(exc).__name__}: {exc})")

    async def health(self) -> Health:
        health = await self.probe(self.health_path)
        if health.ok:
            health.metrics = await self._read_load()
        return health

    async def fresh_load(self, max_age: float = LOAD_MAX_AGE_S) -> dict[str, float]:
        """The backend's load figures (running, waiting, KV use) no older than ``max_age`` seconds: the
        last ones read, or read now, one read at a time however many requests ask (a route deciding,
        a scrape of the gateway's ``/metrics``)."""
        if time.monotonic() - self.reported_at <= max_age:
            return self.reported_load
        if self._reading is None or self._reading.done():
            self._reading = asyncio.ensure_future(self._read_load())
        return await asyncio.shield(self._reading)

    async def _read_load(self) -> dict[str, float]:
        """One read; kept unless a read started later has been kept already (a health check's read and a
        route's may overlap). Its age counts from when it was sent."""
        started = time.monotonic()
        load = await self.load_metrics()
        if started >= self.reported_at:
            self.reported_load, self.reported_at = load, started
        return load

    async def probe(self, path: str) -> Health:
        """``GET path``: healthy on a 200, with the round trip's latency."""
        t0 = time.perf_counter()
        try:
            response = await self.client.get(path, self.headers())
        except Exception as exc:
            return Health(ok=False, detail=self.to_error(exc).message)
        ok = response.status_code == 200
        return Health(ok=ok, detail="ok" if ok else f"{path} answered {response.status_code}",
                      latency_ms=(time.perf_counter() - t0) * 1000)

    def current_load(self) -> dict[str, float]:
        """The gateway's side of this backend's queue: requests waiting for a ``max_inflight`` slot."""
        return {"requests_waiting": float(self.num_waiting)}

    async def load_metrics(self) -> dict[str, float]:
        """Load signals for routing (requests_running, requests_waiting, kv_cache_usage); {} when unknown."""
        return {}

    async def prometheus_metrics(self, names: dict[str, str], labels: dict[str, str] | None = None,
                                 ratios: frozenset[str] = frozenset()) -> dict[str, float]:
        """``names`` scraped from the backend's Prometheus ``/metrics``; {} when it is off or unreadable
        (load signals are advisory: a broken page must not fail the health check)."""
        try:
            response = await self.client.get("/metrics", self.headers())
            return scrape(response.text, names, labels, ratios) if response.status_code == 200 else {}
        except Exception:
            return {}

    async def list_models(self) -> list[ModelInfo]:
        return [ModelInfo(name=self.settings.name, backend=self.type, family=self.type,
                          context_length=self.settings.context_length, owned_by=self.settings.type,
                          parent=self.settings.parent)]

    async def loaded_models(self) -> list[LoadedModel]:
        return []

    async def unload(self, model: str) -> bool:
        return False

    async def embed(self, model: str, inputs: list[str], *, truncate: bool = True, keep_alive: float | None = None):
        raise InvalidRequest(f"the {self.type} backend does not serve embeddings", param="model")

    async def aclose(self) -> None:
        if self._owns_client:
            await self.client.aclose()

    # -- helpers for subclasses ---------------------------------------------------------------------

    def headers(self, request_id: str | None = None) -> dict[str, str]:
        """Every request's headers: the key, the current trace context when tracing is on, and the
        request's id (``X-Request-Id``) when the gateway gave it one."""
        headers = {"Authorization": f"Bearer {self.settings.api_key}"} if self.settings.api_key else {}
        if request_id is not None:
            headers["X-Request-Id"] = request_id
        if self.inject is not None:
            self.inject(headers)
        return headers

    @asynccontextmanager
    async def post_stream(self, path: str, body: dict[str, Any], accept: str = "text/event-stream",
                          request_id: str | None = None):
        """POST ``body`` and yield the streaming response once its status is known to be a success."""
        reply = await self.client.stream(path, body, {**self.headers(request_id), "Accept": accept})
        try:
            if reply.status_code >= 400:
                raise self.error_from_response(reply.status_code, await reply.aread(), reply.headers)
            yield reply
        finally:
            await reply.aclose()

    async def post_json(self, path: str, body: dict[str, Any], request_id: str | None = None) -> Any:
        return self._json(await self.client.post(path, body, self.headers(request_id)))

    async def get_json(self, path: str) -> Any:
        return self._json(await self.client.get(path, self.headers()))

    def _json(self, response: Response) -> Any:
        if response.status_code >= 400:
            raise self.error_from_response(response.status_code, response.content, response.headers)
        return parse_json(response.content)

    # -- internals ----------------------------------------------------------------------------------

    @asynccontextmanager
    async def _slot(self, first_byte: float, turn: Turn):
        if self._slots is None:
            yield
            return
        self.num_waiting += 1
        try:
            async with asyncio.timeout_at(_loop_time(first_byte)):
                await self._slots.acquire()
        except TimeoutError:
            raise BackendOverloaded(f"{self.where} has {self.settings.max_inflight} requests in flight "
                                    "(max_inflight); retry later", retry_after=1.0) from None
        finally:
            self.num_waiting -= 1
        turn.queue = time.perf_counter() - turn.start
        try:
            yield
        finally:
            self._slots.release()

    def _timeout(self, turn: Turn) -> BackendTimeout:
        t = self.settings.timeouts
        if not turn.events:
            return BackendTimeout(f"{self.where} sent no token within {t.first_byte:g} s (first_byte timeout)")
        return BackendTimeout(f"{self.where} did not finish within {t.total:g} s (total timeout)")

    def _failure(self, exc: BaseException, turn: Turn) -> BackendError:
        error = self.to_error(exc)
        if turn.events:
            error.partial = turn.done("error")
        return error


def error_message(body: bytes) -> str:
    """The human message inside an error body of any common shape (OpenAI, flat, TGI, FastAPI)."""
    text = body.decode("utf-8", errors="replace").strip()
    try:
        value = parse_json(text) if text else None
    except BackendError:
        return text[:500]
    return message_of(value) or text[:500]


def error_fields(body: bytes) -> dict[str, Any]:
    """``param`` and ``code`` of an OpenAI-shaped error body (``{"error": {message, type, param, code}}``),
    each when the backend set it."""
    try:
        error = parse_json(body).get("error")
    except (BackendError, AttributeError):
        return {}
    if not isinstance(error, dict):
        return {}
    return {k: error[k] for k in ("param", "code") if isinstance(error.get(k), (str, int))}


def message_of(value: Any) -> str:
    if isinstance(value, str):
        return value
    if not isinstance(value, dict):
        return ""
    for key in ("error", "message", "detail"):
        inner = value.get(key)
        if isinstance(inner, str) and inner:
            return inner
        if isinstance(inner, dict):
            return message_of(inner)
        if isinstance(inner, list) and inner:  # FastAPI/pydantic validation details
            return "; ".join(str(e.get("msg", e)) if isinstance(e, dict) else str(e) for e in inner)
    return ""


def _cut(timer: asyncio.Timeout) -> None:
    """End the read in progress now; nothing to do once the request has left the timer's block."""
    try:
        timer.reschedule(asyncio.get_running_loop().time())
    except RuntimeError:  # "Cannot change state of finished Timeout": the stream already ended
        pass


def _loop_time(perf_deadline: float) -> float:
    """A ``time.perf_counter`` deadline on the event loop's clock."""
    return asyncio.get_running_loop().time() + (perf_deadline - time.perf_counter())


__all__ = ["RemoteBackend", "RemoteSettings", "Timeouts", "Turn", "error_fields", "error_message", "make_client",
           "message_of"]
