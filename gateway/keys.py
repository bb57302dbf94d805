"""API keys on the request path: who is asking, within which limits, and within which budget.

- ``authenticate``: ``Authorization: Bearer sk-infer-…`` names a key of the ledger (looked up off
  the event loop, cached for a few seconds); a revoked or unknown key is 401, a model outside the
  key's routes 403. With ``auth: {required: true}`` in the config every API request needs one.
- limits: requests and tokens per minute per key: 429 with ``Retry-After`` and
  ``x-ratelimit-remaining-requests`` / ``-tokens``. In this process (a sliding minute), or shared
  by every replica in Redis with ``--redis-url`` (a counter per key and minute: atomic INCR with an
  expiry).
- budgets: the recorder reserves a request's maximum cost before it starts and settles it to the
  actual cost when it ends (``ledger.keys``), so concurrent requests cannot overrun a budget.
  A reservation that reaches the database also reserves room for ``LEASE_REQUESTS`` more such
  requests: the replica's *lease*, from which its next requests reserve in memory (no database
  statement, no thread hop). The lease is reserved in the database like any reservation, so
  replicas together still cannot pass a budget; what a lease still holds goes back to the budget
  after ``LEASE_IDLE_S`` without a request on that key, and at shutdown.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Engine

from adapters.core.errors import BackendOverloaded
from ledger.keys import ApiKey, find_key, reserve, settle

from gateway.http.errors import APIError

CACHE_S = 2.0
LEASE_REQUESTS = 8   # a reservation that goes to the database takes room for this many more requests
LEASE_IDLE_S = 1.0   # a lease's unused room goes back to the budget after this long without a request


class OverBudget(BackendOverloaded):
    """A key's budget cannot cover this request's maximum cost (429)."""


class RateLimited(BackendOverloaded):
    def __init__(self, message: str, *, retry_after: float, remaining: dict[str, int]):
        super().__init__(message, retry_after=retry_after)
        self.remaining = remaining


@dataclass
class KeyBook:
    db: Engine
    required: bool = False
    redis: Any = None  # redis.asyncio.Redis when the limits are shared between replicas
    _cache: dict[str, tuple[float, ApiKey | None]] = field(default_factory=dict)
    _minutes: dict[str, "Minute"] = field(default_factory=dict)
    _finding: dict[str, asyncio.Future] = field(default_factory=dict)  # lookups in flight, by key
    _leases: dict[str, "Lease"] = field(default_factory=dict)
    _returning: set[asyncio.Task] = field(default_factory=set)

    def take(self, key_name: str, amount: float) -> bool:
        """Reserve ``amount`` from this replica's lease on the key, in memory; False when it is short."""
        lease = self._leases.get(key_name)
        if lease is None or lease.held < amount:
            return False
        lease.held -= amount
        self._touch(key_name, lease)
        return True

    async def reserve(self, key_name: str, amount: float) -> bool:
        """Reserve ``amount`` in the database, with room for a lease when the budget has it; False when
        even ``amount`` would pass the budget (after a last look at the lease, which a concurrent
        request may have filled meanwhile)."""
        lease = self._leases.setdefault(key_name, Lease())
        loop = asyncio.get_running_loop()
        extra = amount * LEASE_REQUESTS
        if await loop.run_in_executor(None, reserve, self.db, key_name, amount + extra):
            lease.held += extra
        elif not self.take(key_name, amount) and not await loop.run_in_executor(None, reserve, self.db, key_name,
                                                                                 amount):
            return self.take(key_name, amount)
        self._touch(key_name, lease)
        return True

    def _touch(self, key_name: str, lease: "Lease") -> None:
        """The lease was used now: one timer per lease, re-armed at its expiry if it was used since
        (not cancelled and re-armed on every request)."""
        loop = asyncio.get_running_loop()
        lease.used_at = loop.time()
        if lease.timer is None:
            lease.timer = loop.call_later(LEASE_IDLE_S, self._expire, key_name)

    def _expire(self, key_name: str) -> None:
        lease = self._leases[key_name]
        loop = asyncio.get_running_loop()
        idle_left = lease.used_at + LEASE_IDLE_S - loop.time()
        if idle_left > 0:
            lease.timer = loop.call_later(idle_left, self._expire, key_name)
        else:
            self._give_back(key_name)

    def _give_back(self, key_name: str) -> None:
        lease = self._leases[key_name]
        held, lease.held, lease.timer = lease.held, 0.0, None
        if held > 0:
            task = asyncio.get_running_loop().create_task(asyncio.to_thread(settle, self.db, key_name, held, 0.0))
            self._returning.add(task)
            task.add_done_callback(self._returning.discard)

    async def aclose(self) -> None:
        """Shutdown: every lease's unused room goes back to its budget."""
        for name, lease in self._leases.items():
            if lease.timer is not None:
                lease.timer.cancel()
            self._give_back(name)
        await asyncio.gather(*self._returning, return_exceptions=True)

    async def authenticate(self, bearer: str | None, model: str) -> ApiKey | None:
        if not bearer or not bearer.startswith("sk-infer-"):
            if self.required:
                raise APIError(401, "this server requires an API key: send 'Authorization: Bearer sk-infer-…' "
                                    "(infer keys create NAME)")
            return None
        key = await self.identify(bearer)
        if not key.allows(model):
            raise APIError(403, f"key '{key.name}' may not use '{model}' (its routes: {', '.join(key.routes)})")
        return key

    async def identify(self, bearer: str) -> ApiKey:
        """The live key ``bearer`` names, or 401."""
        key = await self._lookup(bearer)
        if key is None or key.revoked:
            raise APIError(401, "invalid or revoked API key")
        return key

    async def _lookup(self, bearer: str) -> ApiKey | None:
        now = time.monotonic()
        cached = self._cache.get(bearer)
        if cached is not None and now - cached[0] < CACHE_S:
            return cached[1]
        running = self._finding.get(bearer)  # a burst on a cold cache asks the database once
        if running is None:
            running = self._finding[bearer] = asyncio.ensure_future(asyncio.to_thread(find_key, self.db, bearer))
            running.add_done_callback(lambda _: self._finding.pop(bearer, None))
        key = await asyncio.shield(running)
        if len(self._cache) > 10_000:
            self._cache.clear()
        self._cache[bearer] = (now, key)
        return key

    async def admit(self, key: ApiKey, tokens: int) -> None:
        """Count one request against the key's per-minute limits, or raise RateLimited."""
        if key.rpm is None and key.tpm is None:
            return
        if self.redis is not None:
            await _redis_admit(self.redis, key, tokens)
        else:
            self._minutes.setdefault(key.name, Minute()).admit(key, tokens)

    def used(self, key_name: str, tokens: int) -> Coroutine[Any, Any, None] | None:
        """Count a finished request's tokens: at once in this process, or the coroutine that counts
        them in Redis."""
        if self.redis is not None:
            return _redis_used(self.redis, key_name, tokens)
        minute = self._minutes.get(key_name)
        if minute is not None:
            minute.tokens.append((time.monotonic(), tokens))
        return None


async def _redis_used(redis: Any, key_name: str, tokens: int) -> None:
    counter = f"infer:tpm:{key_name}:{int(time.time() // 60)}"
    async with redis.pipeline(transaction=True) as pipe:
        await pipe.incrby(counter, tokens).expire(counter, 120).execute()


async def _redis_admit(redis: Any, key: ApiKey, tokens: int) -> None:
    """Fixed one-minute windows shared by every replica: one INCR of the request counter (with an
    expiry), one read of the token counter."""
    now = time.time()
    minute, wait = int(now // 60), math.ceil(60 - now % 60)
    requests, tokens_key = f"infer:rpm:{key.name}:{minute}", f"infer:tpm:{key.name}:{minute}"
    async with redis.pipeline(transaction=True) as pipe:
        count, _, used = await pipe.incr(requests).expire(requests, 120).get(tokens_key).execute()
    used = int(used or 0)
    remaining = {"requests": max(0, key.rpm - count) if key.rpm else -1,
                 "tokens": max(0, key.tpm - used) if key.tpm else -1}
    if key.rpm is not None and count > key.rpm:
        raise RateLimited(f"key '{key.name}' reached its {key.rpm} requests per minute; retry in {wait} s",
                          retry_after=float(max(1, wait)), remaining=remaining)
    if key.tpm is not None and used + tokens > key.tpm:
        raise RateLimited(f"key '{key.name}' reached its {key.tpm} tokens per minute; retry in {wait} s",
                          retry_after=float(max(1, wait)), remaining=remaining)


@dataclass
class Lease:
    held: float = 0.0  # reserved in the database, not yet handed to a request
    used_at: float = 0.0  # loop time of the last reservation from it
    timer: asyncio.TimerHandle | None = None  # gives the room back LEASE_IDLE_S after used_at


@dataclass
class Minute:
    requests: deque = field(default_factory=deque)  # admission times
    tokens: deque = field(default_factory=deque)    # (time, tokens) of finished requests

    def admit(self, key: ApiKey, tokens: int) -> None:
        now = time.monotonic()
        while self.requests and self.requests[0] <= now - 60:
            self.requests.popleft()
        while self.tokens and self.tokens[0][0] <= now - 60:
            self.tokens.popleft()
        used = sum(n for _, n in self.tokens)
        remaining = {"requests": (key.rpm - len(self.requests)) if key.rpm else -1,
                     "tokens": (key.tpm - used) if key.tpm else -1}
        if key.rpm is not None and len(self.requests) >= key.rpm:
            wait = self.requests[0] + 60 - now
            raise RateLimited(f"key '{key.name}' reached its {key.rpm} requests per minute; retry in "
                              f"{math.ceil(wait)} s", retry_after=max(1.0, math.ceil(wait)), remaining=remaining)
        if key.tpm is not None and used + tokens > key.tpm:
            wait = self.tokens[0][0] + 60 - now if self.tokens else 60.0
            raise RateLimited(f"key '{key.name}' reached its {key.tpm} tokens per minute; retry in "
                              f"{math.ceil(wait)} s", retry_after=max(1.0, math.ceil(wait)), remaining=remaining)
        self.requests.append(now)
