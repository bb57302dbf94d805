"""API keys: shown once, stored hashed; budgets that concurrent requests cannot overrun."""

from __future__ import annotations

import threading

import pytest
import sqlalchemy as sa

from ledger.db import open_db
from ledger.keys import KEYS, create_key, find_key, hash_key, list_keys, reserve, revoke_key, settle


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
    assert (found.name, found.budget_usd, found.rpm, found.routes) == ("team-a", 5.0, 60, ("chat",))
    assert found.allows("chat") and not found.allows("other")
    with pytest.raises(ValueError, match="exists"):
        create_key(db, "team-a")
    assert revoke_key(db, "team-a") and not revoke_key(db, "team-a")
    assert find_key(db, key).revoked and [k.name for k in list_keys(db)] == ["team-a"]


def reserve_concurrently(db, name: str, amount: float, n: int) -> list[bool]:
    """``n`` threads each reserving ``amount`` of ``name``'s budget at once."""
    results: list[bool] = []
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
    assert reserve_concurrently(db, "k", 0.1, 100).count(True) == 10
    for _ in range(10):
        settle(db, "k", 0.1, 0.07)  # the actual cost was lower: the rest is released
    key = list_keys(db)[0]
    assert key.spent_usd == pytest.approx(0.7) and key.reserved_usd == pytest.approx(0.0, abs=1e-12)
    assert reserve(db, "k", 0.3) and not reserve(db, "k", 0.01)  # 0.7 + 0.3 = the budget


def test_a_period_restarts_the_spend(db):
    create_key(db, "k", budget_usd=1.0, period_s=60)
    assert reserve(db, "k", 1.0, now=1e10 - 30)  # the first period has long run out: it restarts
    settle(db, "k", 1.0, 1.0)
    assert not reserve(db, "k", 0.5, now=1e10)
    assert reserve(db, "k", 0.5, now=1e10 + 60)  # the next period
