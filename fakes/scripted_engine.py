"""The ``scripted`` engine: no model, a script of words; for tests, benchmarks and fault drills.

Offered only when the server runs with ``INFER_TEST_ENGINE=1`` (``LocalSettings.test_engine``). It
serves any model of the store, answering ``word0 word1 …`` (``num_predict`` words, 16 by default,
one token each) and obeys directives in the prompt's last message, which is how the fault tests
crash a real runner process the way native code does:

    delay:MS          sleep MS milliseconds before each word (the loop stays free)
    segv:N            read address 0 (``ctypes.string_at(0)``, SIGSEGV) after N words (0: before the first;
                      the words before it are sent 50 ms before)
    hang:N            block the whole process (the event loop too) after N words
    stall:N           stop producing after N words while the event loop still answers (a hung engine thread)
    exit:N            ``os._exit(3)`` after N words

Embeddings are 8 numbers derived from each input's bytes; an input containing ``segv:0`` crashes.
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import re
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from registry.details import ModelDetails
from registry.store import Store

from core.base import Chunk, Done, EmbedResult, GenerationRequest, LoadedModel, StreamEvent, Timings, Usage
from core.options import resolve_options
from core.settings import DEFAULTS, LocalSettings
from adapters.engines.store_models import model_details

_DIRECTIVE = re.compile(r"\b(delay|segv|hang|stall|exit):(\d+)\b")


def fault(kind: str) -> None:
    """Fail the way native code fails: a segfault, a hang holding the process, an abrupt exit."""
    if kind == "segv":
        ctypes.string_at(0)
    elif kind == "hang":
        while True:
            time.sleep(3600)
    elif kind == "exit":
        os._exit(3)


def directives(request: GenerationRequest) -> dict[str, int]:
    text = request.prompt or ""
    if request.messages:
        text = str(request.messages[-1].get("content") or "")
    return {name: int(value) for name, value in _DIRECTIVE.findall(text)}


@dataclass
class ScriptedBackend:
    store: Store
    settings: LocalSettings = field(default_factory=lambda: DEFAULTS)
    name: str = "scripted"
    can_stream: bool = True
    supports_embeddings: bool = True

    def __post_init__(self) -> None:
        self._loaded: dict[str, LoadedModel] = {}
        self._running = 0

    async def stream(self, request: GenerationRequest) -> AsyncIterator[StreamEvent]:
        details = self.details(request.model)
        options = resolve_options(details.parameters, request.options, defaults=self.settings.option_defaults)
        script = directives(request)
        count = options.num_predict if options.num_predict > 0 else 16
        timings, output = Timings(), []
        self._running += 1
        try:
            for i in range(count):
                for kind in ("segv", "hang", "exit"):
                    if script.get(kind) == i:
                        await asyncio.sleep(0.05 if i else 0)  # the words before it reach the gateway
                        fault(kind)
                if script.get("stall") == i:
                    await asyncio.Event().wait()  # never set: the runner's loop keeps answering pings
                if request.cancel.cancelled:
                    break
                if script.get("delay"):
                    await asyncio.sleep(script["delay"] / 1000)
                output.append(i)
                timings.token_times.append(time.perf_counter() - request.arrival)
                yield Chunk(f"word{i} " if i < count - 1 else f"word{i}", [i])
        finally:
            self._running -= 1
        timings.ttft = timings.token_times[0] if timings.token_times else None
        timings.total = time.perf_counter() - request.arrival
        reason = "cancelled" if request.cancel.cancelled else "length"
        yield Done(reason, Usage(input_tokens=4, output_tokens=len(output)), timings, prompt_tokens=[1, 2, 3, 4],
                   output_tokens=output)

    async def embed(self, model: str, inputs: list, *, truncate: bool = True,
                    keep_alive: float | None = None) -> EmbedResult:
        self.details(model)
        if any("segv:0" in str(item) for item in inputs):
            fault("segv")
        vectors = [[((sum(str(item).encode()) * (k + 1)) % 97) / 97 for k in range(8)] for item in inputs]
        return EmbedResult(vectors, sum(len(str(item).split()) for item in inputs))

    async def load(self, model: str, options: dict[str, Any] | None = None, keep_alive: float | None = None) -> None:
        details = self.details(model)
        resolved = resolve_options(details.parameters, options, defaults=self.settings.option_defaults)
        self._loaded[details.digest] = LoadedModel(details.name.display, self.name, 0, details.digest, None,
                                                   resolved.num_ctx)

    def details(self, model: str) -> ModelDetails:
        return model_details(self.store, model)

    async def loaded_models(self) -> list[LoadedModel]:
        return list(self._loaded.values())

    def current_load(self) -> dict[str, float]:
        return {"requests_running": float(self._running), "requests_waiting": 0.0}

    async def aclose(self) -> None:
        self._loaded.clear()
