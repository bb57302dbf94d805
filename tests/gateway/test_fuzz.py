"""Schemathesis against a live ``infer serve`` on loopback: no 5xx, answers as declared, server alive.

Every operation of ``/openapi.json`` (both APIs, health routes included) is fuzzed twice:

- ``free``: every field as the schema allows, valid and invalid (schemathesis' positive and
  negative modes), so model names are mostly unknown: request validation and 4xx paths;
- ``pinned``: the model fields set to a real store model (``tiny``) after generation, so the
  fuzzed options reach the in-process engine (the mode that found the /api/embed crash). Every
  operation runs on the llama.cpp engine; the routes that reach an engine (generation and
  embeddings) run pinned on the native engine too, on a second server.

A third server runs with keys on (``INFER_API_KEYS`` and ``auth: {required: true}``, a priced
engine): every operation is fuzzed ``pinned`` with a credential drawn per case: a caller's ledger
key with a budget, per-minute limits and an output cap (so generation goes through admission,
budget holds and the rate windows), an operator key (sent as ``x-api-key`` every other time), no
key, or ``sk-infer-`` and garbage; 401, 403 and 429 must then be declared answers too.

Each answer must pass schemathesis' ``not_a_server_error`` (no 5xx at all: the tiny model runs in
process, so there is no backend to fail), ``status_code_conformance``, ``content_type_conformance``
and ``response_schema_conformance`` (bodies against ``gateway/*/wire_models.py``, streams per
event/line). Every failure is collected with a curl reproducer (no shrinking, to bound the time),
and after each operation the server must still answer ``GET /`` and its process must be alive.

What is not fuzzed as generated, and why:

- ``/api/pull`` and ``/api/push`` would reach out to a registry on the internet: their model is
  always pinned to a registry on a closed loopback port, so they fail fast (502) instead, and 502 is
  the only 5xx accepted for them.
- ``/api/delete`` in ``pinned`` mode names a ``victim`` copy of ``tiny``, not ``tiny`` itself, which
  the other operations need; ``/api/create`` and ``/api/copy`` pin only their source model.
- ``/api/blobs/{digest}``: the upload body is not in the schema (the route streams raw bytes), so
  schemathesis sends none; ``pinned`` uses a stored blob's digest or the empty body's, so both the
  "already stored" and the "created" answers are seen without writing anything large.
- The server runs over a private copy of the tiny store (create, copy and delete change it).

Strings are spoiled on purpose: about half the cases get one value from ``NASTY`` (lone surrogates,
empty strings and ``[""]`` inputs, Go/Jinja template syntax, NUL, special tokens, long text), the
inputs that crashed the server or got 5xx before (issue 12); plain random strings rarely hit them.
Pinned generations are capped at ``MAX_TOKENS`` and every other one is streamed.

The budget: ``MAX_EXAMPLES`` cases per operation and mode (``INFER_FUZZ_EXAMPLES`` raises it for a
deeper local run), Hypothesis' fixed seed (``derandomize``; schemathesis' own choices still vary
with ``PYTHONHASHSEED``), no shrinking: 66 tests, ~3,400 requests, 70 s on 2 cores (load average 2.5); the keyed server adds
``KEYED_EXAMPLES`` cases per operation.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings, strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.core.failures import FailureGroup
from schemathesis.specs.openapi.checks import (content_type_conformance, response_schema_conformance,
                                               status_code_conformance)

from fakes.live import free_port, start_server, stop_server

from tests.gateway.conftest import private_store

pytestmark = pytest.mark.fuzz

MAX_EXAMPLES = int(os.environ.get("INFER_FUZZ_EXAMPLES", "75"))  # raise it for a deeper local hunt
KEYED_EXAMPLES = max(1, MAX_EXAMPLES // 5)
OPERATOR = "fuzz-operator-secret"
PIN = "tiny"
VICTIM = "victim"
EMPTY_DIGEST = "sha256:" + hashlib.sha256(b"").hexdigest()
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]
REQUEST_TIMEOUT = 30.0


@schemathesis.deserializer("application/x-ndjson")
def _ndjson(_ctx, response) -> list:
    """An NDJSON stream as the array of its lines (the declared ``schema`` of an Ollama stream)."""
    return [json.loads(line) for line in response.content.decode("utf-8").splitlines() if line.strip()]


def _operations() -> list[tuple[str, str]]:
    """(method, path) of every operation, from the app's own schema (no server needed to collect)."""
    from gateway.app import create_app
    from core.settings import ServerSettings

    schema = create_app(ServerSettings.from_env({"INFER_HOME": "/nonexistent"})).openapi()
    return [(method.upper(), path) for path, ops in schema["paths"].items() for method in ops]


OPERATIONS = _operations()
ENGINE_ROUTES = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/api/generate", "/api/chat",
                 "/api/embed", "/api/embeddings")
NATIVE_OPERATIONS = [(m, p) for m, p in OPERATIONS if p in ENGINE_ROUTES]


class Fuzz:
    def __init__(self, engine: str, server, registry: str, blob: str, caller: str | None = None):
        self.engine = engine
        self.server = server
        self.registry = registry  # a host:port nothing listens on
        self.blob = blob  # the digest of a stored blob
        self.caller = caller  # keys on: a ledger key of a caller (else no keys)
        headers = {"Authorization": f"Bearer {OPERATOR}"} if caller else {}
        self.schema = schemathesis.openapi.from_url(server.url + "/openapi.json", headers=headers)

    def credential(self, data) -> dict[str, str]:
        """Keys on: the headers of a credential drawn for one case."""
        if self.caller is None:
            return {}
        kind = data.draw(st.sampled_from(["caller", "caller", "operator", "x-api-key", "none", "garbage"]),
                         label="credential")
        return {"caller": {"Authorization": f"Bearer {self.caller}"}, "operator": {"Authorization": f"Bearer {OPERATOR}"},
                "x-api-key": {"x-api-key": OPERATOR}, "none": {},
                "garbage": {"Authorization": "Bearer sk-infer-garbage"}}[kind]


@pytest.fixture(scope="module")
def llamacpp(tiny_store, tmp_path_factory) -> Iterator[Fuzz]:
    yield from _serve("llamacpp", tiny_store, tmp_path_factory)


@pytest.fixture(scope="module")
def native(tiny_store, tmp_path_factory) -> Iterator[Fuzz]:
    yield from _serve("native", tiny_store, tmp_path_factory)


@pytest.fixture(scope="module")
def keyed(tiny_store, tmp_path_factory) -> Iterator[Fuzz]:
    yield from _serve("llamacpp", tiny_store, tmp_path_factory, keys=True)


def _serve(engine: str, tiny_store, tmp_path_factory, keys: bool = False) -> Iterator[Fuzz]:
    """A server on ``engine`` over its own copy of the tiny store (``keys``: with auth on, a priced
    engine and a caller's key with a budget, limits and an output cap)."""
    from ledger.db import open_db
    from ledger.keys import create_key
    from registry.names import parse_name

    store = private_store(tiny_store, tmp_path_factory, "fuzz")
    tiny = store.resolve(PIN)
    registry = f"127.0.0.1:{free_port()}"
    for copy in (VICTIM, f"{registry}/library/{PIN}:latest"):
        store.copy(tiny, parse_name(copy, insecure=True))
    tmp = tmp_path_factory.mktemp("fuzz-server")
    env, caller = {"INFER_ENGINE": engine}, None
    if keys:
        config = tmp / "config.yaml"
        config.write_text(json.dumps({"routes": [{"name": "chat", "backends": [PIN]}], "auth": {"required": True},
                                      "local": {"pricing": {"input_per_mtok": 1.0, "output_per_mtok": 2.0}}}))
        db_url = f"sqlite:///{tmp / 'keys.db'}"
        db = open_db(db_url)
        caller = create_key(db, "fuzzer", budget_usd=50.0, period_s=86400, rpm=100_000, tpm=10**9,
                            max_output_tokens=MAX_TOKENS)
        db.dispose()
        env.update(INFER_CONFIG=str(config), INFER_DATABASE_URL=db_url, INFER_API_KEYS=OPERATOR)
    server = start_server(tmp, store.root, **env)
    try:
        yield Fuzz(engine, server, registry, store.read_manifest(tiny).layers[0].digest, caller)
    finally:
        stop_server(server)


GENERATION = ("/v1/chat/completions", "/v1/completions", "/api/generate", "/api/chat", "/v1/messages", "/v1/responses")
MAX_TOKENS = 8  # pinned generations are cut short: the budget goes to more cases, not longer answers


def _bound(body: dict, path: str, index: int) -> None:
    """Pinned generation: at most ``MAX_TOKENS`` tokens, and every other case streamed."""
    if path.startswith("/v1/"):
        for key in ("max_tokens", "max_completion_tokens", "max_output_tokens"):
            if not isinstance(body.get(key), int) or body[key] > MAX_TOKENS:
                body[key] = MAX_TOKENS
    elif isinstance(body.get("options"), dict) or body.get("options") is None:
        options = body.setdefault("options", {}) or {}
        body["options"] = options
        if not isinstance(options.get("num_predict"), int) or not 0 <= options["num_predict"] <= MAX_TOKENS:
            options["num_predict"] = MAX_TOKENS
    if index % 2:  # and a real prompt, not a load request
        body["stream"] = True
        if path == "/api/generate" and not (isinstance(body.get("prompt"), str) and body["prompt"]):
            body["prompt"] = "Why is the sky blue?"
        if path == "/api/chat" and not body.get("messages"):
            body["messages"] = [{"role": "user", "content": "Why is the sky blue?"}]


def _pin(case, path: str, pinned: bool, registry: str, index: int, blob: str) -> None:
    """Point the case's model fields at a real model (pinned) or, for pull/push, at a dead registry."""
    if path in ("/api/pull", "/api/push"):
        if isinstance(case.body, dict):
            case.body["model"] = f"{registry}/library/{PIN}:latest"
            case.body.pop("name", None)
        return
    if not pinned:
        return
    if path == "/v1/models/{model}":
        case.path_parameters["model"] = PIN
    if path == "/api/blobs/{digest}":  # a stored blob, or the digest of the empty body POST sends
        case.path_parameters["digest"] = blob if index % 2 else EMPTY_DIGEST
    if not isinstance(case.body, dict):
        return
    if path == "/api/copy":
        case.body["source"] = PIN
    elif path == "/api/create":
        case.body["from"] = PIN
    else:
        case.body["model"] = VICTIM if path == "/api/delete" else PIN
        case.body.pop("name", None)
    if path in GENERATION:
        _bound(case.body, path, index)


# Values that broke the server before (issue 12) or that a tokenizer, a template engine or a
# C library may choke on; one of them replaces a string of every other case.
NASTY = ["", "\ud800", "a\udfffb", "\x00", "{{ .Foo.Bar }}", '{{define "x"}}{{end}}', "{% raw %}", "<|im_end|>",
         "\u202e\ufeff", "\U0001f642" * 64, "x" * 5000]


def _leaves(node, path=()) -> list[tuple]:
    """Paths to the strings and lists of strings inside a JSON body."""
    found = []
    if isinstance(node, dict):
        items = node.items()
    elif isinstance(node, list):
        items = enumerate(node)
        if node and all(isinstance(v, str) for v in node):
            found.append(path)
    else:
        return [path] if isinstance(node, str) and path else []
    for key, value in items:
        found.extend(_leaves(value, (*path, key)))
    return found


def _spoil(body, data) -> None:
    """Put one nasty value (or [""], ["", "x"] for a list of strings) somewhere in the body."""
    paths = _leaves(body)
    if not paths or not data.draw(st.booleans(), label="spoil"):
        return
    path = data.draw(st.sampled_from(paths), label="where")
    parent = body
    for key in path[:-1]:
        parent = parent[key]
    if isinstance(parent[path[-1]], list):
        parent[path[-1]] = data.draw(st.sampled_from([[""], ["", "x"], ["\ud800"]]), label="value")
    else:
        parent[path[-1]] = data.draw(st.sampled_from(NASTY), label="value")


# Bugs the fuzzer found that are being fixed (.notes/issue12-fuzz.md): name -> predicate(engine, case,
# response). A failure one explains makes the test xfail with the bug's name; any other failure still
# fails it. Remove an entry with its fix. (fuzz-1, an empty stop string answered 500 on the native
# engine, was fixed in e0bbc10.)
KNOWN_BUGS: dict[str, Callable[[str, Any, Any], bool]] = {}


def _titles(exc: BaseException) -> str:
    """What a schemathesis failure says, one line per check that failed."""
    inner = exc.exceptions if isinstance(exc, FailureGroup) else [exc]
    lines = []
    for failure in inner:
        message = (getattr(failure, "message", "") or str(failure)).strip().splitlines()
        lines.append(f"{getattr(failure, 'title', type(failure).__name__)}: {message[0] if message else ''}"[:300])
    return "; ".join(lines)


def _failure(case, exc: BaseException, url: str) -> str:
    first = _titles(exc)
    try:
        curl = case.as_curl_command(base_url=url)
    except Exception:
        curl = f"{case.method} {case.formatted_path} body={case.body!r}"
    return f"{first}\n    {curl}"


def _alive(server) -> None:
    assert server.process.poll() is None, f"infer serve died:\n{server.log()[-4000:]}"
    assert httpx.get(server.url + "/", timeout=10).status_code == 200


@pytest.mark.parametrize("mode", ["free", "pinned"])
@pytest.mark.parametrize(("method", "path"), OPERATIONS, ids=[f"{m} {p}" for m, p in OPERATIONS])
def test_fuzz(llamacpp: Fuzz, method: str, path: str, mode: str):
    _fuzz(llamacpp, method, path, mode)


@pytest.mark.parametrize(("method", "path"), NATIVE_OPERATIONS, ids=[f"{m} {p}" for m, p in NATIVE_OPERATIONS])
def test_fuzz_native(native: Fuzz, method: str, path: str):
    _fuzz(native, method, path, "pinned")


@pytest.mark.parametrize(("method", "path"), OPERATIONS, ids=[f"{m} {p}" for m, p in OPERATIONS])
def test_fuzz_keyed(keyed: Fuzz, method: str, path: str):
    _fuzz(keyed, method, path, "pinned", examples=KEYED_EXAMPLES)


def _fuzz(fuzz: Fuzz, method: str, path: str, mode: str, examples: int = MAX_EXAMPLES) -> None:
    operation = fuzz.schema[path][method]
    strategy = st.one_of(operation.as_strategy(generation_mode=GenerationMode.POSITIVE),
                         operation.as_strategy(generation_mode=GenerationMode.NEGATIVE))
    failures: dict[str, str] = {}  # one reproducer per distinct failure
    known: set[str] = set()
    allowed_5xx = {502} if path in ("/api/pull", "/api/push") else set()
    count = 0
    statuses: list[int] = []

    @given(case=strategy, data=st.data())
    @settings(max_examples=examples, derandomize=True, database=None, deadline=None,
              phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))
    def run(case, data) -> None:
        nonlocal count
        count += 1
        if isinstance(case.body, (dict, list)):
            _spoil(case.body, data)
        _pin(case, path, mode == "pinned", fuzz.registry, count, fuzz.blob)
        headers = fuzz.credential(data)
        try:
            response = case.call(base_url=fuzz.server.url, timeout=REQUEST_TIMEOUT, headers=headers)
        except Exception as exc:  # a reset or timeout: the server may be gone
            failures.setdefault(f"transport {type(exc).__name__}", _failure(case, exc, fuzz.server.url))
            return
        statuses.append(response.status_code)
        checks = CHECKS if response.status_code not in allowed_5xx else CHECKS[1:]
        try:
            case.validate_response(response, checks=checks)
        except (Exception, FailureGroup) as exc:
            bug = next((name for name, match in KNOWN_BUGS.items() if match(fuzz.engine, case, response)), None)
            if bug is not None:
                known.add(bug)
                return
            key = f"{response.status_code} {_titles(exc)[:80]}"
            body = response.content[:200].decode("utf-8", "replace")
            failures.setdefault(key, f"[{response.status_code}] {body!r}\n    " + _failure(case, exc, fuzz.server.url))

    started = time.monotonic()
    run()
    elapsed = time.monotonic() - started
    _alive(fuzz.server)
    print(f"{method} {path} {mode}: {count} cases in {elapsed:.1f}s, answers {sorted(Counter(statuses).items())}")
    assert count > 0
    assert not failures, (f"{len(failures)} distinct failure(s) in {count} cases ({elapsed:.1f}s):\n"
                          + "\n".join(failures.values()))
    if known:
        pytest.xfail("known bug(s): " + "; ".join(sorted(known)))
