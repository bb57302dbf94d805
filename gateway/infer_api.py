"""``/infer/*``: the gateway's own views, in JSON. ``GET /infer/backends``: each backend's health,
in flight, running, waiting and KV-cache use (``gateway/observability/monitor.py``). ``GET /infer/routes``: per route and per backend,
over the route's SLO window: requests, good, shed, errors, attainment, goodput, TTFT/TPOT/e2e
percentiles, in flight, predictions now and their error, breaker state (``routing/route.py``).
``GET /infer/cost``: ``infer cost --json``. Who may read them: ``gateway/policy/access.py`` (with auth
on, the routes and backends need a key, the cost report an operator key)."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Request
from pydantic import BaseModel

from gateway.deps import DbDep, RouterDep
from gateway.http.errors import APIError
from pricing.settle import cost_report
from gateway.http.jsonwire import JSONBytes
from gateway.http.period import since_epoch
from gateway.ollama.wire_models import errors

router = APIRouter(tags=["infer"])


class RouteView(BaseModel):
    """One route of ``GET /infer/routes`` (documentation only; the window's fields vary with the route)."""

    name: str
    strategy: str
    slo: dict[str, Any]
    backends: list[dict[str, Any]]


class RoutesResponse(BaseModel):
    routes: list[RouteView]


class CostReport(BaseModel):
    """``GET /infer/cost`` (documentation only): ``groups`` per ``by`` key, ``bills`` per hour-priced backend."""

    since: str
    by: str
    groups: list[dict[str, Any]]
    bills: dict[str, dict[str, Any]]


@router.get("/infer/routes", responses={200: {"model": RoutesResponse}, **errors(401)})
async def routes(backends: RouterDep) -> JSONBytes:
    return JSONBytes({"routes": [route.snapshot() for route in backends.routes.values()]})


class BackendView(BaseModel):
    """One backend of ``GET /infer/backends`` (``gateway/observability/monitor.py``)."""

    name: str
    type: str
    up: bool | None
    detail: str
    health_latency_ms: float | None
    checked_at: float | None
    in_flight: int
    requests_running: float | None
    requests_waiting: float
    kv_cache_usage: float | None
    reported: dict[str, float]


class BackendsResponse(BaseModel):
    backends: list[BackendView]


@router.get("/infer/backends", responses={200: {"model": BackendsResponse}, **errors(401)})
async def backends_view(request: Request) -> JSONBytes:
    """Every backend: its last health check, the gateway's requests in flight to it, and its load
    (running, waiting, KV-cache use) as ``/metrics`` shows it."""
    await request.app.state.monitor.read_loads()
    return JSONBytes({"backends": request.app.state.monitor.view()})


@router.get("/infer/cost", responses={200: {"model": CostReport}, **errors(400, 401, 403)})
async def cost(request: Request, db: DbDep, since: str = "24h",
               by: str = "backend") -> JSONBytes:
    """What ``infer cost --json`` prints: requests since ``since`` grouped ``by`` backend, route,
    model, key or day, settled against each hour-priced backend's bill (with its output weight and
    where that came from)."""
    start = since_epoch(since)
    config_prices = getattr(request.app.state, "prices", None)
    prices = config_prices.priced if config_prices is not None else []
    try:
        report = await asyncio.to_thread(cost_report, db, prices, since=start, by=by)
    except ValueError as exc:
        raise APIError(400, str(exc), param="by") from None
    return JSONBytes(report)
