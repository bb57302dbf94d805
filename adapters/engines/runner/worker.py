"""The runner's side for llama.cpp and the scripted test engine: one process, one engine, one model, an
event loop between the socket and the engine (a native runner runs ``engine_core.py`` instead: no event
loop, the engine stepped on the thread that reads and writes the socket).

The gateway starts ``python -m adapters.engines.runner`` with its end of a socket pair and an engine name
(``infer run --local`` runs the same body, :func:`serve_runner`, on a thread of its own process);
the process imports its engine at once (a spare runner is ready before a model is asked for), then
waits for :class:`~adapters.engines.runner.protocol.Load`. Each ``Generate`` becomes a task that runs the
engine's ``generate`` (token ids) or ``stream`` (text) and sends each event as it comes. A llama.cpp runner gets the prompt as token ids for a vocabulary the gateway's tokenizer reads (the
gateway rendered, tokenized and admitted it, and parses tools and thinking on the way back:
``runner/backend.py``), else the request as text, rendered here. The runner never decides when to exit on
its own: the gateway sends ``Shutdown`` or kills it; it also exits when the gateway is gone (its parent
changes; an in-process runner has no parent to watch).
"""

from __future__ import annotations

import asyncio
import ctypes
import importlib
import logging
import os
import signal
from collections.abc import AsyncIterator
from typing import Any, Protocol

from core.base import CancelToken, Done, EmbedResult, GenerationRequest, LoadedModel, StreamEvent
from core.errors import BackendError, BackendUnavailable
from core.settings import LocalSettings
from registry.store import Store

from . import protocol as p
from .channel import Channel

log = logging.getLogger(__name__)

ENGINE_MODULES = {"llamacpp": "adapters.engines.llamacpp.backend", "native": "adapters.engines.native.backend",
                  "scripted": "fakes.scripted_engine"}
ENGINE_CLASSES = {"llamacpp": "LlamaCppBackend", "scripted": "ScriptedBackend"}  # native: engine_core.py


def serve_runner(engine: str, fd: int, parent: int | None) -> None:
    """A runner's body until ``Shutdown`` or the gateway's end: in its own process (``__main__``), or on a
    thread of the gateway's (``parent`` None: ``client.RunnerThread``, for ``infer run --local``)."""
    preload(engine)
    if engine == "native":  # the engine core's loop: no event loop, no engine thread (engine_core.py)
        from .engine_core import serve_core

        serve_core(fd, parent)
    else:
        asyncio.run(serve(engine, fd, parent))


class Engine(Protocol):
    """What a worker asks of its engine (llama.cpp's backend, the scripted test engine): no keep-alive, no
    unload; the runner's life is the scheduler's. ``generate`` (token ids, no tool or thinking parsing) and
    ``current_load`` are read when the engine has them."""

    def stream(self, request: GenerationRequest) -> AsyncIterator[StreamEvent]: ...

    async def load(self, model: str, options: dict[str, Any] | None = None,
                   keep_alive: float | None = None) -> None: ...

    async def loaded_models(self) -> list[LoadedModel]: ...

    async def embed(self, model: str, inputs: list, *, truncate: bool = True,
                    keep_alive: float | None = None) -> EmbedResult: ...

    async def aclose(self) -> None: ...


def make_backend(engine: str, store: Store, settings: LocalSettings) -> Engine:
    module = importlib.import_module(ENGINE_MODULES[engine])
    return getattr(module, ENGINE_CLASSES[engine])(store=store, settings=settings)


class Worker:
    def __init__(self, engine: str, channel: Channel | None):
        self.engine = engine
        self.channel = channel
        self.backend: Engine | None = None
        self.model = ""
        self.cancels: dict[int, CancelToken] = {}
        self.admissions: dict[int, asyncio.Future] = {}  # requests waiting for the gateway's Admitted/Refused
        self.tasks: set[asyncio.Task] = set()
        self.stopping = asyncio.Event()

    async def send(self, *messages: Any) -> None:
        self.channel.send(*messages)

    def handle(self, message: Any) -> None:
        match message:
            case p.Generate():
                self._spawn(self.generate(message))
            case p.Admitted(id=id_, cap=cap):
                self._answer(id_, cap)
            case p.Refused(id=id_):
                self._answer(id_, BackendError("the gateway refused the request (its key's budget or limits)"))
            case p.Cancel(id=id_):
                token = self.cancels.get(id_)
                if token is not None:
                    token.cancel()
            case p.Embed():
                self._spawn(self.embed(message))
            case p.Ping(id=id_):
                self._spawn(self.send(p.Pong(id_, self.current_load())))
            case p.Load():
                self._spawn(self.load(message))
            case p.Shutdown():
                self.stopping.set()

    def _answer(self, id_: int, answer: Any) -> None:
        future = self.admissions.get(id_)
        if future is None or future.done():
            return
        if isinstance(answer, BaseException):
            future.set_exception(answer)
        else:
            future.set_result(answer)

    def _admission(self, id_: int):
        """``request.admit`` for a request of this runner: asks the gateway and waits for its answer."""
        async def admit(prompt_tokens: int, context: int | None, served_by: str | None = None) -> int | None:
            future = asyncio.get_running_loop().create_future()
            self.admissions[id_] = future
            try:
                await self.send(p.Admit(id_, prompt_tokens, context, served_by))
                return await future
            finally:
                self.admissions.pop(id_, None)
        return admit

    async def _admit_here(self, request) -> None:
        """An engine that counts no prompt (``admits`` unset): admitted now, with an upper bound of it."""
        from frontend.token_count import prompt_bound

        cap = await request.admit(prompt_bound(request), None, self.engine)
        request.admit = None
        if cap is not None:
            request.options = {**request.options, "num_predict": cap}

    def _spawn(self, coro) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def load(self, message: p.Load) -> None:
        try:
            settings = LocalSettings.model_validate(message.settings)
            self.backend = make_backend(self.engine, Store(message.store), settings)
            self.model = message.model
            await self.backend.load(message.model, message.options, keep_alive=-1)
            context = max((m.context_length for m in await self.backend.loaded_models()), default=0)
        except BackendError as exc:
            await self.send(p.Failed(-1, p.error_to_wire(exc)))
            return
        except Exception as exc:  # noqa: BLE001 - an engine's own failure to load: the gateway says why
            log.exception("loading %s failed", message.model)
            await self.send(p.Failed(-1, p.error_to_wire(BackendUnavailable(f"{self.engine} could not load "
                                                                          f"{message.model}: {exc}"))))
            return
        await self.send(p.Ready(os.getpid(), context))

    async def generate(self, message: p.Generate) -> None:
        request = p.request_from_wire(message.request)
        self.cancels[message.id] = request.cancel
        first = True
        try:
            if message.admit:
                request.admit = self._admission(message.id)
                if not getattr(self.backend, "admits", False):
                    await self._admit_here(request)
            async for event in self._events(request, message.resolved):
                if isinstance(event, Done):
                    await self.send(p.Finished(message.id, event, self.current_load(), self.spec_decode_stats()))
                    continue
                if first:  # the load with this request running, in the same write as its first token
                    first = False
                    await self.send(p.Pong(0, self.current_load()), p.Token(message.id, event))
                    continue
                await self.send(p.Token(message.id, event))
        except BackendError as exc:
            await self.send(p.Failed(message.id, p.error_to_wire(exc)))
        except Exception as exc:  # noqa: BLE001 - reported to the one request, the runner goes on
            log.exception("generation failed")
            await self.send(p.Failed(message.id, p.error_to_wire(BackendUnavailable(f"{self.engine} failed: {exc}"))))
        finally:
            self.cancels.pop(message.id, None)

    def _events(self, request, resolved: p.Resolved | None):
        """Token ids from the gateway go straight to the engine core (``generate``, with what the gateway
        resolved for them): the gateway's front end parses tools and thinking; a request as text takes the
        engine's whole ``stream``."""
        core = getattr(self.backend, "generate", None)
        if core is not None and request.prompt_tokens is not None:
            return core(request, resolved)
        return self.backend.stream(request)

    async def embed(self, message: p.Embed) -> None:
        try:
            result = await self.backend.embed(message.model, message.inputs, truncate=message.truncate, keep_alive=-1)
        except BackendError as exc:
            await self.send(p.Failed(message.id, p.error_to_wire(exc)))
        except Exception as exc:  # noqa: BLE001
            log.exception("embedding failed")
            await self.send(p.Failed(message.id, p.error_to_wire(BackendUnavailable(f"{self.engine} failed: {exc}"))))
        else:
            await self.send(p.Embedded(message.id, result))

    def spec_decode_stats(self) -> dict[str, dict]:
        read = getattr(self.backend, "spec_decode_stats", None)
        return read() if read is not None else {}

    def current_load(self) -> dict[str, float]:
        current = getattr(self.backend, "current_load", None)
        return current() if current is not None else {}


async def serve(engine: str, fd: int, parent: int | None) -> None:
    import socket

    worker = Worker(engine, None)
    # the gateway closed its end (or died): nobody reads what this runner would say
    channel = worker.channel = await Channel.open(socket.socket(fileno=fd), p.to_runner, worker.handle,
                                                  worker.stopping.set)
    watching = asyncio.ensure_future(_watch_parent(parent, worker)) if parent is not None else None
    try:
        await worker.stopping.wait()
    finally:
        if watching is not None:
            watching.cancel()
        for token in list(worker.cancels.values()):
            token.cancel()
        if worker.backend is not None:
            await worker.backend.aclose()
        channel.close()


async def _watch_parent(parent: int, worker: Worker) -> None:
    """The gateway is gone (its child reaped by init): nobody reads what this runner would say."""
    while os.getppid() == parent:
        await asyncio.sleep(1.0)
    log.warning("the gateway (pid %d) is gone; this runner exits", parent)
    worker.stopping.set()


def die_with_parent() -> None:
    """SIGKILL this process when the process that started it dies (Linux ``PR_SET_PDEATHSIG``)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG = 1
    except (OSError, AttributeError):
        pass


def preload(engine: str) -> None:
    """Import the engine now, before a model is asked for; say so if llama.cpp's build is wrong for this CPU."""
    import_engine(engine)
    if engine == "llamacpp":
        _warn_about_the_build()


def import_engine(engine: str) -> None:
    """Import the engine in this process (the native engine's torch on a thread: ``preload_engine``); what a
    spare runner has done, and what ``infer run --local`` does at start for its default engine."""
    if engine == "native":
        importlib.import_module(ENGINE_MODULES["native"]).preload_engine()
    else:
        importlib.import_module(ENGINE_MODULES[engine])


def _warn_about_the_build() -> None:
    from pathlib import Path

    from adapters.engines.llamacpp import markers
    from adapters.engines.llamacpp.cpu_build import build_warning

    try:
        warning = build_warning(Path("/proc/cpuinfo").read_text(), markers.read(markers.CMAKE_ARGS))
    except OSError:
        return
    if warning:
        log.warning(warning)
