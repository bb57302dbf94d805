"""``GET /dashboard``: the page, and ``GET /dashboard/<file>``: its script and style, shipped in the
package (``static/``, package data) and read once. No build step, nothing fetched from elsewhere:
the Content-Security-Policy allows this origin only, so the page works offline.

The page itself holds no data, so it is served without a key; the JSON it polls is guarded like
the rest of the API (``api.py``), and a key typed into the page is sent as a Bearer token.
"""

from __future__ import annotations

from functools import cache
from importlib.resources import files

from fastapi import APIRouter
from fastapi.responses import Response

from gateway.http.errors import APIError

router = APIRouter(include_in_schema=False)
FILES = {"index.html": "text/html; charset=utf-8", "dashboard.js": "text/javascript; charset=utf-8",
         "charts.js": "text/javascript; charset=utf-8", "dashboard.css": "text/css; charset=utf-8"}
HEADERS = {"content-security-policy": "default-src 'self'; img-src 'self' data:; style-src 'self'; "
                                      "script-src 'self'; connect-src 'self'; frame-ancestors 'none'",
           "cache-control": "no-cache", "x-content-type-options": "nosniff"}


@cache
def _read(name: str) -> bytes:
    return files("gateway.dashboard").joinpath("static", name).read_bytes()


@router.get("/dashboard")
@router.get("/dashboard/")
async def dashboard() -> Response:
    """The page at both addresses (its assets are linked by absolute path): ``curl /dashboard`` gets it."""
    return _file("index.html")


@router.get("/dashboard/{name}")
async def asset(name: str) -> Response:
    if name not in FILES:
        raise APIError(404, f"no dashboard file '{name}'")
    return _file(name)


def _file(name: str) -> Response:
    return Response(_read(name), media_type=FILES[name], headers=HEADERS)
