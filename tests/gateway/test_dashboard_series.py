"""``GET /infer/series``'s buckets from ledger rows: every row in exactly one bucket, empty buckets
kept, attainment counting errors and sheds of a route as misses, TPOT derived where none was
reported, and the bucket width bounded."""

from __future__ import annotations

import pytest

from gateway.dashboard.series import MAX_BUCKETS, bucket_seconds, build_series, tpot_ms, window_totals
from ledger.views import SeriesRow


def row(at: float, status: str = "ok", slo_met: bool | None = True, ttft: float | None = 100.0,
        tpot: float | None = 10.0, total: float | None = 500.0, route: str | None = "chat",
        cost: float | None = 0.001, cached: int | None = None) -> SeriesRow:
    return SeriesRow(at, route, status, slo_met, ttft, tpot, total, 10, 41, cost, cached)


def test_rows_fall_in_their_bucket_and_empty_buckets_stay():
    rows = [row(1000.5, cached=6), row(1009.9, slo_met=False, ttft=300.0),
            row(1030.0, status="shed", slo_met=None, ttft=None, tpot=None, total=None, cost=None)]
    buckets = build_series(rows, since=1000.0, now=1035.0, step_s=10.0)
    assert [b["t"] for b in buckets] == [1000.0, 1010.0, 1020.0, 1030.0]
    assert [b["requests"] for b in buckets] == [2, 0, 0, 1]
    first = buckets[0]
    assert (first["good"], first["judged"], first["attainment"]) == (1, 2, 0.5)
    assert first["ttft"] == {"p50": 100.0, "p95": 300.0, "p99": 300.0}
    assert first["requests_per_s"] == 0.2 and first["spend_usd"] == pytest.approx(0.002)
    assert (first["input_tokens"], first["cached_input_tokens"]) == (20, 6)  # a NULL (not reported) counts 0
    assert buckets[1]["attainment"] is None and buckets[1]["ttft"]["p50"] is None
    assert (buckets[3]["shed"], buckets[3]["judged"], buckets[3]["attainment"]) == (1, 1, 0.0)
    totals = window_totals(buckets)
    assert (totals["requests"], totals["good"], totals["judged"], totals["shed"]) == (3, 1, 3, 1)
    assert totals["cached_input_tokens"] == 6
    assert totals["attainment"] == pytest.approx(1 / 3)


def test_errors_without_a_route_are_not_judged():
    [bucket] = build_series([row(5.0, status="error", slo_met=None, route=None)], since=0.0, now=9.0, step_s=10.0)
    assert (bucket["errors"], bucket["judged"], bucket["attainment"]) == (1, 0, None)


def test_tpot_is_derived_as_vllm_does_where_the_backend_reported_none():
    assert tpot_ms(None, 100.0, 500.0, 41) == 10.0  # (500 - 100) / (41 - 1)
    assert tpot_ms(7.0, 100.0, 500.0, 41) == 7.0
    assert tpot_ms(None, 100.0, 500.0, 1) is None and tpot_ms(None, None, 500.0, 41) is None


def test_the_bucket_width_keeps_the_count_bounded():
    assert bucket_seconds(900, None) == 15  # about 60 buckets
    assert bucket_seconds(3600, 1) == 3600 / MAX_BUCKETS  # a step asked for too fine
    assert bucket_seconds(30, None) == 1
