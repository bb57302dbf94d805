"""The OpenAI-compatible API of ``infer serve`` on the wire: SSE framing, shapes, sampling fields, errors.

The tiny models have random weights: these tests assert the contract (fields, framing, counts,
determinism), never the text. Raw bytes come from a live server through httpx; the rest uses the
app in-process.
"""

from __future__ import annotations

import base64
import json
import math
import struct
import time

import httpx
import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from gateway.app import create_app
from gateway.openai.schemas import ChatCompletionRequest
from core.settings import ServerSettings
from ledger.usage import recent
from fakes.live import server_env

HI = [{"role": "user", "content": "hello there"}]


@pytest.fixture(scope="module")
def api(tiny_store, tmp_path_factory):
    env = server_env(tmp_path_factory.mktemp("openai-api") / "home", tiny_store.root, 11434)
    with TestClient(create_app(ServerSettings.from_env(env)), base_url="http://127.0.0.1:11434") as client:
        yield client


def chat(client, **fields):
    body = {"model": "tiny", "messages": HI, "max_tokens": 8, "seed": 1, **fields}
    return client.post("/v1/chat/completions", json=body)


def sse_payloads(raw: bytes) -> list[bytes]:
    """Split an SSE body into its ``data:`` payloads, asserting the exact framing."""
    assert raw.endswith(b"\n\n")
    events = raw[:-2].split(b"\n\n")
    for event in events:
        assert event.startswith(b"data: ") and b"\n" not in event, event
    return [event[len(b"data: "):] for event in events]


def stream_objects(raw: bytes) -> list[dict]:
    payloads = sse_payloads(raw)
    assert payloads[-1] == b"[DONE]" and b"[DONE]" not in payloads[:-1]
    return [json.loads(p) for p in payloads[:-1]]


def raw_stream(url: str, path: str, body: dict) -> tuple[httpx.Response, bytes]:
    with httpx.stream("POST", url + path, json=body, timeout=60) as response:
        return response, response.read()


# -- chat streaming ---------------------------------------------------------------------------------

def check_chat_stream(objs: list[dict], *, n: int = 1, usage: bool) -> None:
    assert len({o["id"] for o in objs}) == 1 and objs[0]["id"].startswith("chatcmpl-")
    assert len({o["created"] for o in objs}) == 1
    assert all(o["object"] == "chat.completion.chunk" and o["model"] == "tiny" for o in objs)
    assert all(o["system_fingerprint"] == "fp_infer" for o in objs)
    body = objs[:-1] if usage else objs
    for index in range(n):
        mine = [o["choices"][0] for o in body if o["choices"][0]["index"] == index]
        assert all(len(o["choices"]) == 1 for o in body)
        assert mine[0]["delta"]["role"] == "assistant"
        assert all("role" not in c["delta"] for c in mine[1:])
        final = mine[-1]
        assert final["delta"] == {} and final["finish_reason"] in ("stop", "length")
        for c in mine[:-1]:
            assert c["finish_reason"] is None and c["delta"].get("content"), c  # never empty before the end
    if usage:
        last = objs[-1]
        assert last["choices"] == [] and set(last["usage"]) >= {"prompt_tokens", "completion_tokens", "total_tokens"}
        assert last["usage"]["total_tokens"] == last["usage"]["prompt_tokens"] + last["usage"]["completion_tokens"]
        assert all(o["usage"] is None for o in objs[:-1])
    else:
        assert all("usage" not in o for o in objs)


def test_chat_stream_framing_on_the_wire(live_server):
    body = {"model": "tiny", "messages": HI, "max_tokens": 12, "seed": 5, "stream": True}
    response, raw = raw_stream(live_server.url, "/v1/chat/completions", body)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    objs = stream_objects(raw)
    check_chat_stream(objs, usage=False)

    response, raw = raw_stream(live_server.url, "/v1/chat/completions",
                               {**body, "stream_options": {"include_usage": True}})
    objs = stream_objects(raw)
    check_chat_stream(objs, usage=True)
    assert objs[-1]["usage"]["completion_tokens"] <= 12


def test_chat_stream_text_equals_non_stream_text(api):
    text = chat(api, max_tokens=12).json()["choices"][0]["message"]["content"]
    objs = stream_objects(chat(api, max_tokens=12, stream=True).content)
    assert "".join(o["choices"][0]["delta"].get("content", "") for o in objs) == text


def test_completions_stream_framing(live_server):
    body = {"model": "tiny", "prompt": "Once", "max_tokens": 6, "seed": 2, "stream": True,
            "stream_options": {"include_usage": True}}
    response, raw = raw_stream(live_server.url, "/v1/completions", body)
    assert response.status_code == 200
    objs = stream_objects(raw)
    assert len({o["id"] for o in objs}) == 1 and objs[0]["id"].startswith("cmpl-")
    assert all(o["object"] == "text_completion" for o in objs)
    *texts, final, usage = objs
    assert all(o["choices"][0]["text"] and o["choices"][0]["finish_reason"] is None for o in texts)
    assert final["choices"][0]["text"] == "" and final["choices"][0]["finish_reason"] in ("stop", "length")
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] <= 6


# -- non-streaming shapes ---------------------------------------------------------------------------

def test_chat_non_stream_shape(api):
    r = chat(api)
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    body = r.json()
    assert body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-")
    assert body["model"] == "tiny" and body["system_fingerprint"] == "fp_infer"
    assert isinstance(body["created"], int) and abs(body["created"] - time.time()) < 60
    (choice,) = body["choices"]
    assert choice["index"] == 0 and choice["message"]["role"] == "assistant"
    assert isinstance(choice["message"]["content"], str) and choice["logprobs"] is None
    assert choice["finish_reason"] in ("stop", "length")
    usage = body["usage"]
    assert 0 < usage["completion_tokens"] <= 8 and usage["prompt_tokens"] > 0
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert usage["prompt_tokens_details"]["cached_tokens"] >= 0


def test_completions_non_stream_shape(api):
    r = api.post("/v1/completions", json={"model": "tiny", "prompt": "Once", "max_tokens": 5, "seed": 1})
    body = r.json()
    assert r.status_code == 200 and body["object"] == "text_completion" and body["id"].startswith("cmpl-")
    (choice,) = body["choices"]
    assert set(choice) == {"index", "text", "logprobs", "finish_reason"}
    assert body["usage"]["completion_tokens"] <= 5


def test_chat_logprobs_shape(api):
    body = chat(api, logprobs=True, top_logprobs=3).json()
    entries = body["choices"][0]["logprobs"]["content"]
    assert len(entries) == body["usage"]["completion_tokens"]
    for e in entries:
        assert set(e) == {"token", "logprob", "bytes", "top_logprobs"} and e["logprob"] <= 0
        assert isinstance(e["bytes"], list) and len(e["top_logprobs"]) == 3
        tops = [t["logprob"] for t in e["top_logprobs"]]
        assert tops == sorted(tops, reverse=True) and set(e["top_logprobs"][0]) == {"token", "logprob", "bytes"}
    objs = stream_objects(chat(api, logprobs=True, stream=True, stream_options={"include_usage": True}).content)
    streamed = [e for o in objs[:-1] for e in (o["choices"][0]["logprobs"] or {"content": []})["content"]]
    assert len(streamed) == objs[-1]["usage"]["completion_tokens"]
    assert all(e["top_logprobs"] == [] for e in streamed)


def test_completions_legacy_logprobs_shape(api):
    body = api.post("/v1/completions", json={"model": "tiny", "prompt": "Once", "max_tokens": 5, "seed": 1,
                                              "logprobs": 2}).json()
    lp = body["choices"][0]["logprobs"]
    assert set(lp) == {"tokens", "token_logprobs", "top_logprobs", "text_offset"}
    n = body["usage"]["completion_tokens"]
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == len(lp["text_offset"]) == n
    assert lp["text_offset"][0] == 0 and lp["text_offset"] == sorted(lp["text_offset"])
    assert all(2 <= len(top) <= 3 and all(isinstance(v, float) for v in top.values()) for top in lp["top_logprobs"])


# -- sampling fields --------------------------------------------------------------------------------

def test_n_gives_n_choices_each_its_own_generation(api):
    before = len(recent(api.app.state.db, 200, model="tiny"))
    body = chat(api, n=2, seed=11).json()
    assert [c["index"] for c in body["choices"]] == [0, 1]
    solo = [chat(api, seed=11 + i).json()["choices"][0]["message"]["content"] for i in range(2)]
    assert [c["message"]["content"] for c in body["choices"]] == solo  # choice i uses seed + i
    assert body["usage"]["completion_tokens"] <= 16
    objs = stream_objects(chat(api, n=2, stream=True, stream_options={"include_usage": True}).content)
    check_chat_stream(objs, n=2, usage=True)
    _wait_rows(api, before + 6)  # one ledger row per generation


def _wait_rows(api, count: int) -> None:
    deadline = time.monotonic() + 5
    while len(recent(api.app.state.db, 200, model="tiny")) < count and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(recent(api.app.state.db, 200, model="tiny")) >= count


def test_same_seed_gives_same_text(api):
    texts = {chat(api, seed=42, max_tokens=12, temperature=1.0).json()["choices"][0]["message"]["content"]
             for _ in range(2)}
    assert len(texts) == 1


def test_stop_cuts_the_text_before_the_stop_string(api):
    body = chat(api, seed=9, max_tokens=16, logprobs=True).json()
    text = body["choices"][0]["message"]["content"]
    tokens = [e["token"] for e in body["choices"][0]["logprobs"]["content"]]
    stop = next(t for t in tokens[2:] if t.strip() and "\ufffd" not in t)  # a clean token past the start
    for fields in ({"stop": stop}, {"stop": [stop, "never-generated-zzz"]}):
        cut = chat(api, seed=9, max_tokens=16, **fields).json()["choices"][0]
        assert cut["message"]["content"] == text[: text.index(stop)]
        assert cut["finish_reason"] == "stop"


def test_json_object_response_format(api):
    """With the JSON grammar the output parses when the model finishes; seed 3 finishes in budget with the
    tiny model. A choice cut by max_tokens is only checked to be the start of a JSON object."""
    finished = 0
    for seed in (3, 0):
        choice = chat(api, seed=seed, max_tokens=64, response_format={"type": "json_object"}).json()["choices"][0]
        text = choice["message"]["content"]
        if choice["finish_reason"] == "stop":
            assert isinstance(json.loads(text), dict)
            finished += 1
        else:
            assert text.lstrip().startswith("{")
    assert finished >= 1


def test_json_schema_response_format(api):
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    fmt = {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}
    choice = chat(api, seed=1, max_tokens=64, response_format=fmt).json()["choices"][0]
    assert choice["finish_reason"] == "stop" and isinstance(json.loads(choice["message"]["content"])["ok"], bool)
    bad = chat(api, response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "frob"}}})
    assert bad.status_code == 400 and bad.json()["error"]["type"] == "invalid_request_error"
    assert chat(api, response_format={"type": "json_schema"}).status_code == 400


def test_field_mapping_to_backend_options():
    body = ChatCompletionRequest.model_validate({
        "model": "m", "messages": [{"role": "developer", "content": "be brief"},
                                   {"role": "user", "content": [{"type": "text", "text": "a"},
                                                                {"type": "text", "text": "b"}]},
                                   {"role": "assistant", "content": None}, {"role": "tool", "content": "42"}],
        "max_tokens": 5, "max_completion_tokens": 7, "seed": 10, "stop": "x", "n": 2, "user": "ignored",
        "response_format": {"type": "json_schema", "json_schema": {"name": "t", "schema": {"type": "object"}}}})
    first, second = body.generation_requests("client")
    assert first.options == {"num_predict": 7, "seed": 10, "stop": ["x"]}  # no forced temperature/top_p
    assert second.options["seed"] == 11 and first.strict_max_tokens and first.format == {"type": "object"}
    assert first.messages == [{"role": "system", "content": "be brief"}, {"role": "user", "content": "a\nb"},
                              {"role": "assistant", "content": ""}, {"role": "tool", "content": "42"}]


# -- models and embeddings --------------------------------------------------------------------------

def test_models_list_and_retrieve(api):
    body = api.get("/v1/models").json()
    assert body["object"] == "list"
    ids = {m["id"]: m for m in body["data"]}
    assert {"tiny:latest", "tiny-go:latest"} <= set(ids)
    assert ids["tiny:latest"]["object"] == "model" and ids["tiny:latest"]["owned_by"] == "library"
    assert isinstance(ids["tiny:latest"]["created"], int)
    assert api.get("/v1/models/tiny").json() == ids["tiny:latest"]
    assert api.get("/v1/models/tiny:latest").json() == ids["tiny:latest"]
    missing = api.get("/v1/models/nope:1b")
    assert missing.status_code == 404 and missing.json()["error"]["type"] == "not_found_error"


def test_embeddings_float_base64_dimensions_and_ledger(api):
    r = api.post("/v1/embeddings", json={"model": "tiny", "input": ["hello world", "bye"]})
    body = r.json()
    assert r.status_code == 200 and body["object"] == "list" and body["model"] == "tiny"
    assert [d["index"] for d in body["data"]] == [0, 1] and all(d["object"] == "embedding" for d in body["data"])
    vec = body["data"][0]["embedding"]
    assert body["usage"]["prompt_tokens"] == body["usage"]["total_tokens"] > 0
    b64 = api.post("/v1/embeddings", json={"model": "tiny", "input": "hello world", "encoding_format": "base64"})
    raw = base64.b64decode(b64.json()["data"][0]["embedding"])
    assert struct.unpack(f"<{len(raw) // 4}f", raw) == pytest.approx(vec, rel=1e-5, abs=1e-6)
    small = api.post("/v1/embeddings", json={"model": "tiny", "input": "hello world", "dimensions": 8}).json()
    cut = small["data"][0]["embedding"]
    assert len(cut) == 8 and math.isclose(math.fsum(x * x for x in cut), 1.0, rel_tol=1e-6)
    too_big = api.post("/v1/embeddings", json={"model": "tiny", "input": "x", "dimensions": len(vec) + 1})
    assert too_big.status_code == 400 and too_big.json()["error"]["param"] == "dimensions"
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        rows = [r for r in recent(api.app.state.db, 50, model="tiny") if r.route == "/v1/embeddings"]
        if len(rows) >= 3:
            break
        time.sleep(0.05)
    ok = [r for r in rows if r.status == "ok"]
    assert len(ok) >= 3 and all(r.source == "gateway" and r.input_tokens > 0 for r in ok)
    assert body["usage"]["prompt_tokens"] in {r.input_tokens for r in ok}


# -- errors: each one is followed by a request that succeeds ----------------------------------------

BAD_CHAT = {
    "invalid-json": (b'{"model": "tiny", "messages": [', 400, "invalid_request_error", None),
    "unknown-model": ({"model": "no-such-model", "messages": HI}, 404, "not_found_error", None),
    "negative-max-tokens": ({"model": "tiny", "messages": HI, "max_tokens": -1}, 400, "invalid_request_error", None),
    "zero-max-tokens": ({"model": "tiny", "messages": HI, "max_tokens": 0}, 400, "invalid_request_error", None),
    "huge-max-tokens": ({"model": "tiny", "messages": HI, "max_tokens": 10**9}, 400, "invalid_request_error", None),
    "huge-max-tokens-stream": ({"model": "tiny", "messages": HI, "max_tokens": 10**9, "stream": True}, 400,
                               "invalid_request_error", None),
    "messages-string": ({"model": "tiny", "messages": "hello"}, 400, "invalid_request_error", None),
    "temperature-hot": ({"model": "tiny", "messages": HI, "temperature": "hot"}, 400, "invalid_request_error", None),
    "bad-role": ({"model": "tiny", "messages": [{"role": "robot", "content": "x"}]}, 400,
                 "invalid_request_error", None),
    "five-stops": ({"model": "tiny", "messages": HI, "stop": list("abcde")}, 400, "invalid_request_error", None),
    "n-too-big": ({"model": "tiny", "messages": HI, "n": 9}, 400, "invalid_request_error", None),
    "top-logprobs-21": ({"model": "tiny", "messages": HI, "logprobs": True, "top_logprobs": 21}, 400,
                        "invalid_request_error", None),
    "stream-options-no-stream": ({"model": "tiny", "messages": HI, "stream_options": {"include_usage": True}}, 400,
                                 "invalid_request_error", None),
    "image-part": ({"model": "tiny", "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}]}, 400,
        "invalid_request_error", None),
    "over-context": ({"model": "tiny", "messages": [{"role": "user", "content": "hello " * 600}]}, 400,
                     "invalid_request_error", "context_length_exceeded"),
}


def _ok(url: str) -> None:
    r = httpx.post(url + "/v1/chat/completions", json={"model": "tiny", "messages": HI, "max_tokens": 2}, timeout=60)
    assert r.status_code == 200 and r.json()["choices"][0]["finish_reason"] in ("stop", "length")


def _check_error(r: httpx.Response, status: int, kind: str, code: str | None) -> dict:
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/json"
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    assert err["type"] == kind and err["code"] == code
    return err


@pytest.mark.parametrize("case", list(BAD_CHAT))
def test_chat_errors_then_the_server_keeps_serving(live_server, case):
    body, status, kind, code = BAD_CHAT[case]
    send = {"content": body, "headers": {"content-type": "application/json"}} if isinstance(body, bytes) \
        else {"json": body}
    r = httpx.post(live_server.url + "/v1/chat/completions", timeout=60, **send)
    err = _check_error(r, status, kind, code)
    if case == "image-part":
        assert err["message"] == "images are not supported by this model"
    if "max-tokens" in case:
        assert err["param"] == "max_tokens"
    _ok(live_server.url)


@pytest.mark.parametrize("path, body", [
    ("/v1/completions", {"model": "tiny", "prompt": [[1, "2", 3]]}),
    ("/v1/completions", {"model": "tiny", "prompt": "x", "max_tokens": -5}),
    ("/v1/embeddings", {"model": "tiny", "input": [[1, 2, 3], "x"]}),
    ("/v1/embeddings", {"model": "tiny", "input": "x", "encoding_format": "int8"}),
])
def test_other_routes_validate_then_keep_serving(live_server, path, body):
    _check_error(httpx.post(live_server.url + path, json=body, timeout=60), 400, "invalid_request_error", None)
    _ok(live_server.url)


def test_unknown_route_is_an_openai_404(live_server):
    err = _check_error(httpx.get(live_server.url + "/v1/nothing-here", timeout=10), 404, "not_found_error", None)
    assert "/v1/nothing-here" in err["message"]
    _ok(live_server.url)


def test_oversize_body_is_413_then_keeps_serving(live_server):
    big = b'{"model": "tiny", "messages": [{"role": "user", "content": "' + b"x" * (33 << 20) + b'"}]}'
    r = httpx.post(live_server.url + "/v1/chat/completions", content=big,
                   headers={"content-type": "application/json"}, timeout=60)
    _check_error(r, 413, "invalid_request_error", None)
    _ok(live_server.url)


def test_our_engines_report_the_prompt_tokens_their_prefix_cache_served(live_server):
    """A second turn behind the same system prompt: the engine (llama.cpp's slot reuse, the native
    engine's block hashes) prefills only the rest, and says so in usage and in the ledger."""
    system = {"role": "system", "content": "You answer in one short sentence about rivers. " * 12}
    body = lambda text: {"model": "tiny", "max_tokens": 2, "seed": 1,  # noqa: E731
                         "messages": [system, {"role": "user", "content": text}]}
    first = httpx.post(live_server.url + "/v1/chat/completions", json=body("first question"), timeout=60).json()
    second = httpx.post(live_server.url + "/v1/chat/completions", json=body("second question"), timeout=60).json()
    assert first["usage"]["prompt_tokens_details"]["cached_tokens"] < 16
    cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert 64 <= cached < second["usage"]["prompt_tokens"]
    db = sa.create_engine(live_server.db_url)
    deadline = time.monotonic() + 10
    try:
        while time.monotonic() < deadline:
            with db.connect() as conn:
                rows = list(conn.execute(sa.text("SELECT input_tokens, cached_input_tokens FROM requests "
                                                 "WHERE input_tokens = :n ORDER BY rowid"),
                                         {"n": second["usage"]["prompt_tokens"]}))
            if rows and rows[-1].cached_input_tokens == cached:
                break
            time.sleep(0.1)
    finally:
        db.dispose()
    assert rows[-1].cached_input_tokens == cached
