"""Ollama adapter: pass-through request bodies and NDJSON parsing (ollama.md §2), against recorded bytes."""

from __future__ import annotations

import asyncio
import json
from datetime import datetime

import httpx
import pytest

from core.base import Done, GenerationRequest
from core.errors import BackendOverloaded, BackendProtocolError, BackendUnavailable, InvalidRequest
from adapters.remote.ollama import OllamaBackend
from adapters.remote.base import RemoteSettings
from fakes.recorded import recorded_server

FINAL = {"model": "qwen2:0.5b", "created_at": "2025-07-07T20:22:19.19314Z",
         "message": {"role": "assistant", "content": ""}, "done_reason": "stop", "done": True,
         "total_duration": 182242375, "load_duration": 41295167,
         "prompt_eval_count": 169, "prompt_eval_duration": 24573166, "eval_count": 15, "eval_duration": 115959084}


def chat_line(text: str) -> dict:
    return {"model": "qwen2:0.5b", "created_at": "2025-07-07T20:22:19Z",
            "message": {"role": "assistant", "content": text}, "done": False}


def ndjson(*objects: dict, status: int = 200) -> httpx.Response:
    text = "".join(json.dumps(o) + "\n" for o in objects)
    return httpx.Response(status, content=text.encode(), headers={"content-type": "application/x-ndjson"})


class Server:
    def __init__(self, reply: httpx.Response | None = None, routes: dict | None = None):
        self.reply = reply or ndjson(chat_line("Hel"), chat_line("lo"), FINAL)
        self.routes = routes or {}
        self.bodies: dict[str, dict] = {}

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.content:
            self.bodies[request.url.path] = json.loads(request.content)
        return self.routes.get(request.url.path, self.reply)


def backend(server, **settings) -> OllamaBackend:
    url = recorded_server(server).url
    return OllamaBackend(RemoteSettings(name="pub", type="ollama", base_url=url, model="qwen2:0.5b", **settings))


def run(ollama: OllamaBackend, request: GenerationRequest) -> list:
    async def go():
        return [event async for event in ollama.stream(request)]
    return asyncio.run(go())


def chat(**kw) -> GenerationRequest:
    return GenerationRequest(model="pub", messages=[{"role": "user", "content": "hi"}], **kw)


def test_chat_body_passes_options_keep_alive_format_and_tools_with_the_backend_model():
    server = Server()
    tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    run(backend(server), chat(options={"temperature": 0.2, "num_ctx": 4096, "engine": "native"}, keep_alive=300,
                              format="json", tools=tools))
    assert server.bodies["/api/chat"] == {
        "model": "qwen2:0.5b", "stream": True, "messages": [{"role": "user", "content": "hi"}],
        "options": {"temperature": 0.2, "num_ctx": 4096}, "format": "json", "tools": tools, "keep_alive": 300}


def test_generate_body_and_response_chunks():
    reply = ndjson({"response": "The", "done": False}, {"response": " end", "done": False},
                   {"response": "", "done": True, "done_reason": "length", "eval_count": 2})
    server = Server(reply)
    request = GenerationRequest(model="pub", prompt="p", system="s", suffix="x", template="{{ .Prompt }}", raw=True,
                                stream=False, keep_alive=0.5)
    events = run(backend(server), request)
    assert server.bodies["/api/generate"] == {
        "model": "qwen2:0.5b", "stream": False, "prompt": "p", "system": "s", "suffix": "x",
        "template": "{{ .Prompt }}", "raw": True, "keep_alive": 0.5}
    assert "".join(e.text for e in events[:-1]) == "The end" and events[-1].finish_reason == "length"


def test_final_chunk_gives_usage_and_backend_timings():
    events = run(backend(Server()), chat())
    done = events[-1]
    assert isinstance(done, Done) and done.finish_reason == "stop"
    assert (done.usage.input_tokens, done.usage.output_tokens, done.usage.source) == (169, 15, "backend")
    assert done.timings.prompt_eval == pytest.approx(0.024573166)
    assert done.timings.eval == pytest.approx(0.115959084)


def test_mid_stream_error_line_keeps_200_and_is_mapped_with_partial_usage():
    reply = ndjson(chat_line("Hel"), {"error": "an error was encountered while running the model"})
    with pytest.raises(BackendUnavailable, match="while running the model") as info:
        run(backend(Server(reply)), chat())
    assert info.value.partial.usage.output_tokens >= 1


def test_stream_without_done_line_is_incomplete():
    with pytest.raises(BackendProtocolError, match="incomplete stream"):
        run(backend(Server(ndjson(chat_line("a")))), chat())


def test_error_replies():
    missing = httpx.Response(404, json={"error": "model 'qwen2:0.5b' not found"})
    with pytest.raises(BackendUnavailable, match=r"ollama backend 'pub'.*qwen2:0.5b"):
        run(backend(Server(missing)), chat())
    with pytest.raises(InvalidRequest, match=r"^invalid format$"):
        run(backend(Server(httpx.Response(400, json={"error": "invalid format"}))), chat())
    with pytest.raises(BackendOverloaded) as busy:
        run(backend(Server(httpx.Response(503, json={"error": "server busy, please try again"}))), chat())
    assert busy.value.retry_after == 1.0


def test_models_loaded_models_unload_and_embed():
    tags = httpx.Response(200, json={"models": [{"name": "qwen2:0.5b"}, {"name": "llama3:latest"}]})
    entry = {"name": "qwen2:0.5b", "model": "qwen2:0.5b", "size": 123, "digest": "abc",
             "expires_at": "2024-12-06T00:48:09.983619123Z", "context_length": 4096}
    ps = httpx.Response(200, json={"models": [entry]})
    embed = httpx.Response(200, json={"model": "qwen2:0.5b", "embeddings": [[0.1, 0.2]], "total_duration": 2000000000,
                                      "load_duration": 1000000000, "prompt_eval_count": 3})
    unloaded = httpx.Response(200, json={"model": "qwen2:0.5b", "done": True, "done_reason": "unload"})
    server = Server(routes={"/api/tags": tags, "/api/ps": ps, "/api/embed": embed, "/api/generate": unloaded})
    ollama = backend(server)

    async def go():
        assert await ollama.models() == ["qwen2:0.5b", "llama3:latest"]
        [loaded] = await ollama.loaded_models()
        assert (loaded.name, loaded.size, loaded.digest, loaded.context_length) == ("pub", 123, "abc", 4096)
        assert loaded.expires_at == datetime.fromisoformat("2024-12-06T00:48:09.983619+00:00").timestamp()
        assert await ollama.unload("pub") is True
        result = await ollama.embed("pub", ["a"], keep_alive=60)
        assert (result.embeddings, result.input_tokens, result.load, result.total) == ([[0.1, 0.2]], 3, 1.0, 2.0)
    asyncio.run(go())
    assert server.bodies["/api/generate"] == {"model": "qwen2:0.5b", "keep_alive": 0, "stream": False}
    assert server.bodies["/api/embed"] == {"model": "qwen2:0.5b", "input": ["a"], "truncate": True, "keep_alive": 60}
    assert backend(server).supports_embeddings


def test_loaded_models_matches_latest_tag_and_health_probe():
    ps = httpx.Response(200, json={"models": [{"name": "llama3:latest", "model": "llama3:latest", "size": 1}]})
    ollama = backend(Server(routes={"/api/ps": ps, "/": httpx.Response(200, text="Ollama is running")}))
    ollama.settings = RemoteSettings(name="pub", type="ollama", base_url=ollama.settings.base_url, model="llama3")
    assert [m.name for m in asyncio.run(ollama.loaded_models())] == ["pub"]
    assert asyncio.run(ollama.health()).ok
