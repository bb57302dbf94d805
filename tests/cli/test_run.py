"""``infer run`` as a user sees it: a real subprocess, one-shot over pipes and the REPL over a pseudo-terminal.

The tiny model has random weights: the tests check behaviour (framing, counts, the ledger, exact
REPL messages), never the generated text.
"""

from __future__ import annotations

import io
import os
import re
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cli import repl_text
from cli.run import _prompt_text
from core.settings import default_database_url
from ledger.db import open_db
from ledger.usage import recent
from registry.create import create_model
from registry.details import load_details
from registry.modelfile import parse_modelfile
from registry.names import parse_name
from registry.server import RegistryServerThread
from registry.store import Store
from fakes.live import free_port

ROOT = Path(__file__).resolve().parents[2]
DURATION = r"(\d+h)?(\d+m)?\d+(\.\d+)?(ns|µs|ms|s)"
STAT_LINES = [
    ("total duration", DURATION), ("load duration", DURATION), ("prompt eval count", r"\d+ token\(s\)"),
    ("prompt eval duration", DURATION), ("prompt eval rate", r"\d+\.\d\d tokens/s"),
    ("eval count", r"\d+ token\(s\)"), ("eval duration", DURATION), ("eval rate", r"\d+\.\d\d tokens/s"),
    ("time to first token", DURATION), ("time per output token", DURATION),
]
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


@pytest.fixture
def store(tmp_path, tiny_store, infer_home, monkeypatch) -> Store:
    """A writable store: ``tiny`` and, newest, ``seeded`` (tiny + seed 42, num_predict 8)."""
    gguf = load_details(tiny_store, parse_name("tiny")).model_path
    local = Store(tmp_path / "models")
    create_model(local, parse_name("tiny"), parse_modelfile(f"FROM {gguf}\nPARAMETER num_ctx 512\n"), tmp_path)
    os.utime(local.manifest_path(parse_name("tiny")), (time.time() - 60, time.time() - 60))
    create_model(local, parse_name("seeded"),
                 parse_modelfile("FROM tiny\nPARAMETER seed 42\nPARAMETER num_predict 8\n"), tmp_path)
    monkeypatch.setenv("INFER_MODELS", str(local.root))
    return local


def cli_env(**extra: str) -> dict[str, str]:
    """The test's environment; no server answers at INFER_HOST unless ``extra`` names one (in-process runs)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("INFER_DATABASE")}
    env.update({"TERM": "dumb", "PYTHONIOENCODING": "utf-8", "INFER_HOST": f"127.0.0.1:{free_port()}", **extra})
    return env


def infer_run(*args: str, stdin: str = "") -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cli", "run", *args], check=False, input=stdin,
                          capture_output=True, text=True, encoding="utf-8", errors="replace", env=cli_env(), cwd=ROOT, timeout=60)


def ledger(home: Path):
    engine = open_db(default_database_url(home))
    try:
        return recent(engine, limit=50)
    finally:
        engine.dispose()


def stat(stderr: str, label: str) -> str:
    return re.search(rf"^{label}:\s+(.+)$", stderr, re.MULTILINE).group(1)


# -- one-shot ------------------------------------------------------------------------------------

@pytest.mark.parametrize("engine", ["llamacpp", "native"])
def test_one_shot_streams_the_answer_prints_stats_and_writes_one_ledger_row(store, infer_home, engine):
    result = infer_run("seeded", "hi", "--verbose", "--engine", engine)
    assert result.returncode == 0, result.stderr
    assert result.stdout.endswith("\n\n") and result.stdout.strip()
    lines = result.stderr.splitlines()
    labels = [label for label, _ in STAT_LINES]
    for line in lines:
        label = line.split(":")[0]
        assert label in labels, line
        assert re.fullmatch(re.escape(f"{label + ':':<21} ") + dict(STAT_LINES)[label], line), line
    shown = [line.split(":")[0] for line in lines]
    assert shown == [label for label in labels if label in shown]  # Ollama's order
    assert {"total duration", "prompt eval count", "prompt eval duration", "eval count", "time to first token"} <= set(shown)
    assert lines[0].startswith("total duration:       ")  # label padded to 22 columns

    rows = ledger(infer_home)
    assert len(rows) == 1
    row = rows[0]
    assert (row.source, row.route, row.status, row.model, row.backend) == ("cli", "run", "ok", "seeded", engine)
    assert 0 < row.output_tokens <= 8
    assert f"{row.output_tokens} token(s)" == stat(result.stderr, "eval count")
    assert f"{row.input_tokens} token(s)" == stat(result.stderr, "prompt eval count")

    again = infer_run("seeded", "hi", "--engine", engine)  # same seed: same answer; no stats without --verbose
    assert again.returncode == 0 and again.stderr == ""
    assert again.stdout == result.stdout


@pytest.mark.parametrize("engine", ["llamacpp", "native"])
def test_context_overflow_is_a_one_line_error_and_an_error_row(store, infer_home, engine):
    result = infer_run("tiny", "word " * 700, "--engine", engine)
    assert result.returncode == 1 and result.stdout == ""
    assert re.fullmatch(r"Error: the prompt is \d+ tokens but the context window is 512 tokens; [^\n]+\n", result.stderr)
    (row,) = ledger(infer_home)
    assert (row.source, row.route, row.status, row.output_tokens) == ("cli", "run", "error", 0)


def test_piped_stdin_is_the_prompt_and_no_model_means_the_newest(store, infer_home):
    result = infer_run(stdin="Write a haiku about tokens.\n")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip()
    (row,) = ledger(infer_home)
    assert row.model == "seeded:latest" and row.output_tokens > 0


def test_prompt_words_then_stdin_after_a_blank_line(monkeypatch):
    class Piped(io.StringIO):
        def isatty(self) -> bool:
            return False

    monkeypatch.setattr(sys, "stdin", Piped("the text\n"))
    assert _prompt_text(["summarize", "this"]) == "summarize this\n\nthe text\n"
    monkeypatch.setattr(sys, "stdin", Piped("only stdin"))
    assert _prompt_text([]) == "only stdin"


def test_empty_store_is_a_one_line_error(tmp_path, monkeypatch):
    monkeypatch.setenv("INFER_MODELS", str(tmp_path / "empty"))
    result = infer_run(stdin="hi")
    assert result.returncode == 1
    assert result.stderr == "Error: no models yet: run 'infer pull MODEL' first\n"
    assert result.stdout == ""


def test_a_model_that_cannot_be_pulled_is_a_one_line_error(store):
    result = infer_run("127.0.0.1:9/library/nope", "hi", "--insecure")
    assert result.returncode == 1
    assert result.stderr.splitlines()[-1].startswith("Error: could not reach registry 127.0.0.1:9")
    assert sum(line.startswith("Error:") for line in result.stderr.splitlines()) == 1


def test_a_missing_model_is_pulled_then_run(store, tmp_path, monkeypatch):
    monkeypatch.setenv("INFER_MODELS", str(tmp_path / "fresh"))
    with RegistryServerThread(store) as server:
        name = f"127.0.0.1:{server.port}/library/seeded"
        result = infer_run(name, "hi", "--insecure")
    assert result.returncode == 0, result.stderr
    assert "pulling manifest" in result.stderr and "success" in result.stderr
    assert result.stdout.strip()
    assert [m.name.display for m in Store(tmp_path / "fresh").list_models()] == [f"{name}:latest"]


# -- the REPL over a pseudo-terminal -----------------------------------------------------------------

def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class Terminal:
    """``infer run`` attached to a pty; ``expect`` reads until a text appears (CRLF folded to LF)."""

    def __init__(self, *args: str, env: dict[str, str] | None = None) -> None:
        master, slave = os.openpty()
        # Ctrl+C as a terminal delivers it: SIGINT at its default even when this test run was started in
        # the background (a non-interactive shell's `cmd &` ignores SIGINT, and children inherit that)
        self.proc = subprocess.Popen([sys.executable, "-m", "cli", "run", *args], stdin=slave, stdout=slave,
                                     stderr=slave, env=env or cli_env(), cwd=ROOT, start_new_session=True,
                                     preexec_fn=_default_sigint)
        os.close(slave)
        self.fd, self.pending = master, ""

    def expect(self, text: str, timeout: float = 30.0) -> str:
        deadline = time.monotonic() + timeout
        while text not in self.pending:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.fd], [], [], left)[0]:
                raise AssertionError(f"timed out waiting for {text!r}; got {self.pending!r}")
            try:
                data = os.read(self.fd, 65536)
            except OSError:  # the child closed the pty
                raise AssertionError(f"{text!r} never came; got {self.pending!r}") from None
            self.pending = ANSI.sub("", (self.pending + data.decode("utf-8", "replace")).replace("\r\n", "\n"))
        head, _, self.pending = self.pending.partition(text)
        return head + text

    def send(self, line: str) -> str:
        """Type a line and return what appears until the next ``>>> `` prompt (minus the echo)."""
        os.write(self.fd, (line + "\n").encode())
        return self.expect(">>> ").split("\n", 1)[-1]

    def interrupt(self, text: str) -> str:
        """Ctrl+C. CPython's readline only notices a SIGINT that interrupts its select(), so one that
        lands between printing the prompt and entering select() waits for the next: send again."""
        for _ in range(10):
            time.sleep(0.1)
            os.kill(self.proc.pid, signal.SIGINT)
            try:
                return self.expect(text, timeout=2.0)
            except AssertionError:
                continue
        raise AssertionError(f"Ctrl+C never answered with {text!r}; got {self.pending!r}")

    def close(self) -> int:
        try:
            return self.proc.wait(timeout=30)
        finally:
            os.close(self.fd)
            if self.proc.poll() is None:
                self.proc.kill()


@pytest.fixture
def repl(store):
    term = Terminal("seeded")
    term.expect(">>> ")
    yield term
    if term.proc.poll() is None:
        term.proc.kill()
        term.close()


def test_repl_commands_answer_like_ollama(repl, infer_home):
    assert repl.send("/?") == repl_text.USAGE + "\n>>> "
    assert "/load <model>" in repl_text.USAGE and "/save <model>" in repl_text.USAGE
    assert repl.send("/help") == repl_text.USAGE + "\n>>> "
    assert repl.send("/set") == repl_text.USAGE_SET + "\n>>> "
    assert repl.send("/show") == repl_text.USAGE_SHOW + "\n>>> "
    assert repl.send("/set parameter temperature 0.2") == "Set parameter 'temperature' to '0.2'\n>>> "
    assert repl.send("/set parameter stop <|im_end|> END") == "Set parameter 'stop' to '<|im_end|>, END'\n>>> "
    assert repl.send("/set parameter temperature hot") == \
        'Couldn\'t set parameter: "invalid float value [hot]"\n>>> '
    assert repl.send("/set parameter bogus 1") == 'Couldn\'t set parameter: "unknown parameter \'bogus\'"\n>>> '
    assert repl.send("/set parameter top_p 7").startswith("Couldn't set parameter: \"invalid option 'top_p'")
    assert repl.send("/show parameters") == (
        "Model defined parameters:\n"
        f"  {'num_ctx':<30} 512\n  {'seed':<30} 42\n  {'num_predict':<30} 8\n\n"
        "User defined parameters:\n"
        f"  {'temperature':<30} 0.2\n  {'stop':<30} [<|im_end|> END]\n\n>>> ")
    assert repl.send("/set system Be terse.") == "Set system message.\n>>> "
    assert repl.send("/show system") == "Be terse.\n\n>>> "
    assert repl.send("/set verbose") == "Set 'verbose' mode.\n>>> "
    assert repl.send("/set quiet") == "Set 'quiet' mode.\n>>> "
    assert repl.send("/set format json") == "Set format to 'json' mode.\n>>> "
    assert repl.send("/set noformat") == "Disabled format.\n>>> "
    assert repl.send("/foo bar") == "Unknown command '/foo'. Type /? for help\n>>> "
    assert repl.send("/show nothing") == "Unknown command '/show nothing'. Type /? for help\n>>> "
    assert repl.send("/load nope") == "Loading model 'nope'\nCouldn't find model 'nope'\n>>> "
    assert repl.send("/save mine") == "Created new model 'mine'\n>>> "
    assert repl.send("/load mine") == "Loading model 'mine'\n>>> "
    repl.interrupt("Use Ctrl + d or /bye to exit.\n>>> ")  # Ctrl+C on an empty line
    os.write(repl.fd, b"/bye\n")
    assert repl.close() == 0
    assert ledger(infer_home) == []  # no turn happened
    saved = load_details(Store(os.environ["INFER_MODELS"]), parse_name("mine"))
    assert saved.system == "Be terse." and saved.parameters["temperature"] == 0.2
    assert saved.parameters["seed"] == 42  # inherited from the model it was saved from


def test_repl_turns_multiline_clear_and_the_ledger(repl, infer_home):
    assert repl.send("/set parameter num_predict 8") == "Set parameter 'num_predict' to '8'\n>>> "
    assert repl.send("/set parameter seed 7") == "Set parameter 'seed' to '7'\n>>> "
    first = repl.send("hello")
    assert first.endswith("\n\n>>> ") and first.strip(">\n ")
    os.write(repl.fd, b'"""first line\n')
    repl.expect("... ")
    os.write(repl.fd, b'second line"""\n')
    assert repl.expect(">>> ").endswith("\n\n>>> ")
    assert repl.send("/clear") == "Cleared session context\n>>> "
    assert repl.send("/set verbose") == "Set 'verbose' mode.\n>>> "
    third = repl.send("hello")
    assert re.search(r"^eval count:           \d+ token\(s\)$", third, re.MULTILINE)
    assert third.endswith("\n>>> ")
    assert repl.send("/set quiet") == "Set 'quiet' mode.\n>>> "
    os.write(repl.fd, b'"""\n')  # a message longer than the context window
    for _ in range(60):
        repl.expect("... ")
        os.write(repl.fd, b"word " * 12 + b"\n")
    repl.expect("... ")
    assert re.fullmatch(r"Error: the prompt is \d+ tokens but the context window is 512 tokens; .+\n>>> ",
                        repl.send('"""'))  # one line, and the session goes on
    assert repl.send("/show system") == "No system message was specified for this model.\n>>> "
    os.write(repl.fd, b"\x04")  # Ctrl+D
    assert repl.close() == 0

    rows = sorted(ledger(infer_home), key=lambda r: r.id)
    assert [(r.source, r.route) for r in rows] == [("cli", "run")] * 4
    assert [r.status for r in rows] == ["ok", "ok", "ok", "error"]
    hello, multiline, after_clear = rows[:3]
    assert multiline.input_tokens > hello.input_tokens  # the history came along
    assert after_clear.input_tokens == hello.input_tokens  # /clear dropped it
    assert all(0 < r.output_tokens <= 8 for r in rows[:3])
    assert (Path(infer_home) / "history").is_file()
