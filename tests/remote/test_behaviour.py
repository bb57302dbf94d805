"""One behavioural suite for every remote protocol, run against the protocol-faithful fake servers:
vLLM, TGI (native and Messages API), trtllm-serve and Triton's generate extension.

Each case drives the adapter as the gateway does (``backend.stream(GenerationRequest)``) and checks
what a user would see: the streamed text, the usage, the error class and message, deadlines, and
that the backend notices a client that went away.
"""

from __future__ import annotations

import asyncio
import gc
import sys
import time
from contextlib import aclosing

import pytest

from core.base import Chunk, Done, GenerationRequest
from core.errors import (BackendError, BackendOverloaded, BackendProtocolError, BackendTimeout,
                                  BackendUnavailable, InvalidRequest)
from adapters.remote.base import RemoteSettings, Timeouts
from adapters.remote.registry import create_remote
from fakes import FakeEngine, start_server

# (adapter type, fake server, mode); the Messages API mode is asked chats, the others prompts.
CASES = {"vllm": ("vllm", "vllm", None), "tgi": ("tgi", "tgi", None), "tgi-messages": ("tgi", "tgi", "messages"),
         "trtllm": ("trtllm", "trtllm", None), "triton": ("triton", "triton", None)}
PROMPT = "the quick brown fox"
CHAT = [{"role": "user", "content": "the quick brown fox"}]
# Each server's own status for "your request is wrong" and for "I failed".
BAD_REQUEST = {"vllm": 400, "tgi": 422, "trtllm": 400, "triton": 400}
FAILED = {"vllm": 500, "tgi": 424, "trtllm": 500, "triton": 500}


@pytest.fixture(scope="module", params=list(CASES))
def case(request):
    kind, server_kind, mode = CASES[request.param]
    with start_server(server_kind) as server:
        yield request.param, kind, mode, server


@pytest.fixture
def remote(case):
    """``remote(**settings)`` -> adapter on the case's fake server, whose behaviour is reset."""
    name, kind, mode, server = case
    server.behaviour.reset()

    def make(**overrides):
        settings = dict(name="pub", type=kind, base_url=server.url, model=server.behaviour.models[0], mode=mode)
        return create_remote(RemoteSettings(**{**settings, **overrides}))
    make.server, make.name = server, name
    return make


def request_for(name: str, **kw) -> GenerationRequest:
    options = {"num_predict": 6, "temperature": 0, **kw.pop("options", {})}
    if name == "tgi-messages":
        return GenerationRequest(model="pub", messages=CHAT, options=options, **kw)
    return GenerationRequest(model="pub", prompt=PROMPT, options=options, **kw)


def expected(name: str, max_tokens: int = 6) -> tuple[str, int]:
    source = CHAT if name == "tgi-messages" else PROMPT
    return FakeEngine.expected_text(source, max_tokens), FakeEngine.prompt_tokens(source)


def collect(backend, request, *, stop_after: int | None = None) -> tuple[list[Chunk], Done | None]:
    """Every event; with ``stop_after``, cancel the request after that many chunks (the client went
    away) and read on to the final record."""
    async def run():
        chunks, done = [], None
        stream = backend.stream(request)
        try:
            async for event in stream:
                if isinstance(event, Done):
                    done = event
                elif request.cancel.cancelled:
                    raise AssertionError("a chunk arrived after the request was cancelled")
                else:
                    chunks.append(event)
                    if stop_after is not None and len(chunks) >= stop_after:
                        request.cancel.cancel()
        finally:
            await stream.aclose()
            await backend.aclose()
        return chunks, done
    return asyncio.run(run())


def failure(backend, request) -> tuple[BackendError, list[Chunk]]:
    seen: list[Chunk] = []

    async def run():
        try:
            async for event in backend.stream(request):
                if isinstance(event, Chunk):
                    seen.append(event)
        finally:
            await backend.aclose()
    with pytest.raises(BackendError) as caught:
        asyncio.run(run())
    return caught.value, seen


def test_streamed_text_and_usage_match_the_backend(remote):
    chunks, done = collect(remote(), request_for(remote.name))
    text, prompt_tokens = expected(remote.name)
    assert "".join(c.text for c in chunks) == text
    assert (done.usage.input_tokens, done.usage.output_tokens, done.usage.source) == (prompt_tokens, 6, "backend")
    assert done.finish_reason == "length"
    assert done.timings.ttft is not None and len(done.timings.token_times) == len(chunks)


@pytest.mark.parametrize("stream", [True, False])
def test_every_async_generator_is_closed_not_left_to_the_garbage_collector(remote, stream):
    """An async generator left suspended (a loop that returns at ``[DONE]``) is closed by the event
    loop's finalizer hook: a thread-safe wake-up (an eventfd write and read) and one more task for
    every request on the gateway's loop. The adapter closes each one it opens (httpx's own, under an
    injected httpx client, are httpx's business)."""
    finalized: list[str] = []

    async def run():
        firstiter, finalizer = sys.get_asyncgen_hooks()

        def counting(agen):
            if not agen.ag_code.co_filename.startswith(sys.modules["httpx"].__path__[0]):
                finalized.append(agen.ag_code.co_qualname)
            return finalizer(agen)
        sys.set_asyncgen_hooks(firstiter, counting)  # generators first iterated from here on report here
        try:
            backend = remote()
            for _ in range(3):
                async with aclosing(backend.stream(request_for(remote.name, stream=stream))) as events:
                    assert isinstance([e async for e in events][-1], Done)
            await backend.aclose()
            gc.collect()
        finally:
            sys.set_asyncgen_hooks(firstiter, finalizer)
    asyncio.run(run())
    assert finalized == []


def test_one_reply_when_the_client_does_not_stream(remote):
    chunks, done = collect(remote(), request_for(remote.name, stream=False))
    assert "".join(c.text for c in chunks) == expected(remote.name)[0]
    assert done.usage.output_tokens == 6


def test_usage_is_estimated_when_the_backend_reports_none(remote):
    remote.server.behaviour.report_usage = False
    chunks, done = collect(remote(), request_for(remote.name))
    assert "".join(c.text for c in chunks) == expected(remote.name)[0]
    assert done.usage.source == "estimated"
    assert done.usage.output_tokens > 0 and done.usage.input_tokens > 0


def test_a_bad_request_passes_the_backends_words_through(remote):
    remote.server.behaviour.fail_status = BAD_REQUEST[remote.name.split("-")[0]]
    remote.server.behaviour.fail_message = "temperature must be strictly positive"
    error, _ = failure(remote(), request_for(remote.name))
    assert isinstance(error, InvalidRequest) and error.status == 400
    assert "temperature must be strictly positive" in error.message


def test_overload_is_429_with_the_backends_retry_after(remote):
    remote.server.behaviour.fail_status, remote.server.behaviour.retry_after = 429, "3"
    error, _ = failure(remote(), request_for(remote.name))
    assert isinstance(error, BackendOverloaded) and error.status == 429 and error.retry_after == 3.0


def test_a_backend_failure_names_the_backend(remote):
    remote.server.behaviour.fail_status = FAILED[remote.name.split("-")[0]]
    error, _ = failure(remote(), request_for(remote.name))
    assert isinstance(error, BackendUnavailable) and error.status == 502
    assert "backend 'pub'" in error.message


def test_mid_stream_failure_keeps_the_tokens_sent(remote):
    remote.server.behaviour.fail_after = 3
    error, seen = failure(remote(), request_for(remote.name))
    assert len(seen) == 3
    # TGI's chat stream tags its error events with status 422, so that one reads as a bad request.
    assert isinstance(error, (BackendUnavailable, BackendProtocolError, InvalidRequest))
    assert error.partial.finish_reason == "error" and error.partial.usage.output_tokens > 0


def test_a_dropped_connection_is_unavailable(remote):
    remote.server.behaviour.drop_after = 2
    error, seen = failure(remote(), request_for(remote.name))
    assert len(seen) == 2 and isinstance(error, (BackendUnavailable, BackendProtocolError))
    assert error.partial.usage.output_tokens > 0


def test_a_malformed_event_is_a_protocol_error(remote):
    remote.server.behaviour.malformed_after = 2
    error, _ = failure(remote(), request_for(remote.name))
    assert isinstance(error, BackendProtocolError) and "not JSON" in error.message


def test_first_byte_timeout(remote):
    remote.server.behaviour.first_byte_delay = 3.0
    t0 = time.perf_counter()
    error, _ = failure(remote(timeouts=Timeouts(first_byte=0.3)), request_for(remote.name))
    assert isinstance(error, BackendTimeout) and "first_byte" in error.message
    assert time.perf_counter() - t0 < 2.0
    assert remote.server.behaviour.wait_for(lambda b: b.disconnects == 1, timeout=5.0)  # we hung up on it


def test_total_timeout(remote):
    remote.server.behaviour.token_delay = 0.2
    error, seen = failure(remote(timeouts=Timeouts(total=0.5)), request_for(remote.name, options={"num_predict": 30}))
    assert isinstance(error, BackendTimeout) and "total" in error.message and 0 < len(seen) < 30
    assert remote.server.behaviour.wait_for(lambda b: b.disconnects == 1, timeout=5.0)


def test_read_timeout(remote):
    remote.server.behaviour.token_delay = 1.5
    error, _ = failure(remote(timeouts=Timeouts(read=0.3)), request_for(remote.name))
    assert isinstance(error, BackendTimeout)
    assert remote.server.behaviour.wait_for(lambda b: b.disconnects == 1, timeout=5.0)


def test_client_gone_reaches_the_backend_and_usage_is_reported(remote):
    remote.server.behaviour.token_delay = 0.05
    t0 = time.perf_counter()
    chunks, done = collect(remote(), request_for(remote.name, options={"num_predict": 50}), stop_after=2)
    assert len(chunks) == 2 and time.perf_counter() - t0 < 0.05 * 50 / 2  # stopped well before the end
    assert remote.server.behaviour.wait_for(lambda b: b.disconnects == 1, timeout=3.0)
    assert done.finish_reason == "cancelled" and done.usage.output_tokens > 0


def test_max_inflight_queues_then_refuses(remote):
    remote.server.behaviour.token_delay = 0.1
    backend = remote(max_inflight=1, timeouts=Timeouts(first_byte=0.4))

    async def one():
        return [e async for e in backend.stream(request_for(remote.name, options={"num_predict": 10}))]

    async def run():
        try:
            return await asyncio.gather(one(), one(), return_exceptions=True)
        finally:
            await backend.aclose()
    results = asyncio.run(run())
    assert sum(isinstance(r, list) for r in results) == 1
    [refused] = [r for r in results if isinstance(r, BaseException)]
    assert isinstance(refused, BackendOverloaded) and "max_inflight" in refused.message


def test_health_and_models(remote):
    async def run():
        backend = remote()
        try:
            return await backend.health(), await backend.models()
        finally:
            await backend.aclose()
    health, models = asyncio.run(run())
    assert health.ok and health.latency_ms is not None
    assert remote.server.behaviour.models[0] in models


def test_unreachable_backend():
    from fakes.live import free_port

    backend = create_remote(RemoteSettings(name="pub", type="vllm", base_url=f"http://127.0.0.1:{free_port()}",
                                           model="m"))
    error, _ = failure(backend, request_for("vllm"))
    assert isinstance(error, BackendUnavailable) and "unreachable" in error.message


@pytest.mark.parametrize("kind", ["vllm", "trtllm"])
def test_health_carries_the_schedulers_load(kind):
    """vLLM's Prometheus gauges and trtllm-serve's JSON iteration stats, as one set of keys for routing."""
    with start_server(kind) as server:
        server.behaviour.running, server.behaviour.waiting, server.behaviour.kv_usage = 2, 3, 0.25
        backend = create_remote(RemoteSettings(name="pub", type=kind, base_url=server.url,
                                               model=server.behaviour.models[0]))

        async def run():
            try:
                return await backend.health()
            finally:
                await backend.aclose()
        health = asyncio.run(run())
    assert health.ok
    assert health.metrics["requests_running"] == 2 and health.metrics["requests_waiting"] == 3
    assert health.metrics["kv_cache_usage"] == pytest.approx(0.25, abs=0.01)
