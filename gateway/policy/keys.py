"""API keys on the request path: who a key is (looked up off the event loop, cached for a few
seconds), its per-minute limits (``gateway/policy/ratelimit.py``) and the holds on its budget.

- ``find``: the ledger key a request sends (``sk-infer-…``), by its hash; the access policy
  (``gateway/policy/access.py``) decides what it may call. The database down: 503 with Retry-After.
- budgets: :meth:`KeyBook.hold` holds a request's maximum cost before it runs (``ledger.keys``:
  hold rows that expire ``hold_ttl_s`` after their last renewal, which this replica makes every
  quarter of it while their request runs), and the request
  settles it to its actual cost when it ends (through the ledger writer). A hold that reaches the
  database also holds room for ``LEASE_REQUESTS`` more such requests: this replica's *lease*, from
  which its next requests take their hold in memory (no statement, no thread hop). The lease is a
  hold like any other, so replicas together still cannot pass a budget; its unused room goes back
  after ``LEASE_IDLE_S`` without a request on that key, at shutdown, and with the hold's expiry if
  this replica dies. A lease is used only within its key's budget period and while its renewal
  keeps reaching the database.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Engine

from core.errors import BackendOverloaded
from ledger.keys import ApiKey, Hold, find_key, renew, reserve, settle

from gateway.http.outage import Outage, Unavailable, database_down
from gateway.policy.ratelimit import MemoryWindows, RedisWindows, Windows

log = logging.getLogger(__name__)

CACHE_S = 2.0
LEASE_REQUESTS = 8   # a reservation that goes to the database takes room for this many more requests
LEASE_IDLE_S = 1.0   # a lease's unused room goes back to the budget after this long without a request


class OverBudget(BackendOverloaded):
    """A key's budget cannot cover this request (429)."""


@dataclass(frozen=True)
class Claim:
    """A request's part of a hold: ``taken`` dollars of hold ``hold.id`` (its own, or a lease's)."""

    hold: Hold
    taken: float


@dataclass
class Lease:
    hold: Hold | None = None
    held: float = 0.0  # room of the hold not handed to a request yet
    used_at: float = 0.0  # loop time of the last claim from it
    renewed_at: float = 0.0  # monotonic time its hold was last made or renewed
    timer: asyncio.TimerHandle | None = None  # gives the room back LEASE_IDLE_S after used_at


@dataclass
class KeyBook:
    db: Engine
    redis: Any = None  # redis.asyncio.Redis when the limits are shared between replicas
    fail_open: bool = False  # Redis down: requests go on without their rate limits (else 503)
    hold_ttl_s: float = 60.0  # a hold nobody renews is released this long after its last renewal
    windows: Windows = field(init=False)
    database: Outage = field(default_factory=lambda: Outage("the ledger database (API keys and budgets)"))
    _cache: dict[str, tuple[float, ApiKey | None]] = field(default_factory=dict)
    _finding: dict[str, asyncio.Future] = field(default_factory=dict)  # lookups in flight, by key
    _leases: dict[str, Lease] = field(default_factory=dict)
    _holds: dict[str, Hold] = field(default_factory=dict)  # requests' own holds, renewed while they run
    _renewer: asyncio.Task | None = None
    _returning: set[asyncio.Task] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.windows = RedisWindows(self.redis, self.fail_open) if self.redis is not None else MemoryWindows()

    # -- who --------------------------------------------------------------------------------------

    async def find(self, credential: str) -> ApiKey | None:
        """The ledger key ``credential`` names (revoked ones included), None for none; a burst on a
        cold cache asks the database once. While the database is down, a key seen before is taken
        as it was last read (a key never seen gets 503)."""
        now = time.monotonic()
        cached = self._cache.get(credential)
        if cached is not None and now - cached[0] < CACHE_S:
            return cached[1]
        running = self._finding.get(credential)
        if running is None:
            running = self._finding[credential] = asyncio.ensure_future(self._db(find_key, self.db, credential))
            running.add_done_callback(lambda _: self._finding.pop(credential, None))
            running.add_done_callback(_quietly)
        try:
            key = await asyncio.shield(running)
        except Unavailable:
            if cached is None:
                raise
            return cached[1]
        if len(self._cache) > 10_000:
            self._cache.clear()
        self._cache[credential] = (now, key)
        return key

    async def _db(self, work, *args, **kwargs):
        """``work(*args, **kwargs)`` in a worker thread; the database unreachable: 503 (logged once per
        outage). A pooled connection the database dropped (it restarted) is retried once on a new one."""
        for attempt in (1, 2):
            try:
                result = await asyncio.to_thread(work, *args, **kwargs)
                break
            except Exception as exc:
                if attempt == 1 and getattr(exc, "connection_invalidated", False):
                    continue
                if database_down(exc):
                    raise self.database.failed(exc) from None
                raise
        self.database.ok()
        return result

    # -- budgets ----------------------------------------------------------------------------------

    async def hold(self, key: ApiKey, wanted: float, minimum: float) -> Claim | None:
        """Hold ``wanted`` dollars of ``key``'s budget (less, down to ``minimum``, when that is all it
        has left): from this replica's lease, else from the database (a new lease when the budget has
        room for one); None when not even ``minimum`` fits."""
        claim = self.take(key.name, wanted)
        if claim is not None:
            return claim
        self._retire(key.name)  # too short, stale or past its period: its claims keep its row alive
        extra = wanted * LEASE_REQUESTS
        found = await self._db(reserve, self.db, key.name, wanted + extra, wanted + extra, ttl_s=self.hold_ttl_s)
        if found is not None:
            self._retire(key.name)  # (a concurrent request may have made one meanwhile)
            lease = self._leases[key.name]
            lease.hold, lease.held, lease.renewed_at = found, extra, time.monotonic()
            self._touch(key.name, lease)
            return self._claim(found, wanted)
        claim = self.take(key.name, wanted)  # a concurrent request may have made the lease meanwhile
        if claim is not None:
            return claim
        own = await self._db(reserve, self.db, key.name, wanted, minimum, ttl_s=self.hold_ttl_s)
        return None if own is None else self._claim(own, own.amount)

    def take(self, key_name: str, amount: float) -> Claim | None:
        """``amount`` from this replica's lease on the key, in memory; None when it is short, past its
        period or not renewed lately."""
        lease = self._leases.get(key_name)
        if lease is None or lease.hold is None or lease.held + 1e-12 < amount:
            return None
        end = lease.hold.period_end
        if (end is not None and time.time() >= end) or time.monotonic() - lease.renewed_at > self.hold_ttl_s / 2:
            return None
        lease.held -= amount
        self._touch(key_name, lease)
        return self._claim(lease.hold, amount)

    def _claim(self, hold: Hold, amount: float) -> Claim:
        """A request's part of ``hold``; the hold is renewed while claims on it are unsettled."""
        self._holds[hold.id] = (hold, self._holds.get(hold.id, (hold, 0))[1] + 1)
        self._start_renewing()
        return Claim(hold, amount)

    def released(self, claim: Claim) -> None:
        """A request's claim was settled (or queued to be): it no longer keeps its hold alive."""
        hold, claims = self._holds.pop(claim.hold.id, (claim.hold, 1))
        lease = self._leases.get(hold.key_name)
        if claims > 1 or (lease is not None and lease.hold is not None and lease.hold.id == hold.id):
            self._holds[hold.id] = (hold, claims - 1)

    def _retire(self, key_name: str) -> None:
        """This replica stops taking from the key's lease: the room it still had goes back to the budget."""
        lease = self._leases.setdefault(key_name, Lease())
        hold, held = lease.hold, lease.held
        lease.hold, lease.held = None, 0.0
        if hold is None:
            return
        entry = self._holds.get(hold.id)
        if entry is not None and entry[1] <= 0:
            del self._holds[hold.id]
        if held > 1e-12:
            self._background(self._db(settle, self.db, key_name, hold.id, held, 0.0, hold.period_start))

    def _touch(self, key_name: str, lease: Lease) -> None:
        """The lease was used now: one timer per lease, re-armed at its expiry if it was used since."""
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
            lease.timer = None
            self._retire(key_name)

    def _background(self, work) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._returning.add(task)
        task.add_done_callback(_quietly)
        task.add_done_callback(self._returning.discard)

    # -- renewal ----------------------------------------------------------------------------------

    def _start_renewing(self) -> None:
        if self._renewer is None or self._renewer.done():
            self._renewer = asyncio.get_running_loop().create_task(self._renew_forever())

    async def _renew_forever(self) -> None:
        while self._holds:
            await asyncio.sleep(self.hold_ttl_s / 4)
            try:
                await self.renew_now()
            except Exception:  # the database is down: logged once by its Outage; the next round retries
                continue

    async def renew_now(self) -> None:
        """Extend every hold this replica keeps (its leases, and the holds its running requests have
        claims on); a lease whose hold is gone (expired, or its period restarted) is dropped."""
        gone = await self._db(renew, self.db, list(self._holds), self.hold_ttl_s)
        now = time.monotonic()
        for lease in self._leases.values():
            if lease.hold is None:
                continue
            if lease.hold.id in gone:
                lease.hold, lease.held = None, 0.0
            else:
                lease.renewed_at = now

    async def aclose(self) -> None:
        """Shutdown: every lease's unused room goes back to its budget."""
        if self._renewer is not None:
            self._renewer.cancel()
        for name, lease in list(self._leases.items()):
            if lease.timer is not None:
                lease.timer.cancel()
            self._retire(name)
        await asyncio.gather(*self._returning, return_exceptions=True)


def _quietly(task: asyncio.Task) -> None:
    """A background settlement that failed (the database is down) was logged by its Outage."""
    if not task.cancelled():
        task.exception()
