"""API keys, their budgets and the holds on them, in the ledger database (replicas sharing it share budgets).

A key is shown once when created (``sk-infer-…``); only its sha256 is stored. Its ``role`` is
``caller`` or ``operator`` (model management, every key's spend). A budget is spent in periods
(``period_s``; the period restarts when it has run out).

Budgets cannot be overrun, by concurrent requests or by replicas: admission **holds** a request's
maximum cost before the request runs (:func:`reserve`), and completion **settles** the hold to the
actual cost (:func:`settle`). A hold is a row of ``key_holds`` with an expiry: the replica that
made it renews it while its request runs (:func:`renew`); a hold whose replica died, or could not
reach the database to settle it, expires, and the next reservation on that key releases it. A
period's restart releases every hold of the period before (a settlement of such a hold then
changes nothing: that period is over). ``reserved_usd`` is the sum of the key's live holds.

:func:`reserve` and :func:`settle` each run in one transaction that first locks the key's row
(``SELECT … FOR UPDATE`` on PostgreSQL, ``BEGIN IMMEDIATE`` on SQLite), so their reads and writes
of it are never interleaved with another's.
"""

from __future__ import annotations

import hashlib
import secrets
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy import Connection, Engine

ROLES = ("caller", "operator")

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
    sa.Column("role", sa.String(16)),
    sa.Column("max_output_tokens", sa.Integer),
)

HOLDS = sa.Table(
    "key_holds", sa.MetaData(),
    sa.Column("id", sa.String(32), primary_key=True),
    sa.Column("key_name", sa.String(255), nullable=False),
    sa.Column("amount_usd", sa.Float, nullable=False),
    sa.Column("period_start", sa.Float, nullable=False),
    sa.Column("expires_at", sa.Float, nullable=False),
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
    role: str = "caller"
    max_output_tokens: int | None = None

    @property
    def operator(self) -> bool:
        return self.role == "operator"

    def allows(self, model: str) -> bool:
        return not self.routes or model in self.routes


@dataclass(frozen=True)
class Hold:
    """Room held on a key's budget: ``amount`` dollars in hold row ``id``, made in the period that
    started at ``period_start`` (which ends at ``period_end``, or never)."""

    id: str
    key_name: str
    amount: float
    period_start: float
    period_end: float | None


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def create_key(db: Engine, name: str, *, budget_usd: float | None = None, period_s: float | None = None,
               rpm: int | None = None, tpm: int | None = None, routes: tuple[str, ...] = (),
               role: str = "caller", max_output_tokens: int | None = None) -> str:
    """A new key named ``name``; the key itself is returned once and never stored."""
    if role not in ROLES:
        raise ValueError(f"invalid role {role!r}: use one of {', '.join(ROLES)}")
    key = "sk-infer-" + secrets.token_urlsafe(24)
    with db.begin() as conn:
        exists = conn.execute(sa.select(KEYS.c.name).where(KEYS.c.name == name)).first()
        if exists is not None:
            raise ValueError(f"a key named '{name}' exists; revoke it or pick another name")
        conn.execute(KEYS.insert().values(
            name=name, key_hash=hash_key(key), created_at=time.time(), budget_usd=budget_usd, period_s=period_s,
            period_start=time.time(), spent_usd=0.0, reserved_usd=0.0, rpm=rpm, tpm=tpm,
            routes=",".join(routes) or None, role=role, max_output_tokens=max_output_tokens))
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
    """The key whose sha256 is ``key``'s: the database holds hashes only, so a key is found by its hash."""
    with db.connect() as conn:
        row = conn.execute(sa.select(KEYS).where(KEYS.c.key_hash == hash_key(key))).first()
    return None if row is None else _key(row)


def new_hold_id() -> str:
    return secrets.token_hex(16)


def reserve(db: Engine, name: str, wanted: float, minimum: float | None = None, *, hold_id: str | None = None,
            ttl_s: float = 60.0, now: float | None = None) -> Hold | None:
    """Hold up to ``wanted`` dollars of ``name``'s budget: all of it when the budget has it, else what
    is left when that is at least ``minimum`` (default: ``wanted``), else nothing (None). Expired
    holds are released first, and a period that has run out restarts (spent 0, no holds)."""
    now = time.time() if now is None else now
    minimum = wanted if minimum is None else minimum
    with _locked(db) as conn:
        row = _lock_key(conn, name)
        if row is None:
            return None
        spent, reserved, start = _current(conn, name, row, now)
        left = float("inf") if row.budget_usd is None else row.budget_usd - spent - reserved
        if left + 1e-12 < minimum:
            _store(conn, name, spent, reserved, start)
            return None
        amount = min(wanted, max(left, minimum))
        hold = Hold(hold_id or new_hold_id(), name, amount, start, start + row.period_s if row.period_s else None)
        conn.execute(HOLDS.insert().values(id=hold.id, key_name=name, amount_usd=amount, period_start=start,
                                           expires_at=now + ttl_s))
        _store(conn, name, spent, reserved + amount, start)
    return hold


def settle(db: Engine, name: str, hold_id: str | None, taken: float, actual: float, period_start: float) -> None:
    """Turn ``taken`` dollars of hold ``hold_id`` into the ``actual`` cost: the hold shrinks by ``taken``
    (and goes when empty), the key's spend grows by ``actual``, in the period the hold was made in
    (a period that has since restarted is left alone). ``hold_id`` None: spend without a hold."""
    with _locked(db) as conn:
        row = _lock_key(conn, name)
        if row is None or row.period_start != period_start:
            return
        released = _shrink(conn, hold_id, taken) if hold_id else 0.0
        conn.execute(KEYS.update().where(KEYS.c.name == name).values(
            reserved_usd=max(0.0, row.reserved_usd - released), spent_usd=row.spent_usd + actual))


def renew(db: Engine, hold_ids: list[str], ttl_s: float, now: float | None = None) -> set[str]:
    """Extend the holds ``hold_ids`` to ``now + ttl_s``; the ids that no longer exist (expired and
    released, or of a period that restarted)."""
    if not hold_ids:
        return set()
    now = time.time() if now is None else now
    with db.begin() as conn:
        conn.execute(HOLDS.update().where(HOLDS.c.id.in_(hold_ids)).values(expires_at=now + ttl_s))
        alive = set(conn.scalars(sa.select(HOLDS.c.id).where(HOLDS.c.id.in_(hold_ids))))
    return set(hold_ids) - alive


def holds_of(db: Engine, name: str) -> list[tuple[str, float, float]]:
    """``(id, amount, expires_at)`` of each hold on ``name``."""
    with db.connect() as conn:
        return [tuple(r) for r in conn.execute(sa.select(HOLDS.c.id, HOLDS.c.amount_usd, HOLDS.c.expires_at)
                                               .where(HOLDS.c.key_name == name))]


@contextmanager
def _locked(db: Engine) -> Iterator[Connection]:
    """A transaction that will lock a key's row: BEGIN IMMEDIATE on SQLite (the write lock at once, so
    a read-then-write never meets a newer snapshot); PostgreSQL locks the row with FOR UPDATE."""
    if db.dialect.name != "sqlite":
        with db.begin() as conn:
            yield conn
        return
    with db.connect() as conn:
        conn.execution_options(infer_begin_immediate=True)
        with conn.begin():
            yield conn


def _lock_key(conn: Connection, name: str):
    query = sa.select(KEYS.c.budget_usd, KEYS.c.period_s, KEYS.c.period_start, KEYS.c.spent_usd,
                      KEYS.c.reserved_usd).where(KEYS.c.name == name)
    if conn.dialect.name != "sqlite":
        query = query.with_for_update()
    return conn.execute(query).first()


def _current(conn: Connection, name: str, row, now: float) -> tuple[float, float, float]:
    """(spent, reserved, period start) of a locked key now: a period that ran out restarts with no
    spend and no holds; holds that expired are released."""
    if row.period_s is not None and row.period_start + row.period_s <= now:
        conn.execute(HOLDS.delete().where(HOLDS.c.key_name == name))
        return 0.0, 0.0, now
    expired = conn.execute(sa.select(sa.func.coalesce(sa.func.sum(HOLDS.c.amount_usd), 0.0))
                           .where(HOLDS.c.key_name == name, HOLDS.c.expires_at <= now)).scalar_one()
    if expired:
        conn.execute(HOLDS.delete().where(HOLDS.c.key_name == name, HOLDS.c.expires_at <= now))
    return row.spent_usd, max(0.0, row.reserved_usd - expired), row.period_start


def _store(conn: Connection, name: str, spent: float, reserved: float, start: float) -> None:
    conn.execute(KEYS.update().where(KEYS.c.name == name).values(spent_usd=spent, reserved_usd=reserved,
                                                                 period_start=start))


def _shrink(conn: Connection, hold_id: str, taken: float) -> float:
    """Take ``taken`` out of hold ``hold_id`` (deleting it when empty): how much it still held of that."""
    amount = conn.execute(sa.select(HOLDS.c.amount_usd).where(HOLDS.c.id == hold_id)).scalar()
    if amount is None:
        return 0.0
    if amount - taken <= 1e-12:
        conn.execute(HOLDS.delete().where(HOLDS.c.id == hold_id))
        return amount
    conn.execute(HOLDS.update().where(HOLDS.c.id == hold_id).values(amount_usd=amount - taken))
    return taken


def _key(row) -> ApiKey:
    return ApiKey(name=row.name, budget_usd=row.budget_usd, period_s=row.period_s, spent_usd=row.spent_usd,
                  reserved_usd=row.reserved_usd, rpm=row.rpm, tpm=row.tpm,
                  routes=tuple(r for r in (row.routes or "").split(",") if r), revoked=row.revoked_at is not None,
                  role=row.role or "caller", max_output_tokens=row.max_output_tokens)
