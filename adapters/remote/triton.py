"""Triton Inference Server's generate extension in front of a TensorRT-LLM ensemble
(serving-protocols.md §3.2): ``POST /v2/models/{model}/generate_stream`` with a flat body.

Translation (§3.2, §5):
- ``text_input`` is rendered like TGI's native prompt (``frontend.prompt_text.render_prompt``: the
  tokenizer's chat template, else a plain transcript);
- ``max_tokens`` (required): ``num_predict`` when > 0, else ``context_length`` minus the prompt estimate,
  else 512;
- temperature 0 is greedy as ``top_k: 1`` with no temperature/top_p (the template's own default for an
  absent temperature is unconfirmed); temperature > 0, ``top_p`` in (0, 1], ``top_k`` > 0, ``seed`` >= 0,
  ``repeat_penalty`` -> ``repetition_penalty``, presence/frequency penalties pass through; ``stop`` ->
  ``stop_words``; ``ignore_eos`` -> ``min_tokens = max_tokens``; ``format`` -> guided decoding;
- always ``exclude_input_in_output`` and ``return_num_input_tokens``/``return_num_output_tokens``.
The model's config (``GET /v2/models/{model}/config``) is read once: inputs it lacks are not sent, and older
templates get ``random_seed``/``min_length`` for ``seed``/``min_tokens``. Without a readable config the
current names are sent as they are.

The stream ends at connection close (no ``[DONE]``); each event's ``text_output`` is new text. Errors: a 400
``{"error"}`` passes through as a 400 (an unknown model names the entry's ``model`` instead); an error event
inside a 200 stream is a 400 when its wording says the request was wrong ("unexpected", "invalid",
"exceeds", ...), else a failure of the backend (502).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from contextlib import aclosing
from itertools import pairwise
from typing import Any


from core.base import Chunk, GenerationRequest, Usage
from core.errors import BackendError, BackendUnavailable, InvalidRequest
from .http_errors import error_from_status
from .base import RemoteBackend, Turn, error_message
from .client import Response
from .registry import register_remote
from .tgi import EXTRAS as TGI_EXTRAS
from frontend.prompt_text import chat_spec, is_greedy, render_prompt, token_budget, translate
from .wire import parse_object, sse_data

# option -> (input name, the values sent); TGI's penalties and seed rules, plus presence_penalty
SAMPLERS = {"temperature": ("temperature", lambda v: v > 0), "top_p": ("top_p", lambda v: 0 < v <= 1),
            "top_k": ("top_k", lambda v: v > 0)}
EXTRAS = {**TGI_EXTRAS, "presence_penalty": ("presence_penalty", bool)}
_OLD_NAMES = {"seed": "random_seed", "min_tokens": "min_length"}
_REQUIRED = ("text_input", "max_tokens")
_REQUEST_WORDING = re.compile(r"unexpected|invalid|must be|exceed|out of range|too (long|large|many)|"
                              r"not supported|unsupported|greater than|less than", re.IGNORECASE)


class TritonBackend(RemoteBackend):
    type = "triton"
    health_path = "/v2/health/ready"

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._inputs: frozenset[str] | None = None

    @property
    def model(self) -> str:
        return self.settings.model or "ensemble"

    async def generate(self, request: GenerationRequest, turn: Turn):
        body = await self.request_body(request)
        route = "generate_stream" if request.stream else "generate"
        counts = Counts()
        accept = "text/event-stream" if request.stream else "application/json"
        async with self.post_stream(f"/v2/models/{self.model}/{route}", body, accept) as response, \
                aclosing(sse_data(response) if request.stream else _one(response)) as events:
            async for data in events:
                if data.strip() == "[DONE]":
                    continue
                event = parse_object(data)
                if "error" in event:
                    raise self.event_error(str(event["error"]))
                counts.add(event)
                text = _scalar(event.get("text_output"))
                if text:
                    yield Chunk(str(text))
        counts.record(turn, body["max_tokens"], None if request.stream else self.counter.count(turn.text))

    async def request_body(self, request: GenerationRequest) -> dict[str, Any]:
        prompt = render_prompt(request, chat_spec(self.settings.tokenizer))
        max_tokens = token_budget(request.options.get("num_predict"), self.counter, prompt,
                                  self.settings.context_length)
        body = flat_body(prompt, request.options, max_tokens, request.stream)
        if request.format:
            body.update(guided_decoding(request.format))
        body = adapt(body, await self.input_names())
        if request.format and "guided_decoding_guide_type" not in body:
            raise InvalidRequest(f"Triton model '{self.model}' has no guided decoding inputs; format is not "
                                 "supported here", param="format")
        return body

    async def input_names(self) -> frozenset[str] | None:
        """The model's input names from its config, read once; None while unreadable."""
        if self._inputs is None:
            try:
                config = await self.get_json(f"/v2/models/{self.model}/config")
                inputs = config.get("input", []) if isinstance(config, dict) else []
                self._inputs = frozenset(str(i["name"]) for i in inputs if isinstance(i, dict) and "name" in i)
            except Exception:
                return None
        return self._inputs or None

    def error_from_response(self, status: int, body: bytes, headers: Mapping[str, str]) -> BackendError:
        message = error_message(body)
        if status in (400, 404) and "unknown model" in message.lower():
            return BackendUnavailable(f"{self.where} does not serve '{self.model}' ({message}); check the entry's "
                                      "model (the Triton model name, e.g. 'ensemble')")
        return error_from_status(self.where, status, message, headers)

    def event_error(self, message: str) -> BackendError:
        if _REQUEST_WORDING.search(message):
            return InvalidRequest(message)
        return BackendUnavailable(f"{self.where} failed: {message}")

    async def models(self) -> list[str]:
        response = await self.client.get(f"/v2/models/{self.model}/ready", self.headers())
        if response.status_code != 200:
            raise self.error_from_response(response.status_code, response.content, response.headers)
        return [self.model]


def flat_body(prompt: str, options: dict[str, Any], max_tokens: int, stream: bool) -> dict[str, Any]:
    body: dict[str, Any] = {"text_input": prompt, "max_tokens": max_tokens, "stream": stream,
                            "exclude_input_in_output": True, "return_num_input_tokens": True,
                            "return_num_output_tokens": True}
    body.update({"top_k": 1} if is_greedy(options) else translate(options, SAMPLERS))
    body.update(translate(options, EXTRAS))
    stop = options.get("stop")
    if stop:
        body["stop_words"] = [stop] if isinstance(stop, str) else list(stop)
    if options.get("ignore_eos"):
        body["min_tokens"] = max_tokens
    return body


def guided_decoding(format: str | dict) -> dict[str, Any]:
    if isinstance(format, dict):
        return {"guided_decoding_guide_type": "json_schema", "guided_decoding_guide": json.dumps(format)}
    return {"guided_decoding_guide_type": "json"}


def adapt(body: dict[str, Any], inputs: frozenset[str] | None) -> dict[str, Any]:
    """The body in the names the model's config declares (older templates: random_seed, min_length)."""
    if inputs is None:
        return body
    out: dict[str, Any] = {}
    for key, value in body.items():
        name = _OLD_NAMES.get(key, key) if key not in inputs else key
        if name in inputs or key in _REQUIRED:
            out[name] = value
    return out


class Counts:
    """Token counts across the events. ``num_input_tokens`` is the prompt's; ``num_output_tokens`` per event
    may be this event's tokens or the running total (unconfirmed): a series that grows from first to last
    is read as running totals (the last one), anything else as per-event counts (their sum)."""

    def __init__(self) -> None:
        self.input: int | None = None
        self.outputs: list[int] = []

    def add(self, event: dict[str, Any]) -> None:
        n_in, n_out = _number(event.get("num_input_tokens")), _number(event.get("num_output_tokens"))
        if n_in is not None:
            self.input = n_in
        if n_out is not None:
            self.outputs.append(n_out)

    @property
    def output(self) -> int | None:
        values = self.outputs
        if not values:
            return None
        growing = len(values) > 1 and values[-1] > values[0] and all(a <= b for a, b in pairwise(values))
        return values[-1] if growing else sum(values)

    def record(self, turn: Turn, max_tokens: int, produced: int | None = None) -> None:
        """Usage when reported; "length" when the output (reported, else ``produced`` or the number of
        events) reached ``max_tokens``."""
        output = self.output
        if output is not None:
            turn.reported = Usage(input_tokens=self.input or 0, output_tokens=output, source="backend")
        elif self.input:
            turn.reported = Usage(input_tokens=self.input, output_tokens=0, source="backend")
        produced = output if output is not None else produced if produced is not None else turn.events
        turn.finish_reason = "length" if produced >= max_tokens else "stop"


async def _one(response: Response):
    """A non-streaming reply as one event."""
    yield (await response.aread()).decode("utf-8", errors="replace")


def _scalar(value: Any) -> Any:
    """A one-element output tensor as its value."""
    return value[0] if isinstance(value, list) and value else value


def _number(value: Any) -> int | None:
    value = _scalar(value)
    try:
        return int(value) if value is not None else None
    except (TypeError, ValueError):
        return None


register_remote("triton", TritonBackend)
