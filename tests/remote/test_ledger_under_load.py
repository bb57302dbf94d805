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

from tests.gateway.conftest import stop_server
from tests.remote.servers import start_server as start_fake
from tests.remote.servers.behaviour import Behaviour


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


def test_500_concurrent_streams_get_one_row_each(fake_vllm, gateway_for):
    server = gateway_for([{"name": "fast", "type": "vllm", "base_url": fake_vllm.url,
                           "model": fake_vllm.behaviour.models[0], "max_inflight": 500}])
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
            await asyncio.sleep(0.3)
            server.process.send_signal(signal.SIGTERM)
            return await asyncio.gather(*tasks, return_exceptions=True)
    t0 = time.monotonic()
    asyncio.run(run())
    server.process.wait(timeout=30)
    assert time.monotonic() - t0 < 30
    rows = _rows(server.db_url)
    assert len(answered) > 0
    assert len(rows) == len(answered)
