"""The official ``anthropic`` SDK against a live ``infer serve``: Messages API on a local model (llama.cpp)
and on a remote OpenAI-compatible backend (``agent_fake.py``), streamed and not, a tool-use round trip,
``count_tokens``, thinking blocks, Anthropic's error shape, ``x-api-key``, and the ledger rows.
"""

from __future__ import annotations

import json
import time

import anthropic
import httpx
import pytest
import sqlalchemy as sa

from tests.gateway.claude_code_request import claude_code_request
from tests.gateway.agent_fake import ANSWER, ARGUMENTS, CALL_ID, PROMPT_TOKENS, REASONING_TOKENS, TEXT_TOKENS, THOUGHT

WEATHER = {"name": "get_weather", "description": "Current weather in a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Tokyo"]}},
                            "required": ["city"], "additionalProperties": False}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def client(agent_gateway):
    return anthropic.Anthropic(base_url=agent_gateway.url, api_key="infer", max_retries=0, timeout=60)


def rows(gateway, model: str, at_least: int = 1, route: str = "/v1/messages") -> list[dict]:
    """The ledger rows of ``model`` on ``route``, oldest first, once there are ``at_least`` (the writer batches)."""
    engine = sa.create_engine(gateway.server.db_url)
    query = sa.text("SELECT * FROM requests WHERE route = :r AND model = :m ORDER BY datetime_utc, id")
    try:
        deadline = time.monotonic() + 10
        while True:
            with engine.connect() as conn:
                found = [dict(r._mapping) for r in conn.execute(query, {"r": route, "m": model})]
            if len(found) >= at_least or time.monotonic() > deadline:
                return found
            time.sleep(0.05)
    finally:
        engine.dispose()


def test_create_on_a_local_model(client, agent_gateway):
    before = len(rows(agent_gateway, "tiny", at_least=0))  # the gateway is shared: other modules' rows come first
    message = client.messages.create(model="tiny", max_tokens=8, system="Be brief.", messages=ASK,
                                     extra_body={"temperature": 0.0})
    assert message.type == "message" and message.role == "assistant" and message.model == "tiny"
    assert message.id.startswith("msg_") and message.stop_reason in ("end_turn", "max_tokens")
    assert [b.type for b in message.content] == ["text"]
    assert 0 < message.usage.output_tokens <= 8
    # Anthropic's input_tokens leaves out the prompt cache's hits (another module may have left this prefix cached)
    prompt = message.usage.input_tokens + (message.usage.cache_read_input_tokens or 0)
    counted = client.messages.count_tokens(model="tiny", system="Be brief.", messages=ASK)
    assert counted.input_tokens == prompt > 10
    last = rows(agent_gateway, "tiny", at_least=before + 1)[-1]
    assert (last["model"], last["backend"], last["status"], last["stream"]) == ("tiny", "llamacpp", "ok", 0)
    assert (last["input_tokens"], last["output_tokens"]) == (prompt, message.usage.output_tokens)


def test_stream_on_a_local_model(client):
    with client.messages.stream(model="tiny", max_tokens=12, messages=ASK, extra_body={"temperature": 0.0}) as stream:
        events = [e.type for e in stream]
        final = stream.get_final_message()
    assert events[0] == "message_start" and events[-1] == "message_stop"
    assert events[-2] == "message_delta" and "content_block_start" in events
    assert final.usage.output_tokens > 0 and final.usage.input_tokens > 10  # the final counts reach the snapshot
    again = client.messages.create(model="tiny", max_tokens=12, messages=ASK, extra_body={"temperature": 0.0})
    assert final.content[0].text == again.content[0].text  # greedy: the same answer both ways


def test_the_raw_stream_is_anthropics_event_sequence(agent_gateway):
    body = {"model": "tiny", "max_tokens": 5, "stream": True, "messages": ASK, "temperature": 0.0}
    reply = httpx.post(agent_gateway.url + "/v1/messages", json=body, timeout=60,
                       headers={"anthropic-version": "2023-06-01", "x-api-key": "x"})
    assert reply.status_code == 200 and reply.headers["content-type"].startswith("text/event-stream")
    frames = [f for f in reply.text.split("\n\n") if f]
    names = [f.split("\n")[0].removeprefix("event: ") for f in frames]
    assert names[:3] == ["message_start", "ping", "content_block_start"]
    assert names[-4:] == ["content_block_stop", "message_delta", "message_stop"][-3:] or names[-3:] == [
        "content_block_stop", "message_delta", "message_stop"]
    data = [json.loads(f.split("\n", 1)[1].removeprefix("data: ")) for f in frames]
    assert all(d["type"] == n for d, n in zip(data, names))
    assert data[0]["message"]["usage"] == {"input_tokens": 0, "output_tokens": 0}
    assert data[-2]["delta"]["stop_reason"] in ("end_turn", "max_tokens") and data[-2]["usage"]["output_tokens"] <= 5


def test_tool_use_round_trip_on_a_local_model(client, agent_gateway):
    first = client.messages.create(model="qwen-tools", max_tokens=64, messages=ASK, tools=[WEATHER],
                                   tool_choice={"type": "tool", "name": "get_weather"})
    assert first.stop_reason == "tool_use"
    call = next(b for b in first.content if b.type == "tool_use")
    assert call.name == "get_weather" and call.input["city"] in ("Paris", "Tokyo")
    turn = [*ASK, {"role": "assistant", "content": first.content},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "18 °C"}]}]
    second = client.messages.create(model="qwen-tools", max_tokens=8, messages=turn, tools=[WEATHER])
    assert second.stop_reason in ("end_turn", "max_tokens", "tool_use")
    total = second.usage.input_tokens + second.usage.cache_read_input_tokens  # llama.cpp reused the first prompt
    assert second.usage.cache_read_input_tokens > 0 and total > first.usage.input_tokens  # the call and result too
    assert rows(agent_gateway, "qwen-tools", 2)[0]["finish_reason"] == "tool_calls"


def test_remote_backend_create_stream_and_thinking(client, agent_gateway):
    message = client.messages.create(model="remote-agent", max_tokens=100, messages=ASK,
                                     thinking={"type": "enabled", "budget_tokens": 1024})
    assert [b.type for b in message.content] == ["thinking", "text"]
    assert message.content[0].thinking == "".join(THOUGHT) and message.content[0].signature
    assert message.content[1].text == "".join(ANSWER) and message.stop_reason == "end_turn"
    assert (message.usage.input_tokens, message.usage.output_tokens) == (PROMPT_TOKENS, REASONING_TOKENS + TEXT_TOKENS)
    assert message.usage.output_tokens_details.thinking_tokens == REASONING_TOKENS
    assert agent_gateway.received[-1]["chat_template_kwargs"] == {"enable_thinking": True}
    with client.messages.stream(model="remote-agent", max_tokens=100, messages=ASK) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == "".join(ANSWER) and [b.type for b in final.content] == ["thinking", "text"]
    assert final.content[0].thinking == "".join(THOUGHT)
    row = rows(agent_gateway, "remote-agent", 2)[1]
    assert (row["model"], row["backend"], row["reasoning_tokens"], row["output_tokens"]) == (
        "remote-agent", "remote-agent", REASONING_TOKENS, REASONING_TOKENS + TEXT_TOKENS)
    assert row["reasoning_cost_usd"] == pytest.approx(row["output_cost_usd"] * REASONING_TOKENS / row["output_tokens"])


def test_remote_tool_use_round_trip(client, agent_gateway):
    with client.messages.stream(model="remote-agent", max_tokens=100, messages=ASK, tools=[WEATHER]) as stream:
        first = stream.get_final_message()
    assert first.stop_reason == "tool_use"
    call = first.content[-1]
    assert (call.type, call.id, call.name, call.input) == ("tool_use", CALL_ID, "get_weather", json.loads(ARGUMENTS))
    turn = [*ASK, {"role": "assistant", "content": first.content},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id,
                                          "content": [{"type": "text", "text": "18 °C"}]}]}]
    second = client.messages.create(model="remote-agent", max_tokens=100, messages=turn, tools=[WEATHER])
    assert second.content[-1].text == "".join(ANSWER)
    sent = agent_gateway.received[-1]["messages"]
    assert sent[1]["tool_calls"][0]["id"] == CALL_ID and sent[1]["tool_calls"][0]["function"]["arguments"] == ARGUMENTS
    assert sent[2] == {"role": "tool", "content": "18 °C", "tool_call_id": CALL_ID}


def test_errors_in_anthropics_shape(client, agent_gateway):
    with pytest.raises(anthropic.NotFoundError) as missing:
        client.messages.create(model="no-such-model", max_tokens=5, messages=ASK)
    assert missing.value.body["type"] == "error" and missing.value.body["error"]["type"] == "not_found_error"
    reply = httpx.post(agent_gateway.url + "/v1/messages", json={"model": "tiny", "messages": ASK}, timeout=30)
    assert reply.status_code == 400
    assert reply.json() == {"type": "error", "error": {"type": "invalid_request_error",
                                                       "message": "invalid 'max_tokens': Field required"}}
    with pytest.raises(anthropic.BadRequestError) as thinking:
        client.messages.create(model="tiny", max_tokens=5, messages=ASK, thinking={"type": "enabled",
                                                                                   "budget_tokens": 1024})
    assert thinking.value.body["error"]["message"] == '"tiny" does not support thinking'


@pytest.mark.parametrize("model", ["remote-agent", "agent-tools"])
def test_a_claude_code_shaped_request_runs_end_to_end(agent_gateway, model):
    body = claude_code_request(model)
    if model == "agent-tools":
        body["stop_sequences"] = ["\n\n"]  # random weights: keep the local answer short (max_tokens is clamped)
    headers = {"x-api-key": "sk-ant-local", "anthropic-version": "2023-06-01", "anthropic-beta": "claude-code-20250219"}
    with httpx.stream("POST", agent_gateway.url + "/v1/messages", json=body, headers=headers, timeout=120) as reply:
        assert reply.status_code == 200
        frames = [f for f in reply.read().decode().split("\n\n") if f]
    data = [json.loads(f.split("\n", 1)[1].removeprefix("data: ")) for f in frames]
    assert [d["type"] for d in data][:2] == ["message_start", "ping"] and data[-1]["type"] == "message_stop"
    assert data[-2]["delta"]["stop_reason"] in ("end_turn", "tool_use", "max_tokens", "stop_sequence")
    if model == "remote-agent":
        sent = agent_gateway.received[-1]
        assert len(sent["tools"]) == 10 and sent["max_tokens"] == 32000
        assert sent["messages"][0]["role"] == "system" and "billing-header" not in sent["messages"][0]["content"]
        assert [m["role"] for m in sent["messages"]] == ["system", "user", "assistant", "tool", "user"]
        assert sent["messages"][2]["tool_calls"][0]["function"] == {"name": "Read",
                                                                     "arguments": '{"file_path": "/repo/main.py"}'}
        assert data[-2]["usage"]["input_tokens"] == PROMPT_TOKENS
    else:
        assert data[-2]["usage"]["input_tokens"] > 500  # ten tools and the history, rendered by the template


def test_keys_are_read_from_x_api_key(tiny_store, tmp_path):
    from fakes.live import start_server, stop_server

    server = start_server(tmp_path, tiny_store.root, INFER_API_KEYS="sk-local-test")
    try:
        body = {"model": "tiny", "max_tokens": 2, "messages": ASK}
        refused = httpx.post(server.url + "/v1/messages", json=body, headers={"x-api-key": "wrong"}, timeout=30)
        assert refused.status_code == 401 and refused.json()["error"]["type"] == "authentication_error"
        client = anthropic.Anthropic(base_url=server.url, api_key="sk-local-test", max_retries=0, timeout=30)
        assert client.messages.create(**body).usage.output_tokens > 0  # the SDK sends x-api-key
    finally:
        stop_server(server)
