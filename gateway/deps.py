"""Typed dependencies: route handlers list these instead of reaching into ``app.state``.

All are ``async def``: FastAPI runs a plain ``def`` dependency in a worker thread, a thread hop per
dependency per request.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request
from sqlalchemy import Engine

from gateway.serving.router import Router
from registry.store import Store

from gateway.policy.access import Principal
from gateway.http.errors import APIError
from gateway.http.hints import caller_of
from gateway.serving.recorder import Recorder
from core.settings import ServerSettings


async def _router(request: Request) -> Router:
    return request.app.state.router


async def _store(request: Request) -> Store:
    return request.app.state.store


async def _recorder(request: Request) -> Recorder:
    return request.app.state.recorder


async def _settings(request: Request) -> ServerSettings:
    return request.app.state.settings


async def _db(request: Request) -> Engine:
    return request.app.state.db


async def client_of(request: Request) -> str | None:
    return client_from(request.headers, request.scope)


def client_from(headers, scope) -> str | None:
    """What the ledger's ``client`` column shows: the User-Agent, else the peer address."""
    agent = headers.get("user-agent")
    if agent:
        return agent[:200]
    peer = scope.get("client")
    return peer[0] if peer else None


RouterDep = Annotated[Router, Depends(_router)]
StoreDep = Annotated[Store, Depends(_store)]
RecorderDep = Annotated[Recorder, Depends(_recorder)]
SettingsDep = Annotated[ServerSettings, Depends(_settings)]
DbDep = Annotated[Engine, Depends(_db)]
ClientDep = Annotated[str | None, Depends(client_of)]


async def viewer(request: Request) -> str | None:
    """Whose rows a view shows: ``None``, every row (an operator, or a server without auth); a ledger
    key's name, that key's rows only. The access policy has already let the request in."""
    principal = caller_of(request.scope)
    if principal is None or principal.operator or not request.app.state.access.required:
        return None
    return principal.name


async def caller(request: Request) -> Principal | None:
    """Who sent the request (``gateway/policy/access.py``): None without a key on a server without auth."""
    return caller_of(request.scope)


def check_model(principal: Principal | None, model: str) -> None:
    """403 when the request's key may not use ``model`` (its ``--routes``)."""
    if principal is not None and not principal.allows(model):
        raise APIError(403, f"key '{principal.name}' may not use '{model}' (its routes: "
                            f"{', '.join(principal.key.routes)})", param="model")


ViewerDep = Annotated[str | None, Depends(viewer)]
CallerDep = Annotated[Principal | None, Depends(caller)]
