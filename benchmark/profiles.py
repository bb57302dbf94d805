"""Load profiles (GuideLLM's, plus AIPerf's SLO search), each a sequence of load points.

- ``synchronous``: one request at a time.
- ``concurrent:N``: N streams, each sending its next request when the last ends.
- ``rate:R``: Poisson arrivals at R req/s (gamma with ``burstiness`` != 1).
- ``sweep``: synchronous, then throughput (all at once under ``max_concurrency``), then
  ``linspace(sync_rate, max_rate, sweep_size - 1)[1:]`` as rate points (GuideLLM's sweep).
- ``slo-search``: concurrency 1, 2, 4, … until SLO attainment falls below the target, then bisect
  between the last passing and first failing concurrency; reports the largest passing one.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import numpy as np

from .metrics import calculate_metrics
from .runner import LoadPoint, PointRun

RunPoint = Callable[[LoadPoint], Awaitable[PointRun]]


@dataclass(frozen=True)
class Profile:
    kind: str
    value: float | None = None

    @classmethod
    def parse(cls, text: str) -> Profile:
        kind, _, value = text.partition(":")
        if kind in ("synchronous", "sweep", "slo-search") and not value:
            return cls(kind)
        if kind in ("concurrent", "rate") and value:
            try:
                number = float(value)
            except ValueError:
                number = -1.0
            if number > 0 and (kind == "rate" or number == int(number)):
                return cls(kind, number)
        raise ValueError(f"--profile {text!r}: use synchronous, concurrent:N, rate:R, sweep or slo-search")


@dataclass(frozen=True)
class SearchSettings:
    """Knobs for sweep and slo-search."""

    max_concurrency: int = 64
    sweep_size: int = 10
    burstiness: float = 1.0
    goodput_slos: dict[str, float] | None = None
    target_attainment: float = 0.9


async def run_profile(profile: Profile, run: RunPoint, settings: SearchSettings) -> list[PointRun]:
    if profile.kind == "synchronous":
        return [await run(LoadPoint("synchronous", max_concurrency=1))]
    if profile.kind == "concurrent":
        return [await run(LoadPoint("concurrent", max_concurrency=int(profile.value or 1)))]
    if profile.kind == "rate":
        return [await run(LoadPoint("rate", rate=float(profile.value or 1), burstiness=settings.burstiness))]
    if profile.kind == "sweep":
        return await _sweep(run, settings)
    return await _slo_search(run, settings)


def sweep_rates(sync_rate: float, max_rate: float, sweep_size: int) -> list[float]:
    return [float(r) for r in np.linspace(sync_rate, max_rate, sweep_size - 1)[1:]]


async def _sweep(run: RunPoint, settings: SearchSettings) -> list[PointRun]:
    sync = await run(LoadPoint("synchronous", max_concurrency=1))
    peak = await run(LoadPoint("throughput", max_concurrency=settings.max_concurrency))
    rates = sweep_rates(_rate(sync), _rate(peak), settings.sweep_size)
    runs = [sync, peak]
    for rate in rates:
        runs.append(await run(LoadPoint("sweep", rate=rate, burstiness=settings.burstiness)))
    return runs


def _rate(point: PointRun) -> float:
    ok = sum(1 for r in point.records if r.success)
    return ok / point.duration if point.duration > 0 else 0.0


def attainment(point: PointRun, slos: dict[str, float]) -> float:
    return calculate_metrics(point.records, point.duration, goodput_slos=slos, percentiles=())["slo_attainment"]


async def _slo_search(run: RunPoint, settings: SearchSettings) -> list[PointRun]:
    slos = settings.goodput_slos
    if not slos:
        raise ValueError("--profile slo-search needs --goodput, e.g. --goodput \"ttft:500 tpot:50\"")
    runs: list[PointRun] = []

    async def passes(concurrency: int) -> bool:
        runs.append(await run(LoadPoint("slo-search", max_concurrency=concurrency)))
        return attainment(runs[-1], slos) >= settings.target_attainment

    good, bad = 0, None
    concurrency = 1
    while bad is None and good < settings.max_concurrency:
        if await passes(concurrency):
            good, concurrency = concurrency, min(concurrency * 2, settings.max_concurrency)
        else:
            bad = concurrency
    while bad is not None and bad - good > 1:
        middle = (good + bad) // 2
        good, bad = (middle, bad) if await passes(middle) else (good, middle)
    return runs


def best_passing_concurrency(runs: list[PointRun], slos: dict[str, float], target: float) -> int | None:
    passing = [r.point.max_concurrency or 0 for r in runs if attainment(r, slos) >= target]
    return max(passing) if passing else None
