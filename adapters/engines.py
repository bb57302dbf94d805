"""The in-process engines behind one backend: llama.cpp (default) and the native PyTorch engine.

A request picks one with the option ``"engine": "native"`` (Ollama ``options`` or an OpenAI body
field); otherwise the server's default (``INFER_ENGINE``) serves it. Engines are created on first use.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from .base import Backend, EmbedResult, GenerationRequest, Health, LoadedModel, ModelInfo, StreamEvent
from .errors import InvalidRequest

ENGINES = ("llamacpp", "native")


def check_engine(name: str) -> str:
    if name not in ENGINES:
        raise InvalidRequest(f"unknown engine {name!r}: choose one of {', '.join(ENGINES)}", param="engine")
    return name


@dataclass
class EngineSelector:
    factories: dict[str, Callable[[], Backend]]
    default: str = "llamacpp"
    name: str = "engines"
    can_stream: bool = True
    supports_embeddings: bool = True
    _backends: dict[str, Backend] = field(default_factory=dict)

    def backend(self, engine: str | None = None) -> Backend:
        engine = check_engine(engine or self.default)
        if engine not in self._backends:
            self._backends[engine] = self.factories[engine]()
        return self._backends[engine]

    def for_request(self, options: dict[str, Any] | None, *, embedding: bool = False, model: str | None = None) -> Backend:
        backend = self.backend((options or {}).get("engine"))
        if embedding and not backend.supports_embeddings:
            return self.backend("llamacpp")
        return backend

    async def stream(self, request: GenerationRequest) -> AsyncIterator[StreamEvent]:
        async for event in self.for_request(request.options).stream(request):
            yield event

    async def load(self, model: str, options: dict[str, Any] | None = None, keep_alive: float | None = None) -> None:
        await self.for_request(options).load(model, options, keep_alive)

    async def embed(self, model: str, inputs: list[str], *, truncate: bool = True,
                    keep_alive: float | None = None) -> EmbedResult:
        backend = self.for_request(None, embedding=True)
        return await backend.embed(model, inputs, truncate=truncate, keep_alive=keep_alive)

    def details(self, model: str):
        return self.backend().details(model)

    async def list_models(self) -> list[ModelInfo]:
        return await self.backend().list_models()

    async def loaded_models(self) -> list[LoadedModel]:
        return [m for b in self._backends.values() for m in await b.loaded_models()]

    async def unload(self, model: str) -> bool:
        return any([await b.unload(model) for b in list(self._backends.values())])

    async def health(self) -> Health:
        checks = {name: await b.health() for name, b in self._backends.items()}
        return Health(ok=all(h.ok for h in checks.values()),
                      detail="; ".join(f"{n}: {h.detail}" for n, h in checks.items()) or "no engine started")

    async def aclose(self) -> None:
        for backend in self._backends.values():
            await backend.aclose()
        self._backends.clear()


def in_process_backends(store, *, default: str, defaults: dict[str, Any], keep_alive: float,
                        pool_settings=None, native_settings=None) -> EngineSelector:
    """Both engines over ``store``; ``defaults`` are option defaults (``num_ctx``)."""

    def llamacpp() -> Backend:
        from .llamacpp import LlamaCppBackend, PoolSettings

        return LlamaCppBackend(store=store, pool_settings=pool_settings or PoolSettings(), defaults=defaults)

    def native() -> Backend:
        from .native import NativeBackend, NativeSettings

        return NativeBackend(store=store, settings=native_settings or NativeSettings(), defaults=defaults,
                             keep_alive=keep_alive)

    return EngineSelector({"llamacpp": llamacpp, "native": native}, default=check_engine(default))
