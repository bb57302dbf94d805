"""The ledger writer: batches rows off the caller's thread, waits out a locked database, flushes on close."""

from __future__ import annotations

import logging
import sqlite3
import threading
import time

import pytest
import sqlalchemy as sa

from ledger.db import open_db
from ledger.tables import UsageRecord
from ledger.writer import LedgerWriter, WriterSettings


@pytest.fixture
def db(tmp_path):
    engine = open_db(f"sqlite:///{tmp_path / 'usage.db'}")
    yield engine
    engine.dispose()


def record(i: int = 0) -> UsageRecord:
    return UsageRecord(source="gateway", route="/v1/chat/completions", model=f"m{i}", backend="openai",
                       output_tokens=i)


def count(db) -> int:
    with db.connect() as conn:
        return conn.scalar(sa.text("SELECT count(*) FROM requests"))


def test_rows_from_many_threads_are_all_written_in_few_transactions(db):
    transactions = []
    sa.event.listen(db, "commit", lambda conn: transactions.append(1))
    writer = LedgerWriter(db, WriterSettings(flush_s=0.05))
    threads = [threading.Thread(target=lambda: [writer.submit(record(i)) for i in range(250)]) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert writer.flush(timeout=10)
    assert count(db) == 1000 and writer.written == 1000
    assert len(transactions) <= 20  # batched: 256 rows a transaction at most, one batch per 50 ms
    writer.close()


@pytest.mark.slow  # seconds of a held lock: make test-slow (CI runs it)
def test_a_locked_database_delays_rows_and_drops_none(db, tmp_path, caplog):
    locker = sqlite3.connect(tmp_path / "usage.db", timeout=0)
    locker.execute("BEGIN EXCLUSIVE")  # another process holding the file, as in the hardening report
    writer = LedgerWriter(db, WriterSettings(flush_s=0.01, retry_max_s=0.2))
    with caplog.at_level(logging.WARNING, logger="ledger.writer"):
        for i in range(20):
            writer.submit(record(i))
        time.sleep(8.0)  # longer than SQLite's busy timeout (5 s): the writer must retry, not give up
        assert writer.written == 0 and writer.failed_attempts >= 1
        locker.rollback()
        locker.close()
        assert writer.flush(timeout=15)
    assert count(db) == 20 and writer.dropped == 0
    outage = [r.getMessage() for r in caplog.records if r.name == "ledger.writer"]
    assert len(outage) == 2, outage  # once when it starts, once when it ends: not once per retry
    assert "unreachable or locked" in outage[0] and "is back after" in outage[1]
    writer.close()


def test_close_writes_everything_queued(db):
    writer = LedgerWriter(db, WriterSettings(flush_s=5.0))  # a long batch window: close must not wait it out
    for i in range(50):
        writer.submit(record(i))
    t0 = time.monotonic()
    writer.close()
    assert time.monotonic() - t0 < 2.0
    assert count(db) == 50


def test_a_full_queue_counts_and_logs_every_dropped_row(db, caplog):
    writer = LedgerWriter(db, WriterSettings(flush_s=1.0, max_pending=10))
    with caplog.at_level(logging.ERROR, logger="ledger.writer"):
        for i in range(13):
            writer.submit(record(i))
    assert writer.dropped == 3
    assert "dropped a row" in caplog.text and "3 dropped so far" in caplog.text
    writer.close()
    assert count(db) == 10
