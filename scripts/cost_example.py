"""The README's `infer cost` worked example (metrics-and-cost.md §4.2): one hour of a $2.50/h H100
(`vllm-h100`, output_weight 5, cached_input_weight 0.1) that served 40,000 requests of 1,000 input
tokens (600 of them a system prompt found in the prefix cache) and 200 output tokens, next to a
list-priced API (`api-mini`) that served 1,000 such requests. The rows
are costed as the gateway costs them when they finish (provisional), written to a fresh ledger, and
settled for that hour as `infer cost` does; it prints what `infer cost` prints for the hour.

    .venv/bin/python scripts/cost_example.py
"""

from __future__ import annotations

import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from cli.cost import _render  # noqa: E402
from gateway.backends_config import load_config  # noqa: E402
from ledger.db import open_db  # noqa: E402
from ledger.tables import UsageRecord  # noqa: E402
from ledger.usage import insert_rows, stamp  # noqa: E402
from pricing.book import PriceBook  # noqa: E402
from pricing.method import Tokens  # noqa: E402
from pricing.settle import cost_report  # noqa: E402

HOUR = 3600.0
START = 1_795_000_000.0 - 1_795_000_000.0 % HOUR  # an hour boundary (2026-11-18 11:00 UTC)
CONFIG = {"backends": [
    {"name": "api-mini", "type": "openai", "base_url": "https://api.openai.com/v1", "model": "gpt-4o-mini",
     "pricing": {"input_per_mtok": 0.15, "output_per_mtok": 0.60, "cached_input_per_mtok": 0.075}},
    {"name": "vllm-h100", "type": "vllm", "base_url": "http://gpu-a:8000", "model": "Qwen/Qwen2.5-7B-Instruct",
     "pricing": {"gpu_hourly_usd": 2.50, "gpus": 1, "output_weight": 5, "cached_input_weight": 0.1}}]}


def main() -> None:
    home = Path(tempfile.mkdtemp(prefix="infer-cost-"))
    (home / "backends.yaml").write_text(yaml.safe_dump(CONFIG, sort_keys=False))
    priced = load_config(home / "backends.yaml").priced(home)
    db = open_db(f"sqlite:///{home / 'usage.db'}")
    book, rows = PriceBook(priced), []
    book.hourly["vllm-h100"].window_start = START  # a gateway whose first window began at START
    for i in range(41_000):
        backend = "api-mini" if i % 41 == 40 else "vllm-h100"
        at = START + (i + 0.5) * HOUR / 41_000
        rows.append(_row(book, backend, at))
    for i in range(0, len(rows), 5000):
        insert_rows(db, rows[i:i + 5000])
    report = cost_report(db, priced, since=START, by="backend", now=START + HOUR)
    print("$ infer cost --by backend   # for the hour " + _iso(START) + " to " + _iso(START + HOUR))
    print(_render(report))
    gpu = next(g for g in report["groups"] if g["key"] == "vllm-h100")
    print(f"\none vllm-h100 request of 1,000 in (600 cached) and 200 out, settled: "
          f"${gpu['total_cost_usd'] / gpu['requests']:.7f}")
    db.dispose()


def _row(book: PriceBook, backend: str, at: float) -> dict:
    """A request through route ``chat`` served by ``backend``, costed as the recorder costs it."""
    tokens = Tokens(400, 600, 200)  # uncached, cached, output
    record = UsageRecord(source="gateway", route="/v1/chat/completions", route_name="chat", model="chat",
                         backend=backend, input_tokens=1000, output_tokens=200, cached_input_tokens=600)
    cost, record.pricing_version = book.cost(backend, tokens, now=at)
    record.input_cost_usd, record.cached_input_cost_usd = cost.input, cost.cached_input
    record.output_cost_usd, record.total_cost_usd = cost.output, cost.total
    return stamp(record, datetime.fromtimestamp(at, timezone.utc))


def _iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


if __name__ == "__main__":
    main()
