"""``infer compare`` against servers over HTTP on 127.0.0.1: a live ``infer serve`` (its OpenAI API
with token-id prompts, its Ollama API with raw text), llama.cpp's own server (llama-cpp-python's,
text only), a server as A, and vLLM's ``prompt_logprobs`` (one request per answer)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from cli.main import app
from tests.accuracy.vllm_scoring import VLLMScoring
from fakes.live import start_server, stop_server
from tests.remote.conftest import tiny_gguf

runner = CliRunner()


@pytest.fixture(scope="module")
def serve(tiny_store, tmp_path_factory):
    server = start_server(tmp_path_factory.mktemp("compare-serve"), tiny_store.root)
    yield server
    stop_server(server)


@pytest.fixture
def models(tiny_store, monkeypatch):
    monkeypatch.setenv("INFER_MODELS", str(tiny_store.root))


def compare(*args: str) -> dict:
    result = runner.invoke(app, ["compare", *args, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)["relative"]


def test_infer_serve_openai_api_with_token_ids_matches_in_process_llamacpp(models, serve):
    relative = compare("--a", "tiny@llamacpp", "--b", f"{serve.url}#tiny", "--max-tokens", "12")
    summary = relative["summary"]
    assert relative["method"] == "top-k"  # a server reports its top-k only
    assert summary["positions_compared"] == summary["positions"] > 50  # token ids: every position
    assert summary["kl"]["max"] < 1e-9 and summary["same_top"] == 1.0  # the same llama.cpp, over HTTP


def test_infer_serve_ollama_api_with_raw_text(models, serve):
    summary = compare("--a", "tiny@llamacpp", "--b", f"{serve.url}/api#tiny", "--max-tokens", "12")["summary"]
    # text is re-tokenized by the server: only the positions where A's tokens survive that are scored
    assert 0 < summary["positions_compared"] <= summary["positions"]
    assert summary["kl"]["max"] < 1e-9 and summary["same_top"] == 1.0


def test_a_server_as_a_and_an_engine_as_b(models, serve):
    relative = compare("--a", f"{serve.url}/api#tiny", "--b", "tiny@native", "--max-tokens", "12")
    summary = relative["summary"]
    # A's tokens come back with their bytes (Ollama's logprobs), which name ids in B's vocabulary
    assert summary["positions_compared"] == summary["positions"] > 50
    assert summary["kl"]["max"] < 1e-6 and summary["same_top"] == 1.0


def test_llama_cpp_server(models, llama_server):
    summary = compare("--a", "tiny@llamacpp", "--b", f"{llama_server.url}#{llama_server.model}",
                      "--max-tokens", "12")["summary"]
    assert summary["positions_compared"] > 0
    assert summary["same_top"] == 1.0 and summary["kl"]["median"] < 1e-9


def test_vllm_prompt_logprobs_scores_an_answer_in_one_request(models, tiny_store):
    with VLLMScoring(tiny_gguf(tiny_store)) as vllm:
        relative = compare("--a", "tiny@native", "--b", f"{vllm.url}#tiny", "--max-tokens", "12")
    summary = relative["summary"]
    assert len(vllm.bodies) == summary["prompts"] == 8
    assert all(isinstance(b["prompt"], list) and b["prompt_logprobs"] == 20 for b in vllm.bodies)
    assert summary["positions_compared"] == summary["positions"] and summary["kl"]["max"] < 1e-9
    assert summary["same_top"] == 1.0
