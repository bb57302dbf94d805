"""A client that goes away mid-stream: generation stops, the slot is freed, one ledger row remains."""

from __future__ import annotations

import json
import time

import httpx
import pytest

from ledger.db import open_db
from ledger.usage import recent
from fakes.live import start_server, stop_server


@pytest.fixture(scope="module")
def server(tiny_store, tmp_path_factory):
    srv = start_server(tmp_path_factory.mktemp("disconnect"), tiny_store.root, INFER_NUM_PARALLEL="1")
    yield srv
    stop_server(srv)


def _rows(server, route: str, timeout: float = 15.0):
    """The ledger rows of ``route``, once at least one is there (writes are asynchronous)."""
    engine = open_db(server.db_url)
    try:
        deadline = time.monotonic() + timeout
        while True:
            rows = [r for r in recent(engine, limit=100) if r.route == route]
            if rows or time.monotonic() > deadline:
                return rows
            time.sleep(0.1)
    finally:
        engine.dispose()


def _abandon(url: str, path: str, body: dict, events: int) -> None:
    with httpx.Client(timeout=30) as client, client.stream("POST", url + path, json=body) as r:
        assert r.status_code == 200
        seen = 0
        for line in r.iter_lines():
            if line.strip():
                seen += 1
            if seen >= events:
                break  # leaving the block closes the connection mid-stream


@pytest.mark.parametrize("path,body", [
    ("/v1/chat/completions", {"model": "slow", "stream": True, "max_tokens": 3000, "seed": 1, "ignore_eos": True,
                              "messages": [{"role": "user", "content": "go on forever"}]}),
    ("/api/chat", {"model": "slow", "options": {"num_predict": 3000, "seed": 1, "ignore_eos": True},
                   "messages": [{"role": "user", "content": "go on forever"}]}),
])
def test_disconnect_frees_the_slot_and_writes_one_cancelled_row(server, path, body):
    _abandon(server.url, path, body, events=3)
    rows = _rows(server, path)
    time.sleep(0.5)  # a second row, if one were (wrongly) written, would land by now
    rows = _rows(server, path)
    assert len(rows) == 1, [(r.route, r.status) for r in rows]
    row = rows[0]
    assert (row.route, row.status, row.finish_reason, row.stream) == (path, "cancelled", "cancelled", True)
    assert 0 < row.output_tokens < 3000 and row.input_tokens > 0
    # With one slot, a stuck slot would block this request; it must complete promptly.
    t0 = time.monotonic()
    r = httpx.post(server.url + "/api/generate", timeout=30,
                   json={"model": "tiny", "prompt": "hi", "stream": False, "options": {"num_predict": 4}})
    assert r.status_code == 200 and r.json()["done"] is True
    assert time.monotonic() - t0 < 10
    metrics = httpx.get(server.url + "/metrics").text
    assert 'infer_requests_in_flight{model="slow"} 0.0' in metrics
    assert (f'infer_requests_total{{backend="llamacpp",endpoint="{path}",error_type="",finish_reason="cancelled",'
            f'model="slow",route="",status="cancelled"}} 1.0') in metrics


def test_server_survives_many_abandoned_streams(server):
    body = {"model": "slow", "options": {"num_predict": 3000, "ignore_eos": True}, "messages": [{"role": "user", "content": "x"}]}
    for _ in range(5):
        _abandon(server.url, "/api/chat", body, events=1)
    r = httpx.post(server.url + "/api/chat", timeout=30, json={**body, "stream": False, "options": {"num_predict": 3}})
    assert r.status_code == 200
    assert json.loads(r.text)["eval_count"] <= 3


def test_a_native_runner_stops_the_request_of_a_client_that_left(server):
    """The native runner's engine core aborts the request (``Cancel``) and its cancelled record, counting what it
    generated, ends the stream the response still reads: one row, and the runner holds nothing more."""
    body = {"model": "slow", "options": {"engine": "native", "num_predict": 3000, "ignore_eos": True},
            "messages": [{"role": "user", "content": "go on forever"}]}
    _abandon(server.url, "/api/chat", body, events=3)
    deadline = time.monotonic() + 15
    while not (rows := [r for r in _rows(server, "/api/chat") if r.backend == "native"]) and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(0.5)  # a second row, if one were (wrongly) written, would land by now
    rows = [r for r in _rows(server, "/api/chat") if r.backend == "native"]
    assert len(rows) == 1, [(r.status, r.output_tokens) for r in rows]
    row = rows[0]
    assert (row.status, row.finish_reason, row.stream) == ("cancelled", "cancelled", True)
    assert 3 <= row.output_tokens < 3000 and row.input_tokens > 0
    runner = next(m["runner"] for m in httpx.get(server.url + "/api/ps").json()["models"]
                  if m["runner"]["engine"] == "native")
    assert runner["requests"] == 0
