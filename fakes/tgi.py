"""Fake Hugging Face TGI router (serving-protocols.md §2), written against TGI 3.3.6
(``huggingface/text-generation-inference`` commit ``db931fcf``, 2026-01-08; the version its ``/info``
reports). No CPU build of TGI runs here, so it is not checked against a live server.

Reproduces: ``/generate`` (§2.4: ``details`` only when asked, ``x-*`` timing/token headers),
``/generate_stream`` (§2.5: ``data:{json}`` with no space, index from 1, last event with
``generated_text`` and ``details``, no ``[DONE]``, ``X-Accel-Buffering: no``, in-stream
``{"error", "error_type"}`` event), the §2.3 validation → 422 ``{"error": "Input validation error: …",
"error_type": "validation"}``, the §2.6 error table, axum's ``Json`` rejections (415/400/422 plain
text), ``/info``, ``/health``, ``/v1/models``, ``/metrics`` (§2.7, §2.8) and the Messages API
``/v1/chat/completions`` (§2.9).
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
from .openai_wire import Style, full_body, stream_wire

DEFAULT_MODEL = "bigscience/bloom-560m"
MAX_INPUT_TOKENS, MAX_TOTAL_TOKENS, MAX_STOP_SEQUENCES, MAX_BEST_OF, MAX_TOP_N_TOKENS = 512, 1024, 4, 2, 5
ERROR_TYPES = {422: "validation", 424: "generation", 429: "overloaded", 500: "incomplete_generation",
               503: "healthcheck"}
STREAM_HEADERS = {"content-type": "text/event-stream", "cache-control": "no-cache",
                  "x-compute-type": "gpu+optimized", "x-accel-buffering": "no"}


def error_reply(b: Behaviour, status: int, message: str, error_type: str | None = None) -> Reply:
    """§2.6: ``{"error": "<message>", "error_type": "<type>"}``."""
    body = {"error": message, "error_type": error_type or ERROR_TYPES.get(status, "generation")}
    return json_reply(b, body, status, retry_headers(b, status))


async def parse(request: Request, b: Behaviour, required: str) -> tuple[dict[str, Any] | None, Reply | None]:
    """axum's ``Json`` extractor: 415 without a JSON content type, 400 on bad syntax, 422 on a bad shape."""
    body = await read_request(request, b)
    if "application/json" not in request.headers.get("content-type", ""):
        return None, text_reply(b, "Expected request with `Content-Type: application/json`", 415,
                                "text/plain; charset=utf-8")
    if body is None:
        return None, text_reply(b, "Failed to parse the request body as JSON", 400, "text/plain; charset=utf-8")
    if not isinstance(body, dict) or required not in body:
        message = f"Failed to deserialize the JSON body into the target type: missing field `{required}`"
        return None, text_reply(b, message, 422, "text/plain; charset=utf-8")
    return body, None


def invalid(p: dict[str, Any], prompt_tokens: int, stream: bool) -> str | None:
    """§2.3, in the router's order; the message as ``ValidationError`` words it."""
    def given(name):
        return p.get(name) is not None

    checks = [
        (given("best_of") and not 0 < p["best_of"] <= MAX_BEST_OF,
         f"`best_of` must be > 0 and <= {MAX_BEST_OF}. Given: {p.get('best_of')}"),
        (given("best_of") and p["best_of"] > 1 and stream, "`best_of` != 1 is not allowed for this endpoint"),
        (given("temperature") and p["temperature"] <= 0, "`temperature` must be strictly positive"),
        (given("repetition_penalty") and p["repetition_penalty"] <= 0, "`repetition_penalty` must be strictly positive"),
        (given("frequency_penalty") and not -2 <= p["frequency_penalty"] <= 2,
         "`frequency_penalty` must be >= -2.0 and <= 2.0"),
        (given("top_p") and not 0 < p["top_p"] < 1, "`top_p` must be > 0.0 and < 1.0"),
        (given("typical_p") and not 0 < p["typical_p"] < 1, "`typical_p` must be > 0.0 and < 1.0"),
        (given("top_k") and p["top_k"] <= 0, "`top_k` must be strictly positive"),
        (p.get("max_new_tokens") == 0, "`max_new_tokens` must be strictly positive"),
        (len(p.get("stop") or []) > MAX_STOP_SEQUENCES,
         f"`stop` supports up to {MAX_STOP_SEQUENCES} stop sequences. Given: {len(p.get('stop') or [])}"),
        (given("top_n_tokens") and p["top_n_tokens"] > MAX_TOP_N_TOKENS,
         f"`top_n_tokens` must be >= 0 and <= {MAX_TOP_N_TOKENS}. Given: {p.get('top_n_tokens')}"),
        (bool(p.get("decoder_input_details")) and stream,
         "`decoder_input_details` == true is not supported when streaming tokens"),
        (prompt_tokens == 0, "`inputs` cannot be empty"),
        (prompt_tokens > MAX_INPUT_TOKENS,
         f"`inputs` must have less than {MAX_INPUT_TOKENS} tokens. Given: {prompt_tokens}"),
        (prompt_tokens + new_tokens(p, prompt_tokens) > MAX_TOTAL_TOKENS,
         (f"`inputs` tokens + `max_new_tokens` must be <= {MAX_TOTAL_TOKENS}. "
         f"Given: {prompt_tokens} `inputs` tokens and {new_tokens(p, prompt_tokens)} `max_new_tokens`")),
    ]
    return next((message for failed, message in checks if failed), None)


def new_tokens(p: dict[str, Any], prompt_tokens: int) -> int:
    """§2.3: a null ``max_new_tokens`` means everything left of ``max_total_tokens``."""
    value = p.get("max_new_tokens")
    return max(MAX_TOTAL_TOKENS - prompt_tokens, 0) if value is None else value


def sampling_seed(p: dict[str, Any], defaulted: bool) -> int | None:
    """§2.2: sampling (and so a seed) when ``do_sample`` or any warper is set; defaults sample."""
    sampling = defaulted or p.get("do_sample") or any(
        p.get(k) is not None for k in ("top_k", "top_p", "typical_p")) or p.get("temperature") not in (None, 1.0)
    return (p.get("seed") if p.get("seed") is not None else 1177) if sampling else None


def finish(gen: Generation) -> str:
    return "stop_sequence" if gen.finish_reason == "stop" else "length"


def token_object(gen: Generation, i: int) -> dict[str, Any]:
    token_id, text = gen.tokens[i]
    return {"id": token_id, "text": text, "logprob": -0.5, "special": False}


def generate_body(b: Behaviour, body: dict[str, Any], gen: Generation, seed: int | None) -> dict[str, Any]:
    """§2.4; ``details`` only with ``details``/``decoder_input_details`` (and ``report_usage``)."""
    p = body.get("parameters") or {}
    prefix = body["inputs"] if p.get("return_full_text") else ""
    result: dict[str, Any] = {"generated_text": prefix + gen.text}
    if (p.get("details") or p.get("decoder_input_details")) and b.report_usage:
        result["details"] = {"finish_reason": finish(gen), "generated_tokens": gen.completion_tokens, "seed": seed,
                             "prefill": [], "tokens": [token_object(gen, i) for i in range(len(gen.tokens))]}
    return result


def timing_headers(b: Behaviour, body: dict[str, Any], gen: Generation) -> dict[str, str]:
    """§2.4 response headers; the token counts are left out when ``report_usage`` is off."""
    headers = {"x-compute-type": "gpu+optimized", "x-compute-time": "0.001", "x-compute-characters":
               str(len(body["inputs"])), "x-total-time": "1", "x-validation-time": "0",
               "x-queue-time": str(round(b.first_byte_delay * 1000)),  # the delay stands for time queued
               "x-inference-time": "1", "x-time-per-token": "0"}
    if b.report_usage:
        headers |= {"x-prompt-tokens": str(gen.prompt_tokens), "x-generated-tokens": str(gen.completion_tokens)}
    return headers


def event(value: Any) -> bytes:
    """§2.5: ``data:`` with no space after the colon."""
    return b"data:" + dumps(value).encode() + b"\n\n"


def generate_wire(b: Behaviour, body: dict[str, Any], gen: Generation, seed: int | None) -> Wire:
    """§2.5 events; the last token's event carries ``generated_text`` (and ``details``). With no token
    at all (a stop string hit at once) one special empty token ends the stream."""
    p, total = body.get("parameters") or {}, len(gen.tokens)
    details = {"finish_reason": finish(gen), "generated_tokens": total, "seed": seed,
               "input_length": gen.prompt_tokens} if p.get("details") and b.report_usage else None
    full = (body["inputs"] if p.get("return_full_text") else "") + gen.text

    def token(i: int) -> bytes:
        last = i == total - 1
        return event({"index": i + 1, "token": token_object(gen, i), "generated_text": full if last else None,
                      "details": details if last else None})

    def end() -> bytes:
        empty = {"id": 0, "text": "", "logprob": 0.0, "special": True}
        return event({"index": 1, "token": empty, "generated_text": full, "details": details}) if total == 0 else b""

    def error(message: str) -> bytes:
        return event({"error": message, "error_type": "generation"})

    return Wire(token, end, error, b'data:{"index":1,"token":{"id":\n\n')


def generation(b: Behaviour, stream: bool):
    """``/generate`` or ``/generate_stream``: failure, parsing, validation, then the answer."""
    async def endpoint(request: Request) -> Reply:
        body, rejected = await parse(request, b, "inputs")
        status = b.take_failure()
        if status is not None:
            return error_reply(b, status, b.fail_message)
        if rejected:
            return rejected
        defaulted = body.get("parameters") is None
        p = body.get("parameters") or {}
        prompt_tokens = FakeEngine.prompt_tokens(str(body["inputs"]))
        message = invalid(p, prompt_tokens, stream)
        if message:
            return error_reply(b, 422, f"Input validation error: {message}")
        gen = FakeEngine.run(str(body["inputs"]), new_tokens(p, prompt_tokens), p.get("stop"))
        seed = sampling_seed(p, defaulted)
        if stream:
            return Reply(b, 200, STREAM_HEADERS, drive(b, len(gen.tokens), generate_wire(b, body, gen, seed)))
        return whole(b, generate_body(b, body, gen, seed), timing_headers(b, body, gen), 424)

    return endpoint


def whole(b: Behaviour, value: dict[str, Any], headers: dict[str, str], fail_status: int) -> Reply:
    """A non-streamed answer, or the fault the Behaviour asks for."""
    fault = b.body_fault()
    if fault == "fail":
        return error_reply(b, fail_status, b.fail_message)
    if fault == "drop":
        return dropped_reply(b, value)
    if fault == "malformed":
        return text_reply(b, '{"generated_text":', content_type="application/json")
    return json_reply(b, value, headers=headers)


def chat_params(body: dict[str, Any]) -> dict[str, Any]:
    """§2.9 → native parameters: ``temperature`` 0 means greedy, ``max_completion_tokens`` aliases
    ``max_tokens``, no ``top_k``."""
    temperature = body.get("temperature")
    return {"temperature": None if temperature == 0 else temperature, "top_p": body.get("top_p"),
            "max_new_tokens": body.get("max_completion_tokens", body.get("max_tokens")),
            "stop": [body["stop"]] if isinstance(body.get("stop"), str) else body.get("stop"),
            "seed": body.get("seed")}


def chat(b: Behaviour):
    """§2.9 Messages API; a mid-stream error is ``{"error": {"message", "http_status_code": 422}}``."""
    async def endpoint(request: Request) -> Reply:
        body, rejected = await parse(request, b, "messages")
        status = b.take_failure()
        if status is not None:
            return error_reply(b, status, b.fail_message)
        if rejected:
            return rejected
        p, prompt_tokens = chat_params(body), FakeEngine.prompt_tokens(body["messages"])
        message = invalid(p, prompt_tokens, bool(body.get("stream")))
        if message:
            return error_reply(b, 422, f"Input validation error: {message}")
        gen = FakeEngine.run(body["messages"], new_tokens(p, prompt_tokens), p["stop"])
        style = Style(chat=True, model=b.models[0], tgi=True)
        if not body.get("stream"):
            return whole(b, full_body(style, gen, b.report_usage), {}, 424)
        include_usage = bool((body.get("stream_options") or {}).get("include_usage")) and b.report_usage
        error = lambda m: style.event({"error": {"message": m, "http_status_code": 422}})
        wire = stream_wire(style, gen, include_usage, error, b'data:{"object":\n\n')
        return Reply(b, 200, STREAM_HEADERS, drive(b, len(gen.tokens), wire))

    return endpoint


def info(b: Behaviour) -> dict[str, Any]:
    """§2.7 ``/info``."""
    return {"model_id": b.models[0], "model_sha": None, "model_pipeline_tag": "text-generation",
            "max_concurrent_requests": 128, "max_best_of": MAX_BEST_OF, "max_stop_sequences": MAX_STOP_SEQUENCES,
            "max_input_tokens": MAX_INPUT_TOKENS, "max_total_tokens": MAX_TOTAL_TOKENS, "validation_workers": 2,
            "max_client_batch_size": 4, "router": "text-generation-router", "version": "3.3.6", "sha": None,
            "docker_label": None}


def make_app(b: Behaviour) -> Starlette:
    async def get_info(_: Request) -> Reply:
        return json_reply(b, info(b))

    async def health(_: Request) -> Reply:
        return text_reply(b, "") if b.healthy else error_reply(b, 503, "unhealthy", "healthcheck")

    async def models(_: Request) -> Reply:
        cards = [{"id": b.models[0], "object": "model", "created": 0, "owned_by": b.models[0]}]
        return json_reply(b, {"object": "list", "data": cards})

    async def metrics(_: Request) -> Reply:
        text = (f"# TYPE tgi_queue_size gauge\ntgi_queue_size {b.waiting}\n"
                f"# TYPE tgi_batch_current_size gauge\ntgi_batch_current_size {b.running}\n")
        return text_reply(b, text, content_type="text/plain; charset=utf-8")

    return Starlette(routes=[
        Route("/generate", generation(b, stream=False), methods=["POST"]),
        Route("/generate_stream", generation(b, stream=True), methods=["POST"]),
        Route("/v1/chat/completions", chat(b), methods=["POST"]),
        Route("/info", get_info), Route("/health", health), Route("/ping", health),
        Route("/v1/models", models), Route("/metrics", metrics),
    ])

