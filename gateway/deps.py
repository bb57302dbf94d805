"""Typed dependencies: route handlers list these instead of reaching into ``app.state``.

All are ``async def``: FastAPI runs a plain ``def`` dependency in a worker thread, a thread hop per
dependency per request.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request
from sqlalchemy import Engine

from adapters.router import Router
from registry.store import Store

from gateway.recorder import Recorder
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
