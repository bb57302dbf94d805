"""llama.cpp (llama-cpp-python) running a GGUF model of the local store: what a llama.cpp runner serves
(``adapters/engines/runner/worker.py``; the runner is a process of ``infer serve`` or a thread of
``infer run --local``, started and stopped by the scheduler). Its contexts are ``pool.py``'s.

Generation runs in worker threads (llama.cpp releases the GIL); events reach the event loop through
``loop.call_soon_threadsafe``. ``request.cancel`` sets the job's cancel flag: the worker stops at the
next token and the stream ends with a ``cancelled`` Done counting what was generated. Closing the
stream early sets the flag too; the slot goes back to the pool when the worker thread has stopped.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from registry.details import ModelDetails
from registry.store import Store

from core.base import Done, EmbedResult, GenerationRequest, LoadedModel, StreamEvent, Timings
from frontend.chat_format import PromptSpec
from core.errors import BackendError, BackendUnavailable, InvalidRequest
from . import markers
from .job import GenerationJob, Refused
from frontend.reasoning import reasoning
from frontend.tools.local import tool_calling
from .pool import ModelPool
from core.settings import DEFAULTS, LocalSettings
from core.options import Options, check_token_ids, resolve_options
from adapters.engines.store_models import gguf_path, model_details

log = logging.getLogger(__name__)
_BROKEN = object()  # what a worker returns after llama.cpp itself failed

@dataclass
class LlamaCppBackend:
    """Serves every GGUF model in ``store`` with the pool limits and option defaults of ``settings``."""

    store: Store
    settings: LocalSettings = field(default_factory=lambda: DEFAULTS)
    name: str = "llamacpp"
    can_stream: bool = True
    supports_embeddings: bool = True
    admits: bool = True  # calls request.admit with the tokenized prompt before generating

    def __post_init__(self) -> None:
        self.defaults = self.settings.option_defaults
        self._pool = ModelPool(self.settings)
        self._loaded: dict[str, ModelDetails] = {}  # by the name `load` was given: the runner's own model
        missing = markers.missing_preload()  # `infer run --local` and the like: this process started without it
        if missing:
            log.warning("llama.cpp on this machine answers only with %s preloaded (scripts/install_llama_cpp.py "
                        "found so); start with LD_PRELOAD=%s, or use `infer serve`, whose runners preload it",
                        missing, missing)

    # -- generation -----------------------------------------------------------------------------

    @tool_calling(grammar=True)
    @reasoning
    def stream(self, request: GenerationRequest) -> AsyncIterator[StreamEvent]:
        return self.generate(request)

    async def generate(self, request: GenerationRequest, resolved: Any = None) -> AsyncIterator[StreamEvent]:
        """Generation as the request says: from token ids (a runner's, from the gateway's front end, which
        parses tools and thinking) or a prompt rendered here (in-process, or a vocabulary the gateway
        does not tokenize). ``resolved``: what the gateway resolved for the request (``protocol.Resolved``:
        its options, weights and adapter); with it, a request for the loaded model reads no store."""
        details = self._details_of(request.model, resolved)
        if resolved is not None:  # validated by the gateway, the admission's cap in num_predict
            options = Options.model_construct(**resolved.options)
        else:
            options = resolve_options(details.parameters, request.options, defaults=self.defaults)
        t_queue = time.perf_counter()
        entry, slot, load_s = await self._pool.acquire(details.name.display, gguf_path(details, "llama.cpp"),
                                                       details.digest, options, lora_path=details.adapter_path)
        timings = Timings(queue=time.perf_counter() - t_queue - load_s, load=load_s)
        job = GenerationJob(request, options, _prompt_spec(details, slot), timings=timings,
                            admit=_admission(request, self.name))
        request.cancel.on_cancel(job.cancel.set)
        events: asyncio.Queue = asyncio.Queue()
        future = self._start(job, slot, events)
        future.add_done_callback(lambda f: self._finish(entry, slot, request, broken=_broke(f)))
        try:
            while True:
                kind, item = await events.get()
                if kind == "error":
                    raise item
                yield item
                if kind == "done":
                    return
        finally:
            job.cancel.set()

    def _details_of(self, model: str, resolved: Any) -> ModelDetails:
        """The loaded model's details when the gateway resolved the same weights and adapter, else the store's."""
        loaded = self._loaded.get(model) if resolved is not None else None
        adapter = None if loaded is None or loaded.adapter_path is None else str(loaded.adapter_path)
        if loaded is not None and loaded.base_digest == resolved.weights and adapter == resolved.adapter:
            return loaded
        return self.details(model)

    def _start(self, job: GenerationJob, slot, events: asyncio.Queue) -> asyncio.Future:
        loop = asyncio.get_running_loop()
        put = lambda kind, item: loop.call_soon_threadsafe(events.put_nowait, (kind, item))  # noqa: E731

        def work() -> Done | None:
            try:
                done = job.run(slot, lambda chunk: put("chunk", chunk))
            except BackendError as exc:
                put("error", exc)
                return None
            except Refused as exc:  # the request's key refused it before anything was generated
                put("error", exc.error)
                return None
            except Exception as exc:  # a llama.cpp failure mid-request: the context may be broken
                log.exception("generation failed")
                put("error", BackendUnavailable(f"llama.cpp failed: {exc}"))
                return _BROKEN
            done.timings.total = time.perf_counter() - job.request.arrival
            put("done", done)
            return done

        return loop.run_in_executor(self._pool.thread_of(slot), work)

    def _finish(self, entry, slot, request: GenerationRequest, *, broken: bool) -> None:
        pool = self._pool
        done = pool.discard(entry, slot) if broken else pool.release(entry, slot, request.keep_alive)
        asyncio.get_running_loop().create_task(done)

    async def load(self, model: str, options: dict[str, Any] | None = None,
                   keep_alive: float | None = None) -> None:
        """Open ``model``'s context as a request with ``options`` would, without generating: the runner's own,
        open until the backend closes (its runner's life is the scheduler's keep-alive; ``keep_alive`` is
        taken for the protocol's sake and not used)."""
        details = self.details(model)
        resolved = resolve_options(details.parameters, options, defaults=self.defaults)
        entry, slot, _ = await self._pool.acquire(details.name.display, gguf_path(details, "llama.cpp"),
                                                  details.digest, resolved, lora_path=details.adapter_path, pin=True)
        await self._pool.release(entry, slot, -1)
        self._loaded[model] = details

    async def embed(self, model: str, inputs: list[str], *, truncate: bool = True,
                    keep_alive: float | None = None) -> EmbedResult:
        t0 = time.perf_counter()
        if not inputs or any(not item for item in inputs):
            raise InvalidRequest("'input' must not contain empty strings or token lists", param="input")
        details = self.details(model)
        options = resolve_options(details.parameters, defaults=self.defaults)
        entry, slot, load_s = await self._pool.acquire(details.name.display, gguf_path(details, "llama.cpp"),
                                                       details.digest, options, embedding=True,
                                                       lora_path=details.adapter_path)
        try:
            loop = asyncio.get_running_loop()
            vectors, count = await loop.run_in_executor(self._pool.thread_of(slot), _embed, slot, inputs, truncate)
        except BackendError:
            await self._pool.release(entry, slot, keep_alive)
            raise
        except Exception as exc:  # llama.cpp failed: the context may be broken, never use it again
            await self._pool.discard(entry, slot)
            raise BackendUnavailable(f"llama.cpp failed to embed: {exc}") from None
        await self._pool.release(entry, slot, keep_alive)
        return EmbedResult(vectors, count, load=load_s, total=time.perf_counter() - t0)

    # -- models ---------------------------------------------------------------------------------

    def details(self, model: str) -> ModelDetails:
        return model_details(self.store, model)

    async def loaded_models(self) -> list[LoadedModel]:
        return [LoadedModel(name=e.name, backend=self.name, size=e.path.stat().st_size, digest=e.digest,
                            expires_at=e.expires_at, context_length=e.n_ctx)
                for e in self._pool.entries() if not e.embedding]

    def current_load(self) -> dict[str, float]:
        """Requests holding a slot, requests queued for one, and the KV cells in use over all slots."""
        entries = self._pool.entries()
        slots = [s for e in entries for s in e.slots]
        load = {"requests_running": float(sum(e.active for e in entries)),
                "requests_waiting": float(sum(e.waiters for e in entries))}
        if slots:
            load["kv_cache_usage"] = sum(s.n_tokens for s in slots) / max(1, sum(s.n_ctx() for s in slots))
        return load

    async def aclose(self) -> None:
        await self._pool.aclose()


def _admission(request: GenerationRequest, served_by: str):
    """``request.admit`` for the worker thread: it waits there for the answer, computed on the loop."""
    hook = request.admit
    if hook is None:
        return None
    loop = asyncio.get_running_loop()

    def admit(n_prompt: int, n_ctx: int) -> int | None:
        try:
            return asyncio.run_coroutine_threadsafe(hook(n_prompt, n_ctx, served_by), loop).result()
        except Exception as exc:
            raise Refused(exc) from None
    return admit


def _broke(future: asyncio.Future) -> bool:
    return not future.cancelled() and future.exception() is None and future.result() is _BROKEN


def _prompt_spec(details: ModelDetails, slot) -> PromptSpec:
    bos, eos = _special_text(slot, slot.token_bos()), _special_text(slot, slot.token_eos())
    return PromptSpec.from_details(details, bos_token=bos, eos_token=eos)


def _special_text(slot, token: int) -> str:
    if token < 0:
        return ""
    return slot.detokenize([token], special=True).decode("utf-8", errors="replace")


def _embed(slot, inputs: list[str] | list[list[int]], truncate: bool) -> tuple[list[list[float]], int]:
    """Vectors and the tokens embedded; token-id inputs are detokenized first (llama-cpp-python's
    ``embed`` takes text; it tokenizes them back to the same ids for a text that round-trips)."""
    if inputs and not isinstance(inputs[0], str):
        inputs = [slot.detokenize(check_token_ids(ids, slot.n_vocab(), "input"), special=True)
                  .decode("utf-8", errors="replace") for ids in inputs]
    try:
        vectors, count = slot.embed(inputs, normalize=True, truncate=truncate, return_count=True)
    except ValueError as exc:  # llama-cpp-python: an input longer than the context or batch
        raise InvalidRequest(f"input too long to embed ({exc}); shorten it or set \"truncate\": true",
                             param="input") from None
    if vectors and isinstance(vectors[0][0], list):  # no pooling: one vector per token; mean-pool
        vectors = [[sum(col) / len(rows) for col in zip(*rows)] for rows in vectors]
    return vectors, count


__all__ = ["LlamaCppBackend"]
