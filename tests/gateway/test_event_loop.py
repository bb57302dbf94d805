"""One caller never stalls the others (issue 40, finding 2), against a live ``infer serve``.

While hostile requests run (one at a time, repeated for two seconds or more, so the p99 is of at least
50 samples), a thread polls ``/health`` every 10 ms; its p99 stays under 100 ms, plus the p99 the same
poll sees with no request running (the machine's own noise: on 2 shared cores under load it alone can
pass 100 ms; ``bench/hostile.py`` reports both figures raw).
Requests over a limit (a 10 MB prompt body, 30,000 messages, 10,000 tools) are 413 at once, naming the
limit; those under them (10,000 messages to count, 512 tools for a model without tool support) are
answered, their work off the event loop. The server's memory returns within 50 MB after a 7.5 MB body.
"""

from __future__ import annotations

import json
import os
import statistics
import threading
import time

import httpx
import pytest

from fakes.live import start_server, stop_server

HEALTH_P99_MS = 100.0  # the goal; the machine's idle p99 is added (``allowed``)
CHAT = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def server(tiny_store, tmp_path_factory):
    live = start_server(tmp_path_factory.mktemp("event-loop"), tiny_store.root)
    try:
        yield live
    finally:
        stop_server(live)


def history(n: int, size: int) -> list[dict]:
    text = "word " * (size // 5)
    return [{"role": "user" if i % 2 == 0 else "assistant", "content": f"{i} {text}"} for i in range(n)]


def tools(n: int) -> list[dict]:
    return [{"type": "function", "function": {"name": f"tool_{i}", "description": "does a thing",
                                              "parameters": {"type": "object", "properties": {
                                                  "x": {"type": "string", "description": f"input {i}"}}}}}
            for i in range(n)]


def while_health_polled(url: str, send, at_least_s: float = 2.0) -> tuple[httpx.Response, list[float]]:
    """``send()``'s last answer (sent again until ``at_least_s`` passed), and the /health latencies (ms)
    polled every 10 ms meanwhile."""
    latencies: list[float] = []
    done = threading.Event()

    def poll() -> None:
        with httpx.Client(timeout=30) as client:
            while not done.is_set():
                t0 = time.perf_counter()
                assert client.get(url + "/health").status_code == 200
                latencies.append((time.perf_counter() - t0) * 1000)
                time.sleep(0.01)

    poller = threading.Thread(target=poll)
    poller.start()
    deadline = time.monotonic() + at_least_s
    try:
        answer = send()
        while time.monotonic() < deadline:
            answer = send()
    finally:
        done.set()
        poller.join()
    return answer, latencies


_idle: list[float] = []


def allowed(url: str) -> float:
    """100 ms plus the p99 of /health with nothing else running, measured once per module."""
    if not _idle:
        _idle.append(p99(while_health_polled(url, lambda: time.sleep(0.1))[1]))
    return HEALTH_P99_MS + _idle[0]


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


def post(url: str, path: str, body: dict):
    data = json.dumps(body).encode()
    return lambda: httpx.post(url + path, content=data, headers={"content-type": "application/json"}, timeout=120)


def test_a_prompt_body_over_8_mib_is_413_before_it_is_read(server):
    body = {"model": "tiny", "messages": history(30_000, 320)}  # 10.8 MB
    answer, latencies = while_health_polled(server.url, post(server.url, "/v1/messages/count_tokens", body))
    assert answer.status_code == 413 and "limit 8 MiB, INFER_MAX_PROMPT_BYTES" in answer.text, answer.text
    assert len(latencies) >= 50 and p99(latencies) <= allowed(server.url), sorted(latencies)[-5:]


@pytest.mark.parametrize("path, body, field, limit", [
    ("/v1/messages/count_tokens", {"model": "tiny", "messages": history(30_000, 10)}, "messages", 10_000),
    ("/v1/chat/completions", {"model": "tiny-go", "messages": CHAT, "tools": tools(10_000)}, "tools", 512),
    ("/api/chat", {"model": "tiny", "messages": history(10_001, 10)}, "messages", 10_000),
    ("/v1/responses", {"model": "tiny", "input": history(10_001, 10)}, "input", 10_000),
])
def test_a_body_over_a_count_limit_is_413_at_once_naming_the_limit(server, path, body, field, limit):
    answer, latencies = while_health_polled(server.url, post(server.url, path, body))
    assert answer.status_code == 413, answer.text
    assert f"'{field}'" in answer.text and f"the most one request may send is {limit}" in answer.text
    assert answer.elapsed.total_seconds() < 2.0
    assert len(latencies) >= 50 and p99(latencies) <= allowed(server.url), sorted(latencies)[-5:]


def test_counting_10000_messages_keeps_health_answering(server):
    body = {"model": "tiny", "messages": history(10_000, 320)}  # 3.6 MB
    answer, latencies = while_health_polled(server.url, post(server.url, "/v1/messages/count_tokens", body))
    assert answer.status_code == 200 and answer.json()["input_tokens"] > 10_000 * 64, answer.text
    assert len(latencies) >= 50 and p99(latencies) <= allowed(server.url), (statistics.median(latencies),
                                                                       sorted(latencies)[-5:])


def test_512_tools_for_a_model_without_tools_is_400_and_health_keeps_answering(server):
    warm = {"model": "tiny-go", "messages": CHAT, "max_tokens": 1}  # its runner started, its details read
    assert httpx.post(server.url + "/v1/chat/completions", json=warm, timeout=60).status_code == 200
    body = {"model": "tiny-go", "messages": CHAT, "tools": tools(512), "max_tokens": 2}
    answer, latencies = while_health_polled(server.url, post(server.url, "/v1/chat/completions", body))
    assert answer.status_code == 400 and "does not support tools" in answer.text, answer.text
    assert len(latencies) >= 50 and p99(latencies) <= allowed(server.url), sorted(latencies)[-5:]


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e6


def test_memory_returns_after_a_7_mb_body(server):
    small = {"model": "tiny", "messages": history(10, 320)}
    assert httpx.post(server.url + "/v1/messages/count_tokens", json=small, timeout=60).status_code == 200
    before = rss_mb(server.process.pid)
    big = {"model": "tiny", "messages": history(10_000, 700)}  # 7.4 MB
    answer = post(server.url, "/v1/messages/count_tokens", big)()
    assert answer.status_code == 200, answer.text
    time.sleep(1.0)
    assert rss_mb(server.process.pid) - before <= 50.0, (before, rss_mb(server.process.pid))


def test_counting_in_pieces_gives_the_count_of_one_encode(tiny_store):
    from frontend.prompt_ids import PIECE_CHARS, count_in_pieces
    from gguf_io.tokenizer import Tokenizer

    vocab = Tokenizer.from_gguf(str(tiny_store.root.parent / "tiny-qwen2.gguf"))
    text = "".join(f"<|im_start|>{m['role']}\n{m['content']}\n  indented {i}\n<|im_end|>\n"
                   for i, m in enumerate(history(400, 200)))
    assert len(text) > 4 * PIECE_CHARS
    assert count_in_pieces(vocab, text) == len(vocab.encode(text))
