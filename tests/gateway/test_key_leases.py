"""Budget leases (gateway/policy/keys.py): a hold that reaches the database also takes room for the next
requests, which then take theirs in memory; the room goes back to the budget when the key is idle
and at shutdown, a lease is renewed while it is used and dropped when its hold is gone, and a budget
is never passed."""

from __future__ import annotations

import asyncio

import pytest
import sqlalchemy as sa

from gateway.policy import keys
from gateway.policy.keys import KeyBook
from ledger.db import open_db
from ledger.keys import create_key, holds_of, list_keys, settle


def reserved(db) -> tuple[float, float]:
    with db.connect() as conn:
        return tuple(conn.execute(sa.text("SELECT spent_usd, reserved_usd FROM api_keys WHERE name = 'k'")).one())


@pytest.fixture
def db(tmp_path):
    engine = open_db(f"sqlite:///{tmp_path / 'usage.db'}")
    create_key(engine, "k", budget_usd=1.0, period_s=86400)
    yield engine
    engine.dispose()


def key(db):
    return list_keys(db)[0]


def finish(db, book: KeyBook, claim, actual: float) -> None:
    settle(db, "k", claim.hold.id, claim.taken, actual, claim.hold.period_start)
    book.released(claim)


def test_one_database_hold_serves_the_next_requests_from_memory(db, monkeypatch):
    monkeypatch.setattr(keys, "LEASE_IDLE_S", 0.2)

    async def run() -> None:
        book = KeyBook(db)
        assert book.take("k", 0.05) is None  # no lease yet: the first request goes to the database
        first = await book.hold(key(db), 0.05, 0.05)
        assert reserved(db)[1] == pytest.approx(0.05 * (1 + keys.LEASE_REQUESTS))
        claims = [book.take("k", 0.05) for _ in range(keys.LEASE_REQUESTS)]
        assert all(c is not None and c.hold.id == first.hold.id for c in claims)
        assert book.take("k", 0.05) is None  # the lease is used up
        for claim in [first, *claims]:  # each request settles its own part of the lease's hold
            finish(db, book, claim, 0.01)
        assert reserved(db) == pytest.approx((0.09, 0.0)) and holds_of(db, "k") == []
        await asyncio.sleep(0.4)
        await book.aclose()
    asyncio.run(run())


def test_idle_lease_goes_back_and_the_budget_is_never_passed(db, monkeypatch):
    monkeypatch.setattr(keys, "LEASE_IDLE_S", 0.2)

    async def run() -> None:
        book = KeyBook(db)
        assert await book.hold(key(db), 0.3, 0.3)  # 0.3 + a lease that does not fit: 0.3 alone
        assert reserved(db)[1] == pytest.approx(0.3)
        answers = await asyncio.gather(*(book.hold(key(db), 0.3, 0.3) for _ in range(5)))
        assert sum(a is not None for a in answers) == 2 and reserved(db)[1] == pytest.approx(0.9)  # 1.0 fits 3
        await asyncio.sleep(0.4)  # idle: nothing was held beyond the requests
        assert reserved(db)[1] == pytest.approx(0.9)
        await book.aclose()
    asyncio.run(run())


def test_shutdown_gives_the_lease_back(db):
    async def run() -> None:
        book = KeyBook(db)
        assert await book.hold(key(db), 0.01, 0.01)
        assert reserved(db)[1] == pytest.approx(0.01 * (1 + keys.LEASE_REQUESTS))
        await book.aclose()
        assert reserved(db)[1] == pytest.approx(0.01)  # only the request in flight stays held
    asyncio.run(run())


def test_a_lease_whose_hold_expired_is_not_used(db, monkeypatch):
    """Renewal finds the lease's hold gone (the database was out longer than the hold's life and
    another replica released it): this replica stops taking from it."""
    async def run() -> None:
        book = KeyBook(db)
        first = await book.hold(key(db), 0.01, 0.01)
        with db.begin() as conn:
            conn.execute(sa.text("DELETE FROM key_holds"))
        await book.renew_now()
        assert book.take("k", 0.01) is None
        finish(db, book, first, 0.01)  # its request still pays what it used
        assert reserved(db)[0] == pytest.approx(0.01)
        await book.aclose()
    asyncio.run(run())
