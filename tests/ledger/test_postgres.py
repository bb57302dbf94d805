"""The same ledger on PostgreSQL: migrations, the batching writer, and budgets that concurrent
reservations cannot overrun (the test CI runs against a real server, ``tests/servers.py``)."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from ledger.db import open_db
from ledger.keys import create_key, list_keys, settle
from ledger.migrations import MIGRATIONS
from ledger.tables import UsageRecord
from ledger.writer import LedgerWriter
from tests.ledger.test_keys import reserve_concurrently


@pytest.fixture
def pg(postgres):
    db = open_db(postgres.url)
    with db.begin() as conn:
        conn.execute(sa.text("DELETE FROM api_keys"))
        conn.execute(sa.text("DELETE FROM key_holds"))
        conn.execute(sa.text("DELETE FROM requests"))
    yield db
    db.dispose()


def test_migrations_and_the_writer_on_postgres(pg):
    with pg.connect() as conn:
        applied = {r[0] for r in conn.execute(sa.text("SELECT name FROM _infer_migrations"))}
    assert applied == {m.__name__ for m in MIGRATIONS}
    writer = LedgerWriter(pg)
    for i in range(200):
        writer.submit(UsageRecord(source="gateway", route="/v1/chat/completions", model=f"m{i % 3}", backend="vllm",
                                  input_tokens=i, output_tokens=1, total_cost_usd=0.001))
    writer.close()
    with pg.connect() as conn:
        assert conn.scalar(sa.text("SELECT count(*), sum(input_tokens) FROM requests")) == 200


def test_100_concurrent_reservations_on_postgres(pg):
    create_key(pg, "k", budget_usd=1.0)
    holds = [h for h in reserve_concurrently(pg, "k", 0.1, 100) if h is not None]
    assert len(holds) == 10
    for hold in holds:
        settle(pg, "k", hold.id, 0.1, 0.05, hold.period_start)
    key = list_keys(pg)[0]
    assert key.spent_usd == pytest.approx(0.5) and key.reserved_usd == pytest.approx(0.0, abs=1e-12)
