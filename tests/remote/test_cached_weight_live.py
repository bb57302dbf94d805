"""``cached_input_weight: measured`` through a live ``infer serve``: ``infer bench --shared-prefix`` against
a backend with a prefix cache measures what a cached prompt token costs in prefill time, the gateway
prices cached tokens with it, and ``infer cost`` shows the bill split into uncached input, cached
input, output and idle parts that add up to it."""

from __future__ import annotations

import json

import httpx
import pytest
from typer.testing import CliRunner

from cli.main import app
from fakes.queueing import QueueModel, start_queueing
from tests.remote.test_costs_live import rows

SYSTEM = {"role": "system", "content": " ".join(f"rule{i}" for i in range(400))}
HOURLY = {"gpu_hourly_usd": 2.5, "gpus": 1, "output_weight": 4, "cached_input_weight": "measured"}


@pytest.fixture(scope="module")
def fake():
    model = QueueModel(batch_limit=4, prefill_tok_s=2000, tpot_base_ms=2, tpot_slope_ms=0, prefix_cache_tokens=64_000,
                       cached_prefill_weight=0.1, model="sim")
    with start_queueing(model) as server:
        yield server


def test_the_cached_weight_is_measured_and_the_parts_add_up_to_the_bill(fake, gateway_for, infer_home, tmp_path):
    bench = CliRunner().invoke(app, ["bench", "--url", fake.url, "--model", "sim", "--num-requests", "12",
                                     "--warmup", "0", "--input-tokens", "600:100", "--output-tokens", "2",
                                     "--shared-prefix", "400"])
    assert bench.exit_code == 0, bench.output
    [summary_file] = (infer_home / "bench").glob("*/summary.json")
    [point] = json.loads(summary_file.read_text())["load_points"]
    weight = point["cached_prefill_weight"]
    assert 0.03 < weight < 0.3  # the fake's cached token costs 0.1 of an uncached one; TTFT noise moves it a little

    db_url = f"sqlite:///{tmp_path / 'usage.db'}"
    server = gateway_for([{"name": "gpu", "type": "vllm", "base_url": fake.url, "model": "sim", "pricing": HOURLY}],
                         env={"INFER_HOME": str(infer_home), "INFER_DATABASE_URL": db_url})
    for question in ("one", "two"):  # the second finds the system prompt cached
        r = httpx.post(server.url + "/v1/chat/completions", json={"model": "gpu", "max_tokens": 3, "messages": [
            SYSTEM, {"role": "user", "content": question}]})
        assert r.status_code == 200
    found = rows(server, "model = 'gpu'", 2)
    cached = [row for row in found if row.cached_input_cost_usd]
    assert len(cached) == 1 and cached[0].cached_input_tokens == 400
    per_cached = cached[0].cached_input_cost_usd / cached[0].cached_input_tokens
    per_input = cached[0].input_cost_usd / (cached[0].input_tokens - cached[0].cached_input_tokens)
    assert per_cached / per_input == pytest.approx(weight, rel=1e-6)

    config = server.home.parent / "backends.yaml"
    shown = CliRunner().invoke(app, ["cost", "--config", str(config), "--db", db_url, "--json"])
    bill = json.loads(shown.output[shown.output.index("{"):])["bills"]["gpu"]
    assert bill["cached_input_weight"] == pytest.approx(weight) and "measured by infer bench" in \
        bill["cached_input_weight_source"]
    parts = bill["input_usd"] + bill["cached_input_usd"] + bill["output_usd"]
    assert parts == pytest.approx(bill["allocated_usd"], rel=1e-12)
    assert parts + bill["idle_usd"] == pytest.approx(bill["bill_usd"], rel=1e-12)
    assert bill["cached_input_usd"] > 0
    text = CliRunner().invoke(app, ["cost", "--config", str(config), "--db", db_url]).output
    assert "gpu: bill $" in text and " + cached $" in text and "cached_input_weight" in text
