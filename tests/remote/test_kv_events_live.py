"""Precise prefix routing through a live `infer serve`: two queueing fakes publish vLLM's KV events over
ZMQ and tokenize with the same WordLevel tokenizer the gateway is given; the route matches prompts to
the blocks each backend says it holds, so it knows when one evicted a conversation (where the
approximate index would still expect it cached) and expects exactly what the backend then reports."""

from __future__ import annotations

import json
import time

import httpx
import pytest
import sqlalchemy as sa
from tokenizers import Tokenizer, models, pre_tokenizers

from fakes.engine import WORDS
from fakes.queueing import QueueModel, start_queueing
from fakes.live import free_port

SYSTEM = {"role": "system", "content": " ".join(f"rule{i}" for i in range(300))}
OTHER = {"role": "system", "content": " ".join(f"rule{i}" for i in reversed(range(300)))}
TEMPLATE = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"  # the fakes' own rendering


def word_tokenizer(root) -> str:
    words = ["[UNK]", "system:", "user:", "assistant:", *(f"rule{i}" for i in range(300)),
             *(w.strip() for w in WORDS), "tell", "me", "more", "again", "please"]
    tokenizer = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.save(str(root / "tokenizer.json"))
    (root / "tokenizer_config.json").write_text(json.dumps({"chat_template": TEMPLATE}))
    return str(root / "tokenizer.json")


@pytest.fixture(scope="module")
def server(gateway_for, tmp_path_factory):
    tokenizer = word_tokenizer(tmp_path_factory.mktemp("tokenizer"))
    ports = [free_port(), free_port()]
    fakes = [start_queueing(QueueModel(batch_limit=4, prefill_tok_s=50_000, tpot_base_ms=2, tpot_slope_ms=0,
                                       prefix_cache_tokens=capacity, model="sim", kv_events_port=port,
                                       tokenizer=tokenizer))
             for capacity, port in ((64, ports[0]), (20_000, ports[1]))]  # gpu0 keeps 4 blocks of 16 tokens
    try:
        yield gateway_for([{"name": f"gpu{i}", "type": "vllm", "base_url": f.url, "model": "sim",
                            "tokenizer": tokenizer, "kv_events": f"tcp://127.0.0.1:{port}"}
                           for i, (f, port) in enumerate(zip(fakes, ports))],
                          routes=[{"name": "chat", "backends": ["gpu0", "gpu1"], "strategy": "prefix"}])
    finally:
        for fake in fakes:
            fake.stop()


def ledger(server) -> list:
    db = sa.create_engine(server.db_url)
    try:
        with db.connect() as conn:
            return list(conn.execute(sa.text("SELECT backend, input_tokens, cached_input_tokens, "
                                              "expected_cached_tokens FROM requests ORDER BY rowid")))
    finally:
        db.dispose()


def converse(http: httpx.Client, system: dict, turns: int) -> None:
    messages = [system, {"role": "user", "content": "tell me"}]
    for follow_up in ("more", "again", "please")[:turns]:
        reply = http.post("/v1/chat/completions", json={"model": "chat", "messages": messages, "max_tokens": 3})
        assert reply.status_code == 200, reply.text
        messages += [reply.json()["choices"][0]["message"], {"role": "user", "content": follow_up}]
        time.sleep(0.3)  # the backend's events arrive


def test_the_route_follows_what_each_backend_says_it_holds(server):
    time.sleep(0.5)  # the gateway's subscriptions take effect
    with httpx.Client(base_url=server.url, timeout=30) as http:
        converse(http, SYSTEM, 3)
        converse(http, OTHER, 2)  # another prefix: no match anywhere, so the backend with more room
        view = next(r for r in http.get("/infer/routes").json()["routes"] if r["name"] == "chat")
    deadline = time.monotonic() + 10
    while len(rows := ledger(server)) < 5 and time.monotonic() < deadline:
        time.sleep(0.1)
    other, rows = rows[3:], rows[:3]
    assert [r.backend for r in other] == ["gpu1", "gpu1"] and other[1].cached_input_tokens > 300
    assert other[1].expected_cached_tokens == other[1].cached_input_tokens  # both in the backend's own tokens
    assert [r.backend for r in rows] == ["gpu0"] * 3 and rows[0].expected_cached_tokens == 0
    # gpu0 keeps 4 blocks: it evicted all but the first 64 tokens and said so; the route expected
    # exactly those (the approximate index would have expected the whole 300-word prefix)
    assert [(r.expected_cached_tokens, r.cached_input_tokens) for r in rows[1:]] == [(64, 64), (64, 64)]
    assert [b["prefix_mode"] for b in view["backends"]] == ["precise", "precise"]
    assert all(b["kv_events"] > 0 and b["kv_block_size"] == 16 for b in view["backends"])
