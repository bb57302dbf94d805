"""A real backend: llama-cpp-python's OpenAI-compatible server, put behind ``infer serve`` through
the vLLM, llama.cpp and generic OpenAI adapters. The official ``openai`` client gets the same text
and usage through the gateway as from the server directly."""

from __future__ import annotations

import time

import pytest
import sqlalchemy as sa
from openai import OpenAI

TYPES = ("vllm", "llamacpp", "openai")
CHAT = [{"role": "user", "content": "Say something short."}]


@pytest.fixture(scope="module")
def gateway(llama_server, gateway_for):
    return gateway_for([{"name": f"via-{kind}", "type": kind, "base_url": llama_server.url + "/v1",
                         "model": llama_server.model, "tokenizer": str(llama_server.gguf)} for kind in TYPES])


def clients(llama_server, gateway) -> tuple[OpenAI, OpenAI]:
    direct = OpenAI(base_url=llama_server.url + "/v1", api_key="none", max_retries=0)
    return direct, OpenAI(base_url=gateway.url + "/v1", api_key="none", max_retries=0)


def ledger_row(gateway, **match):
    """The newest ledger row whose columns equal ``match`` (waiting for the background write)."""
    engine = sa.create_engine(gateway.db_url)
    deadline = time.monotonic() + 5
    try:
        while True:
            with engine.connect() as conn:
                rows = conn.execute(sa.text("select * from requests order by id")).mappings().all()
            found = [r for r in rows if all(r[k] == v for k, v in match.items())]
            if found or time.monotonic() > deadline:
                return found[-1] if found else None
            time.sleep(0.05)
    finally:
        engine.dispose()


@pytest.mark.parametrize("kind", TYPES)
def test_chat_matches_the_server_called_directly(llama_server, gateway, kind):
    direct, proxied = clients(llama_server, gateway)
    args = dict(messages=CHAT, max_tokens=8, temperature=0, seed=7)
    want = direct.chat.completions.create(model=llama_server.model, **args)
    got = proxied.chat.completions.create(model=f"via-{kind}", **args)
    assert got.choices[0].message.content == want.choices[0].message.content
    assert got.choices[0].finish_reason == want.choices[0].finish_reason
    assert (got.usage.prompt_tokens, got.usage.completion_tokens) == (want.usage.prompt_tokens,
                                                                      want.usage.completion_tokens)
    assert got.model == f"via-{kind}"


@pytest.mark.parametrize("kind", TYPES)
def test_completion_matches_the_server_called_directly(llama_server, gateway, kind):
    direct, proxied = clients(llama_server, gateway)
    want = direct.completions.create(model=llama_server.model, prompt="Once upon a time", max_tokens=6, temperature=0)
    got = proxied.completions.create(model=f"via-{kind}", prompt="Once upon a time", max_tokens=6, temperature=0)
    assert got.choices[0].text == want.choices[0].text
    assert (got.usage.prompt_tokens, got.usage.completion_tokens) == (want.usage.prompt_tokens,
                                                                      want.usage.completion_tokens)


@pytest.mark.parametrize("kind", TYPES)
def test_streamed_text_matches_and_usage_is_estimated_when_the_server_reports_none(llama_server, gateway, kind):
    direct, proxied = clients(llama_server, gateway)
    args = dict(messages=CHAT, max_tokens=8, temperature=0, seed=7, stream=True)
    want = "".join(c.choices[0].delta.content or "" for c in
                   direct.chat.completions.create(model=llama_server.model, **args) if c.choices)
    chunks = list(proxied.chat.completions.create(model=f"via-{kind}", stream_options={"include_usage": True}, **args))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == want
    usage = chunks[-1].usage
    assert usage.completion_tokens > 0 and usage.prompt_tokens > 0  # never zero for a stream that produced text
    row = ledger_row(gateway, model=f"via-{kind}", stream=True, status="ok")
    assert row["backend"] == f"via-{kind}"  # the config name of the backend that served it
    assert row["usage_source"] == "estimated"  # llama-cpp-python's stream carries no usage
    assert (row["input_tokens"], row["output_tokens"]) == (usage.prompt_tokens, usage.completion_tokens)


def test_ignore_eos_generates_exactly_max_tokens_as_min_tokens_does_on_the_server(llama_server, gateway):
    """vLLM's ``ignore_eos`` (sent by benchmarks) reaches llama-cpp-python's server as ``min_tokens``."""
    direct, proxied = clients(llama_server, gateway)
    prompt, n = "The end.", 24
    plain = direct.completions.create(model=llama_server.model, prompt=prompt, max_tokens=n, temperature=0)
    assert plain.usage.completion_tokens < n  # this prompt ends early on its own
    want = direct.completions.create(model=llama_server.model, prompt=prompt, max_tokens=n, temperature=0,
                                     extra_body={"min_tokens": n})
    got = proxied.completions.create(model="via-llamacpp", prompt=prompt, max_tokens=n, temperature=0,
                                     extra_body={"ignore_eos": True})
    assert want.usage.completion_tokens == n
    assert got.choices[0].text == want.choices[0].text
    assert got.usage.completion_tokens == n and got.choices[0].finish_reason == "length"


def test_models_are_listed_next_to_the_store(gateway):
    proxied = OpenAI(base_url=gateway.url + "/v1", api_key="none")
    listed = {m.id: m.owned_by for m in proxied.models.list()}
    assert {f"via-{k}": k for k in TYPES}.items() <= listed.items()
    assert "tiny:latest" in listed  # the local store's models stay served


def test_a_backend_failure_is_a_502_naming_the_backend_and_its_message(llama_server, gateway):
    """This server was started without embeddings: its 500 reaches the client as a 502 with its words."""
    import openai

    _, proxied = clients(llama_server, gateway)
    with pytest.raises(openai.InternalServerError) as caught:
        proxied.embeddings.create(model="via-openai", input=["hello"])
    assert caught.value.status_code == 502
    assert "openai backend 'via-openai'" in caught.value.message and "embedding=True" in caught.value.message
    assert "embedding=True" in ledger_row(gateway, model="via-openai", route="/v1/embeddings", status="error")["error"]
