"""Fake ``trtllm-serve`` (serving-protocols.md §3.1), written against TensorRT-LLM's
``tensorrt_llm/serve/openai_server.py`` at commit ``00057725`` and ``openai_protocol.py`` at ``0076e939``
(``/version`` answers :data:`VERSION`). TensorRT-LLM needs an NVIDIA GPU: no live check here.

Reproduces: OpenAI-style ``/v1/completions`` and ``/v1/chat/completions`` whose request models are
``extra="forbid"`` (unknown field → 400 ``{"error": "<pydantic errors>"}``, as FastAPI's
``RequestValidationError`` handler writes it), ``model`` required in chat, ``stream_options`` only with
``stream`` and ``include_usage`` on by default, usage with ``prompt_tokens_details.cached_tokens``,
flat ``{"object": "error", ...}`` bodies for other errors, a mid-stream failure that cuts the
connection (the stream generator re-raises; no error event, no ``[DONE]``), ``/health``,
``/health_generate``, ``/version``, ``/v1/models`` (``owned_by: "tensorrt_llm"``) and ``/metrics`` as a
JSON list of iteration stats.
"""

from __future__ import annotations

from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.routing import Route

from .behaviour import Behaviour
from .common import (
    Reply,
    drive,
    dropped_reply,
    json_reply,
    read_request,
    retry_headers,
    text_reply,
)
from .engine import FakeEngine, Generation
from .openai_wire import Style, full_body, stream_wire
from .vllm import error_type

DEFAULT_MODEL = "TinyLlama-1.1B-Chat-v1.0"
VERSION = "1.2.0"
SAMPLING = {"model", "best_of", "echo", "frequency_penalty", "logit_bias", "logprobs", "n", "presence_penalty",
            "seed", "stop", "stream", "stream_options", "temperature", "top_p", "user", "top_k", "top_p_min",
            "min_p", "repetition_penalty", "length_penalty", "early_stopping", "stop_token_ids",
            "include_stop_str_in_output", "ignore_eos", "min_tokens", "skip_special_tokens",
            "spaces_between_special_tokens", "truncate_prompt_tokens", "return_context_logits",
            "return_generation_logits", "detokenize", "add_special_tokens", "response_format", "priority",
            "use_beam_search", "lora_request", "disaggregated_params", "cache_salt", "prompt_logprobs"}
COMPLETION_FIELDS = SAMPLING | {"prompt", "max_tokens", "suffix"}
CHAT_FIELDS = SAMPLING | {"messages", "max_tokens", "max_completion_tokens", "top_logprobs", "tools",
                          "tool_choice", "parallel_tool_calls", "reasoning_effort", "add_generation_prompt",
                          "documents", "chat_template", "chat_template_kwargs", "prompt_token_ids",
                          "agent_hierarchy", "mm_processor_kwargs"}


def flat_error(status: int, message: str) -> dict[str, Any]:
    """``ErrorResponse``: ``{"object": "error", "message", "type", "param", "code"}``."""
    return {"object": "error", "message": message, "type": error_type(status), "param": None, "code": status}


def error_reply(b: Behaviour, status: int, message: str) -> Reply:
    """400 is the validation handler's ``{"error": str(exc)}``; every other status the flat shape."""
    body = {"error": message} if status == 400 else flat_error(status, message)
    return json_reply(b, body, status, retry_headers(b, status))


def validation_errors(body: Any, chat: bool) -> list[dict[str, Any]]:
    """The pydantic errors FastAPI would collect for this body."""
    if not isinstance(body, dict):
        return [{"type": "model_attributes_type", "loc": ("body",), "msg": "Input should be a valid dictionary "
                 "or object to extract fields from", "input": body}]
    required = ("messages", "model") if chat else ("prompt",)
    errors = [{"type": "missing", "loc": ("body", name), "msg": "Field required", "input": body}
              for name in required if name not in body]
    allowed = CHAT_FIELDS if chat else COMPLETION_FIELDS
    errors += [{"type": "extra_forbidden", "loc": ("body", name), "msg": "Extra inputs are not permitted",
                "input": value} for name, value in body.items() if name not in allowed]
    if not errors and body.get("stream_options") is not None and not body.get("stream"):
        errors.append({"type": "value_error", "loc": ("body",),
                       "msg": "Value error, Stream options can only be defined when `stream=True`.", "input": body})
    return errors


def run(body: dict[str, Any], chat: bool) -> Generation:
    limit = body.get("max_completion_tokens", body.get("max_tokens")) if chat else body.get("max_tokens")
    prompt = body["messages"] if chat else str(body["prompt"])
    return FakeEngine.run(prompt, limit, body.get("stop"))


def stream_reply(b: Behaviour, style: Style, gen: Generation, body: dict[str, Any]) -> Reply:
    """``StreamOptions.include_usage`` defaults to True: the usage chunk comes unless turned off."""
    include_usage = (body.get("stream_options") or {}).get("include_usage", True) is not False and b.report_usage
    wire = stream_wire(style, gen, include_usage, None, b'data: {"id": "cmpl-\n\n')
    return Reply(b, 200, {"content-type": "text/event-stream; charset=utf-8"}, drive(b, len(gen.tokens), wire))


def whole_reply(b: Behaviour, style: Style, gen: Generation) -> Reply:
    """A failure while generating becomes ``create_error_response(str(e))``: flat, 400 BadRequestError."""
    fault, value = b.body_fault(), full_body(style, gen, b.report_usage)
    if fault == "fail":
        return json_reply(b, flat_error(400, b.fail_message), 400)
    if fault == "drop":
        return dropped_reply(b, value)
    if fault == "malformed":
        return text_reply(b, '{"id": "cmpl-', content_type="application/json")
    return json_reply(b, value)


def completions(b: Behaviour, chat: bool):
    async def endpoint(request: Request) -> Reply:
        body = await read_request(request, b)
        status = b.take_failure()
        if status is not None:
            return error_reply(b, status, b.fail_message)
        errors = validation_errors(body, chat)
        if errors:
            return error_reply(b, 400, str(errors))
        if not chat and body.get("suffix") is not None:
            return json_reply(b, flat_error(400, "suffix is not currently supported"), 400)
        gen = run(body, chat)
        style = Style(chat, b.models[0], usage_extra={"prompt_tokens_details": {"cached_tokens": 0}})
        return stream_reply(b, style, gen, body) if body.get("stream") else whole_reply(b, style, gen)

    return endpoint


def iteration_stats(b: Behaviour) -> dict[str, Any]:
    """One executor ``IterationStats`` item (§3.1 ``/metrics``); KV figures from ``kv_usage``."""
    used = round(b.kv_usage * 1000)
    return {"iter": 1, "iterLatencyMS": 1.5, "gpuMemUsage": 1 << 30, "cpuMemUsage": 0, "pinnedMemUsage": 0,
            "numActiveRequests": b.running, "numQueuedRequests": b.waiting, "numCompletedRequests": 0,
            "maxNumActiveRequests": 256, "timestamp": "01-01-2026 00:00:00",
            "inflightBatchingStats": {"numScheduledRequests": b.running, "numContextRequests": 0,
                                      "numGenRequests": b.running, "numPausedRequests": 0, "numCtxTokens": 0,
                                      "microBatchId": 0, "avgNumDecodedTokensPerIter": 1.0},
            "kvCacheStats": {"maxNumBlocks": 1000, "freeNumBlocks": 1000 - used, "usedNumBlocks": used,
                             "tokensPerBlock": 32, "allocTotalBlocks": used, "allocNewBlocks": used,
                             "reusedBlocks": 0, "missedBlocks": 0, "cacheHitRate": 0.0}}


def make_app(b: Behaviour) -> Starlette:
    async def health(_: Request) -> Reply:
        return text_reply(b, "") if b.healthy else text_reply(
            b, "LLM is unavailable. Please check the server logs for more details.", 503)

    async def health_generate(_: Request) -> Reply:
        return text_reply(b, "Generation health check OK") if b.healthy else text_reply(
            b, "Generation health check failed", 500)

    async def version(_: Request) -> Reply:
        return json_reply(b, {"version": VERSION})

    async def models(_: Request) -> Reply:
        cards = [{"id": m, "object": "model", "created": 0, "owned_by": "tensorrt_llm"} for m in b.models]
        return json_reply(b, {"object": "list", "data": cards})

    async def metrics(_: Request) -> Reply:
        return json_reply(b, [iteration_stats(b)])

    return Starlette(routes=[
        Route("/v1/completions", completions(b, chat=False), methods=["POST"]),
        Route("/v1/chat/completions", completions(b, chat=True), methods=["POST"]),
        Route("/health", health), Route("/health_generate", health_generate), Route("/version", version),
        Route("/v1/models", models), Route("/metrics", metrics),
    ])
