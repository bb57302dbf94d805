"""Run one generation through its backend and account for it: metrics, and exactly one ledger row.

``Recorder.start(backend, request)`` starts a :class:`Generation`: a pump task reads the backend's
stream (Chunk…, Done) into a queue, so the stream keeps running to its ``Done`` even when the
consumer is cancelled (Starlette cancels a streaming body when the client goes away). ``start``
waits for the first event, so request errors (unknown model, prompt over the context) surface
before any response header is sent.

The pump enforces the request's output cap (``output_cap.py``: the gateway's own limit, whatever
the backend does) and reads at most ``AHEAD`` events ahead of a streaming consumer: a client that
stops reading holds its backend, so one that then hangs up is charged for what was generated
before the gateway noticed, not for a whole answer nobody read.

The ledger row is written from one place, when the pump ends: from the backend's ``Done``
(``ok``, or ``cancelled`` when the consumer went away and ``request.cancel`` stopped the backend)
or from the error (with the tokens of ``BackendError.partial`` when it failed mid-stream).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass, field

from core.base import Backend, CancelToken, Chunk, Done, GenerationRequest, StreamEvent
from core.errors import BackendError, BackendProtocolError, RouteShed, ShuttingDown
from core.settings import DEFAULTS
from gateway.serving.router import Router
from ledger.tables import UsageRecord
from frontend.token_count import prompt_bound
from ledger.writer import LedgerWriter
from pricing.book import PriceBook
from pricing.method import Cost, Tokens

from gateway.policy.admission import Admission
from gateway.http.errors import APIError, to_status_message
from gateway.policy.keys import KeyBook
from gateway.observability.metrics import GatewayMetrics
from gateway.observability.monitor import BackendMonitor, backend_label
from gateway.serving.output_cap import OutputCap
from gateway.observability.tracing import Tracer

log = logging.getLogger(__name__)

AHEAD = 64  # events the pump reads ahead of a streaming client before the backend waits for it


def key_forbids(caller, model: str) -> APIError:
    return APIError(403, f"key '{caller.name}' may not use '{model}' (its routes: {', '.join(caller.key.routes)})")


def _retrieved(task: asyncio.Task) -> None:
    """A settlement that failed (the database or Redis down: logged once by its Outage) is done with."""
    if not task.cancelled() and task.exception() is not None:
        log.debug("a key's settlement failed: %s", task.exception())


@dataclass
class Recorder:
    writer: LedgerWriter | None
    metrics: GatewayMetrics | None = None
    live: set["Generation"] = field(default_factory=set)
    prices: PriceBook | None = None
    keys: KeyBook | None = None
    monitor: BackendMonitor | None = None  # per-backend in-flight counts
    tracer: Tracer | None = None  # None: tracing off (OTEL_EXPORTER_OTLP_ENDPOINT unset)
    _settling: set[asyncio.Task] = field(default_factory=set)

    def priced(self, record: UsageRecord) -> UsageRecord:
        """``record`` with its cost, when its backend has pricing (tokens generated are billed,
        also for a cancelled or failed request). Pricing is keyed by the config's backend names:
        a route's member (``backend``), a remote backend (its public ``model`` name), or an
        in-process engine (``llamacpp``/``native``, priced by ``local:``)."""
        if self.prices is None:
            return record
        cached = record.cached_input_tokens or 0
        tokens = Tokens(max(0, record.input_tokens - cached), cached, record.output_tokens)
        if record.prefill_backend is not None:
            return self._priced_by_leg(record, tokens)
        key = next((k for k in (record.backend, record.model) if k in self.prices.entries), None)
        found = self.prices.cost(key, tokens) if key is not None else None
        if found is not None:
            cost, version = found
            record.input_cost_usd, record.cached_input_cost_usd = cost.input, cost.cached_input
            record.output_cost_usd, record.total_cost_usd, record.pricing_version = cost.output, cost.total, version
            if record.reasoning_tokens and record.output_tokens:  # reasoning is billed as output, at its rate
                record.reasoning_cost_usd = cost.output * record.reasoning_tokens / record.output_tokens
        return record

    def _priced_by_leg(self, record: UsageRecord, tokens: Tokens) -> UsageRecord:
        """A disaggregated request: the prompt at the prefill worker's prices, the output at the decode
        worker's (a worker without pricing costs nothing here)."""
        assert self.prices is not None
        legs = [(record.prefill_backend, Tokens(tokens.input, tokens.cached_input, 0)),
                (record.backend, Tokens(0, 0, tokens.output))]
        found = [self.prices.cost(name, leg) if name in self.prices.entries else None for name, leg in legs]
        if all(f is None for f in found):
            return record
        (prefill, prefill_version), (decode, decode_version) = [f or (Cost(), None) for f in found]
        record.input_cost_usd, record.cached_input_cost_usd = prefill.input, prefill.cached_input
        record.output_cost_usd, record.total_cost_usd = decode.output, prefill.total + decode.total
        record.prefill_cost_usd, record.decode_cost_usd = prefill.total, decode.total
        record.pricing_version = decode_version or prefill_version
        if record.reasoning_tokens and record.output_tokens:
            record.reasoning_cost_usd = decode.output * record.reasoning_tokens / record.output_tokens
        return record

    def resolve(self, router: Router, request: GenerationRequest, *, route: str, stream: bool) -> Backend:
        """``router.resolve(request)``, once per request; a request nothing serves still gets its row."""
        try:
            return router.resolve(request)
        except BackendError as exc:
            self.record(UsageRecord(source=request.source, route=route, model=request.model, backend="none",
                                    stream=stream, client=request.client, status="error", error=exc.message),
                        error_type=type(exc).__name__)
            raise

    async def start(self, backend: Backend, request: GenerationRequest, *, route: str,
                    stream: bool) -> "Generation":
        request.stream = stream  # a remote adapter asks its backend for one reply when the client wants one
        label = backend_label(backend)
        span = None if self.tracer is None else self.tracer.start(request, endpoint=route, backend=backend,
                                                                    label=label)
        try:
            admission = await self._admission(backend, request)
        except (BackendError, APIError) as exc:
            record = UsageRecord(source=request.source, route=route, model=request.model, backend=label,
                                 stream=stream, client=request.client, status="error", error=exc.message,
                                 key_name=request.key_name)
            self.record(record, backend=label, error_type=type(exc).__name__, span=span)
            raise
        gen = Generation(self, backend, request, route, stream, label, span)
        gen.admission = admission
        await gen.prime()
        return gen

    async def _admission(self, backend: Backend, request: GenerationRequest) -> Admission | None:
        """A request sent with a ledger key: the key must allow its model (403); its requests per
        minute are counted now; its tokens and budget are admitted before it runs: by the backend,
        which counts the prompt (``admits``), else here with an upper bound of the prompt."""
        caller = request.caller
        if caller is not None and not caller.allows(request.model):
            raise key_forbids(caller, request.model)
        key = getattr(caller, "key", None)
        if key is None or self.keys is None:
            return None
        request.key_name = key.name
        names = (backend_label(backend), backend.name, request.model)  # as ``priced`` finds a row's pricing
        admission = Admission(self.keys, key, request, self.prices, names)
        await admission.start()
        if getattr(backend, "admits", False):
            request.admit = admission.admit
            return admission
        cap = await admission.admit(prompt_bound(request), None)
        if cap is not None:
            request.options = {**request.options, "num_predict": cap}
        return admission

    def settle_key(self, admission: Admission | None, record: UsageRecord) -> None:
        """A finished keyed request: its budget hold becomes its cost, its tokens per minute its actual
        tokens (the hold's settlement rides the ledger writer's next batch, in its thread)."""
        if admission is None:
            return
        work = admission.finish(record.input_tokens, record.output_tokens, record.total_cost_usd or 0.0, self.writer)
        for job in work:
            task = asyncio.get_running_loop().create_task(job)
            self._settling.add(task)
            task.add_done_callback(self._settling.discard)
            task.add_done_callback(_retrieved)

    def record(self, record: UsageRecord, *, backend: str | None = None, error_type: str = "",
               span=None) -> None:
        """Account for one finished request: its metrics (labelled by ``backend``, the backend's name in
        metrics; the record's own by default), its span (tracing on) and its ledger row."""
        label = backend or record.backend
        if self.metrics is not None:
            _observe(self.metrics, record, label, error_type)
        if span is not None:
            self.tracer.end(span, record, backend=label, error_type=error_type)
        if self.writer is not None:
            self.writer.submit(record)

    def stop_all(self) -> int:
        """Shutdown: every live generation ends now with a ShuttingDown error for its client (an
        error event, then the stream's normal end) and a ledger row with what it generated."""
        live = list(self.live)
        for gen in live:
            gen.abort(ShuttingDown())
        return len(live)

    async def stop_after(self, delay: float) -> None:
        """Let live generations finish for ``delay`` seconds, then stop the rest (SIGTERM)."""
        deadline = asyncio.get_running_loop().time() + delay
        while self.live and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.05)
        stopped = self.stop_all()
        if stopped:
            log.warning("shutting down: stopped %d request(s) still running after %.1f s", stopped, delay)

    async def settle(self) -> None:
        """Wait until every generation started so far has recorded its row (tests, shutdown)."""
        while self.live or self._settling:
            await asyncio.gather(*(g.finished for g in list(self.live)), *self._settling, return_exceptions=True)


@dataclass
class _Failure:
    exc: BaseException


class _Handover:
    """One producer (the pump), one consumer: a deque and the consumer's wake-up future (an
    ``asyncio.Queue`` does more bookkeeping per event than this hand-over needs). The producer may
    wait for ``room`` while the consumer has ``AHEAD`` events still to take."""

    __slots__ = ("items", "_waiter", "_space")

    def __init__(self) -> None:
        self.items: deque = deque()
        self._waiter: asyncio.Future | None = None
        self._space: asyncio.Future | None = None

    def put(self, item) -> None:
        self.items.append(item)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def get(self):
        while not self.items:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        return self.take()

    def take(self):
        item = self.items.popleft()
        if self._space is not None and len(self.items) < AHEAD:
            self.wake()
        return item

    def wake(self) -> None:
        """The producer stops waiting for room (the consumer took events, or it left)."""
        space = self._space
        if space is not None and not space.done():
            space.set_result(None)

    async def room(self, consumer_gone: CancelToken) -> None:
        while len(self.items) >= AHEAD and not consumer_gone.cancelled:
            self._space = asyncio.get_running_loop().create_future()
            try:
                await self._space
            finally:
                self._space = None


class Generation:
    """One request's events after the first has arrived; ``done`` is set at the end."""

    def __init__(self, recorder: Recorder, backend: Backend, request: GenerationRequest, route: str, stream: bool,
                 label: str | None = None, span=None):
        self.recorder, self.backend, self.request = recorder, backend, request
        self.route, self.stream = route, stream
        self.label = label or backend_label(backend)  # the backend's name in metrics
        self.span = span  # tracing on: this request's span
        self.error_type = ""
        self.called = False  # a chunk carried tool calls: the row's finish_reason says tool_calls
        self.done: Done | None = None
        self.record: UsageRecord | None = None  # built (and costed) as soon as the final Done arrives
        self.admission: Admission | None = None  # its key's limits and budget hold, for a keyed request
        self.cap = OutputCap(request, self._cap_limit)  # the most it may generate, enforced on its events
        self._ended = False
        self._aborted: BackendError | None = None
        self._queue = _Handover()  # the pump's events, in order
        request.cancel.on_cancel(self._queue.wake)  # a consumer that left never holds the pump
        self.finished: asyncio.Future = asyncio.get_running_loop().create_future()

    async def prime(self) -> None:
        self._in_flight(+1)
        self.recorder.live.add(self)
        run = self._run() if self.span is None else self._traced_run()
        self._pump = asyncio.get_running_loop().create_task(run)
        try:
            self.first = await self._queue.get()
        except asyncio.CancelledError:
            self.request.cancel.cancel()
            raise
        if isinstance(self.first, _Failure):
            raise self.first.exc

    def __aiter__(self) -> AsyncIterator[StreamEvent]:
        return self._events(None)

    def indexed(self, index: int) -> AsyncIterator[tuple[int, StreamEvent]]:
        """The events as ``(index, event)`` pairs: choice ``index`` of an OpenAI request, with no generator
        of its own between this one and the response."""
        return self._events(index)

    async def _events(self, index: int | None) -> AsyncIterator:
        ended = False
        try:
            event = self.first
            while True:
                if isinstance(event, _Failure):
                    ended = True
                    raise event.exc
                if isinstance(event, Done):
                    ended = self._ended = True
                    yield event if index is None else (index, event)
                    return
                yield event if index is None else (index, event)
                event = self._queue.take() if self._queue.items else await self._queue.get()
        finally:
            if not ended:  # the consumer went away: the backend stops and reports a cancelled Done
                self.request.cancel.cancel()

    def abort(self, error: BackendError) -> None:
        """End this generation for its consumer with ``error`` now; the backend stops (the request is
        cancelled) and the ledger row records ``error`` with the tokens generated."""
        if self._aborted is not None or self.finished.done():
            return
        self._aborted = error
        self._queue.put(_Failure(error))
        self.request.cancel.cancel()

    @property
    def cost_usd(self) -> float | None:
        return None if self.record is None else self.record.total_cost_usd

    def more_ready(self) -> bool:
        """Whether what the consumer reads next is already here (the final record was read, or the next
        event has arrived): the response writer then holds its bytes to send them with the next."""
        return self._ended or bool(self._queue.items)

    async def collect(self) -> tuple[str, list[Chunk], Done]:
        """Non-streaming: the whole text, the chunks and the final record."""
        chunks = self.cap.trim([e async for e in self if isinstance(e, Chunk)])
        assert self.done is not None
        return "".join(c.text for c in chunks), chunks, self.done

    # -- the pump ---------------------------------------------------------------------------------

    async def _traced_run(self) -> None:
        """``_run`` with this request's span current, so remote adapters propagate it."""
        tracer = self.recorder.tracer
        token = tracer.attach(tracer.context_of(self.span))
        try:
            await self._run()
        finally:
            tracer.detach(token)

    async def _run(self) -> None:
        try:
            async with aclosing(self.backend.stream(self.request)) as events:
                async for event in events:
                    if self.done is not None:
                        continue
                    if isinstance(event, Done):
                        self._end(self.cap.settle(event))
                        continue
                    chunk = self.cap.take(event)
                    if chunk is None:
                        continue
                    self.called = self.called or bool(chunk.tool_calls)
                    self._queue.put(chunk)
                    if self.request.stream and len(self._queue.items) >= AHEAD:  # a slow reader: the backend waits
                        await self._queue.room(self.request.cancel)
            if self.done is None:
                raise BackendProtocolError(f"the {self.backend.name} backend ended a stream without its final record")
        except asyncio.CancelledError as exc:  # shutdown cancelled the pump itself
            self._queue.put(_Failure(BackendError("the server is shutting down")))
            self._finish(self._error_record(exc))
            raise
        except Exception as exc:
            self._queue.put(_Failure(exc))
            self._finish(self._error_record(exc))
        else:
            try:  # the consumer answers first: the row, metrics and key settlement are not on the client's clock
                await asyncio.sleep(0)
            finally:
                self._finish(self.record)

    def _end(self, done: Done) -> None:
        self.done, self.record = done, self._done_record(done)
        self.record.backend_reported_output_tokens = self.cap.backend_reported
        self._queue.put(done)

    def _done_record(self, done: Done) -> UsageRecord:
        if self._aborted is not None:
            record = _record(self, done, "error")
            record.error = self._aborted.message
            self.error_type = type(self._aborted).__name__
        else:
            record = _record(self, done, "cancelled" if done.finish_reason == "cancelled" else "ok")
        return self.recorder.priced(record)

    def _error_record(self, exc: BaseException) -> UsageRecord:
        self.error_type = "ShuttingDown" if isinstance(exc, asyncio.CancelledError) else type(exc).__name__
        message = "cancelled at shutdown" if isinstance(exc, asyncio.CancelledError) else to_status_message(exc)[1]
        partial = exc.partial if isinstance(exc, BackendError) else None
        if partial is not None:
            record = self.recorder.priced(_record(self, partial, "shed" if isinstance(exc, RouteShed) else "error"))
        else:
            record = UsageRecord(source=self.request.source, route=self.route, model=self.request.model,
                                 backend=self.label, stream=self.stream, client=self.request.client,
                                 status="error")
        record.error = message
        return record

    def _finish(self, record: UsageRecord) -> None:
        self._in_flight(-1)
        self.recorder.live.discard(self)
        record.key_name = self.request.key_name
        try:
            self.recorder.settle_key(self.admission, record)
            self.recorder.record(record, backend=self.served_by(record), error_type=self.error_type, span=self.span)
        finally:
            if not self.finished.done():
                self.finished.set_result(record)

    def _cap_limit(self) -> int | None:
        """The cap the gateway computed for a keyed request (its admission); None: the gateway set none."""
        return None if self.admission is None else self.admission.cap

    @property
    def note(self) -> str | None:
        """Why the gateway limited this request's output below what it asked (a key's budget or cap)."""
        return None if self.admission is None else self.admission.note

    def served_by(self, record: UsageRecord) -> str:
        """The backend's name in metrics: a route's member that served, else the resolved backend's."""
        return record.backend if record.route_name else self.label

    def _in_flight(self, delta: int) -> None:
        if self.recorder.metrics is not None:
            self.recorder.metrics.in_flight_of(self.request.model).inc(delta)
        monitor = self.recorder.monitor
        if monitor is not None:
            (monitor.started if delta > 0 else monitor.finished)(self.label)


def _record(gen: Generation, done: Done, status: str) -> UsageRecord:
    t = done.timings
    ms = lambda s: None if s is None else round(s * 1000, 3)  # noqa: E731
    missed = done.slo_missed
    return UsageRecord(
        route_name=done.route, attempts=done.attempts if done.route else None,
        slo_met=None if missed is None else not missed, slo_missed=",".join(missed) if missed else None,
        source=gen.request.source, route=gen.route, model=gen.request.model,
        backend=done.served_by or gen.label,
        stream=gen.stream, status=status, client=gen.request.client,
        finish_reason="tool_calls" if gen.called and done.finish_reason == "stop" else done.finish_reason,
        input_tokens=done.usage.input_tokens, output_tokens=done.usage.output_tokens,
        cached_input_tokens=done.usage.cached_input_tokens, usage_source=done.usage.source,
        expected_cached_tokens=done.expected_cached_tokens,
        prefill_backend=done.prefill_by, prefill_ms=ms(done.prefill_s),
        reasoning_tokens=done.usage.reasoning_tokens,
        queue_ms=ms(t.queue), ttft_ms=ms(t.ttft),
        tpot_ms=ms(t.tpot), total_ms=ms(t.total),
    )


def _observe(m: GatewayMetrics, r: UsageRecord, backend: str, error_type: str) -> None:
    route = r.route_name or ""
    m.outcome(r.model, r.route, route, backend, r.status, r.finish_reason or "", error_type).inc()
    children = m.latency(r.model, route, backend)
    children.input_tokens.inc(r.input_tokens)
    children.output_tokens.inc(r.output_tokens)
    if r.cached_input_tokens:
        children.cached_tokens.inc(r.cached_input_tokens)
    if r.ttft_ms is not None:
        children.ttft.observe(r.ttft_ms / 1000)
    if r.tpot_ms is not None:
        children.tpot.observe(r.tpot_ms / 1000)
    if r.total_ms is not None:
        children.e2e.observe(r.total_ms / 1000)
    if r.queue_ms is not None and r.status != "error":
        children.queue.observe(r.queue_ms / 1000)
    if r.backend_reported_output_tokens is not None:
        m.overruns.labels(backend).inc()
        m.overrun_tokens.labels(backend).inc(r.backend_reported_output_tokens - r.output_tokens)
    if r.total_cost_usd:
        route = r.route_name or r.model
        for kind, value in (("input", r.input_cost_usd), ("cached_input", r.cached_input_cost_usd),
                            ("output", r.output_cost_usd)):
            if value:
                m.cost.labels(route, r.backend, kind).inc(value)
