"""Exact costs from the ledger: ``infer cost`` and ``GET /infer/cost``.

List-priced rows keep the cost they were written with. For an hour-priced backend the period is
cut into its accounting windows (aligned to ``window_s`` from the epoch); each window's bill is
``hourly × gpus × its length`` (the window still running counts up to now) and is divided over the
tokens its requests used (``method.conserving_rates``), so the settled costs of a window's requests
add up to its bill. A window without tokens has a bill no request pays: that idle share is reported
(it is what raises realised $/Mtok). ``provisional`` is what the rows were written with. A row
belongs to the entry the recorder costed it with (``catalog.owner``): the local engines and the
route members that are store models share ``local``'s one bill.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

import sqlalchemy as sa
from sqlalchemy import Engine

from ledger.tables import RequestLog, utc_iso

from .catalog import Priced, by_member, owner
from .method import MTOK, Cost, Tokens, conserving_rates, window_bill

GROUPS = ("backend", "route", "model", "key", "day")
NO_KEY = "(no key)"  # the group of requests made without an API key
_T = RequestLog.__table__  # type: ignore[attr-defined]


@dataclass
class Row:
    at: float
    backend: str
    route: str
    model: str
    key: str
    tokens: Tokens
    provisional: Cost | None
    settled: Cost | None = None


@dataclass
class Group:
    key: str
    requests: int = 0
    tokens: Tokens = field(default_factory=Tokens)
    settled: Cost = field(default_factory=Cost)
    provisional: float = 0.0
    priced: int = 0

    def add(self, row: Row) -> None:
        self.requests += 1
        self.tokens = self.tokens + row.tokens
        if row.settled is not None:
            self.priced += 1
            s = self.settled
            self.settled = Cost(s.input + row.settled.input, s.cached_input + row.settled.cached_input,
                                s.output + row.settled.output)
            self.provisional += row.provisional.total if row.provisional is not None else 0.0

    def as_dict(self) -> dict[str, Any]:
        t, c = self.tokens, self.settled
        per_mtok = lambda usd, n: round(usd / n * MTOK, 6) if n else None  # noqa: E731
        return {"key": self.key, "requests": self.requests, "priced_requests": self.priced,
                "input_tokens": t.input, "cached_input_tokens": t.cached_input, "output_tokens": t.output,
                "input_cost_usd": c.input, "cached_input_cost_usd": c.cached_input, "output_cost_usd": c.output,
                "total_cost_usd": c.total, "provisional_cost_usd": self.provisional,
                "difference_usd": c.total - self.provisional,
                "usd_per_mtok_input": per_mtok(c.input + c.cached_input, t.input + t.cached_input),
                "usd_per_mtok_output": per_mtok(c.output, t.output)}


def cost_report(db: Engine, priced: list[Priced], *, since: float, by: str = "backend",
                now: float | None = None) -> dict[str, Any]:
    """Requests since ``since`` (epoch seconds) grouped ``by`` backend, route, model, API key or day, with
    settled and provisional costs, and each hour-priced backend's bill and traffic share."""
    if by not in GROUPS:
        raise ValueError(f"--by must be one of {', '.join(GROUPS)}")
    now = time.time() if now is None else now
    rows = _rows(db, since)
    members = by_member(priced)
    bills = {p.name: _settle(p, [r for r in rows if owner(members, r.backend, r.model) is p], since, now)
             for p in priced if p.is_hourly}
    for row in rows:
        if row.settled is None and row.provisional is not None:
            row.settled = row.provisional  # list prices: what was written is exact
    groups: dict[str, Group] = {}
    for row in rows:
        key = _key(row, by)
        groups.setdefault(key, Group(key)).add(row)
    return {"since": utc_iso(datetime.fromtimestamp(since, timezone.utc)), "by": by,
            "groups": [g.as_dict() for g in sorted(groups.values(), key=lambda g: g.key)],
            "bills": bills}


def _settle(priced: Priced, rows: list[Row], since: float, now: float) -> dict[str, Any]:
    entry, size = priced.entry, priced.entry.window_s
    first, last = math.floor(since / size), math.ceil(now / size) - 1  # a window starting at now is not one yet
    by_window: dict[int, list[Row]] = defaultdict(list)
    for row in rows:
        by_window[math.floor(row.at / size)].append(row)
    k, k_cache = priced.output_weight, priced.cached_input_weight
    bill, parts = 0.0, Cost()
    for window in range(first, last + 1):
        start, end = max(since, window * size), min(now, (window + 1) * size)
        cost = window_bill(entry.gpu_hourly_usd, entry.gpus, max(0.0, end - start))
        bill += cost
        members = by_window.get(window, [])
        rates = conserving_rates(cost, sum((r.tokens for r in members), Tokens()), k, k_cache)
        for row in members:
            row.settled = rates.cost(row.tokens) if rates is not None else Cost()
            parts = Cost(parts.input + row.settled.input, parts.cached_input + row.settled.cached_input,
                         parts.output + row.settled.output)
    windows = last - first + 1
    allocated = parts.total
    return {"bill_usd": bill, "allocated_usd": allocated, "idle_usd": bill - allocated,
            "input_usd": parts.input, "cached_input_usd": parts.cached_input, "output_usd": parts.output,
            "windows": windows, "windows_with_traffic": len([w for w in by_window if first <= w <= last]),
            "traffic_share": len([w for w in by_window if first <= w <= last]) / windows if windows else None,
            "output_weight": k, "output_weight_source": priced.weight_source, "cached_input_weight": k_cache,
            "cached_input_weight_source": priced.cached_weight_source,
            "backends": list(priced.members)}


def _rows(db: Engine, since: float) -> list[Row]:
    query = sa.select(_T.c.datetime_utc, _T.c.backend, _T.c.route_name, _T.c.route, _T.c.model, _T.c.key_name,
                      _T.c.input_tokens, _T.c.cached_input_tokens, _T.c.output_tokens, _T.c.input_cost_usd,
                      _T.c.cached_input_cost_usd, _T.c.output_cost_usd).where(_T.c.datetime_utc >= utc_iso(datetime.fromtimestamp(since, timezone.utc)))
    out = []
    with db.connect() as conn:
        for r in conn.execute(query):
            cached = r.cached_input_tokens or 0
            provisional = None if r.input_cost_usd is None else Cost(r.input_cost_usd, r.cached_input_cost_usd or 0.0,
                                                                      r.output_cost_usd or 0.0)
            out.append(Row(_epoch(r.datetime_utc), r.backend, r.route_name or r.model, r.model, r.key_name or NO_KEY,
                           Tokens(max(0, r.input_tokens - cached), cached, r.output_tokens), provisional))
    return out


def _key(row: Row, by: str) -> str:
    if by == "day":
        return datetime.fromtimestamp(row.at, timezone.utc).strftime("%Y-%m-%d")
    return getattr(row, by)


def _epoch(iso: str) -> float:
    return datetime.strptime(iso, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=timezone.utc).timestamp()
