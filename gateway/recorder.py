"""Run one generation through a backend and account for it: metrics, and one ledger row.

``Recorder.start`` calls ``backend.stream`` and waits for the first event, so request errors
(unknown model, prompt over the context) surface before any response header is sent. The returned
:class:`Generation` iterates the remaining events. Exactly one ledger row is written per request:
from the backend's final record (also for clients that went away mid-stream: status
``cancelled`` with the tokens generated) or from the error.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from sqlalchemy import Engine

from adapters.base import Backend, Chunk, Done, GenerationRequest, StreamEvent, serving_backend

from .errors import to_status_message
from .metrics import GatewayMetrics
from .usage import UsageRecord, log_usage

log = logging.getLogger(__name__)


@dataclass
class Recorder:
    engine: Engine | None
    metrics: GatewayMetrics | None = None
    _writes: set[asyncio.Task] = field(default_factory=set)

    async def start(self, backend: Backend, request: GenerationRequest, *, route: str,
                    stream: bool) -> "Generation":
        request.stream = stream  # a remote adapter asks its backend for one reply when the client wants one
        gen = Generation(self, backend, request, route, stream)
        await gen.prime()
        return gen

    def record(self, record: UsageRecord) -> None:
        if self.metrics is not None:
            _observe(self.metrics, record)
        if self.engine is None:
            return
        task = asyncio.get_running_loop().create_task(asyncio.to_thread(log_usage, self.engine, record))
        self._writes.add(task)
        task.add_done_callback(self._writes.discard)

    async def drain(self) -> None:
        """Wait for pending ledger writes (shutdown, tests)."""
        while self._writes:
            await asyncio.gather(*list(self._writes), return_exceptions=True)


class Generation:
    """Events of one request after the first has arrived; ``done`` is set at the end."""

    def __init__(self, recorder: Recorder, backend: Backend, request: GenerationRequest, route: str, stream: bool):
        self.recorder, self.backend, self.request = recorder, serving_backend(backend, request.options, model=request.model), request
        self.route, self.stream = route, stream
        self.first: StreamEvent | None = None
        self.done: Done | None = None
        self._recorded = False
        request.on_done = self._on_done
        self._events = backend.stream(request)

    async def prime(self) -> None:
        self._in_flight(+1)
        try:
            self.first = await anext(self._events)
        except StopAsyncIteration:
            self.first = None
        except BaseException as exc:
            self._on_error(exc)
            raise

    async def __aiter__(self) -> AsyncIterator[StreamEvent]:
        try:
            if self.first is not None:
                yield self._seen(self.first)
            async for event in self._events:
                yield self._seen(event)
        except Exception as exc:
            self._on_error(exc)
            raise
        finally:
            await self._events.aclose()

    async def collect(self) -> tuple[str, list[Chunk], Done]:
        """Non-streaming: the whole text, the chunks and the final record."""
        chunks = [e async for e in self if isinstance(e, Chunk)]
        assert self.done is not None
        return "".join(c.text for c in chunks), chunks, self.done

    def _seen(self, event: StreamEvent) -> StreamEvent:
        if isinstance(event, Done):
            self.done = event
        return event

    def _on_done(self, done: Done) -> None:
        self.done = self.done or done
        status = "cancelled" if done.finish_reason == "cancelled" else "ok"
        self._finish(_record(self, done, status))

    def _on_error(self, exc: BaseException) -> None:
        if isinstance(exc, (asyncio.CancelledError, GeneratorExit)):
            return
        _, message, _ = to_status_message(exc)
        partial: Done | None = getattr(exc, "partial", None)  # a backend that failed mid-stream
        if partial is not None:
            record = _record(self, partial, "error")
            record.error = message
        else:
            record = UsageRecord(source=self.request.source, route=self.route, model=self.request.model,
                                 backend=self.backend.name, stream=self.stream, client=self.request.client,
                                 status="error", error=message)
        self._finish(record)

    def _finish(self, record: UsageRecord) -> None:
        if self._recorded:
            return
        self._recorded = True
        self._in_flight(-1)
        self.recorder.record(record)

    def _in_flight(self, delta: int) -> None:
        if self.recorder.metrics is not None:
            self.recorder.metrics.in_flight.labels(self.request.model).inc(delta)


def _record(gen: Generation, done: Done, status: str) -> UsageRecord:
    t = done.timings
    ms = lambda s: None if s is None else round(s * 1000, 3)  # noqa: E731
    return UsageRecord(
        source=gen.request.source, route=gen.route, model=gen.request.model, backend=gen.backend.name,
        stream=gen.stream, status=status, client=gen.request.client, finish_reason=done.finish_reason,
        input_tokens=done.usage.input_tokens, output_tokens=done.usage.output_tokens,
        cached_input_tokens=done.usage.cached_input_tokens, usage_source=done.usage.source,
        queue_ms=ms(t.queue), ttft_ms=ms(t.ttft),
        tpot_ms=ms(t.tpot), total_ms=ms(t.total),
    )


def _observe(m: GatewayMetrics, r: UsageRecord) -> None:
    m.requests.labels(r.model, r.route, r.status).inc()
    m.input_tokens.labels(r.model).inc(r.input_tokens)
    m.output_tokens.labels(r.model).inc(r.output_tokens)
    if r.cached_input_tokens:
        m.cached_tokens.labels(r.model).inc(r.cached_input_tokens)
    if r.ttft_ms is not None:
        m.ttft.labels(r.model).observe(r.ttft_ms / 1000)
    if r.tpot_ms is not None:
        m.tpot.labels(r.model).observe(r.tpot_ms / 1000)
    if r.total_ms is not None:
        m.e2e.labels(r.model).observe(r.total_ms / 1000)
