"""``infer bench report DIR [DIR...] -o report.html``: one self-contained HTML file of bench runs.

Charts are matplotlib figures rendered to SVG and inlined (text kept as text), with inline CSS and
no script, so the file opens offline and makes no request:

- sweep curves: median and p99 TTFT, and median TPOT, against output tok/s, one line per run;
- Pareto: output tok/s (per GPU) against tok/s per user (1000 / median TPOT), each run's front drawn;
- TTFT and TPOT CDFs from ``requests.jsonl``: one curve per load point for one run, else one per
  run at its headline point (``compare.headline_point``);
- the comparison table of ``infer bench compare`` (with $/Mtok in and out), and each run's load points.
"""

from __future__ import annotations

import html
import io
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from .compare import compare_rows, headline_point  # noqa: E402
from .plots import pareto_front  # noqa: E402
from .report import load_summary  # noqa: E402

POINT_COLUMNS = [("load point", "load_point", "{}"), ("completed", "completed", "{}"), ("failed", "failed", "{}"),
                 ("req/s", "request_throughput", "{:.2f}"), ("output tok/s", "output_throughput", "{:.1f}"),
                 ("median TTFT ms", "median_ttft_ms", "{:.1f}"), ("p99 TTFT ms", "p99_ttft_ms", "{:.1f}"),
                 ("median TPOT ms", "median_tpot_ms", "{:.2f}"), ("tok/s per user", "median_tok_s_per_user", "{:.1f}"),
                 ("goodput req/s", "request_goodput", "{:.2f}"), ("input $/Mtok", "input_usd_per_mtok", "{:.4f}"),
                 ("output $/Mtok", "output_usd_per_mtok", "{:.4f}")]


@dataclass
class Run:
    name: str
    path: Path
    summary: dict
    records: dict[int, list[dict]] = field(default_factory=dict)  # load point index -> requests.jsonl rows

    @property
    def points(self) -> list[dict]:
        return self.summary["load_points"]


def load_run(path: Path) -> Run:
    summary = load_summary(path)
    folder = path if path.is_dir() else path.parent
    run = Run(summary.get("label", {}).get("name") or folder.name, folder, summary)
    requests = folder / "requests.jsonl"
    if requests.exists():
        for line in requests.read_text(encoding="utf-8").splitlines():
            row = json.loads(line)
            run.records.setdefault(row["load_point"], []).append(row)
    return run


def write_report(dirs: list[Path], out: Path) -> Path:
    runs = [load_run(d) for d in dirs]
    charts = [("sweep", "Latency against throughput (sweep)", _sweep(runs)),
              ("pareto", "Throughput against tok/s per user (Pareto)", _pareto(runs)),
              ("ttft-cdf", "TTFT CDF", _cdf(runs, "ttft")), ("tpot-cdf", "TPOT CDF", _cdf(runs, "tpot"))]
    plt.close("all")
    header, rows = compare_rows(dirs)
    out.write_text(_page(runs, charts, header, rows), encoding="utf-8")
    return out


# -- charts -----------------------------------------------------------------------------------------


def _svg(fig, name: str) -> str:
    buffer = io.StringIO()
    with plt.rc_context({"svg.fonttype": "none", "svg.hashsalt": name}):
        fig.savefig(buffer, format="svg", bbox_inches="tight")
    plt.close(fig)
    text = buffer.getvalue()
    text = re.sub(r"^.*?(<svg\b)", r"\1", text, count=1, flags=re.S)  # the XML prolog and doctype
    return re.sub(r"<metadata>.*?</metadata>\s*", "", text, count=1, flags=re.S)  # RDF with a date


def _sweep(runs: list[Run]) -> str:
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7.5, 6.5), sharex=True)
    for i, run in enumerate(runs):
        order = sorted(run.points, key=lambda p: p["output_throughput"])
        x = [p["output_throughput"] for p in order]
        color = f"C{i}"
        top.plot(x, [p["median_ttft_ms"] for p in order], "o-", color=color, label=f"{run.name} median")
        if order and "p99_ttft_ms" in order[0]:
            top.plot(x, [p["p99_ttft_ms"] for p in order], "s--", color=color, label=f"{run.name} p99")
        bottom.plot(x, [p["median_tpot_ms"] for p in order], "o-", color=color, label=run.name)
    _slo_line(top, runs, "ttft")
    _slo_line(bottom, runs, "tpot")
    top.set_ylabel("TTFT (ms)")
    bottom.set_ylabel("median TPOT (ms)")
    bottom.set_xlabel("output throughput (tok/s)")
    top.legend(fontsize=8)
    bottom.legend(fontsize=8)
    return _svg(fig, "sweep")


def _slo_line(ax, runs: list[Run], metric: str) -> None:
    limits = {run.summary.get("goodput", {}).get(metric) for run in runs if run.summary.get("goodput")} - {None}
    for limit in limits:
        ax.axhline(limit, color="tab:red", linestyle=":", linewidth=1)
        ax.annotate(f"SLO {limit:g} ms", (0, limit), xycoords=("axes fraction", "data"), color="tab:red", fontsize=8,
                    xytext=(2, 2), textcoords="offset points")


def _pareto(runs: list[Run]) -> str:
    fig, ax = plt.subplots(figsize=(7.5, 5))
    per_gpu = any(p.get("gpus", 1) > 1 for run in runs for p in run.points)
    for i, run in enumerate(runs):
        xs = [p["median_tok_s_per_user"] for p in run.points]
        ys = [p["output_throughput"] / p.get("gpus", 1) for p in run.points]
        ax.scatter(xs, ys, color=f"C{i}", label=run.name)
        for p, x, y in zip(run.points, xs, ys):
            ax.annotate(p["load_point"], (x, y), fontsize=7, xytext=(3, 3), textcoords="offset points")
        front = pareto_front(xs, ys)
        ax.plot([xs[j] for j in front], [ys[j] for j in front], "-", color=f"C{i}", alpha=0.7)
    ax.set_xlabel("interactivity (tok/s per user = 1000 / median TPOT)")
    ax.set_ylabel("output tok/s" + (" per GPU" if per_gpu else ""))
    ax.legend(fontsize=8)
    return _svg(fig, "pareto")


def _cdf(runs: list[Run], metric: str) -> str:
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for label, rows in _cdf_curves(runs):
        ok = [r for r in rows if r["success"]]
        values = sorted(1000 * (r["ttft"] if metric == "ttft" else _tpot(r)) for r in ok
                        if metric == "ttft" or (r["output_tokens"] or 0) > 1)
        if values:
            ax.step(values, [(i + 1) / len(values) for i in range(len(values))], where="post", label=label)
    ax.set_xlabel(f"{metric.upper()} (ms)")
    ax.set_ylabel("fraction of requests")
    if ax.get_legend_handles_labels()[1]:
        ax.legend(fontsize=7)
    else:
        ax.text(0.5, 0.5, "no per-request data (requests.jsonl)", ha="center", transform=ax.transAxes)
    return _svg(fig, f"{metric}-cdf")


def _cdf_curves(runs: list[Run]) -> list[tuple[str, list[dict]]]:
    if len(runs) == 1:
        run = runs[0]
        return [(p["load_point"], run.records.get(i, [])) for i, p in enumerate(run.points)]
    curves = []
    for run in runs:
        point, _ = headline_point(run.summary)
        curves.append((f"{run.name} ({point['load_point']})", run.records.get(run.points.index(point), [])))
    return curves


def _tpot(row: dict) -> float:
    """As ``metrics.request_tpot``: seconds per output token after the first."""
    n = row["output_tokens"] or 0
    return (row["latency"] - row["ttft"]) / (n - 1) if n > 1 else 0.0


# -- the page ---------------------------------------------------------------------------------------

CSS = """body{font-family:system-ui,-apple-system,'Segoe UI',sans-serif;font-size:13px;color:#1f2937;margin:0;background:#f9fafb}
header{background:#111827;color:#f9fafb;padding:10px 18px}h1{font-size:17px;margin:0}header p{margin:2px 0 0;color:#9ca3af}
main{padding:8px 18px 24px}section{background:#fff;border:1px solid #e5e7eb;border-radius:6px;padding:10px 14px;margin:10px 0}
h2{font-size:14px;margin:0 0 8px}.charts{display:grid;grid-template-columns:repeat(auto-fit,minmax(460px,1fr));gap:12px}
figure{margin:0}figcaption{color:#6b7280;margin-bottom:4px}figure svg{width:100%;max-width:760px;height:auto}
table{border-collapse:collapse;font-variant-numeric:tabular-nums}th,td{padding:3px 10px;border-bottom:1px solid #e5e7eb;
text-align:right;white-space:nowrap}th:first-child,td:first-child{text-align:left}th{color:#6b7280;font-weight:500}
.muted{color:#6b7280}.wide{overflow-x:auto}h3{font-size:13px;margin:10px 0 4px}"""


def _page(runs: list[Run], charts: list[tuple[str, str, str]], header: list[str], rows: list[list[str]]) -> str:
    e = html.escape
    names = ", ".join(run.name for run in runs)
    figures = "\n".join(f'<figure data-chart="{key}"><figcaption>{e(title)}</figcaption>{svg}</figure>'
                        for key, title, svg in charts)
    compare = _table(header, rows, "compare")
    details = "\n".join(f"<h3>{e(run.name)} <span class=muted>{e(run.summary.get('model_id', ''))} · "
                        f"{e(run.summary.get('base_url', ''))} · {e(str(run.summary.get('date', '')))}</span></h3>"
                        + _table([t for t, _, _ in POINT_COLUMNS],
                                 [[_fmt(p.get(k), f) for _, k, f in POINT_COLUMNS] for p in run.points], f"points-{i}")
                        for i, run in enumerate(runs))
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>infer bench report: {e(names)}</title>
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; style-src 'unsafe-inline'; img-src data:">
<style>{CSS}</style></head>
<body><header><h1>infer bench report</h1><p>{e(names)}</p></header><main>
<section><h2>Comparison <span class=muted>each run at its best load point that meets its SLO</span></h2>{compare}</section>
<section><div class=charts>{figures}</div></section>
<section class=wide><h2>Load points</h2>{details}</section>
</main></body></html>
"""


def _table(header: list[str], rows: list[list[str]], name: str) -> str:
    e = html.escape
    head = "".join(f"<th>{e(str(h))}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{e(str(c))}</td>" for c in row) + "</tr>" for row in rows)
    return f'<table data-table="{name}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def _fmt(value, fmt: str) -> str:
    if value is None:
        return "-"
    return fmt.format(value) if not isinstance(value, str) else value
