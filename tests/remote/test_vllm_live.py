"""The real vLLM (CPU build) behind a ``prefix`` route with its KV events on an ``ipc://`` endpoint: the
cached tokens the route expects are the ones vLLM reports for the request and counts in its own
``vllm:prompt_tokens_cached_total`` (blocks of 128 tokens on the CPU); with two servers behind the
route, a prefix goes to the one whose events said it holds it."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import httpx
import pytest

from tests.remote.test_kv_events_live import ledger

pytestmark = pytest.mark.slow
SYSTEM = {"role": "system", "content": " ".join(f"rule {i} says {i * 7}." for i in range(80))}  # ~1,100 tokens


def cached_total(url: str) -> float:
    page = httpx.get(url + "/metrics", timeout=30).text
    return sum(float(m) for m in re.findall(r'^vllm:prompt_tokens_cached_total\{[^}]*\} (\S+)$', page, re.M))


@pytest.fixture(scope="module")
def server(vllm_cpu, gateway_for):
    tokenizer = str(vllm_cpu.model_dir / "tokenizer.json")  # tokenizer_config.json beside it: the chat template
    return gateway_for([{"name": "cpu0", "type": "vllm", "base_url": vllm_cpu.url, "model": vllm_cpu.model,
                         "tokenizer": tokenizer, "kv_events": vllm_cpu.kv_endpoint}],
                       routes=[{"name": "chat", "backends": ["cpu0"], "strategy": "prefix"}])


def test_expected_cached_tokens_equal_what_vllm_counts(server, vllm_cpu):
    before = cached_total(vllm_cpu.url)
    with httpx.Client(base_url=server.url, timeout=300) as http:
        for question in ("first question", "second question"):
            body = {"model": "chat", "messages": [SYSTEM, {"role": "user", "content": question}], "max_tokens": 2,
                    "temperature": 0}
            reply = http.post("/v1/chat/completions", json=body)
            assert reply.status_code == 200, reply.text
            time.sleep(0.5)  # vLLM's events arrive
        view = next(r for r in http.get("/infer/routes").json()["routes"] if r["name"] == "chat")
    rows = ledger(server)[-2:]
    counted = cached_total(vllm_cpu.url) - before
    assert view["backends"][0]["prefix_mode"] == "precise" and view["backends"][0]["kv_events"] > 0
    assert rows[0].cached_input_tokens == 0 and rows[1].cached_input_tokens >= 256
    figures = {"expected": rows[1].expected_cached_tokens, "reported": rows[1].cached_input_tokens,
               "vllm_prompt_tokens_cached_total": counted, "input_tokens": rows[1].input_tokens}
    out = Path(__file__).resolve().parents[2] / ".bench" / "conformance"
    out.mkdir(parents=True, exist_ok=True)
    (out / "prefix.json").write_text(json.dumps(figures) + "\n")
    assert rows[1].expected_cached_tokens == rows[1].cached_input_tokens == counted, figures


def backend_entry(name: str, server) -> dict:
    return {"name": name, "type": "vllm", "base_url": server.url, "model": server.model,
            "tokenizer": str(server.model_dir / "tokenizer.json"), "kv_events": server.kv_endpoint}


def ask(url: str, model: str, system: dict, question: str) -> httpx.Response:
    body = {"model": model, "messages": [system, {"role": "user", "content": question}], "max_tokens": 2,
            "temperature": 0}
    reply = httpx.post(url + "/v1/chat/completions", json=body, timeout=300)
    assert reply.status_code == 200, reply.text
    return reply


def ledger_rows(server, count: int) -> list:
    """The ledger's rows once it has ``count`` (the row is written after the answer)."""
    deadline = time.monotonic() + 10
    while len(rows := ledger(server)) < count and time.monotonic() < deadline:
        time.sleep(0.1)
    return rows


def test_two_servers_each_prefix_goes_where_it_is_held(vllm_cpu, vllm_cpu_second, gateway_for):
    """Each server is given one prefix directly (not through the gateway); the route learns who holds
    what from their KV events alone and sends each prefix's next request there, expecting the cached
    tokens that server then reports and counts."""
    servers = {"cpu0": vllm_cpu, "cpu1": vllm_cpu_second}
    held = {name: {"role": "system", "content": " ".join(f"{word} {i} means {i * 3}." for i in range(80))}
            for name, word in (("cpu0", "law"), ("cpu1", "clause"))}  # ~1,000 tokens each, new to both
    gateway = gateway_for([backend_entry(name, server) for name, server in servers.items()],
                          routes=[{"name": "pair", "backends": list(servers), "strategy": "prefix"}])
    time.sleep(1.0)  # the gateway's subscriptions take effect
    for name, system in held.items():
        ask(servers[name].url, servers[name].model, system, "warm up")
    time.sleep(1.0)  # their events arrive
    figures = []
    for count, (name, system) in enumerate(reversed(held.items()), start=1):  # cpu1's first: not a rotation
        before = {n: cached_total(s.url) for n, s in servers.items()}
        reply = ask(gateway.url, "pair", system, "and now?")
        row = ledger_rows(gateway, count)[-1]
        counted = {n: cached_total(s.url) - before[n] for n, s in servers.items()}
        reported = reply.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
        figures.append({"prefix_on": name, "routed_to": row.backend, "expected": row.expected_cached_tokens,
                        "reported": reported, "ledger": row.cached_input_tokens, "counted": counted})
    out = Path(__file__).resolve().parents[2] / ".bench" / "conformance"
    out.mkdir(parents=True, exist_ok=True)
    (out / "prefix-two.json").write_text(json.dumps(figures) + "\n")
    for f in figures:
        assert f["routed_to"] == f["prefix_on"], figures
        assert f["expected"] == f["reported"] == f["ledger"] == f["counted"][f["prefix_on"]] >= 256, figures
