"""``infer bench`` end to end against the scripted server: sweep outputs on disk, compare, errors."""

from __future__ import annotations

import csv
import json

import pytest
from typer.testing import CliRunner

from cli.main import app

from .conftest import entry

FAST = [entry(0.02, [0.01] * 3), entry(0.03, [0.01] * 4, [1, 2, 1, 1, 1])]
SLOW = [entry(0.12, [0.03] * 3), entry(0.15, [0.03] * 4)]


def _bench(url: str, out, *args: str):
    return CliRunner().invoke(app, ["bench", "--url", url, "--model", "m", "--num-requests", "6", "--warmup", "1",
                                    "--input-tokens", "8", "--output-tokens", "4", "--out", str(out), *args])


def test_sweep_writes_every_load_point_plots_and_csv(scripted, tmp_path):
    server = scripted(FAST)
    out = tmp_path / "sweep"
    result = _bench(server.url, out, "--profile", "sweep", "--sweep-size", "4", "--max-concurrency", "6",
                    "--goodput", "ttft:100 tpot:50", "--price-per-hour", "2.5", "--label", "name=fast")
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "summary.json").read_text())
    points = summary["load_points"]
    # synchronous, throughput, then linspace(sync, max, 3)[1:] -> 2 rate points ending at the max rate
    assert [p["profile"] for p in points] == ["synchronous", "throughput", "sweep", "sweep"]
    sync_rate, max_rate = points[0]["request_throughput"], points[1]["request_throughput"]
    assert points[2]["request_rate"] == pytest.approx((sync_rate + max_rate) / 2)
    assert points[3]["request_rate"] == pytest.approx(max_rate)
    assert all(p["completed"] == 6 and p["slo_attainment"] == 1.0 for p in points)
    for p in points:  # the bill-conserving split adds back up to the bill
        total = (p["input_usd_per_mtok"] * p["total_input_tokens"] + p["output_usd_per_mtok"] * p["total_output_tokens"]) / 1e6
        assert abs(total - p["bill_usd"]) < 1e-12
        assert p["bill_usd"] == 2.5 * p["duration"] / 3600
    rows = list(csv.DictReader((out / "summary.csv").open()))
    assert [r["load_point"] for r in rows] == [p["load_point"] for p in points]
    lines = (out / "requests.jsonl").read_text().splitlines()
    assert len(lines) == 4 * 6 and {json.loads(line)["load_point"] for line in lines} == {0, 1, 2, 3}
    for name in ("latency_vs_throughput.png", "pareto.png", "ttft_cdf.png", "tpot_cdf.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert result.output.count("Serving Benchmark Result") == 4
    assert "Request goodput (req/s):" in result.output


def test_compare_prints_runs_side_by_side_at_their_slo(scripted, tmp_path):
    fast, slow = scripted(FAST), scripted(SLOW)
    for server, name in ((fast, "fast"), (slow, "slow")):
        result = _bench(server.url, tmp_path / name, "--profile", "concurrent:3", "--goodput", "ttft:100",
                        "--price-per-hour", "2", "--label", f"name={name}")
        assert result.exit_code == 0, result.output
    result = CliRunner().invoke(app, ["bench", "compare", str(tmp_path / "fast"), str(tmp_path / "slow")])
    assert result.exit_code == 0, result.output
    lines = {line.split("  ")[0]: line for line in result.output.splitlines()}
    assert lines[""].split() == ["fast", "slow"]
    assert lines["met the SLO"].split()[3:] == ["yes", "no", "point", "met", "the", "SLO"]
    attainment = lines["SLO attainment (%)"].split()
    assert attainment[-2:] == ["100.0", "0.0"]
    assert "input $/Mtok" in lines and "concurrent:3" in lines["load point"]


def test_bad_flags_are_one_readable_line(tmp_path):
    result = CliRunner().invoke(app, ["bench", "--url", "http://127.0.0.1:9", "--model", "m", "--goodput", "ttfb:5"])
    assert result.exit_code == 2 and "key must be one of ttft, tpot, e2el" in result.output
    result = CliRunner().invoke(app, ["bench", "compare", str(tmp_path)])
    assert result.exit_code == 1 and "cannot read bench summary" in result.output


def test_slo_search_doubles_then_bisects_to_the_largest_passing_concurrency(scripted, tmp_path):
    """TTFT = 10 ms + 100 ms per other request in flight; SLO 250 ms: 3 in flight pass (≤ 210 ms), 4 fail (310 ms)."""
    slowing = entry(0.01, [0.005]) | {"ttft_per_inflight": 0.1}
    server = scripted([slowing])
    out = tmp_path / "search"
    result = _bench(server.url, out, "--profile", "slo-search", "--goodput", "ttft:250", "--max-concurrency", "16",
                    "--num-requests", "4", "--target-attainment", "1.0")
    assert result.exit_code == 0, result.output
    points = json.loads((out / "summary.json").read_text())["load_points"]
    assert [p["max_concurrency"] for p in points] == [1, 2, 4, 3]
    assert [p["slo_attainment"] == 1.0 for p in points] == [True, True, False, True]
    assert "largest concurrency meeting the SLO: 3" in result.output


def test_slo_search_tries_the_cap_when_doubling_overshoots_it(scripted, tmp_path):
    server = scripted([entry(0.01, [0.005])])
    out = tmp_path / "search"
    result = _bench(server.url, out, "--profile", "slo-search", "--goodput", "ttft:1000", "--max-concurrency", "5",
                    "--num-requests", "5")
    assert result.exit_code == 0, result.output
    points = json.loads((out / "summary.json").read_text())["load_points"]
    assert [p["max_concurrency"] for p in points] == [1, 2, 4, 5]


def test_rate_profile_with_a_time_limit(scripted, tmp_path):
    """Poisson arrivals at 40 req/s for 0.5 s: dispatching stops at the limit, requests in flight finish."""
    server = scripted([entry(0.01, [0.005])])
    out = tmp_path / "rate"
    result = _bench(server.url, out, "--profile", "rate:40", "--duration", "0.5")
    assert result.exit_code == 0, result.output
    point = json.loads((out / "summary.json").read_text())["load_points"][0]
    assert point["request_rate"] == 40 and point["profile"] == "rate" and point["failed"] == 0
    assert 8 <= point["completed"] <= 35  # ~20 expected; Poisson
    starts = sorted(json.loads(line)["start_time"] for line in (out / "requests.jsonl").read_text().splitlines())
    assert starts[-1] - starts[0] < 0.5


def test_packages_export_their_public_names():
    import benchmark
    import estimator

    for package in (benchmark, estimator):
        assert all(hasattr(package, name) for name in package.__all__)


def test_a_server_that_is_down_gives_failed_requests_and_the_first_error():
    result = CliRunner().invoke(app, ["bench", "--url", "http://127.0.0.1:9", "--model", "m", "--num-requests", "2",
                                      "--warmup", "0", "--input-tokens", "4", "--output-tokens", "4"])
    assert result.exit_code == 1, result.output  # nothing measured: a failure, not a result
    assert "Failed requests:                         2" in result.output
    assert "2 request(s) failed; the first: ClientConnectorError: Cannot connect to host 127.0.0.1:9" in result.output
    assert "Error: all 2 requests failed; the first: ClientConnectorError: Cannot connect to host 127.0.0.1:9" in result.output
    result = CliRunner().invoke(app, ["bench", "--url", "http://127.0.0.1:9", "--model", "m", "--profile", "slo-search"])
    assert result.exit_code == 2 and "slo-search needs --goodput" in result.output
