"""Structured outputs on the native engine with SmolLM2, through `infer serve` and the real clients:
Ollama's `format` (a JSON schema, and "json") and OpenAI's `response_format` (`json_schema`, `json_object`)
return JSON that parses and fits the schema, greedy and sampled; a malformed schema is a 400."""

from __future__ import annotations

import json

import ollama
import openai
import pytest

from .conftest import MODEL

pytestmark = pytest.mark.realmodel
ASK = [{"role": "user", "content": "Describe a fictional person as JSON with their name, age and city."}]
PERSON = {"type": "object", "additionalProperties": False, "required": ["name", "age", "city"],
          "properties": {"name": {"type": "string", "maxLength": 24}, "age": {"type": "integer", "minimum": 0},
                         "city": {"type": "string", "maxLength": 24}}}


def _fits(text: str) -> dict:
    value = json.loads(text)
    assert set(value) == {"name", "age", "city"}, value
    assert isinstance(value["name"], str) and isinstance(value["city"], str) and len(value["name"]) <= 24
    assert isinstance(value["age"], int) and value["age"] >= 0
    return value


@pytest.mark.parametrize("options", [{"temperature": 0}, {"temperature": 0.8, "seed": 3}])
def test_ollama_format_schema_gives_json_that_fits(native_server, options):
    client = ollama.Client(host=native_server.url, timeout=120)
    reply = client.chat(model=MODEL, messages=ASK, format=PERSON, options={**options, "num_predict": 96})
    assert reply.done_reason == "stop"
    _fits(reply.message.content)


def test_ollama_format_json_gives_an_object(native_server):
    """Greedy: free-form JSON from a 135M model, sampled, may still be inside a string after num_predict
    tokens (the grammar keeps it valid but cannot make it end); the schema above bounds it."""
    client = ollama.Client(host=native_server.url, timeout=120)
    free = client.chat(model=MODEL, messages=ASK, format="json", options={"temperature": 0, "num_predict": 96})
    assert free.done_reason == "stop"
    assert isinstance(json.loads(free.message.content), dict)


def test_openai_response_format_gives_json_that_fits(native_server):
    client = openai.OpenAI(base_url=native_server.url + "/v1", api_key="infer", max_retries=0, timeout=120)
    schema = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
    chunks = list(client.chat.completions.create(model=MODEL, messages=ASK, response_format=schema, max_tokens=96,
                                                 temperature=0, stream=True))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert chunks[-1].choices[0].finish_reason == "stop"
    _fits(text)
    reply = client.chat.completions.create(model=MODEL, messages=ASK, response_format={"type": "json_object"},
                                           max_tokens=96, temperature=0)
    assert isinstance(json.loads(reply.choices[0].message.content), dict)
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=8, response_format={
            "type": "json_schema", "json_schema": {"name": "bad", "schema": {"type": "no-such-type"}}})
    assert "invalid structured output" in err.value.body["message"]
