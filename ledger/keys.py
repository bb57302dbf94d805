"""API keys and their budgets, in the ledger database (so replicas sharing it share budgets).

A key is shown once when created (``sk-infer-…``); only its sha256 is stored. A budget is spent in
periods (``period_s``; the period restarts when it has run out). Budgets cannot be overrun by
concurrent requests: admission **reserves** a request's maximum cost in one conditional UPDATE
that succeeds only while ``spent + reserved + this <= budget``; completion **settles** it to the
actual cost and releases the rest. Both statements are single and atomic on SQLite and Postgres.
"""

from __future__ import annotations

import hashlib
import secrets
import time
from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy import Engine

KEYS = sa.Table(
    "api_keys", sa.MetaData(),
    sa.Column("name", sa.String(255), primary_key=True),
    sa.Column("key_hash", sa.String(64), nullable=False, unique=True),
    sa.Column("created_at", sa.Float, nullable=False),
    sa.Column("revoked_at", sa.Float),
    sa.Column("budget_usd", sa.Float),
    sa.Column("period_s", sa.Float),
    sa.Column("period_start", sa.Float, nullable=False),
    sa.Column("spent_usd", sa.Float, nullable=False, default=0.0),
    sa.Column("reserved_usd", sa.Float, nullable=False, default=0.0),
    sa.Column("rpm", sa.Integer),
    sa.Column("tpm", sa.Integer),
    sa.Column("routes", sa.Text),
)


@dataclass(frozen=True)
class ApiKey:
    name: str
    budget_usd: float | None
    period_s: float | None
    spent_usd: float
    reserved_usd: float
    rpm: int | None
    tpm: int | None
    routes: tuple[str, ...]
    revoked: bool

    def allows(self, model: str) -> bool:
        return not self.routes or model in self.routes


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def create_key(db: Engine, name: str, *, budget_usd: float | None = None, period_s: float | None = None,
               rpm: int | None = None, tpm: int | None = None, routes: tuple[str, ...] = ()) -> str:
    """A new key named ``name``; the key itself is returned once and never stored."""
    key = "sk-infer-" + secrets.token_urlsafe(24)
    with db.begin() as conn:
        exists = conn.execute(sa.select(KEYS.c.name).where(KEYS.c.name == name)).first()
        if exists is not None:
            raise ValueError(f"a key named '{name}' exists; revoke it or pick another name")
        conn.execute(KEYS.insert().values(
            name=name, key_hash=hash_key(key), created_at=time.time(), budget_usd=budget_usd, period_s=period_s,
            period_start=time.time(), spent_usd=0.0, reserved_usd=0.0, rpm=rpm, tpm=tpm,
            routes=",".join(routes) or None))
    return key


def revoke_key(db: Engine, name: str) -> bool:
    with db.begin() as conn:
        done = conn.execute(KEYS.update().where(KEYS.c.name == name, KEYS.c.revoked_at.is_(None))
                            .values(revoked_at=time.time()))
    return done.rowcount == 1


def list_keys(db: Engine) -> list[ApiKey]:
    with db.connect() as conn:
        return [_key(row) for row in conn.execute(sa.select(KEYS).order_by(KEYS.c.name))]


def find_key(db: Engine, key: str) -> ApiKey | None:
    with db.connect() as conn:
        row = conn.execute(sa.select(KEYS).where(KEYS.c.key_hash == hash_key(key))).first()
    return None if row is None else _key(row)


# The two statements on every keyed request, as plain SQL that SQLite and Postgres both run: building
# them with SQLAlchemy's expression language cost ~6x more CPU per call (0.45 vs 0.075 ms on SQLite).
_EXPIRED = "(period_s IS NOT NULL AND period_start + period_s <= :now)"
_SPENT = f"(CASE WHEN {_EXPIRED} THEN 0.0 ELSE spent_usd END)"
_RESERVE = sa.text(
    f"UPDATE api_keys SET spent_usd = {_SPENT}, "
    f"period_start = CASE WHEN {_EXPIRED} THEN :now ELSE period_start END, "
    "reserved_usd = reserved_usd + :amount "
    f"WHERE name = :name AND (budget_usd IS NULL OR {_SPENT} + reserved_usd + :amount <= budget_usd + 1e-9)")
_SETTLE = sa.text(
    "UPDATE api_keys SET reserved_usd = CASE WHEN reserved_usd - :reserved > 0.0 THEN reserved_usd - :reserved "
    "ELSE 0.0 END, spent_usd = spent_usd + :actual WHERE name = :name")


def reserve(db: Engine, name: str, amount: float, now: float | None = None) -> bool:
    """Reserve ``amount`` dollars of ``name``'s budget; False when it would pass the budget. A key
    without a budget always succeeds. One statement: concurrent reservations cannot overrun it."""
    now = time.time() if now is None else now
    with db.begin() as conn:
        done = conn.execute(_RESERVE, {"now": now, "amount": amount, "name": name})
    return done.rowcount == 1


def settle(db: Engine, name: str, reserved: float, actual: float) -> None:
    """Turn a reservation into the actual spend (never negative), releasing the rest."""
    with db.begin() as conn:
        conn.execute(_SETTLE, {"reserved": reserved, "actual": actual, "name": name})


def _key(row) -> ApiKey:
    return ApiKey(name=row.name, budget_usd=row.budget_usd, period_s=row.period_s, spent_usd=row.spent_usd,
                  reserved_usd=row.reserved_usd, rpm=row.rpm, tpm=row.tpm,
                  routes=tuple(r for r in (row.routes or "").split(",") if r), revoked=row.revoked_at is not None)
