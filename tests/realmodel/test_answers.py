"""Real answers from SmolLM2 through `infer serve`, on both APIs and both in-process engines:
greedy "What is the capital of France?" says Paris on the native engine, and the llama.cpp engine
answers exactly as llama-cpp-python itself does with the same file and the same greedy settings."""

from __future__ import annotations

import httpx
import openai
import pytest

from .conftest import MODEL, QUESTION

pytestmark = pytest.mark.realmodel
MAX_TOKENS = 32


def openai_answer(server) -> str:
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="infer", max_retries=0, timeout=120)
    out = client.chat.completions.create(model=MODEL, messages=QUESTION, temperature=0, max_tokens=MAX_TOKENS)
    return out.choices[0].message.content


def ollama_answer(server) -> str:
    body = {"model": MODEL, "messages": QUESTION, "stream": False,
            "options": {"temperature": 0, "num_predict": MAX_TOKENS}}
    resp = httpx.post(server.url + "/api/chat", json=body, timeout=120)
    assert resp.status_code == 200, resp.text
    return resp.json()["message"]["content"]


@pytest.fixture(scope="module")
def llama_cpp_answer(smollm2_gguf) -> str:
    """llama-cpp-python called directly: its own chat handler (the GGUF's template), greedy."""
    llama_cpp = pytest.importorskip("llama_cpp")
    llm = llama_cpp.Llama(str(smollm2_gguf), n_ctx=2048, verbose=False)
    try:
        out = llm.create_chat_completion(QUESTION, temperature=0, max_tokens=MAX_TOKENS)
        return out["choices"][0]["message"]["content"]
    finally:
        llm.close()


def test_native_engine_says_paris_on_both_apis(native_server):
    answer = openai_answer(native_server)
    assert "Paris" in answer
    assert ollama_answer(native_server) == answer


def test_llamacpp_engine_answers_as_llama_cpp_python_on_both_apis(llamacpp_server, llama_cpp_answer):
    assert openai_answer(llamacpp_server) == llama_cpp_answer
    assert ollama_answer(llamacpp_server) == llama_cpp_answer
