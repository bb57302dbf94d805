"""``infer bench compare``: bench runs side by side, one column per run directory.

Each run is represented by its headline load point: with a goodput SLO, the highest output throughput
among points whose SLO attainment reaches the run's target (so $/Mtok is the price *at the SLO*);
without one, or when no point passes, the highest output throughput (marked ``no point met the SLO``).
"""

from __future__ import annotations

from pathlib import Path

from .report import load_summary

_ROWS = [
    ("load point", "load_point", "{}"), ("completed / failed", None, "{}"),
    ("request throughput (req/s)", "request_throughput", "{:.2f}"),
    ("output throughput (tok/s)", "output_throughput", "{:.1f}"),
    ("total throughput (tok/s)", "total_token_throughput", "{:.1f}"),
    ("median TTFT (ms)", "median_ttft_ms", "{:.1f}"), ("p99 TTFT (ms)", "p99_ttft_ms", "{:.1f}"),
    ("median TPOT (ms)", "median_tpot_ms", "{:.2f}"), ("p99 TPOT (ms)", "p99_tpot_ms", "{:.2f}"),
    ("median ITL (ms)", "median_itl_ms", "{:.2f}"), ("median E2EL (ms)", "median_e2el_ms", "{:.1f}"),
    ("tok/s per user", "median_tok_s_per_user", "{:.1f}"),
    ("goodput (req/s)", "request_goodput", "{:.2f}"), ("SLO attainment (%)", "slo_attainment", "pct"),
    ("input $/Mtok", "input_usd_per_mtok", "{:.4f}"), ("output $/Mtok", "output_usd_per_mtok", "{:.4f}"),
]


def headline_point(summary: dict) -> tuple[dict, bool]:
    """(point, met_slo): the best point at the SLO, else the highest-throughput point."""
    points = summary["load_points"]
    target = summary.get("target_attainment") or 0.9
    if summary.get("goodput"):
        passing = [p for p in points if (p.get("slo_attainment") or 0) >= target]
        if passing:
            return max(passing, key=lambda p: p["output_throughput"]), True
    return max(points, key=lambda p: p["output_throughput"]), not summary.get("goodput")


def compare_table(dirs: list[Path]) -> str:
    header, rows = compare_rows(dirs)
    widths = [max(len(str(row[i])) for row in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(str(cell).ljust(w) for cell, w in zip(row, widths)).rstrip() for row in [header, *rows]]
    return "\n".join(lines)


def compare_rows(dirs: list[Path]) -> tuple[list[str], list[list[str]]]:
    """The table's header (a blank, then each run's name) and its rows (a title, then one cell per run)."""
    columns = []
    for path in dirs:
        summary = load_summary(path)
        point, met = headline_point(summary)
        name = summary.get("label", {}).get("name") or path.name
        columns.append((name, summary, point, met))
    header = ["", *(c[0] for c in columns)]
    rows = [["model", *(c[1].get("model_id", "") for c in columns)],
            ["api", *(c[1].get("endpoint_type", "") for c in columns)]]
    for title, key, fmt in _ROWS:
        rows.append([title, *(_cell(c[2], key, fmt) for c in columns)])
    rows.append(["met the SLO", *(("yes" if c[3] else "no point met the SLO") if c[1].get("goodput") else "-"
                                  for c in columns)])
    return header, rows


def _cell(point: dict, key: str | None, fmt: str) -> str:
    if key is None:
        return f"{point['completed']} / {point['failed']}"
    value = point.get(key)
    if value is None:
        return "-"
    if fmt == "pct":
        return f"{100 * value:.1f}"
    return fmt.format(value)
