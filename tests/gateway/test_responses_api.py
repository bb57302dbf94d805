"""The official ``openai`` SDK's Responses API against a live ``infer serve``: ``responses.create`` streamed
and not, function tools with ``function_call_output``, ``previous_response_id`` over the stored
conversation, ``store: false``, retrieve and delete, reasoning summaries; on a local model (llama.cpp)
and on a remote OpenAI-compatible backend (``agent_fake.py``).
"""

from __future__ import annotations

import json

import openai
import pytest

from tests.gateway.agent_fake import ANSWER, ARGUMENTS, CALL_ID, PROMPT_TOKENS, REASONING_TOKENS, TEXT_TOKENS, THOUGHT
from tests.gateway.test_anthropic_api import rows

WEATHER = {"type": "function", "name": "get_weather", "description": "Current weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Tokyo"]}},
                          "required": ["city"], "additionalProperties": False}}


@pytest.fixture(scope="module")
def client(agent_gateway):
    return openai.OpenAI(base_url=agent_gateway.url + "/v1", api_key="infer", max_retries=0, timeout=60)


def test_create_on_a_local_model(client, agent_gateway):
    response = client.responses.create(model="tiny", input="Why is the sky blue?", instructions="Be brief.",
                                       max_output_tokens=8, temperature=0.0)
    assert response.object == "response" and response.id.startswith("resp_") and response.model == "tiny"
    assert response.status in ("completed", "incomplete") and response.output[0].type == "message"
    assert response.output_text and 0 < response.usage.output_tokens <= 8
    assert response.usage.total_tokens == response.usage.input_tokens + response.usage.output_tokens
    assert client.responses.retrieve(response.id).output_text == response.output_text
    row = rows(agent_gateway, "tiny", route="/v1/responses")[0]
    assert (row["status"], row["output_tokens"]) == ("ok", response.usage.output_tokens)


def test_stream_on_a_local_model(client):
    events = list(client.responses.create(model="tiny", input="Why is the sky blue?", max_output_tokens=8,
                                          temperature=0.0, stream=True))
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] in ("response.completed", "response.incomplete")
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == events[-1].response.output_text != ""
    with client.responses.stream(model="remote-agent", input="Why is the sky blue?") as stream:
        deltas = "".join(e.delta for e in stream if e.type == "response.output_text.delta")
        final = stream.get_final_response()  # the SDK's own accumulator (it needs response.completed)
    assert final.output_text == deltas == "".join(ANSWER)


def test_function_call_and_previous_response_on_a_local_model(client):
    first = client.responses.create(model="qwen-tools", input="What is the weather in Paris?", tools=[WEATHER],
                                    tool_choice={"type": "function", "name": "get_weather"})
    call = next(item for item in first.output if item.type == "function_call")
    assert call.name == "get_weather" and json.loads(call.arguments)["city"] in ("Paris", "Tokyo")
    answer = [{"type": "function_call_output", "call_id": call.call_id, "output": "18 °C"}]
    second = client.responses.create(model="qwen-tools", previous_response_id=first.id, tools=[WEATHER],
                                     max_output_tokens=8, input=answer)
    assert second.previous_response_id == first.id and second.output
    assert second.usage.input_tokens > first.usage.input_tokens  # the whole conversation was in the prompt


def test_remote_round_trip_with_previous_response_and_reasoning(client, agent_gateway):
    first = client.responses.create(model="remote-agent", input="What is the weather in Paris?", tools=[WEATHER],
                                    reasoning={"effort": "low"})
    assert [item.type for item in first.output] == ["reasoning", "function_call"]
    assert first.output[0].summary[0].text == "".join(THOUGHT)
    call = first.output[1]
    assert (call.call_id, call.name, call.arguments) == (CALL_ID, "get_weather", ARGUMENTS)
    assert first.usage.output_tokens_details.reasoning_tokens == REASONING_TOKENS
    assert agent_gateway.received[-1]["reasoning_effort"] == "low"
    events = list(client.responses.create(model="remote-agent", previous_response_id=first.id, tools=[WEATHER],
                                          stream=True, input=[{"type": "function_call_output", "call_id": CALL_ID,
                                                               "output": "18 °C"}]))
    kinds = [e.type for e in events]
    assert "response.reasoning_summary_text.delta" in kinds and kinds[-1] == "response.completed"
    final = events[-1].response
    assert final.output_text == "".join(ANSWER) and final.usage.input_tokens == PROMPT_TOKENS
    assert final.usage.output_tokens == REASONING_TOKENS + TEXT_TOKENS
    sent = agent_gateway.received[-1]["messages"]
    assert sent[0] == {"role": "user", "content": "What is the weather in Paris?"}
    assert sent[1]["tool_calls"][0]["id"] == CALL_ID and sent[2]["tool_call_id"] == CALL_ID
    third = client.responses.create(model="remote-agent", previous_response_id=final.id, input="Thanks!")
    assert [m["role"] for m in agent_gateway.received[-1]["messages"]] == ["user", "assistant", "tool", "assistant",
                                                                          "user"]
    assert third.output_text == "".join(ANSWER)


def test_stream_of_a_function_call(client):
    events = list(client.responses.create(model="remote-agent", input="Weather?", tools=[WEATHER], stream=True))
    kinds = [e.type for e in events]
    at = kinds.index("response.function_call_arguments.delta")
    assert kinds[at - 1] == "response.output_item.added" and kinds[at + 1:at + 3] == [
        "response.function_call_arguments.done", "response.output_item.done"]
    assert events[at].delta == ARGUMENTS and events[-1].response.output[-1].call_id == CALL_ID


def test_store_false_and_delete(client):
    kept = client.responses.create(model="remote-agent", input="Hi")
    unkept = client.responses.create(model="remote-agent", input="Hi", store=False)
    assert unkept.store is False and kept.store is True
    with pytest.raises(openai.NotFoundError) as missing:
        client.responses.create(model="remote-agent", input="again", previous_response_id=unkept.id)
    assert missing.value.body["param"] == "previous_response_id"
    client.responses.delete(kept.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(kept.id)


@pytest.mark.parametrize("api", ["anthropic-messages", "openai-responses"])
def test_infer_bench_speaks_both_agent_apis_and_takes_a_v1_base_url(agent_gateway, api, tmp_path):
    from typer.testing import CliRunner

    from cli.main import app

    result = CliRunner().invoke(app, ["bench", "--url", agent_gateway.url + "/v1", "--model", "remote-agent",
                                      "--api", api, "--num-requests", "3", "--warmup", "0", "--input-tokens", "8",
                                      "--output-tokens", "4", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "Successful requests:                     3" in result.output and "request(s) failed" not in result.output
    records = [json.loads(line) for line in (tmp_path / "requests.jsonl").read_text().splitlines()]
    assert [r["output_tokens"] for r in records] == [REASONING_TOKENS + TEXT_TOKENS] * 3
    assert {r["generated_text"] for r in records} == {"".join(ANSWER)}
