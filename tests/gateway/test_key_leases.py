"""Budget leases (gateway/keys.py): a reservation that reaches the database also takes room for the
next requests, which then reserve in memory; the room goes back to the budget when the key is idle
and at shutdown, and a budget is never passed."""

from __future__ import annotations

import asyncio

import pytest
import sqlalchemy as sa

from gateway import keys
from gateway.keys import KeyBook
from ledger.db import open_db
from ledger.keys import create_key, settle


def reserved(db) -> tuple[float, float]:
    with db.connect() as conn:
        return tuple(conn.execute(sa.text("SELECT spent_usd, reserved_usd FROM api_keys WHERE name = 'k'")).one())


@pytest.fixture
def db(tmp_path):
    engine = open_db(f"sqlite:///{tmp_path / 'usage.db'}")
    create_key(engine, "k", budget_usd=1.0, period_s=86400)
    yield engine
    engine.dispose()


def test_one_database_reservation_serves_the_next_requests_from_memory(db, monkeypatch):
    monkeypatch.setattr(keys, "LEASE_IDLE_S", 0.2)

    async def run() -> None:
        book = KeyBook(db)
        assert not book.take("k", 0.05)  # no lease yet: the first request goes to the database
        assert await book.reserve("k", 0.05)
        assert reserved(db)[1] == pytest.approx(0.05 * (1 + keys.LEASE_REQUESTS))
        assert all(book.take("k", 0.05) for _ in range(keys.LEASE_REQUESTS))
        assert not book.take("k", 0.05)  # the lease is used up
        for _ in range(1 + keys.LEASE_REQUESTS):  # each request settles its own reservation
            settle(db, "k", 0.05, 0.01)
        assert reserved(db) == pytest.approx((0.09, 0.0))
        await asyncio.sleep(0.4)
        await book.aclose()
    asyncio.run(run())


def test_idle_lease_goes_back_and_the_budget_is_never_passed(db, monkeypatch):
    monkeypatch.setattr(keys, "LEASE_IDLE_S", 0.2)

    async def run() -> list[bool]:
        book = KeyBook(db)
        assert await book.reserve("k", 0.3)  # 0.3 + a lease that does not fit: 0.3 alone
        assert reserved(db)[1] == pytest.approx(0.3)
        answers = await asyncio.gather(*(book.reserve("k", 0.3) for _ in range(5)))
        assert sum(answers) == 2 and reserved(db)[1] == pytest.approx(0.9)  # 1.0 fits three
        await asyncio.sleep(0.4)  # idle: nothing was held beyond the requests
        assert reserved(db)[1] == pytest.approx(0.9)
        return answers
    asyncio.run(run())


def test_shutdown_gives_the_lease_back(db):
    async def run() -> None:
        book = KeyBook(db)
        assert await book.reserve("k", 0.01)
        assert reserved(db)[1] == pytest.approx(0.01 * (1 + keys.LEASE_REQUESTS))
        await book.aclose()
        assert reserved(db)[1] == pytest.approx(0.01)  # only the request in flight stays reserved
    asyncio.run(run())
