"""One writer thread per process that batches ledger rows off the event loop.

``submit(record)`` stamps the row (ULID and time of the request's end) and queues it; it never
blocks, never touches the database and wakes the writer thread only for the first row of a batch
(a wake-up per row costs the event loop a GIL hand-over each). The writer thread sleeps ``flush_s``
after that first row, then inserts everything queued, ``batch_rows`` per transaction, with a
SQLAlchemy Core ``insert`` (executemany). When the database is locked or unreachable the
batch is kept and retried with exponential backoff; rows are only ever dropped when the queue
holds ``max_pending`` rows (bounded memory), and then every dropped row is counted and logged as
an error. ``close()`` flushes every queued row before it returns (graceful shutdown).

``settle(key, hold, taken, actual, period_start)`` queues an API key's budget settlement
(``ledger.keys.settle``) the same way: the writer applies a batch's settlements after its rows, one
transaction per hold (a lease's requests share one), so a keyed request costs the event loop no
thread hop of its own (the hold is released up to ``flush_s`` later, which only makes admission more
careful).

An unreachable database is logged once when the outage starts and once when it ends (how long,
how many rows waited), not on every retry.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass

from sqlalchemy import Engine
from sqlalchemy.exc import SQLAlchemyError

from .keys import settle
from .tables import UsageRecord
from .usage import insert_rows, stamp

log = logging.getLogger(__name__)

@dataclass(frozen=True)
class WriterSettings:
    batch_rows: int = 256         # rows per transaction at most
    flush_s: float = 0.05         # how long the first row of a batch waits for company
    max_pending: int = 100_000    # rows queued before new ones are dropped (and counted)
    retry_initial_s: float = 0.05
    retry_max_s: float = 2.0


class LedgerWriter:
    def __init__(self, db: Engine, settings: WriterSettings | None = None) -> None:
        self.db = db
        self.settings = settings or WriterSettings()
        self._rows: deque[dict] = deque()
        self._settles: deque[tuple[str, str, float, float, float]] = deque()
        self._down_since: float | None = None  # monotonic time the database became unreachable
        self._has_rows = threading.Event()  # set once per batch, not once per row: no thread wake-up per row
        self._stopping = threading.Event()
        self._written = 0
        self.dropped = 0
        self.failed_attempts = 0
        self._idle = threading.Condition()
        self._pending = 0
        self._thread = threading.Thread(target=self._run, name="ledger-writer", daemon=True)
        self._thread.start()

    @property
    def written(self) -> int:
        return self._written

    def submit(self, record: UsageRecord) -> None:
        """Queue one row; cheap, thread-safe, never blocks."""
        with self._idle:
            if self._pending >= self.settings.max_pending:
                self.dropped += 1
                log.error("usage ledger queue full (%d rows pending): dropped a row for model %r "
                          "(%d dropped so far)", self._pending, record.model, self.dropped)
                return
            self._pending += 1
        self._rows.append(stamp(record))
        if not self._has_rows.is_set():
            self._has_rows.set()

    def settle(self, key_name: str, hold_id: str, taken: float, actual: float, period_start: float) -> None:
        """Queue turning ``taken`` of a key's hold into its actual spend; thread-safe, never blocks."""
        with self._idle:
            self._pending += 1
        self._settles.append((key_name, hold_id, taken, actual, period_start))
        if not self._has_rows.is_set():
            self._has_rows.set()

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every row submitted so far is written (or dropped); False on timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._idle:
            while self._pending:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                self._idle.wait(remaining)
        return True

    def close(self, timeout: float | None = 30.0) -> None:
        """Write everything queued, then stop the thread."""
        if not self._thread.is_alive():
            return
        self._stopping.set()
        self._has_rows.set()
        self._thread.join(timeout)
        if self._thread.is_alive() or self._pending:
            log.error("usage ledger: %d row(s) could not be written before shutdown", self._pending)

    # -- the writer thread ------------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            self._has_rows.wait()
            self._stopping.wait(self.settings.flush_s)  # let the batch fill; submitters do not wake us meanwhile
            self._has_rows.clear()
            batch, settles = self._take_all(), self._take_settles()
            if batch:
                self._write(batch)
            if settles:
                self._settle(settles)
            if self._stopping.is_set() and not self._rows and not self._settles:
                return

    def _take_all(self) -> list[dict]:
        rows = []
        while self._rows:
            rows.append(self._rows.popleft())
        return rows

    def _take_settles(self) -> list[tuple[str, str, float, float, float]]:
        settles = []
        while self._settles:
            settles.append(self._settles.popleft())
        return settles

    def _settle(self, settles: list[tuple[str, str, float, float, float]]) -> None:
        by_hold: dict[tuple[str, str, float], list[float]] = {}
        for name, hold_id, taken, actual, period_start in settles:
            total = by_hold.setdefault((name, hold_id, period_start), [0.0, 0.0])
            total[0] += taken
            total[1] += actual
        for (name, hold_id, start), (taken, actual) in by_hold.items():
            self._retrying(lambda: settle(self.db, name, hold_id, taken, actual, start))
        self._done(len(settles))

    def _retrying(self, work) -> None:
        """``work()`` until the database takes it: a locked or unreachable database is waited for, with
        backoff; the outage is logged when it starts and when it ends."""
        delay = self.settings.retry_initial_s
        while True:
            try:
                work()
            except (SQLAlchemyError, OSError) as exc:
                self.failed_attempts += 1
                if self._down_since is None:
                    self._down_since = time.monotonic()
                    log.warning("usage ledger: the database is unreachable or locked (%s); rows and settlements "
                                "wait in memory and are written when it is back", _short(exc))
                time.sleep(delay)
                delay = min(delay * 2, self.settings.retry_max_s)
                continue
            if self._down_since is not None:
                log.warning("usage ledger: the database is back after %.1f s; %d row(s) and settlement(s) waited",
                            time.monotonic() - self._down_since, self._pending)
                self._down_since = None
            return

    def _write(self, batch: list[dict]) -> None:
        for start in range(0, len(batch), self.settings.batch_rows):
            chunk = batch[start:start + self.settings.batch_rows]
            self._retrying(lambda: insert_rows(self.db, chunk))
            self._done(len(chunk))

    def _done(self, count: int) -> None:
        with self._idle:
            self._written += count
            self._pending -= count
            if not self._pending:
                self._idle.notify_all()


def _short(exc: BaseException) -> str:
    return str(exc).splitlines()[0][:200]
