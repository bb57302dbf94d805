"""``output_weight: measured`` through a live ``infer serve``: the weight comes from the latest
``infer bench`` run of the backend (saved under ``$INFER_HOME/bench`` by default), the costs use it,
and ``GET /infer/cost`` / ``infer cost`` say where it came from. Without a calibration the default is
used and the server says which command to run. A route member that is a model of the local store is
priced by ``local:``."""

from __future__ import annotations

import json

import httpx
import pytest
from typer.testing import CliRunner

from cli.main import app
from fakes import start_server as start_fake
from fakes.behaviour import Behaviour
from tests.remote.test_costs_live import rows

CHAT = [{"role": "user", "content": "name four letters " * 20}]
HOURLY = {"gpu_hourly_usd": 2.5, "gpus": 1, "output_weight": "measured", "cached_input_weight": 0.1}


@pytest.fixture(scope="module")
def fake():
    server = start_fake("vllm", Behaviour(first_byte_delay=0.02, token_delay=0.005))
    try:
        yield server
    finally:
        server.stop()


def rate_ratio(row) -> float:
    """What an output token cost over what an input token cost, in this row."""
    return (row.output_cost_usd / row.output_tokens) / (row.input_cost_usd / row.input_tokens)


def test_measured_weight_comes_from_the_latest_bench_of_the_backend(fake, gateway_for, infer_home, tmp_path):
    model = fake.behaviour.models[0]
    bench = CliRunner().invoke(app, ["bench", "--url", fake.url, "--model", model, "--num-requests", "4",
                                     "--warmup", "0", "--input-tokens", "64", "--output-tokens", "8"])
    assert bench.exit_code == 0, bench.output
    [summary_file] = (infer_home / "bench").glob("*/summary.json")  # saved by default
    [point] = json.loads(summary_file.read_text())["load_points"]
    k = point["prefill_decode_ratio"]
    assert k > 0 and f"to {summary_file.parent}" in bench.output

    db_url = f"sqlite:///{tmp_path / 'usage.db'}"
    server = gateway_for([{"name": "gpu", "type": "vllm", "base_url": fake.url, "model": model, "pricing": HOURLY}],
                         env={"INFER_HOME": str(infer_home), "INFER_DATABASE_URL": db_url})
    r = httpx.post(server.url + "/v1/chat/completions", json={"model": "gpu", "messages": CHAT, "max_tokens": 6})
    assert r.status_code == 200
    [row] = rows(server, "model = 'gpu'", 1)
    assert rate_ratio(row) == pytest.approx(k, rel=1e-9)  # the provisional cost used the measured weight
    assert float(r.headers["x-infer-cost-usd"]) == pytest.approx(row.total_cost_usd, rel=1e-9)

    bill = httpx.get(server.url + "/infer/cost").json()["bills"]["gpu"]
    assert bill["output_weight"] == pytest.approx(k, rel=1e-12)
    assert bill["output_weight_source"].startswith(f"output_weight {k:.4g} measured by infer bench at ")
    assert str(summary_file.parent) in bill["output_weight_source"]
    assert bill["windows_with_traffic"] == 1 and bill["allocated_usd"] > 0  # the row settles against gpu's bill
    config = server.home.parent / "backends.yaml"
    shown = CliRunner().invoke(app, ["cost", "--config", str(config), "--db", db_url, "--by", "model", "--json"])
    assert shown.exit_code == 0, shown.output
    report = json.loads(shown.output[shown.output.index("{"):])
    group = next(g for g in report["groups"] if g["key"] == "gpu")  # by model: the public name
    assert group["usd_per_mtok_output"] / group["usd_per_mtok_input"] == pytest.approx(k, rel=1e-5)  # settled
    text = CliRunner().invoke(app, ["cost", "--config", str(config), "--db", db_url]).output
    assert "gpu: bill $" in text and f"output_weight {k:.4g} measured by infer bench at " in text


def test_without_a_bench_the_default_is_used_and_a_local_route_member_is_priced(gateway_for, tmp_path):
    """``tiny`` is a model of the local store: the route's rows carry ``local:``'s costs."""
    db_url = f"sqlite:///{tmp_path / 'usage.db'}"
    server = gateway_for([], routes=[{"name": "chat-local", "backends": ["tiny"]}],
                         local={"pricing": {"gpu_hourly_usd": 0.10, "output_weight": "measured"}},
                         env={"INFER_DATABASE_URL": db_url})
    r = httpx.post(server.url + "/v1/chat/completions",
                   json={"model": "chat-local", "messages": CHAT[:1], "max_tokens": 4,
                         "ignore_eos": True})  # a random-weight model may end at once: 4 output tokens always
    assert r.status_code == 200, r.text
    [row] = rows(server, "route_name = 'chat-local'", 1)
    assert row.output_tokens == 4 and row.total_cost_usd > 0 and row.pricing_version
    assert float(r.headers["x-infer-cost-usd"]) == pytest.approx(row.total_cost_usd, rel=1e-9)
    assert rate_ratio(row) == pytest.approx(5.0, rel=1e-9)  # the default weight
    bill = httpx.get(server.url + "/infer/cost", params={"by": "route"}).json()["bills"]["local"]
    assert bill["backends"] == ["llamacpp", "native", "tiny"] and bill["output_weight"] == 5.0
    hint = "run: infer bench --url http://127.0.0.1:11434 --model MODEL --label backend=local"
    assert hint in bill["output_weight_source"] and hint in server.log()
