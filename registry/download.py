"""Blob download: parallel ranged GETs into one sparse file, resumable, verified.

On-disk state is Ollama's, so either tool can resume the other's partial downloads::

    blobs/sha256-<hex>-partial      the data, pre-sized to the blob's size (sparse)
    blobs/sha256-<hex>-partial-N    JSON {"N", "Offset", "Size", "Completed"} for part N

The sha256 is computed while downloading: a hasher follows the contiguous completed
prefix of the file, so verification costs no second pass over the blob. The blob is
renamed into place only after its digest matched; a mismatch deletes the bad data.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import json
import logging
import os
import shutil
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from .client import RegistryClient
from .errors import DigestMismatch, DiskFull, ModelNotFound, RegistryError, RegistryUnreachable
from .fsutil import disk_errors
from .rangeget import RangeFailed, RangeGet, WriteFailed
from .names import parse_digest
from .store import Store

log = logging.getLogger(__name__)

PART_MIN = 100_000_000
PART_MAX = 1_000_000_000
HASH_CHUNK = 8 << 20
STATE_EVERY = 16 << 20


@dataclass
class Part:
    n: int
    offset: int
    size: int
    completed: int = 0

    @property
    def done(self) -> bool:
        return self.completed >= self.size

    def wire(self) -> dict:
        return {"N": self.n, "Offset": self.offset, "Size": self.size, "Completed": self.completed}


@dataclass(frozen=True)
class DownloadOptions:
    max_streams: int = 16
    part_size: int | None = None  # default: clamp(total/16, 100 MB, 1 GB), as Ollama
    max_retries: int = 6
    backoff: float = 1.0  # seconds; doubles on each retry
    stall_timeout: float = 30.0  # no byte for this long -> retry the part (not counted)


def plan_parts(total: int, part_size: int | None = None) -> list[Part]:
    size = part_size or min(max(total // 16, PART_MIN), PART_MAX)
    size = max(size, 1)
    return [Part(n, off, min(size, total - off)) for n, off in enumerate(range(0, total, size))] or [Part(0, 0, 0)]


class _Retry(Exception):
    """A part attempt failed in a way worth retrying."""

    def __init__(self, reason: str, *, counts: bool = True) -> None:
        super().__init__(reason)
        self.counts = counts


class BlobDownload:
    """Downloads one blob into the store. Use through ``download_blob``."""

    def __init__(self, client: RegistryClient, store: Store, url: str, digest: str, total: int,
                 on_bytes: Callable[[int], None], opts: DownloadOptions) -> None:
        self.client, self.store, self.url, self.total = client, store, url, total
        self.digest = parse_digest(digest)
        self.on_bytes, self.opts = on_bytes, opts
        self.data_path = store.partial_path(self.digest)
        self.parts: list[Part] = []
        self._progress = asyncio.Event()

    def state_path(self, n: int) -> Path:
        return self.data_path.with_name(f"{self.data_path.name}-{n}")

    # -- state --------------------------------------------------------------------------
    def load_or_plan(self) -> None:
        self.data_path.parent.mkdir(parents=True, exist_ok=True)
        self.parts = self._load_parts() or plan_parts(self.total, self.opts.part_size)
        if not self.data_path.exists() or self.data_path.stat().st_size != self.total:
            for part in self.parts:
                part.completed = 0
            self._check_free_space(self.total)
            with disk_errors(self.data_path), open(self.data_path, "wb") as fh:
                fh.truncate(self.total)
        else:
            self._check_free_space(sum(p.size - p.completed for p in self.parts))
        for part in self.parts:
            self.save_state(part)

    def _load_parts(self) -> list[Part]:
        parts = []
        for path in sorted(self.data_path.parent.glob(self.data_path.name + "-*")):
            try:
                raw = json.loads(path.read_text())
                parts.append(Part(int(raw["N"]), int(raw["Offset"]), int(raw["Size"]), int(raw["Completed"])))
            except (ValueError, KeyError, TypeError, OSError):
                return []  # unreadable state: start over rather than trust it
        parts.sort(key=lambda p: p.n)
        expected = 0
        for i, part in enumerate(parts):
            if part.n != i or part.offset != expected or not 0 <= part.completed <= part.size:
                return []
            expected += part.size
        return parts if expected == self.total else []

    def save_state(self, part: Part) -> None:
        path = self.state_path(part.n)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(part.wire()))
        os.replace(tmp, path)

    def _check_free_space(self, needed: int) -> None:
        free = shutil.disk_usage(self.data_path.parent).free
        if needed > free:
            raise DiskFull(f"not enough disk space in {self.data_path.parent}: need {needed:,} bytes, "
                           f"{free:,} free; free some space or point INFER_MODELS elsewhere")

    def contiguous(self) -> int:
        """Bytes from the start of the file that are known to be written."""
        done = 0
        for part in self.parts:
            done += part.completed
            if not part.done:
                break
        return done

    # -- running ------------------------------------------------------------------------
    async def run(self) -> None:
        self.load_or_plan()
        self.on_bytes(sum(p.completed for p in self.parts))
        fd = os.open(self.data_path, os.O_WRONLY)
        hasher = asyncio.create_task(self._hash())
        self._pool = ThreadPoolExecutor(self.opts.max_streams, thread_name_prefix="blob-part")
        try:
            sem = asyncio.Semaphore(self.opts.max_streams)
            await _run_all([self._run_part(part, fd, sem) for part in self.parts if not part.done])
            self._progress.set()
            got = await hasher
        finally:
            hasher.cancel()
            self._pool.shutdown(wait=True)
            for part in self.parts:
                with contextlib.suppress(OSError):
                    self.save_state(part)
            os.close(fd)
        self._finish(got)

    def _finish(self, got: str) -> None:
        if got != self.digest:
            self.discard()
            raise DigestMismatch(self.digest, got)
        self.store.commit_blob(self.data_path, self.digest, actual=got)
        self.discard()  # what is left: the part state files

    def discard(self) -> None:
        self.data_path.unlink(missing_ok=True)
        for path in self.data_path.parent.glob(self.data_path.name + "-*"):
            path.unlink(missing_ok=True)

    async def _hash(self) -> str:
        sha, done = hashlib.sha256(), 0
        fd = os.open(self.data_path, os.O_RDONLY)
        try:
            while done < self.total:
                target = self.contiguous()
                if target == done:
                    self._progress.clear()
                    await self._progress.wait()
                    continue
                done = await asyncio.to_thread(_hash_range, fd, sha, done, target)
        finally:
            os.close(fd)
        return "sha256:" + sha.hexdigest()

    async def _run_part(self, part: Part, fd: int, sem: asyncio.Semaphore) -> None:
        async with sem:
            failures = 0
            while not part.done:
                try:
                    await self._fetch(part, fd)
                except _Retry as exc:
                    failures += exc.counts
                    if failures > self.opts.max_retries:
                        raise RegistryUnreachable(f"download of {self.digest[:19]} failed after "
                                                  f"{failures} tries: {exc}; run the pull again to resume") from None
                    log.info("part %d: %s; retrying", part.n, exc)
                    await asyncio.sleep(self.opts.backoff * 2 ** (failures - 1) if exc.counts else 0)
                finally:
                    self.save_state(part)

    async def _fetch(self, part: Part, fd: int) -> None:
        start, end = part.offset + part.completed, part.offset + part.size - 1
        get = RangeGet(self.url, start, end, self.client.auth_headers(self.url), self.opts.stall_timeout)
        loop = asyncio.get_running_loop()
        # Progress crosses from the worker thread by call_soon_threadsafe; the loop runs those
        # callbacks in order, before it resumes this task with the thread's result.
        report = functools.partial(loop.call_soon_threadsafe, self._advance, part)
        future = loop.run_in_executor(self._pool, get.run, fd,
                                      functools.partial(self._check_response, start, end), report)
        try:
            await asyncio.shield(future)
        except asyncio.CancelledError:
            get.abort()  # the thread must be done writing before the file is closed
            await asyncio.gather(future, return_exceptions=True)
            raise
        except RangeFailed as exc:
            if exc.stalled:
                raise _Retry(f"stalled for {self.opts.stall_timeout:g}s", counts=False) from exc
            raise _Retry(str(exc)) from exc
        except WriteFailed as exc:
            with disk_errors(self.data_path):
                raise exc.__cause__ from None
        if not part.done:
            raise _Retry(f"connection ended {part.size - part.completed} bytes short")

    def _advance(self, part: Part, nbytes: int) -> None:
        before = part.completed
        part.completed += nbytes
        self.on_bytes(nbytes)
        self._progress.set()
        if part.completed // STATE_EVERY != before // STATE_EVERY:
            self.save_state(part)

    def _check_response(self, start: int, end: int, status: int, headers) -> None:
        """Runs in the worker thread before any byte is written."""
        if status >= 500 or status == 429:
            raise RangeFailed(f"server answered {status}")
        if status == 404:
            raise ModelNotFound(f"blob {self.digest} is gone from the registry (404)")
        if status == 206:
            want = f"bytes {start}-{end}/"
            if not (headers.get("content-range") or "").startswith(want):
                raise RegistryError(f"registry sent range {headers.get('content-range')!r}, asked {want}")
            return
        if status == 200 and start == 0 and end == self.total - 1:
            return  # server ignored Range, but we asked for the whole blob anyway
        raise RegistryError(f"unexpected {status} for a ranged blob request to {self.url}")


async def _run_all(coros: list) -> None:
    """Run coroutines concurrently; on the first failure cancel the rest, then re-raise it."""
    tasks = [asyncio.ensure_future(c) for c in coros]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        for task in done:
            if task.exception() is not None:
                raise task.exception()
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _hash_range(fd: int, sha: "hashlib._Hash", start: int, end: int) -> int:
    pos = start
    while pos < end:
        chunk = os.pread(fd, min(HASH_CHUNK, end - pos), pos)
        if not chunk:
            break
        sha.update(chunk)
        pos += len(chunk)
    return pos


async def download_blob(client: RegistryClient, store: Store, url: str, digest: str, total: int,
                        on_bytes: Callable[[int], None], opts: DownloadOptions | None = None) -> bool:
    """Fetch a blob into the store unless present; returns False on a cache hit.

    Concurrent pulls (threads, tasks or processes) of one blob share the work: the first
    holds the blob's lock and downloads, the others wait and then find it present.
    """
    if store.has_blob(digest):
        return False
    async with _blob_lock(store, digest):
        if store.has_blob(digest):
            return False
        await BlobDownload(client, store, url, digest, total, on_bytes, opts or DownloadOptions()).run()
    return True


@contextlib.asynccontextmanager
async def _blob_lock(store: Store, digest: str):
    while True:
        with store.blob_lock(digest, blocking=False) as held:
            if held:
                yield
                return
        await asyncio.sleep(0.1)
