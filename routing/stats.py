"""What a route did over its window: requests, good ones, sheds, errors, attainment, goodput and
latency percentiles, per route and per backend (metrics-and-cost.md §3).

Attainment = good / (finished + shed + errors): a shed request or an error is a miss, as in
DistServe and vLLM's benchmark; ``admitted_attainment`` leaves the sheds out. Goodput = good
requests per second over the window (or since the first request, when that is shorter). Requests
the client abandoned (``cancelled``) are counted but not judged.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Literal

Kind = Literal["ok", "shed", "error", "cancelled"]


@dataclass(frozen=True)
class Outcome:
    at: float
    backend: str | None
    kind: Kind
    good: bool = False
    ttft_s: float | None = None
    tpot_s: float | None = None
    e2e_s: float | None = None
    missed: tuple[str, ...] = ()


@dataclass
class Window:
    window_s: float = 300.0
    outcomes: deque = field(default_factory=deque)
    started: float = field(default_factory=time.monotonic)

    def add(self, outcome: Outcome) -> None:
        self.outcomes.append(outcome)
        self._trim(outcome.at)

    def _trim(self, now: float) -> None:
        while self.outcomes and self.outcomes[0].at < now - self.window_s:
            self.outcomes.popleft()

    def summary(self, backend: str | None = None, now: float | None = None) -> dict:
        now = time.monotonic() if now is None else now
        self._trim(now)
        rows = [o for o in self.outcomes if backend is None or o.backend == backend]
        count = {kind: sum(1 for o in rows if o.kind == kind) for kind in ("ok", "shed", "error", "cancelled")}
        judged = count["ok"] + count["shed"] + count["error"]
        good = sum(1 for o in rows if o.good)
        span = max(1e-9, min(self.window_s, now - self.started))
        return {
            "requests": len(rows), "good": good, "shed": count["shed"], "errors": count["error"],
            "cancelled": count["cancelled"],
            "attainment": good / judged if judged else None,
            "admitted_attainment": good / (judged - count["shed"]) if judged - count["shed"] else None,
            "goodput_rps": good / span,
            "missed": {part: sum(1 for o in rows if part in o.missed) for part in ("ttft", "tpot", "e2e")},
            **{name: percentiles([getattr(o, f"{name}_s") for o in rows if o.kind == "ok"])
               for name in ("ttft", "tpot", "e2e")},
        }


def percentiles(values: list[float | None]) -> dict[str, float | None]:
    """p50/p95/p99 in milliseconds (nearest rank), None when there is nothing to rank."""
    data = sorted(v for v in values if v is not None)
    if not data:
        return {"p50": None, "p95": None, "p99": None}
    pick = lambda q: round(data[min(len(data) - 1, max(0, int(q * len(data) + 0.999999) - 1))] * 1000, 3)  # noqa: E731
    return {"p50": pick(0.50), "p95": pick(0.95), "p99": pick(0.99)}
