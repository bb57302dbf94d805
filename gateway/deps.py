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

from gateway.http.errors import APIError
from gateway.serving.recorder import Recorder
from gateway.settings import ServerSettings


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
    """``None``: may see every row; a key's name: may see that key's rows only."""
    keys = request.app.state.keys
    if not keys.required:
        return None
    scheme, _, bearer = request.headers.get("authorization", "").partition(" ")
    bearer = bearer.strip()
    if scheme.lower() == "bearer" and request.app.state.settings.key_allowed(bearer):
        return None
    if scheme.lower() != "bearer" or not bearer.startswith("sk-infer-"):
        raise APIError(401, "this server requires an API key: send 'Authorization: Bearer <key>' "
                            "(the dashboard asks for it once)")
    return (await keys.identify(bearer)).name


async def operator(request: Request) -> None:
    """With ``auth: {required: true}``, only an operator key (``INFER_API_KEYS``) may read views that
    cover every key (``GET /infer/cost``); a ledger key gets 403."""
    if await viewer(request) is not None:
        raise APIError(403, "this view covers every key: send an operator key (one of INFER_API_KEYS)")


ViewerDep = Annotated[str | None, Depends(viewer)]
OperatorDep = Annotated[None, Depends(operator)]
