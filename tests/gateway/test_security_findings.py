"""The red-team findings of issue 26, each as the attacker's request and what must happen instead."""

from __future__ import annotations

import pytest
import yaml
from fastapi.testclient import TestClient

from gateway.app import create_app
from core.settings import ServerSettings
from ledger.db import open_db
from ledger.keys import create_key
from fakes.live import server_env
from tests.gateway.conftest import private_store


@pytest.fixture
def store(tiny_store, tmp_path_factory):
    return private_store(tiny_store, tmp_path_factory, "victim")


def client_for(store, tmp_path, **env) -> TestClient:
    settings = ServerSettings.from_env(server_env(tmp_path / "home", store.root, 11434, **env))
    return TestClient(create_app(settings), base_url="http://127.0.0.1:11434")


def names(store) -> list[str]:
    return sorted(m.name.display for m in store.list_models())


def test_a_sk_infer_prefix_with_garbage_deletes_nothing(store, tmp_path):
    before = names(store)
    with client_for(store, tmp_path, INFER_API_KEYS="op") as client:
        r = client.request("DELETE", "/api/delete", json={"model": "tiny"}, headers={"Authorization": "Bearer sk-infer-x"})
        assert r.status_code == 401
        r = client.post("/api/copy", json={"source": "tiny", "destination": "mine"},
                        headers={"Authorization": "Bearer sk-infer-x"})
        assert r.status_code == 401
    assert names(store) == before


def test_auth_required_guards_model_management_and_a_route_limited_key_deletes_nothing(store, tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"routes": [{"name": "fast", "backends": ["tiny"]}], "auth": {"required": True}}))
    db_url = f"sqlite:///{tmp_path / 'usage.db'}"
    db = open_db(db_url)
    narrow = create_key(db, "narrow", routes=("fast",))
    db.dispose()
    before = names(store)
    with client_for(store, tmp_path, INFER_CONFIG=str(config), INFER_DATABASE_URL=db_url) as client:
        for headers in ({}, {"Authorization": f"Bearer {narrow}"}):
            r = client.request("DELETE", "/api/delete", json={"model": "tiny"}, headers=headers)
            assert r.status_code in (401, 403), (headers, r.status_code)
        assert client.post("/api/embed", json={"model": "tiny", "input": "x"}).status_code == 401
        assert client.get("/metrics").status_code == 401
        assert client.post("/api/create", json={"model": "x", "from": "tiny"}).status_code == 401
    assert names(store) == before


def test_a_keep_alive_too_long_is_a_400_and_ps_keeps_answering(store, tmp_path):
    with client_for(store, tmp_path) as client:
        for value in (1e30, "1e30", "inf", "nan"):
            r = client.post("/api/generate", json={"model": "tiny", "prompt": "", "keep_alive": value})
            assert r.status_code == 400 and "keep_alive" in r.json()["error"], (value, r.text)
        assert client.post("/api/generate", json={"model": "tiny", "prompt": "", "keep_alive": -1}).status_code == 200
        ps = client.get("/api/ps")
        assert ps.status_code == 200 and [m["name"] for m in ps.json()["models"]] == ["tiny:latest"]


def test_create_refuses_a_cut_gguf_and_bad_parameters(store, tiny_store, tmp_path):
    import hashlib

    whole = (tiny_store.root.parent / "tiny-qwen2.gguf").read_bytes()
    cut = whole[:300_000]
    digest = "sha256:" + hashlib.sha256(cut).hexdigest()
    before = names(store)
    with client_for(store, tmp_path) as client:
        assert client.post(f"/api/blobs/{digest}", content=cut).status_code == 201
        r = client.post("/api/create", json={"model": "cut", "files": {"m.gguf": digest}, "stream": False})
        assert r.status_code == 400 and "past the end of the file" in r.json()["error"]
        for params, field in (({"num_ctx": 0}, "num_ctx"), ({"num_thread": 4096}, "num_thread"),
                              ({"temperature": -1}, "temperature"), ({"stop": 5}, "stop")):
            r = client.post("/api/create", json={"model": "bad", "from": "tiny", "parameters": params, "stream": False})
            assert r.status_code == 400 and field in r.json()["error"], (params, r.text)
    assert names(store) == before


def test_wrong_types_get_a_readable_400_naming_the_field(store, tmp_path):
    chat = [{"role": "user", "content": "hi"}]
    with client_for(store, tmp_path) as client:
        r = client.post("/v1/chat/completions", json={"model": "tiny", "messages": chat, "stop": 5})
        assert r.status_code == 400 and r.json()["error"]["param"] == "stop"
        assert "'stop'" in r.json()["error"]["message"] and "a list of" in r.json()["error"]["message"]
        r = client.post("/api/chat", json={"model": "tiny", "messages": chat, "options": {"stop": 5}})
        assert r.status_code == 400 and r.json()["error"] == ("invalid option 'stop': must be a string or a list of "
                                                              "strings, got 5")
        r = client.post("/api/embed", json={"model": "tiny"})
        assert r.status_code == 400 and "'input' is required" in r.json()["error"]


def test_a_callers_key_reads_continues_and_deletes_only_its_own_stored_responses(store, tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"routes": [{"name": "fast", "backends": ["tiny"]}], "auth": {"required": True}}))
    db_url = f"sqlite:///{tmp_path / 'usage.db'}"
    db = open_db(db_url)
    alice, bob = create_key(db, "alice"), create_key(db, "bob")
    admin = create_key(db, "admin", role="operator")
    db.dispose()
    as_ = lambda key: {"Authorization": f"Bearer {key}"}  # noqa: E731
    with client_for(store, tmp_path, INFER_CONFIG=str(config), INFER_DATABASE_URL=db_url) as client:
        r = client.post("/v1/responses", json={"model": "tiny", "input": "hi", "max_output_tokens": 2}, headers=as_(alice))
        assert r.status_code == 200, r.text
        rid = r.json()["id"]
        assert client.get(f"/v1/responses/{rid}", headers=as_(bob)).status_code == 404
        again = {"model": "tiny", "input": "more", "max_output_tokens": 2, "previous_response_id": rid}
        assert client.post("/v1/responses", json=again, headers=as_(bob)).status_code == 404
        assert client.request("DELETE", f"/v1/responses/{rid}", headers=as_(bob)).status_code == 404
        assert client.get(f"/v1/responses/{rid}", headers=as_(admin)).json()["id"] == rid
        assert client.get(f"/v1/responses/{rid}", headers=as_(alice)).status_code == 200
        assert client.request("DELETE", f"/v1/responses/{rid}", headers=as_(alice)).status_code == 200
