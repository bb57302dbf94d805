"""Host guard, CORS, API keys and body size, as a browser or a client sees them."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from gateway.app import create_app
from core.settings import ServerSettings
from fakes.live import server_env


@pytest.fixture
def make_client(tiny_store, tmp_path):
    clients = []

    def make(**env) -> TestClient:
        settings = ServerSettings.from_env(server_env(tmp_path / "home", tiny_store.root, 11434, **env))
        client = TestClient(create_app(settings), base_url="http://127.0.0.1:11434")
        client.__enter__()
        clients.append(client)
        return client
    yield make
    for client in clients:
        client.__exit__(None, None, None)


def test_root_and_version_probes(app_client):
    r = app_client.get("/")
    assert (r.status_code, r.text, r.headers["content-type"].split(";")[0]) == (200, "Ollama is running", "text/plain")
    assert app_client.head("/").status_code == 200
    assert set(app_client.get("/api/version").json()) == {"version"}


@pytest.mark.parametrize("host", ["evil.example.com", "attacker.test:11434", "8.8.8.8"])
def test_dns_rebinding_hosts_are_refused_with_empty_403(app_client, host):
    r = app_client.get("/api/version", headers={"Host": host})
    assert (r.status_code, r.content) == (403, b"")


@pytest.mark.parametrize("host", ["localhost:11434", "127.0.0.1", "10.1.2.3:11434", "box.local", "api.internal",
                                  "[::1]:11434", "0.0.0.0"])
def test_local_hosts_are_served(app_client, host):
    assert app_client.get("/api/version", headers={"Host": host}).status_code == 200


def test_host_guard_is_off_when_bound_to_all_interfaces(make_client):
    client = make_client(INFER_HOST="0.0.0.0:11434")
    assert client.get("/api/version", headers={"Host": "my-server.example.com"}).status_code == 200


@pytest.mark.parametrize("origin", ["http://localhost:3000", "http://127.0.0.1", "app://chatbox", "file://",
                                    "tauri://localhost", "vscode-webview://abc"])
def test_allowed_origins_get_cors_headers(app_client, origin):
    r = app_client.get("/api/version", headers={"Origin": origin})
    assert r.status_code == 200
    assert r.headers["access-control-allow-origin"] == origin
    pre = app_client.options("/v1/chat/completions", headers={
        "Origin": origin, "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization,content-type,x-stainless-os"})
    assert pre.status_code == 204
    assert "x-stainless-os" in pre.headers["access-control-allow-headers"]


@pytest.mark.parametrize("origin", ["https://evil.example", "chrome-extension://abcdef"])
def test_other_origins_get_an_empty_403(app_client, origin):
    for r in (app_client.get("/api/tags", headers={"Origin": origin}),
              app_client.options("/api/chat", headers={"Origin": origin, "Access-Control-Request-Method": "POST"})):
        assert (r.status_code, r.content) == (403, b"")


def test_infer_origins_adds_origins(make_client):
    client = make_client(INFER_ORIGINS="chrome-extension://*")
    assert client.get("/api/version", headers={"Origin": "chrome-extension://abcdef"}).status_code == 200


def test_api_keys_are_required_when_configured(make_client):
    client = make_client(INFER_API_KEYS="sk-one,sk-two")
    assert client.get("/").status_code == 200  # health probes stay open
    r = client.get("/v1/models")
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    r = client.get("/api/tags", headers={"Authorization": "Bearer wrong"})
    assert r.status_code == 401 and isinstance(r.json()["error"], str)
    assert client.get("/v1/models", headers={"Authorization": "Bearer sk-two"}).status_code == 200
    assert client.get("/metrics", headers={"Authorization": "Bearer sk-one"}).status_code == 200


def test_oversize_body_is_413_in_each_shape_and_the_server_keeps_serving(app_client):
    big = b"x" * (33 << 20)
    r = app_client.post("/v1/chat/completions", content=big, headers={"Content-Type": "application/json"})
    assert r.status_code == 413 and "too large" in r.json()["error"]["message"]
    r = app_client.post("/api/chat", content=big, headers={"Content-Type": "application/json"})
    assert r.status_code == 413 and "too large" in r.json()["error"]
    assert app_client.get("/api/version").status_code == 200


def test_unknown_routes_are_404_in_the_right_shape(app_client):
    r = app_client.get("/v1/nothing")
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"
    r = app_client.get("/api/nothing")
    assert r.status_code == 404 and isinstance(r.json()["error"], str)
    r = app_client.get("/api/chat")
    assert r.status_code == 405 and "not allowed" in r.json()["error"]


def test_metrics_exposition(app_client):
    r = app_client.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    for name in ("infer_requests_total", "infer_time_to_first_token_seconds", "infer_requests_in_flight"):
        assert f"# TYPE {name.removesuffix('_total')}" in r.text


def test_bodies_are_json_whatever_the_content_type(app_client):
    """`curl -d` sends form-urlencoded, LiteLLM octet-stream; Ollama reads the body as JSON anyway."""
    body = b'{"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "stream": false, "options": {"num_predict": 2}}'
    for ctype in ("application/x-www-form-urlencoded", None, "text/plain", "application/octet-stream",
                  "application/x-ndjson"):
        headers = {"Content-Type": ctype} if ctype else {}
        r = app_client.post("/api/chat", content=body, headers=headers)
        assert r.status_code == 200 and r.json()["done"] is True, r.text
        r = app_client.post("/v1/chat/completions", content=body.replace(b'"options": {"num_predict": 2}',
                                                                          b'"max_tokens": 2'), headers=headers)
        assert r.status_code == 200 and r.json()["object"] == "chat.completion", r.text
