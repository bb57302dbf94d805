"""Token-id inputs, as vLLM and OpenAI take them: ``/v1/embeddings`` ``input`` and ``/v1/completions``
``prompt`` as ``[int]`` or ``[[int]]``, on the in-process engines and through an OpenAI-compatible
remote (another ``infer serve``); LangChain's default ``OpenAIEmbeddings`` request shape."""

from __future__ import annotations

import json

import httpx
import llama_cpp
import pytest
import yaml

from registry.details import load_details
from fakes.live import start_server, stop_server


@pytest.fixture(scope="module")
def upstream(tiny_store, tmp_path_factory):
    server = start_server(tmp_path_factory.mktemp("tokens-up"), tiny_store.root)
    yield server
    stop_server(server)


@pytest.fixture(scope="module")
def front(upstream, tiny_store, tmp_path_factory):
    """An infer serve whose ``tiny-oai`` is the upstream as an OpenAI backend and ``tiny-ollama`` as Ollama."""
    tmp = tmp_path_factory.mktemp("tokens-front")
    config = tmp / "backends.yaml"
    config.write_text(yaml.safe_dump({"backends": [
        {"name": "tiny-oai", "type": "openai", "base_url": upstream.url, "model": "tiny"},
        {"name": "tiny-ollama", "type": "ollama", "base_url": upstream.url, "model": "tiny"}]}))
    server = start_server(tmp, tiny_store.root, INFER_CONFIG=str(config))
    yield server
    stop_server(server)


@pytest.fixture(scope="module")
def vocab(tiny_store):
    details = load_details(tiny_store, tiny_store.resolve("tiny"))
    return llama_cpp.Llama(str(details.model_path), vocab_only=True, verbose=False)


def ids(vocab, text: str) -> list[int]:
    return vocab.tokenize(text.encode(), add_bos=False, special=False)


def embed(url: str, model: str, value) -> httpx.Response:
    return httpx.post(url + "/v1/embeddings", json={"model": model, "input": value}, timeout=60)


def test_embedding_token_ids_give_the_texts_vectors(upstream, vocab):
    text = embed(upstream.url, "tiny", ["hello world", "bye"]).json()["data"]
    one = embed(upstream.url, "tiny", ids(vocab, "hello world"))
    assert one.status_code == 200, one.text
    assert [d["index"] for d in one.json()["data"]] == [0]
    assert one.json()["data"][0]["embedding"] == pytest.approx(text[0]["embedding"], abs=1e-5)
    two = embed(upstream.url, "tiny", [ids(vocab, "hello world"), ids(vocab, "bye")]).json()["data"]
    assert [d["embedding"] for d in two] == [pytest.approx(d["embedding"], abs=1e-5) for d in text]


@pytest.mark.parametrize("value,message", [
    ([[1, 2], "x"], "mixes texts and token lists"), ([1, -2], "must be a string"), ([[]], "must not contain empty"),
    ([[1, 99999]], "not in the model's vocabulary of 1024 tokens")])
def test_bad_token_inputs_are_400(upstream, value, message):
    r = embed(upstream.url, "tiny", value)
    assert r.status_code == 400 and message in r.json()["error"]["message"], r.text
    assert r.json()["error"]["param"] == "input"


@pytest.mark.parametrize("engine", ["llamacpp", "native"])
def test_completion_token_ids_go_to_the_engine_as_they_are(upstream, vocab, engine):
    prompt = ids(vocab, "Once upon a time")
    body = {"model": "tiny", "max_tokens": 4, "temperature": 0, "seed": 1, "engine": engine}
    r = httpx.post(upstream.url + "/v1/completions", json={**body, "prompt": prompt}, timeout=120)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["prompt_tokens"] == len(prompt)  # not re-tokenized, no template, no BOS added
    two = httpx.post(upstream.url + "/v1/completions", json={**body, "prompt": [prompt, prompt[:2]]}, timeout=120)
    assert [c["index"] for c in two.json()["choices"]] == [0, 1]
    assert two.json()["usage"]["prompt_tokens"] == len(prompt) + 2
    bad = httpx.post(upstream.url + "/v1/completions", json={**body, "prompt": [5, 123456]}, timeout=60)
    assert bad.status_code == 400 and "123456" in bad.json()["error"]["message"]


def test_token_ids_pass_through_an_openai_backend(upstream, front, vocab):
    prompt = ids(vocab, "Once upon a time")
    body = {"max_tokens": 4, "temperature": 0, "seed": 1, "prompt": prompt}
    direct = httpx.post(upstream.url + "/v1/completions", json={**body, "model": "tiny"}, timeout=60).json()
    proxied = httpx.post(front.url + "/v1/completions", json={**body, "model": "tiny-oai"}, timeout=60).json()
    assert proxied["choices"][0]["text"] == direct["choices"][0]["text"]
    assert proxied["usage"]["prompt_tokens"] == len(prompt)  # the upstream's count of the ids it got
    vectors = embed(front.url, "tiny-oai", [prompt]).json()["data"]
    direct_vectors = embed(upstream.url, "tiny", [prompt]).json()["data"]
    assert vectors[0]["embedding"] == pytest.approx(direct_vectors[0]["embedding"])


def test_an_ollama_backend_refuses_token_ids_with_a_clear_400(front, vocab):
    r = httpx.post(front.url + "/v1/completions", json={"model": "tiny-ollama", "prompt": [1, 2, 3]}, timeout=60)
    assert r.status_code == 400
    assert r.json()["error"]["message"] == ("the ollama backend takes prompts as text, not token ids; send the "
                                            "prompt as text")
    r = embed(front.url, "tiny-ollama", [[1, 2, 3]])
    assert r.status_code == 400 and "not token ids" in r.json()["error"]["message"]


def test_langchain_openai_embeddings_default_request(upstream, monkeypatch):
    """LangChain's ``OpenAIEmbeddings`` tokenizes with tiktoken and sends token-id arrays. tiktoken's
    vocabularies are downloaded on first use; offline, a byte-level encoding stands in under the name
    LangChain asks for (``cl100k_base``), so the request is LangChain's own, token arrays included."""
    import tiktoken
    import tiktoken.registry
    from langchain_openai import OpenAIEmbeddings

    ranks = {bytes([b]): b for b in range(256)}
    byte_level = tiktoken.Encoding("cl100k_base", pat_str=r"[\s\S]", mergeable_ranks=ranks, special_tokens={})
    monkeypatch.setitem(tiktoken.registry.ENCODINGS, "cl100k_base", byte_level)
    sent: list[dict] = []
    hooks = {"request": [lambda request: sent.append(json.loads(request.read()))]}
    client = httpx.Client(event_hooks=hooks)
    embeddings = OpenAIEmbeddings(model="tiny", base_url=upstream.url + "/v1", api_key="infer", http_client=client,
                                  max_retries=0)
    vectors = embeddings.embed_documents(["hello world", "bye"])
    assert sent and sent[0]["input"] == [list(b"hello world"), list(b"bye")]  # token arrays on the wire
    direct = embed(upstream.url, "tiny", [list(b"hello world"), list(b"bye")]).json()["data"]
    assert len(vectors) == 2 and vectors[0] == pytest.approx(direct[0]["embedding"], abs=1e-5)
    assert embeddings.embed_query("hello world") == pytest.approx(vectors[0], abs=1e-5)
