"""``strategy: prefix`` through a live `infer serve`, in front of three queueing fakes with a prefix
cache: a conversation's turns go back to the backend that holds it, a new conversation goes where
there is room, and the ledger, `GET /infer/routes`, `infer usage` and the metrics show the cached
tokens the backends reported beside what the route expected."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import httpx
import pytest
import sqlalchemy as sa

from fakes.queueing import QueueModel, start_queueing

SYSTEM = {"role": "system", "content": " ".join(f"rule{i}" for i in range(600))}
OTHER = {"role": "system", "content": " ".join(f"law{i}" for i in range(600))}


@pytest.fixture(scope="module")
def server(gateway_for):
    fakes = [start_queueing(QueueModel(batch_limit=4, prefill_tok_s=20_000, tpot_base_ms=2, tpot_slope_ms=0,
                                       prefix_cache_tokens=50_000, model="sim")) for _ in range(3)]
    try:
        yield gateway_for([{"name": f"gpu{i}", "type": "vllm", "base_url": f.url, "model": "sim"}
                           for i, f in enumerate(fakes)],
                          routes=[{"name": "chat", "backends": ["gpu0", "gpu1", "gpu2"], "strategy": "prefix"}])
    finally:
        for fake in fakes:
            fake.stop()


def converse(http: httpx.Client, opening: str, turns: int, system: dict = SYSTEM) -> list[dict]:
    messages, usages = [system, {"role": "user", "content": opening}], []
    for turn in range(turns):
        reply = http.post("/v1/chat/completions", json={"model": "chat", "messages": messages, "max_tokens": 3})
        assert reply.status_code == 200, reply.text
        usages.append(reply.json()["usage"])
        messages += [reply.json()["choices"][0]["message"], {"role": "user", "content": f"and then {turn}?"}]
    return usages


def ledger(server) -> list:
    db = sa.create_engine(server.db_url)
    try:
        with db.connect() as conn:
            return list(conn.execute(sa.text("SELECT backend, input_tokens, cached_input_tokens, "
                                              "expected_cached_tokens FROM requests ORDER BY rowid")))
    finally:
        db.dispose()


def test_a_conversation_stays_where_its_prefix_is_cached_and_the_ledger_says_so(server):
    with httpx.Client(base_url=server.url, timeout=30) as http:
        first = converse(http, "tell me a story", 3)
        converse(http, "a different question", 1, OTHER)  # another system prompt: another backend
        converse(http, "more of the story", 1)              # the first system prompt: back where it is
        deadline = time.monotonic() + 10
        while len(rows := ledger(server)) < 5 and time.monotonic() < deadline:
            time.sleep(0.1)
        view = next(r for r in http.get("/infer/routes").json()["routes"] if r["name"] == "chat")
        metrics = http.get("/metrics").text
    assert [u["prompt_tokens_details"]["cached_tokens"] for u in first][0] == 0
    assert all(u["prompt_tokens_details"]["cached_tokens"] >= 592 for u in first[1:])  # the 600-word system prompt
    assert len({r.backend for r in rows[:3]}) == 1 and rows[3].backend != rows[0].backend == rows[4].backend
    assert [r.expected_cached_tokens > 0 for r in rows] == [False, True, True, False, True]
    assert all(0.9 * r.expected_cached_tokens <= r.cached_input_tokens <= r.input_tokens for r in rows[1:3])
    served = next(b for b in view["backends"] if b["name"] == rows[0].backend)
    assert served["prefix_blocks"] > 30 and 0.5 < served["cache_hit_ratio"] < 1
    assert served["cached_tokens_reported"] == sum(r.cached_input_tokens for r in rows if r.backend == rows[0].backend)
    assert 'infer_cached_input_tokens_total{backend="' + rows[0].backend + '"' in metrics
    usage = subprocess.run([sys.executable, "-m", "cli", "usage", "--db", server.db_url, "-n", "4"],
                           capture_output=True, text=True, timeout=60, env={**os.environ, "INFER_HOME": server.home})
    assert usage.returncode == 0 and "CACHED" in usage.stdout.splitlines()[0], usage.stdout + usage.stderr
    assert str(rows[2].cached_input_tokens) in usage.stdout


def test_the_route_learns_each_backends_kv_size_from_its_metrics(server):
    deadline = time.monotonic() + 15
    with httpx.Client(base_url=server.url, timeout=30) as http:
        while time.monotonic() < deadline:
            view = next(r for r in http.get("/infer/routes").json()["routes"] if r["name"] == "chat")
            if all(b["prefix_capacity_source"] == "reported" for b in view["backends"]):
                break
            time.sleep(0.5)
    for b in view["backends"]:  # 50,000 tokens of 'ruleN ' words (about 8 characters each) in 128-character blocks
        assert 6 < b["prefix_chars_per_token"] < 9
        assert b["prefix_capacity_blocks"] == pytest.approx(50_000 * b["prefix_chars_per_token"] / 128, rel=0.01)
