"""LiteLLM as the client of a live ``infer serve``: the ``ollama/``, ``ollama_chat/`` and ``openai/`` providers.

Each call, sync and async, streaming and not, must return text, and the usage LiteLLM hands its
caller must be the token counts ``infer serve`` wrote to its ledger for that request (one new row,
on the route the provider speaks to). LiteLLM's async HTTP client posts bodies without a JSON
Content-Type (``application/octet-stream`` to ``/api/chat``), which the server must accept as
Ollama does. LiteLLM's proxy in front of the server (slow; needs the proxy venv of
bench/gateway_overhead.py) sends the same bodies.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import time
from pathlib import Path

import httpx
import pytest
import yaml

from ledger.db import open_db
from ledger.usage import recent
from fakes.live import free_port, start_server, stop_server

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # offline: LiteLLM's bundled price map
litellm = pytest.importorskip("litellm", reason="LiteLLM is in the dev extra: pip install -e '.[dev]'")

MESSAGES = [{"role": "user", "content": "hello there"}]
pytestmark = [pytest.mark.filterwarnings("ignore:.*ReadOnly.*:UserWarning"),  # LiteLLM's own pydantic use
              pytest.mark.filterwarnings("ignore:Accessing the 'model_:DeprecationWarning")]

ROUTES = {"ollama": "/api/generate", "ollama_chat": "/api/chat", "openai": "/v1/chat/completions"}


@pytest.fixture(scope="module")
def server(tiny_store, tmp_path_factory):
    srv = start_server(tmp_path_factory.mktemp("litellm"), tiny_store.root)
    yield srv
    stop_server(srv)


@pytest.fixture(scope="module")
def ledger(server):
    db = open_db(server.db_url)
    yield db
    db.dispose()


def _kwargs(server, provider: str, stream: bool) -> dict:
    api_base = server.url + "/v1" if provider == "openai" else server.url
    kwargs = {"model": f"{provider}/tiny", "messages": MESSAGES, "api_base": api_base, "max_tokens": 8,
              "seed": 3, "stream": stream, "timeout": 60, "num_retries": 0}
    if provider == "openai":
        kwargs["api_key"] = "infer"
    if stream:  # LiteLLM hands usage to a streaming caller only when asked, whatever the provider
        kwargs["stream_options"] = {"include_usage": True}
    return kwargs


def _collect(response, stream: bool) -> tuple[str, object]:
    """(text, usage) from a response or the list of its stream chunks."""
    if not stream:
        return response.choices[0].message.content or "", response.usage
    response = list(response)
    text = "".join(c.choices[0].delta.content or "" for c in response if c.choices)
    usages = [getattr(c, "usage", None) for c in response]
    return text, next((u for u in reversed(usages) if u is not None), None)


async def _acall(kwargs: dict) -> tuple[str, object]:
    response = await litellm.acompletion(**kwargs)
    if kwargs["stream"]:
        response = [chunk async for chunk in response]
    return _collect(response, kwargs["stream"])


def _new_row(ledger, seen: set[str], timeout: float = 10.0):
    """The one ledger row written since ``seen`` (rows land just after the answer)."""
    deadline = time.monotonic() + timeout
    while True:
        rows = [r for r in recent(ledger, limit=50) if r.id not in seen]
        if rows or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    time.sleep(0.2)  # a second row, if one were (wrongly) written, lands by now
    rows = [r for r in recent(ledger, limit=50) if r.id not in seen]
    assert len(rows) == 1, [(r.route, r.status) for r in rows]
    return rows[0]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("provider", ["ollama", "ollama_chat", "openai"])
def test_litellm_completion_text_and_usage_match_the_ledger(server, ledger, provider, mode, stream):
    seen = {r.id for r in recent(ledger, limit=50)}
    kwargs = _kwargs(server, provider, stream)
    if mode == "sync":
        text, usage = _collect(litellm.completion(**kwargs), stream)
    else:
        text, usage = asyncio.run(_acall(kwargs))
    row = _new_row(ledger, seen)
    assert text.strip(), f"no text from {provider}/{mode}/stream={stream}"
    assert (row.route, row.model, row.stream, row.status) == (ROUTES[provider], "tiny", stream, "ok")
    assert row.input_tokens > 0 and 0 < row.output_tokens <= 8
    assert usage is not None, "LiteLLM returned no usage"
    assert (usage.prompt_tokens, usage.completion_tokens) == (row.input_tokens, row.output_tokens)
    assert usage.total_tokens == row.input_tokens + row.output_tokens


PROXY = Path(__file__).resolve().parents[2] / ".bench" / "litellm-venv" / "bin" / "litellm"
PROXY_KEY = "sk-test-litellm-proxy-0123456789abcdef"


@pytest.fixture(scope="module")
def litellm_proxy(server, tmp_path_factory):
    """LiteLLM's proxy (``litellm --config``) in front of the server, with ``ollama_chat/`` and ``ollama/`` entries.
    Its extras are heavy, so it lives in its own venv (``make litellm-proxy``, which .ci/run runs); skipped
    when that is not built, except in CI, where it fails."""
    if not PROXY.exists():
        if os.environ.get("CI"):  # .ci/run builds it (make litellm-proxy): missing there is a failure, not a skip
            pytest.fail(f"LiteLLM's proxy is not installed ({PROXY}): run make litellm-proxy")
        pytest.skip(f"LiteLLM's proxy is not installed ({PROXY}; make litellm-proxy installs it)")
    tmp = tmp_path_factory.mktemp("litellm-proxy")
    config = tmp / "config.yaml"
    config.write_text(yaml.safe_dump({"model_list": [
        {"model_name": "chat", "litellm_params": {"model": "ollama_chat/tiny", "api_base": server.url}},
        {"model_name": "generate", "litellm_params": {"model": "ollama/tiny", "api_base": server.url}}]}))
    port = free_port()
    env = {**os.environ, "LITELLM_MASTER_KEY": PROXY_KEY, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    with open(tmp / "proxy.log", "wb") as log:
        proc = subprocess.Popen([str(PROXY), "--config", str(config), "--host", "127.0.0.1", "--port", str(port)],
                                env=env, cwd=tmp, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while proc.poll() is None and time.monotonic() < deadline:
            try:
                if httpx.get(url + "/health/liveliness", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.5)
        else:
            pytest.fail(f"LiteLLM's proxy did not start:\n{(tmp / 'proxy.log').read_text(errors='replace')[-3000:]}")
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.mark.slow
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("entry,route", [("chat", "/api/chat"), ("generate", "/api/generate")])
def test_litellm_proxy_in_front_of_infer(litellm_proxy, ledger, entry, route, stream):
    seen = {r.id for r in recent(ledger, limit=50)}
    body = {"model": entry, "messages": MESSAGES, "max_tokens": 8, "stream": stream}
    if stream:
        body["stream_options"] = {"include_usage": True}
    resp = httpx.post(litellm_proxy + "/v1/chat/completions", json=body, timeout=120,
                      headers={"Authorization": f"Bearer {PROXY_KEY}"})
    assert resp.status_code == 200, resp.text
    if stream:
        events = [json.loads(line[5:]) for line in resp.text.splitlines()
                  if line.startswith("data:") and line[5:].strip() != "[DONE]"]
        text = "".join(c["delta"].get("content") or "" for e in events for c in e["choices"])
        usage = next(e["usage"] for e in reversed(events) if e.get("usage"))
    else:
        text, usage = resp.json()["choices"][0]["message"]["content"], resp.json()["usage"]
    row = _new_row(ledger, seen)
    assert text.strip() and (row.route, row.stream, row.status) == (route, stream, "ok")
    assert (usage["prompt_tokens"], usage["completion_tokens"]) == (row.input_tokens, row.output_tokens)
