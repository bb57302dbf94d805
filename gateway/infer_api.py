"""``/infer/*``: the gateway's own views, in JSON. ``GET /infer/routes``: per route and per backend,
over the route's SLO window: requests, good, shed, errors, attainment, goodput, TTFT/TPOT/e2e
percentiles, in flight, predictions now and their error, breaker state (``routing/route.py``)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from pydantic import BaseModel

from gateway.deps import RouterDep
from gateway.http.jsonwire import JSONBytes
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


@router.get("/infer/routes", responses={200: {"model": RoutesResponse}, **errors()})
async def routes(backends: RouterDep) -> JSONBytes:
    return JSONBytes({"routes": [route.snapshot() for route in backends.routes.values()]})
