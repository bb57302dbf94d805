"""Every backend's state for ``/metrics``, ``/ready`` and ``GET /infer/backends``.

:class:`BackendMonitor` polls each backend's ``health()`` in the background (at start, then every
``every_s`` seconds, every ``HEALTH_POLL_S`` when routes are configured; a remote's check also reads its
``/metrics`` load figures) and keeps the last answer. It is the only poller: each route is told its
members' answers (``Route.health_checked``), so a backend is asked once per period, not once per reader.
The gateway's own view is added at read time: requests in flight per backend (counted by
the recorder) and each backend's ``current_load()`` when it has one (in-process engines: the scheduler's
running/waiting and the KV cache's used share; remote adapters: requests waiting for a
``max_inflight`` slot). A remote's figures are read when ``/metrics`` or ``/infer/backends`` answers
(``read_loads``: a read already under way is shared, so a burst of scrapes costs the backend one), and
a route reads them when it decides (no older than ``LOAD_MAX_AGE_S``), so the gauges show the backend
as it is when they are read, not as it was at the last poll or the last route decision. Requests the gateway has sent to a backend that it does
not count yet (vLLM's API server holds them before its scheduler sees them) count as waiting there:
``waiting = max(reported waiting, in flight − reported running)``. Nothing here runs per request except
``started``/``finished``, two dict operations.

Backends are named as the config names them: a remote by its ``name``, an in-process engine by its
engine (``llamacpp``, ``native``), a route's local member by its model, a test's single backend
``backend``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, Gauge

from core.base import Backend, Health
from gateway.serving.router import Router
from gateway.observability.spec_decode_metrics import SpecDecodeCollector
from routing.route import HEALTH_POLL_S

HEALTH_TIMEOUT_S = 3.0  # one slow backend must not hold the others' figures


@dataclass
class BackendState:
    name: str
    type: str
    up: bool | None = None  # None until the first check has answered
    detail: str = ""
    latency_ms: float | None = None
    checked_at: float | None = None  # epoch seconds
    reported: dict[str, float] = field(default_factory=dict)  # load figures from the backend's health
    health: Health | None = None  # the last answer (None: the check failed or timed out)


def backend_label(backend: Any) -> str:
    """A backend's name in metrics: a remote's config name, else its own name."""
    settings = getattr(backend, "settings", None)
    name = getattr(settings, "name", None)
    return name if isinstance(name, str) and getattr(settings, "base_url", None) else backend.name


class BackendMonitor:
    def __init__(self, router: Router, registry: CollectorRegistry, every_s: float = 5.0) -> None:
        self.router = router
        self.every_s = min(every_s, HEALTH_POLL_S) if router.routes else every_s  # routes predict from the load
        self.states: dict[str, BackendState] = {}
        self.in_flight: dict[str, int] = {}
        self.first_poll = asyncio.Event()
        labels = ["backend"]
        self.up = Gauge("infer_backend_up", "1 when the backend's last health check passed (and, for a route's "
                        "member, its circuit breaker is not open).", labels, registry=registry)
        self.gateway_in_flight = Gauge("infer_backend_requests_in_flight", "Requests the gateway has sent to the "
                                       "backend and not yet finished.", labels, registry=registry)
        self.running = Gauge("infer_num_requests_running", "Requests the backend is running (its scheduler's "
                             "count when it reports one).", labels, registry=registry)
        self.waiting = Gauge("infer_num_requests_waiting", "Requests waiting for the backend: in its scheduler "
                             "queue, or in the gateway for a max_inflight slot.", labels, registry=registry)
        self.kv_usage = Gauge("infer_kv_cache_usage_perc", "KV-cache usage, 0-1, where the backend has one and "
                              "reports it.", labels, registry=registry)
        registry.register(SpecDecodeCollector(self.targets))

    # -- per request ------------------------------------------------------------------------------

    def started(self, name: str) -> None:
        self.in_flight[name] = self.in_flight.get(name, 0) + 1

    def finished(self, name: str) -> None:
        self.in_flight[name] = self.in_flight.get(name, 1) - 1

    # -- polling ----------------------------------------------------------------------------------

    def targets(self) -> dict[str, Backend]:
        """Every backend by name: the fixed one, the started in-process engines, the remotes, and the
        routes' members that are none of these."""
        router = self.router
        named: dict[str, Backend] = {"backend": router.fixed} if router.fixed is not None else {}
        if router.local is not None:
            named.update(router.local.started())
        named.update(router.remotes)
        for route in router.routes.values():
            for member in getattr(route, "members", ()):
                named.setdefault(member.name, member.backend)
        return named

    async def run(self) -> None:
        """Every ``every_s`` seconds, each backend is asked unless its last check is still waiting for its
        answer (up to ``HEALTH_TIMEOUT_S``): a backend that does not answer delays nobody else's state."""
        checking: dict[str, asyncio.Task] = {}
        await self.poll()
        self.first_poll.set()
        try:
            while True:
                await asyncio.sleep(self.every_s)
                named = self.targets()
                for name in set(self.states) - set(named):
                    del self.states[name]
                for name, backend in named.items():
                    if name not in checking or checking[name].done():
                        checking[name] = asyncio.create_task(self._check_and_tell(name, backend))
        finally:
            for task in checking.values():
                task.cancel()

    async def poll(self) -> None:
        """One check of every backend, each applied as soon as it answers; the states kept in the
        backends' order (``/ready`` names them so), not in the order they answered."""
        named = self.targets()
        await asyncio.gather(*(self._check_and_tell(n, b) for n, b in named.items()))
        self.states = {n: self.states[n] for n in named if n in self.states}

    async def _check_and_tell(self, name: str, backend: Backend) -> None:
        state = await self._check(name, backend)
        self.states[name] = state
        for route in self.router.routes.values():
            if hasattr(route, "health_checked"):
                route.health_checked(state.name, state.health)

    async def _check(self, name: str, backend: Backend) -> BackendState:
        state = BackendState(name, getattr(getattr(backend, "settings", None), "type", None) or backend.name)
        t0 = time.perf_counter()
        try:
            health = await asyncio.wait_for(backend.health(), HEALTH_TIMEOUT_S)
        except TimeoutError:
            state.up, state.detail = False, f"no health answer within {HEALTH_TIMEOUT_S:g} s"
        except Exception as exc:  # a health check never takes the monitor down
            state.up, state.detail = False, f"health check failed: {exc or type(exc).__name__}"
        else:
            state.up, state.detail, state.reported, state.health = health.ok, health.detail, dict(health.metrics), health
            state.latency_ms = health.latency_ms
        if state.latency_ms is None:
            state.latency_ms = round((time.perf_counter() - t0) * 1000, 3)
        state.checked_at = time.time()
        return state

    # -- reading ----------------------------------------------------------------------------------

    def view(self) -> list[dict[str, Any]]:
        """What ``GET /infer/backends`` returns, and what the gauges are set from."""
        named = self.targets()
        return [self._view(name, backend) for name, backend in named.items()]

    async def read_loads(self) -> None:
        """Every remote's load figures read now (``fresh_load`` with no age allowed; a read already under
        way is shared), before ``/metrics`` and ``/infer/backends`` answer, within ``HEALTH_TIMEOUT_S``.
        Figures cached for ``LOAD_MAX_AGE_S`` (a route's) would show a change up to that late."""
        reads = [b.fresh_load(0.0) for b in self.targets().values() if hasattr(b, "fresh_load")]
        if reads:
            await asyncio.wait([asyncio.ensure_future(r) for r in reads], timeout=HEALTH_TIMEOUT_S)

    def _view(self, name: str, backend: Backend) -> dict[str, Any]:
        state = self.states.get(name) or BackendState(name, backend.name)
        local = _load(backend)
        reported = state.reported
        up = state.up
        if up and getattr(backend, "reported_load", None):  # read since the last check (a route, a scrape)
            reported = backend.reported_load  # type: ignore[attr-defined]
        if up is None and self.router.local is not None and name in self.router.local.started():
            up = True  # an in-process engine started since the last check: it runs in this process
        if up and _breaker_open(self.router, name):
            up = False
        in_flight = self.in_flight.get(name, 0) + _through_routes(self.router, name)
        waiting = local.get("requests_waiting", 0.0) + reported.get("requests_waiting", 0.0)
        running = reported.get("requests_running", local.get("requests_running"))
        if "requests_running" in reported:  # the gateway's requests the backend does not count yet wait there
            sent = in_flight - local.get("requests_waiting", 0.0)  # past the gateway's own max_inflight queue
            waiting = local.get("requests_waiting", 0.0) + max(reported.get("requests_waiting", 0.0),
                                                               sent - reported["requests_running"])
        kv = local.get("kv_cache_usage", reported.get("kv_cache_usage"))
        return {"name": name, "type": state.type, "up": up, "detail": state.detail,
                "health_latency_ms": state.latency_ms, "checked_at": state.checked_at, "in_flight": in_flight,
                "requests_running": running, "requests_waiting": waiting, "kv_cache_usage": kv, "reported": reported}

    def refresh(self) -> None:
        for view in self.view():
            name = view["name"]
            if view["up"] is not None:
                self.up.labels(name).set(1.0 if view["up"] else 0.0)
            self.gateway_in_flight.labels(name).set(view["in_flight"])
            self.waiting.labels(name).set(view["requests_waiting"])
            if view["requests_running"] is not None:
                self.running.labels(name).set(view["requests_running"])
            if view["kv_cache_usage"] is not None:
                self.kv_usage.labels(name).set(view["kv_cache_usage"])

    def any_up(self) -> list[str]:
        return [s.name for s in self.states.values() if s.up]

    def down(self) -> Iterable[BackendState]:
        return (s for s in self.states.values() if not s.up)


def _load(backend: Backend) -> dict[str, float]:
    current_load = getattr(backend, "current_load", None)
    if current_load is None:
        return {}
    try:
        return current_load()
    except Exception:  # advisory; an engine shutting down must not fail a scrape
        return {}


def _breaker_open(router: Router, name: str) -> bool:
    return any(m.name == name and m.breaker.state == "open"
               for route in router.routes.values() for m in getattr(route, "members", ()))


def _through_routes(router: Router, name: str) -> int:
    """Requests in flight to ``name`` as a route's member (the recorder counts them under the route)."""
    return sum(m.in_flight for route in router.routes.values() for m in getattr(route, "members", ()) if m.name == name)
