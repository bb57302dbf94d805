"""A tensor-parallel model behind a live ``infer serve`` (issue 33): a Modelfile's ``PARAMETER
tensor_parallel 2`` makes its runner a group of two processes (the runner as rank 0, a native-engine
worker as rank 1), which answers as one rank does, which ``/api/ps`` and ``infer ps`` show, and which
fails as one when a rank dies: every request in flight ends with an error, the next starts a new group.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading

import httpx
import pytest

from registry.create import create_model
from registry.modelfile import parse_modelfile
from registry.names import parse_name
from fakes.live import start_server, stop_server
from tests.gateway.conftest import private_store

from .test_faults import STOPPED, ledger, tagged, wait_rows


@pytest.fixture(scope="module")
def server(tiny_store, tmp_path_factory):
    store = private_store(tiny_store, tmp_path_factory, "tp-store")
    gguf = tiny_store.root.parent / "tiny-qwen2.gguf"
    modelfile = parse_modelfile(f"FROM {gguf}\nPARAMETER num_ctx 512\nPARAMETER tensor_parallel 2\n")
    create_model(store, parse_name("tiny-tp", insecure=True), modelfile, store.root.parent)
    live = start_server(tmp_path_factory.mktemp("tp"), store.root, INFER_ENGINE="native")
    try:
        yield live
    finally:
        stop_server(live)


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.url, timeout=120) as client:
        yield client


def generate(http, model: str, **options) -> httpx.Response:
    return http.post("/api/generate", json={"model": model, "prompt": "Once upon a time", "stream": False,
                                           "options": {"temperature": 0, "num_predict": 32, **options}})


def group_of(http, model: str = "tiny-tp:latest") -> dict:
    [runner] = [m["runner"] for m in http.get("/api/ps").json()["models"] if m["name"] == model]
    return runner


def test_a_two_rank_model_answers_as_one_rank_does_and_ps_shows_its_group(server, http):
    one, two = generate(http, "tiny"), generate(http, "tiny-tp")
    assert one.status_code == two.status_code == 200
    assert two.json()["response"] == one.json()["response"] and two.json()["eval_count"] == 32
    runner = group_of(http)
    assert runner["tensor_parallel"] == 2 and len(set(runner["pids"])) == 2 and runner["pids"][0] == runner["pid"]
    assert runner["memory"] > 0 and group_of(http, "tiny:latest")["tensor_parallel"] == 1
    shown = subprocess.run([sys.executable, "-m", "cli", "ps"], capture_output=True, text=True, timeout=60,
                           env={**os.environ, "INFER_HOST": f"127.0.0.1:{server.port}"})
    [line] = [x for x in shown.stdout.splitlines() if x.startswith("tiny-tp")]
    assert line.split()[-5:-2] == ["native", "2", f"{runner['pids'][0]},{runner['pids'][1]}"], line


def test_a_dead_rank_fails_every_request_in_flight_and_the_next_starts_a_new_group(server, http):
    assert generate(http, "tiny-tp").status_code == 200  # the group is up
    before = group_of(http)["pids"]
    started, lines = threading.Barrier(3), {}

    def stream(agent: str) -> None:
        body = {"model": "tiny-tp", "prompt": f"story {agent}", "options": {"num_predict": 400, "ignore_eos": True}}
        with http.stream("POST", "/api/generate", json=body, headers=tagged(agent)) as resp:
            got = []
            for line in resp.iter_lines():
                got.append(json.loads(line))
                if len(got) == 1:
                    started.wait(timeout=60)
            lines[agent] = got

    threads = [threading.Thread(target=stream, args=(f"tp-dead-{i}",)) for i in range(2)]
    for t in threads:
        t.start()
    started.wait(timeout=60)  # both requests have their first token
    os.kill(before[1], signal.SIGKILL)  # rank 1, a native-engine worker
    for t in threads:
        t.join(timeout=60)
    for agent, got in lines.items():
        assert got[0]["response"] and set(got[-1]) == {"error"}, got[-1]
        assert got[-1]["error"].startswith(STOPPED)
        assert f"(tensor-parallel rank 1 of 2, pid {before[1]}, killed by SIGKILL" in got[-1]["error"]
        [row] = wait_rows(server, agent, 1)
        assert row.status == "error" and 0 < row.output_tokens < 400
    assert generate(http, "tiny-tp").status_code == 200  # a fresh group
    after = group_of(http)["pids"]
    assert len(after) == 2 and not set(after) & set(before)
    assert [r.status for r in ledger(server, "tp-dead-0")] == ["error"]
