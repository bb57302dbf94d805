"""PNG charts of a bench run (matplotlib, Agg backend).

- ``latency_vs_throughput.png``: median and p99 TTFT, and median TPOT, against output tok/s per load point.
- ``pareto.png``: output tok/s (per GPU when ``--gpus`` is given) against tok/s per user
  (1000 / median TPOT), InferenceX's chart, with the Pareto front drawn.
- ``ttft_cdf.png`` and ``tpot_cdf.png``: per-request distributions, one curve per load point.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from .metrics import request_tpot  # noqa: E402
from .session import BenchResult  # noqa: E402


def write_plots(result: BenchResult, out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = [_latency_vs_throughput(result.points, out / "latency_vs_throughput.png"),
             _pareto(result.points, out / "pareto.png"),
             _cdf(result, "ttft", out / "ttft_cdf.png"), _cdf(result, "tpot", out / "tpot_cdf.png")]
    plt.close("all")
    return paths


def _latency_vs_throughput(points: list[dict], path: Path) -> Path:
    order = sorted(points, key=lambda p: p["output_throughput"])
    x = [p["output_throughput"] for p in order]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 7), sharex=True)
    top.plot(x, [p["median_ttft_ms"] for p in order], "o-", label="median TTFT")
    if order and "p99_ttft_ms" in order[0]:
        top.plot(x, [p["p99_ttft_ms"] for p in order], "s--", label="p99 TTFT")
    top.set_ylabel("TTFT (ms)")
    top.legend()
    bottom.plot(x, [p["median_tpot_ms"] for p in order], "o-", color="tab:green", label="median TPOT")
    bottom.set_ylabel("TPOT (ms)")
    bottom.set_xlabel("output throughput (tok/s)")
    bottom.legend()
    fig.suptitle("Latency vs throughput")
    fig.savefig(path, dpi=100)
    return path


def pareto_front(xs: list[float], ys: list[float]) -> list[int]:
    """Indices of points no other point beats on both axes (higher is better), sorted by x."""
    front = [i for i in range(len(xs))
             if not any(xs[j] >= xs[i] and ys[j] >= ys[i] and (xs[j], ys[j]) != (xs[i], ys[i]) for j in range(len(xs)))]
    return sorted(front, key=lambda i: xs[i])


def _pareto(points: list[dict], path: Path) -> Path:
    gpus = points[0].get("gpus", 1) if points else 1
    xs = [p["median_tok_s_per_user"] for p in points]
    ys = [p["output_throughput"] / gpus for p in points]
    fig, ax = plt.subplots(figsize=(7, 5))
    ax.scatter(xs, ys)
    for p, x, y in zip(points, xs, ys):
        ax.annotate(p["load_point"], (x, y), fontsize=7, xytext=(3, 3), textcoords="offset points")
    front = pareto_front(xs, ys)
    ax.plot([xs[i] for i in front], [ys[i] for i in front], "-", color="tab:red", label="Pareto front")
    ax.set_xlabel("interactivity (tok/s per user = 1000 / median TPOT)")
    ax.set_ylabel("output tok/s" + (" per GPU" if gpus > 1 else ""))
    ax.legend()
    fig.savefig(path, dpi=100)
    return path


def _cdf(result: BenchResult, metric: str, path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(7, 5))
    for run in result.runs:
        ok = [r for r in run.records if r.success]
        values = [r.ttft for r in ok] if metric == "ttft" else [request_tpot(r) for r in ok if (r.output_tokens or 0) > 1]
        if values:
            data = np.sort(np.asarray(values) * 1000.0)
            ax.step(data, np.arange(1, len(data) + 1) / len(data), where="post", label=run.point.label)
    ax.set_xlabel(f"{metric.upper()} (ms)")
    ax.set_ylabel("fraction of requests")
    ax.set_title(f"{metric.upper()} CDF")
    if ax.get_legend_handles_labels()[1]:
        ax.legend(fontsize=7)
    fig.savefig(path, dpi=100)
    return path
