"""One scheduler for the local models of every engine: which runners run, and for how long. It is the
only keep-alive of ``infer serve`` and of ``infer run --local`` alike.

A *runner* serves one model with one engine: a process of ``infer serve``, a thread of ``infer run
--local`` (``runner/client.py``: ``RunnerThread``; the rules below are the same for both, only a crash
of native code takes the whole CLI down). It is started on a model's first request, as Ollama's
``server/sched.go`` does, loaded with that request's options. A later request with other load
options (``Options.load_key``: context size, batch, GPU layers) is served by the same runner, which
opens a context for them next to the first (Ollama restarts its runner instead; a context costs a
few MiB, a new process seconds). The scheduler owns every rule about a runner's life, once:

- **keep-alive**: a runner with no request in flight stops ``keep_alive`` seconds after its last
  request ended (the request's own ``keep_alive``, else the server's; < 0 = never; 0 = at once);
- **max_loaded_models**: before a new runner starts, the idle runner that expires first stops; when
  every runner is busy, the request waits until one is idle (``max_queue`` bound: 503 past it);
- **memory**: before a new runner starts, idle runners stop (the first to expire first) while the
  system's available memory is below the new model's estimated need; when nothing idle is left the
  runner starts anyway, and the OOM killer's SIGKILL is a crash like any other;
- **unload** (``infer stop``, ``keep_alive: 0``) waits for the requests in flight, then stops it;
- **crashes**: a runner that dies is forgotten at once (its requests already got their error from
  the runner client) and the next request starts a fresh one; each crash in a row without a
  finished request in between doubles a back-off (1 s after the second, up to 60 s) during which
  requests for that model get a 503 that says why, as ``/api/ps`` (``failures``) and the log do.

A native runner serves every model made of its weights: a model that adds a LoRA adapter (``ADAPTER``)
to a loaded base, or two adapters on one base, run in the same runner and the same batches
(``SHARED_WEIGHTS_ENGINES``; llama.cpp applies an adapter per context, so each model has its runner).

The scheduler does no I/O of its own: ``start(engine, details, options)`` starts and loads a runner
(``adapters/engines/runner/backend.py``: ``RunnerStarter``), ``available_memory()`` reads /proc/meminfo.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from registry.details import ModelDetails

from core.errors import QueueFull, RunnerBackoff, RunnerStopped
from core.options import Options
from core.settings import LocalSettings

SHARED_WEIGHTS_ENGINES = ("native",)  # engines whose one runner serves every model of the same weights
log = logging.getLogger(__name__)

BACKOFF_MAX_S = 60.0


class Runner(Protocol):
    engine: str
    pid: int
    pids: list[int]  # every process (a tensor-parallel group has one per rank), ``pid`` first
    context_length: int
    failure: str | None
    on_exit: Callable[[Any, str], None] | None
    load_stats: dict[str, float]

    def memory(self) -> int: ...

    def kill(self, why: str) -> None: ...

    async def stop(self) -> None: ...


Start = Callable[[str, ModelDetails, Options], Awaitable[Runner]]


@dataclass(eq=False)
class Loaded:
    """One runner as the scheduler sees it."""

    key: tuple
    engine: str
    name: str
    digest: str
    size: int
    runner: Runner | None = None
    ready: asyncio.Future | None = None
    active: int = 0
    expires_at: float | None = None
    unload_when_idle: bool = False
    timer: asyncio.TimerHandle | None = None

    @property
    def idle(self) -> bool:
        return self.active == 0 and self.ready is not None and self.ready.done()


@dataclass
class RunnerFailure:
    """A model whose runner crashed, until one of its requests finishes again."""

    name: str
    engine: str
    count: int
    why: str
    at: float  # wall clock
    retry_at: float  # wall clock; before it, requests are refused


@dataclass
class RunnerScheduler:
    settings: LocalSettings
    start: Start
    available_memory: Callable[[], int | None] = field(default=lambda: available_memory())

    def __post_init__(self) -> None:
        self._loaded: dict[tuple, Loaded] = {}
        self._room = asyncio.Condition()
        self._waiting = 0
        self.crashes: dict[tuple[str, str], RunnerFailure] = {}
        self.closing: list[Callable[[], Awaitable[None]]] = []  # run once by aclose (the starter's spares)
        self._closed = False

    def failures(self) -> list[RunnerFailure]:
        return list(self.crashes.values())

    def runners(self, engine: str | None = None) -> list[Loaded]:
        return [e for e in self._loaded.values() if engine is None or e.engine == engine]

    # -- requests --------------------------------------------------------------------------------

    async def acquire(self, engine: str, details: ModelDetails, options: Options) -> tuple[Loaded, float]:
        """A loaded runner for the request, counted busy until :meth:`release`; seconds spent loading."""
        self._check_backoff(engine, details)
        key = (engine, details.base_digest if engine in SHARED_WEIGHTS_ENGINES else details.digest)
        t0 = time.perf_counter()
        async with self._room:
            entry = self._loaded.get(key)
            if entry is None:
                await self._make_room(details)
                entry = self._loaded.get(key) or self._begin(key, engine, details, options)
            entry.active += 1
            entry.unload_when_idle = False
            _cancel_timer(entry)
        loading = not entry.ready.done()
        try:
            await asyncio.shield(entry.ready)
        except BaseException:
            await self.release(entry, None, ok=False)
            raise
        return entry, time.perf_counter() - t0 if loading else 0.0

    async def release(self, entry: Loaded, keep_alive: float | None, *, ok: bool = True) -> None:
        """The request is over; ``ok``: it finished (a crash streak ends)."""
        if ok:
            self.crashes.pop((entry.engine, entry.digest), None)
        async with self._room:
            entry.active -= 1
            if entry.active == 0 and self._loaded.get(entry.key) is entry:
                seconds = self.settings.keep_alive if keep_alive is None else keep_alive
                self._expire_in(entry, 0 if entry.unload_when_idle else seconds)
            self._room.notify_all()

    def _check_backoff(self, engine: str, details: ModelDetails) -> None:
        crash = self.crashes.get((engine, details.digest))
        if crash is not None and time.time() < crash.retry_at:
            left = crash.retry_at - time.time()
            raise RunnerBackoff(f"the {engine} runner of {details.name.display} crashed {crash.count} times in a row "
                                f"(last: {crash.why}); the next start is in {left:.0f} s", retry_after=left)

    # -- starting --------------------------------------------------------------------------------

    def _begin(self, key: tuple, engine: str, details: ModelDetails, options: Options) -> Loaded:
        entry = Loaded(key, engine, details.name.display, details.digest, _model_bytes(details))
        entry.ready = asyncio.get_running_loop().create_future()
        self._loaded[key] = entry
        asyncio.get_running_loop().create_task(self._start(entry, details, options))
        return entry

    async def _start(self, entry: Loaded, details: ModelDetails, options: Options) -> None:
        try:
            runner = await self.start(entry.engine, details, options)
        except BaseException as exc:
            self._loaded.pop(entry.key, None)
            entry.ready.set_exception(exc)
            entry.ready.exception()  # retrieved: the requests waiting re-raise it
            if isinstance(exc, RunnerStopped):
                self._crashed(entry, exc.message)
            async with self._room:
                self._room.notify_all()
            return
        entry.runner = runner
        runner.on_exit = lambda _runner, why: self._on_exit(entry, why)
        if runner.failure is not None:  # died between its answer and now
            self._on_exit(entry, runner.failure)
        entry.ready.set_result(runner)
        log.info("%s runner %d serves %s (context %d)", entry.engine, runner.pid, entry.name, runner.context_length)

    async def _make_room(self, details: ModelDetails) -> None:
        """Stop idle runners for the limit and for memory; wait while every runner is busy at the limit."""
        limit = self.settings.max_loaded_models
        while limit > 0 and len(self._loaded) >= limit:
            idle = self._idle()
            if idle:
                await self._stop(idle[0], "max_loaded_models")
                continue
            if self._waiting >= self.settings.max_queue:
                raise QueueFull(details.name.display)
            self._waiting += 1
            try:
                await self._room.wait()
            finally:
                self._waiting -= 1
        need = _model_bytes(details)
        while (free := self.available_memory()) is not None and free < need and (idle := self._idle()):
            await self._stop(idle[0], f"memory: {details.name.display} needs ~{need >> 20} MiB, {free >> 20} MiB free")

    def _idle(self) -> list[Loaded]:
        return sorted((e for e in self._loaded.values() if e.idle), key=lambda e: e.expires_at or float("inf"))

    # -- stopping --------------------------------------------------------------------------------

    def _expire_in(self, entry: Loaded, seconds: float) -> None:
        _cancel_timer(entry)
        if seconds < 0:
            entry.expires_at = None
            return
        entry.expires_at = time.time() + seconds
        loop = asyncio.get_running_loop()
        entry.timer = loop.call_later(seconds, lambda: loop.create_task(self._expire(entry)))

    async def _expire(self, entry: Loaded) -> None:
        async with self._room:
            if entry.active == 0 and self._loaded.get(entry.key) is entry:
                await self._stop(entry, "keep_alive")
                self._room.notify_all()

    async def _stop(self, entry: Loaded, why: str) -> None:
        _cancel_timer(entry)
        self._loaded.pop(entry.key, None)
        if entry.runner is not None:
            log.info("stopping the %s runner %d of %s (%s)", entry.engine, entry.runner.pid, entry.name, why)
            entry.runner.on_exit = None
            await entry.runner.stop()

    async def unload(self, digest: str, engine: str | None = None) -> bool:
        """Stop the runners of a model now, or when their requests in flight end."""
        found = [e for e in self._loaded.values() if digest in (e.digest, e.key[1]) and engine in (None, e.engine)]
        async with self._room:
            for entry in found:
                if entry.active:
                    entry.unload_when_idle = True
                elif self._loaded.get(entry.key) is entry:
                    await self._stop(entry, "unload")
            self._room.notify_all()
        return bool(found)

    def _on_exit(self, entry: Loaded, why: str) -> None:
        if self._loaded.get(entry.key) is entry:
            del self._loaded[entry.key]
        _cancel_timer(entry)
        self._crashed(entry, why)
        asyncio.get_running_loop().create_task(self._notify())

    def _crashed(self, entry: Loaded, why: str) -> None:
        key = (entry.engine, entry.digest)
        count = self.crashes[key].count + 1 if key in self.crashes else 1
        delay = 0.0 if count < 2 else min(BACKOFF_MAX_S, 2.0 ** (count - 2))
        now = time.time()
        self.crashes[key] = RunnerFailure(entry.name, entry.engine, count, why, now, now + delay)
        log.error("the %s runner of %s stopped (%s); crash %d in a row, next start %s", entry.engine, entry.name, why,
                  count, "on the next request" if delay == 0 else f"in {delay:.0f} s at the earliest")

    async def _notify(self) -> None:
        async with self._room:
            self._room.notify_all()

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        for close in self.closing:
            await close()
        entries = list(self._loaded.values())
        self._loaded.clear()
        for entry in entries:
            _cancel_timer(entry)
            if entry.runner is not None:
                entry.runner.on_exit = None
        await asyncio.gather(*(e.runner.stop() for e in entries if e.runner is not None), return_exceptions=True)


def _cancel_timer(entry: Loaded) -> None:
    if entry.timer is not None:
        entry.timer.cancel()
        entry.timer = None


def _model_bytes(details: ModelDetails) -> int:
    """The memory a model needs, estimated as its weights' file size plus a tenth (KV cache, buffers)."""
    path = details.model_path
    try:
        size = path.stat().st_size if path is not None else 0
    except OSError:
        size = 0
    return size + size // 10


def available_memory() -> int | None:
    """``MemAvailable`` of /proc/meminfo in bytes (None where there is none)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return None
