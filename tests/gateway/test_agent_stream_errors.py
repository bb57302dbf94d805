"""A backend that fails after the stream started: the Messages stream ends with Anthropic's ``error``
event, the Responses stream with ``response.failed``, and each request still gets its ledger row."""

from __future__ import annotations

import json

import httpx
import pytest
import yaml

from fakes.live import start_server, stop_server
from fakes import start_server as start_fake
from fakes.behaviour import Behaviour


@pytest.fixture(scope="module")
def gateway(tiny_store, tmp_path_factory):
    fake = start_fake("vllm", Behaviour(fail_after=2))
    tmp = tmp_path_factory.mktemp("agent-errors")
    config = tmp / "backends.yaml"
    config.write_text(yaml.safe_dump({"backends": [
        {"name": "flaky", "type": "vllm", "base_url": fake.url, "model": fake.behaviour.models[0]}]}))
    server = start_server(tmp, tiny_store.root, INFER_CONFIG=str(config))
    try:
        yield server
    finally:
        stop_server(server)
        fake.stop()


def events(reply: httpx.Response) -> list[tuple[str, dict]]:
    frames = [f.split("\n", 1) for f in reply.text.split("\n\n") if f]
    return [(head.removeprefix("event: "), json.loads(data.removeprefix("data: "))) for head, data in frames]


def test_messages_stream_ends_with_an_error_event(gateway):
    body = {"model": "flaky", "max_tokens": 20, "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    reply = httpx.post(gateway.url + "/v1/messages", json=body, timeout=30)
    seen = events(reply)
    assert reply.status_code == 200 and seen[0][0] == "message_start"
    name, data = seen[-1]
    assert name == "error" and data["type"] == "error" and data["error"]["type"] == "api_error"
    assert "message_stop" not in [n for n, _ in seen]


def test_responses_stream_ends_with_response_failed(gateway):
    body = {"model": "flaky", "input": "hi", "stream": True}
    seen = events(httpx.post(gateway.url + "/v1/responses", json=body, timeout=30))
    name, data = seen[-1]
    assert name == "response.failed" and data["response"]["status"] == "failed"
    assert data["response"]["error"]["code"] == "server_error" and data["response"]["error"]["message"]
    assert [e["sequence_number"] for _, e in seen] == list(range(len(seen)))
