"""``infer serve``'s access log: uvicorn's line, once per request, written after the response left.

A live ``infer serve --log-level info`` in front of a fake vLLM server: each request gets exactly one
line in uvicorn's own format; a streamed answer's line appears when the stream ends, not when its
status line was sent (before the first byte, where uvicorn writes it, it was on every client's clock).
"""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
import time

import aiohttp
import httpx
import pytest
import yaml

from fakes.live import free_port, server_env
from fakes import start_server as start_fake

LINE = re.compile(r'INFO: +127\.0\.0\.1:\d+ - "(\w+) (\S+) HTTP/1\.1" (\d{3})')


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("access-log")
    fake = start_fake("vllm")
    fake.behaviour.token_delay = 0.05
    config = tmp / "backends.yaml"
    config.write_text(yaml.safe_dump({"backends": [{"name": "pub", "type": "vllm", "base_url": fake.url,
                                                    "model": fake.behaviour.models[0]}]}))
    port = free_port()
    log_path = tmp / "serve.log"
    env = server_env(tmp / "home", tmp / "models", port, INFER_CONFIG=str(config))
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "cli", "serve", "--log-level", "info"], env=env,
                                stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(url + "/api/version", timeout=1.0).status_code == 200:
                    break
            except httpx.TransportError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(log_path.read_text())
                time.sleep(0.1)
        yield url, log_path
    finally:
        proc.terminate()
        proc.wait(timeout=15)
        fake.stop()


def lines(log_path) -> list[tuple[str, str, int]]:
    return [(m[1], m[2], int(m[3])) for m in LINE.finditer(log_path.read_text(errors="replace"))]


def wait_for(log_path, count: int) -> list[tuple[str, str, int]]:
    deadline = time.monotonic() + 5
    while len(found := lines(log_path)) < count and time.monotonic() < deadline:
        time.sleep(0.02)
    return found


def test_one_line_per_request_in_uvicorns_format(served):
    url, log_path = served
    before = len(wait_for(log_path, 1))  # the readiness probe's
    chat = {"model": "pub", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
    assert httpx.post(url + "/v1/chat/completions", json=chat, timeout=30).status_code == 200
    assert httpx.get(url + "/api/tags?verbose=1", timeout=30).status_code == 200
    assert httpx.get(url + "/nowhere", timeout=30).status_code == 404
    assert httpx.post(url + "/v1/chat/completions", json={"model": "pub"}, timeout=30).status_code == 400
    found = wait_for(log_path, before + 4)
    time.sleep(0.2)  # nothing more comes
    assert lines(log_path)[before:] == found[before:] == [
        ("POST", "/v1/chat/completions", 200), ("GET", "/api/tags?verbose=1", 200), ("GET", "/nowhere", 404),
        ("POST", "/v1/chat/completions", 400)]


def test_a_streamed_answer_is_logged_when_it_ends(served):
    url, log_path = served
    before = len(wait_for(log_path, 1))
    chat = {"model": "pub", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8, "stream": True}
    with httpx.stream("POST", url + "/v1/chat/completions", json=chat, timeout=30) as response:
        events = response.iter_lines()
        assert next(events).startswith("data: ")  # the stream is under way (8 tokens, 50 ms apart)
        time.sleep(0.1)
        assert len(lines(log_path)) == before
        rest = list(events)
    assert "data: [DONE]" in rest
    assert wait_for(log_path, before + 1)[before:] == [("POST", "/v1/chat/completions", 200)]


def test_a_client_that_stops_at_done_keeps_its_connection(served):
    """``data: [DONE]`` and the chunked body's end leave in one write, so a client that stops reading
    at ``[DONE]`` (as the bench and many SDKs do) finds the response complete and reuses the connection:
    both requests are logged from the same client port."""
    url, log_path = served
    before = len(wait_for(log_path, 1))
    chat = {"model": "pub", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "stream": True}

    async def twice() -> None:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1)) as session:
            for _ in range(2):
                async with session.post(url + "/v1/chat/completions", json=chat) as response:
                    async for line in response.content:
                        if line.strip() == b"data: [DONE]":
                            break
    asyncio.run(twice())
    wait_for(log_path, before + 2)
    ports = re.findall(r'127\.0\.0\.1:(\d+) - "POST /v1/chat/completions', log_path.read_text())[-2:]
    assert len(ports) == 2 and ports[0] == ports[1]
