"""Blobs: ``GET/HEAD …/blobs/<digest>`` streams a complete blob, single byte ranges too."""

from __future__ import annotations

import asyncio
import os
import re
import stat

from fastapi import Request, Response
from starlette.types import Receive, Scope, Send

from ..store import Store
from .common import CHUNK, OCIError, check_digest

_RANGE_RE = re.compile(r"bytes=(\d*)-(\d*)")


def parse_range(header: str | None, size: int) -> tuple[int, int] | None:
    """(start, end inclusive) for one satisfiable ``bytes=`` range; None = serve it all."""
    match = _RANGE_RE.fullmatch(header.strip()) if header else None
    if not match or match.groups() == ("", ""):
        return None  # absent, multi-range or malformed: RFC 9110 says ignore it
    first, last = match.groups()
    if not first:  # a suffix: the last n bytes
        if int(last) == 0 or size == 0:
            raise _unsatisfiable(size)
        return max(size - int(last), 0), size - 1
    start = int(first)
    if last and int(last) < start:
        return None
    if start >= size:
        raise _unsatisfiable(size)
    return start, min(int(last), size - 1) if last else size - 1


def _unsatisfiable(size: int) -> OCIError:
    return OCIError(416, "RANGE_NOT_SATISFIABLE", "requested range not satisfiable",
                    {"Content-Range": f"bytes */{size}"})


class BlobResponse(Response):
    """Streams ``length`` bytes of an open file from ``start``: a raw ASGI response.

    The hot path of a pull. Reads are ``os.pread`` of CHUNK bytes on the event loop: from the
    page cache that is ~0.1 ms per MiB, and measured cheaper than a thread hop per chunk
    (which cost 20-30 % more CPU per GiB). The loop is yielded after every chunk so that other
    connections progress and a client that hangs up stops the read."""

    def __init__(self, fd: int, start: int, length: int, status_code: int, headers: dict[str, str]) -> None:
        super().__init__(status_code=status_code, headers=headers)
        self.fd, self.start, self.length = fd, start, length

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
            if scope["method"] == "HEAD" or self.length == 0:
                await send({"type": "http.response.body", "body": b""})
                return
            gone = asyncio.Event()
            watcher = asyncio.ensure_future(_wait_for_disconnect(receive, gone))
            try:
                await self._stream(send, gone)
            finally:
                watcher.cancel()
                await asyncio.gather(watcher, return_exceptions=True)
        finally:
            os.close(self.fd)

    async def _stream(self, send: Send, gone: asyncio.Event) -> None:
        offset, end = self.start, self.start + self.length
        if hasattr(os, "posix_fadvise"):  # Linux: read ahead aggressively
            os.posix_fadvise(self.fd, offset, self.length, os.POSIX_FADV_SEQUENTIAL)
        while offset < end and not gone.is_set():
            data = os.pread(self.fd, min(CHUNK, end - offset), offset)
            if not data:
                raise OSError(f"blob file shrank while being served (at byte {offset})")
            offset += len(data)
            await send({"type": "http.response.body", "body": data, "more_body": offset < end})
            await asyncio.sleep(0)


async def _wait_for_disconnect(receive: Receive, gone: asyncio.Event) -> None:
    try:
        while (await receive())["type"] != "http.disconnect":
            pass
    finally:
        gone.set()


def open_blob(store: Store, digest: str) -> tuple[int, int]:
    """(fd, size) of a complete blob; 404 for anything else (a ``-partial`` file is never named)."""
    try:
        fd = os.open(store.blob_path(check_digest(digest)), os.O_RDONLY)
    except FileNotFoundError:
        raise OCIError(404, "BLOB_UNKNOWN", f"blob unknown: {digest}") from None
    info = os.fstat(fd)
    if stat.S_ISREG(info.st_mode):
        return fd, info.st_size
    os.close(fd)
    raise OCIError(404, "BLOB_UNKNOWN", f"blob unknown: {digest}")


def blob_response(store: Store, request: Request, digest: str) -> BlobResponse:
    fd, size = open_blob(store, digest)
    try:
        byte_range = parse_range(request.headers.get("range"), size)
    except OCIError:
        os.close(fd)
        raise
    headers = {"Accept-Ranges": "bytes", "Content-Type": "application/octet-stream",
               "Docker-Content-Digest": digest, "ETag": f'"{digest}"'}
    start, end = byte_range or (0, size - 1)
    headers["Content-Length"] = str(end - start + 1)
    if byte_range:
        headers["Content-Range"] = f"bytes {start}-{end}/{size}"
    return BlobResponse(fd, start, end - start + 1, 206 if byte_range else 200, headers)
