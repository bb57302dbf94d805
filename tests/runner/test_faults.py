"""A runner that crashes or hangs never takes the gateway down (issue 27), against a live ``infer serve``.

The ``scripted`` engine (``INFER_TEST_ENGINE=1``) runs in a real runner process and faults as native
code does when its prompt says so: ``segv:N`` reads address 0 after N words, ``hang:N`` blocks the
whole process. Each fault is tried before the first token and mid-stream, on the Ollama and OpenAI
APIs; each answer is checked as a client reads it, each ledger row, and the gateway's PID.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import httpx
import pytest
import sqlalchemy as sa

from fakes.live import start_server, stop_server

HANG_S = 2.5  # INFER_HANG_TIMEOUT: well above a busy 2-core machine's slowest token
STOPPED = "model runner has unexpectedly stopped"


@pytest.fixture(scope="module")
def server(tiny_store, tmp_path_factory):
    live = start_server(tmp_path_factory.mktemp("faults"), tiny_store.root, INFER_TEST_ENGINE="1",
                        INFER_HANG_TIMEOUT=str(HANG_S))
    pid = live.process.pid
    try:
        yield live
    finally:
        assert live.process.poll() is None and live.process.pid == pid, "the gateway died"
        stop_server(live)


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.url, timeout=60) as client:
        yield client


def ollama(prompt: str, **options) -> dict:
    return {"model": "tiny", "prompt": prompt, "options": {"engine": "scripted", "num_predict": 8, **options}}


def openai(prompt: str, *, stream: bool = True) -> dict:
    return {"model": "tiny", "engine": "scripted", "stream": stream, "max_tokens": 8,
            "messages": [{"role": "user", "content": prompt}]}


def ledger(server, agent: str) -> list:
    """The ledger rows of the requests sent with User-Agent ``agent``, in the order written."""
    db = sa.create_engine(server.db_url)
    try:
        with db.connect() as conn:
            return list(conn.execute(sa.text("SELECT status, output_tokens, error FROM requests WHERE client = :agent "
                                             "ORDER BY id"), {"agent": agent}))
    finally:
        db.dispose()


def wait_rows(server, agent: str, count: int) -> list:
    """Those rows once there are ``count`` of them (the ledger writer is a thread; 10 s at most)."""
    deadline = time.monotonic() + 10
    while len(rows := ledger(server, agent)) < count and time.monotonic() < deadline:
        time.sleep(0.1)
    return rows


def tagged(agent: str) -> dict[str, str]:
    return {"user-agent": agent}


def settle(http) -> None:
    """A finished request ends a crash streak (no back-off for the next test)."""
    resp = http.post("/api/generate", json={**ollama("fine"), "stream": False})
    assert resp.status_code == 200 and resp.json()["response"].startswith("word0")


def runner_pids(http, engine: str = "scripted") -> list[int]:
    return [m["runner"]["pid"] for m in http.get("/api/ps").json()["models"]
            if (m.get("runner") or {}).get("engine") == engine]


# -- before the first token ------------------------------------------------------------------------

@pytest.mark.parametrize("fault", ["segv", "hang"])
def test_a_fault_before_the_first_token_is_a_502_in_each_api_shape(server, http, fault):
    settle(http)
    agent = f"before-{fault}"
    t0 = time.monotonic()
    resp = http.post("/api/generate", json=ollama(f"{fault}:0"), headers=tagged(agent))
    assert resp.status_code == 502
    error = resp.json()["error"]
    assert error.startswith(STOPPED)
    assert ("killed by SIGSEGV" if fault == "segv" else "hung: no event for") in error
    if fault == "hang":
        assert HANG_S <= time.monotonic() - t0 < HANG_S + 2.5

    settle(http)  # a fresh runner answers, and the streak ends
    resp = http.post("/v1/chat/completions", json=openai(f"{fault}:0"), headers=tagged(agent))
    assert resp.status_code == 502
    body = resp.json()["error"]
    assert body["message"].startswith(STOPPED) and body["type"] == "api_error"
    rows = wait_rows(server, agent, 2)
    assert [(r.status, r.output_tokens) for r in rows] == [("error", 0), ("error", 0)]
    assert all(STOPPED in r.error for r in rows if r.status == "error")
    settle(http)


# -- mid-stream ------------------------------------------------------------------------------------

@pytest.mark.parametrize("fault", ["segv", "hang", "stall"])
def test_a_fault_mid_stream_ends_the_ollama_stream_with_an_error_line(server, http, fault):
    settle(http)
    agent = f"mid-{fault}"
    body = {"model": "tiny", "options": {"engine": "scripted", "num_predict": 8},
            "messages": [{"role": "user", "content": f"{fault}:3 delay:10"}]}
    with http.stream("POST", "/api/chat", headers=tagged(agent), json=body) as resp:
        assert resp.status_code == 200
        lines = [json.loads(line) for line in resp.iter_lines() if line]
    assert [m["message"]["content"] for m in lines[:-1]] == ["word0 ", "word1 ", "word2 "]
    assert set(lines[-1]) == {"error"} and lines[-1]["error"].startswith(STOPPED)
    rows = wait_rows(server, agent, 1)
    assert [(r.status, r.output_tokens) for r in rows] == [("error", 3)]
    settle(http)


@pytest.mark.parametrize("fault", ["segv", "hang"])
def test_a_fault_mid_stream_ends_the_sse_stream_with_an_error_event(server, http, fault):
    settle(http)
    agent = f"sse-{fault}"
    with http.stream("POST", "/v1/chat/completions", json=openai(f"{fault}:2 delay:10"), headers=tagged(agent)) as resp:
        assert resp.status_code == 200
        events = [line.removeprefix("data: ") for line in resp.iter_lines() if line.startswith("data: ")]
    texts = [json.loads(e)["choices"][0]["delta"].get("content") for e in events[:-2] if "choices" in json.loads(e)]
    assert "word0 " in texts and "word1 " in texts
    error = json.loads(events[-2] if events[-1] == "[DONE]" else events[-1])
    assert error["error"]["message"].startswith(STOPPED)
    assert [(r.status, r.output_tokens) for r in wait_rows(server, agent, 1)] == [("error", 2)]
    settle(http)


# -- many streams, two models, back-off ------------------------------------------------------------

def test_sigkill_of_a_runner_during_20_streams_ends_them_all_within_2_s(server, http):
    settle(http)
    [pid] = runner_pids(http)
    ends: list[tuple[float, dict]] = []
    started = threading.Barrier(21)

    def stream() -> None:
        body = ollama("delay:20", num_predict=2000)
        with httpx.Client(base_url=server.url, timeout=30, headers=tagged("sigkill")) as client, \
                client.stream("POST", "/api/generate", json=body) as resp:
            lines = resp.iter_lines()
            first = json.loads(next(lines))
            assert first["response"] == "word0 "
            started.wait()
            last = first
            for line in lines:
                if line:
                    last = json.loads(line)
            ends.append((time.monotonic(), last))

    threads = [threading.Thread(target=stream) for _ in range(20)]
    for t in threads:
        t.start()
    started.wait(timeout=30)
    time.sleep(0.2)
    killed_at = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    for t in threads:
        t.join(timeout=10)
    assert len(ends) == 20
    assert max(at for at, _ in ends) - killed_at < 2.0
    assert all("killed by SIGKILL" in last.get("error", "") for _, last in ends)
    rows = wait_rows(server, "sigkill", 20)
    assert len(rows) == 20 and all(r.status == "error" and r.output_tokens > 0 for r in rows)
    settle(http)
    assert runner_pids(http) and runner_pids(http) != [pid]


def test_two_models_run_in_two_runners_at_once(server, http):
    answers: dict[str, int] = {}

    def ask(model: str) -> None:
        resp = httpx.post(server.url + "/api/generate", timeout=60, json={
            "model": model, "prompt": "hello", "stream": False, "options": {"num_predict": 4}})
        answers[model] = resp.status_code

    threads = [threading.Thread(target=ask, args=(m,)) for m in ("tiny", "tiny-go")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert answers == {"tiny": 200, "tiny-go": 200}
    models = {m["name"]: m["runner"] for m in http.get("/api/ps").json()["models"]
              if m["runner"]["engine"] == "llamacpp"}
    assert {"tiny:latest", "tiny-go:latest"} <= set(models)
    pids = {models["tiny:latest"]["pid"], models["tiny-go:latest"]["pid"], server.process.pid}
    assert len(pids) == 3 and all(models[n]["memory"] > 0 for n in ("tiny:latest", "tiny-go:latest"))


def test_repeated_crashes_back_off_and_say_why(server, http):
    settle(http)
    for _ in range(2):
        assert http.post("/api/generate", json=ollama("segv:0")).status_code == 502
    resp = http.post("/api/generate", json=ollama("hello"))
    assert resp.status_code == 503 and int(resp.headers["retry-after"]) >= 1
    assert "crashed 2 times in a row (last: killed by SIGSEGV)" in resp.json()["error"]
    [failure] = [f for f in http.get("/api/ps").json()["failures"] if f["engine"] == "scripted"]
    assert failure["crashes"] == 2 and failure["error"] == "killed by SIGSEGV"
    assert "crash 2 in a row, next start in 1 s" in server.log()
    shown = subprocess.run([sys.executable, "-m", "cli", "ps"], capture_output=True, text=True, timeout=60,
                           env={**os.environ, "INFER_HOST": f"127.0.0.1:{server.port}"})
    assert shown.returncode == 0 and shown.stdout.splitlines()[0].split() == [
        "NAME", "ID", "SIZE", "PROCESSOR", "CONTEXT", "UNTIL", "ENGINE", "TP", "PID", "MEMORY"]
    assert "tiny:latest (scripted): 2 crash(es) in a row, last: killed by SIGSEGV; next start" in shown.stdout
    time.sleep(1.1)
    settle(http)
    assert not [f for f in http.get("/api/ps").json()["failures"] if f["engine"] == "scripted"]


def test_a_crash_while_embedding_is_a_502_and_the_next_embedding_works(tiny_store, tmp_path):
    """Embeddings run in runners too: on a server whose default engine embeds (here ``scripted``)."""
    live = start_server(tmp_path, tiny_store.root, INFER_TEST_ENGINE="1", INFER_ENGINE="scripted")
    try:
        resp = httpx.post(live.url + "/api/embed", json={"model": "tiny", "input": ["segv:0"]}, timeout=30)
        assert resp.status_code == 502 and resp.json()["error"].startswith(STOPPED)
        resp = httpx.post(live.url + "/v1/embeddings", json={"model": "tiny", "input": ["hello"]}, timeout=30)
        assert resp.status_code == 200 and len(resp.json()["data"][0]["embedding"]) == 8
        assert live.process.poll() is None
    finally:
        stop_server(live)


def test_unload_waits_for_the_requests_in_flight(server, http):
    settle(http)
    [pid] = runner_pids(http)
    out: dict = {}

    def slow() -> None:
        resp = httpx.post(server.url + "/api/generate", timeout=30, json={**ollama("delay:20", num_predict=40),
                                                                           "stream": False})
        out["resp"] = resp

    thread = threading.Thread(target=slow)
    thread.start()
    time.sleep(0.3)
    assert http.post("/api/generate", json={"model": "tiny", "keep_alive": 0,
                                            "options": {"engine": "scripted"}}).status_code == 200
    assert runner_pids(http) == [pid]  # still serving
    thread.join()
    assert out["resp"].status_code == 200 and out["resp"].json()["eval_count"] == 40
    deadline = time.monotonic() + 5
    while runner_pids(http) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert runner_pids(http) == []
    while gone(pid) is False and time.monotonic() < deadline:
        time.sleep(0.05)
    assert gone(pid)


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False
