"""The native engine (`native_engine/`, PyTorch, paged KV cache, continuous batching) as a backend.

Serves the GGUF models of the local store. One `LLMEngine` per base model's weights runs on its own
thread (`AsyncLLMEngine`); every request to that model joins its running batch, and so does every
request to a model made of the same weights plus a LoRA adapter (`ADAPTER` in its Modelfile): the engine
runs each row through its request's adapter (`native_engine/lora/`). This module is the only
place that imports `native_engine`, and it does so lazily so `infer serve` starts without torch.
"""

from __future__ import annotations

import asyncio
import importlib
import itertools
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from registry.details import ModelDetails
from registry.store import Store

from core.base import (Chunk, Done, EmbedResult, GenerationRequest, Health, LoadedModel, ModelInfo,
                                StreamEvent, Timings, TokenLogprob, Usage, until_cancelled)
from frontend.prompt_ids import max_token_bytes, tokenize_request
from core.errors import BackendUnavailable, InvalidRequest, ModelNotFound
from frontend.reasoning import reasoning
from frontend.tools.local import tool_calling
from core.options import Options, check_room, check_token_ids, resolve_options
from core.settings import (DEFAULTS, SPECULATIVE_SWITCHES, LocalSettings, NativeSettings,
                                    speculative_switch)
from adapters.engines.store_models import gguf_path, model_details, store_models

_ids = itertools.count()


@dataclass
class _Loaded:
    name: str
    digest: str  # the weights' (`ModelDetails.base_digest`): models that add an adapter share the engine
    size: int
    engine: Any  # AsyncLLMEngine
    active: int = 0
    expires_at: float | None = None
    timer: asyncio.TimerHandle | None = None
    unload_when_idle: bool = False  # an unload was asked while requests ran: it happens when they end
    max_token_bytes: int | None = None  # the longest vocabulary entry, measured on first use


@dataclass
class NativeBackend:
    store: Store
    settings: LocalSettings = field(default_factory=lambda: DEFAULTS)
    name: str = "native"
    can_stream: bool = True
    supports_embeddings: bool = False
    admits: bool = True  # calls request.admit with the tokenized prompt before generating

    def __post_init__(self) -> None:
        self._loaded: dict[str, _Loaded] = {}
        self._lock = asyncio.Lock()
        preload_engine()

    # -- generation -----------------------------------------------------------------------------

    @tool_calling(grammar=True)
    @reasoning
    def stream(self, request: GenerationRequest) -> AsyncIterator[StreamEvent]:
        return self.generate(request)

    async def generate(self, request: GenerationRequest) -> AsyncIterator[StreamEvent]:
        """The engine core: generate from the prompt as given (a runner gets token ids from the gateway,
        whose front end parses tools and thinking); text is rendered and tokenized here only in-process."""
        details = self.details(request.model)
        options = resolve_options(details.parameters, request.options, defaults=self.settings.option_defaults)
        structured_outputs(request.format)  # a malformed format is a 400 before the model loads
        entry, load_s = await self._acquire(details, options)
        try:
            async for event in self._generate(entry, details, request, options, Timings(load=load_s)):
                yield event
        finally:
            self._release(entry, request.keep_alive)

    async def _generate(self, entry: _Loaded, details: ModelDetails, request: GenerationRequest, options: Options,
                        timings: Timings) -> AsyncIterator[StreamEvent]:
        llm = entry.engine.engine
        token_ids, dropped, room = engine_prompt(llm, details, request, options,
                                                 lambda: _max_token_bytes(entry, llm.tokenizer))
        if request.admit is not None:  # a keyed request: its budget and limits, before anything runs
            limit = min(options.num_ctx, llm.max_model_len)
            room = min(room, await request.admit(len(token_ids), limit, self.name) or room)
        params = sampling_params(options, request, room=room)
        check_kv_role(self.settings.kv_role, params.kv_transfer_params)
        output: list[int] = []
        done: Done | None = None
        outputs = _engine_outputs(entry.engine, token_ids, params, request.arrival, lora_request(details))
        async for out in until_cancelled(outputs, request.cancel):
            completion = out.outputs[0]
            output += completion.token_ids
            if completion.text or completion.logprobs:
                yield Chunk(completion.text, completion.token_ids, chunk_logprobs(llm.tokenizer, completion, request))
            if out.finished:
                done = final_done(out, token_ids, output, timings, request, dropped)
        yield done or final_done(None, token_ids, output, timings, request, dropped, reason="cancelled")

    # -- loading --------------------------------------------------------------------------------

    async def _acquire(self, details: ModelDetails, options: Options) -> tuple[_Loaded, float]:
        async with self._lock:
            t0 = time.perf_counter()
            entry = self._loaded.get(details.base_digest)
            if entry is None:
                entry = await asyncio.get_running_loop().run_in_executor(None, self._load, details, options)
                self._loaded[details.base_digest] = entry
            entry.active += 1
            entry.unload_when_idle = False
            if entry.timer is not None:
                entry.timer.cancel()
                entry.timer = None
            return entry, time.perf_counter() - t0

    def _load(self, details: ModelDetails, options: Options) -> _Loaded:
        from native_engine import AsyncLLMEngine

        llm = self.new_engine(details, options)
        size = gguf_path(details, "the native engine").stat().st_size
        return _Loaded(details.name.display, details.base_digest, size, AsyncLLMEngine(llm))

    def new_engine(self, details: ModelDetails, options: Options):
        """The model's ``LLMEngine``, with no thread of its own (a runner's engine core steps it itself)."""
        model_path = gguf_path(details, "the native engine")
        from native_engine import LLMEngine

        context = min(options.num_ctx, details.gguf.context_length or options.num_ctx)
        try:
            config = engine_config(self.settings.native, str(model_path), context, self._speculative(details),
                                   options.tensor_parallel)
            if details.adapter_path is not None and config.lora_slots == 0:
                raise ValueError("the model has a LoRA adapter and max_loras is 0 (or it is split over ranks)")
            llm = LLMEngine(config)
        except (ValueError, NotImplementedError) as exc:
            raise BackendUnavailable(f"the native engine cannot load {details.name.display}: {exc}") from None
        return llm

    def _speculative(self, details: ModelDetails) -> str | None:
        """The model's method: its Modelfile's PARAMETER speculative, else the server's setting ("on": n-gram);
        a draft named by its store name is resolved to its GGUF file."""
        value = details.parameters.get("speculative") or self.settings.speculative
        if not speculative_switch(value):
            return None
        if value in SPECULATIVE_SWITCHES:
            return "ngram"
        if not value.startswith("draft:"):
            return value
        model, sep, opts = value.removeprefix("draft:").rpartition(":")
        if "=" not in opts:
            model, sep, opts = value.removeprefix("draft:"), "", ""
        path = model if Path(model).exists() else str(gguf_path(self.details(model), "a draft model"))
        return f"draft:{path}{sep}{opts}"

    def _release(self, entry: _Loaded, keep_alive: float | None) -> None:
        entry.active -= 1
        seconds = self.settings.keep_alive if keep_alive is None else keep_alive
        if entry.unload_when_idle:
            seconds = 0
        if seconds < 0:
            entry.expires_at = None
            return
        entry.expires_at = time.time() + seconds
        if entry.active == 0:
            loop = asyncio.get_running_loop()
            entry.timer = loop.call_later(seconds, lambda: loop.create_task(self._expire(entry)))

    async def _expire(self, entry: _Loaded) -> None:
        async with self._lock:
            if entry.active == 0 and self._loaded.get(entry.digest) is entry:
                self._drop(entry)

    def _drop(self, entry: _Loaded) -> None:
        del self._loaded[entry.digest]
        if entry.timer is not None:
            entry.timer.cancel()
        entry.engine.shutdown()

    async def load(self, model: str, options: dict[str, Any] | None = None, keep_alive: float | None = None) -> None:
        details = self.details(model)
        entry, _ = await self._acquire(details, resolve_options(details.parameters, options, defaults=self.settings.option_defaults))
        self._release(entry, keep_alive)

    # -- models ---------------------------------------------------------------------------------

    def details(self, model: str) -> ModelDetails:
        return model_details(self.store, model)

    async def embed(self, model: str, inputs: list[str], *, truncate: bool = True,
                    keep_alive: float | None = None) -> EmbedResult:
        raise InvalidRequest("the native engine does not compute embeddings; use the llama.cpp engine")

    async def list_models(self) -> list[ModelInfo]:
        return store_models(self.store, self.name)

    async def loaded_models(self) -> list[LoadedModel]:
        return [LoadedModel(name=e.name, backend=self.name, size=e.size, digest=e.digest, expires_at=e.expires_at,
                            context_length=e.engine.engine.max_model_len) for e in self._loaded.values()]

    async def unload(self, model: str) -> bool:
        try:
            digest = self.details(model).base_digest
        except ModelNotFound:
            return False
        async with self._lock:
            entry = self._loaded.get(digest)
            if entry is None:
                return False
            if entry.active:
                entry.unload_when_idle = True  # the engine stops when its requests end, not under them
            else:
                self._drop(entry)
            return True

    def spec_decode_stats(self) -> dict[str, dict]:
        """Each loaded model's speculative decoding counters (models that never speculated are left out)."""
        stats = {e.name: e.engine.engine.spec_decode_stats() for e in list(self._loaded.values())}
        return {name: s for name, s in stats.items() if s}

    async def health(self) -> Health:
        return Health(ok=True, detail=f"{len(self._loaded)} model(s) loaded")

    def current_load(self) -> dict[str, float]:
        """The loaded engines' schedulers now: running, waiting, and the fullest KV cache's used share
        (read from the event loop while the engine threads run: a snapshot, not a transaction)."""
        schedulers = [e.engine.engine.scheduler for e in list(self._loaded.values())]
        if not schedulers:
            return {"requests_running": 0.0, "requests_waiting": 0.0}
        return {"requests_running": float(sum(s.num_running for s in schedulers)),
                "requests_waiting": float(sum(s.num_waiting for s in schedulers)),
                "kv_cache_usage": max(s.block_manager.usage for s in schedulers)}

    async def aclose(self) -> None:
        for entry in list(self._loaded.values()):
            self._drop(entry)


_preload_lock = threading.Lock()
_preloading: threading.Thread | None = None


def preload_engine() -> None:
    """Import the engine (torch and the model code, about a second of a model's load) on a background
    thread, once per process; a load that follows waits (on the import lock) only for what is left.
    Called when the native backend is created, which `infer serve` and `infer run` do at start when
    the native engine is the default, before the first model is asked for."""
    global _preloading
    with _preload_lock:
        if _preloading is None:
            _preloading = threading.Thread(target=importlib.import_module, args=("native_engine.llm_engine",),
                                           name="native-engine-import", daemon=True)
            _preloading.start()


def lora_request(details: ModelDetails):
    """The engine's adapter for a model with an adapter layer (named by its blob, so models sharing an
    adapter share its slot and their prefix cache); None for a plain model."""
    return None if details.adapter_path is None else adapter_request(str(details.adapter_path))


def adapter_request(path: str):
    """The engine's ``LoRARequest`` for the adapter file at ``path``, named by its blob (see ``lora_request``)."""
    from native_engine import LoRARequest

    return LoRARequest(Path(path).name, path)


async def _engine_outputs(engine, token_ids: list[int], params, arrival: float, lora=None) -> AsyncIterator:
    """The engine's outputs, its errors translated into the backend error tree."""
    try:
        async for out in engine.generate(f"native-{next(_ids)}", token_ids, params, arrival_time=arrival,
                                         lora_request=lora):
            yield out
    except ValueError as exc:
        raise InvalidRequest(str(exc)) from None
    except RuntimeError as exc:
        raise BackendUnavailable(f"the native engine failed: {exc}") from None


def engine_prompt(llm, details: ModelDetails, request: GenerationRequest, options: Options,
                  max_bytes: Callable[[], int]) -> tuple[list[int], int, int]:
    """The prompt's token ids for ``llm`` (the gateway's as they are, else rendered and tokenized here, the
    oldest messages dropped to fit), how many messages were dropped, and the room left to generate."""
    limit = min(options.num_ctx, llm.max_model_len)
    if request.prompt_tokens is not None:  # the gateway's (or the client's) ids go to the engine as they are
        token_ids, dropped = check_token_ids(request.prompt_tokens, llm.tokenizer.vocab_size), 0
    else:
        prompt = tokenize_request(llm.tokenizer, details, request, limit, max_bytes())
        token_ids, dropped = prompt.token_ids, prompt.dropped
    check_room(len(token_ids), limit, options.num_predict, strict=request.strict_max_tokens)
    return token_ids, dropped, limit - len(token_ids)


def _max_token_bytes(entry: _Loaded, tokenizer) -> int:
    """The longest vocabulary entry in bytes, measured once per loaded model."""
    if entry.max_token_bytes is None:
        entry.max_token_bytes = max_token_bytes(tokenizer)
    return entry.max_token_bytes


def engine_config(native: NativeSettings, model_path: str, max_model_len: int, speculative: str | None = None,
                  tensor_parallel: int = 1):
    """One model's ``EngineConfig``: the settings tree's native knobs, the model's path, its context, its
    speculative decoding method and the ranks it is split over (the group's meeting place, when the gateway
    started them, is in ``native``)."""
    from native_engine import EngineConfig

    return EngineConfig(model=model_path, max_model_len=max_model_len, speculative=speculative,
                        tensor_parallel_size=tensor_parallel, **native.given())


def sampling_params(options: Options, request: GenerationRequest, room: int):
    from native_engine import SamplingParams

    wanted = options.num_predict if options.num_predict > 0 else room
    return SamplingParams(
        temperature=options.temperature, top_k=options.top_k, top_p=options.top_p or 1.0, min_p=options.min_p,
        repetition_penalty=options.repeat_penalty or 1.0, presence_penalty=options.presence_penalty,
        frequency_penalty=options.frequency_penalty, seed=options.seed if options.seed >= 0 else None,
        max_tokens=max(1, min(wanted, room)), stop=list(options.stop), ignore_eos=options.ignore_eos,
        logprobs=request.top_logprobs if request.logprobs else None,
        structured_outputs=structured_outputs(request.format), speculative=speculative_switch(options.speculative),
        kv_transfer_params=(request.disagg_fields or {}).get("kv_transfer_params"),
    )


def check_kv_role(role: str, kv_params: dict | None) -> None:
    """A prefill worker takes no decode leg, a decode worker no prefill leg (``infer serve --role``)."""
    leg = ("decode" if kv_params.get("do_remote_prefill") else "prefill" if kv_params.get("do_remote_decode")
           else None) if kv_params else None
    if leg is not None and role not in ("both", leg):
        raise InvalidRequest(f"this server's native engine is a {role} worker (--role {role}); it takes no "
                             f"{leg} leg (kv_transfer_params)", param="kv_transfer_params")


def structured_outputs(fmt: str | dict | None):
    """Ollama's `format` ("json" or a JSON schema; OpenAI's `response_format` arrives as the same) as the
    engine's grammar constraint."""
    from native_engine import StructuredOutputsParams

    if not fmt:
        return None
    if fmt == "json":
        return StructuredOutputsParams(json_object=True)
    if isinstance(fmt, dict):
        return StructuredOutputsParams(json=fmt)
    raise InvalidRequest(f"invalid format {fmt!r}: use \"json\" or a JSON schema object", param="format")


def chunk_logprobs(tokenizer, completion, request: GenerationRequest) -> list[TokenLogprob] | None:
    if not request.logprobs or not completion.logprobs:
        return None
    return [_entry(tokenizer, lp.token_id, lp.logprob, lp.top_logprobs) for lp in completion.logprobs]


def _entry(tokenizer, token_id: int, logprob: float, top: list[tuple[int, float]] = ()) -> TokenLogprob:
    raw = tokenizer.token_bytes(token_id)
    return TokenLogprob(token=raw.decode("utf-8", errors="replace"), logprob=logprob, bytes=list(raw),
                        top_logprobs=[_entry(tokenizer, t, lp) for t, lp in top])


def final_done(out, prompt: list[int], output: list[int], timings: Timings, request: GenerationRequest,
          dropped: int, reason: str | None = None) -> Done:
    cached = out.num_cached_tokens if out is not None else 0
    if out is not None:
        m, arrival = out.metrics, request.arrival
        timings.queue = (m.first_scheduled_time or arrival) - arrival
        timings.prompt_eval = (m.first_token_time or arrival) - (m.first_scheduled_time or arrival)
        timings.eval = (m.last_token_time or arrival) - (m.first_token_time or arrival)
        timings.token_times = [t - arrival for t in m.token_times]
        timings.draft_tokens, timings.accepted_tokens = m.num_draft_tokens, m.num_accepted_tokens
        timings.ttft = timings.token_times[0] if timings.token_times else None
        reason = out.outputs[0].finish_reason
    timings.total = time.perf_counter() - request.arrival
    usage = Usage(input_tokens=len(prompt), output_tokens=len(output), cached_input_tokens=cached)
    return Done(finish_reason=reason or "stop", usage=usage, timings=timings, prompt_tokens=prompt,
                output_tokens=output, truncated_messages=dropped,
                kv_transfer_params=out.kv_transfer_params if out is not None else None)


__all__ = ["NativeBackend"]
