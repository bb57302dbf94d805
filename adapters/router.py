"""Model name -> backend: the configured remote backends first, then the local store's engines.

``infer serve --config FILE`` puts each ``backends:`` entry under its public ``name``; any other
model name goes to the in-process engines (``adapters/engines.py``), which serve the local store.
The gateway only ever sees this one :class:`~adapters.base.Backend`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from .base import Backend, EmbedResult, GenerationRequest, Health, LoadedModel, ModelInfo, StreamEvent, serving_backend
from .errors import ModelNotFound


@dataclass
class ModelRouter:
    local: Backend | None
    remotes: dict[str, Backend] = field(default_factory=dict)
    name: str = "router"
    can_stream: bool = True
    supports_embeddings: bool = True

    def for_request(self, options: dict[str, Any] | None, *, embedding: bool = False,
                    model: str | None = None) -> Backend:
        if model is not None and model in self.remotes:
            return self.remotes[model]
        if self.local is None:
            raise ModelNotFound(model or "")
        return serving_backend(self.local, options, embedding=embedding, model=model)

    async def stream(self, request: GenerationRequest) -> AsyncIterator[StreamEvent]:
        async for event in self.for_request(request.options, model=request.model).stream(request):
            yield event

    async def embed(self, model: str, inputs: list[str], *, truncate: bool = True,
                    keep_alive: float | None = None) -> EmbedResult:
        backend = self.for_request(None, embedding=True, model=model)
        return await backend.embed(model, inputs, truncate=truncate, keep_alive=keep_alive)

    async def load(self, model: str, options: dict[str, Any] | None = None, keep_alive: float | None = None) -> None:
        """Ollama's preload: local models load; a remote backend is already running."""
        if model in self.remotes:
            return
        loader = getattr(self.local, "load", None)
        if loader is not None:
            await loader(model, options, keep_alive)
        else:
            self.details(model)

    def details(self, model: str):
        """Raises ModelNotFound for a model nobody serves (Ollama's load/unload check); a remote
        model has no local details, so its backend stands in."""
        if model in self.remotes:
            return self.remotes[model]
        if self.local is None:
            raise ModelNotFound(model)
        return self.local.details(model)  # type: ignore[attr-defined]

    async def remote_models(self) -> list[ModelInfo]:
        return [m for b in self.remotes.values() for m in await b.list_models()]

    async def list_models(self) -> list[ModelInfo]:
        local = await self.local.list_models() if self.local is not None else []
        return local + await self.remote_models()

    async def loaded_models(self) -> list[LoadedModel]:
        found = await asyncio.gather(*(b.loaded_models() for _, b in self._all()), return_exceptions=True)
        return [m for models in found if isinstance(models, list) for m in models]

    async def unload(self, model: str) -> bool:
        if model in self.remotes:
            return await self.remotes[model].unload(model)
        return await self.local.unload(model) if self.local is not None else False

    async def health(self) -> Health:
        checks = await self.health_by_name()
        return Health(ok=all(h.ok for h in checks.values()),
                      detail="; ".join(f"{n}: {h.detail}" for n, h in checks.items()))

    async def health_by_name(self) -> dict[str, Health]:
        named = self._all()
        return dict(zip([n for n, _ in named], await asyncio.gather(*(b.health() for _, b in named))))

    async def aclose(self) -> None:
        for _, backend in self._all():
            await backend.aclose()

    def _all(self) -> list[tuple[str, Backend]]:
        """Every backend by name: ``local`` for the store's engines, then the remotes."""
        return ([("local", self.local)] if self.local is not None else []) + list(self.remotes.items())
