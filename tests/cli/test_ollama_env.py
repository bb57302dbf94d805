"""Ollama's environment variables, each seen doing what it does in Ollama when its ``INFER_*`` twin is unset.

One live ``infer serve`` started with ``OLLAMA_*`` variables only (no ``INFER_HOST``/``INFER_MODELS``):
its address, store, CORS origins, keep-alive, default context and loaded-model limit are checked
over HTTP; ``~/.ollama/models`` is checked with a store ``infer`` wrote in Ollama's layout under a
temporary ``HOME``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import httpx
import pytest
from typer.testing import CliRunner

from core.settings import LocalSettings
from cli.main import app
from core.settings import ServerSettings, SettingsError, client_url, host_from_env
from registry.create import create_model
from registry.details import load_details
from registry.modelfile import parse_modelfile
from registry.names import parse_name
from core.settings import RegistrySettings
from registry.store import Store
from tests.cli.test_run import ROOT
from fakes.live import free_port, LiveServer, stop_server, wait_ready
from tests.gateway.conftest import private_store
from cli.format import parse_time

OLLAMA_ENV = {"OLLAMA_KEEP_ALIVE": "1h", "OLLAMA_CONTEXT_LENGTH": "256", "OLLAMA_MAX_LOADED_MODELS": "1",
              "OLLAMA_ORIGINS": "chrome-extension://*", "OLLAMA_NUM_PARALLEL": "2"}


@pytest.fixture(scope="module")
def store(tiny_store, tmp_path_factory):
    """The tiny models plus ``plain``: the same GGUF without a ``num_ctx`` parameter."""
    local = private_store(tiny_store, tmp_path_factory, "ollama-env")
    gguf = load_details(local, parse_name("tiny")).model_path
    create_model(local, parse_name("plain"), parse_modelfile(f"FROM {gguf}\n"), local.root)
    return local


@pytest.fixture(scope="module")
def server(store, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ollama-env-server")
    port, log_path = free_port(), tmp / "server.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("INFER_", "OLLAMA_"))}
    env.update(INFER_HOME=str(tmp / "home"), OLLAMA_HOST=f"127.0.0.1:{port}", OLLAMA_MODELS=str(store.root),
               **OLLAMA_ENV)
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "cli", "serve", "--log-level", "warning"], env=env,
                                stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
    live = LiveServer(f"http://127.0.0.1:{port}", port, tmp / "home", "", proc, log_path)
    wait_ready(live)
    try:
        yield live
    finally:
        stop_server(live)


def load(server, model: str) -> None:
    assert httpx.post(server.url + "/api/generate", json={"model": model}, timeout=60).json()["done_reason"] == "load"


def ps(server) -> dict[str, dict]:
    return {m["name"].removesuffix(":latest"): m for m in httpx.get(server.url + "/api/ps").json()["models"]}


def test_ollama_host_and_models_place_the_server_and_its_store(server, store):
    assert httpx.get(server.url + "/").text == "Ollama is running"  # OLLAMA_HOST
    names = {m["name"] for m in httpx.get(server.url + "/api/tags").json()["models"]}
    assert {"tiny:latest", "plain:latest"} <= names  # OLLAMA_MODELS
    assert "(models: " + str(store.root) + ")" in server.log()


def test_ollama_origins_allow_an_extension(server):
    allowed = httpx.get(server.url + "/api/version", headers={"Origin": "chrome-extension://abc"})
    assert allowed.status_code == 200 and allowed.headers["access-control-allow-origin"] == "chrome-extension://abc"
    refused = httpx.get(server.url + "/api/version", headers={"Origin": "https://elsewhere.example"})
    assert (refused.status_code, refused.content) == (403, b"")


def test_keep_alive_context_length_and_max_loaded_models(server):
    load(server, "plain")
    plain = ps(server)["plain"]
    assert plain["context_length"] == 256  # OLLAMA_CONTEXT_LENGTH: the model sets no num_ctx
    assert 59 * 60 < parse_time(plain["expires_at"]) - time.time() <= 3600  # OLLAMA_KEEP_ALIVE=1h
    load(server, "tiny")
    assert list(ps(server)) == ["tiny"]  # OLLAMA_MAX_LOADED_MODELS=1: plain made room
    assert ps(server)["tiny"]["context_length"] == 512  # the model's own num_ctx wins, as in Ollama


def test_num_parallel_answers_two_requests_at_once(server):
    """OLLAMA_NUM_PARALLEL=2: a second request starts streaming while the first is still generating
    (with one slot it would wait for the first to finish)."""
    body = {"model": "slow", "prompt": "count", "options": {"num_predict": 3000, "seed": 1, "ignore_eos": True}}
    first_started, first_done = threading.Event(), threading.Event()

    def first() -> None:
        with httpx.stream("POST", server.url + "/api/generate", json=body, timeout=120) as r:
            for line in r.iter_lines():
                first_started.set()
                if '"done":true' in line.replace(" ", ""):
                    first_done.set()
                if stop.is_set():
                    return

    stop = threading.Event()
    thread = threading.Thread(target=first, daemon=True)
    thread.start()
    try:
        assert first_started.wait(60)
        with httpx.stream("POST", server.url + "/api/generate", json=body, timeout=120) as r:
            next(r.iter_lines())  # the second request's first token
            assert not first_done.is_set()
    finally:
        stop.set()
        thread.join(60)


def test_the_cli_finds_the_server_at_ollama_host(server):
    result = CliRunner().invoke(app, ["ps"], env={"OLLAMA_HOST": f"127.0.0.1:{server.port}", "INFER_HOST": None})
    assert result.exit_code == 0 and result.stdout.startswith("NAME")


def test_a_busy_ollama_host_is_one_line_and_exit_1(server, tmp_path):
    env = {"INFER_HOME": str(tmp_path), "OLLAMA_HOST": f"127.0.0.1:{server.port}", "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-m", "cli", "serve"], env=env, capture_output=True, text=True,
                          timeout=60, cwd=ROOT)
    assert done.returncode == 1 and "listening" not in done.stderr
    assert done.stderr.strip().splitlines() == [
        f"Error: port {server.port} on 127.0.0.1 is already in use (another infer serve, or Ollama?); "
        "stop it or choose another with --host / INFER_HOST"]


@pytest.mark.parametrize("value,bound,url", [
    ("0.0.0.0", ("0.0.0.0", 11434), "http://127.0.0.1:11434"),
    ("example.com:8080", ("example.com", 8080), "http://example.com:8080"),
    ("http://127.0.0.2:9000", ("127.0.0.2", 9000), "http://127.0.0.2:9000"),
    (":7000", ("127.0.0.1", 7000), "http://127.0.0.1:7000"),
])
def test_ollama_host_forms(value, bound, url):
    assert host_from_env({"OLLAMA_HOST": value}) == bound
    assert client_url({"OLLAMA_HOST": value}) == url
    assert host_from_env({"OLLAMA_HOST": value, "INFER_HOST": "127.0.0.1:1234"}) == ("127.0.0.1", 1234)


def test_infer_variables_win_and_bad_values_name_the_variable(tmp_path):
    env = {"INFER_HOME": str(tmp_path), **OLLAMA_ENV}
    s = ServerSettings.from_env(env)
    assert (s.keep_alive, s.context_length, s.local.max_loaded_models, s.num_parallel) == (3600.0, 256, 1, 2)
    assert s.origins == ("chrome-extension://*",)
    s = ServerSettings.from_env({**env, "INFER_KEEP_ALIVE": "5m", "INFER_NUM_PARALLEL": "3"})
    assert (s.keep_alive, s.num_parallel) == (300.0, 3)
    assert LocalSettings.from_env({"OLLAMA_MAX_LOADED_MODELS": "0"}).max_loaded_models == 3  # Ollama's 0 = auto
    assert LocalSettings.from_env({"INFER_MAX_LOADED_MODELS": "0"}).max_loaded_models == 0  # ours: no limit
    with pytest.raises(SettingsError, match="invalid OLLAMA_NUM_PARALLEL"):
        ServerSettings.from_env({"INFER_HOME": str(tmp_path), "OLLAMA_NUM_PARALLEL": "many"})


def test_an_existing_ollama_store_is_the_default(tmp_path, monkeypatch, tiny_store):
    home = tmp_path / "home"
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("INFER_HOME")
    assert RegistrySettings.from_env().models == home / ".infer" / "models"  # no ~/.ollama: today's default

    ollama = Store(home / ".ollama" / "models")  # a store infer writes, in Ollama's layout
    gguf = load_details(tiny_store, parse_name("tiny")).model_path
    create_model(ollama, parse_name("mine"), parse_modelfile(f"FROM {gguf}\n"), tmp_path)
    manifest = home / ".ollama/models/manifests/registry.ollama.ai/library/mine/latest"
    assert manifest.is_file() and any((home / ".ollama/models/blobs").glob("sha256-*"))

    assert RegistrySettings.from_env().models == home / ".ollama" / "models"
    listed = CliRunner().invoke(app, ["list"])
    assert listed.exit_code == 0 and listed.stdout.splitlines()[1].startswith("mine:latest")
    assert RegistrySettings.from_env({"INFER_HOME": str(tmp_path / "x")}).models == tmp_path / "x" / "models"
    assert RegistrySettings.from_env({"OLLAMA_MODELS": str(tmp_path / "o")}).models == tmp_path / "o"
