"""Outages of what keys need (the ledger database, Redis): one 503 per request, one log line per outage.

A request that needs the database (a key's lookup, a budget hold) or Redis (a key's rate limits)
while it is unreachable gets ``503`` with ``Retry-After`` (:class:`Unavailable`), never a 500. An
:class:`Outage` tracks one dependency: its first failure logs a warning, the failures after it are
only counted, and the first success after it logs how long it lasted (from the first failure
noticed) and how many calls failed.
"""

from __future__ import annotations

import logging
import threading
import time

from gateway.http.errors import APIError

log = logging.getLogger(__name__)

RETRY_AFTER_S = 5.0


class Unavailable(APIError):
    """A dependency of the request is down: 503 with ``Retry-After``."""

    def __init__(self, message: str, retry_after: float = RETRY_AFTER_S):
        super().__init__(503, message)
        self.retry_after = retry_after


def database_down(exc: BaseException) -> bool:
    """Whether ``exc`` says the database cannot be reached (rather than that a statement is wrong)."""
    from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError

    if isinstance(exc, (OperationalError, InterfaceError, OSError)):
        return True
    return isinstance(exc, DBAPIError) and bool(exc.connection_invalidated)


def redis_down(exc: BaseException) -> bool:
    try:
        from redis.exceptions import ConnectionError as RedisConnectionError, TimeoutError as RedisTimeout
    except ImportError:  # redis is only needed with --redis-url
        return False
    return isinstance(exc, (RedisConnectionError, RedisTimeout, OSError))


class Outage:
    """The state of one dependency, shared by the event loop and worker threads."""

    def __init__(self, what: str):
        self.what = what
        self.since: float | None = None  # monotonic time of the first failure of the current outage
        self.failures = 0
        self.outages = 0
        self._lock = threading.Lock()

    @property
    def down(self) -> bool:
        return self.since is not None

    def failed(self, exc: BaseException) -> Unavailable:
        """Note one failure (logged only when it starts an outage); the 503 to answer."""
        with self._lock:
            first = self.since is None
            if first:
                self.since = time.monotonic()
                self.outages += 1
            self.failures += 1
        if first:
            log.warning("%s is unreachable (%s); requests that need it get 503 until it is back",
                        self.what, str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__)
        return Unavailable(f"{self.what} is unreachable; retry shortly")

    def ok(self) -> None:
        """Note a success: the end of an outage, if one was going on."""
        if self.since is None:
            return
        with self._lock:
            since, failures, self.since, self.failures = self.since, self.failures, None, 0
        if since is not None:
            log.warning("%s is back after %.1f s (%d call(s) failed meanwhile)", self.what,
                        time.monotonic() - since, failures)
