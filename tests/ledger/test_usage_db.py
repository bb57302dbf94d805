"""The usage ledger: exact schema, migrations, WAL, concurrent writers, and the read-back numbers."""

from __future__ import annotations

import logging
import subprocess
import sys
import threading
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlmodel import Session

from ledger import migrations
from core.settings import RegistrySettings
from ledger.db import open_db
from ledger.tables import RequestLog
from ledger.ulid import ALPHABET, new_ulid
from ledger.usage import ModelTotals, UsageRecord, log_usage, recent, totals_by_model

COLUMNS = ["id", "datetime_utc", "source", "client", "route", "model", "backend", "stream", "status",
           "finish_reason", "input_tokens", "output_tokens", "cached_input_tokens", "queue_ms", "ttft_ms",
           "tpot_ms", "total_ms", "error", "usage_source", "route_name", "attempts", "slo_met", "slo_missed",
           "input_cost_usd", "cached_input_cost_usd", "output_cost_usd", "total_cost_usd", "pricing_version",
           "key_name", "expected_cached_tokens", "reasoning_tokens", "reasoning_cost_usd",
           "prefill_backend", "prefill_ms", "prefill_cost_usd", "decode_cost_usd", "backend_reported_output_tokens"]
APPLIED = ["m001_requests", "m002_usage_source", "m003_routes", "m004_costs", "m005_api_keys", "m006_expected_cached",
           "m007_reasoning", "m008_responses", "m009_key_roles_and_holds", "m010_response_owners", "m011_disagg",
           "m012_backend_reported_output"]


@pytest.fixture
def url(tmp_path):
    return f"sqlite:///{tmp_path / 'db' / 'usage.db'}"


@pytest.fixture
def reopen(url):
    """Opens ``url`` when the test asks (after the test made the file); disposed at teardown."""
    engines = []
    yield lambda: engines.append(open_db(url)) or engines[-1]
    for engine in engines:
        engine.dispose()


@pytest.fixture
def engine(reopen):
    return reopen()


def record(model="qwen2:0.5b", **fields) -> UsageRecord:
    return UsageRecord(**{"source": "gateway", "route": "/v1/chat/completions", "model": model,
                          "backend": "llamacpp", **fields})


def migration_rows(engine):
    with engine.connect() as conn:
        return conn.execute(sa.text("SELECT name, applied_at FROM _infer_migrations ORDER BY name")).all()


def count(engine) -> int:
    with engine.connect() as conn:
        return conn.execute(sa.text("SELECT count(*) FROM requests")).scalar_one()


def test_migrating_an_empty_db_creates_the_exact_schema(engine):
    inspector = sa.inspect(engine)
    assert [c["name"] for c in inspector.get_columns("requests")] == COLUMNS
    assert sorted(c.name for c in RequestLog.__table__.columns) == sorted(COLUMNS)  # model and migrations agree
    assert inspector.get_pk_constraint("requests")["constrained_columns"] == ["id"]
    assert sorted((i["name"], i["column_names"]) for i in inspector.get_indexes("requests")) == [
        ("ix_requests_datetime_utc", ["datetime_utc"]), ("ix_requests_model", ["model"])]
    rows = migration_rows(engine)
    assert [name for name, _ in rows] == APPLIED
    assert all(datetime.fromisoformat(at) > datetime.now(timezone.utc) - timedelta(minutes=1) for _, at in rows)


def test_migrating_twice_is_a_no_op(engine, reopen):
    before = migration_rows(engine)
    assert migrations.migrate(engine) == []
    reopen()
    assert migration_rows(engine) == before


def test_an_old_db_upgrades_when_a_migration_is_added(engine, monkeypatch):
    log_usage(engine, record())

    def m999_cost(conn):
        conn.execute(sa.text("ALTER TABLE requests ADD COLUMN cost_usd FLOAT"))

    monkeypatch.setattr(migrations, "MIGRATIONS", [*migrations.MIGRATIONS, m999_cost])
    assert migrations.migrate(engine) == ["m999_cost"]
    assert [c["name"] for c in sa.inspect(engine).get_columns("requests")] == [*COLUMNS, "cost_usd"]
    assert [name for name, _ in migration_rows(engine)] == [*APPLIED, "m999_cost"]
    assert count(engine) == 1 and recent(engine)[0].model == "qwen2:0.5b"


def test_a_failing_migration_leaves_no_trace(engine, monkeypatch):
    def m999_broken(conn):
        conn.execute(sa.text("ALTER TABLE requests ADD COLUMN half_done TEXT"))
        raise RuntimeError("boom")

    monkeypatch.setattr(migrations, "MIGRATIONS", [*migrations.MIGRATIONS, m999_broken])
    with pytest.raises(RuntimeError):
        migrations.migrate(engine)
    assert "half_done" not in [c["name"] for c in sa.inspect(engine).get_columns("requests")]
    assert [name for name, _ in migration_rows(engine)] == APPLIED


def test_sqlite_pragmas_are_on(engine):
    with engine.connect() as conn:
        pragmas = [conn.exec_driver_sql(f"PRAGMA {p}").scalar_one()
                   for p in ("journal_mode", "busy_timeout", "synchronous")]
    assert pragmas == ["wal", 5000, 1]  # synchronous=NORMAL is 1


def test_database_urls(tmp_path):
    assert RegistrySettings.from_env({"INFER_HOME": str(tmp_path)}).database_url == f"sqlite:///{tmp_path}/usage.db"
    env = {"INFER_HOME": str(tmp_path), "INFER_DATABASE_URL": "sqlite:///elsewhere.db"}
    assert RegistrySettings.from_env(env).database_url == "sqlite:///elsewhere.db"


@pytest.mark.parametrize("bad, reason", [
    ("not a url", "expected e.g. sqlite:///path/usage.db"),
    ("nosuchdb://x/y", "Can't load plugin"),
])
def test_a_bad_url_is_a_clear_value_error(bad, reason):
    with pytest.raises(ValueError, match=f"^invalid database URL '{bad}': {reason}"):
        open_db(bad)


def test_ulids_are_crockford_and_sort_by_time():
    ids = [new_ulid(1_700_000_000_000), new_ulid(1_700_000_000_000), new_ulid(1_700_000_000_001), new_ulid()]
    assert all(len(i) == 26 and set(i) <= set(ALPHABET) for i in ids)
    assert ids == sorted(ids) and len(set(ids)) == 4
    assert new_ulid(0).startswith("0000000000") and new_ulid(2**48 - 1).startswith("7ZZZZZZZZZ")


def test_log_usage_recent_and_totals(engine):
    log_usage(engine, record(input_tokens=10, output_tokens=20, cached_input_tokens=4, ttft_ms=100.0, tpot_ms=10.0))
    log_usage(engine, record(input_tokens=5, output_tokens=7, ttft_ms=300.0, tpot_ms=20.0, stream=True))
    log_usage(engine, record(status="error", error="backend down", input_tokens=3))
    last = log_usage(engine, record(model="llama3:8b", source="cli", route="run", status="cancelled", output_tokens=2))

    rows = recent(engine)
    assert [r.id for r in rows][0] == last and len(rows) == 4
    assert [r.datetime_utc for r in rows] == sorted((r.datetime_utc for r in rows), reverse=True)
    assert rows[0].datetime_utc.endswith("Z") and len(rows[0].datetime_utc) == len("2026-11-21T10:00:00.123456Z")
    assert [r.status for r in recent(engine, limit=2, model="qwen2:0.5b")] == ["error", "ok"]
    assert recent(engine, model="qwen2:0.5b")[1].stream is True
    assert totals_by_model(engine) == [
        ModelTotals("llama3:8b", requests=1, errors=0, input_tokens=0, output_tokens=2, cached_input_tokens=0,
                    mean_ttft_ms=None, mean_tpot_ms=None),
        ModelTotals("qwen2:0.5b", requests=3, errors=1, input_tokens=18, output_tokens=27, cached_input_tokens=4,
                    mean_ttft_ms=200.0, mean_tpot_ms=15.0),
    ]


def test_totals_since(engine):
    with Session(engine) as session:
        session.add(RequestLog(id=new_ulid(), datetime_utc="2020-01-01T00:00:00.000000Z", source="cli", route="run",
                               model="old", backend="llamacpp", status="ok", input_tokens=1, output_tokens=1))
        session.commit()
    log_usage(engine, record())
    assert [t.model for t in totals_by_model(engine)] == ["old", "qwen2:0.5b"]
    since = datetime(2025, 1, 1, tzinfo=timezone.utc)
    assert [t.model for t in totals_by_model(engine, since=since)] == ["qwen2:0.5b"]


def test_a_db_failure_does_not_raise(caplog):
    unmigrated = sa.create_engine("sqlite://")
    with caplog.at_level(logging.WARNING, logger="ledger.usage"):
        assert log_usage(unmigrated, record()) == ""
    assert "could not record usage for model 'qwen2:0.5b'" in caplog.text and "no such table" in caplog.text


def run_threads(target, n: int) -> None:
    threads = [threading.Thread(target=target, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def test_two_threads_writing_to_a_fresh_db(url, reopen):
    barrier, ids = threading.Barrier(2), [[], []]

    def writer(n: int) -> None:
        barrier.wait()
        engine = open_db(url)  # both migrate the fresh file at once
        ids[n] = [log_usage(engine, record(model=f"m{n}")) for _ in range(25)]
        engine.dispose()

    run_threads(writer, 2)
    engine = reopen()
    assert count(engine) == 50 and all(ids[0] + ids[1]) and len(set(ids[0] + ids[1])) == 50
    assert [name for name, _ in migration_rows(engine)] == APPLIED


def test_threads_sharing_one_engine(engine):
    """The gateway writes from worker threads (``asyncio.to_thread``) through one engine."""
    run_threads(lambda _: [log_usage(engine, record()) for _ in range(10)], 8)
    assert count(engine) == 80


WRITER = """
import sys
from ledger.db import open_db
from ledger.usage import UsageRecord, log_usage
engine = open_db(sys.argv[1])
ids = [log_usage(engine, UsageRecord(source="cli", route="run", model=sys.argv[2], backend="llamacpp"))
       for _ in range(25)]
sys.exit(0 if all(ids) else 1)
"""


def test_two_processes_writing_to_a_fresh_db(url, reopen):
    root = Path(__file__).resolve().parents[2]
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, url, f"p{n}"], cwd=root) for n in range(2)]
    assert [p.wait(timeout=60) for p in procs] == [0, 0]
    engine = reopen()
    assert [(t.model, t.requests) for t in totals_by_model(engine)] == [("p0", 25), ("p1", 25)]
    assert [name for name, _ in migration_rows(engine)] == APPLIED
