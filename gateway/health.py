"""``/`` and ``/api/version`` (the probes clients use) and ``/metrics`` (Prometheus)."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

from fastapi import APIRouter, Request
from fastapi.responses import PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

try:
    VERSION = version("infer")
except PackageNotFoundError:  # running from a source tree that was not installed
    VERSION = "0.0.0"

router = APIRouter(tags=["health"])


@router.api_route("/", methods=["GET", "HEAD"], response_class=PlainTextResponse)
async def root() -> str:
    return "Ollama is running"


@router.api_route("/api/version", methods=["GET", "HEAD"])
async def api_version() -> dict:
    return {"version": VERSION}


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    return Response(request.app.state.metrics.render(), media_type=CONTENT_TYPE_LATEST)
