"""LiteLLM as the client of a live ``infer serve``: the ``ollama/``, ``ollama_chat/`` and ``openai/`` providers.

Each call, sync and async, streaming and not, must return text, and the usage LiteLLM hands its
caller must be the token counts ``infer serve`` wrote to its ledger for that request (one new row,
on the route the provider speaks to). LiteLLM's async HTTP client posts bodies without a JSON
Content-Type (``application/octet-stream`` to ``/api/chat``), which the server must accept as
Ollama does.
"""

from __future__ import annotations

import asyncio
import os
import time

import pytest

from ledger.db import open_db
from ledger.usage import recent
from tests.gateway.conftest import start_server, stop_server

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
