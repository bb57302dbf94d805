"""The CLI as a client of a live ``infer serve``: ``infer run`` (one-shot and the REPL), ``ps``, ``stop``, ``-v``.

One server on a free loopback port serves a private copy of the tiny models plus ``seeded`` (seed 42,
num_predict 8, so an answer is the same every time); the CLI runs as a subprocess with
``INFER_HOST`` pointing at it, and its answers are compared with the in-process run's.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from datetime import datetime

import httpx
import pytest
from typer.testing import CliRunner

from cli.main import app
from gateway.health import VERSION
from ledger.db import open_db
from ledger.usage import recent
from cli.models import render_show
from registry.create import create_model
from registry.details import load_details
from registry.modelfile import parse_modelfile
from registry.names import parse_name
from tests.cli.test_run import ROOT, STAT_LINES, Terminal, cli_env, stat
from fakes.live import free_port, start_server, stop_server
from tests.gateway.conftest import private_store

LABELS = [label for label, _ in STAT_LINES]


@pytest.fixture(scope="module")
def store(tiny_store, tmp_path_factory):
    local = private_store(tiny_store, tmp_path_factory, "client")
    create_model(local, parse_name("seeded"), parse_modelfile("FROM tiny\nPARAMETER seed 42\nPARAMETER num_predict 8\n"),
                 local.root)
    return local


@pytest.fixture(scope="module")
def server(store, tmp_path_factory):
    live = start_server(tmp_path_factory.mktemp("client-server"), store.root)
    try:
        yield live
    finally:
        stop_server(live)


def infer(*args: str, env: dict[str, str], stdin: str = "") -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cli", *args], check=False, input=stdin, capture_output=True,
                          text=True, encoding="utf-8", env=env, cwd=ROOT, timeout=60)


def command(*args: str, host: str) -> tuple[int, str, str]:
    """A quick command in this process (``ps``, ``stop``, ``-v``): exit code, stdout, stderr."""
    result = CliRunner().invoke(app, list(args), env={"INFER_HOST": host})
    return result.exit_code, result.stdout, result.stderr


def via(server, store, **extra: str) -> dict[str, str]:
    return cli_env(INFER_HOST=f"127.0.0.1:{server.port}", INFER_MODELS=str(store.root), **extra)


def loaded(server) -> dict[str, dict]:
    """/api/ps by display name (``seeded`` for ``seeded:latest``)."""
    return {m["name"].removesuffix(":latest"): m for m in httpx.get(server.url + "/api/ps").json()["models"]}


def rows(server):
    engine = open_db(server.db_url)
    try:
        return recent(engine, limit=50)
    finally:
        engine.dispose()


def test_run_through_the_server_answers_as_in_process_and_leaves_the_model_warm(server, store):
    before = {r.id for r in rows(server)}
    remote = infer("run", "seeded", "hi", "--verbose", "--keepalive", "10m", env=via(server, store))
    local = infer("run", "seeded", "hi", "--verbose", "--local", env=via(server, store))
    assert remote.returncode == 0 and local.returncode == 0, remote.stderr + local.stderr
    assert remote.stdout == local.stdout and remote.stdout.endswith("\n\n") and remote.stdout.strip()
    shown = [line.split(":")[0] for line in remote.stderr.splitlines()]
    assert shown == [label for label in LABELS if label in shown]  # Ollama's labels, Ollama's order
    assert {"total duration", "prompt eval count", "prompt eval rate", "eval count", "eval rate"} <= set(shown)
    for label in ("prompt eval count", "eval count"):
        assert stat(remote.stderr, label) == stat(local.stderr, label)

    (row,) = [r for r in rows(server) if r.id not in before]  # the server's ledger, one row
    assert (row.route, row.status, row.model, row.source) == ("/api/chat", "ok", "seeded", "gateway")
    assert row.client.startswith(f"infer/{VERSION}")
    assert f"{row.output_tokens} token(s)" == stat(remote.stderr, "eval count")

    warm = loaded(server)["seeded"]  # --keepalive 10m: still loaded, until about then
    until = datetime.fromisoformat(re.sub(r"(\.\d{6})\d+", r"\1", warm["expires_at"])).timestamp() - time.time()
    assert 9 * 60 < until <= 10 * 60

    again = infer("run", "seeded", "hi", env=via(server, store))  # the warm model: the same answer, no stats
    assert (again.returncode, again.stdout, again.stderr) == (0, remote.stdout, "")


def test_ps_lists_the_loaded_model_and_stop_unloads_it(server, store):
    host = f"127.0.0.1:{server.port}"
    assert infer("run", "seeded", "hi", "--keepalive", "5m", env=via(server, store)).returncode == 0
    code, out, err = command("ps", host=host)
    assert (code, err) == (0, "")
    header, *lines = out.splitlines()
    assert re.fullmatch(r"NAME\s{4,}ID\s{4,}SIZE\s{4,}PROCESSOR\s{4,}CONTEXT\s{4,}UNTIL\s{4,}ENGINE\s{4,}TP"
                        r"\s{4,}PID\s{4,}MEMORY", header)
    (line,) = [x for x in lines if x.startswith("seeded")]
    runner = loaded(server)["seeded"]["runner"]
    digest = loaded(server)["seeded"]["digest"][:12]
    assert re.fullmatch(rf"seeded(:latest)?\s{{4,}}{digest}\s{{4,}}\d+(\.\d)? [KM]B\s{{4,}}100% CPU\s{{4,}}512"
                        rf"\s{{4,}}(4|5) minutes from now\s{{4,}}llamacpp\s{{4,}}1\s{{4,}}{runner['pid']}\s{{4,}}\d+(\.\d)? MB",
                        line), line

    assert command("stop", "seeded", host=host) == (0, "", "")
    assert "seeded" not in loaded(server)
    assert command("stop", "seeded", host=host) == (1, "", "Error: model 'seeded' is not running\n")
    assert command("stop", "nope", host=host) == (1, "", 'Error: couldn\'t find model "nope" to stop\n')


def test_version_names_the_servers_and_warns_without_one(server):
    assert command("--version", host=f"127.0.0.1:{server.port}") == (0, f"infer version is {VERSION}\n", "")
    assert command("-v", host=f"127.0.0.1:{free_port()}") == (
        0, f"Warning: could not connect to a running infer serve\nWarning: client version is {VERSION}\n", "")


def test_without_a_server_ps_and_stop_are_one_line_errors():
    host = f"127.0.0.1:{free_port()}"
    for args in (["ps"], ["stop", "tiny"]):
        assert command(*args, host=host) == (
            1, "", f"Error: could not connect to a server at http://{host}; is 'infer serve' running?\n")


def test_a_server_error_is_one_line_and_exit_1(server, store):
    result = infer("run", "tiny", "word " * 700, env=via(server, store))
    assert result.returncode == 1 and result.stdout == ""
    assert re.fullmatch(r"Error: the prompt is \d+ tokens but the context window is 512 tokens; [^\n]+\n", result.stderr)
    missing = infer("run", "127.0.0.1:1/library/absent", "hi", "--insecure", env=via(server, store))
    assert missing.returncode == 1 and missing.stdout == ""  # pulled through the server, which cannot reach it
    assert re.fullmatch(r"pulling manifest\nError: could not reach registry 127\.0\.0\.1:1 [^\n]+\n", missing.stderr)


def test_the_repl_keeps_the_history_on_the_server(server, store):
    before = {r.id for r in rows(server)}
    term = Terminal("seeded", env=via(server, store))
    try:
        term.expect(">>> ")
        first = term.send("hello")
        assert first.endswith("\n\n>>> ") and first.strip(">\n ")
        assert term.send("/set verbose") == "Set 'verbose' mode.\n>>> "
        second = term.send("and again")
        assert re.search(r"^eval count:           \d+ token\(s\)$", second, re.MULTILINE)
        assert term.send("/show parameters").startswith("Model defined parameters:\n")
        details = load_details(store, parse_name("seeded"))
        assert term.send("/show info") == render_show(details) + ">>> "  # as in-process
        assert term.send("/show template") == details.chat_template + "\n>>> "
        assert term.send("/clear") == "Cleared session context\n>>> "
        term.send("hello")
    finally:
        os.write(term.fd, b"/bye\n")
        assert term.close() == 0
    new = sorted((r for r in rows(server) if r.id not in before), key=lambda r: r.id)
    assert [(r.route, r.status) for r in new] == [("/api/chat", "ok")] * 3
    first_row, second_row, after_clear = new
    assert second_row.input_tokens > first_row.input_tokens  # the history went to the server
    assert after_clear.input_tokens == first_row.input_tokens


def test_a_turn_is_ollamas_chat_body():
    from cli.client import ServerClient
    from cli.remote_session import RemoteChatSession, parse_parameters

    s = RemoteChatSession(ServerClient("http://127.0.0.1:1"), "tiny", format="json", keep_alive=600.0, engine="native")
    s.system, s.options = "Be terse.", {"seed": 7}
    s.messages.append({"role": "user", "content": "hi"})
    assert s.body(truncate=False) == {
        "model": "tiny", "stream": True, "truncate": False, "format": "json", "keep_alive": 600.0,
        "messages": [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "hi"}],
        "options": {"seed": 7, "engine": "native"}}
    assert parse_parameters('num_ctx                        512\nstop                           "<|im_end|>"\n'
                            'stop                           "END"') == {"num_ctx": 512, "stop": ["<|im_end|>", "END"]}


def test_ctrl_c_stops_a_reply_on_the_server_and_the_session_goes_on(server, store):
    before = {r.id for r in rows(server)}
    term = Terminal("slow", env=via(server, store))
    try:
        term.expect(">>> ")
        assert term.send("/set parameter num_predict 3000") == "Set parameter 'num_predict' to '3000'\n>>> "
        assert term.send("/set parameter ignore_eos true") == "Set parameter 'ignore_eos' to 'true'\n>>> "
        os.write(term.fd, b"count to a million\n")
        deadline = time.monotonic() + 60
        while "slow" not in loaded(server) and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(1.0)  # generating
        term.interrupt(">>> ")
        assert term.send("/set parameter num_predict 4") == "Set parameter 'num_predict' to '4'\n>>> "
        assert term.send("and now?").endswith("\n\n>>> ")
    finally:
        os.write(term.fd, b"/bye\n")
        assert term.close() == 0
    deadline = time.monotonic() + 15
    while len([r for r in rows(server) if r.id not in before]) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    new = sorted((r for r in rows(server) if r.id not in before), key=lambda r: r.id)
    assert [r.status for r in new] == ["cancelled", "ok"]
    assert new[0].output_tokens < 3000 and new[1].input_tokens > new[0].input_tokens  # the history went along
