"""The queueing fake backend: measured TTFT/TPOT follow its model, FIFO order, the batch limit,
prefill blocking decode, the metrics page, the stall and failure faults, and the subprocess form.

Timings are client-side as vLLM's benchmark takes them (TTFT = first content chunk, TPOT = (last −
first) / (n − 1)); tolerances allow for a shared, busy 2-core machine.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from fakes.live import free_port

from fakes.queueing import QueueModel, start_queueing

ROOT = Path(__file__).resolve().parents[2]
MS = 1e-3


def chat(words: int, max_tokens: int, stream: bool = True) -> dict:
    """A chat whose rendered prompt ("user: w w …\\n") is ``words + 1`` tokens."""
    body = {"model": "queueing", "messages": [{"role": "user", "content": " ".join(["abc"] * words)}],
            "max_tokens": max_tokens, "stream": stream}
    if stream:
        body["stream_options"] = {"include_usage": True}
    return body


async def measure(client: httpx.AsyncClient, url: str, body: dict, delay: float = 0.0) -> dict:
    """Send after ``delay`` s; client-side times of every content chunk, and the usage."""
    await asyncio.sleep(delay)
    start, times, usage = time.monotonic(), [], None
    async with client.stream("POST", url + "/v1/chat/completions", json=body) as resp:
        assert resp.status_code == 200
        async for line in resp.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if event["choices"] and event["choices"][0]["delta"].get("content"):
                times.append(time.monotonic())
            usage = event.get("usage") or usage
    ttft = times[0] - start
    tpot = (times[-1] - times[0]) / (len(times) - 1) if len(times) > 1 else 0.0
    gaps = [b - a for a, b in zip(times, times[1:])]
    return {"start": start, "ttft": ttft, "tpot": tpot, "gaps": gaps, "n": len(times), "usage": usage,
            "times": times}


async def run_all(url: str, *calls: tuple[dict, float]) -> list[dict]:
    async with httpx.AsyncClient(timeout=30) as client:
        await measure(client, url, chat(1, 1))  # warm the connection pool and the engine task
        return await asyncio.gather(*(measure(client, url, body, delay) for body, delay in calls))


def near(measured: float, expected: float, rel: float = 0.1, abs_s: float = 0.015) -> bool:
    return abs(measured - expected) <= rel * expected + abs_s


def test_a_lone_request_has_prefill_ttft_and_tpot_of_one():
    model = QueueModel(batch_limit=4, prefill_tok_s=2000, tpot_base_ms=20, tpot_slope_ms=10)
    with start_queueing(model) as server:
        (one,) = asyncio.run(run_all(server.url, (chat(199, 21), 0.0)))
    assert one["usage"] == {"prompt_tokens": 200, "completion_tokens": 21, "total_tokens": 221}
    assert one["n"] == 21
    assert near(one["ttft"], 200 / 2000), one["ttft"]            # 100 ms of prefill
    assert near(one["tpot"], model.tpot(1), abs_s=0.004), one["tpot"]  # 30 ms


def test_tpot_grows_with_the_batch():
    model = QueueModel(batch_limit=8, prefill_tok_s=1e6, tpot_base_ms=10, tpot_slope_ms=5)
    with start_queueing(model) as server:
        results = asyncio.run(run_all(server.url, *[(chat(3, 16), 0.0)] * 6))
    for r in results:
        assert near(r["tpot"], model.tpot(6), abs_s=0.004), (r["tpot"], model.tpot(6))  # 40 ms, not tpot(1) = 15
    assert max(rec.batch_at_admit for rec in server.engine.records) == 6


def test_batch_limit_and_fifo_order():
    """Batch of 2, four requests 30 ms apart: the 3rd enters when the 1st leaves, the 4th after the 2nd."""
    model = QueueModel(batch_limit=2, prefill_tok_s=1e6, tpot_base_ms=20, tpot_slope_ms=0)
    with start_queueing(model) as server:
        calls = [(chat(3, 10), 0.03 * i) for i in range(4)]
        results = asyncio.run(run_all(server.url, *calls))
        records = sorted((r for r in server.engine.records if r.index > 0), key=lambda r: r.index)  # 0: warm-up
    assert [r.batch_at_admit for r in records] == [1, 2, 2, 2]
    assert [r.admitted for r in records] == sorted(r.admitted for r in records)
    assert records[2].admitted >= records[0].finished and records[3].admitted >= records[1].finished
    service = 9 * model.tpot(2)  # the 1st token comes with the prefill, nine decode steps follow
    assert near(results[2]["ttft"], service - 0.06, abs_s=0.03), results[2]["ttft"]  # waited for the 1st to finish
    # the step time each stream saw: the median gap, so one scheduler stall of a busy test machine is not a step
    steps = [statistics.median(b - a for a, b in zip(r["times"], r["times"][1:])) for r in results]
    assert all(near(step, model.tpot(2), abs_s=0.004) for step in steps), steps


def test_a_prefill_blocks_the_running_decode():
    """A 400-token prompt arriving mid-stream stalls the running sequence for its 200 ms prefill."""
    model = QueueModel(batch_limit=4, prefill_tok_s=2000, tpot_base_ms=20, tpot_slope_ms=0)
    with start_queueing(model) as server:
        long, late = asyncio.run(run_all(server.url, (chat(3, 30), 0.0), (chat(399, 5), 0.2)))
    around = next(b - a for a, b in zip(long["times"], long["times"][1:]) if a <= late["times"][0] <= b)
    assert near(around, 0.2 + model.tpot(2), abs_s=0.03), (around, late["ttft"])  # prefill, then a step of two
    assert near(late["ttft"], 0.2, abs_s=0.03), late["ttft"]  # plus at most one 20 ms step


def test_metrics_page_shows_running_waiting_and_kv():
    model = QueueModel(batch_limit=2, prefill_tok_s=1e6, tpot_base_ms=20, tpot_slope_ms=0, kv_tokens=1000)

    async def scenario(url: str) -> str:
        async with httpx.AsyncClient(timeout=30) as client:
            tasks = [asyncio.create_task(measure(client, url, chat(99, 30))) for _ in range(3)]
            await asyncio.sleep(0.25)
            page = (await client.get(url + "/metrics")).text
            await asyncio.gather(*tasks)
            return page

    with start_queueing(model) as server:
        page = asyncio.run(scenario(server.url))
        idle = httpx.get(server.url + "/metrics").text
    labels = '{engine="0",model_name="queueing"}'
    assert f"vllm:num_requests_running{labels} 2.0" in page
    assert f"vllm:num_requests_waiting{labels} 1.0" in page
    kv = float(next(line for line in page.splitlines() if line.startswith("vllm:kv_cache_usage_perc")).split()[-1])
    assert 0.2 < kv < 0.3  # two sequences of 100 prompt + ~12 generated tokens in 1000
    assert f"vllm:num_requests_running{labels} 0.0" in idle
    assert f"vllm:generation_tokens_total{labels} 90.0" in idle
    assert 'vllm:request_success_total{engine="0",finished_reason="length",model_name="queueing"} 3.0' in idle
    assert "# TYPE vllm:kv_cache_usage_perc gauge" in idle


def test_stall_fault_sends_headers_then_nothing_and_holds_no_slot():
    model = QueueModel(batch_limit=1, prefill_tok_s=1e6, stall_first_token=True, stall_times=1)
    with start_queueing(model) as server, httpx.Client(timeout=httpx.Timeout(5, read=0.3)) as client:
        with client.stream("POST", server.url + "/v1/chat/completions", json=chat(3, 4)) as resp:
            assert resp.status_code == 200
            assert resp.headers["content-type"].startswith("text/event-stream")
            with pytest.raises(httpx.ReadTimeout):
                next(resp.iter_raw())  # a timeout comes from the client, nothing from the server
        assert not model.stall_first_token  # used up
        st = time.monotonic()
        answer = client.post(server.url + "/v1/chat/completions", json=chat(3, 4, stream=False))
        assert answer.status_code == 200 and time.monotonic() - st < 1.0
        assert answer.json()["usage"]["completion_tokens"] == 4


def test_fail_status_is_vllm_shaped_with_retry_after():
    model = QueueModel(fail_status=429, fail_times=1, retry_after="2", fail_message="busy")
    with start_queueing(model) as server:
        refused = httpx.post(server.url + "/v1/chat/completions", json=chat(3, 4, stream=False))
        served = httpx.post(server.url + "/v1/chat/completions", json=chat(3, 4, stream=False))
        unknown = httpx.post(server.url + "/v1/chat/completions", json={**chat(3, 4), "model": "other"})
    assert refused.status_code == 429 and refused.headers["retry-after"] == "2"
    assert refused.json() == {"error": {"message": "busy", "type": "TooManyRequestsError", "param": None, "code": 429}}
    assert served.status_code == 200
    assert unknown.status_code == 404


def test_a_client_that_leaves_frees_its_batch_slot():
    model = QueueModel(batch_limit=1, prefill_tok_s=1e6, tpot_base_ms=20, tpot_slope_ms=0)
    with start_queueing(model) as server, httpx.Client(timeout=5) as client:
        with client.stream("POST", server.url + "/v1/chat/completions", json=chat(3, 500)) as resp:
            next(resp.iter_lines())
        st = time.monotonic()
        answer = client.post(server.url + "/v1/chat/completions", json=chat(3, 2, stream=False))
        waited = time.monotonic() - st
        aborted = [r for r in server.engine.records if r.aborted]
    assert answer.status_code == 200 and waited < 0.5  # not the 10 s the first would have taken
    assert len(aborted) == 1 and aborted[0].produced < 500


def test_runs_as_a_subprocess():
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "fakes.queueing", "--port", str(port),
                             "--batch-limit", "3", "--model", "slow-one", "--tpot-base-ms", "5"], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        url, deadline = f"http://127.0.0.1:{port}", time.monotonic() + 20
        while True:
            try:
                models = httpx.get(url + "/v1/models", timeout=1)
                break
            except httpx.TransportError:
                assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
                time.sleep(0.1)
        assert [m["id"] for m in models.json()["data"]] == ["slow-one"]
        answer = httpx.post(url + "/v1/chat/completions", json={**chat(3, 3, stream=False), "model": "slow-one"})
        assert answer.json()["choices"][0]["message"]["content"] == " echo foxtrot golf"  # 4 prompt tokens: starts at WORDS[4]
        assert httpx.get(url + "/health").status_code == 200
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_the_prefix_cache_skips_the_cached_prefill_and_reports_it():
    """A 2,000-word system prompt at 4,000 tokens/s: 0.5 s to prefill, then again only the new turn's
    words; usage's cached_tokens and the prefix-cache counters say how many were skipped."""
    system = {"role": "system", "content": " ".join(f"w{i}" for i in range(2000))}
    turn = lambda text: {"model": "queueing", "messages": [system, {"role": "user", "content": text}],  # noqa: E731
                         "max_tokens": 2, "stream": True, "stream_options": {"include_usage": True}}
    model = QueueModel(batch_limit=4, prefill_tok_s=4000, tpot_base_ms=5, tpot_slope_ms=0, prefix_cache_tokens=64_000)
    with start_queueing(model) as server:
        first, second = asyncio.run(run_all(server.url, (turn("one two"), 0.0), (turn("three four"), 0.8)))
        metrics = httpx.get(server.url + "/metrics").text
    assert first["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}
    assert second["usage"]["prompt_tokens_details"] == {"cached_tokens": 2000}  # 125 whole blocks of 16 words
    assert first["ttft"] > 0.45 and second["ttft"] < 0.2
    assert 'num_gpu_blocks="4000"' in metrics and "vllm:prefix_cache_hits_total" in metrics
