"""Tools through remote backends, both directions, with the real clients: what reaches a vLLM-style
and an Ollama backend (tools, tool_choice, the history's calls and results in that backend's wire form),
and how their tool calls come back to an OpenAI or an Ollama client (translated when the APIs differ).
"""

from __future__ import annotations

import json

import ollama
import openai
import pytest
import yaml

from fakes.live import start_server, stop_server
from fakes.behaviour import Behaviour
from fakes.runner import RunningServer
from tests.tools.conftest import ASK, TIME, WEATHER
from tests.tools.fake_backends import ARGUMENTS, CALL_ID, ollama_app, openai_app

NAMED = {"type": "function", "function": {"name": "get_weather"}}
OPENAI_HISTORY = [*ASK, {"role": "assistant", "content": None, "tool_calls": [
    {"id": "call_9", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Tokyo"}'}}]},
    {"role": "tool", "tool_call_id": "call_9", "content": "18 C"}]


@pytest.fixture(scope="module")
def fakes():
    seen = {"vllm": [], "ollama": []}
    with RunningServer("vllm", openai_app(seen["vllm"]), Behaviour()).start() as vllm, \
            RunningServer("ollama", ollama_app(seen["ollama"]), Behaviour()).start() as upstream:
        yield {"vllm": vllm.url, "ollama": upstream.url, "seen": seen}


@pytest.fixture(scope="module")
def gateway(fakes, tiny_store, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("tools-remote")
    config = tmp / "backends.yaml"
    config.write_text(yaml.safe_dump({"backends": [
        {"name": "vllm-tools", "type": "vllm", "base_url": fakes["vllm"], "model": "qwen2.5"},
        {"name": "ollama-tools", "type": "ollama", "base_url": fakes["ollama"], "model": "llama3.1"}]}))
    server = start_server(tmp, tiny_store.root, INFER_CONFIG=str(config))
    try:
        yield server
    finally:
        stop_server(server)


@pytest.fixture(scope="module")
def oai(gateway):
    return openai.OpenAI(base_url=gateway.url + "/v1", api_key="infer", max_retries=0, timeout=30)


@pytest.fixture(scope="module")
def oll(gateway):
    return ollama.Client(host=gateway.url, timeout=30)


def test_openai_client_to_vllm_passes_everything_through(oai, fakes):
    reply = oai.chat.completions.create(model="vllm-tools", messages=OPENAI_HISTORY, tools=[WEATHER, TIME],
                                        tool_choice=NAMED, parallel_tool_calls=False)
    choice = reply.choices[0]
    assert choice.finish_reason == "stop" and choice.message.content is None  # a named call: "stop", as vLLM
    assert [(c.id, c.function.name, c.function.arguments) for c in choice.message.tool_calls] == [
        (CALL_ID, "get_weather", ARGUMENTS)]
    sent = fakes["seen"]["vllm"][-1]
    assert sent["model"] == "qwen2.5" and sent["tools"] == [WEATHER, TIME] and sent["tool_choice"] == NAMED
    assert sent["parallel_tool_calls"] is False
    assert sent["messages"][1] == {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_9", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Tokyo"}'}}]}
    assert sent["messages"][2] == {"role": "tool", "content": "18 C", "tool_call_id": "call_9"}


def test_openai_stream_from_vllm_joins_the_deltas(oai):
    chunks = list(oai.chat.completions.create(model="vllm-tools", messages=ASK, tools=[WEATHER], stream=True,
                                              stream_options={"include_usage": True}))
    deltas = [d for c in chunks if c.choices for d in c.choices[0].delta.tool_calls or []]
    assert [(d.index, d.id, d.function.name, d.function.arguments) for d in deltas] == [
        (0, CALL_ID, "get_weather", ARGUMENTS)]
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
    assert chunks[-1].usage.completion_tokens == 9


@pytest.mark.parametrize("stream", [False, True])
def test_ollama_client_in_front_of_vllm_gets_object_arguments(oll, fakes, stream):
    history = [*ASK, {"role": "assistant", "content": "", "tool_calls": [
        {"function": {"name": "get_weather", "arguments": {"city": "Tokyo"}}}]},
        {"role": "tool", "content": "18 C", "tool_name": "get_weather"}]
    reply = oll.chat(model="vllm-tools", messages=history, tools=[WEATHER], stream=stream)
    parts = list(reply) if stream else [reply]
    calls = [c for p in parts for c in p.message.tool_calls or []]
    assert [(c.function.name, c.function.arguments) for c in calls] == [("get_weather", {"city": "Paris"})]
    sent = fakes["seen"]["vllm"][-1]
    (tool,) = sent["tools"]  # as the ollama client sent it (its Tool model drops additionalProperties)
    assert tool["function"]["name"] == "get_weather" and tool["function"]["parameters"]["required"] == ["city"]
    assert sent["messages"][1]["tool_calls"][0]["function"]["arguments"] == '{"city": "Tokyo"}'
    assert sent["messages"][2]["role"] == "tool" and sent["messages"][2]["content"] == "18 C"


def test_openai_client_in_front_of_ollama_gets_string_arguments(oai, fakes):
    reply = oai.chat.completions.create(model="ollama-tools", messages=OPENAI_HISTORY, tools=[WEATHER, TIME],
                                        tool_choice=NAMED)
    (call,) = reply.choices[0].message.tool_calls
    assert reply.choices[0].finish_reason == "stop"  # a named call, as OpenAI
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Paris"}
    assert call.id.startswith("call_")
    sent = fakes["seen"]["ollama"][-1]
    assert sent["model"] == "llama3.1" and sent["tools"] == [WEATHER]  # Ollama has no tool_choice: only that tool
    assert sent["messages"][1]["tool_calls"] == [{"id": "call_9", "function": {"name": "get_weather",
                                                                               "arguments": {"city": "Tokyo"}}}]
    assert sent["messages"][2] == {"role": "tool", "content": "18 C", "tool_call_id": "call_9",
                                   "tool_name": "get_weather"}
    oai.chat.completions.create(model="ollama-tools", messages=ASK, tools=[WEATHER], tool_choice="none")
    assert "tools" not in fakes["seen"]["ollama"][-1]


def test_openai_stream_from_ollama(oai):
    chunks = list(oai.chat.completions.create(model="ollama-tools", messages=ASK, tools=[WEATHER], stream=True))
    deltas = [d for c in chunks for d in c.choices[0].delta.tool_calls or []]
    assert [(d.index, d.function.name, json.loads(d.function.arguments)) for d in deltas] == [
        (0, "get_weather", {"city": "Paris"})]
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_ollama_client_to_ollama_stream(oll):
    parts = list(oll.chat(model="ollama-tools", messages=ASK, tools=[WEATHER], stream=True))
    with_calls = [p for p in parts if p.message.tool_calls]
    assert len(with_calls) == 1 and not with_calls[0].done and parts[-1].done
    call = with_calls[0].message.tool_calls[0]
    assert call.function.name == "get_weather" and call.function.arguments == {"city": "Paris"}
