"""Exactly one ledger row per answered request: 500 concurrent streams, and SIGTERM mid-load.

``infer serve --config`` fronts a fake vLLM server; the client is httpx with 500 connections. The
rows are counted in the SQLite file after the server has exited (its shutdown flushes the writer).
"""

from __future__ import annotations

import asyncio
import signal
import time

import httpx
import pytest
import sqlalchemy as sa

from fakes.live import stop_server
from fakes import start_server as start_fake
from fakes.behaviour import Behaviour


@pytest.fixture
def fake_vllm():
    server = start_fake("vllm", Behaviour())
    try:
        yield server
    finally:
        server.stop()


def _rows(db_url: str) -> list[tuple]:
    db = sa.create_engine(db_url)
    try:
        with db.connect() as conn:
            return list(conn.execute(sa.text("SELECT status, output_tokens, stream FROM requests")))
    finally:
        db.dispose()


def _body(i: int, tokens: int) -> dict:
    return {"model": "fast", "stream": True, "max_tokens": tokens,
            "messages": [{"role": "user", "content": f"request {i}"}]}


async def _stream(client: httpx.AsyncClient, url: str, i: int, tokens: int, answered: list) -> str:
    async with client.stream("POST", url + "/v1/chat/completions", json=_body(i, tokens)) as response:
        if response.status_code == 200:
            answered.append(i)
        text = "".join([line async for line in response.aiter_lines()])
    return text


def _client(n: int) -> httpx.AsyncClient:
    limits = httpx.Limits(max_connections=n, max_keepalive_connections=n)
    return httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(120.0))


@pytest.mark.slow  # seconds of waiting on health polls or 500 streams: make test-slow (CI runs it)
def test_500_concurrent_streams_get_one_row_each(fake_vllm, gateway_for):
    """No max_inflight: no hidden connection cap either (a 64-connection pool gave 5-68 % 504s)."""
    server = gateway_for([{"name": "fast", "type": "openai", "base_url": fake_vllm.url,
                           "model": fake_vllm.behaviour.models[0]}])
    answered: list[int] = []

    async def run() -> list:
        async with _client(500) as client:
            return await asyncio.gather(*(_stream(client, server.url, i, 4, answered) for i in range(500)),
                                        return_exceptions=True)
    results = asyncio.run(run())
    failures = [r for r in results if isinstance(r, BaseException) or not r.endswith("data: [DONE]")]
    assert failures == [] and len(answered) == 500
    stop_server(server)  # SIGTERM: the writer flushes before the process exits
    rows = _rows(server.db_url)
    assert len(rows) == 500
    assert all(status == "ok" and out > 0 and stream for status, out, stream in rows)


def test_sigterm_mid_load_leaves_one_row_per_answered_request(fake_vllm, gateway_for):
    fake_vllm.behaviour.token_delay = 0.05  # each stream takes ~0.5 s
    server = gateway_for([{"name": "fast", "type": "vllm", "base_url": fake_vllm.url,
                           "model": fake_vllm.behaviour.models[0], "max_inflight": 200}])
    answered: list[int] = []

    async def run() -> list:
        async with _client(200) as client:
            tasks = [asyncio.create_task(_stream(client, server.url, i, 10, answered)) for i in range(200)]
            deadline = time.monotonic() + 30
            while len(answered) < 20 and time.monotonic() < deadline:  # mid-load, however slow the machine
                await asyncio.sleep(0.05)
            server.process.send_signal(signal.SIGTERM)
            return await asyncio.gather(*tasks, return_exceptions=True)
    t0 = time.monotonic()
    asyncio.run(run())
    server.process.wait(timeout=30)
    assert time.monotonic() - t0 < 30
    rows = _rows(server.db_url)
    assert len(answered) > 0
    assert len(rows) == len(answered)


def test_overload_waits_then_answers_429_with_retry_after_never_504(fake_vllm, gateway_for):
    fake_vllm.behaviour.token_delay = 0.1  # ~1 s a request
    server = gateway_for([{"name": "fast", "type": "vllm", "base_url": fake_vllm.url,
                           "model": fake_vllm.behaviour.models[0], "max_inflight": 2,
                           "timeout": {"first_byte": 0.5}}])

    async def one(client: httpx.AsyncClient, i: int) -> httpx.Response:
        return await client.post(server.url + "/v1/chat/completions", json=_body(i, 10))  # a stream, read whole

    async def run() -> list[httpx.Response]:
        async with _client(10) as client:
            return await asyncio.gather(*(one(client, i) for i in range(10)))
    answers = asyncio.run(run())
    statuses = sorted(r.status_code for r in answers)
    assert set(statuses) == {200, 429} and statuses.count(200) >= 2, statuses
    refused = [r for r in answers if r.status_code == 429]
    assert all(float(r.headers["retry-after"]) > 0 for r in refused)
    assert all(r.json()["error"]["type"] == "rate_limit_error" for r in refused)


def test_sigterm_ends_running_streams_with_an_error_event_and_a_row(fake_vllm, gateway_for):
    fake_vllm.behaviour.token_delay = 0.2  # 200 tokens: 40 s, far past the 5 s grace
    server = gateway_for([{"name": "fast", "type": "vllm", "base_url": fake_vllm.url,
                           "model": fake_vllm.behaviour.models[0]}])
    answered: list[int] = []

    async def run() -> list:
        async with _client(5) as client:
            tasks = [asyncio.create_task(_stream(client, server.url, i, 200, answered)) for i in range(5)]
            await asyncio.sleep(1.0)
            server.process.send_signal(signal.SIGTERM)
            return await asyncio.gather(*tasks, return_exceptions=True)
    t0 = time.monotonic()
    texts = asyncio.run(run())
    assert server.process.wait(timeout=30) in (0, -signal.SIGTERM)  # uvicorn re-raises the signal once shut down
    assert time.monotonic() - t0 < 15
    for text in texts:
        assert isinstance(text, str), text
        events = [line.removeprefix("data: ") for line in text.split("data: ") if line]
        assert text.endswith("data: [DONE]") and "shutting down" in events[-2], text[-300:]
    found = _rows(server.db_url)
    assert len(found) == 5 and all(status == "error" and out > 0 for status, out, _ in found)
