"""One ranged GET of a blob, written straight into a file at its offset, in a worker thread.

This is the hot path of a pull. It uses the standard library's ``http.client`` and
``readinto`` a 4 MiB buffer, so the socket fills the buffer directly (``recv_into``, GIL
released) and Python runs a handful of calls per MiB. httpx hands out 64 KiB chunks through
several layers, which measured 3-10x slower than curl on loopback; it is still used for
everything else (manifests, HEAD, auth).

Honours ``HTTP(S)_PROXY``/``NO_PROXY`` and ``SSL_CERT_FILE`` like httpx does.
"""

from __future__ import annotations

import http.client
import os
import socket
import ssl
import urllib.request
from collections.abc import Callable
from urllib.parse import urljoin, urlsplit

BUFFER = 4 << 20
MAX_REDIRECTS = 5


class RangeFailed(Exception):
    """A transport failure; ``stalled`` when no byte arrived within the timeout."""

    def __init__(self, reason: str, *, stalled: bool = False) -> None:
        super().__init__(reason)
        self.stalled = stalled


class WriteFailed(Exception):
    """Writing to the local file failed (e.g. ENOSPC): not a transport problem, never retried."""


class RangeGet:
    def __init__(self, url: str, start: int, end: int, headers: dict[str, str], timeout: float) -> None:
        self.url, self.start, self.end = url, start, end
        self.headers = {**headers, "Range": f"bytes={start}-{end}", "Accept-Encoding": "identity"}
        self.timeout = timeout
        self._conn: http.client.HTTPConnection | None = None
        self._aborted = False

    def run(self, fd: int, check: Callable[[int, http.client.HTTPMessage], None],
            report: Callable[[int], None]) -> int:
        """Fetch and write; ``check(status, headers)`` vets the response first. Returns bytes written."""
        try:
            resp = self._open()
            check(resp.status, resp.headers)
            return self._copy(resp, fd, report)
        except (TimeoutError, socket.timeout) as exc:
            raise RangeFailed(f"no data for {self.timeout:g}s", stalled=True) from exc
        except (OSError, http.client.HTTPException) as exc:
            if self._aborted:
                raise RangeFailed("aborted") from exc
            raise RangeFailed(f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__) from exc
        finally:
            self.close()

    def abort(self) -> None:
        """Unblock a thread stuck in recv (called from another thread on cancellation)."""
        self._aborted = True
        conn = self._conn
        if conn is not None and conn.sock is not None:
            try:
                conn.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()

    def _open(self) -> http.client.HTTPResponse:
        url = self.url
        for _ in range(MAX_REDIRECTS + 1):
            self._conn, target = _connect(url, self.timeout)
            self._conn.request("GET", target, headers=self.headers)
            resp = self._conn.getresponse()
            if resp.status not in (301, 302, 303, 307, 308):
                return resp
            url = urljoin(url, resp.headers["location"])
            self.close()
        raise RangeFailed(f"more than {MAX_REDIRECTS} redirects fetching {self.url}")

    def _copy(self, resp: http.client.HTTPResponse, fd: int, report: Callable[[int], None]) -> int:
        pos, end = self.start, self.end + 1
        view = memoryview(bytearray(min(BUFFER, max(1, end - pos))))
        while pos < end and not self._aborted:
            n = resp.readinto(view[: min(len(view), end - pos)])
            if not n:
                break
            try:
                os.pwrite(fd, view[:n], pos)
            except OSError as exc:
                raise WriteFailed(str(exc)) from exc
            pos += n
            report(n)
        if pos < end and not self._aborted and resp.read(1):
            raise RangeFailed("server sent more bytes than the range asked for")
        return pos - self.start


def _connect(url: str, timeout: float) -> tuple[http.client.HTTPConnection, str]:
    """A connection for ``url`` (through a proxy when the environment says so) and the request target."""
    parts = urlsplit(url)
    target = parts.path + (f"?{parts.query}" if parts.query else "")
    proxy = _proxy_for(parts.scheme, parts.hostname or "")
    if parts.scheme == "https":
        ctx = _ssl_context()
        if proxy:
            conn = http.client.HTTPSConnection(proxy.hostname, proxy.port or 8080, timeout=timeout, context=ctx)
            conn.set_tunnel(parts.hostname, parts.port or 443)
        else:
            conn = http.client.HTTPSConnection(parts.hostname, parts.port or 443, timeout=timeout, context=ctx)
        return conn, target
    if proxy:
        return http.client.HTTPConnection(proxy.hostname, proxy.port or 8080, timeout=timeout), url
    return http.client.HTTPConnection(parts.hostname, parts.port or 80, timeout=timeout), target


def _proxy_for(scheme: str, host: str):
    proxies = urllib.request.getproxies()
    if scheme not in proxies or urllib.request.proxy_bypass(host):
        return None
    return urlsplit(proxies[scheme])


_SSL: ssl.SSLContext | None = None


def _ssl_context() -> ssl.SSLContext:
    global _SSL
    if _SSL is None:
        import certifi

        _SSL = ssl.create_default_context(cafile=os.environ.get("SSL_CERT_FILE") or certifi.where())
    return _SSL
