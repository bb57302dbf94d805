"""``create_app(settings)``: the FastAPI app behind ``infer serve``.

State lives on ``app.state`` (set up in the lifespan): the backend, the store, the usage ledger's
engine, the metrics and the recorder. Tests pass their own ``backend``.
"""

from __future__ import annotations

import logging
from contextlib import asynccontextmanager

from fastapi import FastAPI

from adapters.base import Backend
from adapters.engines import in_process_backends
from adapters.llamacpp_pool import PoolSettings
from adapters.remote_registry import create_remote
from adapters.router import ModelRouter
from registry.store import Store

from . import errors
from .backends_config import load_config
from .bodies import JSONBodies
from .db import open_db
from .metrics import GatewayMetrics
from .recorder import Recorder
from .routes import health, ollama_generate, ollama_models, openai_chat, openai_models
from .security import GuardMiddleware
from .settings import ServerSettings

log = logging.getLogger(__name__)


def create_app(settings: ServerSettings, backend: Backend | None = None) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI):
        store = Store(settings.registry.models)
        app.state.settings = settings
        app.state.store = store
        app.state.backend = backend or default_backend(settings, store)
        app.state.engine = open_db(settings.database_url)
        app.state.metrics = GatewayMetrics()
        app.state.recorder = Recorder(app.state.engine, app.state.metrics)
        try:
            yield
        finally:
            await app.state.recorder.drain()
            await app.state.backend.aclose()
            app.state.engine.dispose()

    app = FastAPI(title="infer", version=health.VERSION, lifespan=lifespan, docs_url=None, redoc_url=None)
    errors.install(app)
    app.add_middleware(JSONBodies)
    app.add_middleware(GuardMiddleware, settings=settings)  # added last: runs first
    for module in (health, ollama_generate, ollama_models, openai_chat, openai_models):
        app.include_router(module.router)
    return app


def default_backend(settings: ServerSettings, store: Store) -> Backend:
    """The store's in-process engines, behind the remote backends of ``settings.config`` when there is one."""
    pool = PoolSettings(num_parallel=settings.num_parallel, max_queue=settings.max_queue,
                        max_loaded_models=settings.max_loaded_models, keep_alive=settings.keep_alive)
    local = in_process_backends(store, default=settings.engine, defaults={"num_ctx": settings.context_length},
                                keep_alive=settings.keep_alive, pool_settings=pool)
    if settings.config is None:
        return local
    remotes = {s.name: create_remote(s) for s in load_config(settings.config).remote_settings()}
    return ModelRouter(local, remotes)
