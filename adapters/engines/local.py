"""The engines over the local store by name: llama.cpp (default), the native PyTorch engine, and
``scripted`` (no model; offered with ``INFER_TEST_ENGINE=1``).

:class:`LocalEngines` creates each engine's backend on first use and hands it out by name; it serves
no request itself. ``gateway/serving/router.py`` asks it for the engine a request names
(``request.engine``, else the server's default). Both ``infer serve`` and ``infer run --local`` build it
in ``adapters/engines/runner/backend.py``: runner backends over one scheduler, each model's runner a
process (``runner_engines``) or, for ``infer run --local``, a thread of the CLI's process
(``in_process_engines``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from core.base import LoadedModel, LocalBackend
from core.errors import InvalidRequest
from adapters.engines.scheduler import RunnerFailure, RunnerScheduler

ENGINES = ("llamacpp", "native")
TEST_ENGINE = "scripted"


def check_engine(name: str, offered: tuple[str, ...] | list[str] = ENGINES) -> str:
    if name not in offered:
        raise InvalidRequest(f"unknown engine {name!r}: choose one of {', '.join(offered)}", param="engine")
    return name


@dataclass
class LocalEngines:
    factories: dict[str, Callable[[], LocalBackend]]
    scheduler: RunnerScheduler  # the runners' of every engine
    default: str = "llamacpp"
    _started: dict[str, LocalBackend] = field(default_factory=dict)

    def get(self, engine: str | None = None) -> LocalBackend:
        """The engine ``engine`` (None = the default), started on first use."""
        engine = check_engine(engine or self.default, list(self.factories))
        if engine not in self._started:
            self._started[engine] = self.factories[engine]()
        return self._started[engine]

    def for_embedding(self) -> LocalBackend:
        backend = self.get()
        return backend if backend.supports_embeddings else self.get("llamacpp")

    def failures(self) -> list[RunnerFailure]:
        return self.scheduler.failures()

    def started(self) -> dict[str, LocalBackend]:
        return dict(self._started)

    async def loaded_models(self) -> list[LoadedModel]:
        return [m for b in self._started.values() for m in await b.loaded_models()]

    async def unload(self, model: str) -> bool:
        return any([await b.unload(model) for b in list(self._started.values())])

    async def aclose(self) -> None:
        for backend in self._started.values():
            await backend.aclose()
        self._started.clear()
        await self.scheduler.aclose()

