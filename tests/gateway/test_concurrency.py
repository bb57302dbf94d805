"""Concurrent requests to one model: parallel slots, a bounded queue, and no mixed-up tokens."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from fakes.live import start_server, stop_server

WORDS = ["apple", "river", "stone", "cloud", "tiger", "maple"]


def generate(url: str, word: str, n: int = 24) -> str:
    body = {"model": "tiny", "prompt": f"{word} is a word about", "raw": True, "stream": False,
            "options": {"num_predict": n, "temperature": 0}}
    r = httpx.post(url + "/api/generate", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()["response"]


@pytest.fixture(scope="module")
def parallel_server(tiny_store, tmp_path_factory):
    srv = start_server(tmp_path_factory.mktemp("parallel"), tiny_store.root, INFER_NUM_PARALLEL="2")
    yield srv
    stop_server(srv)


def test_concurrent_answers_equal_the_answers_given_alone(parallel_server):
    """Each prompt starts with a different token, so no slot reuses another prompt's KV prefix."""
    alone = {w: generate(parallel_server.url, w) for w in WORDS}
    with ThreadPoolExecutor(len(WORDS)) as pool:  # 6 requests, 2 slots: 4 wait in the queue
        together = dict(zip(WORDS, pool.map(lambda w: generate(parallel_server.url, w), WORDS)))
    assert together == alone
    ps = httpx.get(parallel_server.url + "/api/ps").json()["models"]
    assert [m["name"] for m in ps] == ["tiny:latest"]


def test_a_full_queue_answers_503_and_the_server_recovers(tiny_store, tmp_path):
    srv = start_server(tmp_path, tiny_store.root, INFER_NUM_PARALLEL="1", INFER_MAX_QUEUE="0")
    try:
        started, release = threading.Event(), threading.Event()

        def long_request():  # holds the only slot until released, then disconnects
            body = {"model": "slow", "messages": [{"role": "user", "content": "go on forever"}],
                    "options": {"num_predict": 3000, "ignore_eos": True}}
            with httpx.stream("POST", srv.url + "/api/chat", json=body, timeout=60) as r:
                for _ in r.iter_lines():
                    started.set()
                    if release.is_set():
                        break
        worker = threading.Thread(target=long_request)
        worker.start()
        assert started.wait(30)
        r = httpx.post(srv.url + "/api/chat", timeout=30, json={
            "model": "slow", "stream": False, "messages": [{"role": "user", "content": "y"}]})
        assert r.status_code == 503 and "busy" in r.json()["error"]
        r = httpx.post(srv.url + "/v1/chat/completions", timeout=30, json={
            "model": "slow", "messages": [{"role": "user", "content": "y"}], "max_tokens": 2})
        assert r.status_code == 503 and r.json()["error"]["message"].startswith("server busy")
        release.set()
        worker.join(60)
        deadline = time.monotonic() + 10
        while True:  # the slot is freed as soon as the server sees the disconnect
            r = httpx.post(srv.url + "/api/chat", timeout=30, json={
                "model": "slow", "stream": False, "messages": [{"role": "user", "content": "z"}],
                "options": {"num_predict": 2}})
            if r.status_code != 503 or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert r.status_code == 200 and r.json()["eval_count"] <= 2
    finally:
        stop_server(srv)
