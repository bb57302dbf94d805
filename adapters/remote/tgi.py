"""Hugging Face TGI (serving-protocols.md §2): the native ``/generate(_stream)`` API, or with
``mode: messages`` its OpenAI-style Messages API (§2.9).

Native translation (§2.3, §5): the prompt is rendered here (:func:`render_prompt`, with the configured
tokenizer's chat template, else a plain transcript); ``max_new_tokens`` is always sent (older TGIs default
to 20; see :func:`token_budget`); temperature 0 is greedy, sent as ``do_sample: false`` with no
temperature/top_p/top_k (TGI rejects 0); temperature > 0 adds ``do_sample: true``; ``top_p``/``typical_p``
only inside (0, 1), ``top_k`` only > 0, ``repeat_penalty`` -> ``repetition_penalty`` (> 0, != 1),
``seed`` >= 0; more ``stop`` strings than /info's ``max_stop_sequences`` (4) is our 400; ``format`` ->
``grammar``; ``details: true`` for usage. Dropped (not in the native API): min_p, presence_penalty,
ignore_eos. Messages mode sends ``model: "tgi"`` (another name selects a LoRA adapter) and leaves
``max_tokens`` to TGI when ``num_predict`` is unset; it has no top_k or repetition_penalty.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import aclosing
from typing import Any

from core.base import Chunk, GenerationRequest, Usage
from core.errors import BackendError, BackendProtocolError, BackendUnavailable, InvalidRequest
from .http_errors import error_from_status
from .openai_compat import OpenAICompatBackend
from .base import RemoteBackend, Turn, error_message, message_of
from frontend.prompt_text import chat_spec, is_greedy, render_prompt, token_budget, translate
from .registry import register_remote
from .wire import parse_json, parse_object, sse_data

_REQUEST_ERRORS = {"validation", "template_error", "missing_template_variable", "tool_error"}
_LOAD_METRICS = {"tgi_queue_size": "requests_waiting", "tgi_batch_current_size": "requests_running"}


class TGIBackend(RemoteBackend):
    type = "tgi"
    health_path = "/health"

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._info: dict[str, Any] | None = None
        self._messages_api = MessagesAPI(self)

    def generate(self, request: GenerationRequest, turn: Turn):
        if self.settings.mode == "messages":
            return self._messages(request, turn)
        return self._stream(request, turn) if request.stream else self._once(request, turn)

    async def _stream(self, request: GenerationRequest, turn: Turn):
        body = await self.native_body(request)
        final = False
        async with self.post_stream("/generate_stream", body) as response, aclosing(sse_data(response)) as events:
            async for data in events:
                event = parse_object(data)
                if "error" in event:
                    raise self.event_error(event)
                token = event.get("token") or {}
                if token.get("text") and not token.get("special"):
                    yield Chunk(token["text"], [token["id"]] if isinstance(token.get("id"), int) else [])
                if event.get("generated_text") is not None:
                    final = True
                    record(turn, event.get("details"), budget=body["parameters"]["max_new_tokens"])
        if not final:
            raise BackendProtocolError(f"{self.where} ended the stream before its final event (incomplete stream)")

    async def _once(self, request: GenerationRequest, turn: Turn):
        body = await self.native_body(request)
        response = await self.client.post("/generate", body, self.headers())
        reply = self._json(response)
        if not isinstance(reply, dict):
            raise BackendProtocolError(f"{self.where} sent a /generate reply that is not an object")
        # Non-stream details carry no input_length: TGI's x-prompt-tokens header, else our count.
        prompt_tokens = _int(response.headers.get("x-prompt-tokens")) or self.counter.count(body["inputs"])
        turn.queue += (_int(response.headers.get("x-queue-time")) or 0) / 1000  # ms TGI's scheduler held it
        record(turn, reply.get("details"), prompt_tokens, budget=body["parameters"]["max_new_tokens"],
               produced=self.counter.count(reply.get("generated_text") or ""))
        if reply.get("generated_text"):
            yield Chunk(reply["generated_text"])

    async def native_body(self, request: GenerationRequest) -> dict[str, Any]:
        info = await self.info()
        options = request.options
        prompt = render_prompt(request, chat_spec(self.settings.tokenizer))
        total = info.get("max_total_tokens") or self.settings.context_length
        budget = token_budget(options.get("num_predict"), self.counter, prompt, total)
        params = {"max_new_tokens": budget, "details": True, "return_full_text": False, **sampling(options)}
        stop = stop_list(options.get("stop"), info.get("max_stop_sequences") or 4)
        if stop:
            params["stop"] = stop
        if request.format:
            params["grammar"] = grammar(request.format)
        return {"inputs": prompt, "parameters": params}

    async def _messages(self, request: GenerationRequest, turn: Turn):
        await self.info()  # the stop limit
        async with aclosing(self._messages_api.generate(request, turn)) as chunks:  # a client gone closes it
            async for chunk in chunks:
                yield chunk

    # -- errors, info, health --------------------------------------------------------------------

    def error_from_response(self, status: int, body: bytes, headers: Mapping[str, str]) -> BackendError:
        try:
            value = parse_json(body) if body.strip() else None
        except BackendError:
            value = None
        kind = value.get("error_type") if isinstance(value, dict) else None
        return self.mapped_error(error_message(body), kind, status, headers)

    def event_error(self, event: dict[str, Any]) -> BackendError:
        """An ``error`` event inside a 200 stream: native ``{"error", "error_type"}`` or the Messages
        API's ``{"error": {"message", "http_status_code"}}``."""
        error = event["error"]
        if isinstance(error, dict):
            status = _int(error.get("http_status_code")) or 500
            return self.mapped_error(message_of(error) or str(error), error.get("error_type"), status, None)
        return self.mapped_error(str(error), event.get("error_type"), 500, None)

    def mapped_error(self, message: str, kind: Any, status: int, headers: Mapping[str, str] | None) -> BackendError:
        """TGI's error_type (§2.6) first, its status second."""
        kind = str(kind or "")
        if kind in _REQUEST_ERRORS:
            return InvalidRequest(message)
        if kind == "overloaded":
            return error_from_status(self.where, 429, message, headers)
        if kind == "generation" or kind.startswith("incomplete_generation") or status == 424:
            return BackendUnavailable(f"{self.where} failed to generate: {message}")
        if kind == "stream_serialization_error":
            return BackendProtocolError(f"{self.where} could not serialize its stream: {message}")
        return error_from_status(self.where, status, message, headers)

    async def info(self) -> dict[str, Any]:
        """/info, read once (its limits do not change while the server runs); {} while unreadable."""
        if self._info is None:
            try:
                info = await self.get_json("/info")
            except Exception:  # the request itself will report the failure
                return {}
            self._info = info if isinstance(info, dict) else {}
        return self._info

    async def models(self) -> list[str]:
        info = await self.get_json("/info")
        return [str(info["model_id"])] if isinstance(info, dict) and info.get("model_id") else []

    async def load_metrics(self) -> dict[str, float]:
        """Queue and batch sizes from /metrics."""
        return await self.prometheus_metrics(_LOAD_METRICS)


class MessagesAPI(OpenAICompatBackend):
    """TGI's Messages API (§2.9) as an OpenAI-compatible server, on the TGI backend's client: ``model: "tgi"``
    (another name selects a LoRA adapter), TGI's ranges, ``grammar`` for ``format``, TGI's error mapping."""

    type = "tgi"
    passes_fields = False  # TGI's own fields differ from vLLM's (its ranges and names are mapped here)

    def __init__(self, tgi: TGIBackend):
        super().__init__(tgi.settings, client=tgi.client, counter=tgi.counter)
        self.tgi = tgi

    def headers(self, request_id: str | None = None) -> dict[str, str]:
        return self.tgi.headers(request_id)  # the TGI backend's, trace context included

    def body(self, request: GenerationRequest, stream: bool) -> tuple[str, dict[str, Any]]:
        path, body = super().body(request, stream)
        body["model"] = "tgi"
        if request.format:
            body["response_format"] = grammar(request.format)
        return path, body

    def sampling(self, options: dict[str, Any]) -> dict[str, Any]:
        out = translate(options, MESSAGES)
        if is_greedy(options):  # temperature 0 is greedy there; a top_p would turn sampling back on
            out.pop("top_p", None)
        if isinstance(options.get("num_predict"), int) and options["num_predict"] > 0:
            out["max_tokens"] = options["num_predict"]
        stop = stop_list(options.get("stop"), (self.tgi._info or {}).get("max_stop_sequences") or 4)
        return {**out, "stop": stop} if stop else out

    def error_from_response(self, status: int, body: bytes, headers: Mapping[str, str]) -> BackendError:
        return self.tgi.error_from_response(status, body, headers)

    def stream_error(self, error: Any) -> Exception:
        return self.tgi.event_error({"error": error})


# option -> (TGI field, the values TGI accepts) (§2.3)
SAMPLERS = {"temperature": ("temperature", lambda v: v > 0), "top_p": ("top_p", lambda v: 0 < v < 1),
            "typical_p": ("typical_p", lambda v: 0 < v < 1), "top_k": ("top_k", lambda v: v > 0)}
EXTRAS = {"repeat_penalty": ("repetition_penalty", lambda v: v > 0 and v != 1),
          "frequency_penalty": ("frequency_penalty", bool), "seed": ("seed", lambda v: v >= 0)}
MESSAGES = {"temperature": ("temperature", lambda v: v >= 0), "top_p": ("top_p", lambda v: 0 < v < 1),
            "frequency_penalty": ("frequency_penalty", bool), "presence_penalty": ("presence_penalty", bool),
            "seed": ("seed", lambda v: v >= 0)}


def sampling(options: dict[str, Any]) -> dict[str, Any]:
    """TGI ``parameters`` for the sampling options (§2.3 ranges)."""
    if is_greedy(options):
        out: dict[str, Any] = {"do_sample": False}
    else:
        out = translate(options, SAMPLERS)
        if "temperature" in out:
            out["do_sample"] = True
    return {**out, **translate(options, EXTRAS)}


def stop_list(stop: Any, limit: int) -> list[str]:
    stops = [stop] if isinstance(stop, str) else list(stop or [])
    if len(stops) > limit:
        raise InvalidRequest(f"this TGI backend accepts at most {limit} stop sequences (max_stop_sequences); "
                             f"got {len(stops)}", param="stop")
    return stops


def grammar(format: str | dict) -> dict[str, Any]:
    return {"type": "json", "value": format if isinstance(format, dict) else {}}


def record(turn: Turn, details: Any, prompt_tokens: int = 0, budget: int = 0, produced: int | None = None) -> None:
    """The final event's details: finish reason and usage. Without details, a reply that used its whole
    ``budget`` (``produced`` tokens, by default the token events) stopped for length."""
    details = details if isinstance(details, dict) else {}
    produced = turn.events if produced is None else produced
    reason = details.get("finish_reason") or ("length" if budget and produced >= budget else "stop")
    turn.finish_reason = "length" if reason == "length" else "stop"
    if _int(details.get("generated_tokens")) is not None:
        turn.reported = Usage(input_tokens=_int(details.get("input_length")) or prompt_tokens,
                              output_tokens=_int(details["generated_tokens"]) or 0, source="backend")


def _int(value: Any) -> int | None:
    try:
        return int(value) if value is not None else None
    except (TypeError, ValueError):
        return None


register_remote("tgi", TGIBackend)
