"""Local adapter models through `infer serve` on the native engine: each is a model name in the Ollama,
OpenAI (chat and responses) and Anthropic APIs, listed with its parent; a base and its adapters share one
runner and its batches, and each answers as the model with its adapter merged in."""

from __future__ import annotations

import concurrent.futures

import httpx
import pytest

from registry.create import create_model
from registry.modelbuilder import PRESETS, LoraSpec, build_gguf, build_lora
from registry.modelbuilder.lora_out import build_merged_gguf
from registry.modelfile import parse_modelfile
from registry.names import parse_name
from registry.store import Store

from fakes.live import start_server, stop_server

SPEC = PRESETS["tiny-qwen2"]
GREEDY = "PARAMETER temperature 0\nPARAMETER num_predict 10\nPARAMETER num_ctx 256\n"
ADAPTERS = {"a1": LoraSpec(rank=8, alpha=8.0, seed=1), "a2": LoraSpec(rank=4, alpha=8.0, seed=2)}
ASK = "Say something."


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("lora-gateway")
    store = Store(root / "models")
    base = build_gguf(root / "base.gguf", SPEC, dtype="f32")
    create_model(store, parse_name("base"), parse_modelfile(f"FROM {base}\n{GREEDY}"), root)
    for name, lora in ADAPTERS.items():
        adapter = build_lora(root / f"{name}.gguf", SPEC, lora)
        create_model(store, parse_name(name), parse_modelfile(f"FROM base\nADAPTER {adapter}\n"), root)
        merged = build_merged_gguf(root / f"{name}-merged.gguf", SPEC, lora)
        create_model(store, parse_name(f"{name}-merged"), parse_modelfile(f"FROM {merged}\n{GREEDY}"), root)
    live = start_server(root, store.root, INFER_ENGINE="native")
    try:
        yield live
    finally:
        stop_server(live)


def _answer(url: str, api: str, model: str) -> str:
    messages = [{"role": "user", "content": ASK}]
    if api == "ollama":
        body = httpx.post(url + "/api/chat", json={"model": model, "messages": messages, "stream": False}, timeout=60)
        return body.json()["message"]["content"]
    if api == "openai":
        body = httpx.post(url + "/v1/chat/completions", json={"model": model, "messages": messages}, timeout=60)
        return body.json()["choices"][0]["message"]["content"]
    if api == "responses":
        body = httpx.post(url + "/v1/responses", json={"model": model, "input": ASK}, timeout=60)
        return body.json()["output"][0]["content"][0]["text"]
    body = httpx.post(url + "/v1/messages", json={"model": model, "messages": messages, "max_tokens": 10}, timeout=60)
    return body.json()["content"][0]["text"]


def test_adapter_models_are_listed_with_their_parent(server):
    models = {m["id"]: m for m in httpx.get(server.url + "/v1/models").json()["data"]}
    assert models["a1:latest"]["parent"] == "base:latest" and models["a2:latest"]["parent"] == "base:latest"
    assert "parent" not in models["base:latest"]
    tags = {m["name"]: m for m in httpx.get(server.url + "/api/tags").json()["models"]}
    assert tags["a1:latest"]["details"]["parent_model"] == "base:latest"


@pytest.mark.parametrize("api", ["openai", pytest.param("ollama", marks=pytest.mark.slow),
                                 pytest.param("responses", marks=pytest.mark.slow),
                                 pytest.param("anthropic", marks=pytest.mark.slow)])
def test_each_api_runs_the_adapter_as_the_merged_model(server, api):
    names = ["a1", "a2", "base", "a1", "a2", "base"]
    with concurrent.futures.ThreadPoolExecutor(len(names)) as pool:
        answers = list(pool.map(lambda n: _answer(server.url, api, n), names))
    expected = {n: _answer(server.url, api, f"{n}-merged") for n in ("a1", "a2")}
    assert answers[0] == answers[3] == expected["a1"] and answers[1] == answers[4] == expected["a2"]
    assert answers[2] == answers[5] and len({answers[0], answers[1], answers[2]}) == 3
    ours = ("a1:latest", "a2:latest", "base:latest")
    runners = [m for m in httpx.get(server.url + "/api/ps").json()["models"] if m["name"] in ours]
    assert len(runners) == 1  # the base and both adapters: one runner, one engine
