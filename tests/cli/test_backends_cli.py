"""``infer backends check`` against a real (fake) OpenAI-compatible server on 127.0.0.1."""

from __future__ import annotations

import json
import threading
import time

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from typer.testing import CliRunner

from cli.main import app
from fakes.live import free_port

runner = CliRunner()


class FakeOpenAI:
    """GET /health, GET /v1/models and a streaming POST /v1/completions, as vLLM answers them."""

    def __init__(self, model: str = "fake/model") -> None:
        self.model = model
        self.bodies: list[dict] = []
        self.headers: list[dict] = []
        routes = [Route("/health", self.health), Route("/v1/models", self.models),
                  Route("/v1/completions", self.completions, methods=["POST"])]
        self.server = uvicorn.Server(uvicorn.Config(Starlette(routes=routes), host="127.0.0.1", port=0,
                                                    log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    async def health(self, request: Request) -> Response:
        return Response(status_code=200)

    async def models(self, request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{"id": self.model, "object": "model"}]})

    async def completions(self, request: Request) -> Response:
        body = await request.json()
        self.bodies.append(body)
        self.headers.append(dict(request.headers))
        if body.get("model") != self.model:
            return JSONResponse({"error": {"message": f"The model `{body.get('model')}` does not exist.",
                                           "type": "NotFoundError", "code": 404}}, status_code=404)

        async def events():
            yield _sse({"choices": [{"index": 0, "text": "Hi", "finish_reason": None}]})
            yield _sse({"choices": [{"index": 0, "text": "", "finish_reason": "length"}]})
            yield _sse({"choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}})
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    def __enter__(self) -> FakeOpenAI:
        self.thread.start()
        while not self.server.started:
            time.sleep(0.01)
        self.port = self.server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(5)


def _sse(obj: dict) -> str:
    return f"data: {json.dumps(obj)}\n\n"


def closed_port() -> int:
    return free_port()  # nobody listens once the probe socket closes


@pytest.fixture
def fake():
    with FakeOpenAI() as server:
        yield server


def config(tmp_path, *entries: str):
    path = tmp_path / "backends.yaml"
    path.write_text("backends:\n" + "".join(entries))
    return path


def entry(name: str, url: str, type_: str = "openai", model: str = "fake/model", extra: str = "") -> str:
    return f"  - name: {name}\n    type: {type_}\n    base_url: {url}\n    model: {model}\n{extra}"


def check(*args: str, env: dict[str, str] | None = None):
    return runner.invoke(app, ["backends", "check", *args], env=env)


def test_healthy_backends_pass_and_exit_zero(tmp_path, fake, monkeypatch):
    monkeypatch.setenv("FAKE_KEY", "sk-test")
    path = config(tmp_path, entry("oai", fake.url + "/v1", extra="    api_key_env: FAKE_KEY\n"),
                  entry("vl", fake.url, type_="vllm"))
    result = check("--config", str(path), "--json")
    assert result.exit_code == 0, result.output
    rows = {r["name"]: r for r in json.loads(result.output)}
    for name, kind in (("oai", "openai"), ("vl", "vllm")):
        row = rows[name]
        assert (row["type"], row["base_url"], row["ok"]) == (kind, fake.url, True)
        assert (row["health"], row["models"], row["generate"]) == ("ok", "ok", "ok")
        assert row["latency_ms"] > 0 and row["ttft_ms"] > 0 and row["errors"] == []
    assert {b["model"] for b in fake.bodies} == {"fake/model"}
    assert all(b["max_tokens"] == 1 and b["temperature"] == 0 and b["prompt"] == "Hello" for b in fake.bodies)
    assert sorted(h.get("authorization", "") for h in fake.headers) == ["", "Bearer sk-test"]


def test_table_output(tmp_path, fake):
    result = check("--config", str(config(tmp_path, entry("oai", fake.url))), env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    header, _, row = result.output.splitlines()[:3]
    assert header.split() == ["name", "type", "base_url", "health", "models", "generate", "latency", "detail"]
    assert row.split()[:6] == ["oai", "openai", fake.url, "ok", "ok", "ok"]
    assert row.split()[7] == "ms"


def test_unreachable_backend_shows_the_error_and_exits_one(tmp_path, fake):
    dead = f"http://127.0.0.1:{closed_port()}"
    path = config(tmp_path, entry("alive", fake.url), entry("dead", dead))
    result = check("--config", str(path), "--json", "--timeout", "2")
    assert result.exit_code == 1
    rows = {r["name"]: r for r in json.loads(result.output)}
    assert rows["alive"]["ok"] is True
    dead_row = rows["dead"]
    assert dead_row["ok"] is False
    assert (dead_row["health"], dead_row["models"], dead_row["generate"]) == ("fail", "fail", "fail")
    assert "unreachable" in dead_row["detail"] and dead in dead_row["detail"]
    table = check("--config", str(path), env={"COLUMNS": "250"})
    assert table.exit_code == 1
    assert "dead" in table.output and "fail" in table.output and "unreachable" in table.output


def test_wrong_model_is_not_listed_and_fails_generation(tmp_path, fake):
    result = check("--config", str(config(tmp_path, entry("oai", fake.url, model="other"))), "--json")
    assert result.exit_code == 1
    (row,) = json.loads(result.output)
    assert (row["health"], row["models"], row["generate"]) == ("ok", "not listed", "fail")
    assert "does not exist" in row["detail"] or "404" in row["detail"]


def test_config_from_env_and_errors_are_one_line(tmp_path, fake, monkeypatch):
    monkeypatch.delenv("INFER_CONFIG", raising=False)
    result = check()
    assert result.exit_code == 1
    assert result.output.strip() == "Error: no config: pass --config FILE or set INFER_CONFIG"

    bad = tmp_path / "bad.yaml"
    bad.write_text("backends:\n  - name: a\n    type: vlm\n")
    result = check("--config", str(bad))
    assert result.exit_code == 1
    assert result.output.strip().startswith(f"Error: {bad}:3: backends[0].type: unknown type 'vlm'")

    result = check("--json", env={"INFER_CONFIG": str(config(tmp_path, entry("oai", fake.url)))})
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)[0]["name"] == "oai"


def test_an_ollama_model_without_a_tag_is_listed_as_latest(tmp_path, tiny_store):
    """Ollama lists ``tiny`` as ``tiny:latest``; ``model: tiny`` is that model, not "not listed"."""
    from fakes.live import start_server, stop_server

    server = start_server(tmp_path, tiny_store.root)
    try:
        path = config(tmp_path, entry("short", server.url, type_="ollama", model="tiny"),
                      entry("other", server.url, type_="ollama", model="tiny:q8"))
        rows = {r["name"]: r for r in json.loads(check("--config", str(path), "--json").output)}
    finally:
        stop_server(server)
    assert (rows["short"]["health"], rows["short"]["models"], rows["short"]["generate"]) == ("ok", "ok", "ok")
    assert rows["short"]["ok"] is True and rows["short"]["detail"] == ""
    assert rows["other"]["models"] == "not listed"
    assert "does not have model 'tiny:q8'" in rows["other"]["detail"]
