"""A remote vLLM's LoRA adapters through `infer serve --config` (`lora_modules:`): each adapter is a model
name in the OpenAI and Ollama APIs with the backend as its parent, its requests reach vLLM with the
adapter as `model`, and the ledger, `infer cost --by model` and the prices know it (its own price, or the
backend's)."""

from __future__ import annotations

import time

import httpx
import pytest
import sqlalchemy as sa
from openai import OpenAI
from typer.testing import CliRunner

from cli.main import app
from fakes import start_server as start_fake
from fakes.behaviour import Behaviour
from gateway.backends_config import ConfigError, load_config

BASE = "Qwen/Qwen2.5-0.5B-Instruct"
BASE_PRICE = {"input_per_mtok": 100.0, "output_per_mtok": 400.0}
SQL_PRICE = {"input_per_mtok": 300.0, "output_per_mtok": 900.0}
CHAT = [{"role": "user", "content": "name four letters"}]


@pytest.fixture(scope="module")
def fake():
    server = start_fake("vllm", Behaviour(models=[BASE, "sql-lora", "chat-lora"],
                                          parents={"sql-lora": BASE, "chat-lora": BASE}))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def server(fake, gateway_for):
    return gateway_for([{"name": "qwen", "type": "vllm", "base_url": fake.url, "model": BASE, "pricing": BASE_PRICE,
                         "lora_modules": [{"name": "sql", "model": "sql-lora", "pricing": SQL_PRICE},
                                          {"name": "chat-lora"}]}])


def _row(server, model: str):
    db = sa.create_engine(server.db_url)
    deadline = time.monotonic() + 10
    try:
        while True:
            with db.connect() as conn:
                found = conn.execute(sa.text("SELECT model, backend, input_tokens, output_tokens, total_cost_usd "
                                             "FROM requests WHERE model = :m"), {"m": model}).fetchall()
            if found or time.monotonic() > deadline:
                return found[-1]
            time.sleep(0.1)
    finally:
        db.dispose()


def test_adapters_are_model_names_with_their_parent(server):
    models = {m["id"]: m for m in httpx.get(server.url + "/v1/models").json()["data"]}
    assert models["sql"]["parent"] == "qwen" and models["chat-lora"]["parent"] == "qwen"
    assert "parent" not in models["qwen"]
    tags = {m["name"]: m for m in httpx.get(server.url + "/api/tags").json()["models"]}
    assert tags["sql"]["details"]["parent_model"] == "qwen" and tags["qwen"]["details"]["parent_model"] == ""


def test_an_adapter_request_reaches_vllm_as_the_adapter_and_is_priced_as_it(server, fake):
    client = OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
    for model, sent in (("sql", "sql-lora"), ("chat-lora", "chat-lora"), ("qwen", BASE)):
        fake.behaviour.requests.clear()
        answer = client.chat.completions.create(model=model, messages=CHAT, max_tokens=4)
        assert answer.choices[0].message.content
        assert [r["model"] for r in fake.behaviour.requests if r.get("path", "").startswith("/v1/")] == [sent]
    sql, chat = _row(server, "sql"), _row(server, "chat-lora")
    assert (sql.backend, chat.backend) == ("sql", "chat-lora")
    assert sql.total_cost_usd == pytest.approx((sql.input_tokens * 300 + sql.output_tokens * 900) / 1e6)
    assert chat.total_cost_usd == pytest.approx((chat.input_tokens * 100 + chat.output_tokens * 400) / 1e6)
    shown = CliRunner().invoke(app, ["cost", "--db", server.db_url, "--by", "model", "--since", "1h"])
    assert shown.exit_code == 0, shown.output
    keys = [line.split()[0] for line in shown.output.splitlines() if line.strip()]
    assert {"sql", "chat-lora", "qwen"} <= set(keys)


def test_lora_modules_are_for_openai_compatible_servers_and_unique(tmp_path):
    bad = tmp_path / "b.yaml"
    bad.write_text("backends:\n  - name: t\n    type: tgi\n    base_url: http://h:1\n    model: m\n"
                   "    lora_modules:\n      - name: x\n")
    with pytest.raises(ConfigError, match=r"b.yaml:\d+: backends\[0\].lora_modules: LoRA adapters are passed"):
        load_config(bad)
    bad.write_text("backends:\n  - name: v\n    type: vllm\n    base_url: http://h:1\n    model: m\n"
                   "    lora_modules:\n      - name: v\n")
    with pytest.raises(ConfigError, match=r"backends\[0\].lora_modules\[0\].name: duplicate name 'v'"):
        load_config(bad)
