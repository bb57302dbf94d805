"""The real vLLM (CPU build) behind a ``prefix`` route with its KV events on an ``ipc://`` endpoint: the
cached tokens the route expects are the ones vLLM reports for the request and counts in its own
``vllm:prompt_tokens_cached_total`` (blocks of 128 tokens on the CPU)."""

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
