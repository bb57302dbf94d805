"""A gateway in front of a gateway: ``infer serve`` B lists ``infer serve`` A as a ``type: ollama``
backend. Clients of B get what A gives them directly: same text, same usage (A reports it in its
final NDJSON line), and B's ledger says the tokens came from the backend."""

from __future__ import annotations

import httpx
import ollama
import pytest
from openai import OpenAI

from fakes.live import start_server, stop_server
from tests.remote.test_llamacpp_server import ledger_row

CHAT = [{"role": "user", "content": "Tell me a story."}]


@pytest.fixture(scope="module")
def upstream(tiny_store, tmp_path_factory):
    server = start_server(tmp_path_factory.mktemp("upstream"), tiny_store.root)
    try:
        yield server
    finally:
        stop_server(server)


@pytest.fixture(scope="module")
def front(upstream, gateway_for):
    return gateway_for([{"name": "tiny-remote", "type": "ollama", "base_url": upstream.url, "model": "tiny"}])


def test_openai_client_gets_the_same_text_and_usage(upstream, front):
    args = dict(messages=CHAT, max_tokens=12, temperature=0, seed=3)
    want = OpenAI(base_url=upstream.url + "/v1", api_key="x").chat.completions.create(model="tiny", **args)
    got = OpenAI(base_url=front.url + "/v1", api_key="x").chat.completions.create(model="tiny-remote", **args)
    assert got.choices[0].message.content == want.choices[0].message.content
    assert got.choices[0].finish_reason == want.choices[0].finish_reason
    assert (got.usage.prompt_tokens, got.usage.completion_tokens) == (want.usage.prompt_tokens,
                                                                      want.usage.completion_tokens)


def test_streams_match_including_usage(upstream, front):
    args = dict(messages=CHAT, max_tokens=12, temperature=0, seed=3, stream=True,
                stream_options={"include_usage": True})

    def run(url: str, model: str):
        chunks = list(OpenAI(base_url=url + "/v1", api_key="x").chat.completions.create(model=model, **args))
        return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices), chunks[-1].usage

    (want_text, want_usage), (got_text, got_usage) = run(upstream.url, "tiny"), run(front.url, "tiny-remote")
    assert got_text == want_text
    # (Ollama's wire format has no cached-token count, so only these two travel.)
    assert (got_usage.prompt_tokens, got_usage.completion_tokens) == (want_usage.prompt_tokens,
                                                                      want_usage.completion_tokens)
    row = ledger_row(front, model="tiny-remote", stream=True, status="ok")
    assert row["backend"] == "tiny-remote" and row["usage_source"] == "backend"
    assert row["output_tokens"] == want_usage.completion_tokens


def test_ollama_client_chat_and_generate_through_the_front(upstream, front):
    client = ollama.Client(host=front.url)
    options = {"temperature": 0, "num_predict": 8, "seed": 1}
    direct = ollama.Client(host=upstream.url).chat(model="tiny", messages=CHAT, options=options)
    proxied = client.chat(model="tiny-remote", messages=CHAT, options=options)
    assert proxied.message.content == direct.message.content
    assert (proxied.prompt_eval_count, proxied.eval_count) == (direct.prompt_eval_count, direct.eval_count)
    streamed = "".join(p.response for p in client.generate(model="tiny-remote", prompt="Hi", options=options,
                                                           stream=True))
    assert streamed == ollama.Client(host=upstream.url).generate(model="tiny", prompt="Hi", options=options).response
    assert "tiny-remote" in [m.model for m in client.list().models]


def test_keep_alive_passes_through_to_the_backend(upstream, front):
    ollama.Client(host=front.url).generate(model="tiny-remote", prompt="Hi", options={"num_predict": 2},
                                           keep_alive="10m")
    assert [m["name"] for m in httpx.get(upstream.url + "/api/ps").json()["models"]] == ["tiny:latest"]
    ollama.Client(host=front.url).generate(model="tiny-remote", prompt="Hi", options={"num_predict": 2},
                                           keep_alive=0)
    assert httpx.get(upstream.url + "/api/ps").json()["models"] == []


def test_unknown_backend_model_is_a_clear_502(upstream, gateway_for):
    front = gateway_for([{"name": "ghost", "type": "ollama", "base_url": upstream.url, "model": "no-such-model"}])
    reply = httpx.post(front.url + "/api/generate", json={"model": "ghost", "prompt": "Hi", "stream": False})
    assert reply.status_code == 502
    assert "ollama backend 'ghost'" in reply.json()["error"] and "no-such-model" in reply.json()["error"]
