"""The Ollama API of ``infer serve`` on the wire: NDJSON framing, fields, metrics, errors.

Raw httpx against a live server over a private copy of the tiny models (this module creates one).
The tiny models have random weights: the tests check the contract, never the text.
"""

from __future__ import annotations

import json
import re
import time

import httpx
import pytest

from tests.gateway.conftest import private_store

TS = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{1,9})?Z$")
METRICS = ("total_duration", "load_duration", "prompt_eval_count", "prompt_eval_duration", "eval_count",
           "eval_duration")
FAST = {"num_predict": 8, "seed": 7}
LONG_PROMPT = "hello world " * 400  # far over the tiny models' 512-token context


@pytest.fixture(scope="module")
def tiny_store(tiny_store, tmp_path_factory):
    """A module-private copy: /api/create below must not change the session's store."""
    return private_store(tiny_store, tmp_path_factory, "ollama-api")


@pytest.fixture(scope="module")
def http(live_server):
    with httpx.Client(base_url=live_server.url, timeout=60) as client:
        yield client


def ndjson(resp: httpx.Response) -> list[dict]:
    """Exactly one JSON object per \\n-terminated line."""
    assert resp.status_code == 200, resp.text
    assert resp.headers["content-type"] == "application/x-ndjson"
    assert resp.text.endswith("\n")
    lines = resp.text.split("\n")[:-1]
    assert lines and all(lines)
    return [json.loads(line) for line in lines]


def check_final(obj: dict, model: str) -> None:
    assert obj["done"] is True and obj["model"] == model and TS.match(obj["created_at"])
    assert obj["done_reason"] in ("stop", "length")
    for key in METRICS:
        assert isinstance(obj[key], int) and obj[key] >= 0, key
    assert obj["total_duration"] > 0 and obj["prompt_eval_count"] > 0


def assert_serving(http: httpx.Client) -> None:
    resp = http.post("/api/generate", json={"model": "tiny", "prompt": "hi", "stream": False,
                                            "options": {"num_predict": 1}})
    assert resp.status_code == 200 and resp.json()["done"] is True


def generate(http, **body) -> dict:
    resp = http.post("/api/generate", json={"model": "tiny", "stream": False, **body})
    assert resp.status_code == 200, resp.text
    assert resp.headers["content-type"] == "application/json"
    return resp.json()


# -- /api/generate --------------------------------------------------------------------------------

def test_generate_streams_ndjson_chunks_then_a_final_record(http):
    lines = ndjson(http.post("/api/generate", json={"model": "tiny", "prompt": "Why is the sky blue?",
                                                    "options": FAST}))
    *chunks, final = lines
    for chunk in chunks:
        assert chunk["done"] is False and chunk["model"] == "tiny" and TS.match(chunk["created_at"])
        assert isinstance(chunk["response"], str)
    check_final(final, "tiny")
    assert final["response"] == "" and final["eval_count"] <= 8
    assert final["context"] and all(isinstance(t, int) for t in final["context"])
    assert len(final["context"]) == final["prompt_eval_count"] + final["eval_count"]


def test_generate_without_streaming_matches_the_stream_for_a_fixed_seed(http):
    streamed = ndjson(http.post("/api/generate", json={"model": "tiny", "prompt": "Count", "options": FAST}))
    text = "".join(line["response"] for line in streamed)
    first = generate(http, prompt="Count", options=FAST)
    second = generate(http, prompt="Count", options=FAST)
    check_final(first, "tiny")
    assert first["response"] == second["response"] == text
    assert first["eval_count"] == streamed[-1]["eval_count"]


def test_raw_generate_has_no_context(http):
    out = generate(http, prompt="<|im_start|>user\nhi", raw=True, options=FAST)
    check_final(out, "tiny")
    assert "context" not in out


def test_format_json_constrains_the_output(http, live_server):
    if live_server.engine == "native":  # a format that is neither "json" nor a schema: a clear 400
        resp = http.post("/api/generate", json={"model": "tiny", "stream": False, "prompt": "x", "format": "yaml"})
        assert resp.status_code == 400 and "format" in resp.json()["error"], resp.text
    out = generate(http, prompt="Give me JSON", format="json", options={"num_predict": 48, "seed": 1})
    assert out["response"].lstrip().startswith("{")
    if out["done_reason"] == "stop":
        json.loads(out["response"])
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    out = generate(http, prompt="A number", format=schema, options={"num_predict": 48, "seed": 1})
    if out["done_reason"] == "stop":
        assert isinstance(json.loads(out["response"])["n"], int)
    else:
        assert out["response"].lstrip().startswith("{")


def test_request_options_override_the_model_params_layer(http):
    created = http.post("/api/create", json={"model": "tiny-short", "from": "tiny", "stream": False,
                                             "parameters": {"num_predict": 2, "temperature": 0}})
    assert created.json() == {"status": "success"}
    assert generate(http, model="tiny-short", prompt="Tell me", options={"seed": 3})["eval_count"] <= 2
    out = generate(http, model="tiny-short", prompt="Tell me", options={"seed": 3, "num_predict": 6})
    assert out["eval_count"] == 6 or (2 < out["eval_count"] < 6 and out["done_reason"] == "stop")


def test_logprobs_come_with_the_chunks(http):
    lines = ndjson(http.post("/api/generate", json={"model": "tiny", "prompt": "hi", "options": FAST,
                                                    "logprobs": True, "top_logprobs": 2}))
    probs = [lp for line in lines for lp in line.get("logprobs", [])]
    assert len(probs) == lines[-1]["eval_count"]
    assert all(len(lp["top_logprobs"]) == 2 and lp["logprob"] <= 0 for lp in probs)


def test_empty_prompt_loads_and_keep_alive_zero_unloads(http):
    loaded = generate(http, prompt="")
    assert loaded == {"model": "tiny", "created_at": loaded["created_at"], "response": "", "done": True,
                      "done_reason": "load"}
    assert "tiny:latest" in [m["name"] for m in http.get("/api/ps").json()["models"]]
    assert generate(http, prompt="", keep_alive="0s")["done_reason"] == "unload"
    assert "tiny:latest" not in [m["name"] for m in http.get("/api/ps").json()["models"]]


# -- /api/chat ------------------------------------------------------------------------------------

@pytest.mark.parametrize("model", ["tiny", "tiny-go"])
def test_chat_stream_never_sends_an_empty_chunk_before_the_last(http, model):
    for seed in range(4):
        lines = ndjson(http.post("/api/chat", json={
            "model": model, "messages": [{"role": "USER", "content": "Hello there"}],
            "options": {"num_predict": 12, "seed": seed}}))
        *chunks, final = lines
        for chunk in chunks:
            assert chunk["done"] is False and chunk["message"]["role"] == "assistant"
            assert chunk["message"]["content"] != ""
        check_final(final, model)
        assert final["message"] == {"role": "assistant", "content": ""} and "context" not in final


def test_chat_without_streaming_is_one_object(http):
    body = {"model": "tiny-go", "messages": [{"role": "user", "content": "hi"}], "stream": False, "options": FAST}
    resp = http.post("/api/chat", json=body)
    assert resp.headers["content-type"] == "application/json"
    out = resp.json()
    check_final(out, "tiny-go")
    assert out["message"]["role"] == "assistant" and isinstance(out["message"]["content"], str)


def test_empty_messages_load_and_ps_shows_the_model(http):
    out = http.post("/api/chat", json={"model": "tiny", "messages": []}).json()
    assert out["done_reason"] == "load" and out["message"] == {"role": "assistant", "content": ""}
    [entry] = [m for m in http.get("/api/ps").json()["models"] if m["name"] == "tiny:latest"]
    assert entry["model"] == "tiny:latest" and entry["size_vram"] == 0 and entry["context_length"] == 512
    assert re.match(r"^\d{4}-\d\d-\d\dT", entry["expires_at"]) and re.fullmatch(r"[0-9a-f]{64}", entry["digest"])
    assert entry["details"]["family"] == "qwen2" and entry["size"] > 0
    out = http.post("/api/chat", json={"model": "tiny", "messages": [], "keep_alive": 0}).json()
    assert out["done_reason"] == "unload"
    assert "tiny:latest" not in [m["name"] for m in http.get("/api/ps").json()["models"]]


def test_truncate_drops_the_oldest_messages_instead_of_failing(http):
    history = [{"role": "user" if i % 2 == 0 else "assistant", "content": LONG_PROMPT[:300]} for i in range(12)]
    messages = [*history, {"role": "user", "content": "and now?"}]
    body = {"model": "tiny", "messages": messages, "stream": False, "options": FAST}
    for refused in (http.post("/api/chat", json=body), http.post("/api/chat", json={**body, "truncate": False})):
        assert refused.status_code == 400 and "context" in refused.json()["error"]  # never silently truncated
    out = http.post("/api/chat", json={**body, "truncate": True})
    assert out.status_code == 200 and out.json()["prompt_eval_count"] < 512
    assert out.json()["truncated_messages"] > 0  # and the truncation is reported


# -- errors ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("path,body,status,message", [
    ("/api/chat", b"{not json", 400, "invalid JSON"),
    ("/api/generate", {"model": "nope", "prompt": "x"}, 404, "model 'nope' not found"),
    ("/api/chat", {"model": "nope", "messages": [{"role": "user", "content": "x"}]}, 404, "model 'nope' not found"),
    ("/api/show", {"model": "nope"}, 404, "model 'nope' not found"),
    ("/api/chat", {"model": "tiny", "messages": "hello"}, 400, "messages"),
    ("/api/generate", {"model": "tiny", "prompt": "x", "stream": "yes"}, 400, "stream"),
    ("/api/generate", {"model": "tiny", "prompt": "x", "options": "hot"}, 400, "options"),
    ("/api/generate", {"model": "tiny", "prompt": "x", "options": {"temperature": "hot"}}, 400, "temperature"),
    ("/api/generate", {"model": "tiny", "prompt": "x", "keep_alive": "soon"}, 400, "keep_alive"),
    ("/api/generate", {"model": "tiny", "prompt": "x", "format": "yaml"}, 400, "format"),
    ("/api/generate", {"model": "tiny", "prompt": "x", "images": ["aGk="]}, 400, "images are not supported"),
    ("/api/chat", {"model": "tiny", "messages": [{"role": "user", "content": "x", "images": ["aGk="]}]},
     400, "images are not supported"),
    ("/api/generate", {"model": "tiny", "prompt": LONG_PROMPT}, 400, "context window"),
    ("/api/generate", {"prompt": "x"}, 400, "model"),
    ("/api/embed", {"model": "nope", "input": "x"}, 404, "model 'nope' not found"),
    ("/api/embed", {"model": "tiny", "input": LONG_PROMPT, "truncate": False}, 400, "too long"),
    ("/api/embed", {"model": "tiny", "input": 3}, 400, "input"),
    ("/api/create", {"model": "x", "from": "/etc/passwd"}, 404, "not found"),
    ("/api/create", {"model": "x", "from": "tiny", "parameters": {"bogus": 1}}, 400, "bogus"),
    ("/api/create", {"model": "x"}, 400, "neither 'from' nor 'files'"),
    ("/api/pull", {"model": "bad//name"}, 400, "invalid model name"),
    ("/api/nothing-here", {}, 404, "not found"),
])
def test_errors_are_ollama_shaped_and_the_server_keeps_serving(http, path, body, status, message):
    kwargs = {"content": body, "headers": {"content-type": "application/json"}} if isinstance(body, bytes) else {"json": body}
    resp = http.post(path, **kwargs)
    assert resp.status_code == status, resp.text
    assert list(resp.json()) == ["error"] and message in resp.json()["error"]
    if status == 404 and "nope" in message:
        assert resp.json() == {"error": message}
    assert_serving(http)


def test_oversize_body_is_413(http):
    resp = http.post("/api/chat", content=b"x" * (33 << 20), headers={"content-type": "application/json"})
    assert resp.status_code == 413 and "too large" in resp.json()["error"]
    assert_serving(http)


# -- embeddings and listings ----------------------------------------------------------------------

def test_embed_batches_and_records_usage(http, live_server):
    out = http.post("/api/embed", json={"model": "tiny", "input": ["one", "two words"]}).json()
    assert out["model"] == "tiny" and len(out["embeddings"]) == 2
    assert len({len(v) for v in out["embeddings"]}) == 1
    assert out["prompt_eval_count"] > 0 and isinstance(out["total_duration"], int)
    short = http.post("/api/embed", json={"model": "tiny", "input": "one", "dimensions": 8}).json()
    assert len(short["embeddings"][0]) == 8
    assert abs(sum(x * x for x in short["embeddings"][0]) - 1) < 1e-6
    legacy = http.post("/api/embeddings", json={"model": "tiny", "prompt": "one"}).json()
    assert list(legacy) == ["embedding"] and len(legacy["embedding"]) == len(out["embeddings"][0])

    from ledger.db import open_db
    from ledger.usage import recent

    engine = open_db(live_server.db_url)
    try:
        for _ in range(50):  # ledger rows are written just after the answer
            rows = [r for r in recent(engine, 200) if r.route in ("/api/embed", "/api/embeddings")]
            ok = [r for r in rows if r.status == "ok"]
            if len(ok) >= 3:
                break
            time.sleep(0.1)
    finally:
        engine.dispose()
    assert len(ok) >= 3 and all(r.input_tokens > 0 and r.model == "tiny" and r.total_ms for r in ok)
    assert all(r.error for r in rows if r.status == "error")


def test_tags_lists_models_newest_first_with_details(http):
    models = http.get("/api/tags").json()["models"]
    names = [m["name"] for m in models]
    assert {"tiny:latest", "tiny-go:latest"} <= set(names)
    assert [m["modified_at"] for m in models] == sorted((m["modified_at"] for m in models), reverse=True)
    tiny = models[names.index("tiny:latest")]
    assert re.fullmatch(r"[0-9a-f]{64}", tiny["digest"]) and tiny["size"] > 0
    assert tiny["details"]["format"] == "gguf" and tiny["details"]["families"] == ["qwen2"]
    assert tiny["details"]["quantization_level"] == "F32" and tiny["details"]["parameter_size"]
    assert http.head("/api/tags").status_code == 200


def test_show_describes_the_model(http):
    out = http.post("/api/show", json={"name": "tiny-go"}).json()
    assert out["system"] == "You are a tiny test model." and "{{ .Prompt }}" in out["template"]
    assert out["parameters"].splitlines() == [f"{'num_ctx':<30} 512", f"{'stop':<30} \"<|im_start|>\"",
                                              f"{'stop':<30} \"<|im_end|>\""]
    assert out["modelfile"].startswith("# Modelfile generated") and "FROM " in out["modelfile"]
    info = out["model_info"]
    assert info["general.architecture"] == "qwen2" and info["qwen2.context_length"] > 0
    assert info["tokenizer.ggml.tokens"] == []
    assert out["capabilities"] == ["completion"] and out["details"]["family"] == "qwen2"
    verbose = http.post("/api/show", json={"model": "tiny-go", "verbose": True}).json()
    assert len(verbose["model_info"]["tokenizer.ggml.tokens"]) > 100


# -- chunk shaping, with a scripted backend ---------------------------------------------------------

class ScriptedBackend:
    """Streams a fixed script: a text chunk, an empty chunk carrying a logprob, another text chunk."""

    name, can_stream, supports_embeddings = "scripted", True, False

    async def stream(self, request):
        from core.base import Chunk, Done, Timings, TokenLogprob, Usage

        def lp(token: str) -> list:
            return [TokenLogprob(token=token, logprob=-0.5, bytes=list(token.encode()))]
        yield Chunk("Hel", logprobs=lp("Hel"))
        yield Chunk("", logprobs=lp("\xe2"))
        yield Chunk("lo", logprobs=lp("lo"))
        done = Done("stop", Usage(3, 3), Timings(load=0.5, prompt_eval=0.25, eval=1.0, total=2.0),
                    prompt_tokens=[1, 2, 3], output_tokens=[4, 5, 6])
        yield done

    async def aclose(self):
        pass


def test_empty_chunks_are_skipped_and_their_logprobs_carried(tiny_store, tmp_path):
    from fastapi.testclient import TestClient

    from gateway.app import create_app
    from core.settings import ServerSettings
    from fakes.live import server_env

    settings = ServerSettings.from_env(server_env(tmp_path / "home", tiny_store.root, 11434))
    with TestClient(create_app(settings, backend=ScriptedBackend()), base_url="http://127.0.0.1:11434") as client:
        lines = ndjson(client.post("/api/chat", json={"model": "m", "messages": [{"role": "user", "content": "x"}],
                                                      "logprobs": True}))
        assert [line["message"]["content"] for line in lines] == ["Hel", "lo", ""]
        assert [lp["token"] for lp in lines[1]["logprobs"]] == ["\xe2", "lo"]
        assert lines[-1]["total_duration"] == 2_000_000_000 and lines[-1]["load_duration"] == 500_000_000
        assert lines[-1]["prompt_eval_duration"] == 250_000_000 and lines[-1]["eval_duration"] == 1_000_000_000
        gen = client.post("/api/generate", json={"model": "m", "prompt": "x", "stream": False}).json()
        assert gen["response"] == "Hello" and gen["context"] == [1, 2, 3, 4, 5, 6]
