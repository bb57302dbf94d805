"""Per-key requests and tokens per minute, over a sliding window: never more than ``rpm`` requests,
nor ``tpm`` tokens, in any 60 seconds (a calendar-minute counter lets twice that through across a
minute boundary).

Each admitted request is an entry ``(time, tokens)`` of its key's window, in three steps:

- :meth:`start` when it arrives: refused (``RateLimited``) when the last 60 s hold ``rpm`` entries,
  or ``tpm`` tokens already; else its entry is added with 0 tokens;
- :meth:`charge` once its prompt is counted: its tokens (prompt + the most it may generate) must fit
  in ``tpm`` with the window's other tokens, else it is refused and its entry removed;
- :meth:`settle` when it ends: its entry keeps the tokens it actually used.

:class:`MemoryWindows` keeps the windows in this process; :class:`RedisWindows` in Redis, shared by
every replica, each step one Lua script (atomic; the window's clock is Redis's ``TIME``, one clock
for every replica). When Redis cannot be reached a request gets 503 with ``Retry-After``, or, with
``fail_open`` (``auth: {rate_limits_fail_open: true}``), goes on without its limits (one log line
per outage either way).
"""

from __future__ import annotations

import math
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Protocol

from core.errors import BackendOverloaded

from gateway.http.outage import Outage, redis_down

WINDOW_S = 60.0


class RateLimited(BackendOverloaded):
    def __init__(self, message: str, *, retry_after: float, remaining: dict[str, int]):
        super().__init__(message, retry_after=retry_after)
        self.remaining = remaining


class Windows(Protocol):
    async def start(self, key: Any, request_id: str) -> None: ...

    async def charge(self, key: Any, request_id: str, tokens: int) -> None: ...

    async def settle(self, key: Any, request_id: str, tokens: int) -> None: ...


def _refusal(key: Any, what: str, wait: float, remaining: dict[str, int]) -> RateLimited:
    limit = f"{key.rpm} requests" if what == "requests" else f"{key.tpm} tokens"
    wait = max(1, math.ceil(wait))
    return RateLimited(f"key '{key.name}' reached its {limit} per minute; retry in {wait} s",
                       retry_after=float(wait), remaining=remaining)


@dataclass
class _Window:
    entries: dict[str, list[float]] = field(default_factory=dict)  # request id -> [time, tokens]
    order: deque = field(default_factory=deque)  # (time, request id), oldest first
    tokens: float = 0.0

    def expire(self, now: float) -> None:
        while self.order and self.order[0][0] <= now - WINDOW_S:
            _, rid = self.order.popleft()
            entry = self.entries.pop(rid, None)
            if entry is not None:
                self.tokens -= entry[1]

    def remaining(self, key: Any) -> dict[str, int]:
        return {"requests": max(0, key.rpm - len(self.entries)) if key.rpm else -1,
                "tokens": max(0, int(key.tpm - self.tokens)) if key.tpm else -1}

    def oldest_wait(self, now: float) -> float:
        return self.order[0][0] + WINDOW_S - now if self.order else WINDOW_S


@dataclass
class MemoryWindows:
    """The windows of this process (one replica)."""

    windows: dict[str, _Window] = field(default_factory=dict)

    def _window(self, key: Any) -> tuple[_Window, float]:
        now = time.monotonic()
        window = self.windows.setdefault(key.name, _Window())
        window.expire(now)
        return window, now

    async def start(self, key: Any, request_id: str) -> None:
        window, now = self._window(key)
        if key.rpm is not None and len(window.entries) >= key.rpm:
            raise _refusal(key, "requests", window.oldest_wait(now), window.remaining(key))
        if key.tpm is not None and window.tokens >= key.tpm:
            raise _refusal(key, "tokens", window.oldest_wait(now), window.remaining(key))
        window.entries[request_id] = [now, 0.0]
        window.order.append((now, request_id))

    async def charge(self, key: Any, request_id: str, tokens: int) -> None:
        window, now = self._window(key)
        entry = window.entries.get(request_id)
        held = entry[1] if entry else 0.0
        if key.tpm is not None and window.tokens - held + tokens > key.tpm:
            if entry is not None:
                del window.entries[request_id]
                window.tokens -= held
            raise _refusal(key, "tokens", window.oldest_wait(now), window.remaining(key))
        if entry is not None:
            window.tokens += tokens - held
            entry[1] = float(tokens)

    async def settle(self, key: Any, request_id: str, tokens: int) -> None:
        window, _ = self._window(key)
        entry = window.entries.get(request_id)
        if entry is not None:
            window.tokens += tokens - entry[1]
            entry[1] = float(tokens)


# KEYS: the window's sorted set (request id by time), its hash (request id -> tokens), its token total.
# ARGV: step (start | charge | settle), request id, rpm (-1: none), tpm (-1: none), tokens, window seconds.
# Returns {admitted (1/0), requests in the window, tokens in the window, seconds until the oldest leaves}.
_SCRIPT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
local window = tonumber(ARGV[6])
local old = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now - window)
for _, id in ipairs(old) do
  local n = tonumber(redis.call('HGET', KEYS[2], id) or '0')
  redis.call('HDEL', KEYS[2], id)
  redis.call('INCRBYFLOAT', KEYS[3], -n)
end
if #old > 0 then redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - window) end
local step, id = ARGV[1], ARGV[2]
local rpm, tpm, tokens = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local count = redis.call('ZCARD', KEYS[1])
local total = tonumber(redis.call('GET', KEYS[3]) or '0')
local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
local wait = window
if first[2] then wait = tonumber(first[2]) + window - now end
local ok = 1
if step == 'start' then
  if (rpm >= 0 and count >= rpm) or (tpm >= 0 and total >= tpm) then
    ok = 0
  else
    redis.call('ZADD', KEYS[1], now, id)
    redis.call('HSET', KEYS[2], id, 0)
    count = count + 1
  end
else
  local held = redis.call('HGET', KEYS[2], id)
  if held then
    held = tonumber(held)
    if step == 'charge' and tpm >= 0 and total - held + tokens > tpm then
      ok = 0
      redis.call('ZREM', KEYS[1], id)
      redis.call('HDEL', KEYS[2], id)
      redis.call('INCRBYFLOAT', KEYS[3], -held)
      count = count - 1
      total = total - held
    else
      redis.call('HSET', KEYS[2], id, tokens)
      redis.call('INCRBYFLOAT', KEYS[3], tokens - held)
      total = total + tokens - held
    end
  end
end
local ttl = math.ceil(window) + 1
redis.call('EXPIRE', KEYS[1], ttl)
redis.call('EXPIRE', KEYS[2], ttl)
redis.call('EXPIRE', KEYS[3], ttl)
return {ok, count, tostring(total), tostring(wait)}
"""


@dataclass
class RedisWindows:
    """The windows in Redis, shared by the replicas that use it."""

    redis: Any  # redis.asyncio.Redis
    fail_open: bool = False
    outage: Outage = field(default_factory=lambda: Outage("Redis (per-key rate limits)"))
    _script: Any = None

    async def _run(self, step: str, key: Any, request_id: str, tokens: int = 0) -> None:
        if self._script is None:
            self._script = self.redis.register_script(_SCRIPT)
        names = [f"infer:rl:{key.name}:{suffix}" for suffix in ("times", "tokens", "total")]
        args = [step, request_id, key.rpm if key.rpm is not None else -1,
                key.tpm if key.tpm is not None else -1, tokens, WINDOW_S]
        try:
            ok, count, total, wait = await self._script(keys=names, args=args)
        except Exception as exc:
            if not redis_down(exc):
                raise
            failure = self.outage.failed(exc)
            if self.fail_open:
                return
            raise failure from None
        self.outage.ok()
        if ok or step == "settle":
            return
        total = float(total)
        remaining = {"requests": max(0, key.rpm - int(count)) if key.rpm else -1,
                     "tokens": max(0, int(key.tpm - total)) if key.tpm else -1}
        refused_requests = step == "start" and key.rpm is not None and int(count) >= key.rpm
        raise _refusal(key, "requests" if refused_requests else "tokens", float(wait), remaining)

    async def start(self, key: Any, request_id: str) -> None:
        await self._run("start", key, request_id)

    async def charge(self, key: Any, request_id: str, tokens: int) -> None:
        await self._run("charge", key, request_id, tokens)

    async def settle(self, key: Any, request_id: str, tokens: int) -> None:
        await self._run("settle", key, request_id, tokens)
