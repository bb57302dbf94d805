"""HTTP failures -> the project's error tree, shared by every remote adapter.

Two functions: :func:`map_transport_error` for anything the remote backends' HTTP client
(aiohttp, ``adapters/remote/client.py``) raises — ``tests/adapters/test_http_errors.py`` walks its
exception classes — and :func:`error_from_status` for an error status with the backend's message. A backend's 400/422 is
the client's fault and passes through with the backend's own words; everything else names the
backend, so an operator can tell which server failed. :class:`Timeouts` (a backend entry's limits)
lives here because the timeout errors quote them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import aiohttp

from core.errors import (BackendError, BackendOverloaded, BackendProtocolError, BackendTimeout,
                                  BackendUnavailable, InvalidRequest)


@dataclass(frozen=True)
class Timeouts:
    """Seconds. ``first_byte`` runs from arrival to the first streamed chunk."""

    connect: float = 5.0
    first_byte: float = 120.0
    read: float = 120.0  # a silent gap inside a reply; as long as first_byte, so a long prefill is not cut
    total: float = 600.0


def map_transport_error(exc: BaseException, where: str, timeouts: Timeouts | None = None) -> BackendError:
    """An aiohttp failure (connection, timeout, protocol, bad URL) as a BackendError."""
    detail = str(exc) or type(exc).__name__
    if isinstance(exc, aiohttp.ConnectionTimeoutError):
        limit = f" within {timeouts.connect:g} s" if timeouts else ""
        return BackendTimeout(f"{where} did not accept a connection{limit} (connect timeout)")
    if isinstance(exc, aiohttp.SocketTimeoutError):
        limit = f" for {timeouts.read:g} s" if timeouts else ""
        return BackendTimeout(f"{where} sent nothing{limit} (read timeout)")
    if isinstance(exc, TimeoutError):
        return BackendTimeout(f"{where} timed out: {detail}")
    if isinstance(exc, aiohttp.ClientConnectorError):
        return BackendUnavailable(f"{where} is unreachable ({detail}); is the server running?")
    if isinstance(exc, (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError, aiohttp.ClientPayloadError,
                        aiohttp.ClientConnectionError)):
        return BackendUnavailable(f"{where} dropped the connection ({type(exc).__name__}: {detail})")
    if isinstance(exc, (aiohttp.InvalidURL, aiohttp.NonHttpUrlClientError)):
        return BackendUnavailable(f"{where}: invalid base_url ({detail}); use http://host:port")
    return BackendProtocolError(f"{where} broke the HTTP protocol ({type(exc).__name__}: {detail})")


def error_from_status(where: str, status: int, message: str, headers: Mapping[str, str] | None = None, *,
                      param: str | None = None, code: str | int | None = None) -> BackendError:
    """An error reply (status + the backend's message, and the ``param``/``code`` its body named) as a
    BackendError; a client error keeps the backend's ``param`` and ``code``."""
    error = _by_status(where, status, message or f"HTTP {status}", _retry_after(headers), param, code)
    error.backend_status = status
    return error


def _by_status(where: str, status: int, message: str, retry_after: float | None, param: str | None,
               code: str | int | None) -> BackendError:
    if status in (400, 413, 422) or (400 <= status < 500 and status not in (401, 403, 404, 408, 429)):
        return InvalidRequest(message, param=param, code=code)
    if status == 429 or (status == 503 and retry_after is not None):
        return BackendOverloaded(f"{where} is overloaded: {message}", retry_after=retry_after or 1.0)
    if status in (401, 403):
        return BackendUnavailable(f"{where} refused our credentials ({status}: {message}); check api_key_env")
    if status == 404:
        return BackendUnavailable(f"{where} answered 404 ({message}); check the entry's model and base_url")
    if status in (408, 504):
        return BackendTimeout(f"{where} timed out ({status}: {message})")
    return BackendUnavailable(f"{where} failed ({status}: {message})")


def _retry_after(headers: Mapping[str, str] | None) -> float | None:
    value = headers.get("retry-after") if headers is not None else None
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None  # an HTTP date: rare from model servers; the client's own backoff applies
