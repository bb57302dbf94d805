"""API keys: shown once, stored hashed; budgets that concurrent requests cannot overrun, held by rows
that expire (an unsettled hold cannot stay forever) and that a period's restart clears."""

from __future__ import annotations

import threading

import pytest
import sqlalchemy as sa

from ledger.db import open_db
from ledger.keys import KEYS, create_key, find_key, hash_key, holds_of, list_keys, renew, reserve, revoke_key, settle


@pytest.fixture
def db(tmp_path):
    engine = open_db(f"sqlite:///{tmp_path / 'usage.db'}")
    yield engine
    engine.dispose()


def test_a_key_is_shown_once_and_only_its_hash_is_stored(db):
    key = create_key(db, "team-a", budget_usd=5.0, period_s=86400, rpm=60, routes=("chat",))
    assert key.startswith("sk-infer-") and len(key) > 30
    with db.connect() as conn:
        stored = conn.execute(sa.select(KEYS)).one()
    assert key not in str(tuple(stored)) and stored.key_hash == hash_key(key)
    found = find_key(db, key)
    assert (found.name, found.budget_usd, found.rpm, found.routes, found.role) == ("team-a", 5.0, 60, ("chat",), "caller")
    assert not found.operator and find_key(db, create_key(db, "admin", role="operator")).operator
    assert found.allows("chat") and not found.allows("other")
    with pytest.raises(ValueError, match="exists"):
        create_key(db, "team-a")
    assert revoke_key(db, "team-a") and not revoke_key(db, "team-a")
    assert find_key(db, key).revoked and [k.name for k in list_keys(db)] == ["admin", "team-a"]
    with pytest.raises(ValueError, match="invalid role"):
        create_key(db, "x", role="root")


def test_the_database_file_holds_no_key(tmp_path):
    db = open_db(f"sqlite:///{tmp_path / 'usage.db'}")
    key = create_key(db, "k")
    db.dispose()
    assert key.encode() not in b"".join(p.read_bytes() for p in tmp_path.iterdir() if p.is_file())


def reserve_concurrently(db, name: str, amount: float, n: int) -> list:
    """``n`` threads each holding ``amount`` of ``name``'s budget at once: their holds (None: refused)."""
    results: list = []
    lock = threading.Lock()

    def one() -> None:
        ok = reserve(db, name, amount)
        with lock:
            results.append(ok)
    threads = [threading.Thread(target=one) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def test_100_concurrent_reservations_against_a_budget_that_fits_10(db):
    create_key(db, "k", budget_usd=1.0)
    holds = [h for h in reserve_concurrently(db, "k", 0.1, 100) if h is not None]
    assert len(holds) == 10
    for hold in holds:
        settle(db, "k", hold.id, 0.1, 0.07, hold.period_start)  # the actual cost was lower: the rest is released
    key = list_keys(db)[0]
    assert key.spent_usd == pytest.approx(0.7) and key.reserved_usd == pytest.approx(0.0, abs=1e-12)
    assert holds_of(db, "k") == []
    assert reserve(db, "k", 0.3) and not reserve(db, "k", 0.01)  # 0.7 + 0.3 = the budget


def test_a_hold_takes_what_is_left_down_to_its_minimum(db):
    create_key(db, "k", budget_usd=1.0)
    assert reserve(db, "k", 0.8).amount == pytest.approx(0.8)
    assert reserve(db, "k", 0.5, 0.1).amount == pytest.approx(0.2)  # what is left
    assert reserve(db, "k", 0.5, 0.1) is None


def test_a_period_restarts_the_spend_and_clears_its_holds(db):
    create_key(db, "k", budget_usd=1.0, period_s=60)
    hold = reserve(db, "k", 1.0, now=1e10 - 30)  # the first period has long run out: it restarts
    settle(db, "k", hold.id, 1.0, 1.0, hold.period_start)
    assert not reserve(db, "k", 0.5, now=1e10)
    leaked = reserve(db, "k", 0.0, now=1e10)  # (a hold whose request never settles)
    assert reserve(db, "k", 0.5, now=1e10 + 60)  # the next period: spent and holds start over
    assert [h[0] for h in holds_of(db, "k")] != [leaked.id] and list_keys(db)[0].reserved_usd == pytest.approx(0.5)
    settle(db, "k", leaked.id, 0.0, 0.3, leaked.period_start)  # its period is over: nothing changes
    assert list_keys(db)[0].spent_usd == 0.0


def test_a_hold_nobody_settles_expires(db):
    """The hold of a replica that died, or that lost the database while releasing it, does not stay."""
    create_key(db, "k", budget_usd=1.0)
    lost = reserve(db, "k", 0.9, ttl_s=60, now=1000.0)
    assert reserve(db, "k", 0.5, now=1030.0) is None  # still held
    assert renew(db, [lost.id], 60, now=1030.0) == set()  # its replica renews it while the request runs
    assert reserve(db, "k", 0.5, now=1080.0) is None
    fresh = reserve(db, "k", 0.5, now=1091.0)  # not renewed for 60 s: released
    assert fresh is not None and list_keys(db)[0].reserved_usd == pytest.approx(0.5)
    assert renew(db, [lost.id, fresh.id], 60, now=1091.0) == {lost.id}
    settle(db, "k", lost.id, 0.9, 0.2, lost.period_start)  # its request did end: the cost counts, no hold
    key = list_keys(db)[0]
    assert (key.spent_usd, key.reserved_usd) == (pytest.approx(0.2), pytest.approx(0.5))
