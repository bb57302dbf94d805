"""Tool calls end to end on the in-process llama.cpp engine, with the real clients (openai, ollama,
LangChain) against a live ``infer serve``.

The model's weights are random: a call comes out where the output is steered — a forced ``tool_choice``
(JSON grammar) and, for the template-learned parser on real model output, an Ollama ``format`` shaped like
a Llama 3.1 call (the ``llama-tools`` template's calls are bare JSON, so the parser reads it as a call).
"""

from __future__ import annotations

import json

import httpx
import ollama
import openai
import pytest

from tests.tools.conftest import ASK, TIME, WEATHER

NAMED = {"type": "function", "function": {"name": "get_weather"}}
LLAMA_CALL = {"type": "object", "additionalProperties": False, "required": ["name", "parameters"],
              "properties": {"name": {"enum": ["get_weather"]}, "parameters": WEATHER["function"]["parameters"]}}


@pytest.fixture(scope="module")
def oai(tools_server):
    return openai.OpenAI(base_url=tools_server.url + "/v1", api_key="infer", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def oll(tools_server):
    return ollama.Client(host=tools_server.url, timeout=60)


def test_openai_named_tool_choice_returns_the_call(oai):
    reply = oai.chat.completions.create(model="qwen-tools", messages=ASK, tools=[WEATHER, TIME],
                                        tool_choice=NAMED, max_tokens=60, seed=1)
    choice = reply.choices[0]
    assert choice.finish_reason == "stop" and choice.message.content is None  # a named call: "stop", as OpenAI
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_") and call.function.name == "get_weather"
    assert json.loads(call.function.arguments)["city"] in ("Paris", "Tokyo")


def test_openai_required_streams_tool_call_deltas(oai):
    chunks = list(oai.chat.completions.create(model="qwen-tools", messages=ASK, tools=[WEATHER, TIME],
                                              tool_choice="required", parallel_tool_calls=False, max_tokens=80,
                                              seed=2, stream=True))
    deltas = [d for c in chunks if c.choices for d in c.choices[0].delta.tool_calls or []]
    assert len(deltas) == 1 and deltas[0].index == 0
    assert all(d.function.name in ("get_weather", "get_time") and d.id.startswith("call_") for d in deltas)
    assert all(json.loads(d.function.arguments)["city"] in ("Paris", "Tokyo") for d in deltas)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_openai_sdk_stream_helper_assembles_the_call(oai):
    with oai.chat.completions.stream(model="qwen-tools", messages=ASK, tools=[WEATHER], tool_choice=NAMED,
                                     max_tokens=60, seed=3) as stream:
        final = stream.get_final_completion()
    (call,) = final.choices[0].message.tool_calls
    assert call.function.name == "get_weather" and json.loads(call.function.arguments)["city"] in ("Paris", "Tokyo")


def test_ollama_chat_parses_a_llama_style_call_from_the_output(oll):
    reply = oll.chat(model="llama-tools", messages=ASK, tools=[WEATHER], format=LLAMA_CALL,
                     options={"num_predict": 80, "seed": 1}, stream=False)
    assert reply.message.content == "" and reply.done_reason == "stop"
    (call,) = reply.message.tool_calls
    assert call.function.name == "get_weather" and call.function.arguments["city"] in ("Paris", "Tokyo")


def test_ollama_chat_stream_sends_the_calls_in_a_chunk(oll):
    parts = list(oll.chat(model="llama-tools", messages=ASK, tools=[WEATHER], format=LLAMA_CALL,
                          options={"num_predict": 80, "seed": 1}, stream=True))
    with_calls = [p for p in parts if p.message.tool_calls]
    assert len(with_calls) == 1 and not with_calls[0].done and parts[-1].done
    assert with_calls[0].message.tool_calls[0].function.name == "get_weather"


def test_ollama_tool_history_round_trip(oll):
    first = oll.chat(model="llama-tools", messages=ASK, tools=[WEATHER], format=LLAMA_CALL,
                     options={"num_predict": 80, "seed": 1})
    history = [*ASK, first.message, {"role": "tool", "content": "18 C", "tool_name": "get_weather"}]
    again = oll.chat(model="llama-tools", messages=history, tools=[WEATHER], options={"num_predict": 5, "seed": 1})
    alone = oll.chat(model="llama-tools", messages=ASK, options={"num_predict": 5, "seed": 1})
    assert again.done and again.prompt_eval_count > alone.prompt_eval_count  # the call and its result are in


def test_model_without_tools_gets_ollamas_400(oll, oai):
    with pytest.raises(ollama.ResponseError) as err:
        oll.chat(model="tiny", messages=ASK, tools=[WEATHER])
    assert err.value.status_code == 400
    assert err.value.error == "registry.ollama.ai/library/tiny:latest does not support tools"
    with pytest.raises(openai.BadRequestError) as bad:
        oai.chat.completions.create(model="tiny-go", messages=ASK, tools=[WEATHER], max_tokens=4)
    assert bad.value.body["message"] == "registry.ollama.ai/library/tiny-go:latest does not support tools"
    none = oai.chat.completions.create(model="tiny", messages=ASK, tools=[WEATHER], tool_choice="none", max_tokens=4)
    assert none.choices[0].message.tool_calls is None and none.choices[0].finish_reason in ("stop", "length")


def test_capabilities_say_tools_only_for_tool_templates(oll):
    assert "tools" in oll.show("qwen-tools").capabilities and "tools" in oll.show("llama-tools").capabilities
    assert "tools" not in oll.show("tiny").capabilities and "tools" not in oll.show("tiny-go").capabilities


@pytest.mark.parametrize("body, param", [
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}]},
     "tools[0].function.parameters"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": [{"type": "retrieval"}]}, None),
])
def test_openai_bad_tools_are_400_in_openais_shape(tools_server, body, param):
    reply = httpx.post(tools_server.url + "/v1/chat/completions",
                       json={"model": "qwen-tools", "messages": ASK, **body}, timeout=30)
    assert reply.status_code == 400
    error = reply.json()["error"]
    assert error["type"] == "invalid_request_error" and error["message"]
    if param:
        assert error["param"] == param


def test_ollama_bad_tool_schema_is_400(tools_server):
    bad = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "required": 3}}}]
    reply = httpx.post(tools_server.url + "/api/chat", json={"model": "qwen-tools", "messages": ASK, "tools": bad},
                       timeout=30)
    assert reply.status_code == 400 and "not a valid JSON Schema" in reply.json()["error"]


def test_langchain_bind_tools(tools_server):
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(base_url=tools_server.url + "/v1", api_key="infer", model="qwen-tools", max_tokens=60,
                     seed=4, max_retries=0)
    bound = llm.bind_tools([WEATHER], tool_choice="get_weather")
    message = bound.invoke("What is the weather in Paris?")
    (call,) = message.tool_calls
    assert call["name"] == "get_weather" and call["args"]["city"] in ("Paris", "Tokyo") and call["id"]
    streamed = None
    for chunk in bound.stream("What is the weather in Tokyo?"):
        streamed = chunk if streamed is None else streamed + chunk
    assert streamed.tool_calls[0]["name"] == "get_weather"


def test_native_engine_forced_tool_choice_returns_the_call(oai):
    """The native engine steers a forced choice with its grammar (llguidance), as llama.cpp does; a call
    that cannot be completed within max_tokens still fails, saying why."""
    reply = oai.chat.completions.create(model="qwen-tools", messages=ASK, tools=[WEATHER, TIME], tool_choice=NAMED,
                                        max_tokens=60, seed=1, extra_body={"engine": "native"})
    choice = reply.choices[0]
    assert choice.finish_reason == "stop" and choice.message.content is None  # a named call: "stop", as OpenAI
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments)["city"] in ("Paris", "Tokyo")
    with pytest.raises(openai.BadRequestError) as err:
        oai.chat.completions.create(model="qwen-tools", messages=ASK, tools=[WEATHER], tool_choice="required",
                                    max_tokens=8, seed=1, extra_body={"engine": "native"})
    assert err.value.body["message"] == ("tool_choice 'required': no complete tool call within max_tokens "
                                         "(8 tokens); raise max_tokens")
