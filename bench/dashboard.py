"""What one dashboard refresh costs the gateway, against the size of the ledger.

A SQLite ledger gets N rows spread over the last hour (two routes, three backends, a share of sheds
and errors). Then, through the real app (``create_app`` over ``httpx.ASGITransport``, lifespan
included), each JSON request one refresh of the page makes with the default 15-minute window is
timed ``--runs`` times, alternating in a fixed rotation: ``/infer/series`` (all, and per route),
``/infer/requests?limit=100``, ``/infer/keys``, ``/infer/cost?by=backend`` and ``/infer/routes``.
Printed: the median of each, and of a whole refresh (the sum), per N; and the event loop's
largest stall while a refresh runs (a 1 ms ticker: the ledger reads run in worker threads, so it
should stay near the ticker's own jitter).

    .venv/bin/python bench/dashboard.py [--rows 10000,100000] [--runs 5] [--json PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import tempfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx  # noqa: E402

from gateway.app import create_app  # noqa: E402
from core.settings import ServerSettings  # noqa: E402
from ledger.db import open_db  # noqa: E402
from ledger.tables import UsageRecord  # noqa: E402
from ledger.usage import insert_rows, stamp  # noqa: E402

WINDOW = "15m"
ROUTES = ("chat", "batch")
BACKENDS = ("fast", "slow", "api")


def fill(db_url: str, rows: int, seed: int = 0) -> None:
    rng = random.Random(seed)
    db = open_db(db_url)
    now = datetime.now(timezone.utc)
    batch = []
    for i in range(rows):
        status = rng.choices(("ok", "shed", "error"), (0.9, 0.07, 0.03))[0]
        ttft = rng.lognormvariate(5, 0.6) if status == "ok" else None
        out = rng.randint(16, 256) if status == "ok" else 0
        record = UsageRecord(source="gateway", route="/v1/chat/completions", model=rng.choice(ROUTES),
                             backend=rng.choice(BACKENDS) if status != "shed" else "none", status=status,
                             route_name=rng.choice(ROUTES), input_tokens=rng.randint(20, 800), output_tokens=out,
                             ttft_ms=ttft, tpot_ms=rng.uniform(8, 40) if ttft else None,
                             total_ms=(ttft + out * 20) if ttft else None,
                             slo_met=(ttft < 300) if ttft else None, total_cost_usd=rng.uniform(0, 1e-4))
        batch.append(stamp(record, now - timedelta(seconds=rng.uniform(0, 3600))))
        if len(batch) == 5000 or i == rows - 1:
            insert_rows(db, batch)
            batch = []
    db.dispose()


def refresh_paths() -> list[str]:
    return [f"/infer/series?since={WINDOW}", *(f"/infer/series?since={WINDOW}&route={r}" for r in ROUTES),
            f"/infer/requests?since={WINDOW}&limit=100", f"/infer/keys?since={WINDOW}",
            f"/infer/cost?since={WINDOW}&by=backend", "/infer/routes"]


async def measure(db_url: str, home: Path, runs: int) -> dict:
    app = create_app(ServerSettings.from_env({"INFER_HOME": str(home), "INFER_DATABASE_URL": db_url}))
    paths = refresh_paths()
    times: dict[str, list[float]] = {p: [] for p in paths}
    totals, stalls = [], []
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
            for run in range(runs + 1):  # the first run warms caches and is not counted
                stall = Stall()
                ticker = asyncio.create_task(stall.tick())
                t0 = time.perf_counter()
                order = paths[run % len(paths):] + paths[:run % len(paths)]
                for path in order:
                    start = time.perf_counter()
                    answer = await client.get(path)
                    answer.raise_for_status()
                    if run:
                        times[path].append(time.perf_counter() - start)
                total = time.perf_counter() - t0
                ticker.cancel()
                if run:
                    totals.append(total)
                    stalls.append(stall.worst)
    return {"per_path_ms": {p: round(statistics.median(v) * 1000, 2) for p, v in times.items()},
            "refresh_ms": round(statistics.median(totals) * 1000, 2),
            "worst_loop_stall_ms": round(max(stalls) * 1000, 2)}


class Stall:
    """The event loop's largest lateness for a 1 ms sleep."""

    def __init__(self) -> None:
        self.worst = 0.0

    async def tick(self) -> None:
        while True:
            start = time.perf_counter()
            await asyncio.sleep(0.001)
            self.worst = max(self.worst, time.perf_counter() - start - 0.001)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", default="10000,100000")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    results = {}
    for rows in (int(n) for n in args.rows.split(",")):
        with tempfile.TemporaryDirectory(prefix="infer-dash-") as tmp:
            db_url = f"sqlite:///{tmp}/usage.db"
            fill(db_url, rows)
            result = asyncio.run(measure(db_url, Path(tmp) / "home", args.runs))
        results[rows] = result
        print(f"{rows} ledger rows over an hour, {WINDOW} window: one refresh {result['refresh_ms']} ms "
              f"(median of {args.runs}); worst event-loop stall {result['worst_loop_stall_ms']} ms")
        for path, ms in result["per_path_ms"].items():
            print(f"  {ms:9.2f} ms  {path}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
