"""Run one load point: send requests on their arrival schedule under an optional concurrency cap.

The cyclic garbage collector is paused while a point runs (as ``timeit`` does): a full collection
in a long-lived process takes milliseconds, which would land inside some request's TTFT or ITL.

``duration`` (s) is vLLM's: from the first dispatch to the last completion. With a time limit the
requests are cycled and dispatching stops at the limit; requests in flight then finish and count.
"""

from __future__ import annotations

import asyncio
import gc
import itertools
import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import aiohttp

from .arrivals import arrival_offsets, open_ended_offsets
from .clients import Counter, Endpoint, open_session, send_request
from .records import BenchRequest, RequestRecord


@dataclass(frozen=True)
class LoadPoint:
    """One load setting: ``rate`` req/s (``inf`` = all at once) and a concurrency cap (``None`` = none)."""

    profile: str
    rate: float = math.inf
    max_concurrency: int | None = None
    burstiness: float = 1.0

    @property
    def label(self) -> str:
        if self.profile == "synchronous":
            return "synchronous"
        if math.isinf(self.rate):
            return f"concurrent:{self.max_concurrency}" if self.max_concurrency else "throughput"
        return f"rate:{self.rate:.3g}" + (f",concurrency:{self.max_concurrency}" if self.max_concurrency else "")


@dataclass
class PointRun:
    point: LoadPoint
    records: list[RequestRecord]
    duration: float


OnDone = Callable[[RequestRecord], None]
WARMUP_POINT = 0xFFFFFFFF


def request_id(point_index: int, i: int) -> str:
    """The ``x-request-id`` sent: UUID-shaped (some servers reject anything else), with the load point
    in the first group and the request's index in the last, so a server log can be matched back."""
    return f"{point_index:08x}-0000-4000-8000-{i:012x}"


async def run_point(endpoint: Endpoint, requests: Sequence[BenchRequest], point: LoadPoint, *,
                    time_limit: float | None = None, count_tokens: Counter | None = None,
                    on_done: OnDone | None = None, seed: int = 0, point_index: int = 0,
                    client: aiohttp.ClientSession | None = None) -> PointRun:
    """Send ``requests`` as ``point`` says; ``client`` (shared to keep connections warm) or a fresh one."""
    if client is None:
        async with open_session() as own:
            return await run_point(endpoint, requests, point, time_limit=time_limit, count_tokens=count_tokens,
                                   on_done=on_done, seed=seed, point_index=point_index, client=own)
    cap = point.max_concurrency
    semaphore = asyncio.Semaphore(cap) if cap else None

    async def one(i: int, request: BenchRequest) -> RequestRecord:
        try:
            record = await send_request(client, endpoint, request, request_id(point_index, i), count_tokens)
        finally:
            if semaphore:
                semaphore.release()
        if on_done:
            on_done(record)
        return record

    gc.disable()
    try:
        return await _dispatch(requests, point, time_limit, seed, semaphore, one)
    finally:
        gc.enable()


async def _dispatch(requests: Sequence[BenchRequest], point: LoadPoint, time_limit: float | None, seed: int,
                    semaphore: asyncio.Semaphore | None, one) -> PointRun:
    start = time.perf_counter()
    tasks = []
    for i, (request, offset) in enumerate(_schedule(requests, point, time_limit, seed)):
        delay = start + offset - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        if semaphore:
            await semaphore.acquire()
        if time_limit is not None and time.perf_counter() - start >= time_limit:
            if semaphore:
                semaphore.release()
            break
        tasks.append(asyncio.create_task(one(i, request)))
    records = list(await asyncio.gather(*tasks))
    return PointRun(point, records, time.perf_counter() - start)


def _schedule(requests: Sequence[BenchRequest], point: LoadPoint, time_limit: float | None,
              seed: int) -> Iterator[tuple[BenchRequest, float]]:
    if time_limit is None:
        return zip(requests, arrival_offsets(len(requests), point.rate, point.burstiness, seed=seed))
    return zip(itertools.cycle(requests), open_ended_offsets(point.rate, point.burstiness, seed=seed))
