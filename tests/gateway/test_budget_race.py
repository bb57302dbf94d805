"""Budgets that hold without max tokens: 50 concurrent requests that set no limit on their output,
against a key whose budget fits a few of them, on a live ``infer serve`` with the in-process llama.cpp
engine (its tokenizer counts each prompt; the hold covers the whole context left) and the SQLite
ledger. The key never spends more than its budget, a refused request is neither run nor priced,
every request has one row, and no hold is left once they have ended.

(Two replicas on PostgreSQL, with a remote backend: ``tests/remote/test_budgets_live.py``.)
"""

from __future__ import annotations

import asyncio

import httpx
import pytest
import yaml

from fakes.live import new_key, query, start_server, stop_server
from tests.servers import wait_for

PRICE = {"input_per_mtok": 1000.0, "output_per_mtok": 1000.0}  # $0.001 a token


@pytest.fixture(scope="module")
def server(tiny_store, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("budget-race")
    config = tmp / "config.yaml"
    config.write_text(yaml.safe_dump({"routes": [{"name": "chat", "backends": ["tiny"]}],
                                      "local": {"pricing": PRICE}}))
    live = start_server(tmp, tiny_store.root, INFER_CONFIG=str(config), INFER_NUM_PARALLEL="4")
    yield live
    stop_server(live)


async def burst(server, key: str, n: int, body_of) -> list[httpx.Response]:
    async with httpx.AsyncClient(limits=httpx.Limits(max_connections=n), timeout=120) as client:
        return await asyncio.gather(*(client.post(server.url + path, json=body, headers={"Authorization": f"Bearer {key}"})
                                      for path, body in (body_of(i) for i in range(n))))


def bodies(model: str):
    """No max tokens, in each API's words: OpenAI without max_tokens, Ollama with num_predict -1 or
    unset; each runs to the end of the context (ignore_eos) unless the gateway stops it."""
    def body(i: int) -> tuple[str, dict]:
        messages = [{"role": "user", "content": f"tell me a long story, number {i}"}]
        if i % 3 == 0:
            return "/v1/chat/completions", {"model": model, "messages": messages, "ignore_eos": True,
                                            "stream": i % 2 == 0}
        options = {"num_predict": -1, "ignore_eos": True} if i % 3 == 1 else {"ignore_eos": True}
        return "/api/chat", {"model": model, "messages": messages, "stream": i % 2 == 0, "options": options}
    return body


@pytest.mark.parametrize("model, budget", [
    ("tiny", 2.5),  # context 512: a request with no max holds about $0.5; 4 fit, and a 5th with what is left
    ("chat", 2.5),  # the same model behind a route: the member that serves prices the hold
    pytest.param("slow", 10.0, marks=pytest.mark.slow),  # context 4096, past the 2,048 tokens once assumed
])
def test_50_concurrent_requests_without_max_tokens_never_pass_the_budget(server, model, budget):
    name = f"race-{model}"
    key = new_key(server, name, "--budget-usd", str(budget))
    answers = asyncio.run(burst(server, key, 50, bodies(model)))
    codes = [r.status_code for r in answers]
    assert set(codes) <= {200, 429} and 200 in codes and 429 in codes, codes
    assert wait_for(lambda: query(server, "SELECT count(*) FROM requests WHERE key_name = :n", n=name)[0][0] == 50,
                    timeout=30)
    assert wait_for(lambda: query(server, "SELECT count(*) FROM key_holds")[0][0] == 0, timeout=10)
    spent, reserved = query(server, "SELECT spent_usd, reserved_usd FROM api_keys WHERE name = :n", n=name)[0]
    assert spent <= budget + 1e-9 and reserved == pytest.approx(0.0, abs=1e-12)
    rows = query(server, "SELECT status, total_cost_usd, output_tokens, error FROM requests WHERE key_name = :n",
                 n=name)
    served = [r for r in rows if r[0] == "ok"]
    refused = [r for r in rows if r[0] != "ok"]
    assert len(served) == codes.count(200) and len(refused) == codes.count(429)
    assert sum(r[1] for r in served) == pytest.approx(spent, rel=1e-9)
    assert all(not cost and tokens == 0 and "over budget" in error for _, cost, tokens, error in refused)
    assert spent > budget * 0.8  # they did generate, to the end of the context: the holds were no guesses
    noted = [r for r in answers if "x-infer-note" in r.headers]  # the last one admitted got what was left
    assert all("budget" in r.headers["x-infer-note"] for r in noted)
