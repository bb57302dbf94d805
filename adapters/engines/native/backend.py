"""The native engine (`native_engine/`, PyTorch, paged KV cache, continuous batching) for a runner's engine core.

A native runner (``adapters/engines/runner/engine_core.py``, in a runner process or, for ``infer run
--local``, on a thread of the CLI's process) holds one `LLMEngine` per base model's weights and steps it
itself; every request to a model made of the same weights plus a LoRA adapter (`ADAPTER` in its Modelfile)
joins the same batch: the engine runs each row through its request's adapter (`native_engine/lora/`).
The scheduler (``adapters/engines/scheduler.py``) decides when a runner starts and stops: nothing here
keeps a model alive. This module holds what the engine core needs of the store and the settings: a model's
engine (:meth:`NativeModels.new_engine`), its prompt as token ids (:func:`engine_prompt`), a request's
sampling parameters and its final ``Done``. With the native bridge's other modules it is the only place
that imports `native_engine`, and lazily, so `infer serve` starts without torch.
"""

from __future__ import annotations

import importlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from registry.details import ModelDetails
from registry.store import Store

from core.base import Done, GenerationRequest, Timings, TokenLogprob, Usage
from frontend.prompt_ids import tokenize_request
from core.errors import BackendUnavailable, InvalidRequest
from core.options import Options, check_room, check_token_ids
from core.settings import DEFAULTS, SPECULATIVE_SWITCHES, LocalSettings, NativeSettings, speculative_switch
from adapters.engines.store_models import gguf_path, model_details


@dataclass
class NativeModels:
    """The store's models as native engines, configured by ``settings`` (what a native runner loads)."""

    store: Store
    settings: LocalSettings = field(default_factory=lambda: DEFAULTS)

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

    def details(self, model: str) -> ModelDetails:
        return model_details(self.store, model)


_preload_lock = threading.Lock()
_preloading: threading.Thread | None = None


def preload_engine() -> None:
    """Import the engine (torch and the model code, about a second of a model's load) on a background
    thread, once per process; a load that follows waits (on the import lock) only for what is left.
    Called as a native runner starts (``runner/worker.py``: ``preload``, a spare runner's before its model is
    asked for), and by ``infer run --local`` at start when the native engine is the default."""
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


__all__ = ["NativeModels", "engine_prompt", "final_done", "preload_engine", "sampling_params"]
