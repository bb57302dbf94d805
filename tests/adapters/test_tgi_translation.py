"""TGI adapter: request translation (serving-protocols.md §2.3, §5) and reply parsing (§2.5, §2.6, §2.9),
against recorded bytes on a loopback server (fakes/recorded.py)."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from core.base import Chunk, Done, GenerationRequest
from core.errors import BackendOverloaded, BackendProtocolError, BackendUnavailable, InvalidRequest
from adapters.remote.base import RemoteSettings
from adapters.remote.registry import create_remote
from adapters.remote.tgi import TGIBackend
from fakes.recorded import recorded_server
from frontend.token_count import ByteEstimate

INFO = {"model_id": "org/model", "max_total_tokens": 100, "max_input_tokens": 90, "max_stop_sequences": 4}
FINAL = {"index": 2, "token": {"id": 2, "text": "</s>", "logprob": -0.1, "special": True}, "generated_text": "Hello.",
         "details": {"finish_reason": "eos_token", "generated_tokens": 2, "seed": None, "input_length": 5}}
STREAM = ('data:{"index":1,"token":{"id":28723,"text":"Hello.","logprob":-0.62,"special":false},'
          '"generated_text":null,"details":null}\n\n:keep-alive\n\ndata:' + json.dumps(FINAL) + "\n\n")


class Server:
    """Answers /info, records every request body, replies to generation routes with ``reply``."""

    def __init__(self, reply: httpx.Response | None = None, info: dict | None = None):
        self.reply = reply or sse(STREAM)
        self.info = INFO if info is None else info
        self.bodies: dict[str, dict] = {}

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/info":
            return httpx.Response(200, json=self.info)
        if request.content:
            self.bodies[request.url.path] = json.loads(request.content)
        return self.reply


def sse(text: str, status: int = 200) -> httpx.Response:
    return httpx.Response(status, content=text.encode(), headers={"content-type": "text/event-stream"})


def backend(server, **settings) -> TGIBackend:
    config = RemoteSettings(name="pub", type="tgi", base_url=recorded_server(server).url, model="m", **settings)
    return TGIBackend(config, counter=ByteEstimate())


def run(tgi: TGIBackend, request: GenerationRequest) -> list:
    async def go():
        return [event async for event in tgi.stream(request)]
    return asyncio.run(go())


def prompt(text: str = "hello", **kw) -> GenerationRequest:
    return GenerationRequest(model="pub", prompt=text, **kw)


def params(server: Server) -> dict:
    return server.bodies["/generate_stream"]["parameters"]


def test_greedy_omits_temperature_top_p_top_k_and_sets_do_sample_false():
    server = Server()
    run(backend(server), prompt(options={"temperature": 0, "top_p": 0.9, "top_k": 40, "num_predict": 7}))
    assert server.bodies["/generate_stream"]["inputs"] == "hello"
    assert params(server) == {"max_new_tokens": 7, "details": True, "return_full_text": False, "do_sample": False}


def test_sampling_options_translate_within_tgi_ranges():
    server = Server()
    options = {"temperature": 0.7, "top_p": 1.0, "top_k": 0, "repeat_penalty": 1.1, "frequency_penalty": 0.5,
               "seed": 5, "stop": ["\n", "END"], "num_predict": 3, "min_p": 0.1, "presence_penalty": 1.0}
    run(backend(server), prompt(options=options, format={"type": "object"}))
    assert params(server) == {"max_new_tokens": 3, "details": True, "return_full_text": False, "temperature": 0.7,
                              "do_sample": True, "repetition_penalty": 1.1, "frequency_penalty": 0.5, "seed": 5,
                              "stop": ["\n", "END"], "grammar": {"type": "json", "value": {"type": "object"}}}


def test_top_p_inside_range_and_json_format():
    server = Server()
    run(backend(server), prompt(options={"top_p": 0.5, "top_k": 3, "seed": -1}, format="json"))
    p = params(server)
    assert (p["top_p"], p["top_k"], p["grammar"]) == (0.5, 3, {"type": "json", "value": {}})
    assert "seed" not in p and "do_sample" not in p


def test_five_stop_sequences_is_invalid_request_naming_the_limit():
    server = Server()
    with pytest.raises(InvalidRequest, match="at most 4 stop sequences"):
        run(backend(server), prompt(options={"stop": ["a", "b", "c", "d", "e"]}))
    assert server.bodies == {}


def test_max_new_tokens_without_num_predict_fills_the_context():
    server = Server()
    run(backend(server), prompt("hello"))  # 5 bytes -> 2 tokens estimated, +1 margin, +8 specials
    assert params(server)["max_new_tokens"] == 100 - 2 - 1 - 8
    server = Server(info={})
    run(backend(server), prompt("hello"))
    assert params(server)["max_new_tokens"] == 512
    server = Server(info={})
    run(backend(server, context_length=50), prompt("hello"))
    assert params(server)["max_new_tokens"] == 50 - 11


def test_system_is_prepended_to_a_completion_prompt():
    server = Server()
    run(backend(server), prompt("hello", system="Be brief."))
    assert server.bodies["/generate_stream"]["inputs"] == "Be brief.\n\nhello"


def test_chat_uses_the_tokenizer_config_template(tmp_path):
    (tmp_path / "tokenizer.json").write_text("{}")
    template = "{% for m in messages %}<{{ m.role }}>{{ m.content }}{{ eos_token }}{% endfor %}<assistant>"
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": template, "eos_token": "</s>"}))
    server = Server()
    messages = [{"role": "system", "content": "S"}, {"role": "user", "content": "hi"}]
    run(backend(server, tokenizer=str(tmp_path / "tokenizer.json")), GenerationRequest(model="pub", messages=messages))
    assert server.bodies["/generate_stream"]["inputs"] == "<system>S</s><user>hi</s><assistant>"


def test_chat_without_a_tokenizer_is_a_plain_transcript():
    server = Server()
    run(backend(server), GenerationRequest(model="pub", messages=[{"role": "user", "content": "hi"}]))
    assert server.bodies["/generate_stream"]["inputs"] == "User: hi\nAssistant: "


def test_stream_without_space_or_done_skips_special_tokens_and_reports_usage():
    events = run(backend(Server()), prompt(options={"num_predict": 5}))
    chunks, done = events[:-1], events[-1]
    assert [(c.text, c.token_ids) for c in chunks] == [("Hello.", [28723])]
    assert isinstance(done, Done) and done.finish_reason == "stop"
    assert (done.usage.input_tokens, done.usage.output_tokens, done.usage.source) == (5, 2, "backend")


def test_length_finish_reason():
    final = {**FINAL, "details": {**FINAL["details"], "finish_reason": "length"}}
    text = 'data:{"index":1,"token":{"id":1,"text":"a","special":false}}\n\ndata:' + json.dumps(final) + "\n\n"
    assert run(backend(Server(sse(text))), prompt())[-1].finish_reason == "length"


@pytest.mark.parametrize("error_type, cls", [("validation", InvalidRequest), ("overloaded", BackendOverloaded),
                                             ("generation", BackendUnavailable),
                                             ("incomplete_generation_stream", BackendUnavailable)])
def test_error_event_in_a_200_stream_is_mapped(error_type, cls):
    text = 'data:{"error":"boom","error_type":"' + error_type + '"}\n\n'
    with pytest.raises(cls, match="boom"):
        run(backend(Server(sse(text))), prompt())


def test_error_after_tokens_carries_partial_usage():
    text = ('data:{"index":1,"token":{"id":1,"text":"a","special":false}}\n\n'
            'data:{"error":"x","error_type":"generation"}\n\n')
    with pytest.raises(BackendUnavailable) as info:
        run(backend(Server(sse(text))), prompt())
    assert info.value.partial.usage.output_tokens == 1


def test_stream_without_final_event_is_incomplete():
    text = 'data:{"index":1,"token":{"id":1,"text":"a","special":false},"generated_text":null}\n\n'
    with pytest.raises(BackendProtocolError, match="incomplete stream"):
        run(backend(Server(sse(text))), prompt())


def test_error_replies_by_status_and_type():
    def reply(status, error_type):
        return httpx.Response(status, json={"error": f"{error_type} went wrong", "error_type": error_type})
    with pytest.raises(InvalidRequest, match=r"^validation went wrong$"):
        run(backend(Server(reply(422, "validation"))), prompt())
    with pytest.raises(BackendOverloaded) as overloaded:
        run(backend(Server(reply(429, "overloaded"))), prompt())
    assert overloaded.value.retry_after == 1.0
    with pytest.raises(BackendUnavailable, match="tgi backend 'pub'"):
        run(backend(Server(reply(424, "generation"))), prompt())
    with pytest.raises(BackendUnavailable, match="503"):
        run(backend(Server(reply(503, "healthcheck"))), prompt())


def test_non_stream_generate_uses_details_and_prompt_header():
    reply = httpx.Response(200, json={"generated_text": " world", "details": {
        "finish_reason": "length", "generated_tokens": 3, "seed": None}}, headers={"x-prompt-tokens": "4"})
    server = Server(reply)
    events = run(backend(server), prompt(stream=False, options={"num_predict": 3}))
    assert "/generate" in server.bodies and events[0] == Chunk(" world")
    done = events[-1]
    assert (done.finish_reason, done.usage.input_tokens, done.usage.output_tokens) == ("length", 4, 3)


def test_messages_mode_chat_body_and_stream():
    text = ('data: {"choices":[{"index":0,"delta":{"role":"assistant","content":"Hi"},"finish_reason":null}],'
            '"usage":null}\n\n'
            'data: {"choices":[{"index":0,"delta":{"content":"!"},"finish_reason":"length"}],"usage":null}\n\n'
            'data: {"choices":[],"usage":{"prompt_tokens":9,"completion_tokens":2,"total_tokens":11}}\n\n'
            "data: [DONE]\n\n")
    server = Server(sse(text))
    request = GenerationRequest(model="pub", messages=[{"role": "user", "content": "hi"}],
                                options={"temperature": 0, "top_k": 5, "top_p": 1.0, "num_predict": 4})
    events = run(backend(server, mode="messages"), request)
    assert server.bodies["/v1/chat/completions"] == {
        "model": "tgi", "stream": True, "stream_options": {"include_usage": True},
        "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "temperature": 0}
    assert "".join(e.text for e in events[:-1]) == "Hi!"
    assert (events[-1].finish_reason, events[-1].usage.input_tokens, events[-1].usage.output_tokens) == ("length", 9, 2)


def test_messages_mode_completion_and_stream_error():
    text = 'data:{"error":{"message":"Input validation error","http_status_code":422}}\n\n'
    server = Server(sse(text))
    with pytest.raises(InvalidRequest, match="Input validation error"):
        run(backend(server, mode="messages"), prompt("hello", system="S"))
    assert server.bodies["/v1/completions"]["prompt"] == "S\n\nhello"


def test_health_reads_load_metrics_and_tolerates_their_absence():
    metrics = ("# TYPE tgi_queue_size gauge\ntgi_queue_size 3\n"
               "# TYPE tgi_batch_current_size gauge\ntgi_batch_current_size 2\n")

    def handler(request):
        if request.url.path == "/health":
            return httpx.Response(200)
        return httpx.Response(200, text=metrics) if with_metrics else httpx.Response(404)
    with_metrics = True
    health = asyncio.run(backend(handler).health())
    assert health.ok and health.metrics == {"requests_waiting": 3.0, "requests_running": 2.0}
    with_metrics = False
    health = asyncio.run(backend(handler).health())
    assert health.ok and health.metrics == {}


def test_models_from_info_and_registration():
    assert asyncio.run(backend(Server()).models()) == ["org/model"]
    settings = RemoteSettings(name="pub", type="tgi", base_url="http://tgi.test", model="m")
    assert isinstance(create_remote(settings), TGIBackend)


def test_chat_uses_the_gguf_chat_template_and_eos(tmp_path):
    import gguf

    path = tmp_path / "m.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_token_list(["a", "</s>", "b"])
    writer.add_eos_token_id(1)
    writer.add_chat_template("{% for m in messages %}[{{ m.role }}]{{ m.content }}{{ eos_token }}{% endfor %}")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    server = Server()
    request = GenerationRequest(model="pub", messages=[{"role": "user", "content": "hi"}])
    run(backend(server, tokenizer=str(path)), request)
    assert server.bodies["/generate_stream"]["inputs"] == "[user]hi</s>"
