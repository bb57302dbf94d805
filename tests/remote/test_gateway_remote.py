"""``infer serve`` fronting each fake backend: what clients of the gateway see.

The official ``openai`` client gets the backend's text and usage (compared with calling the
backend directly where it speaks OpenAI itself); a backend failing mid-stream ends the client's
stream with an error event in the API's own format and still leaves a ledger row with the tokens
sent; an overloaded backend's Retry-After reaches the client; a client that hangs up makes the
gateway hang up on the backend.
"""

from __future__ import annotations

import json

import httpx
import pytest
from openai import OpenAI

from adapters.remote.base import RemoteSettings
from adapters.remote.registry import create_remote
from gateway.serving.router import Router
from gateway.app import create_app
from core.settings import ServerSettings
from fakes.live import server_env
from fakes import FakeEngine, RunningServer, start_server
from tests.remote.test_llamacpp_server import ledger_row

# public name -> (adapter type, fake server, mode)
ROUTES = {"via-vllm": ("vllm", "vllm", None), "via-tgi": ("tgi", "tgi", None),
          "via-tgi-messages": ("tgi", "tgi", "messages"), "via-trtllm": ("trtllm", "trtllm", None),
          "via-triton": ("triton", "triton", None)}
CHAT = [{"role": "user", "content": "name four letters"}]
PROMPT = "name four letters"


class Gateway:
    def __init__(self, url: str, db_url: str, fakes: dict):
        self.url, self.db_url, self.fakes = url, db_url, fakes

    def fake(self, public: str):
        return self.fakes[ROUTES[public][1]]


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("front")
    fakes = {kind: start_server(kind) for kind in ("vllm", "tgi", "trtllm", "triton")}
    remotes = {name: create_remote(RemoteSettings(name=name, type=kind, base_url=fakes[server].url, mode=mode,
                                                  model=fakes[server].behaviour.models[0]))
               for name, (kind, server, mode) in ROUTES.items()}
    settings = ServerSettings.from_env(server_env(tmp / "home", tmp / "models", 0))
    app = create_app(settings, backend=Router(None, remotes))
    front = RunningServer("gateway", app, fakes["vllm"].behaviour, lifespan="on").start()
    try:
        yield Gateway(front.url, settings.database_url, fakes)
    finally:
        front.stop()
        for fake in fakes.values():
            fake.stop()


@pytest.fixture(autouse=True)
def clean(gateway):
    for fake in gateway.fakes.values():
        fake.behaviour.reset()


def client(gateway) -> OpenAI:
    return OpenAI(base_url=gateway.url + "/v1", api_key="none", max_retries=0)


@pytest.mark.parametrize("public", ROUTES)
def test_openai_client_gets_the_backends_text_and_usage(gateway, public):
    args = dict(max_tokens=5, temperature=0)
    if public == "via-tgi-messages":  # TGI's Messages API renders the chat itself
        got = client(gateway).chat.completions.create(model=public, messages=CHAT, **args)
        text, usage = got.choices[0].message.content, got.usage
        want_text, want_prompt = FakeEngine.expected_text(CHAT, 5), FakeEngine.prompt_tokens(CHAT)
    else:
        got = client(gateway).completions.create(model=public, prompt=PROMPT, **args)
        text, usage = got.choices[0].text, got.usage
        want_text, want_prompt = FakeEngine.expected_text(PROMPT, 5), FakeEngine.prompt_tokens(PROMPT)
    assert text == want_text
    assert (usage.prompt_tokens, usage.completion_tokens) == (want_prompt, 5)


@pytest.mark.parametrize("public", ["via-vllm", "via-trtllm"])
def test_openai_servers_match_a_direct_call(gateway, public):
    fake = gateway.fake(public)
    direct = OpenAI(base_url=fake.url + "/v1", api_key="none").chat.completions.create(
        model=fake.behaviour.models[0], messages=CHAT, max_tokens=7, temperature=0)
    proxied = client(gateway).chat.completions.create(model=public, messages=CHAT, max_tokens=7, temperature=0)
    assert proxied.choices[0].message.content == direct.choices[0].message.content
    assert (proxied.usage.prompt_tokens, proxied.usage.completion_tokens) == (direct.usage.prompt_tokens,
                                                                              direct.usage.completion_tokens)
    streamed = list(client(gateway).chat.completions.create(model=public, messages=CHAT, max_tokens=7, temperature=0,
                                                            stream=True, stream_options={"include_usage": True}))
    assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == direct.choices[0].message.content
    assert streamed[-1].usage.completion_tokens == direct.usage.completion_tokens


@pytest.mark.parametrize("public", ["via-vllm", "via-tgi", "via-triton"])
def test_mid_stream_failure_is_an_sse_error_event_and_a_ledger_row(gateway, public):
    gateway.fake(public).behaviour.fail_after = 2
    body = {"model": public, "prompt": PROMPT, "max_tokens": 8, "stream": True}
    with httpx.stream("POST", gateway.url + "/v1/completions", json=body, timeout=10) as reply:
        assert reply.status_code == 200
        events = [line[len("data: "):] for line in reply.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    error = json.loads(events[-2])["error"]
    assert error["type"] == "api_error" and f"backend '{public}'" in error["message"]
    assert sum(1 for e in events[:-2] if json.loads(e)["choices"][0]["text"]) == 2
    row = ledger_row(gateway, model=public, status="error", route="/v1/completions")
    assert row["output_tokens"] > 0 and row["error"] == error["message"]


def test_mid_stream_failure_on_the_ollama_api_is_an_error_line(gateway):
    gateway.fake("via-tgi").behaviour.fail_after = 2
    body = {"model": "via-tgi", "prompt": PROMPT, "options": {"num_predict": 8}}
    with httpx.stream("POST", gateway.url + "/api/generate", json=body, timeout=10) as reply:
        lines = [json.loads(line) for line in reply.iter_lines() if line]
    assert [line["response"] for line in lines[:-1]] == [w for _, w in FakeEngine.generate(PROMPT, 2)]
    assert set(lines[-1]) == {"error"} and "backend 'via-tgi'" in lines[-1]["error"]


def test_overload_reaches_the_client_with_retry_after(gateway):
    gateway.fake("via-vllm").behaviour.fail_status, gateway.fake("via-vllm").behaviour.retry_after = 429, "4"
    reply = httpx.post(gateway.url + "/v1/completions", json={"model": "via-vllm", "prompt": PROMPT, "max_tokens": 2})
    assert reply.status_code == 429 and reply.headers["retry-after"] == "4"
    assert reply.json()["error"]["type"] == "rate_limit_error"


def test_bad_request_keeps_the_backends_message(gateway):
    gateway.fake("via-tgi").behaviour.fail_status = 422
    gateway.fake("via-tgi").behaviour.fail_message = "`top_p` must be > 0.0 and < 1.0"
    reply = httpx.post(gateway.url + "/api/generate", json={"model": "via-tgi", "prompt": PROMPT, "stream": False})
    assert reply.status_code == 400 and "`top_p` must be > 0.0 and < 1.0" in reply.json()["error"]


@pytest.mark.parametrize("public", ["via-vllm", "via-triton"])
def test_client_hang_up_reaches_the_backend(gateway, public):
    fake = gateway.fake(public)
    fake.behaviour.token_delay = 0.05
    body = {"model": public, "prompt": PROMPT, "max_tokens": 200, "stream": True}
    with httpx.stream("POST", gateway.url + "/v1/completions", json=body, timeout=10) as reply:
        for n, _ in enumerate(line for line in reply.iter_lines() if line.startswith("data: ")):
            if n == 2:
                break
    assert fake.behaviour.wait_for(lambda b: b.disconnects == 1, timeout=5.0)
    row = ledger_row(gateway, model=public, status="cancelled")
    assert 0 < row["output_tokens"] < 200


def test_remote_models_are_listed_on_both_apis(gateway):
    assert {m.id: m.owned_by for m in client(gateway).models.list()} == {
        name: kind for name, (kind, _, _) in ROUTES.items()}
    tags = httpx.get(gateway.url + "/api/tags").json()["models"]
    assert sorted(m["name"] for m in tags) == sorted(ROUTES)
    shown = httpx.post(gateway.url + "/api/show", json={"model": "via-tgi"}).json()
    assert shown["details"]["format"] == "tgi"
