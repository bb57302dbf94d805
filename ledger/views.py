"""Read-only views of the ledger for the dashboard (``GET /infer/requests``, ``/infer/series``,
``/infer/keys``): recent rows, filtered, and the rows of a period with just the columns a time series
needs. Synchronous (SQLAlchemy Core): the gateway calls these in a worker thread.

Times are epoch seconds in and out (``at``); the table stores ISO-8601 UTC strings, whose order is
time order, so a period is a string range on the indexed ``datetime_utc``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone

import sqlalchemy as sa
from sqlalchemy import Engine

from ledger.keys import list_keys
from ledger.tables import RequestLog, utc_iso

_T = RequestLog.__table__  # type: ignore[attr-defined]
MAX_SERIES_ROWS = 200_000  # a period's rows read for a time series, newest kept

REQUEST_COLUMNS = ("id", "datetime_utc", "route_name", "route", "model", "backend", "status", "input_tokens",
                   "cached_input_tokens", "expected_cached_tokens", "output_tokens", "reasoning_tokens", "finish_reason",
                   "queue_ms", "ttft_ms", "tpot_ms", "total_ms",
                   "slo_met", "slo_missed", "attempts", "total_cost_usd", "key_name", "error")


@dataclass(frozen=True)
class RowFilter:
    """Which rows: from ``since`` (epoch s) on; each other field, when set, must match exactly.
    ``route`` matches the SLO route's name, or the API path for rows without one."""

    since: float
    route: str | None = None
    backend: str | None = None
    status: str | None = None
    key_name: str | None = None

    def where(self) -> list:
        clauses = [_T.c.datetime_utc >= iso(self.since)]
        if self.route is not None:
            clauses.append(sa.func.coalesce(_T.c.route_name, _T.c.route) == self.route)
        for column, value in ((_T.c.backend, self.backend), (_T.c.status, self.status),
                              (_T.c.key_name, self.key_name)):
            if value is not None:
                clauses.append(column == value)
        return clauses


def iso(epoch: float) -> str:
    return utc_iso(datetime.fromtimestamp(epoch, timezone.utc))


def epoch(iso_time: str) -> float:
    """Seconds since the epoch of a ``datetime_utc`` value (``fromisoformat``: 30x ``strptime``)."""
    return datetime.fromisoformat(iso_time).timestamp()


def recent_requests(db: Engine, rows: RowFilter, limit: int = 100) -> list[dict]:
    """The newest ``limit`` rows matching ``rows``, newest first, each a dict of ``REQUEST_COLUMNS``
    plus ``at`` (epoch seconds)."""
    query = (sa.select(*(_T.c[name] for name in REQUEST_COLUMNS)).where(*rows.where())
             .order_by(_T.c.datetime_utc.desc(), _T.c.id.desc()).limit(limit))
    with db.connect() as conn:
        found = [dict(row._mapping) for row in conn.execute(query)]
    for row in found:
        row["at"] = epoch(row["datetime_utc"])
    return found


@dataclass(frozen=True)
class SeriesRow:
    at: float
    route_name: str | None
    status: str
    slo_met: bool | None
    ttft_ms: float | None
    tpot_ms: float | None
    total_ms: float | None
    input_tokens: int
    output_tokens: int
    cost_usd: float | None
    cached_input_tokens: int | None = None


def series_rows(db: Engine, rows: RowFilter) -> list[SeriesRow]:
    """The rows matching ``rows`` (the newest ``MAX_SERIES_ROWS``), oldest first."""
    c = _T.c
    query = (sa.select(c.datetime_utc, c.route_name, c.status, c.slo_met, c.ttft_ms, c.tpot_ms, c.total_ms, c.input_tokens,
                       c.output_tokens, c.total_cost_usd, c.cached_input_tokens)
             .where(*rows.where()).order_by(c.datetime_utc.desc()).limit(MAX_SERIES_ROWS))
    with db.connect() as conn:
        found = [SeriesRow(epoch(r[0]), *r[1:]) for r in conn.execute(query)]
    found.reverse()
    return found


def key_budgets(db: Engine, since: float, key_name: str | None = None) -> list[dict]:
    """Each key (or only ``key_name``) with its budget, what its current period has spent and
    reserved, the share of the budget used, and its requests and spend since ``since`` in the ledger."""
    query = (sa.select(_T.c.key_name, sa.func.count(), sa.func.coalesce(sa.func.sum(_T.c.total_cost_usd), 0.0))
             .where(_T.c.datetime_utc >= iso(since), _T.c.key_name.is_not(None)).group_by(_T.c.key_name))
    with db.connect() as conn:
        usage = {name: (count, spend) for name, count, spend in conn.execute(query)}
    out = []
    for key in list_keys(db):
        if key_name is not None and key.name != key_name:
            continue
        requests, spend = usage.get(key.name, (0, 0.0))
        used = (key.spent_usd + key.reserved_usd) / key.budget_usd if key.budget_usd else None
        out.append({"name": key.name, "budget_usd": key.budget_usd, "period_s": key.period_s,
                    "spent_usd": key.spent_usd, "reserved_usd": key.reserved_usd, "budget_used": used,
                    "rpm": key.rpm, "tpm": key.tpm, "routes": list(key.routes), "revoked": key.revoked,
                    "requests": requests, "spend_usd": spend})
    return out
