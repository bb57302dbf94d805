"""The dashboard's JSON, read from the ledger in a worker thread (never on the event loop).

- ``GET /infer/requests?since=1h&limit=100&route=&backend=&status=``: recent ledger rows, newest first
  (``tpot_ms`` derived from e2e, TTFT and tokens where the backend reported none).
- ``GET /infer/series?since=1h&step=&route=&backend=&by=``: fixed buckets of counts, rates, attainment,
  latency percentiles, tokens and spend (``series.py``), and the period's totals; ``by=route`` adds each
  SLO route's series from the same read (the dashboard's tiles: one request, not one per route).
- ``GET /infer/keys?since=24h``: each API key's budget, what its period has spent and reserved, and
  its requests and spend in the ledger since ``since``.
- ``GET /infer/dashboard``: which optional views the page can poll (``GET /infer/backends``).

Who may read: ``gateway/policy/access.py`` (callers). With auth on, a caller's ledger key
(``sk-infer-…``) sees only its own rows and budget, an operator key sees everything.
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Request
from fastapi.responses import Response
from pydantic import BaseModel

from gateway.deps import DbDep, RouterDep, ViewerDep
from gateway.http.period import since_epoch
from gateway.http.jsonwire import JSONBytes, dumps
from gateway.ollama.wire_models import errors
from ledger.views import RowFilter, key_budgets, recent_requests, series_rows

from .series import bucket_seconds, build_series, tpot_ms, window_totals

router = APIRouter(tags=["infer"])
MAX_PERIOD_S = 90 * 86400.0


class RequestsPage(BaseModel):
    """``GET /infer/requests`` (documentation only)."""

    since: float
    requests: list[dict[str, Any]]


class Series(BaseModel):
    """``GET /infer/series`` (documentation only): ``buckets`` oldest first, each ``step_s`` wide."""

    since: float
    now: float
    step_s: float
    buckets: list[dict[str, Any]]
    totals: dict[str, Any]
    routes: dict[str, dict[str, Any]] | None = None  # by=route: each route's since/now/step_s/buckets/totals


class KeysView(BaseModel):
    """``GET /infer/keys`` (documentation only)."""

    since: float
    keys: list[dict[str, Any]]




class PageConfig(BaseModel):
    """``GET /infer/dashboard`` (documentation only): which optional views this server has."""

    views: dict[str, bool]


@router.get("/infer/dashboard", responses={200: {"model": PageConfig}, **errors()})
async def page_config(request: Request) -> JSONBytes:
    """What the page may poll besides its own views: ``backends`` when ``GET /infer/backends``
    (every backend's health and load) is served, so the page never asks for a missing one."""
    paths = request.app.openapi()["paths"]  # built once, then cached by FastAPI
    return JSONBytes({"views": {"backends": "/infer/backends" in paths}})


@router.get("/infer/requests", responses={200: {"model": RequestsPage}, **errors(400, 401)})
async def requests(db: DbDep, key_name: ViewerDep, since: str = "1h",
                   limit: Annotated[int, Query(ge=1, le=1000)] = 100, route: str | None = None,
                   backend: str | None = None, status: str | None = None) -> JSONBytes:
    """The newest ledger rows (route, backend, status, tokens, TTFT, TPOT, cost, …)."""
    start = since_epoch(since, MAX_PERIOD_S)
    rows = RowFilter(start, route=route or None, backend=backend or None, status=status or None, key_name=key_name)
    found = await asyncio.to_thread(recent_requests, db, rows, limit)
    for row in found:
        row["tpot_ms"] = tpot_ms(row["tpot_ms"], row["ttft_ms"], row["total_ms"], row["output_tokens"])
    return JSONBytes({"since": start, "requests": found})


@router.get("/infer/series", responses={200: {"model": Series}, **errors(400, 401)})
async def series(db: DbDep, key_name: ViewerDep, router: RouterDep, since: str = "1h",
                 step: Annotated[float | None, Query(gt=0, le=86400)] = None, route: str | None = None,
                 backend: str | None = None, by: Literal["route"] | None = None) -> Response:
    """Requests, sheds, errors, attainment, goodput, TTFT/TPOT/e2e percentiles and spend per bucket;
    with ``by=route`` also each route's own series (``routes``: every configured route, and any other the
    period's rows name), from the same read."""
    start = since_epoch(since, MAX_PERIOD_S)
    now = time.time()
    step_s = bucket_seconds(now - start, step)
    rows = RowFilter(start, route=route or None, backend=backend or None, key_name=key_name)

    def read() -> bytes:  # the read, the buckets and the encoding: all off the event loop
        found = series_rows(db, rows)
        body = _series(found, start, now, step_s)
        if by == "route":
            grouped: dict[str, list] = defaultdict(list)
            for row in found:
                if row.route_name:
                    grouped[row.route_name].append(row)
            names = sorted({*router.routes, *grouped})
            body["routes"] = {name: _series(grouped.get(name, []), start, now, step_s) for name in names}
        return dumps(body)
    return Response(await asyncio.to_thread(read), media_type="application/json")


def _series(rows: list, start: float, now: float, step_s: float) -> dict:
    buckets = build_series(rows, start, now, step_s)
    return {"since": start, "now": now, "step_s": step_s, "buckets": buckets, "totals": window_totals(buckets)}


@router.get("/infer/keys", responses={200: {"model": KeysView}, **errors(400, 401)})
async def keys(db: DbDep, key_name: ViewerDep, since: str = "24h") -> JSONBytes:
    """API keys: budget, spent and reserved this period, share used; requests and spend since ``since``."""
    start = since_epoch(since, MAX_PERIOD_S)
    found = await asyncio.to_thread(key_budgets, db, start, key_name)
    return JSONBytes({"since": start, "keys": found})
