"""An in-process backend with scripted latency for the routing policies' unit tests: TTFT, a gap
per token, a token count, an error status before the first byte, or a stall before the first token.
It honours ``request.cancel`` like the real backends (ends with a cancelled Done)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from core.base import Chunk, Done, GenerationRequest, Health, Timings, Usage
from adapters.remote.http_errors import error_from_status


@dataclass
class Scripted:
    name: str
    ttft: float = 0.01
    gap: float = 0.001
    tokens: int = 4
    fail_status: int | None = None
    fail_times: int = 0
    stall: bool = False
    can_stream: bool = True
    supports_embeddings: bool = False
    calls: list[GenerationRequest] = field(default_factory=list)
    cancelled: int = 0

    async def stream(self, request: GenerationRequest):
        self.calls.append(request)
        if self.fail_status is not None and (self.fail_times == 0 or len(self.calls) <= self.fail_times):
            raise error_from_status(f"scripted backend {self.name}", self.fail_status, "scripted failure")
        stop = asyncio.Event()
        request.cancel.on_cancel(stop.set)
        times: list[float] = []
        if await _wait(stop, 3600 if self.stall else self.ttft):
            self.cancelled += 1
            yield self._done(request, times, "cancelled")
            return
        for i in range(self.tokens):
            if i and await _wait(stop, self.gap):
                self.cancelled += 1
                yield self._done(request, times, "cancelled")
                return
            times.append(time.perf_counter() - request.arrival)
            yield Chunk(f"t{i} ", token_ids=[i])
        yield self._done(request, times, "length")

    def _done(self, request, times, reason) -> Done:
        timings = Timings(ttft=times[0] if times else None, total=time.perf_counter() - request.arrival,
                          token_times=list(times))
        return Done(reason, Usage(input_tokens=5, output_tokens=len(times)), timings)

    async def health(self) -> Health:
        return Health(ok=True)

    async def aclose(self) -> None:
        return None


async def _wait(stop: asyncio.Event, seconds: float) -> bool:
    """Sleep ``seconds``; True when cancelled meanwhile."""
    try:
        await asyncio.wait_for(stop.wait(), seconds)
        return True
    except TimeoutError:
        return False
