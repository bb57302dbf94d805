"""Ledger rows → a time series in fixed buckets (``GET /infer/series``).

Each bucket ``[t, t + step_s)`` holds: requests, ok, errors, shed, cancelled, good (rows whose SLO was
met) and judged (rows with an SLO verdict, and errors and sheds of a route: misses), their rates per second, TTFT/TPOT/e2e
p50/p95/p99 of the ``ok`` rows (nearest rank, ``routing.stats.percentiles``; TPOT derived where
the backend reported none, ``tpot_ms``), tokens in and out, and
spend (the rows' recorded cost; hour-priced backends' costs are provisional until ``infer cost``
settles them). Attainment = good / judged, as the route window counts it. Empty buckets are kept, so
the x axis is time.
"""

from __future__ import annotations

import math

from ledger.views import SeriesRow
from routing.slo import vllm_tpot
from routing.stats import percentiles

MAX_BUCKETS = 240


def bucket_seconds(period_s: float, step_s: float | None) -> float:
    """The bucket width: ``step_s`` if given, else about 60 buckets over the period (at least 1 s);
    never so small that the period has more than ``MAX_BUCKETS``."""
    smallest = max(1.0, math.ceil(period_s / MAX_BUCKETS))
    return max(smallest, step_s if step_s else math.ceil(period_s / 60))


def build_series(rows: list[SeriesRow], since: float, now: float, step_s: float) -> list[dict]:
    first = math.floor(since / step_s)
    count = math.floor(now / step_s) - first + 1
    grouped: list[list[SeriesRow]] = [[] for _ in range(count)]
    for row in rows:
        index = math.floor(row.at / step_s) - first
        if 0 <= index < count:
            grouped[index].append(row)
    return [_bucket((first + i) * step_s, step_s, members) for i, members in enumerate(grouped)]


def _bucket(start: float, step_s: float, rows: list[SeriesRow]) -> dict:
    kinds = {kind: sum(1 for r in rows if r.status == kind) for kind in ("ok", "error", "shed", "cancelled")}
    judged = sum(1 for r in rows if r.slo_met is not None or (r.status in ("error", "shed") and r.route_name))
    good = sum(1 for r in rows if r.slo_met)
    ok = [r for r in rows if r.status == "ok"]
    costs = [r.cost_usd for r in rows if r.cost_usd is not None]
    return {
        "t": start, "requests": len(rows), "ok": kinds["ok"], "errors": kinds["error"], "shed": kinds["shed"],
        "cancelled": kinds["cancelled"], "good": good, "judged": judged,
        "attainment": good / judged if judged else None,
        "requests_per_s": len(rows) / step_s, "errors_per_s": kinds["error"] / step_s,
        "shed_per_s": kinds["shed"] / step_s, "goodput_rps": good / step_s,
        "ttft": _ms_percentiles([r.ttft_ms for r in ok]), "tpot": _ms_percentiles([tpot_ms(r.tpot_ms, r.ttft_ms, r.total_ms, r.output_tokens) for r in ok]),
        "e2e": _ms_percentiles([r.total_ms for r in ok]),
        "input_tokens": sum(r.input_tokens for r in rows), "output_tokens": sum(r.output_tokens for r in rows),
        "cached_input_tokens": sum(r.cached_input_tokens or 0 for r in rows),
        "spend_usd": sum(costs) if costs else 0.0,
    }


def tpot_ms(tpot: float | None, ttft: float | None, total: float | None, output_tokens: int) -> float | None:
    """The row's TPOT; where the backend reported none, vLLM's (e2e − TTFT) / (output − 1), as the
    routes judge it (``routing.slo.vllm_tpot``)."""
    if tpot is not None or ttft is None or total is None:
        return tpot
    derived = vllm_tpot(ttft / 1000, total / 1000, output_tokens)
    return None if derived is None else round(derived * 1000, 3)


def _ms_percentiles(values: list[float | None]) -> dict[str, float | None]:
    return percentiles([v / 1000.0 for v in values if v is not None])


def window_totals(buckets: list[dict]) -> dict:
    """The whole period: sums, and attainment over it."""
    sums = {key: sum(b[key] for b in buckets) for key in ("requests", "ok", "errors", "shed", "cancelled", "good",
                                                        "judged", "input_tokens", "output_tokens",
                                                        "cached_input_tokens", "spend_usd")}
    sums["attainment"] = sums["good"] / sums["judged"] if sums["judged"] else None
    return sums
