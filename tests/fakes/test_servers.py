"""Self-tests of the fake servers: the exact bytes each one puts on the wire (serving-protocols.md)."""

from __future__ import annotations

import json

import httpx
import pytest

from fakes import KINDS, FakeEngine, start_server

PROMPT = "hello world"  # 2 tokens → output starts at " charlie"


@pytest.fixture(scope="module", params=KINDS)
def server(request):
    with start_server(request.param) as running:
        yield running


@pytest.fixture(autouse=True)
def fresh(request):
    """Every test starts from the default Behaviour."""
    if "server" in request.fixturenames:
        request.getfixturevalue("server").behaviour.reset()
    if "servers" in request.fixturenames:
        for each in request.getfixturevalue("servers").values():
            each.behaviour.reset()


@pytest.fixture(scope="module")
def servers():
    running = {kind: start_server(kind) for kind in KINDS}
    yield running
    for each in running.values():
        each.stop()


def stream_call(kind: str, max_tokens: int = 3, **extra) -> tuple[str, dict]:
    """Path and body of a streamed generation in each backend's own request form."""
    if kind == "tgi":
        return "/generate_stream", {"inputs": PROMPT, "parameters": {"max_new_tokens": max_tokens, "details": True}}
    if kind == "triton":
        return "/v2/models/ensemble/generate_stream", {"text_input": PROMPT, "max_tokens": max_tokens,
                                                        "stream": True, **extra}
    if kind == "vllm":
        return "/v1/completions", {"prompt": PROMPT, "max_tokens": max_tokens, "stream": True,
                                   "stream_options": {"include_usage": True}, **extra}
    return "/v1/completions", {"model": "m", "prompt": PROMPT, "max_tokens": max_tokens, "stream": True}


def payloads(raw: bytes) -> list[str]:
    return [event.split(b":", 1)[1].strip().decode() for event in raw.split(b"\n\n") if event]


def test_engine_is_deterministic():
    assert FakeEngine.generate(PROMPT, 3) == [(102, " charlie"), (103, " delta"), (104, " echo")]
    assert FakeEngine.expected_text(PROMPT, 3, stop="delta") == " charlie"
    assert FakeEngine.finish_reason(PROMPT, 3, stop=["delta"]) == "stop"
    assert FakeEngine.prompt_tokens([{"role": "user", "content": "hi there"}]) == 3
    assert len(FakeEngine.generate("x")) == 16


def test_vllm_stream_bytes(servers):
    path, body = stream_call("vllm")
    raw = httpx.post(servers["vllm"].url + path, json=body).content
    assert raw.startswith(b'data: {"id":"cmpl-') and raw.endswith(b"\n\ndata: [DONE]\n\n")
    events = [json.loads(p) for p in payloads(raw)[:-1]]
    assert "".join(e["choices"][0]["text"] for e in events[:-1]) == FakeEngine.expected_text(PROMPT, 3)
    assert events[-1]["choices"] == [] and events[-1]["usage"]["completion_tokens"] == 3


def test_vllm_errors(servers):
    url, b = servers["vllm"].url, servers["vllm"].behaviour
    reply = httpx.post(url + "/v1/completions", json={"prompt": "x", "stream_options": {"include_usage": True}})
    assert reply.status_code == 400 and reply.json()["error"]["type"] == "BadRequestError"
    b.fail_status, b.retry_after = 429, "7"
    reply = httpx.post(url + "/v1/completions", json={"prompt": "x"})
    assert (reply.status_code, reply.headers["retry-after"]) == (429, "7")
    assert reply.json() == {"error": {"message": "simulated failure", "type": "TooManyRequestsError",
                                      "param": None, "code": 429}}
    assert httpx.post(url + "/v1/completions", json={"prompt": "x", "whatever": 1}).status_code == 200


def test_vllm_metrics_and_usage_switch(servers):
    url, b = servers["vllm"].url, servers["vllm"].behaviour
    b.running, b.kv_usage, b.report_usage = 3, 0.5, False
    text = httpx.get(url + "/metrics").text
    assert f'vllm:num_requests_running{{engine="0",model_name="{b.models[0]}"}} 3.0' in text
    assert 'vllm:kv_cache_usage_perc{engine="0"' in text
    path, body = stream_call("vllm")
    assert b'"usage"' not in httpx.post(url + path, json=body).content


def test_tgi_stream_bytes(servers):
    path, body = stream_call("tgi")
    reply = httpx.post(servers["tgi"].url + path, json=body)
    assert reply.headers["x-accel-buffering"] == "no" and reply.headers["content-type"] == "text/event-stream"
    assert reply.content.startswith(b'data:{"index":1,') and b"[DONE]" not in reply.content
    last = json.loads(payloads(reply.content)[-1])
    assert last["generated_text"] == FakeEngine.expected_text(PROMPT, 3)
    assert last["details"] == {"finish_reason": "length", "generated_tokens": 3, "seed": None, "input_length": 2}


@pytest.mark.parametrize("parameters", [{"temperature": 0}, {"top_p": 1.0}, {"top_k": 0}, {"max_new_tokens": 0},
                                        {"stop": list("abcde")}, {"max_new_tokens": 5000}])
def test_tgi_validation(servers, parameters):
    reply = httpx.post(servers["tgi"].url + "/generate", json={"inputs": PROMPT, "parameters": parameters})
    assert reply.status_code == 422 and reply.json()["error_type"] == "validation"
    assert reply.json()["error"].startswith("Input validation error: ")


def test_tgi_messages_stream(servers):
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "stream": True,
            "stream_options": {"include_usage": True}}
    raw = httpx.post(servers["tgi"].url + "/v1/chat/completions", json=body).content
    events = payloads(raw)
    assert raw.endswith(b"data:[DONE]\n\n") and json.loads(events[0])["usage"] is None
    assert json.loads(events[-2])["usage"]["total_tokens"] == 4


def test_trtllm_forbids_unknown_fields(servers):
    url = servers["trtllm"].url
    reply = httpx.post(url + "/v1/completions", json={"prompt": "x", "whatever": 1})
    assert reply.status_code == 400 and "extra_forbidden" in reply.json()["error"]
    reply = httpx.post(url + "/v1/chat/completions", json={"messages": []})
    assert reply.status_code == 400 and "'model'" in reply.json()["error"]
    path, body = stream_call("trtllm")
    raw = httpx.post(url + path, json=body).content
    assert raw.endswith(b"data: [DONE]\n\n") and json.loads(payloads(raw)[-2])["usage"]["completion_tokens"] == 3
    assert httpx.get(url + "/v1/models").json()["data"][0]["owned_by"] == "tensorrt_llm"


def test_triton_stream_and_errors(servers):
    url = servers["triton"].url
    path, body = stream_call("triton", return_num_output_tokens=True)
    reply = httpx.post(url + path, json=body)
    assert reply.headers["content-type"] == "text/event-stream; charset=utf-8" and b"[DONE]" not in reply.content
    events = [json.loads(p) for p in payloads(reply.content)]
    assert "".join(e["text_output"] for e in events) == FakeEngine.expected_text(PROMPT, 3)
    assert events[-1]["num_output_tokens"] == 3
    reply = httpx.post(url + "/v2/models/ensemble/generate", json={"text_input": "x"})
    assert reply.status_code == 400 and "max_tokens" in reply.json()["error"]
    reply = httpx.post(url + "/v2/models/x/generate", json={"text_input": "x", "max_tokens": 1})
    assert reply.json() == {"error": "Request for unknown model: 'x' is not found"}


MID_STREAM_ERRORS = {"vllm": {"error": {"message": "boom", "type": "InternalServerError", "param": None,
                                        "code": 500}},
                     "tgi": {"error": "boom", "error_type": "generation"}, "triton": {"error": "boom"}}


def test_error_event_inside_200_stream(server):
    server.behaviour.fail_after, server.behaviour.fail_message = 1, "boom"
    path, body = stream_call(server.kind)
    if server.kind == "trtllm":  # trtllm-serve's stream generator re-raises: the connection is cut
        with pytest.raises(httpx.RemoteProtocolError):
            httpx.post(server.url + path, json=body)
        return
    reply = httpx.post(server.url + path, json=body)
    assert reply.status_code == 200
    assert json.loads(payloads(reply.content)[1]) == MID_STREAM_ERRORS[server.kind]


def test_drop_after_cuts_the_connection(server):
    server.behaviour.drop_after = 1
    path, body = stream_call(server.kind)
    with pytest.raises(httpx.RemoteProtocolError):
        httpx.post(server.url + path, json=body)


def test_malformed_event(server):
    server.behaviour.malformed_after = 1
    path, body = stream_call(server.kind)
    with pytest.raises(ValueError):
        json.loads(payloads(httpx.post(server.url + path, json=body).content)[1])


def test_client_leaving_is_counted(server):
    server.behaviour.token_delay = 0.02
    path, body = stream_call(server.kind, max_tokens=100)
    with httpx.stream("POST", server.url + path, json=body) as reply:
        next(reply.iter_raw())
    assert server.behaviour.wait_for(lambda b: b.disconnects == 1)
    server.behaviour.token_delay = 0
    httpx.post(server.url + path, json=body)
    assert server.behaviour.disconnects == 1  # a finished stream is not a disconnect


def test_requests_are_logged(server):
    path, body = stream_call(server.kind)
    httpx.post(server.url + path, json=body, headers={"authorization": "Bearer k"})
    seen = server.behaviour.requests[-1]
    assert seen["path"] == path and seen["headers"]["authorization"] == "Bearer k"


HEALTH = {"vllm": "/health", "tgi": "/health", "trtllm": "/health", "triton": "/v2/health/ready"}


def test_health(server):
    assert httpx.get(server.url + HEALTH[server.kind]).status_code == 200
    server.behaviour.healthy = False
    assert httpx.get(server.url + HEALTH[server.kind]).status_code in (400, 503)
