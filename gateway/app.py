"""``create_app(settings)``: the FastAPI app behind ``infer serve``.

State lives on ``app.state`` (set up in the lifespan): the router that resolves each request's
backend, the store, the ledger database and its writer, the metrics and the recorder. Tests may
pass one ``backend`` that serves every model.

The request path: API route → ``Recorder.resolve`` (``Router.resolve``, once) → the backend's
stream (Chunk…, Done; a local model's from its runner process, ``adapters/engines/runner/``) → the
response → one ledger row through the writer thread.
"""

from __future__ import annotations

import asyncio
import gc
import logging
from contextlib import asynccontextmanager

from fastapi import FastAPI

from core.base import Backend
from adapters.remote.registry import create_remote
from adapters.engines.runner.backend import runner_engines
from gateway.serving.router import Router
from pricing.book import PriceBook
from routing.build import build_routes
from routing.kv_events import start_subscribers
from routing.metrics import RouteMetrics
from ledger.db import open_db
from ledger.writer import LedgerWriter
from registry.store import Store

from gateway import dashboard, health, infer_api, wire_docs
from gateway.anthropic import routes as anthropic_routes
from gateway.backends_config import AuthEntry, GatewayConfig, load_config
from gateway.http import errors
from gateway.policy.access import AccessPolicy
from gateway.http.bodies import JSONBodies
from gateway.http.guards import GuardMiddleware
from gateway.http.hot import HotRoutes
from gateway.http.limits import RequestBounds
from gateway.observability.metrics import GatewayMetrics
from gateway.observability.monitor import BackendMonitor
from gateway.ollama import generate as ollama_generate, models as ollama_models
from gateway.openai import generate as openai_generate, models as openai_models, responses_routes
from gateway.policy.keys import KeyBook
from gateway.serving.recorder import Recorder
from core.settings import ServerSettings
from gateway.observability.tracing import TraceContextMiddleware, tracer_from_env

log = logging.getLogger(__name__)


def create_app(settings: ServerSettings, backend: Backend | Router | None = None) -> FastAPI:
    tracer = tracer_from_env()

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        store = Store(settings.registry.models)
        config = load_config(settings.config) if settings.config is not None else None
        app.state.settings = settings
        app.state.store = store
        app.state.router = _router(backend) if backend is not None else default_router(settings, store, config)
        app.state.prices = PriceBook(config.priced(settings.registry.home)) if config is not None else None
        app.state.db = open_db(settings.database_url)
        app.state.ledger = LedgerWriter(app.state.db)
        app.state.metrics = GatewayMetrics()
        auth = config.auth if config is not None else AuthEntry()
        app.state.keys = KeyBook(app.state.db, redis=_redis(settings.redis_url), fail_open=auth.rate_limits_fail_open,
                                 hold_ttl_s=settings.hold_ttl_s)
        app.state.access = AccessPolicy.build(app.routes, required=auth.required or bool(settings.api_key_hashes),
                                              operator_hashes=settings.api_key_hashes, public=auth.public())
        app.state.monitor = app.state.metrics.monitor = BackendMonitor(app.state.router, app.state.metrics.registry)
        app.state.tracer = tracer
        if tracer is not None:
            for remote in app.state.router.remotes.values():
                remote.inject = tracer.inject
        app.state.recorder = Recorder(app.state.ledger, app.state.metrics, prices=app.state.prices,
                                      keys=app.state.keys, monitor=app.state.monitor, tracer=tracer)
        app.state.loop = asyncio.get_running_loop()
        routes = list(app.state.router.routes.values())
        pollers = [asyncio.create_task(app.state.monitor.run())]  # also tells the routes their members' health
        pollers += start_subscribers(list({id(s): s for r in routes for s in r.kv_sources.values()}.values()))
        if routes:
            app.state.metrics.routes = RouteMetrics(app.state.metrics.registry, routes)
            for route in routes:
                route.on_outcome.append(app.state.metrics.routes.outcome)
        gc.collect()
        gc.freeze()  # the startup heap (modules, settings) out of every full collection: one would hold the loop ~70 ms
        try:
            yield
        finally:
            for task in pollers:
                task.cancel()
            await app.state.recorder.settle()
            await app.state.keys.aclose()  # leases' unused room back to the budgets
            await app.state.router.aclose()
            app.state.ledger.close()
            app.state.db.dispose()
            if app.state.keys.redis is not None:
                await app.state.keys.redis.aclose()
            if tracer is not None:
                await tracer.aclose()  # flushes the last spans

    app = FastAPI(title="infer", version=health.VERSION, lifespan=lifespan, docs_url=None, redoc_url=None)
    errors.install(app)
    wire_docs.install(app)  # validation errors are 400, so the schema has no 422s
    app.add_middleware(JSONBodies)  # for FastAPI's routes: the hot routes parse any body as JSON themselves
    app.add_middleware(HotRoutes, routes={openai_generate.CHAT_ROUTE: openai_generate.hot_chat,
                                          "/api/chat": ollama_generate.hot_chat})
    app.add_middleware(RequestBounds, max_messages=settings.max_messages, max_tools=settings.max_tools)
    app.add_middleware(GuardMiddleware, settings=settings)
    if tracer is not None:
        app.add_middleware(TraceContextMiddleware, tracer=tracer)  # added last: runs first
    modules = (openai_generate, ollama_generate, anthropic_routes, responses_routes, openai_models, ollama_models,
               health, infer_api, dashboard)  # hot first
    for module in modules:
        app.include_router(module.router)
    return app


def begin_shutdown(app: FastAPI, grace: float) -> None:
    """From a signal handler: running requests get ``grace`` seconds (less one, so their error events
    leave before the server's own cut), then end with an error event and their ledger row."""
    loop = getattr(app.state, "loop", None)
    if loop is not None and not loop.is_closed():
        recorder = app.state.recorder
        loop.call_soon_threadsafe(lambda: loop.create_task(recorder.stop_after(max(0.0, grace - 1.0))))


def _runner_log_level() -> str:
    """Runners log at the gateway's level (``infer serve --log-level``)."""
    return logging.getLevelName(logging.getLogger().getEffectiveLevel()).lower()


def _redis(url: str | None):
    if url is None:
        return None
    import redis.asyncio

    return redis.asyncio.Redis.from_url(url)


def _router(backend: Backend | Router) -> Router:
    return backend if isinstance(backend, Router) else Router.single(backend)


def default_router(settings: ServerSettings, store: Store, config: GatewayConfig | None = None) -> Router:
    """The store's engines (each model in a runner process), behind the remote backends and routes of the
    config file. Called in the lifespan, on the event loop."""
    local = runner_engines(store, settings.local, log_level=_runner_log_level())
    if config is None:
        return Router(local)
    remotes = {s.name: create_remote(s) for s in config.remote_settings()}
    routes = build_routes(config.routes, remotes, lambda name: local.get(), config.kv_event_sources())
    return Router(local, remotes, routes=routes)
