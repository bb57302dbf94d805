"""The in-process tool-call path with scripted model output, for the formats a random-weight model
cannot be made to write (Hermes ``<tool_call>`` tags around JSON, text before a call).

:class:`ScriptedEngine` stands in for the model only: it is a local backend whose ``stream`` — wrapped by
the same ``@tool_calling`` as the llama.cpp and native engines — yields fixed text pieces, and whose
details are a real store model's (``qwen-tools``: Ollama's qwen2.5 template). The app is the real
``create_app`` served by uvicorn; the clients are the real ``openai`` and ``ollama`` ones.
"""

from __future__ import annotations

import json

import ollama
import openai
import pytest

from core.base import Chunk, Done, GenerationRequest, Health, Timings, Usage
from frontend.tools.local import tool_calling
from adapters.engines.store_models import model_details
from gateway.app import create_app
from core.settings import ServerSettings
from fakes.live import server_env
from tests.gateway.conftest import private_store
from fakes.behaviour import Behaviour
from fakes.runner import RunningServer
from tests.tools.conftest import ASK, TIME, WEATHER, install_tool_models

HERMES = ['Sure.\n<to', 'ol_call>\n{"name": "get_weather", ', '"arguments": {"city": "Paris"}}\n</tool_call>\n',
          '<tool_call>\n{"name": "get_time", "arguments": {"city": "Tokyo"}}\n</tool_call>']


class ScriptedEngine:
    """A local backend that answers every request with ``script`` (one chunk per piece)."""

    name = "scripted"
    can_stream = True
    supports_embeddings = False

    def __init__(self, store):
        self.store, self.script, self.requests = store, [], []

    def details(self, model: str):
        return model_details(self.store, model)

    @tool_calling(grammar=False)
    async def stream(self, request: GenerationRequest):
        self.requests.append(request)
        for piece in self.script:
            yield Chunk(piece)
        yield Done("stop", Usage(input_tokens=7, output_tokens=len(self.script)), Timings())

    async def load(self, model, options=None, keep_alive=None) -> None:
        self.details(model)

    async def health(self) -> Health:
        return Health(ok=True)

    async def list_models(self):
        return []

    async def loaded_models(self):
        return []

    async def unload(self, model: str) -> bool:
        return False

    async def aclose(self) -> None:
        pass


@pytest.fixture(scope="module")
def engine(tiny_store, tmp_path_factory):
    store = private_store(tiny_store, tmp_path_factory, "scripted-models")
    install_tool_models(store, tiny_store.root.parent / "tiny-qwen2.gguf")
    return ScriptedEngine(store)


@pytest.fixture(scope="module")
def url(engine, tmp_path_factory):
    settings = ServerSettings.from_env(server_env(tmp_path_factory.mktemp("scripted"), engine.store.root, 11434))
    with RunningServer("infer", create_app(settings, engine), Behaviour(), lifespan="on").start() as server:
        yield server.url


@pytest.fixture
def oai(url):
    return openai.OpenAI(base_url=url + "/v1", api_key="infer", max_retries=0, timeout=30)


def test_openai_stream_text_then_hermes_calls(engine, oai):
    engine.script = HERMES
    chunks = list(oai.chat.completions.create(model="qwen-tools", messages=ASK, tools=[WEATHER, TIME], stream=True))
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    deltas = [d for c in chunks for d in c.choices[0].delta.tool_calls or []]
    assert text == "Sure.\n"
    assert [(d.index, d.function.name, json.loads(d.function.arguments)) for d in deltas] == [
        (0, "get_weather", {"city": "Paris"}), (1, "get_time", {"city": "Tokyo"})]
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    assert engine.requests[-1].tools == [WEATHER, TIME]


def test_ollama_reply_carries_text_and_calls(engine, url):
    engine.script = HERMES
    reply = ollama.Client(host=url).chat(model="qwen-tools", messages=ASK, tools=[WEATHER, TIME], stream=False)
    assert reply.message.content == "Sure.\n"
    assert [(c.function.name, c.function.arguments) for c in reply.message.tool_calls] == [
        ("get_weather", {"city": "Paris"}), ("get_time", {"city": "Tokyo"})]


def test_text_without_a_call_passes_through_unchanged(engine, oai):
    engine.script = ["Use the <tool", "s> list: ", '{"a": 1}']
    reply = oai.chat.completions.create(model="qwen-tools", messages=ASK, tools=[WEATHER])
    assert reply.choices[0].message.content == 'Use the <tools> list: {"a": 1}'
    assert reply.choices[0].message.tool_calls is None and reply.choices[0].finish_reason == "stop"


def test_named_choice_renders_only_that_tool_and_none_renders_none(engine, oai):
    engine.script = ['<tool_call>{"name": "get_time", "arguments": {"city": "Paris"}}</tool_call>']
    named = {"type": "function", "function": {"name": "get_time"}}
    reply = oai.chat.completions.create(model="qwen-tools", messages=ASK, tools=[WEATHER, TIME], tool_choice=named)
    assert engine.requests[-1].tools == [TIME]
    assert reply.choices[0].message.tool_calls[0].function.name == "get_time"
    engine.script = ["just text"]
    oai.chat.completions.create(model="qwen-tools", messages=ASK, tools=[WEATHER], tool_choice="none")
    assert engine.requests[-1].tools is None


def test_required_without_grammar_and_no_call_is_a_500(engine, oai):
    engine.script = ["I would rather not."]
    with pytest.raises(openai.InternalServerError) as err:
        oai.chat.completions.create(model="qwen-tools", messages=ASK, tools=[WEATHER], tool_choice="required")
    assert err.value.body["message"] == ("tool_choice 'required': the model answered without a tool call: "
                                         "'I would rather not.'")


def test_the_ledger_row_of_an_answer_that_called_tools_says_tool_calls(engine, oai, url):
    import time

    import httpx

    def rows() -> list[dict]:
        return httpx.get(url + "/infer/requests", params={"since": "5m", "limit": 500}).json()["requests"]

    engine.script = HERMES
    reply = oai.chat.completions.create(model="qwen-tools", messages=ASK, tools=[WEATHER, TIME])
    assert reply.choices[0].finish_reason == "tool_calls"
    before = len(rows())  # the earlier tests' rows, and maybe this one's (the writer flushes every 50 ms)
    engine.script = ["just text"]
    oai.chat.completions.create(model="qwen-tools", messages=ASK, tools=[WEATHER])
    deadline = time.monotonic() + 5
    while True:  # until this test's two rows are both written (the older tests' rows are there already)
        found = rows()
        if (len(found) > before and found[0]["finish_reason"] == "stop" and len(found) >= 2
                and found[1]["finish_reason"] == "tool_calls") or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert [r["finish_reason"] for r in found[:2]] == ["stop", "tool_calls"]  # newest first
