"""Routes through a live `infer serve --config`, in front of fake vLLM servers: what clients of both
APIs see (429 with Retry-After on a shed, the OpenAI and Ollama error shapes), the ledger rows
(shed included), `GET /infer/routes`, `infer routes` and the Prometheus series."""

from __future__ import annotations

import subprocess
import sys

import httpx
import pytest
import sqlalchemy as sa

from fakes import start_server as start_fake
from fakes.behaviour import Behaviour
from fakes.queueing import QueueModel, start_queueing

CHAT = [{"role": "user", "content": "name four letters"}]


@pytest.fixture(scope="module")
def fakes():
    fast, slow = start_fake("vllm", Behaviour()), start_fake("vllm", Behaviour(first_byte_delay=0.4))
    stalled = start_fake("vllm", Behaviour(first_byte_delay=5.0))
    paced = start_queueing(QueueModel(batch_limit=4, prefill_tok_s=1e6, tpot_base_ms=60, tpot_slope_ms=0,
                                      model=fast.behaviour.models[0]))  # 60 ms a token, streamed or not
    try:
        yield fast, slow, stalled, paced
    finally:
        for fake in (fast, slow, stalled, paced):
            fake.stop()


@pytest.fixture(scope="module")
def server(fakes, gateway_for):
    fast, slow, stalled, paced = fakes
    model = fast.behaviour.models[0]
    return gateway_for([{"name": "fast", "type": "vllm", "base_url": fast.url, "model": model},
                        {"name": "slow", "type": "vllm", "base_url": slow.url, "model": model},
                        {"name": "stalled", "type": "vllm", "base_url": stalled.url, "model": model},
                        {"name": "paced", "type": "vllm", "base_url": paced.url, "model": model}],
                       routes=[{"name": "chat", "backends": ["slow", "fast"], "strategy": "round_robin",
                                "slo": {"ttft_ms": 260, "window_s": 60}},
                               {"name": "strict", "backends": ["slow"], "slo": {"ttft_ms": 100}, "shed": True},
                               {"name": "hedged", "backends": ["stalled", "fast"], "strategy": "round_robin",
                                "first_token_timeout_ms": 300},
                               {"name": "chat-paced", "backends": ["paced"], "strategy": "slo",
                                "slo": {"ttft_ms": 250, "tpot_ms": 100}, "first_token_timeout_ms": 300}])


def rows(server, where: str) -> list:
    db = sa.create_engine(server.db_url)
    try:
        with db.connect() as conn:
            return list(conn.execute(sa.text(
                f"SELECT route_name, backend, status, slo_met, slo_missed, attempts FROM requests WHERE {where}")))
    finally:
        db.dispose()


def settle(server, where: str, count: int) -> list:
    import time

    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        found = rows(server, where)
        if len(found) >= count:
            return found
        time.sleep(0.1)
    return rows(server, where)


def test_round_robin_attainment_goodput_and_the_rows_say_which_backend_met_the_slo(server):
    with httpx.Client(base_url=server.url, timeout=30) as http:
        for _ in range(4):
            r = http.post("/v1/chat/completions", json={"model": "chat", "messages": CHAT, "max_tokens": 4})
            assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"]
        view = http.get("/infer/routes").json()["routes"]
        metrics = http.get("/metrics").text
    chat = next(r for r in view if r["name"] == "chat")
    assert (chat["requests"], chat["good"], chat["attainment"], chat["missed"]["ttft"]) == (4, 2, 0.5, 2)
    by_name = {b["name"]: b for b in chat["backends"]}
    assert by_name["fast"]["good"] == 2 and by_name["slow"]["good"] == 0
    assert by_name["slow"]["ttft"]["p50"] > 260 > by_name["fast"]["ttft"]["p50"]
    assert chat["goodput_rps"] > 0 and by_name["fast"]["breaker"] == "closed"
    assert 0 < chat["predicted_for_prompt_tokens"] < 50  # the requests' own short prompt, not a default
    for view_of in (chat, by_name["fast"], by_name["slow"]):  # 4-token answers: a TPOT to predict and score
        assert view_of["prediction_error"] >= 0 and view_of["tpot_prediction_error"] >= 0
    found = settle(server, "route_name = 'chat'", 4)
    assert sorted((r.backend, r.slo_met, r.slo_missed) for r in found) == [
        ("fast", True, None), ("fast", True, None), ("slow", False, "ttft"), ("slow", False, "ttft")]
    assert 'infer_slo_violations_total{backend="slow",kind="ttft",route="chat"} 2.0' in metrics
    assert 'le="0.26"' in metrics  # a bucket edge at the SLO (0.26 s is no default edge)


def test_a_route_sheds_on_both_apis_once_it_has_learned_the_backend_is_too_slow(server):
    with httpx.Client(base_url=server.url, timeout=30) as http:
        statuses = []
        for _ in range(12):  # the slow backend takes ~400 ms to a first token against a 100 ms SLO
            r = http.post("/v1/chat/completions", json={"model": "strict", "messages": CHAT, "max_tokens": 2})
            statuses.append(r.status_code)
            if r.status_code == 429:
                break
        assert statuses[-1] == 429 and statuses[0] == 200
        error = r.json()["error"]
        assert error["type"] == "rate_limit_error" and "route 'strict'" in error["message"]
        assert "TTFT SLO of 100 ms" in error["message"] and float(r.headers["retry-after"]) >= 1
        ollama = http.post("/api/chat", json={"model": "strict", "messages": CHAT})
        assert ollama.status_code == 429 and "route 'strict'" in ollama.json()["error"]
        assert float(ollama.headers["retry-after"]) >= 1
        low = http.post("/api/chat", json={"model": "strict", "messages": CHAT}, headers={"x-priority": "-2"})
        assert low.status_code == 429
        bad = http.post("/api/chat", json={"model": "strict", "messages": CHAT}, headers={"x-slo-ttft-ms": "soon"})
        assert bad.status_code == 400 and "x-slo-ttft-ms" in bad.json()["error"]
    shed = settle(server, "route_name = 'strict' AND status = 'shed'", 3)
    assert len(shed) >= 3 and all(r.backend == "none" and r.attempts == 0 for r in shed)


def test_infer_routes_prints_the_table(server):
    done = subprocess.run([sys.executable, "-m", "cli", "routes", "--url", server.url], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "route chat (round_robin; SLO ttft 260 ms, target 95%, window 60 s)" in done.stdout
    lines = done.stdout.splitlines()
    assert any(line.startswith("fast ") for line in lines) and any(line.startswith("(route)") for line in lines)
    assert "pred tpot" in lines[1] and "ttft err" in lines[1] and "tpot err" in lines[1]
    assert any(line.startswith("(predictions for a prompt of ") and " tokens, the median" in line for line in lines)


def test_a_backend_with_no_first_token_in_time_is_cancelled_and_the_next_one_answers(server, fakes):
    import time

    stalled = fakes[2]
    with httpx.Client(base_url=server.url, timeout=30) as http:
        t0 = time.monotonic()
        r = http.post("/v1/chat/completions", json={"model": "hedged", "messages": CHAT, "max_tokens": 4,
                                                    "stream": True})
        assert r.status_code == 200 and r.text.endswith("data: [DONE]\n\n") and '"error"' not in r.text
        assert time.monotonic() - t0 < 3.0  # not the stalled backend's 5 s
    assert stalled.behaviour.wait_for(lambda b: b.disconnects >= 1, timeout=5.0)  # we hung up on it
    [row] = settle(server, "route_name = 'hedged'", 1)
    assert (row.backend, row.attempts, row.status) == ("fast", 2, "ok")


def test_a_reply_not_streamed_to_the_client_is_streamed_from_the_backend_so_its_first_token_is_timed(server):
    """A non-streaming client's request takes 12 x 60 ms: longer than the route's TTFT SLO and its
    first-token deadline, though the backend's first token comes at once. The route must not hedge it
    away nor count it a TTFT miss: it times the backend's first token, as vLLM's own metrics do."""
    with httpx.Client(base_url=server.url, timeout=30) as http:
        for _ in range(2):
            r = http.post("/v1/chat/completions", json={"model": "chat-paced", "messages": CHAT, "max_tokens": 12})
            assert r.status_code == 200, r.text
            assert r.json()["usage"]["completion_tokens"] == 12 and r.json()["choices"][0]["message"]["content"]
        ollama = http.post("/api/chat", json={"model": "chat-paced", "messages": CHAT, "stream": False,
                                              "options": {"num_predict": 12}})
        assert ollama.status_code == 200 and ollama.json()["eval_count"] == 12
        view = next(r for r in http.get("/infer/routes").json()["routes"] if r["name"] == "chat-paced")
    found = settle(server, "route_name = 'chat-paced'", 3)
    assert [(r.backend, r.status, r.attempts, r.slo_met) for r in found] == [("paced", "ok", 1, True)] * 3
    assert (view["requests"], view["good"]) == (3, 3)
    assert view["ttft"]["p50"] < 250 and 50 < view["tpot"]["p50"] < 100


@pytest.mark.slow  # seconds of waiting on health polls or 500 streams: make test-slow (CI runs it)
def test_a_member_whose_health_fails_is_down_in_every_route_and_up_again_when_it_answers(server, fakes):
    """One poller (the backend monitor) asks each backend; every route holding it hears the answer."""
    import time

    slow = fakes[1]

    def members(name: str) -> dict[str, bool]:
        routes = {r["name"]: r for r in httpx.get(server.url + "/infer/routes", timeout=10).json()["routes"]}
        return {b["name"]: b["up"] for b in routes[name]["backends"]}

    def wait(predicate) -> bool:
        deadline = time.monotonic() + 8
        while time.monotonic() < deadline:
            if predicate():
                return True
            time.sleep(0.2)
        return False

    slow.behaviour.healthy = False
    try:
        assert wait(lambda: members("chat") == {"slow": False, "fast": True} and members("strict") == {"slow": False})
        backends = {b["name"]: b["up"] for b in httpx.get(server.url + "/infer/backends", timeout=10).json()["backends"]}
        assert backends["slow"] is False and backends["fast"] is True
    finally:
        slow.behaviour.healthy = True
    assert wait(lambda: members("chat") == {"slow": True, "fast": True} and members("strict") == {"slow": True})
