"""Files and console text of a bench run.

``DIR/requests.jsonl``: one line per request with its load point, timestamps, gaps and token counts.
``DIR/summary.json``: run metadata plus ``load_points``, each with vLLM's result field names
(``completed``, ``request_throughput``, ``mean_ttft_ms``, ``p99_itl_ms``, ``request_goodput``, …) and
``prefill_decode_ratio`` (what ``output_weight: measured`` reads, ``pricing/calibration.py``).
``DIR/summary.csv``: the scalar fields of each load point, one row each.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

from .metrics import PERCENTILE_METRICS, percentile_word
from .session import BenchResult, now_iso

_TITLES = {"ttft": ("Time to First Token", "TTFT"), "tpot": ("Time per Output Token (excl. 1st token)", "TPOT"),
           "itl": ("Inter-token Latency", "ITL"), "e2el": ("End-to-end Latency", "E2EL")}


def summary_document(result: BenchResult) -> dict:
    cfg = result.config
    return {
        "date": now_iso(), "label": cfg.labels, "endpoint_type": cfg.endpoint.api, "base_url": cfg.endpoint.base_url,
        "model_id": cfg.endpoint.model, "tokenizer_id": result.tokenizer, "profile": cfg.profile.kind,
        "num_prompts": cfg.num_requests, "duration_limit_s": cfg.duration, "prompts_exact": result.prompts_exact,
        "input_tokens": None if cfg.dataset else {"mean": cfg.input_tokens.mean, "stdev": cfg.input_tokens.stdev},
        "output_tokens": {"mean": cfg.output_tokens.mean, "stdev": cfg.output_tokens.stdev},
        "dataset": str(cfg.dataset) if cfg.dataset else None, "goodput": cfg.goodput_slos,
        "target_attainment": cfg.search.target_attainment, "load_points": result.points,
    }


def write_outputs(result: BenchResult, out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "requests.jsonl", "w", encoding="utf-8") as fh:
        for index, run in enumerate(result.runs):
            for record in run.records:
                fh.write(json.dumps({"load_point": index, "label": run.point.label, **record.to_json()}) + "\n")
    (out / "summary.json").write_text(json.dumps(summary_document(result), indent=2) + "\n", encoding="utf-8")
    write_csv(result.points, out / "summary.csv")
    return [out / "requests.jsonl", out / "summary.json", out / "summary.csv"]


def flat_row(point: dict) -> dict:
    row = {k: v for k, v in point.items() if not isinstance(v, dict | list)}
    for key, value in (point.get("server_tokens") or {}).items():
        row[f"server_{key}"] = value
    return row


def write_csv(points: list[dict], path: Path) -> None:
    rows = [flat_row(p) for p in points]
    columns = list(dict.fromkeys(k for row in rows for k in row))
    with open(path, "w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)


def _line(label: str, value: object) -> str:
    if isinstance(value, float):
        return "{:<40} {:<10.2f}".format(label, value)
    return "{:<40} {:<10}".format(label, str(value))


def format_point(point: dict, percentiles: tuple[float, ...] = (99.0,)) -> str:
    """vLLM's printed block for one load point, plus goodput, per-user speed, cost and server counts."""
    lines = ["{s:{c}^{n}}".format(s=f" Serving Benchmark Result: {point['load_point']} ", n=50, c="=")]
    lines += [_line("Successful requests:", point["completed"]), _line("Failed requests:", point["failed"])]
    if point.get("max_concurrency"):
        lines.append(_line("Maximum request concurrency:", point["max_concurrency"]))
    rate = point["request_rate"]
    lines.append(_line("Request rate configured (RPS):", rate if isinstance(rate, str) else float(rate)))
    lines += [_line("Benchmark duration (s):", point["duration"]),
              _line("Total input tokens:", point["total_input_tokens"]),
              _line("Total generated tokens:", point["total_output_tokens"]),
              _line("Request throughput (req/s):", point["request_throughput"])]
    if point.get("request_goodput") is not None:
        lines += [_line("Request goodput (req/s):", point["request_goodput"]),
                  _line("SLO attainment (%):", 100.0 * point["slo_attainment"])]
    lines += [_line("Output token throughput (tok/s):", point["output_throughput"]),
              _line("Peak output token throughput (tok/s):", point["max_output_tokens_per_s"]),
              _line("Peak concurrent requests:", point["max_concurrent_requests"]),
              _line("Total token throughput (tok/s):", point["total_token_throughput"]),
              _line("Tok/s per user (1000/median TPOT):", point["median_tok_s_per_user"])]
    if "input_usd_per_mtok" in point:
        lines += [_line("Input $/Mtok:", point["input_usd_per_mtok"]), _line("Output $/Mtok:", point["output_usd_per_mtok"]),
                  _line("Output/input weight k (prefill/decode):", point["output_input_weight"])]
    if server := point.get("server_tokens"):
        lines += [_line("Server input tokens (/metrics):", server.get("input_tokens", "-")),
                  _line("Server output tokens (/metrics):", server.get("output_tokens", "-"))]
        if "spec_acceptance_rate" in server:
            lines += [_line("Draft acceptance rate (%):", 100.0 * server["spec_acceptance_rate"]),
                      _line("Mean acceptance length:", server.get("spec_mean_acceptance_length", "-"))]
    for name in PERCENTILE_METRICS:
        title, short = _TITLES[name]
        lines.append("{s:{c}^{n}}".format(s=title, n=50, c="-"))
        lines += [_line(f"Mean {short} (ms):", point[f"mean_{name}_ms"]),
                  _line(f"Median {short} (ms):", point[f"median_{name}_ms"])]
        for p in percentiles:
            key = f"p{percentile_word(p)}_{name}_ms"
            if key in point:
                lines.append(_line(f"P{percentile_word(p)} {short} (ms):", point[key]))
    lines.append("=" * 50)
    return "\n".join(lines)


def load_summary(path: Path) -> dict:
    """A summary.json (or the DIR holding one), checked for ``load_points``."""
    file = path / "summary.json" if path.is_dir() else path
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"cannot read bench summary {file}: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("load_points"), list) or not data["load_points"]:
        raise ValueError(f"{file} is not an infer bench summary (no load_points)")
    return data
