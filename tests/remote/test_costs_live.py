"""Costs through a live `infer serve --config` with priced fake vLLM backends: the header and the
stream's usage field equal the ledger row, cancelled and failed streams pay for what they produced,
`GET /infer/cost` and `infer cost` settle it."""

from __future__ import annotations

import csv
import io
import json
import subprocess
import sys
import time

import httpx
import pytest
import sqlalchemy as sa
from prometheus_client.parser import text_string_to_metric_families
from typer.testing import CliRunner

from cli.main import app

from fakes import start_server as start_fake
from fakes.behaviour import Behaviour

CHAT = [{"role": "user", "content": "name four letters"}]
API = {"input_per_mtok": 150.0, "output_per_mtok": 600.0}  # big prices: costs well above float noise


@pytest.fixture(scope="module")
def fake():
    server = start_fake("vllm", Behaviour())
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def server(fake, gateway_for):
    model = fake.behaviour.models[0]
    return gateway_for([{"name": "api", "type": "vllm", "base_url": fake.url, "model": model, "pricing": API},
                        {"name": "gpu", "type": "vllm", "base_url": fake.url, "model": model,
                         "pricing": {"gpu_hourly_usd": 2.5, "gpus": 1, "output_weight": 5}},
                        {"name": "free", "type": "vllm", "base_url": fake.url, "model": model}],
                       routes=[{"name": "chat", "backends": ["api", "gpu"], "strategy": "round_robin"}])


def rows(server, where: str, count: int) -> list:
    db = sa.create_engine(server.db_url)
    deadline = time.monotonic() + 10
    try:
        while True:
            with db.connect() as conn:
                found = list(conn.execute(sa.text(
                    "SELECT status, input_tokens, output_tokens, input_cost_usd, output_cost_usd, total_cost_usd, "
                    "cached_input_tokens, cached_input_cost_usd, "
                    f"pricing_version FROM requests WHERE {where} ORDER BY datetime_utc")))
            if len(found) >= count or time.monotonic() > deadline:
                return found
            time.sleep(0.1)
    finally:
        db.dispose()


def expected(row) -> float:
    return row.input_tokens * API["input_per_mtok"] / 1e6 + row.output_tokens * API["output_per_mtok"] / 1e6


def test_non_streaming_answers_carry_the_cost_the_ledger_records(server):
    r = httpx.post(server.url + "/v1/chat/completions", json={"model": "api", "messages": CHAT, "max_tokens": 4})
    assert r.status_code == 200
    [row] = rows(server, "backend = 'api' AND model = 'api'", 1)
    assert float(r.headers["x-infer-cost-usd"]) == pytest.approx(row.total_cost_usd, rel=1e-9)
    assert row.total_cost_usd == pytest.approx(expected(row)) and row.pricing_version
    assert row.input_cost_usd > 0 and row.output_cost_usd > 0
    unpriced = httpx.post(server.url + "/v1/chat/completions", json={"model": "free", "messages": CHAT, "max_tokens": 4})
    assert "x-infer-cost-usd" not in unpriced.headers


def test_streams_carry_it_in_the_usage_chunk_and_the_final_ollama_line(server):
    r = httpx.post(server.url + "/v1/chat/completions", json={"model": "api", "messages": CHAT, "max_tokens": 4,
                                                              "stream": True, "stream_options": {"include_usage": True}})
    events = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]
    usage = events[-1]["usage"]
    assert usage["cost_usd"] == pytest.approx((usage["prompt_tokens"] * 150 + usage["completion_tokens"] * 600) / 1e6)
    lines = httpx.post(server.url + "/api/chat", json={"model": "gpu", "messages": CHAT}).text.splitlines()
    final = json.loads(lines[-1])
    assert final["done"] is True and final["cost_usd"] > 0  # the first window's provisional rate


def test_cancelled_and_failed_streams_pay_for_what_they_produced(server, fake):
    fake.behaviour.token_delay = 0.05
    try:
        with httpx.stream("POST", server.url + "/v1/chat/completions",
                          json={"model": "api", "messages": CHAT, "max_tokens": 40, "stream": True}) as r:
            for line in r.iter_lines():
                if line.startswith("data: {") and '"content"' in line:
                    break  # hang up after the first token
        fake.behaviour.fail_after = 2
        r = httpx.post(server.url + "/v1/chat/completions",
                       json={"model": "api", "messages": CHAT, "max_tokens": 10, "stream": True})
        assert '"error"' in r.text
    finally:
        fake.behaviour.reset()
    found = {row.status: row for row in rows(server, "model = 'api' AND status != 'ok'", 2)}
    for status in ("cancelled", "error"):
        row = found[status]
        assert 0 < row.output_tokens < 40 and row.total_cost_usd == pytest.approx(expected(row))


def test_infer_cost_settles_the_ledger(server):
    answer = httpx.get(server.url + "/infer/cost", params={"since": "1h", "by": "backend"})
    assert answer.status_code == 200, answer.text
    report = answer.json()
    groups = {g["key"]: g for g in report["groups"]}
    served = rows(server, "backend = 'api'", 1)  # rows carry the config's backend name, also asked directly
    assert groups["api"]["requests"] == len(served) >= 3 and groups["api"]["total_cost_usd"] > 0
    assert report["bills"]["gpu"]["bill_usd"] > 0
    bad = httpx.get(server.url + "/infer/cost", params={"by": "team"})
    assert bad.status_code == 400
    env_db = server.db_url
    done = subprocess.run([sys.executable, "-m", "cli", "cost", "--since", "1h", "--by", "route", "--db", env_db],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "$/Mtok in" in done.stdout and "api" in done.stdout


def test_a_routes_backends_side_by_side_in_csv_and_in_prometheus(server):
    """Four requests through route ``chat`` (round robin over ``api`` and ``gpu``): ``infer cost compare``
    shows both with their $/Mtok, ``--csv`` the route's group, ``/metrics`` the cost by route, backend
    and kind; each adds up to the costs the answers carried."""
    answers = [httpx.post(server.url + "/v1/chat/completions", json={"model": "chat", "messages": CHAT, "max_tokens": 4})
               for _ in range(4)]
    assert [r.status_code for r in answers] == [200] * 4
    carried = sum(float(r.headers["x-infer-cost-usd"]) for r in answers)
    rows(server, "route_name = 'chat'", 4)
    config = str(server.home.parent / "backends.yaml")
    shown = CliRunner().invoke(app, ["cost", "compare", "--config", config, "--db", server.db_url, "--since", "1h"])
    assert shown.exit_code == 0, shown.output
    lines = shown.output.splitlines()
    table = {line.split()[0]: line.split() for line in lines[lines.index("route chat") + 1:] if line.strip()}
    assert table["backend"] == ["backend", "requests", "$/Mtok", "in", "$/Mtok", "out", "total", "$"]
    # every request the backend served (asked directly or through the route), at its list prices
    assert table["api"][1:4] == [str(len(rows(server, "backend = 'api'", 1))), "150.000000", "600.000000"]
    assert table["gpu"][1] == str(len(rows(server, "backend = 'gpu'", 1))) and float(table["gpu"][3]) == pytest.approx(5 * float(table["gpu"][2]), rel=1e-5)

    as_csv = CliRunner().invoke(app, ["cost", "--config", config, "--db", server.db_url, "--by", "route", "--csv"])
    assert as_csv.exit_code == 0, as_csv.output
    groups = {row["key"]: row for row in csv.DictReader(io.StringIO(as_csv.output))}
    assert groups["chat"]["requests"] == "4" and float(groups["chat"]["provisional_cost_usd"]) == pytest.approx(carried)

    metrics = httpx.get(server.url + "/metrics").text
    [family] = [f for f in text_string_to_metric_families(metrics) if f.name == "infer_cost_usd"]
    samples = [s for s in family.samples if s.name == "infer_cost_usd_total" and s.labels["route"] == "chat"]
    assert {s.labels["backend"] for s in samples} == {"api", "gpu"}
    assert {s.labels["kind"] for s in samples} == {"input", "output"}  # no cached tokens here
    assert sum(s.value for s in samples) == pytest.approx(carried)
