"""Which backend serves a request: :meth:`Router.resolve`, called once per request.

``infer serve --config FILE`` puts each ``backends:`` entry under its public ``name``; any other
model name goes to the in-process engine the request names (``request.engine``) or the server's
default (``adapters/engines/local.py``). The router also answers the model-management questions the
APIs ask across backends: listings, loaded models, unload, health.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from core.base import Backend, GenerationRequest, Health, LoadedModel, LocalBackend, ModelInfo
from adapters.engines.local import LocalEngines
from adapters.engines.scheduler import RunnerFailure
from core.errors import ModelNotFound


@dataclass
class Router:
    local: LocalEngines | None
    remotes: dict[str, Backend] = field(default_factory=dict)
    fixed: Backend | None = None  # one backend for every model (tests, embedding a custom backend)
    routes: dict[str, Backend] = field(default_factory=dict)  # routing.route.Route by public name

    @classmethod
    def single(cls, backend: Backend) -> "Router":
        return cls(local=None, fixed=backend)

    # -- routing --------------------------------------------------------------------------------

    def resolve(self, request: GenerationRequest) -> Backend:
        """The backend for ``request``; ModelNotFound when nothing serves its model."""
        return self.resolve_model(request.model, request.engine)

    def resolve_model(self, model: str, engine: str | None = None) -> Backend:
        if self.fixed is not None:
            return self.fixed
        named = self.routes.get(model) or self.remotes.get(model)
        if named is not None:
            return named
        return self.local_engine(model, engine)

    def resolve_embedding(self, model: str) -> Backend:
        if self.fixed is not None or model in self.remotes or model in self.routes:
            return self.resolve_model(model)
        return self._engines(model).for_embedding()

    def local_engine(self, model: str, engine: str | None = None) -> LocalBackend:
        return self._engines(model).get(engine)

    def is_remote(self, model: str) -> bool:
        return model in self.remotes or model in self.routes

    def _engines(self, model: str) -> LocalEngines:
        if self.local is None:
            raise ModelNotFound(model)
        return self.local

    # -- model management -----------------------------------------------------------------------

    async def load(self, model: str, *, engine: str | None = None, options: dict[str, Any] | None = None,
                   keep_alive: float | None = None) -> None:
        """Ollama's preload: a local model loads; a remote or fixed backend is already running."""
        backend = self.resolve_model(model, engine)
        if isinstance(backend, LocalBackend):
            await backend.load(model, options, keep_alive)

    def require(self, model: str) -> None:
        """ModelNotFound (404) for a model nobody serves."""
        backend = self.resolve_model(model)
        if isinstance(backend, LocalBackend):
            backend.details(model)

    async def unload(self, model: str) -> bool:
        if self.fixed is not None:
            return await self.fixed.unload(model)
        if model in self.remotes or model in self.routes:
            return False
        return await self.local.unload(model) if self.local is not None else False

    async def remote_models(self) -> list[ModelInfo]:
        """The models of the remote backends and the routes (everything not in the local store)."""
        named = [*self.remotes.values(), *self.routes.values()]
        return [m for b in named for m in await b.list_models()]

    async def list_models(self) -> list[ModelInfo]:
        local = await self.local.get().list_models() if self.local is not None else []
        return local + await self.remote_models()

    async def loaded_models(self) -> list[LoadedModel]:
        found = await asyncio.gather(*(b.loaded_models() for _, b in self._all()), return_exceptions=True)
        local = await self.local.loaded_models() if self.local is not None else []
        return local + [m for models in found if isinstance(models, list) for m in models]

    def runner_failures(self) -> list[RunnerFailure]:
        """Local models whose runners crashed and have not served since (``/api/ps``)."""
        return self.local.failures() if self.local is not None else []

    async def health(self) -> Health:
        checks = await self.health_by_name()
        return Health(ok=all(h.ok for h in checks.values()),
                      detail="; ".join(f"{n}: {h.detail}" for n, h in checks.items()) or "no backend started")

    async def health_by_name(self) -> dict[str, Health]:
        named = self._all(with_local=True)
        return dict(zip([n for n, _ in named], await asyncio.gather(*(b.health() for _, b in named))))

    async def aclose(self) -> None:
        for _, backend in self._all():
            await backend.aclose()
        if self.local is not None:
            await self.local.aclose()

    def _all(self, *, with_local: bool = False) -> list[tuple[str, Backend]]:
        """Every started backend by name: the fixed one, the local engines (``with_local``), the remotes."""
        named: list[tuple[str, Backend]] = [("backend", self.fixed)] if self.fixed is not None else []
        if with_local and self.local is not None:
            named += list(self.local.started().items())
        return named + list(self.remotes.items())
