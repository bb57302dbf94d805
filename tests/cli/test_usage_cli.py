"""``infer usage`` as a user sees it: exact tables, JSON totals, --db."""

from __future__ import annotations

import json
import os
import time

import pytest
from sqlmodel import Session
from typer.testing import CliRunner

from cli.main import app
from ledger.db import open_db
from ledger.tables import RequestLog
from ledger.usage import UsageRecord, log_usage

runner = CliRunner()


def invoke(*args: str):
    return runner.invoke(app, ["usage", *args])


@pytest.fixture(autouse=True)
def india_time(monkeypatch):
    """A fixed local zone (UTC+5:30, no tzdata needed) so TIME cells are exact."""
    monkeypatch.delenv("INFER_DATABASE_URL", raising=False)
    saved = os.environ.get("TZ")
    os.environ["TZ"] = "IST-5:30"
    time.tzset()
    yield
    if saved is None:
        del os.environ["TZ"]
    else:
        os.environ["TZ"] = saved
    time.tzset()


def row(n: int, **fields) -> RequestLog:
    values = {"source": "gateway", "route": "/v1/chat/completions", "model": "qwen2:0.5b", "backend": "llamacpp",
              "status": "ok", "input_tokens": 10, "output_tokens": 20, **fields}
    return RequestLog(id=f"01JD{n:022d}", datetime_utc=f"2026-11-21T10:0{n}:00.000000Z", **values)


@pytest.fixture
def ledger(infer_home):
    engine = open_db(f"sqlite:///{infer_home / 'usage.db'}")
    with Session(engine) as session:
        session.add(row(1, ttft_ms=120.0, tpot_ms=15.25, total_ms=420.0, cached_input_tokens=4))
        session.add(row(2, status="error", error="backend down", input_tokens=3, output_tokens=0))
        session.add(row(3, model="llama3:8b", source="cli", route="run", ttft_ms=80.0, tpot_ms=9.5, total_ms=300.0))
        session.commit()
    engine.dispose()


def test_empty_ledger():
    result = invoke()
    assert result.exit_code == 0 and result.output == "No requests recorded yet.\n"


def test_table_of_rows_and_totals(ledger):
    result = invoke()
    assert result.exit_code == 0, result.output
    assert result.output.splitlines() == [
        "TIME                   MODEL         SOURCE     ROUTE                   STATUS    IN    CACHED    OUT    "
        "TTFT (ms)    TPOT (ms)    TOTAL (ms)",
        "2026-11-21 15:33:00    llama3:8b     cli        run                     ok        10    -         20     "
        "80.0         9.5          300.0",
        "2026-11-21 15:32:00    qwen2:0.5b    gateway    /v1/chat/completions    error     3     -         0      "
        "-            -            -",
        "2026-11-21 15:31:00    qwen2:0.5b    gateway    /v1/chat/completions    ok        10    4         20     "
        "120.0        15.2         420.0",
        "",
        "Totals per model",
        "MODEL         REQUESTS    ERRORS    INPUT TOKENS    OUTPUT TOKENS    CACHED",
        "llama3:8b     1           0         10              20               0",
        "qwen2:0.5b    2           1         13              20               4",
    ]


def test_limit_and_model_filter(ledger):
    lines = invoke("-n", "1", "--model", "qwen2:0.5b").output.splitlines()
    assert len(lines) == 6 and "15:32:00    qwen2:0.5b" in lines[1]
    assert lines[-1].startswith("qwen2:0.5b    2 ")


def test_json_has_rows_and_exact_totals(ledger):
    data = json.loads(invoke("--json").output)
    assert [r["id"] for r in data["requests"]] == [row(n).id for n in (3, 2, 1)]
    assert list(data["requests"][0]) == list(RequestLog.model_fields)
    assert data["requests"][1]["error"] == "backend down" and data["requests"][1]["stream"] is False
    assert data["totals"] == [
        {"model": "llama3:8b", "requests": 1, "errors": 0, "input_tokens": 10, "output_tokens": 20,
         "cached_input_tokens": 0, "mean_ttft_ms": 80.0, "mean_tpot_ms": 9.5},
        {"model": "qwen2:0.5b", "requests": 2, "errors": 1, "input_tokens": 13, "output_tokens": 20,
         "cached_input_tokens": 4, "mean_ttft_ms": 120.0, "mean_tpot_ms": 15.25},
    ]


def test_db_option_and_env_var(tmp_path, monkeypatch, ledger):
    url = f"sqlite:///{tmp_path / 'elsewhere' / 'ledger.db'}"
    engine = open_db(url)
    log_usage(engine, UsageRecord(source="bench", route="/api/chat", model="other", backend="vllm"))
    engine.dispose()
    assert json.loads(invoke("--db", url, "--json").output)["totals"][0]["model"] == "other"
    monkeypatch.setenv("INFER_DATABASE_URL", url)
    assert [t["model"] for t in json.loads(invoke("--json").output)["totals"]] == ["other"]
    assert "llama3:8b" in invoke("--db", f"sqlite:///{tmp_path / 'infer-home' / 'usage.db'}").output


def test_bad_db_url_is_one_line():
    result = invoke("--db", "not a url")
    assert result.exit_code == 1
    assert result.output == "Error: invalid database URL 'not a url': expected e.g. sqlite:///path/usage.db\n"
