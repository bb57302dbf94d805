"""Thinking on every API against a live ``infer serve``: Ollama's ``think`` and ``thinking`` on a local
model whose template thinks (``think-r1``), the 400 on a model that does not, and a remote reasoning
backend's ``reasoning_content`` on OpenAI chat with ``completion_tokens_details.reasoning_tokens``;
reasoning tokens in the ledger."""

from __future__ import annotations

import httpx
import ollama
import openai
import pytest

from tests.gateway.agent_fake import ANSWER, REASONING_TOKENS, THOUGHT
from tests.gateway.test_anthropic_api import rows

ASK = [{"role": "user", "content": "Why is the sky blue?"}]


@pytest.fixture(scope="module")
def oll(agent_gateway):
    return ollama.Client(host=agent_gateway.url, timeout=60)


def test_ollama_think_on_a_local_thinking_model(oll, agent_gateway):
    assert "thinking" in oll.show("think-r1").capabilities
    reply = oll.chat(model="think-r1", messages=ASK, think=True, options={"num_predict": 6, "temperature": 0})
    assert reply.message.thinking and reply.message.content == ""  # the template opened <think>; never closed
    assert 0 < reply.eval_count <= 6
    streamed = list(oll.generate(model="think-r1", prompt="Why?", think=True, stream=True,
                                 options={"num_predict": 6, "temperature": 0}))
    assert "".join(p.thinking or "" for p in streamed) and not "".join(p.response for p in streamed)
    row = rows(agent_gateway, "think-r1", route="/api/chat")[0]
    assert row["reasoning_tokens"] == row["output_tokens"] == reply.eval_count
    plain = oll.chat(model="think-r1", messages=ASK, think=False, options={"num_predict": 4, "temperature": 0})
    assert not plain.message.thinking  # the template was told not to think: nothing is split


def test_think_on_a_model_that_does_not_think_is_a_400(agent_gateway):
    reply = httpx.post(agent_gateway.url + "/api/chat", json={"model": "tiny", "messages": ASK, "think": True},
                       timeout=30)
    assert (reply.status_code, reply.json()) == (400, {"error": '"tiny" does not support thinking'})
    bad = httpx.post(agent_gateway.url + "/api/chat", json={"model": "tiny", "messages": ASK, "think": "max!"},
                     timeout=30)
    assert bad.status_code == 400 and "think" in bad.json()["error"]


def test_reasoning_content_on_openai_chat(agent_gateway):
    client = openai.OpenAI(base_url=agent_gateway.url + "/v1", api_key="x", max_retries=0, timeout=30)
    reply = client.chat.completions.create(model="remote-agent", messages=ASK, reasoning_effort="high")
    message = reply.choices[0].message
    assert message.reasoning_content == "".join(THOUGHT) and message.content == "".join(ANSWER)
    assert reply.usage.completion_tokens_details.reasoning_tokens == REASONING_TOKENS
    chunks = list(client.chat.completions.create(model="remote-agent", messages=ASK, stream=True,
                                                 stream_options={"include_usage": True}))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert "".join(getattr(d, "reasoning_content", None) or "" for d in deltas) == "".join(THOUGHT)
    assert "".join(d.content or "" for d in deltas) == "".join(ANSWER)
    assert chunks[-1].usage.completion_tokens_details.reasoning_tokens == REASONING_TOKENS


def test_stop_says_which_types_it_takes(agent_gateway):
    reply = httpx.post(agent_gateway.url + "/v1/chat/completions", json={"model": "tiny", "messages": ASK, "stop": 5},
                       timeout=30)
    assert reply.status_code == 400
    message = "invalid 'stop': must be a string or a list of up to 4 strings, got int 5"
    assert reply.json()["error"]["message"] == message
    assert reply.json()["error"]["param"] == "stop"
