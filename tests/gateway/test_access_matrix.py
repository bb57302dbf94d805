"""Every route of the app × every kind of credential × every auth configuration, as a client sees it.

The routes come from the app itself (FastAPI's route table, the hot routes answered outside it
included), so a new route without an access class (``gateway/policy/access.py``) or without a probe
here fails this module. Each probe is a request the route answers when it is let through; the test
asserts the status every credential gets:

- public routes: the probe's status, whoever asks (credentials are not even looked at);
- with auth on: no key, a wrong key, ``sk-infer-`` + garbage and a revoked key get 401; a caller's
  ledger key gets the probe's status on caller routes and 403 on operator routes; a key limited to
  other models gets 403 on the routes that name a model; an operator key (``INFER_API_KEYS``, or a
  ledger key made with ``--operator``; as a Bearer token or as ``x-api-key``) gets the probe's status
  everywhere;
- with auth off: everything is open, but a ``sk-infer-`` key that names no live key is 401, and a
  ledger key that is sent is held to its models.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
import yaml
from fastapi.testclient import TestClient

from gateway.app import create_app
from gateway.http.hot import HotRoutes
from gateway.policy.access import CALLER, OPERATOR, PUBLIC, ROUTES, Access, app_routes
from core.settings import ServerSettings
from ledger.db import open_db
from ledger.keys import create_key, revoke_key
from fakes.live import server_env

ZEROS = "sha256:" + "0" * 64
CHAT = [{"role": "user", "content": "hi"}]


@dataclass(frozen=True)
class Probe:
    ok: int  # the status when the request is let through
    json: dict | None = None
    content: bytes | None = None
    model: bool = False  # the request names a model: a key limited to other models gets 403
    path: str | None = None  # the concrete path, for a route with path parameters


PROBES: dict[str, Probe] = {
    "GET /": Probe(200), "HEAD /": Probe(200), "GET /api/version": Probe(200), "HEAD /api/version": Probe(200),
    "GET /health": Probe(200), "GET /ready": Probe(200),
    "GET /dashboard": Probe(200), "GET /dashboard/": Probe(200),
    "GET /dashboard/{name}": Probe(200, path="/dashboard/dashboard.js"),
    "POST /api/generate": Probe(200, {"model": "tiny", "prompt": "hi", "stream": False,
                                      "options": {"num_predict": 1}}, model=True),
    "POST /api/chat": Probe(200, {"model": "tiny", "messages": CHAT, "stream": False,
                                  "options": {"num_predict": 1}}, model=True),
    "POST /api/embed": Probe(200, {"model": "tiny", "input": "hi"}, model=True),
    "POST /api/embeddings": Probe(200, {"model": "tiny", "prompt": "hi"}, model=True),
    "POST /v1/chat/completions": Probe(200, {"model": "tiny", "messages": CHAT, "max_tokens": 1}, model=True),
    "POST /v1/completions": Probe(200, {"model": "tiny", "prompt": "hi", "max_tokens": 1}, model=True),
    "POST /v1/embeddings": Probe(200, {"model": "tiny", "input": "hi"}, model=True),
    "POST /v1/messages": Probe(200, {"model": "tiny", "max_tokens": 1, "messages": CHAT}, model=True),
    "POST /v1/messages/count_tokens": Probe(200, {"model": "tiny", "messages": CHAT}, model=True),
    "POST /v1/responses": Probe(200, {"model": "tiny", "input": "hi", "max_output_tokens": 1, "store": False},
                                model=True),
    "GET /v1/responses/{response_id}": Probe(404, path="/v1/responses/resp_nothing"),
    "DELETE /v1/responses/{response_id}": Probe(404, path="/v1/responses/resp_nothing"),
    "GET /api/tags": Probe(200), "HEAD /api/tags": Probe(200), "GET /api/ps": Probe(200),
    "POST /api/show": Probe(200, {"model": "tiny"}, model=True),
    "GET /v1/models": Probe(200), "GET /v1/models/{model:path}": Probe(200, path="/v1/models/tiny", model=True),
    "GET /infer/dashboard": Probe(200), "GET /infer/requests": Probe(200), "GET /infer/series": Probe(200),
    "GET /infer/keys": Probe(200), "GET /infer/routes": Probe(200), "GET /infer/backends": Probe(200),
    "GET /infer/cost": Probe(200), "GET /metrics": Probe(200), "GET /openapi.json": Probe(200),
    "HEAD /openapi.json": Probe(200),
    "POST /api/pull": Probe(502, {"model": "127.0.0.1:9/library/nothing", "insecure": True, "stream": False}),
    "POST /api/push": Probe(404, {"model": "127.0.0.1:9/library/nothing", "insecure": True, "stream": False}),
    "POST /api/create": Probe(404, {"model": "made", "from": "nothing-here", "stream": False}),
    "DELETE /api/delete": Probe(404, {"model": "nothing-here"}),
    "POST /api/copy": Probe(404, {"source": "nothing-here", "destination": "copied"}),
    "HEAD /api/blobs/{digest}": Probe(404, path=f"/api/blobs/{ZEROS}"),
    "POST /api/blobs/{digest}": Probe(400, content=b"not the digest's bytes", path=f"/api/blobs/{ZEROS}"),
}

# What the issue names, pinned here (the table in gateway/policy/access.py must keep them so).
MANAGEMENT = {"POST /api/pull", "POST /api/push", "POST /api/create", "DELETE /api/delete", "POST /api/copy",
              "HEAD /api/blobs/{digest}", "POST /api/blobs/{digest}", "GET /infer/cost", "GET /metrics",
              "GET /openapi.json"}
OPEN = {"GET /", "HEAD /", "GET /api/version", "HEAD /api/version", "GET /health", "GET /ready", "GET /dashboard",
        "GET /dashboard/", "GET /dashboard/{name}"}

CREDENTIALS = ["none", "wrong", "garbage", "revoked", "ledger", "limited", "operator", "operator-x-api-key"]


@dataclass
class Config:
    name: str
    client: TestClient
    keys: dict[str, str] = field(default_factory=dict)
    required: bool = True

    def headers(self, credential: str) -> dict[str, str]:
        if credential == "none":
            return {}
        if credential == "operator-x-api-key":
            return {"x-api-key": self.keys["operator"]}
        return {"Authorization": f"Bearer {self.keys[credential]}"}


def _keys(db_url: str, operator_role: bool) -> dict[str, str]:
    db = open_db(db_url)
    try:
        keys = {"wrong": "not-a-key-at-all", "garbage": "sk-infer-x",
                "ledger": create_key(db, "caller"), "limited": create_key(db, "narrow", routes=("chat",)),
                "revoked": create_key(db, "gone")}
        revoke_key(db, "gone")
        if operator_role:
            keys["operator"] = create_key(db, "admin", role="operator")
    finally:
        db.dispose()
    return keys


@pytest.fixture(scope="module")
def configs(tiny_store, tmp_path_factory):
    """``api-keys``: INFER_API_KEYS; ``required``: auth: {required: true} and ledger keys only (an
    operator made with --operator); ``open``: neither."""
    made = []
    for name in ("api-keys", "required", "open"):
        tmp = tmp_path_factory.mktemp(name)
        db_url = f"sqlite:///{tmp / 'usage.db'}"
        config = tmp / "config.yaml"
        config.write_text(yaml.safe_dump({"routes": [{"name": "chat", "backends": ["tiny"]}],
                                          "auth": {"required": name == "required"}}))
        keys = _keys(db_url, operator_role=name != "api-keys")
        extra = {"INFER_DATABASE_URL": db_url, "INFER_CONFIG": str(config)}
        if name == "api-keys":
            keys["operator"] = "op-secret"
            extra["INFER_API_KEYS"] = "op-secret,another"
        settings = ServerSettings.from_env(server_env(tmp / "home", tiny_store.root, 11434, **extra))
        client = TestClient(create_app(settings), base_url="http://127.0.0.1:11434")
        client.__enter__()
        made.append(Config(name, client, keys, required=name != "open"))
    yield {c.name: c for c in made}
    for config in made:
        config.client.__exit__(None, None, None)


def app_route_names(client: TestClient) -> list[str]:
    """Every (method, path) the app answers: FastAPI's routes and the hot routes' paths."""
    names = [f"{m} {r.path}" for r in app_routes(client.app.routes) for m in sorted(r.methods or ())]
    stack, hot = client.app.middleware_stack, []
    while stack is not None:  # the hot routes are a middleware: their paths must be routes too
        if isinstance(stack, HotRoutes):
            hot += list(stack.routes)
        stack = getattr(stack, "app", None)
    assert hot and all(f"POST {path}" in names for path in hot), hot
    return names


def expected(access: Access, credential: str, config: Config, probe: Probe) -> int:
    if access is PUBLIC:
        return probe.ok
    if credential in ("garbage", "revoked"):
        return 401
    if credential == "limited" and probe.model:  # a key that is sent is held to its models, auth on or off
        return 403
    if not config.required:
        return probe.ok
    if credential in ("none", "wrong"):
        return 401
    if credential.startswith("operator"):
        return probe.ok
    if access is OPERATOR:
        return 403
    return 403 if credential == "limited" and probe.model else probe.ok


def send(client: TestClient, name: str, headers: dict[str, str]):
    method, path = name.split(" ", 1)
    probe = PROBES[name]
    return client.request(method, probe.path or path, json=probe.json, content=probe.content, headers=headers,
                          follow_redirects=False)


def test_every_route_has_a_class_and_a_probe(configs):
    names = app_route_names(configs["open"].client)
    assert len(names) >= 38
    assert sorted(n for n in names if n not in ROUTES) == []  # the app would not even start (AccessPolicy.build)
    assert sorted(n for n in names if n not in PROBES) == [], "add a probe for each new route"
    assert {n for n in names if ROUTES[n] is PUBLIC} == OPEN
    assert all(ROUTES[n] is OPERATOR for n in MANAGEMENT)
    assert {ROUTES[n] for n in names} == {PUBLIC, CALLER, OPERATOR}


@pytest.mark.parametrize("config_name", ["api-keys", "required", "open"])
def test_route_credential_matrix(configs, config_name):
    config = configs[config_name]
    names = app_route_names(config.client)
    wrong = []
    for name in names:
        access = ROUTES[name]
        for credential in CREDENTIALS:
            want = expected(access, credential, config, PROBES[name])
            got = send(config.client, name, config.headers(credential))
            if got.status_code != want:
                wrong.append(f"{name} with {credential}: {got.status_code} (want {want}) {got.text[:120]}")
    assert wrong == [], "\n".join(wrong)


def test_refusals_say_why_in_each_api_shape(configs):
    client = configs["required"].client
    r = client.request("DELETE", "/api/delete", json={"model": "tiny"}, headers={"Authorization": "Bearer sk-infer-x"})
    assert (r.status_code, r.json()) == (401, {"error": "invalid or revoked API key"})
    r = client.post("/v1/chat/completions", json=PROBES["POST /v1/chat/completions"].json)
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    assert "requires an API key" in r.json()["error"]["message"]
    r = client.get("/metrics", headers=configs["required"].headers("ledger"))
    assert r.status_code == 403 and "operator key" in r.json()["error"]
    r = client.post("/api/show", json={"model": "tiny"}, headers=configs["required"].headers("limited"))
    assert r.status_code == 403 and "may not use 'tiny'" in r.json()["error"]


def test_an_unknown_path_needs_a_key_before_it_is_404(configs):
    client = configs["api-keys"].client
    assert client.get("/api/nothing").status_code == 401
    assert client.get("/api/nothing", headers=configs["api-keys"].headers("ledger")).status_code == 404
    assert client.get("/api/delete", headers=configs["api-keys"].headers("ledger")).status_code == 403  # GET: 405 after


def test_public_metrics_and_docs_when_the_config_says_so(tiny_store, tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"routes": [{"name": "chat", "backends": ["tiny"]}],
                                      "auth": {"required": True, "public_metrics": True, "public_docs": True}}))
    settings = ServerSettings.from_env(server_env(tmp_path / "home", tiny_store.root, 11434,
                                                  INFER_CONFIG=str(config)))
    with TestClient(create_app(settings), base_url="http://127.0.0.1:11434") as client:
        assert client.get("/metrics").status_code == 200
        assert client.get("/openapi.json").status_code == 200
        assert client.get("/infer/cost").status_code == 401


def test_the_start_warning_considers_every_way_auth_is_set_up():
    from gateway.policy.access import exposure_warnings

    wide = {"host": "0.0.0.0", "loopback": False}
    assert "with auth off" in exposure_warnings(**wide, operator_keys=False, required=False)[0]
    assert exposure_warnings(**wide, operator_keys=True, required=False) == []
    assert exposure_warnings(**wide, operator_keys=True, required=True) == []
    only_ledger = exposure_warnings(**wide, operator_keys=False, required=True)
    assert len(only_ledger) == 1 and "--operator" in only_ledger[0]
    opened = exposure_warnings(**wide, operator_keys=True, required=True, public=("metrics", "docs"))
    assert opened == ["warning: /metrics and /openapi.json answer without a key (auth: public_metrics / "
                      "public_docs in the config)"]
    assert exposure_warnings(host="127.0.0.1", loopback=True, operator_keys=False, required=False) == []
