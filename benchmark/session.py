"""One ``infer bench`` run end to end: prompts, warm-up, the profile's load points, per-point
summaries (vLLM metrics + goodput + cost + server-side token counts)."""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass, field
from typing import Protocol

import aiohttp

from .clients import Counter, open_session
from .config import BenchConfig
from .cost import cached_prefill_weight, cost_fields, prefill_decode_ratio
from .metrics import calculate_metrics
from .prometheus import scrape, server_token_deltas
from .profiles import run_profile
from .prompts import dataset_requests, synthetic_requests
from .records import BenchRequest, RequestRecord
from .runner import WARMUP_POINT, LoadPoint, PointRun, run_point
from .tokenizer import TokenCounter


DURATION_POOL = 500


class Progress(Protocol):
    def start_point(self, label: str, total: int | None) -> None: ...
    def advance(self, record: RequestRecord) -> None: ...


@dataclass
class BenchResult:
    config: BenchConfig
    runs: list[PointRun] = field(default_factory=list)
    points: list[dict] = field(default_factory=list)
    prompts_exact: bool = True
    tokenizer: str | None = None


def build_requests(config: BenchConfig, counter: TokenCounter | None, *, seed_offset: int = 0,
                   num: int | None = None) -> list[BenchRequest]:
    """The prompts of a run. A time-limited run gets at least ``DURATION_POOL`` synthetic prompts, so
    it repeats none (and a prefix cache serves none) unless it sends more than that."""
    n = num or (max(config.num_requests, DURATION_POOL) if config.duration and not config.dataset else config.num_requests)
    seed = config.seed + seed_offset
    if config.dataset:
        out = config.output_tokens if config.output_tokens_given else None
        return dataset_requests(config.dataset, counter, n, out, seed=seed)
    return synthetic_requests(counter, n, config.input_tokens, config.output_tokens, seed=seed,
                              shared_prefix=config.shared_prefix)


def summarize(config: BenchConfig, run: PointRun, server: dict | None) -> dict:
    point = run.point
    summary = {"profile": point.profile, "load_point": point.label,
               "request_rate": "inf" if math.isinf(point.rate) else point.rate,
               "burstiness": point.burstiness, "max_concurrency": point.max_concurrency,
               "num_prompts": len(run.records)}
    summary.update(calculate_metrics(run.records, run.duration, goodput_slos=config.goodput_slos,
                                     percentiles=config.percentiles))
    summary["prefill_decode_ratio"] = prefill_decode_ratio(run.records)  # k, for output_weight: measured
    summary["cached_prefill_weight"] = cached_prefill_weight(run.records)  # for cached_input_weight: measured
    if config.pricing:
        summary.update(cost_fields(config.pricing, run.records, run.duration))
    if server:
        summary["server_tokens"] = server
    return summary


async def run_bench(config: BenchConfig, counter: TokenCounter | None = None,
                    progress: Progress | None = None) -> BenchResult:
    requests = build_requests(config, counter)
    result = BenchResult(config, prompts_exact=all(r.is_prompt_len_exact for r in requests),
                         tokenizer=counter.source if counter else None)
    async with open_session() as client:
        await _run_points(config, requests, result, client, counter, progress)
    return result


async def _run_points(config: BenchConfig, requests: list[BenchRequest], result: BenchResult,
                      client: aiohttp.ClientSession, counter: TokenCounter | None, progress: Progress | None) -> None:
    count: Counter | None = counter.count if counter else None
    if config.warmup:  # all at once, so they also open the connections the first load point reuses
        warm = LoadPoint("warmup", max_concurrency=config.warmup)  # other prompts: no cache warmed for the run
        await run_point(config.endpoint, build_requests(config, counter, seed_offset=1, num=config.warmup), warm,
                        count_tokens=count, point_index=WARMUP_POINT, client=client)

    async def one(point: LoadPoint) -> PointRun:
        total = None if config.duration else len(requests)
        if progress:
            progress.start_point(point.label, total)
        before = await _scrape(config)
        run = await run_point(config.endpoint, requests, point, time_limit=config.duration, count_tokens=count,
                              on_done=progress.advance if progress else None, seed=config.seed,
                              point_index=len(result.runs), client=client)
        after = await _scrape(config)
        result.runs.append(run)
        result.points.append(summarize(config, run, server_token_deltas(before, after)))
        return run

    await run_profile(config.profile, one, config.search)


async def _scrape(config: BenchConfig) -> dict | None:
    if not config.scrape_metrics:
        return None
    return await asyncio.to_thread(scrape, config.endpoint.base_url)


def now_iso() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
