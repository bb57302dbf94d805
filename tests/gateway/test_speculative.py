"""Speculative decoding through `infer serve` with the native engine: a Modelfile's PARAMETER speculative,
the per-request switch (Ollama options, OpenAI extra body), the final chunk's draft counts and the
`infer_spec_decode_*` series on /metrics; INFER_SPECULATIVE's validation."""

from __future__ import annotations

import re

import httpx
import pytest

from core.settings import LocalSettings
from registry.create import create_model
from registry.modelfile import parse_modelfile
from registry.names import parse_name
from fakes.live import start_server, stop_server
from tests.gateway.conftest import private_store

PROMPT = "one two three four five six one two three four five six one two three four five six one two"


@pytest.fixture(scope="module")
def server(tiny_store, tmp_path_factory):
    store = private_store(tiny_store, tmp_path_factory, "spec-store")
    gguf = tiny_store.root.parent / "tiny-qwen2.gguf"
    text = f"FROM {gguf}\nPARAMETER num_ctx 512\nPARAMETER speculative ngram:k=4,adaptive=off\n"
    create_model(store, parse_name("tiny-spec", insecure=True), parse_modelfile(text), store.root.parent)
    live = start_server(tmp_path_factory.mktemp("spec-live"), store.root, INFER_ENGINE="native")
    try:
        yield live
    finally:
        stop_server(live)


def generate(server, model: str, **options) -> dict:
    body = {"model": model, "prompt": PROMPT, "raw": True, "stream": False,
            "options": {"temperature": 0, "num_predict": 40, **options}}
    r = httpx.post(server.url + "/api/generate", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def metric(server, name: str, model: str) -> float:
    text = httpx.get(server.url + "/metrics", timeout=10).text
    found = re.search(rf'^{name}{{backend="native",model="{re.escape(model)}"}} (\S+)$', text, re.M)
    return float(found.group(1)) if found else 0.0


def test_modelfile_parameter_speculates_with_the_same_answer(server):
    plain = generate(server, "tiny")
    spec = generate(server, "tiny-spec")
    assert spec["response"] == plain["response"] and spec["eval_count"] == plain["eval_count"]
    assert spec["draft_count"] > 0 and 0 <= spec["draft_accepted_count"] <= spec["draft_count"]
    assert "draft_count" not in plain
    drafts = metric(server, "infer_spec_decode_num_draft_tokens_total", "tiny-spec:latest")
    accepted = metric(server, "infer_spec_decode_num_accepted_tokens_total", "tiny-spec:latest")
    assert drafts >= spec["draft_count"] and accepted >= spec["draft_accepted_count"]
    rate = metric(server, "infer_spec_decode_acceptance_rate", "tiny-spec:latest")
    assert rate == pytest.approx(accepted / drafts)
    assert metric(server, "infer_spec_decode_num_drafts_total", "tiny-spec:latest") > 0


def test_requests_turn_it_off_and_on(server):
    before = metric(server, "infer_spec_decode_num_draft_tokens_total", "tiny-spec:latest")
    off = generate(server, "tiny-spec", speculative=False)
    assert "draft_count" not in off
    body = {"model": "tiny-spec", "prompt": PROMPT, "max_tokens": 30, "temperature": 0, "speculative": False}
    r = httpx.post(server.url + "/v1/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    assert metric(server, "infer_spec_decode_num_draft_tokens_total", "tiny-spec:latest") == before
    on = generate(server, "tiny", speculative=True)  # a model without a method: the n-gram default
    assert on["draft_count"] > 0 and on["response"] == generate(server, "tiny")["response"]
    bad = httpx.post(server.url + "/api/generate", json={"model": "tiny-spec", "prompt": "x", "stream": False,
                                                         "options": {"speculative": "eagle3"}}, timeout=30)
    assert bad.status_code == 400 and "speculative" in bad.json()["error"]


def test_infer_speculative_is_checked_at_start():
    assert LocalSettings.from_env({"INFER_SPECULATIVE": "ngram:k=6"}).speculative == "ngram:k=6"
    assert LocalSettings.from_env({"INFER_SPECULATIVE": "OFF"}).speculative == "off"
    with pytest.raises(ValueError, match="INFER_SPECULATIVE"):
        LocalSettings.from_env({"INFER_SPECULATIVE": "medusa"})


def test_infer_bench_reports_the_server_acceptance(server, tmp_path):
    from typer.testing import CliRunner

    from cli.main import app

    result = CliRunner().invoke(app, ["bench", "--url", server.url, "--model", "tiny-spec", "--num-requests", "4",
                                      "--warmup", "0", "--input-tokens", "24", "--output-tokens", "24",
                                      "--profile", "concurrent:2", "--out", str(tmp_path / "bench")])
    assert result.exit_code == 0, result.output
    line = next(line for line in result.output.splitlines() if line.startswith("Draft acceptance rate (%):"))
    assert 0.0 <= float(line.split()[-1]) <= 100.0
    assert "Mean acceptance length:" in result.output
