"""Fake Triton Inference Server with the TensorRT-LLM ensemble, generate extension
(serving-protocols.md §3.2), written against Triton's ``docs/protocol/extension_generate.md`` and the
``inflight_batcher_llm`` ensemble of ``NVIDIA/TensorRT-LLM`` ``triton_backend`` at commit ``2a9abd95``
(older templates: ``tensorrtllm_backend`` ``fca166cc``). Needs an NVIDIA GPU: no live check here.

Reproduces: ``/v2/models/{model}[/versions/{v}]/generate`` → one JSON object
``{"model_name", "model_version": "1", "text_output", ...outputs}``; ``/generate_stream`` →
``text/event-stream; charset=utf-8`` with one ``data: {json}`` per response holding the newly decoded
text, no ``[DONE]`` (the body simply ends), a failure after the 200 as ``data: {"error": "..."}``;
the flat request (``text_input``, required ``max_tokens``, ``stop_words``, ``bad_words``, sampling
fields, ``stream``, ``return_num_input_tokens``/``return_num_output_tokens`` → ``num_input_tokens``/
``num_output_tokens`` outputs, ``exclude_input_in_output``); ``{"error": "..."}`` bodies (400);
``/v2/health/ready``, ``/v2/health/live``, ``/v2/models/{model}/ready`` and ``/config``.

Interpretations (marked unconfirmed in §3.2): a non-streamed ``text_output`` starts with the prompt
unless ``exclude_input_in_output`` is true; streamed responses never repeat it; each streamed event's
``num_output_tokens`` is the running total.
"""

from __future__ import annotations

from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.routing import Route

from .behaviour import Behaviour
from .common import (
    Reply,
    Wire,
    drive,
    dropped_reply,
    dumps,
    json_reply,
    read_request,
    retry_headers,
    text_reply,
)
from .engine import FakeEngine, Generation

DEFAULT_MODEL = "ensemble"
REQUIRED = {"text_input": "TYPE_STRING", "max_tokens": "TYPE_INT32"}
OPTIONAL = {"decoder_text_input": "TYPE_STRING", "num_return_sequences": "TYPE_INT32", "bad_words": "TYPE_STRING",
            "stop_words": "TYPE_STRING", "exclude_input_in_output": "TYPE_BOOL", "end_id": "TYPE_INT32",
            "pad_id": "TYPE_INT32", "top_k": "TYPE_INT32", "top_p": "TYPE_FP32", "temperature": "TYPE_FP32",
            "length_penalty": "TYPE_FP32", "repetition_penalty": "TYPE_FP32", "min_tokens": "TYPE_INT32",
            "presence_penalty": "TYPE_FP32", "frequency_penalty": "TYPE_FP32", "seed": "TYPE_UINT64",
            "return_log_probs": "TYPE_BOOL", "return_context_logits": "TYPE_BOOL",
            "return_generation_logits": "TYPE_BOOL", "return_num_input_tokens": "TYPE_BOOL",
            "return_num_output_tokens": "TYPE_BOOL", "beam_width": "TYPE_INT32", "stream": "TYPE_BOOL"}
OUTPUTS = {"text_output": "TYPE_STRING", "cum_log_probs": "TYPE_FP32", "output_log_probs": "TYPE_FP32",
           "context_logits": "TYPE_FP32", "generation_logits": "TYPE_FP32", "batch_index": "TYPE_INT32",
           "sequence_index": "TYPE_INT32", "num_input_tokens": "TYPE_INT32", "num_output_tokens": "TYPE_INT32"}
SSE = "text/event-stream; charset=utf-8"


def error_reply(b: Behaviour, status: int, message: str) -> Reply:
    """§3.2: ``{"error": "<message>"}`` whatever the status."""
    return json_reply(b, {"error": message}, status, retry_headers(b, status))


def request_problem(body: Any, model: str, version: str | None, b: Behaviour) -> str | None:
    """What Triton rejects before inference (always 400)."""
    if model not in b.models or version not in (None, "1"):
        return f"Request for unknown model: '{model}' is not found"
    if not isinstance(body, dict):
        return "failed to parse the request JSON buffer: Invalid value. at 0"
    given = [name for name in (*REQUIRED, *OPTIONAL) if name in body]
    missing = [name for name in REQUIRED if name not in body]
    if missing:
        return (f"[request id: <id_unknown>] expected number of inputs between {len(REQUIRED)} and "
                f"{len(REQUIRED) + len(OPTIONAL)} but got {len(given)} inputs for model '{model}'. Got input(s) "
                f"{given}, but missing required input(s) {missing}. Please provide all required input(s).")
    if not isinstance(body["max_tokens"], int) or isinstance(body["max_tokens"], bool):
        return "Unable to parse 'max_tokens': attempt to access JSON non-signed-integer as signed-integer"
    return None


def stop_words(value: Any) -> list[str]:
    """``stop_words`` is a STRING list; a single string (``""`` = none) is accepted too."""
    return [value] if isinstance(value, str) else [str(v) for v in value or []]


def outputs(b: Behaviour, body: dict[str, Any], model: str, text: str, gen: Generation, count: int) -> dict:
    """One response: model name/version, then the ensemble's output tensors by name."""
    value = {"model_name": model, "model_version": "1", "text_output": text, "cum_log_probs": 0.0,
             "output_log_probs": [0.0] * count, "context_logits": 0.0, "generation_logits": 0.0,
             "batch_index": 0, "sequence_index": 0}
    if b.report_usage and body.get("return_num_input_tokens"):
        value["num_input_tokens"] = gen.prompt_tokens
    if b.report_usage and body.get("return_num_output_tokens"):
        value["num_output_tokens"] = count
    return value


def event(value: Any) -> bytes:
    return b"data: " + dumps(value).encode() + b"\n\n"


def stream_wire(b: Behaviour, body: dict[str, Any], model: str, gen: Generation) -> Wire:
    """One event per token with only the new text; a zero-token answer still sends one (empty) event."""
    def token(i: int) -> bytes:
        return event(outputs(b, body, model, gen.tokens[i][1], gen, i + 1))

    def end() -> bytes:
        return event(outputs(b, body, model, "", gen, 0)) if not gen.tokens else b""

    return Wire(token, end, lambda message: event({"error": message}), b'data: {"text_output":\n\n')


def whole_text(body: dict[str, Any], gen: Generation) -> str:
    return gen.text if body.get("exclude_input_in_output") else str(body["text_input"]) + gen.text


def answer(b: Behaviour, body: dict[str, Any], model: str, gen: Generation, stream: bool) -> Reply:
    if stream and body.get("stream"):
        return Reply(b, 200, {"content-type": SSE}, drive(b, len(gen.tokens), stream_wire(b, body, model, gen)))
    value = outputs(b, body, model, whole_text(body, gen), gen, gen.completion_tokens)
    fault = b.body_fault()
    if fault == "fail":
        return error_reply(b, 500, b.fail_message)
    if fault == "drop":
        return dropped_reply(b, value)
    if fault == "malformed":
        return text_reply(b, '{"model_name":', content_type="application/json")
    if stream:  # generate_stream without "stream": true → a single event with the whole answer
        return Reply(b, 200, {"content-type": SSE}, event(value))
    return json_reply(b, value)


def generation(b: Behaviour, stream: bool):
    async def endpoint(request: Request) -> Reply:
        body = await read_request(request, b)
        model, version = request.path_params["model"], request.path_params.get("version")
        status = b.take_failure()
        if status is not None:
            return error_reply(b, status, b.fail_message)
        message = request_problem(body, model, version, b)
        if message:
            return error_reply(b, 400, message)
        gen = FakeEngine.run(str(body["text_input"]), body["max_tokens"], stop_words(body.get("stop_words")))
        return answer(b, body, model, gen, stream)

    return endpoint


def model_config(model: str) -> dict[str, Any]:
    """The ensemble's ``config.pbtxt`` as ``GET /v2/models/{model}/config`` returns it (trimmed)."""
    inputs = [{"name": n, "data_type": t, "dims": [1] if n in REQUIRED else [-1], "optional": n not in REQUIRED}
              for n, t in {**REQUIRED, **OPTIONAL}.items()]
    return {"name": model, "platform": "ensemble", "backend": "", "version_policy": {"latest": {"num_versions": 1}},
            "max_batch_size": 64, "input": inputs,
            "output": [{"name": n, "data_type": t, "dims": [-1]} for n, t in OUTPUTS.items()],
            "ensemble_scheduling": {"step": []}, "parameters": {}}


def make_app(b: Behaviour) -> Starlette:
    async def server_health(_: Request) -> Reply:
        return text_reply(b, "", 200 if b.healthy else 400)

    async def model_ready(request: Request) -> Reply:
        return text_reply(b, "", 200 if b.healthy and request.path_params["model"] in b.models else 400)

    async def config(request: Request) -> Reply:
        model = request.path_params["model"]
        if model not in b.models:
            return error_reply(b, 400, f"Request for unknown model: '{model}' is not found")
        return json_reply(b, model_config(model))

    base, versioned = "/v2/models/{model}", "/v2/models/{model}/versions/{version}"
    routes = [Route(f"{prefix}/{name}", generation(b, name == "generate_stream"), methods=["POST"])
              for prefix in (base, versioned) for name in ("generate", "generate_stream")]
    return Starlette(routes=routes + [
        Route("/v2/health/ready", server_health), Route("/v2/health/live", server_health),
        Route(f"{base}/ready", model_ready), Route(f"{base}/config", config),
    ])
