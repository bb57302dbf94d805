"""Streaming API clients that time one request the way vLLM's ``endpoint_request_func`` does.

Six wire formats: ``openai-chat`` (/v1/chat/completions), ``openai-completions`` (/v1/completions),
``ollama-chat`` (/api/chat), ``ollama-generate`` (/api/generate), ``anthropic-messages`` (/v1/messages)
and ``openai-responses`` (/v1/responses, with ``store: false``). OpenAI chat and completion requests always
stream with ``stream_options.include_usage``.

A *token chunk* is what vLLM's benchmark times (``vllm/benchmarks/lib/endpoint_request_func.py``): an
SSE event with non-empty ``choices``, whatever its text (vLLM sends one per engine step, with ``""``
while the detokenizer holds back a special token or part of a UTF-8 character, and its last token's
chunk carries the finish reason; a chat stream opens with a role chunk sent with the first token); an
NDJSON line before the ``done`` one (or a ``done`` line carrying text); a ``content_block_delta``
(text, thinking or tool input); a ``response.output_text.delta`` or ``response.reasoning_text.delta``.
The first sets TTFT, each next one adds a gap to ITL, the last ends E2EL; reasoning counts as output,
as vLLM counts it. The usage chunk (OpenAI, ``choices: []``), the ``done`` line (Ollama),
``message_delta`` (Anthropic) or ``response.completed`` (Responses) sets the token counts and never moves
a timestamp. On a server that sends the role or the finish reason in chunks of their own, apart from
any token, each such chunk counts too, as it does in vLLM's benchmark (a gap of about 0 in ITL).

The base URL may end in ``/v1`` (as OpenAI clients take it): it is dropped, never doubled.

The HTTP client is aiohttp, as in vLLM's benchmark: one ``ClientSession`` per run (``open_session``),
connections kept alive across load points, no pool limit, no total timeout. A stream is read as the
bytes arrive (``iter_any``) and split into lines here: aiohttp's own line reader refuses lines over
128 KiB, which a Responses ``response.completed`` event can exceed. What the client adds to a TTFT
beyond the server's own (``bench/client_overhead.py``, medians on this 2-core machine): 0.58 ms; the
hand-written HTTP/1.1 client it replaced added 0.29 ms, raw asyncio streams 0.05, httpx 1.29. vLLM's
benchmark pays the same aiohttp cost, so the two measure alike.

Differences from vLLM's payloads: every request is greedy (``temperature: 0``, for answers that repeat
from run to run; vLLM's benchmark sends no temperature unless given ``--temperature 0``, leaving the
server's default); and, for servers beyond vLLM, chat sends ``max_tokens`` (every OpenAI-compatible
server reads it; vLLM's ``max_completion_tokens`` is newer) and no ``ignore_eos`` (pass
``--extra-body '{"ignore_eos": true}'`` to a server that has it).
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import aiohttp

from .records import BenchRequest, RequestRecord

APIS = ("openai-chat", "openai-completions", "ollama-chat", "ollama-generate", "anthropic-messages", "openai-responses")
_PATHS = {"openai-chat": "/v1/chat/completions", "openai-completions": "/v1/completions",
          "ollama-chat": "/api/chat", "ollama-generate": "/api/generate", "anthropic-messages": "/v1/messages",
          "openai-responses": "/v1/responses"}


@dataclass(frozen=True)
class Endpoint:
    """Where and how to send: base URL, model name, wire format, extra body fields merged in."""

    base_url: str
    model: str
    api: str = "openai-chat"
    extra_body: dict | None = None
    api_key: str | None = None

    def __post_init__(self) -> None:
        if self.api not in APIS:
            raise ValueError(f"unknown --api {self.api!r}; choose one of {', '.join(APIS)}")

    @property
    def url(self) -> str:
        return server_root(self.base_url) + _PATHS[self.api]

    def payload(self, request: BenchRequest) -> dict:
        n = request.output_len
        if self.api == "openai-chat":
            body = {"model": self.model, "messages": [{"role": "user", "content": request.prompt}],
                    "max_tokens": n, "temperature": 0.0}
        elif self.api == "openai-completions":
            body = {"model": self.model, "prompt": request.prompt, "max_tokens": n, "temperature": 0.0}
        elif self.api == "anthropic-messages":
            body = {"model": self.model, "messages": [{"role": "user", "content": request.prompt}],
                    "max_tokens": n, "temperature": 0.0}
        elif self.api == "openai-responses":
            body = {"model": self.model, "input": request.prompt, "max_output_tokens": n, "temperature": 0.0,
                    "store": False}
        elif self.api == "ollama-chat":
            body = {"model": self.model, "messages": [{"role": "user", "content": request.prompt}],
                    "options": {"num_predict": n, "temperature": 0.0}}
        else:
            body = {"model": self.model, "prompt": request.prompt, "options": {"num_predict": n, "temperature": 0.0}}
        body["stream"] = True
        if self.api in ("openai-chat", "openai-completions"):
            body["stream_options"] = {"include_usage": True}
        return {**body, **(self.extra_body or {})}


def server_root(base_url: str) -> str:
    """The server's root from a base URL given with or without OpenAI's ``/v1``."""
    root = base_url.rstrip("/")
    return root[:-3] if root.endswith("/v1") else root


Counter = Callable[[str], int]
CONNECT_TIMEOUT_S = 30.0


def open_session() -> aiohttp.ClientSession:
    """The run's HTTP session (vLLM's benchmark settings; cookies ignored, as a load generator's are)."""
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=60),
                                 timeout=aiohttp.ClientTimeout(total=None, sock_connect=CONNECT_TIMEOUT_S),
                                 cookie_jar=aiohttp.DummyCookieJar())


async def iter_lines(resp: aiohttp.ClientResponse) -> AsyncIterator[str]:
    """The body's lines as they arrive, of any length."""
    buffer = b""
    async for data in resp.content.iter_any():
        buffer += data
        *lines, buffer = buffer.split(b"\n")
        for line in lines:
            yield line.rstrip(b"\r").decode("utf-8", "replace")
    if buffer:
        yield buffer.decode("utf-8", "replace")


async def send_request(session: aiohttp.ClientSession, endpoint: Endpoint, request: BenchRequest,
                       request_id: str, count_tokens: Counter | None = None) -> RequestRecord:
    """POST one streaming request and time it; failures come back as a record with ``error`` set."""
    record = RequestRecord(request_id=request_id, prompt_len=request.prompt_len,
                           expected_output_len=request.output_len)
    headers = {"content-type": "application/json", "x-request-id": request_id}
    if endpoint.api_key:
        headers["authorization"] = f"Bearer {endpoint.api_key}"
        headers["x-api-key"] = endpoint.api_key
    body = json.dumps(endpoint.payload(request)).encode()
    timer = _Timer(record)
    try:
        record.start_time = time.perf_counter()
        async with _post(session, endpoint.url, body, headers) as resp:
            if resp.status != 200:
                text = (await resp.read()).decode("utf-8", "replace")[:300]
                record.error = f"HTTP {resp.status} {resp.reason}: {text}"
                return record
            await _READERS.get(endpoint.api, _read_sse if endpoint.api.startswith("openai") else _read_ndjson)(
                resp, timer, chat=endpoint.api.endswith("chat"))
    except (aiohttp.ClientError, OSError, TimeoutError, ValueError) as exc:
        record.error = f"{type(exc).__name__}: {exc}"
        return record
    return _finish(record, timer, count_tokens)


@contextlib.asynccontextmanager
async def _post(session: aiohttp.ClientSession, url: str, body: bytes,
                headers: dict[str, str]) -> AsyncIterator[aiohttp.ClientResponse]:
    """``session.post``, sent once more when the server closed a kept-alive connection as the request
    went out (aiohttp retries only idempotent methods by itself)."""
    try:
        resp = await session.post(url, data=body, headers=headers)
    except aiohttp.ServerDisconnectedError:
        resp = await session.post(url, data=body, headers=headers)
    async with resp:
        yield resp


class _Timer:
    """Stamps token chunks onto a record; keeps the answer's text."""

    def __init__(self, record: RequestRecord) -> None:
        self.record, self.last = record, 0.0
        self.chunks = 0
        self.parts: list[str] = []

    def token(self, text: str | None) -> None:
        now = time.perf_counter()
        if self.chunks == 0:
            self.record.ttft = now - self.record.start_time
        else:
            self.record.itl.append(now - self.last)
        self.last, self.chunks = now, self.chunks + 1
        self.parts.append(text or "")

    def usage(self, prompt_tokens: object, completion_tokens: object, cached_tokens: object = None) -> None:
        if isinstance(completion_tokens, int):
            self.record.output_tokens = completion_tokens
        if isinstance(prompt_tokens, int):
            self.record.server_prompt_tokens = prompt_tokens
        if isinstance(cached_tokens, int):
            self.record.cached_tokens = cached_tokens


async def _read_sse(resp: aiohttp.ClientResponse, timer: _Timer, *, chat: bool) -> None:
    done = False
    async for line in iter_lines(resp):
        if done or not line.startswith("data:"):
            continue  # blank separators, ": ping" comments, event: lines; after [DONE], drain
        data = line[5:].strip()
        if data == "[DONE]":
            done = True
            continue
        event = json.loads(data)
        if "error" in event:
            raise ValueError(f"stream error: {json.dumps(event['error'])[:200]}")
        if choices := event.get("choices"):
            timer.token((choices[0].get("delta") or {}).get("content") if chat else choices[0].get("text"))
        if usage := event.get("usage"):
            timer.usage(usage.get("prompt_tokens"), usage.get("completion_tokens"),
                        (usage.get("prompt_tokens_details") or {}).get("cached_tokens"))


async def _read_ndjson(resp: aiohttp.ClientResponse, timer: _Timer, *, chat: bool) -> None:
    done = False
    async for line in iter_lines(resp):
        if done or not line.strip():
            continue
        event = json.loads(line)
        if "error" in event:
            raise ValueError(f"stream error: {str(event['error'])[:200]}")
        text = (event.get("message") or {}).get("content") if chat else event.get("response")
        if not event.get("done") or text:
            timer.token(text)
        if event.get("done"):
            timer.usage(event.get("prompt_eval_count"), event.get("eval_count"))
            done = True


async def _read_events(resp: aiohttp.ClientResponse, timer: _Timer, *, chat: bool) -> None:
    """Named events (Anthropic's Messages, OpenAI's Responses): tokens in deltas, usage at the end."""
    async for line in iter_lines(resp):
        if not line.startswith("data:"):
            continue
        event = json.loads(line[5:].strip())
        kind = event.get("type")
        if kind in ("error", "response.failed"):
            raise ValueError(f"stream error: {json.dumps(event)[:200]}")
        if kind == "content_block_delta":
            timer.token(event["delta"].get("text"))  # text_delta; thinking_delta, input_json_delta: no text
        elif kind in _RESPONSES_TOKEN_EVENTS:
            timer.token(event.get("delta") if kind == "response.output_text.delta" else None)
        elif kind == "message_delta":
            usage = event.get("usage") or {}
            prompt = (usage.get("input_tokens") or 0) + (usage.get("cache_read_input_tokens") or 0)
            timer.usage(prompt, usage.get("output_tokens"))
        elif kind in ("response.completed", "response.incomplete"):
            usage = event["response"].get("usage") or {}
            timer.usage(usage.get("input_tokens"), usage.get("output_tokens"))


_RESPONSES_TOKEN_EVENTS = ("response.output_text.delta", "response.reasoning_text.delta")  # vLLM's
_READERS = {"anthropic-messages": _read_events, "openai-responses": _read_events}


def _finish(record: RequestRecord, timer: _Timer, count_tokens: Counter | None) -> RequestRecord:
    if timer.chunks == 0:
        record.error = "no token chunk in the stream"
        return record
    record.generated_text = "".join(timer.parts)
    record.latency = timer.last - record.start_time
    if record.server_prompt_tokens is not None:
        record.prompt_len = record.server_prompt_tokens
    if record.output_tokens is None:
        record.usage_source = "estimated"
        record.output_tokens = count_tokens(record.generated_text) if count_tokens else timer.chunks
    record.success = True
    return record
