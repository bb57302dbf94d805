"""The native runner's engine core: one thread reads the gateway's messages, steps the engine and sends each
step's outputs as one message (vLLM v1's ``EngineCoreProc`` busy loop, its input and output threads folded
in: a step's outputs are a few hundred bytes, framed and written in microseconds).

    loop: the messages the socket holds (waiting for one when idle) -> add_request / abort / load / pong
          -> LLMEngine.step() -> Outputs(tokens, finished, load): one write

No event loop, no task per request, no engine thread: a ``Generate`` goes from the socket to
``add_request`` on the thread that steps, and a token from ``LLMEngine.step`` to the socket on the thread
that computed it. The gateway rendered, tokenized and admitted the prompt and resolved its options, weights
and adapter (``runner/backend.py``, ``protocol.Resolved``): the core reads no store per request; a
request as text (a client's raw prompt, a test's) is tokenized here, with no tool or thinking parsing.
llama.cpp and scripted runners keep the event loop of ``worker.py``.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from typing import Any

from adapters.engines.native.backend import (NativeModels, adapter_request, check_kv_role, chunk_logprobs,
                                             engine_prompt, final_done, lora_request, sampling_params)
from core.base import Chunk, GenerationRequest, Timings
from core.errors import BackendError, BackendUnavailable, InvalidRequest
from core.options import Options, resolve_options
from core.settings import LocalSettings
from frontend.prompt_ids import max_token_bytes
from registry.store import Store

from . import protocol as p
from .channel import BlockingChannel

log = logging.getLogger(__name__)

IDLE_WAIT_S = 1.0  # how long an idle core waits for a message before it looks at its parent again


@dataclass(slots=True)
class _Running:
    """One request in the engine: the gateway's id, its prompt and what it has generated so far."""

    id: int
    request: GenerationRequest
    prompt: list[int]
    dropped: int
    output: list[int] = field(default_factory=list)


class EngineCore:
    def __init__(self, channel: BlockingChannel, parent: int | None):
        self.channel, self.parent = channel, parent
        self.backend: NativeModels | None = None  # the store, the settings, how a model is loaded
        self.llm = None  # the loaded LLMEngine
        self.model, self.digest = "", ""  # its name, and its weights' digest (models adding an adapter share it)
        self.running: dict[str, _Running] = {}  # by engine request id ("native-<gateway id>")
        self.stopping = False
        self._max_bytes: int | None = None

    def run(self, *, until_loaded: bool = False) -> None:
        """The loop; ``until_loaded``: return once a model is loaded (the loop then goes on on a fresh thread)."""
        try:
            while not self.stopping and not (until_loaded and self.llm is not None):
                busy = self._busy()
                messages = self.channel.poll(0.0 if busy else IDLE_WAIT_S)
                for message in messages:
                    self.handle(message)
                if self._busy():
                    self.step()
                elif not messages and self.parent is not None and os.getppid() != self.parent:
                    log.warning("the gateway (pid %d) is gone; this runner exits", self.parent)
                    self.stopping = True
        except EOFError:  # the gateway closed its end (or died): nobody reads what this runner would say
            self.stopping = True
        if self.stopping or not until_loaded:
            self.close()

    def _busy(self) -> bool:
        return self.llm is not None and self.llm.has_unfinished_requests()

    def handle(self, message: Any) -> None:
        match message:
            case p.Generate():
                self.add(message)
            case p.Cancel(id=id_):
                self.cancel(f"native-{id_}")
            case p.Ping(id=id_):
                self.channel.send(p.Pong(id_, self.current_load()))
            case p.Load():
                self.load(message)
            case p.Embed(id=id_):
                error = InvalidRequest("the native engine does not compute embeddings; use the llama.cpp engine")
                self.channel.send(p.Failed(id_, p.error_to_wire(error)))
            case p.Shutdown():
                self.stopping = True

    # -- loading ---------------------------------------------------------------------------------

    def load(self, message: p.Load) -> None:
        try:
            settings = LocalSettings.model_validate(message.settings)
            self.backend = NativeModels(Store(message.store), settings)
            details = self.backend.details(message.model)
            options = resolve_options(details.parameters, message.options, defaults=settings.option_defaults)
            self.llm = self.backend.new_engine(details, options)
            self.model, self.digest = details.name.display, details.base_digest
        except BackendError as exc:
            self.channel.send(p.Failed(-1, p.error_to_wire(exc)))
            return
        except Exception as exc:  # noqa: BLE001 - the engine's own failure to load: the gateway says why
            log.exception("loading %s failed", message.model)
            error = BackendUnavailable(f"native could not load {message.model}: {exc}")
            self.channel.send(p.Failed(-1, p.error_to_wire(error)))
            return
        self.channel.send(p.Ready(os.getpid(), self.llm.max_model_len))

    # -- requests --------------------------------------------------------------------------------

    def add(self, message: p.Generate) -> None:
        request = p.request_from_wire(message.request)
        try:
            self._add(message.id, request, message.resolved)
        except BackendError as exc:
            self.channel.send(p.Failed(message.id, p.error_to_wire(exc)))
        except Exception as exc:  # noqa: BLE001 - reported to the one request, the runner goes on
            log.exception("a request failed")
            self.channel.send(p.Failed(message.id, p.error_to_wire(BackendUnavailable(f"native failed: {exc}"))))

    def _add(self, id_: int, request: GenerationRequest, resolved: p.Resolved | None) -> None:
        if self.llm is None:
            raise BackendUnavailable("the runner has no model loaded")
        details, options, adapter = self._resolve(request, resolved)
        if (resolved.weights if resolved is not None else details.base_digest) != self.digest:
            raise BackendUnavailable(f"this runner's engine holds other weights than {request.model}'s")
        token_ids, dropped, room = engine_prompt(self.llm, details, request, options, self._longest_token)
        params = sampling_params(options, request, room=room)
        check_kv_role(self.backend.settings.kv_role, params.kv_transfer_params)
        request_id = f"native-{id_}"
        try:
            self.llm.add_request(request_id, token_ids, params, arrival_time=request.arrival, lora_request=adapter)
        except ValueError as exc:
            raise InvalidRequest(str(exc)) from None
        except RuntimeError as exc:
            raise BackendUnavailable(f"the native engine failed: {exc}") from None
        self.running[request_id] = _Running(id_, request, token_ids, dropped)

    def _resolve(self, request: GenerationRequest, resolved: p.Resolved | None):
        """(details, options, adapter): as the gateway resolved them (its options were validated there; the
        details are needed only to render a prompt sent as text), else from the store, as in-process."""
        if resolved is not None and request.prompt_tokens is not None:
            adapter = None if resolved.adapter is None else adapter_request(resolved.adapter)
            return None, Options.model_construct(**resolved.options), adapter
        details = self.backend.details(request.model)
        options = resolve_options(details.parameters, request.options, defaults=self.backend.settings.option_defaults)
        return details, options, lora_request(details)

    def _longest_token(self) -> int:
        if self._max_bytes is None:
            self._max_bytes = max_token_bytes(self.llm.tokenizer)
        return self._max_bytes

    def cancel(self, request_id: str) -> None:
        """The client went away: the engine drops the request, whose ``Done`` counts what it generated."""
        running = self.running.pop(request_id, None)
        if running is None:
            return
        self.llm.abort(request_id)
        done = final_done(None, running.prompt, running.output, Timings(), running.request, running.dropped,
                          reason="cancelled")
        self.channel.send(p.Outputs(finished=[p.Finished(running.id, done)], load=self.current_load()))

    # -- the step --------------------------------------------------------------------------------

    def step(self) -> None:
        try:
            outputs = self.llm.step()
        except Exception as exc:  # noqa: BLE001 - every request in the batch fails, the runner goes on
            self._fail_all(exc)
            return
        if outputs:
            self.channel.send(self.outputs(outputs))

    def outputs(self, outputs: list) -> p.Outputs:
        """One step's outputs as one message: a ``Token`` for each request the step gave text (or logprobs),
        a ``Finished`` for each that ended."""
        tokens, finished = [], []
        for out in outputs:
            running = self.running.get(out.request_id)
            if running is None:  # cancelled after the step was launched
                continue
            completion = out.outputs[0]
            running.output += completion.token_ids
            if completion.text or completion.logprobs:
                logprobs = chunk_logprobs(self.llm.tokenizer, completion, running.request)
                tokens.append(p.Token(running.id, Chunk(completion.text, completion.token_ids, logprobs)))
            if out.finished:
                del self.running[out.request_id]
                done = final_done(out, running.prompt, running.output, Timings(), running.request, running.dropped)
                finished.append(p.Finished(running.id, done, spec_decode=self.spec_decode_stats()))
        return p.Outputs(tokens, finished, self.current_load())

    def _fail_all(self, exc: Exception) -> None:
        log.exception("an engine step failed")
        error = (InvalidRequest(str(exc)) if isinstance(exc, ValueError)
                 else BackendUnavailable(f"the native engine failed: {exc}"))
        failed = []
        for request_id, running in list(self.running.items()):
            self.llm.abort(request_id)
            failed.append(p.Failed(running.id, p.error_to_wire(error)))
        self.running.clear()
        if failed:
            self.channel.send(*failed)

    # -- what the gateway reads between requests -------------------------------------------------

    def current_load(self) -> dict[str, float]:
        if self.llm is None:
            return {"requests_running": 0.0, "requests_waiting": 0.0}
        scheduler = self.llm.scheduler
        return {"requests_running": float(scheduler.num_running), "requests_waiting": float(scheduler.num_waiting),
                "kv_cache_usage": scheduler.block_manager.usage}

    def spec_decode_stats(self) -> dict[str, dict]:
        stats = self.llm.spec_decode_stats() if self.llm is not None else None
        return {self.model: stats} if stats else {}

    def close(self) -> None:
        for request_id in list(self.running):
            self.llm.abort(request_id)
        self.running.clear()
        if self.llm is not None:
            self.llm.close()
        self.channel.close()


def serve_core(fd: int, parent: int | None) -> None:
    """The native runner's life: the engine core on this thread (a runner process's main thread) until
    ``Shutdown`` or the gateway's end; ``parent`` None: in the gateway's own process, no parent to watch."""
    import socket
    import threading

    core = EngineCore(BlockingChannel(socket.socket(fileno=fd), p.to_runner), parent)
    core.run(until_loaded=True)
    if core.stopping:
        return
    # The loop goes on, unchanged, on a thread started after the load: stepped on a thread that existed
    # before it (this one, or any), the engine's first step of each request took 0.3-1.6 s instead of
    # 0.04-0.07 s on the shared 2-core machine (torch's OpenMP threads after the load's one-thread copy,
    # native_engine/platform.py); on a thread started after it, as AsyncLLMEngine's is, it does not.
    stepping = threading.Thread(target=core.run, name="engine-core", daemon=True)  # in-process: ends with it
    stepping.start()
    stepping.join()
