"""``RunnerBackend``: a local engine whose models run in runners, behind the ``Backend`` protocol.

One ``RunnerBackend`` per engine name (llama.cpp, native, scripted), all sharing one
:class:`~adapters.engines.scheduler.RunnerScheduler`; routes, SLOs, costs and the ledger see the same
``Chunk``…``Done`` stream as from the in-process engines. The gateway side reads the store (a
model's details, its options, its vocabulary) but never loads a model: that happens in the runner.
For a native model it is also the front end (vLLM's split between its API server and ``EngineCore``):
the template is rendered and tokenized here (``frontend/prompt_ids``), a keyed request admitted on
that count, and tools and thinking parsed from the text the runner streams back; the runner sees
token ids only.

:class:`RunnerStarter` is the scheduler's ``start``: it takes the engine's spare runner (started
ahead, its engine already imported) or starts one, and loads the model into it. A spare is started
with the server for the default engine and again a few seconds after each load (not at once: it
would compete for the CPU with the model's first answer), so the next model of that engine skips
``import torch``; one unused for ``keep_alive`` stops, as an idle model would.

``infer serve`` builds the engines with :func:`runner_engines`: each runner a process. ``infer run --local``
builds them with :func:`in_process_engines`: the same backends, scheduler and runner bodies, each runner
on a thread of the CLI's process (``client.RunnerThread``: no spares, nothing to pre-start), so keep-alive,
``max_loaded_models``, unloading, the front end and the wire are the same code as the server's.
"""

from __future__ import annotations

import asyncio
import logging
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace
from typing import Any

from registry.details import ModelDetails
from registry.store import Store

from core.base import Done, EmbedResult, GenerationRequest, Health, LoadedModel, ModelInfo, StreamEvent
from core.errors import BackendError, BackendUnavailable, ModelNotFound, RunnerStopped
from core.options import Options, check_room, resolve_options
from core.settings import LocalSettings
from frontend.prompt_ids import PIECE_CHARS, read_ahead, same_ids_as_llama_cpp, tokenize_request, vocabulary_of
from frontend.reasoning import reasoning
from frontend.token_count import prompt_bound
from frontend.tools.local import tool_calling
from adapters.engines.local import ENGINES, TEST_ENGINE, LocalEngines, check_engine
from adapters.engines.scheduler import Loaded, RunnerScheduler
from adapters.engines.store_models import gguf_path, model_details, store_models

from . import protocol as p
from .client import Launch, RunnerClient
from .worker import import_engine

log = logging.getLogger(__name__)

SPARE_AFTER_S = 5.0  # after a load, when the engine's next spare starts
# Engines whose runner takes token ids: the gateway renders the template, tokenizes, admits a keyed request
# on that count and parses tools and thinking; the runner generates from ids (vLLM's engine core does so).
# llama.cpp only for the vocabularies the gateway's tokenizer reads (byte-level BPE, a known pre-tokenizer):
# SentencePiece ones (Llama 2, Mistral, Gemma) are rendered and tokenized in the runner, as before.
TOKENIZED_ENGINES = ("native", "llamacpp")


@dataclass
class RunnerStarter:
    store: Store
    settings: LocalSettings
    log_level: str = "warning"
    in_process: bool = False  # each runner on a thread of this process (infer run --local), never a spare
    spares: dict[str, RunnerClient] = field(default_factory=dict)
    closed: bool = False

    def launch(self, engine: str) -> RunnerClient:
        launch = Launch.in_process(engine) if self.in_process else Launch.single(engine, log_level=self.log_level)
        return RunnerClient(launch, hang_timeout=self.settings.hang_timeout)

    def prestart(self, engine: str) -> None:
        """Start a runner for ``engine`` now, so the next model's load finds its engine imported; in-process,
        import the engine into this process instead (its runners' threads share it)."""
        if self.in_process:
            import_engine(engine)
            return
        if engine in self.spares and self.spares[engine].alive:
            return
        spare = self.spares[engine] = self.launch(engine)
        if self.settings.keep_alive >= 0:
            loop = asyncio.get_running_loop()
            loop.call_later(max(self.settings.keep_alive, 1.0), lambda: loop.create_task(self._retire(engine, spare)))

    async def _retire(self, engine: str, spare: RunnerClient) -> None:
        if self.spares.get(engine) is spare:
            del self.spares[engine]
            await spare.stop()

    def launch_group(self, engine: str, world_size: int) -> tuple[RunnerClient, LocalSettings]:
        """A tensor-parallel group (no spare: its size is the model's), and the settings that tell the
        runner's engine where its ranks meet."""
        init_method = f"file://{tempfile.mkdtemp(prefix='infer-tp-')}/store"
        native = self.settings.native
        launch = Launch.group(engine, world_size, init_method, device=native.device or "auto", log_level=self.log_level)
        settings = self.settings.model_copy(update={"native": native.model_copy(
            update={"distributed_init_method": init_method})})
        return RunnerClient(launch, hang_timeout=self.settings.hang_timeout), settings

    async def __call__(self, engine: str, details: ModelDetails, options: Options) -> RunnerClient:
        settings = self.settings
        if engine == "native" and options.tensor_parallel > 1 and not self.in_process:
            runner, settings = self.launch_group(engine, options.tensor_parallel)  # (in-process: the engine
            # starts its ranks itself, native_engine/distributed/parallel_state.py)
        else:
            runner = self.spares.pop(engine, None)
            if runner is None or not runner.alive:
                runner = self.launch(engine)
        # The context loaded now stays until the scheduler stops the runner; a llama.cpp runner closes the ones
        # it opens later for other load options keep_alive after their last request (llamacpp/pool.py).
        spec = p.Load(engine, str(self.store.root), details.name.display, options.model_dump(), settings.model_dump())
        try:
            await runner.load(spec, self.settings.load_timeout)
        except BaseException:
            await runner.stop()
            raise
        if not self.in_process:
            loop = asyncio.get_running_loop()
            loop.call_later(SPARE_AFTER_S, lambda: None if self.closed else self.prestart(engine))
        return runner

    async def aclose(self) -> None:
        self.closed = True
        spares, self.spares = list(self.spares.values()), {}
        await asyncio.gather(*(r.stop() for r in spares), return_exceptions=True)


@dataclass
class RunnerBackend:
    store: Store
    settings: LocalSettings
    scheduler: RunnerScheduler
    name: str = "llamacpp"
    can_stream: bool = True
    admits: bool = True  # a keyed request is admitted once its prompt is counted (here, or by the runner's Admit)

    @property
    def supports_embeddings(self) -> bool:
        return self.name != "native"

    def _options(self, details: ModelDetails, options: dict[str, Any] | None) -> Options:
        return resolve_options(details.parameters, options, defaults=self.settings.option_defaults)

    def stream(self, request: GenerationRequest) -> AsyncIterator[StreamEvent]:
        if self._takes_ids(request.model):
            return self._stream_tokenized(request)
        return self._stream(request, tokenize=False)

    def _takes_ids(self, model: str) -> bool:
        """The native engine always (its tokenizer is the gateway's); llama.cpp for a vocabulary the gateway's
        tokenizer reads, which gives llama.cpp's ids (``scripts/check_token_ids.py``); else the runner renders."""
        if self.name not in TOKENIZED_ENGINES:
            return False
        try:
            details = self.details(model)
        except BackendError:
            return False  # the request fails as it would anyway (unknown model), from the runner's path
        return self.name == "native" or same_ids_as_llama_cpp(details)

    @tool_calling(grammar=True)
    @reasoning
    def _stream_tokenized(self, request: GenerationRequest) -> AsyncIterator[StreamEvent]:
        """The runner gets token ids: tools and thinking are parsed here, on the text it sends back."""
        return self._stream(request, tokenize=True)

    async def _stream(self, request: GenerationRequest, *, tokenize: bool) -> AsyncIterator[StreamEvent]:
        details = self.details(request.model)
        options = self._options(details, request.options)
        if tokenize:  # a model's first request: its vocabulary is read while its runner loads
            read_ahead(str(gguf_path(details, f"the {self.name} engine")))
        entry, load_s = await self.scheduler.acquire(self.name, details, options)
        ok = True
        try:
            dropped, resolved = 0, None
            if tokenize:
                request, dropped, options = await tokenized(request, details, options, entry.runner.context_length,
                                                            self.name)
                resolved = p.Resolved(options.model_dump(), details.base_digest,
                                      None if details.adapter_path is None else str(details.adapter_path))
            async for event in entry.runner.stream(request, resolved):
                if isinstance(event, Done):
                    event.timings.load += load_s
                    event.truncated_messages = event.truncated_messages or dropped
                yield event
        except RunnerStopped:
            ok = False
            raise
        finally:
            await self.scheduler.release(entry, request.keep_alive, ok=ok)

    async def embed(self, model: str, inputs: list, *, truncate: bool = True,
                    keep_alive: float | None = None) -> EmbedResult:
        details = self.details(model)
        entry, load_s = await self.scheduler.acquire(self.name, details, self._options(details, None))
        ok = True
        try:
            result = await entry.runner.embed(details.name.display, inputs, truncate=truncate)
        except RunnerStopped:
            ok = False
            raise
        finally:
            await self.scheduler.release(entry, keep_alive, ok=ok)
        result.load += load_s
        return result

    async def load(self, model: str, options: dict[str, Any] | None = None, keep_alive: float | None = None) -> None:
        details = self.details(model)
        entry, _ = await self.scheduler.acquire(self.name, details, self._options(details, options))
        await self.scheduler.release(entry, keep_alive)

    def details(self, model: str) -> ModelDetails:
        return model_details(self.store, model)

    async def list_models(self) -> list[ModelInfo]:
        return store_models(self.store, self.name)

    async def loaded_models(self) -> list[LoadedModel]:
        return [_loaded_model(e) for e in self.scheduler.runners(self.name)]

    async def unload(self, model: str) -> bool:
        try:
            digest = self.details(model).digest
        except ModelNotFound:
            return False
        return await self.scheduler.unload(digest, self.name)

    async def health(self) -> Health:
        runners = self.scheduler.runners(self.name)
        return Health(ok=True, detail=f"{len(runners)} runner(s)")

    def spec_decode_stats(self) -> dict[str, dict]:
        """Each model's speculative decoding counters, as its runner last reported them (with each finished
        request); read by /metrics (gateway/observability/spec_decode_metrics.py)."""
        return {model: stats for e in self.scheduler.runners(self.name) if e.runner is not None
                for model, stats in e.runner.spec_decode.items()}

    def current_load(self) -> dict[str, float]:
        """Requests in flight and waiting over this engine's runners (the runners' last answers to a ping)."""
        runners = [e for e in self.scheduler.runners(self.name) if e.runner is not None]
        stats = [e.runner.load_stats for e in runners]
        load = {"requests_running": float(sum(e.active for e in runners)),
                "requests_waiting": float(sum(s.get("requests_waiting", 0.0) for s in stats))}
        usage = [s["kv_cache_usage"] for s in stats if "kv_cache_usage" in s]
        if usage:
            load["kv_cache_usage"] = max(usage)
        return load

    async def aclose(self) -> None:
        await self.scheduler.aclose()


def _loaded_model(entry: Loaded) -> LoadedModel:
    runner = entry.runner
    ready = runner is not None and entry.ready is not None and entry.ready.done()
    return LoadedModel(name=entry.name, backend=entry.engine, size=entry.size, digest=entry.digest,
                       expires_at=entry.expires_at,
                       context_length=runner.context_length if ready else 0,
                       pid=runner.pid if runner is not None else None,
                       memory=runner.memory() if runner is not None else None,
                       state=("stopping" if entry.unload_when_idle else "ready") if ready else "loading",
                       active=entry.active, pids=runner.pids if runner is not None else [],
                       tensor_parallel=len(runner.pids) if runner is not None else 1)


async def tokenized(request: GenerationRequest, details: ModelDetails, options: Options, context: int,
                    served_by: str) -> tuple[GenerationRequest, int, Options]:
    """What a runner that takes token ids gets: the prompt rendered and tokenized here, once, the key's
    admission decided on that count (its cap becomes ``num_predict``); the messages dropped to fit; and the
    options with that cap."""
    try:
        vocab, longest = await vocabulary_of(str(gguf_path(details, f"the {served_by} engine")))
    except (ValueError, OSError) as exc:
        raise BackendUnavailable(f"cannot read the vocabulary of {details.name.display}: {exc}") from None
    limit = min(options.num_ctx, context) if served_by == "native" and context > 0 else options.num_ctx
    if prompt_bound(request) > PIECE_CHARS:  # a long prompt: tokenizing holds the GIL for milliseconds
        prompt = await asyncio.to_thread(tokenize_request, vocab, details, request, limit, longest)
    else:
        prompt = tokenize_request(vocab, details, request, limit, longest)
    check_room(len(prompt.token_ids), limit, options.num_predict, strict=request.strict_max_tokens)
    sent = replace(request, prompt_tokens=prompt.token_ids, messages=None, prompt="", system=None, suffix=None,
                   template=None, tools=None, raw=False, templated=False, admit=None)
    if request.admit is not None:
        cap = await request.admit(len(prompt.token_ids), limit, served_by)
        if cap is not None:
            most = cap if options.num_predict <= 0 else min(cap, options.num_predict)
            sent.options = {**sent.options, "num_predict": most}
            options = options.model_copy(update={"num_predict": most})
    return sent, prompt.dropped, options


def runner_engines(store: Store, settings: LocalSettings, *, log_level: str = "warning",
                   in_process: bool = False) -> LocalEngines:
    """Every engine over ``store`` in runner processes, one scheduler for all; ``settings.engine`` is the default.

    Called on the event loop (the server's lifespan): the default engine's spare runner starts now.
    ``in_process``: each runner on a thread of this process instead, the default engine imported now
    (:func:`in_process_engines`)."""
    starter = RunnerStarter(store, settings, log_level, in_process=in_process)
    scheduler = RunnerScheduler(settings, starter)
    scheduler.closing.append(starter.aclose)
    names = [*ENGINES, *([TEST_ENGINE] if settings.test_engine else [])]
    engines = LocalEngines({name: _factory(store, settings, scheduler, name) for name in names},
                           default=check_engine(settings.engine, names), scheduler=scheduler)
    starter.prestart(engines.default)
    return engines


def in_process_engines(store: Store, settings: LocalSettings) -> LocalEngines:
    """``infer run --local``'s engines: :func:`runner_engines` with each runner on a thread of this process.

    Needs no event loop (nothing starts until the first request); the default engine is imported now
    (the native engine's torch on a thread, while the user types)."""
    return runner_engines(store, settings, in_process=True)


def _factory(store: Store, settings: LocalSettings, scheduler: RunnerScheduler, name: str):
    return lambda: RunnerBackend(store, settings, scheduler, name)
