"""Ledger rows in and out: stamp and insert rows (SQLAlchemy Core), read recent rows and totals.

The gateway and ``infer run`` hand rows to ``ledger.writer.LedgerWriter``, which batches them off
the event loop; ``log_usage`` writes one row synchronously (tests, one-off tools).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timezone

import sqlalchemy as sa
from sqlalchemy import Engine
from sqlalchemy.exc import SQLAlchemyError
from sqlmodel import Session, col, select

from ledger.tables import RequestLog, UsageRecord, utc_iso
from ledger.ulid import new_ulid

logger = logging.getLogger(__name__)
_REQUESTS = RequestLog.__table__  # type: ignore[attr-defined]

@dataclass(frozen=True)
class ModelTotals:
    model: str
    requests: int
    errors: int
    input_tokens: int
    output_tokens: int
    cached_input_tokens: int  # sum of the values backends reported; 0 when none did
    mean_ttft_ms: float | None
    mean_tpot_ms: float | None


def stamp(record: UsageRecord, now: datetime | None = None) -> dict:
    """The row for ``record``: its columns plus a fresh ULID ``id`` and ``datetime_utc``."""
    now = now or datetime.now(timezone.utc)
    # A plain UsageRecord's fields are all scalars, in column order: a copy is its model_dump, faster.
    row = dict(record.__dict__) if type(record) is UsageRecord else record.model_dump()
    row["id"] = new_ulid(int(now.timestamp() * 1000))
    row["datetime_utc"] = utc_iso(now)
    return row


def insert_rows(db: Engine, rows: list[dict]) -> None:
    """Insert ``rows`` (from :func:`stamp`) in one transaction; raises the database's error."""
    with db.begin() as conn:
        conn.execute(_REQUESTS.insert(), rows)


def log_usage(engine: Engine, record: UsageRecord) -> str:
    """Insert one row and return its id, or ``""`` after a logged warning if the database fails.

    A ledger failure must never break the request it describes, so this does not raise for DB errors.
    """
    row = stamp(record)
    try:
        insert_rows(engine, [row])
    except (SQLAlchemyError, OSError) as exc:
        logger.warning("could not record usage for model %r: %s", record.model, exc)
        return ""
    return row["id"]


def recent(engine: Engine, limit: int = 20, model: str | None = None) -> list[RequestLog]:
    """The latest ``limit`` rows, newest first, optionally for one model."""
    query = select(RequestLog).order_by(col(RequestLog.datetime_utc).desc(), col(RequestLog.id).desc())
    if model is not None:
        query = query.where(RequestLog.model == model)
    with Session(engine) as session:
        return list(session.exec(query.limit(limit)))


def totals_by_model(engine: Engine, since: datetime | None = None) -> list[ModelTotals]:
    """Request counts, token sums and mean latencies per model (rows from ``since`` on), by model name."""
    t = RequestLog.__table__.c  # type: ignore[attr-defined]
    query = (
        sa.select(
            t.model,
            sa.func.count(),
            sa.func.sum(sa.case((t.status == "error", 1), else_=0)),
            *(sa.func.coalesce(sa.func.sum(c), 0) for c in (t.input_tokens, t.output_tokens, t.cached_input_tokens)),
            sa.func.avg(t.ttft_ms),
            sa.func.avg(t.tpot_ms),
        )
        .group_by(t.model)
        .order_by(t.model)
    )
    if since is not None:
        query = query.where(t.datetime_utc >= utc_iso(since))
    with engine.connect() as conn:
        return [ModelTotals(*row) for row in conn.execute(query)]
