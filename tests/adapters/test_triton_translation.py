"""Triton generate-extension adapter: the flat request body (serving-protocols.md §3.2, §5), model-config
name adaptation, and parsing of recorded stream bytes."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from core.base import Done, GenerationRequest
from core.errors import BackendUnavailable, InvalidRequest
from adapters.remote.base import RemoteSettings
from frontend.token_count import ByteEstimate
from adapters.remote.triton import TritonBackend
from fakes.recorded import recorded_server

NEW_INPUTS = ["text_input", "max_tokens", "stream", "exclude_input_in_output", "return_num_input_tokens",
              "return_num_output_tokens", "temperature", "top_p", "top_k", "seed", "stop_words", "min_tokens",
              "repetition_penalty", "guided_decoding_guide_type", "guided_decoding_guide"]
OLD_INPUTS = ["text_input", "max_tokens", "stream", "temperature", "top_k", "top_p", "random_seed", "min_length",
              "stop_words", "bad_words"]


def events(*objects: dict) -> httpx.Response:
    text = "".join(f"data: {json.dumps(o)}\n\n" for o in objects)
    return httpx.Response(200, content=text.encode(), headers={"content-type": "text/event-stream"})


def out(text: str, **extra) -> dict:
    return {"model_name": "ensemble", "model_version": "1", "text_output": text, **extra}


class Server:
    def __init__(self, reply: httpx.Response | None = None, inputs: list[str] | None = None):
        self.reply = reply or events(out("Hel", num_input_tokens=4, num_output_tokens=1),
                                     out("lo", num_input_tokens=4, num_output_tokens=1))
        self.inputs = inputs
        self.bodies: dict[str, dict] = {}

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/config"):
            if self.inputs is None:
                return httpx.Response(400, json={"error": "no config"})
            return httpx.Response(200, json={"name": "ensemble", "input": [{"name": n} for n in self.inputs]})
        if request.url.path.endswith("/ready"):
            return httpx.Response(200)
        self.bodies[request.url.path] = json.loads(request.content)
        return self.reply


def backend(server, **settings) -> TritonBackend:
    config = RemoteSettings(name="pub", type="triton", base_url=recorded_server(server).url,
                            model=settings.pop("model", "ensemble"), **settings)
    return TritonBackend(config, counter=ByteEstimate())


def run(triton: TritonBackend, request: GenerationRequest) -> list:
    async def go():
        return [event async for event in triton.stream(request)]
    return asyncio.run(go())


def prompt(text: str = "hello", **kw) -> GenerationRequest:
    return GenerationRequest(model="pub", prompt=text, **kw)


STREAM_PATH = "/v2/models/ensemble/generate_stream"


def test_flat_body_greedy_is_top_k_1_without_temperature():
    server = Server()
    run(backend(server), prompt(options={"temperature": 0, "top_p": 0.9, "num_predict": 8, "stop": ["\n"]}))
    assert server.bodies[STREAM_PATH] == {
        "text_input": "hello", "max_tokens": 8, "stream": True, "exclude_input_in_output": True,
        "return_num_input_tokens": True, "return_num_output_tokens": True, "top_k": 1, "stop_words": ["\n"]}


def test_sampling_options_and_defaults():
    server = Server()
    options = {"temperature": 0.7, "top_p": 0.9, "top_k": 40, "seed": 11, "repeat_penalty": 1.2, "ignore_eos": True}
    run(backend(server), prompt(options=options))
    body = server.bodies[STREAM_PATH]
    assert body["max_tokens"] == 512 and body["min_tokens"] == 512
    assert {k: body[k] for k in ("temperature", "top_p", "top_k", "seed", "repetition_penalty")} == {
        "temperature": 0.7, "top_p": 0.9, "top_k": 40, "seed": 11, "repetition_penalty": 1.2}
    server = Server()
    run(backend(server, context_length=100), prompt("hello"))
    assert server.bodies[STREAM_PATH]["max_tokens"] == 100 - 2 - 1 - 8


def test_older_template_names_from_the_model_config():
    server = Server(inputs=OLD_INPUTS)
    run(backend(server), prompt(options={"seed": 3, "ignore_eos": True, "num_predict": 4, "temperature": 0.5}))
    assert server.bodies[STREAM_PATH] == {"text_input": "hello", "max_tokens": 4, "stream": True,
                                          "temperature": 0.5, "random_seed": 3, "min_length": 4}


def test_format_needs_guided_decoding_inputs():
    server = Server(inputs=NEW_INPUTS)
    run(backend(server), prompt(format={"type": "object"}))
    body = server.bodies[STREAM_PATH]
    assert body["guided_decoding_guide_type"] == "json_schema"
    assert json.loads(body["guided_decoding_guide"]) == {"type": "object"}
    with pytest.raises(InvalidRequest, match="guided decoding"):
        run(backend(Server(inputs=OLD_INPUTS)), prompt(format="json"))


def test_chat_is_rendered_into_text_input():
    server = Server()
    run(backend(server), GenerationRequest(model="pub", messages=[{"role": "user", "content": "hi"}]))
    assert server.bodies[STREAM_PATH]["text_input"] == "User: hi\nAssistant: "


def test_stream_concatenates_text_output_and_sums_per_event_counts():
    events_ = run(backend(Server()), prompt(options={"num_predict": 8}))
    assert "".join(e.text for e in events_[:-1]) == "Hello"
    done = events_[-1]
    assert isinstance(done, Done) and done.finish_reason == "stop"
    assert (done.usage.input_tokens, done.usage.output_tokens, done.usage.source) == (4, 2, "backend")


def test_running_totals_and_length_finish():
    reply = events(out("a", num_output_tokens=[1]), out("b", num_output_tokens=[2]), out("c", num_output_tokens=[3]))
    done = run(backend(Server(reply)), prompt(options={"num_predict": 3}))[-1]
    assert (done.usage.output_tokens, done.finish_reason) == (3, "length")


def test_without_counts_usage_is_estimated_and_length_counts_events():
    reply = events(out("a"), out("b"))
    done = run(backend(Server(reply)), prompt(options={"num_predict": 2}))[-1]
    assert (done.usage.source, done.finish_reason) == ("estimated", "length")


def test_error_event_in_a_200_stream_is_mapped_by_wording():
    reply = events(out("a"), {"error": "Executor failed: CUDA error"})
    with pytest.raises(BackendUnavailable, match="CUDA error") as info:
        run(backend(Server(reply)), prompt())
    assert info.value.partial is not None
    reply = events({"error": "Prompt length (900) exceeds maximum input length (512)"})
    with pytest.raises(InvalidRequest, match="exceeds maximum input length"):
        run(backend(Server(reply)), prompt())


def test_error_replies():
    unknown = httpx.Response(400, json={"error": "Request for unknown model: 'ensembel' is not found"})
    with pytest.raises(BackendUnavailable, match="check the entry's model"):
        run(backend(Server(unknown), model="ensembel"), prompt())
    bad = httpx.Response(400, json={"error": "unexpected inference input 'foo' for model 'ensemble'"})
    with pytest.raises(InvalidRequest, match=r"^unexpected inference input"):
        run(backend(Server(bad)), prompt())


def test_non_stream_generate_is_one_object():
    reply = httpx.Response(200, json=out("Hello there", num_input_tokens=[4], num_output_tokens=[2]))
    server = Server(reply)
    events_ = run(backend(server), prompt(stream=False))
    assert server.bodies["/v2/models/ensemble/generate"]["stream"] is False
    assert events_[0].text == "Hello there" and events_[-1].usage.output_tokens == 2


def test_models_and_health_routes():
    server = Server()
    triton = backend(server)
    assert asyncio.run(triton.models()) == ["ensemble"]

    def ready(request):
        return httpx.Response(200 if request.url.path == "/v2/health/ready" else 404)
    assert asyncio.run(backend(ready).health()).ok
