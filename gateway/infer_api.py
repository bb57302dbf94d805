"""``/infer/*``: the gateway's own views, in JSON. ``GET /infer/routes``: per route and per backend,
over the route's SLO window: requests, good, shed, errors, attainment, goodput, TTFT/TPOT/e2e
percentiles, in flight, predictions now and their error, breaker state (``routing/route.py``)."""

from __future__ import annotations

from fastapi import APIRouter

from gateway.deps import RouterDep
from gateway.http.jsonwire import JSONBytes

router = APIRouter(tags=["infer"])


@router.get("/infer/routes")
async def routes(backends: RouterDep) -> JSONBytes:
    return JSONBytes({"routes": [route.snapshot() for route in backends.routes.values()]})
