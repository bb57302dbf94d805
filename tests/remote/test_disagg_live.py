"""A P/D route through a live `infer serve --config`, in front of fake vLLM prefill and decode servers:
what the client gets, the one ledger row naming both workers with the cost split by leg, and
`GET /infer/routes`."""

from __future__ import annotations

import time

import httpx
import pytest
import sqlalchemy as sa

from fakes import FakeEngine
from fakes.pd import start_pd_server

PROMPT = " ".join(f"w{i}" for i in range(40))


@pytest.fixture(scope="module")
def pd():
    p, d = start_pd_server("vllm", "prefill"), start_pd_server("vllm", "decode")
    try:
        yield p, d
    finally:
        p.stop()
        d.stop()


@pytest.fixture(scope="module")
def server(pd, gateway_for):
    p, d = pd
    model = p.behaviour.models[0]
    return gateway_for([{"name": "p1", "type": "vllm", "base_url": p.url, "model": model,
                         "pricing": {"input_per_mtok": 2.0, "output_per_mtok": 0.0}},
                        {"name": "d1", "type": "vllm", "base_url": d.url, "model": model,
                         "pricing": {"input_per_mtok": 0.0, "output_per_mtok": 10.0}}],
                       routes=[{"name": "chat", "prefill": {"protocol": "vllm", "backends": ["p1"]},
                                "decode": {"protocol": "vllm", "backends": ["d1"]}, "disagg": {"when": "always"}}])


def test_one_row_names_both_workers_and_splits_the_cost_by_leg(server, pd):
    reply = httpx.post(server.url + "/v1/completions", json={"model": "chat", "prompt": PROMPT, "max_tokens": 5},
                       timeout=10)
    assert reply.status_code == 200 and reply.json()["choices"][0]["text"] == FakeEngine.expected_text(PROMPT, 5)
    assert reply.json()["usage"]["prompt_tokens"] == 40
    p, d = pd
    assert (p.pd.prefilled, d.pd.kv_loaded) == ([40], [32])
    row = _row(server)
    assert row.backend == "d1" and row.prefill_backend == "p1" and row.prefill_ms > 0
    assert (row.input_tokens, row.output_tokens) == (40, 5)
    assert row.prefill_cost_usd == pytest.approx(40 * 2.0 / 1e6)
    assert row.decode_cost_usd == pytest.approx(5 * 10.0 / 1e6)
    assert row.total_cost_usd == pytest.approx(row.prefill_cost_usd + row.decode_cost_usd)
    routes = httpx.get(server.url + "/infer/routes", timeout=5).json()
    chat = next(r for r in routes["routes"] if r["name"] == "chat")
    assert chat["disagg"]["prefill"] == ["p1"] and chat["disagg"]["disaggregated"] == 1


def _row(server):
    db = sa.create_engine(server.db_url)
    deadline = time.monotonic() + 10
    try:
        while time.monotonic() < deadline:
            with db.connect() as conn:
                found = list(conn.execute(sa.text(
                    "SELECT backend, prefill_backend, prefill_ms, input_tokens, output_tokens, prefill_cost_usd, "
                    "decode_cost_usd, total_cost_usd FROM requests WHERE route_name = 'chat'")))
            if found:
                assert len(found) == 1
                return found[0]
            time.sleep(0.1)
    finally:
        db.dispose()
    raise AssertionError("no ledger row")
