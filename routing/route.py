"""A route: one public model name in front of several backends, keeping a latency SLO.

``Route.stream(request)`` is a Backend stream (Chunk…, Done) whose steps are:

1. the SLO: the route's, tightened by the client's ``x-slo-*`` headers;
2. predictions for every backend whose breaker admits a request (``predictor.py``), from the prompt
   tokens each is expected to have to prefill: with ``strategy: slo`` or ``prefix`` the route keeps
   an index of the prefixes it sent each backend (``prefix.py``), and a backend holding the
   prompt's prefix is expected to prefill only the rest;
3. admission and binding: with ``strategy: slo`` the request is held at the gateway until a backend
   is predicted to serve it within every part of its SLO without pushing the requests decoding there
   past theirs, and goes to the one with the most headroom (``dispatch.py``); what cannot be served in
   time is refused with ``shed`` (``RouteShed``, 429, Retry-After), at once when the queue ahead is
   already too long. Other strategies with ``shed`` refuse a request no backend is predicted to start
   within its TTFT SLO. A negative priority is held to a tighter TTFT (each step of −1 takes 25 % off),
   so low priority goes first; nothing is shed once a byte has been sent;
4. the order of the backends (``strategies.py``; ``prefix``: the longest cached prefix within a
   bounded load); the request goes to the first;
5. first-token deadline: no first event within ``first_token_timeout_ms`` cancels that attempt
   (the backend ends it with a cancelled Done) and resubmits to the next backend, unseen by the client;
6. retries: a connection error, 5xx or 429 from a backend before any byte goes to the next
   backend, ``retries`` times; when every backend is out, the ``fallbacks`` routes are tried in turn;
7. accounting: the final Done names the route, the backend that served, the attempts and the SLO
   parts missed; the route's window and the backend's latency model learn from it.

A route with ``prefill:`` and ``decode:`` pools first decides whether to disaggregate the request
(``disagg.py``: a long uncached prompt whose co-located prefill would break the decode worker's TPOT);
if so it prefills on one worker and decodes on another, the decode leg being an attempt like any
other; a failed prefill leg, and every request not worth disaggregating, takes the steps above
(co-located members: the route's ``backends``, else the decode pool).

A route asks its backends for a stream even when the client wants one reply (the gateway joins the
chunks), so TTFT is the backend's first token for every request, as vLLM's own metrics count it.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, replace

from core.base import CancelToken, Chunk, Done, GenerationRequest, Health, LoadedModel, ModelInfo, StreamEvent
from core.base import Timings, Usage
from core.errors import BackendError, InvalidRequest, RouteShed, RouteUnavailable
from frontend.token_count import TokenCounter, load_counter

from . import dispatch
from .disagg import DisaggPolicy, Disaggregation, PrefillFailed
from .dispatch import Dispatcher, Waiter
from .kv_events import KVEventSource, prompt_token_ids
from .predictor import Prediction, median
from .prefix import Lookup, PrefixPolicy, RoutePrefixes
from .slo import SLO, vllm_tpot
from .stats import Outcome, Window
from .strategies import Member, Orderer

log = logging.getLogger(__name__)
RETRYABLE = frozenset({429, 500, 502, 503, 504})
HEALTH_POLL_S = 2.0  # how fresh a route needs its members' health
LOAD_STRATEGIES = ("slo", "prefix")  # the strategies whose choice reads the members' queue figures
LOAD_READ_WAIT_S = 0.25  # the longest a decision waits for a member's queue figures (fresh_load)
_keys = itertools.count()


@dataclass(frozen=True)
class RoutePolicy:
    """A config ``RouteEntry``'s policies (``routing.build.route_policy``); no defaults of its own."""

    strategy: str
    slo: SLO
    shed: bool
    first_token_timeout_s: float | None
    retries: int
    fallbacks: tuple[str, ...]
    prefix: PrefixPolicy
    disagg: DisaggPolicy | None  # None: the route has no prefill and decode pools


class Route:
    can_stream = True
    supports_embeddings = False

    def __init__(self, name: str, members: list[Member], policy: RoutePolicy,
                 resolve_route: Callable[[str], "Route | None"] = lambda name: None,
                 counter: TokenCounter | None = None, kv_sources: dict[str, KVEventSource] | None = None,
                 prefill: list[Member] | None = None, decode: list[Member] | None = None) -> None:
        # ``members`` serve co-located (the decode pool when the route lists no plain backends);
        # ``prefill`` and ``decode`` are its P/D pools (``disagg.py``), members shared by name.
        self.name, self.members, self.policy = name, members or list(decode or []), policy
        self.disagg = Disaggregation(prefill, decode, policy.disagg) if prefill and decode else None
        self.all_members = list({id(m): m for m in [*self.members, *(prefill or []), *(decode or [])]}.values())
        self.orderer = Orderer(policy.strategy)
        self.dispatcher = Dispatcher(policy.shed)
        self._held: dict[int, asyncio.Event] = {}  # held requests' wake-ups, by waiter key
        self.window = Window(policy.slo.window_s)
        self.resolve_route = resolve_route
        self.counter = counter or load_counter(None)
        self.on_outcome: list[Callable[[str, Outcome], None]] = []  # metrics hooks
        self._reported_at: dict[str, float] = {}  # per member: when its last load figures told were read
        self.recent_prompts: deque[int] = deque(maxlen=200)  # prompt tokens of the latest requests
        self.prefixes = (RoutePrefixes(name, [m.name for m in self.all_members], policy.prefix)
                         if policy.strategy in ("slo", "prefix") else None)
        self.kv_sources = kv_sources if self.prefixes is not None and kv_sources else {}  # precise members

    @property
    def admits(self) -> bool:
        """A keyed request is admitted by the member that serves it (each counts its own prompt)."""
        return all(getattr(m.backend, "admits", False) for m in self.all_members)

    # -- the Backend protocol -------------------------------------------------------------------

    async def stream(self, request: GenerationRequest, _visited: frozenset[str] = frozenset()) -> AsyncIterator[StreamEvent]:
        slo = self.policy.slo.tightened(request.slo_ttft_ms, request.slo_tpot_ms)
        prompt_tokens = self.counter.prompt_tokens(request)
        self.recent_prompts.append(prompt_tokens)
        max_tokens = int(request.options.get("num_predict") or 256)
        members = [m for m in self.members if m.breaker.allows()]
        if self.policy.strategy in LOAD_STRATEGIES:  # the others never read a member's queue: no wait for them
            await self._read_loads(members)
        lookup = self.prefixes.lookup(request, prompt_tokens) if self.prefixes is not None else None
        if lookup is not None and self.kv_sources:
            await self._precise(request, lookup, prompt_tokens)
        cached = lookup.cached if lookup is not None else {}
        pair = self.disagg.plan(prompt_tokens, cached, slo) if self.disagg is not None else None
        if pair is not None:
            try:
                async for event in self._disaggregated(request, pair, prompt_tokens, slo, max_tokens, lookup):
                    yield event
                return
            except PrefillFailed:
                pass  # served co-located below
        bound: Waiter | None = None
        if self.policy.strategy == "slo" and slo.is_set and members:
            bound = await self._hold(Waiter(prompt_tokens, max_tokens, time.monotonic(), slo, request.priority,
                                            cached=cached))
            members = [m for m in self.members if m.name == bound.backend] + \
                [m for m in members if m.name != bound.backend]
        predictions = {m.name: m.latency.predict(prompt_tokens, cached.get(m.name, 0)) for m in members}
        if bound is None:
            self._admit(request, slo, members, predictions)
            first = self.prefixes.pick(lookup, members) if self.policy.strategy == "prefix" and lookup else None
            members = self.orderer.order(members, predictions, slo, max_tokens, first)
        retries = self.policy.retries
        last_error: BackendError | None = None
        attempts = 0
        for member in members:
            attempts += 1
            outcome = _Attempt(self, member, request, prompt_tokens, slo, max_tokens, bound if attempts == 1 else None,
                               lookup)
            try:
                async for event in outcome.run(attempts):
                    yield event
                if not outcome.hedged:
                    return
            except BackendError as exc:
                if outcome.started or exc.status not in RETRYABLE:
                    raise
                last_error = exc
                if retries <= 0:
                    break  # this route is out of tries: its fallbacks, or this error
                retries -= 1
        async for event in self._fall_back(request, _visited | {self.name}, last_error, attempts):
            yield event

    async def _read_loads(self, members: list[Member]) -> None:
        """The members' own queue figures no older than ``LOAD_MAX_AGE_S`` (read now when older, at most
        ``LOAD_READ_WAIT_S``: a slow ``/metrics`` keeps the last figures rather than delay the request)."""
        reads = [(m, asyncio.ensure_future(m.backend.fresh_load()))
                 for m in members if hasattr(m.backend, "fresh_load")]
        if not reads:
            return
        await asyncio.wait([read for _, read in reads], timeout=LOAD_READ_WAIT_S)
        for member, read in reads:
            if read.done() and not read.exception():
                self._report(member)

    def _report(self, member: Member) -> None:
        """The member's load figures to its latency model, once per read."""
        load, read_at = getattr(member.backend, "reported_load", None), getattr(member.backend, "reported_at", None)
        if read_at is None or read_at <= self._reported_at.get(member.name, -math.inf):
            return
        self._reported_at[member.name] = read_at
        if load:
            member.latency.reported(load.get("requests_running"), load.get("requests_waiting"))

    def _disaggregated(self, request: GenerationRequest, pair: tuple[Member, Member], prompt_tokens: int, slo: SLO,
                       max_tokens: int, lookup: Lookup | None) -> AsyncIterator[StreamEvent]:
        """Prefill on ``pair[0]``, decode on ``pair[1]``; the decode leg is an attempt like any other,
        whose prefill work is none (the KV arrives), and both workers hold the prefix afterwards."""
        if lookup is not None:
            self.prefixes.sent(pair[0].name, lookup)

        def decode_leg(member: Member, leg: GenerationRequest) -> AsyncIterator[StreamEvent]:
            attempt = _Attempt(self, member, leg, prompt_tokens, slo, max_tokens, None, lookup, cached=prompt_tokens)
            return attempt.run(1)
        cached = lookup.cached if lookup is not None else {}
        return self.disagg.stream(request, pair, prompt_tokens, cached, decode_leg)

    async def _precise(self, request: GenerationRequest, lookup: Lookup, prompt_tokens: int) -> None:
        """The members that publish their KV cache: what they hold of this prompt, in its tokens (rendered
        and tokenized off the event loop, once per tokenizer), instead of the approximate index's guess."""
        tokens: dict[str, list[int] | None] = {}
        for name, source in self.kv_sources.items():
            if source.tokenizer not in tokens:
                try:
                    tokens[source.tokenizer] = await asyncio.to_thread(prompt_token_ids, request, source.tokenizer)
                except Exception as exc:  # a template or tokenizer failure: the approximate index stands
                    log.warning("route %s: cannot tokenize for %s's KV events: %s", self.name, name, exc)
                    tokens[source.tokenizer] = None
            ids = tokens[source.tokenizer]
            if ids:
                self.prefixes.precise(name, lookup, source.index.match(ids) / len(ids), prompt_tokens)

    async def _fall_back(self, request: GenerationRequest, visited: frozenset[str], last_error: BackendError | None,
                         attempts: int) -> AsyncIterator[StreamEvent]:
        for name in self.policy.fallbacks:
            route = self.resolve_route(name)
            if route is not None and name not in visited:
                async for event in route.stream(request, visited):
                    yield event
                return
        if last_error is not None:
            raise last_error
        error = RouteUnavailable(f"route '{self.name}': every backend is out (circuit breakers open, or no "
                                 f"first token in time after {attempts} attempt(s)); retry later",
                                 retry_after=self._breaker_wait())
        error.partial = _annotated(_empty_done(), self.name, "none", attempts, None)
        self._record(Outcome(time.monotonic(), None, "error"))
        raise error

    async def _hold(self, waiter: Waiter) -> Waiter:
        """Until the dispatcher binds the request to a backend (returned) or sheds it (RouteShed)."""
        wake = self._held[waiter.key] = asyncio.Event()
        try:
            self.dispatcher.arrive(waiter, [m for m in self.members if m.breaker.allows()])
            self.pump()
            while not waiter.decided:
                wake.clear()
                timeout = max(0.0, waiter.deadline - time.monotonic()) + 0.001
                try:
                    await asyncio.wait_for(wake.wait(), timeout)
                except TimeoutError:
                    pass
                self.pump()
        except BaseException:  # the client left while held, or just after it was bound
            if not waiter.decided:
                self.dispatcher.forget(waiter)
            for member in self.members:
                if member.name == waiter.backend:
                    member.latency.finished(waiter.key)
            raise
        finally:
            self._held.pop(waiter.key, None)
        if waiter.backend is None:
            self._shed(waiter)
        return waiter

    def pump(self) -> None:
        """Binds or sheds what the dispatcher can decide now; called whenever a backend's load changes."""
        if not self.dispatcher.queue:
            return
        for waiter in self.dispatcher.ready([m for m in self.members if m.breaker.allows()]):
            wake = self._held.get(waiter.key)
            if wake is not None:
                wake.set()

    def _shed(self, waiter: Waiter) -> None:
        self._record(Outcome(time.monotonic(), None, "shed"))
        wait = max(1, math.ceil(waiter.retry_after_s))
        error = RouteShed(f"route '{self.name}': no backend is predicted to serve it within its SLO (TTFT SLO of "
                          f"{waiter.ttft_limit_s * 1000:.0f} ms): {waiter.reason}; retry in {wait} s",
                          retry_after=float(wait))
        error.partial = _annotated(_empty_done(), self.name, "none", 0, None)
        raise error

    def _admit(self, request: GenerationRequest, slo: SLO, members: list[Member],
               predictions: dict[str, Prediction]) -> None:
        if not self.policy.shed or slo.ttft_ms is None or not members:
            return
        limit_ms = slo.ttft_ms * max(0.25, 1.0 + 0.25 * min(0, request.priority))
        best = min(members, key=lambda m: predictions[m.name].ttft_s)
        predicted_ms = predictions[best.name].ttft_s * 1000
        if predicted_ms <= limit_ms:
            return
        self._record(Outcome(time.monotonic(), None, "shed"))
        wait = max(1, math.ceil((predicted_ms - limit_ms) / 1000))
        error = RouteShed(f"route '{self.name}': no backend is predicted to start within the TTFT SLO of "
                          f"{limit_ms:.0f} ms (best: {best.name}, predicted {predicted_ms:.0f} ms); retry in "
                          f"{wait} s", retry_after=float(wait))
        error.partial = _annotated(_empty_done(), self.name, "none", 0, None)
        raise error

    def _breaker_wait(self) -> float:
        waits = [m.breaker.retry_after() for m in self.members]
        return max(1.0, min(waits)) if waits else 1.0

    def _record(self, outcome: Outcome) -> None:
        self.window.add(outcome)
        for hook in self.on_outcome:
            hook(self.name, outcome)

    async def embed(self, model: str, inputs: list[str], *, truncate: bool = True, keep_alive: float | None = None):
        raise InvalidRequest(f"route '{self.name}' serves generation, not embeddings", param="model")

    async def health(self) -> Health:
        up = [m.name for m in self.members if m.breaker.state != "open" and m.up]
        return Health(ok=bool(up), detail=f"{len(up)}/{len(self.members)} backends up")

    async def list_models(self) -> list[ModelInfo]:
        return [ModelInfo(name=self.name, backend="route", family="route", owned_by="route")]

    async def loaded_models(self) -> list[LoadedModel]:
        return []

    async def unload(self, model: str) -> bool:
        return False

    async def aclose(self) -> None:
        return None

    def health_checked(self, name: str, health: Health | None) -> None:
        """The last health check of the member ``name`` (None: it failed or did not answer in time), with
        its backend's own queue figures (vLLM/TGI/TRT-LLM /metrics). The gateway's backend monitor polls
        every backend once, every ``HEALTH_POLL_S`` while there are routes, and tells each route."""
        for member in self.all_members:
            if member.name != name:
                continue
            member.up = health is not None and health.ok
            if health is None:
                continue
            if hasattr(member.backend, "reported_at"):
                self._report(member)  # the check read the figures (RemoteBackend.health): told once
            else:
                member.latency.reported(health.metrics.get("requests_running"), health.metrics.get("requests_waiting"))
            if self.prefixes is not None and health.metrics.get("kv_cache_tokens"):
                self.prefixes.set_capacity(name, health.metrics["kv_cache_tokens"], "reported")

    def snapshot(self) -> dict:
        """The live view of ``GET /infer/routes``: the route's window, and per backend its window,
        in flight, predictions now (for the median prompt of the route's latest requests, so they
        compare with the measured percentiles beside them; 256 tokens before any), prediction error
        and breaker state."""
        slo = self.policy.slo
        prompt_tokens = median(list(self.recent_prompts)) or 256
        backends = []
        for m in self.all_members:
            prediction = m.latency.predict(prompt_tokens)
            backends.append({
                "name": m.name, "model": m.model, "up": m.up, "breaker": m.breaker.state,
                "in_flight": m.in_flight, "queued": sum(1 for r in m.latency.in_flight.values() if r.first_token is None),
                "reported_waiting": m.latency.reported_waiting,
                "predicted_ttft_ms": round(prediction.ttft_s * 1000, 3),
                "predicted_tpot_ms": round(prediction.tpot_s * 1000, 3),
                "prediction_error": m.latency.median_error(), "tpot_prediction_error": m.latency.median_error("tpot"),
                "observations": m.latency.ttft.observations,
                "batch_limit": m.latency.batch_limit or None,
                "margins": {kind: round(m.latency.ratio(kind, q), 3)
                            for kind, q in (("ttft", dispatch.TTFT_QUANTILE), ("tpot", dispatch.TPOT_QUANTILE))},
                **self.window.summary(m.name),
                **(self.prefixes.view(m.name) if self.prefixes is not None else {}),
                **(self._kv_view(m.name) if self.prefixes is not None else {}),
            })
        return {"name": self.name, "strategy": self.policy.strategy, "sheds_early": self.policy.shed,
                "predicted_for_prompt_tokens": prompt_tokens,
                "slo": {"ttft_ms": slo.ttft_ms, "tpot_ms": slo.tpot_ms, "e2e_ms": slo.e2e_ms, "target": slo.target,
                        "window_s": slo.window_s},
                **({"disagg": {"protocol": self.policy.disagg.protocol, "when": self.policy.disagg.when,
                               "prefill": [m.name for m in self.disagg.prefill],
                               "decode": [m.name for m in self.disagg.decode], **self.disagg.counts}}
                   if self.disagg is not None else {}),
                "prediction_error": median([e for m in self.members for e in m.latency.errors]),
                "tpot_prediction_error": median([e for m in self.members for e in m.latency.tpot_errors]),
                **self.window.summary(), "backends": backends}


    def _kv_view(self, name: str) -> dict:
        source = self.kv_sources.get(name)
        if source is None:
            return {"prefix_mode": "approximate"}
        index = source.index
        return {"prefix_mode": "precise", "kv_events": index.events, "kv_event_gaps": index.gaps,
                "kv_blocks": len(index.keys), "kv_block_size": index.block_size or None}


class _Attempt:
    """One try of one backend: its own cancel token (the client's cancel reaches it), the
    first-token deadline, and the bookkeeping of the backend's latency model and the route's window."""

    def __init__(self, route: Route, member: Member, request: GenerationRequest, prompt_tokens: int, slo: SLO,
                 max_tokens: int, bound: Waiter | None = None, lookup: Lookup | None = None,
                 cached: int | None = None):
        """``cached``: the prompt tokens the backend need not prefill (default: the prefix index's guess)."""
        self.route, self.member, self.slo, self.lookup = route, member, slo, lookup
        self.cached = cached if cached is not None else lookup.cached.get(member.name, 0) if lookup is not None else 0
        # Always a stream from the backend, also for a client that wants one reply (the gateway joins the
        # chunks for it): the route times the backend's first token for the SLO, the predictor and the
        # first-token deadline, which a one-reply call would put at its last token.
        self.request = replace(request, model=member.model, cancel=CancelToken(), stream=True)
        request.cancel.on_cancel(self.request.cancel.cancel)
        self.client_cancel = request.cancel
        self.prompt_tokens, self.max_tokens = prompt_tokens, max_tokens
        self.bound = bound    # the dispatcher already told the backend's latency model it started
        self.started = False  # a byte went to the client: no retry, no hedge after this
        self.hedged = False
        self.timed_out = False

    async def run(self, attempt: int) -> AsyncIterator[StreamEvent]:
        member, latency = self.member, self.member.latency
        if self.bound is not None:
            key, features = self.bound.key, self.bound.features
        else:
            key = next(_keys)
            features, _ = latency.started(key, self.prompt_tokens, self.max_tokens, self.cached)
        if self.lookup is not None:
            self.route.prefixes.sent(member.name, self.lookup)  # it holds this prompt's prefix from now on
        member.breaker.attempt()
        timer = self._first_token_timer()
        try:
            async for event in member.backend.stream(self.request):
                if isinstance(event, Done):
                    self._finish(event, key, attempt)
                    if self.hedged:
                        return
                    yield event
                    return
                if not self.started:
                    self.started = True
                    if timer is not None:
                        timer.cancel()
                    latency.first_token(key, features)
                    self.route.pump()
                yield event
        except BackendError as exc:
            if exc.status in RETRYABLE:
                member.breaker.failed()
            self.route._record(Outcome(time.monotonic(), member.name, "error"))
            exc.partial = _annotated(exc.partial or _empty_done(), self.route.name, member.name, attempt, None)
            raise
        finally:
            if timer is not None:
                timer.cancel()
            if key in latency.in_flight:  # failed, or the client left mid-stream
                latency.finished(key)
            self.route.pump()

    def _first_token_timer(self) -> asyncio.TimerHandle | None:
        limit = self.route.policy.first_token_timeout_s
        if limit is None:
            return None

        def expire() -> None:
            if not self.started and not self.client_cancel.cancelled:
                self.timed_out = True
                self.request.cancel.cancel()
        return asyncio.get_running_loop().call_later(limit, expire)

    def _finish(self, done: Done, key: int, attempt: int) -> None:
        member, timings = self.member, done.timings
        if self.timed_out and not self.started:  # hedge: the client never sees this attempt
            self.hedged = True
            member.latency.finished(key)
            member.breaker.failed()
            return
        member.breaker.succeeded()
        e2e = timings.total or (time.perf_counter() - self.request.arrival)
        tpot = vllm_tpot(timings.ttft, e2e, done.usage.output_tokens)
        member.latency.finished(key, tpot, done.usage.output_tokens)
        source = self.route.kv_sources.get(member.name)
        if source is not None:
            source.served()  # a publisher silent while requests are served is logged once
        if self.lookup is not None:
            done.expected_cached_tokens = self.lookup.cached_of(member.name, done.usage.input_tokens)
            self.route.prefixes.served(member.name, self.lookup, done.usage.input_tokens,
                                       done.usage.cached_input_tokens)
        cancelled = done.finish_reason == "cancelled"
        missed = self.slo.missed(timings.ttft, e2e, done.usage.output_tokens) if self.slo.is_set else ()
        self.route._record(Outcome(time.monotonic(), member.name, "cancelled" if cancelled else "ok",
                                   good=not cancelled and not missed, ttft_s=timings.ttft, tpot_s=tpot,
                                   e2e_s=e2e, missed=missed))
        _annotated(done, self.route.name, member.name, attempt, missed if self.slo.is_set else None)


def _annotated(done: Done, route: str, backend: str, attempts: int, missed: tuple[str, ...] | None) -> Done:
    done.route, done.served_by, done.attempts, done.slo_missed = route, backend, attempts, missed
    return done


def _empty_done() -> Done:
    return Done(finish_reason="error", usage=Usage(), timings=Timings())
