"""Every exception httpx exports maps into the project's error tree, with a sentence naming the backend,
and error statuses map to the right class (bad requests pass the backend's words through)."""

from __future__ import annotations

import inspect

import aiohttp
import httpx
import pytest

from core.errors import (BackendError, BackendOverloaded, BackendProtocolError, BackendTimeout,
                                  BackendUnavailable, InvalidRequest)
from adapters.remote.http_errors import error_from_status, map_transport_error
from adapters.remote.base import RemoteSettings, Timeouts, error_message
from adapters.remote.registry import REMOTE_TYPES, create_remote

WHERE = "vllm backend 'pub' at http://10.0.0.1:8000"
HTTPX_ERRORS = sorted((obj for name in httpx.__all__ if inspect.isclass(obj := getattr(httpx, name))
                       and issubclass(obj, Exception)), key=lambda cls: cls.__name__)

EXPECTED = {
    "ConnectTimeout": BackendTimeout, "ReadTimeout": BackendTimeout, "WriteTimeout": BackendTimeout,
    "PoolTimeout": BackendTimeout, "TimeoutException": BackendTimeout,
    "ConnectError": BackendUnavailable, "ReadError": BackendUnavailable, "WriteError": BackendUnavailable,
    "CloseError": BackendUnavailable, "NetworkError": BackendUnavailable, "ProxyError": BackendUnavailable,
    "UnsupportedProtocol": BackendUnavailable, "InvalidURL": BackendUnavailable,
    "HTTPStatusError": BackendUnavailable,  # a 500 here
}


def instance(cls: type[Exception]) -> Exception:
    request = httpx.Request("POST", "http://10.0.0.1:8000/v1/completions")
    if issubclass(cls, httpx.HTTPStatusError):
        return cls("boom", request=request, response=httpx.Response(500, request=request))
    if issubclass(cls, httpx.RequestError):
        return cls("boom", request=request)
    if issubclass(cls, httpx.StreamError) and cls is not httpx.StreamError:
        return cls()
    return cls("boom")


def test_httpx_exports_what_this_test_walks():
    assert len(HTTPX_ERRORS) >= 25  # a new httpx release with new classes still gets mapped (next test)


@pytest.mark.parametrize("cls", HTTPX_ERRORS, ids=lambda c: c.__name__)
def test_every_httpx_exception_is_mapped(cls):
    error = map_transport_error(instance(cls), WHERE, Timeouts(connect=2, read=7))
    assert isinstance(error, BackendError) and type(error) is not BackendError
    assert isinstance(error, EXPECTED.get(cls.__name__, BackendProtocolError)), cls.__name__
    assert WHERE in error.message
    assert 500 <= error.status < 600


@pytest.mark.parametrize("kind", REMOTE_TYPES)
def test_each_adapter_maps_through_its_one_point(kind):
    backend = create_remote(RemoteSettings(name="pub", type=kind, base_url="http://10.0.0.1:8000", model="m",
                                           timeouts=Timeouts(connect=2)))
    for cls in HTTPX_ERRORS:
        assert isinstance(backend.to_error(instance(cls)), BackendError)
    assert "within 2 s" in backend.to_error(instance(httpx.ConnectTimeout)).message
    assert "is unreachable" in backend.to_error(instance(httpx.ConnectError)).message


@pytest.mark.parametrize(("status", "cls", "http"), [
    (400, InvalidRequest, 400), (422, InvalidRequest, 400), (413, InvalidRequest, 400),
    (401, BackendUnavailable, 502), (404, BackendUnavailable, 502), (408, BackendTimeout, 504),
    (429, BackendOverloaded, 429), (500, BackendUnavailable, 502), (502, BackendUnavailable, 502),
    (503, BackendUnavailable, 502), (504, BackendTimeout, 504),
])
def test_status_mapping(status, cls, http):
    error = error_from_status(WHERE, status, "the words of the backend")
    assert type(error) is cls and error.status == http
    assert "the words of the backend" in error.message
    if cls is InvalidRequest:
        assert error.message == "the words of the backend"  # the client's fault: passed through as is


def test_retry_after_is_kept():
    error = error_from_status(WHERE, 503, "busy", httpx.Headers({"Retry-After": "7"}))
    assert isinstance(error, BackendOverloaded) and error.retry_after == 7.0
    assert error_from_status(WHERE, 429, "slow down").retry_after == 1.0


@pytest.mark.parametrize(("body", "message"), [
    (b'{"error": {"message": "bad temperature", "type": "BadRequestError", "param": null, "code": 400}}',
     "bad temperature"),
    (b'{"object": "error", "message": "flat vLLM", "type": "BadRequestError", "param": null, "code": 400}', "flat vLLM"),
    (b'{"error": "Input validation error: `temperature` must be strictly positive", "error_type": "validation"}',
     "Input validation error: `temperature` must be strictly positive"),
    (b'{"detail": [{"msg": "field required"}]}', "field required"),
    (b"upstream connect error", "upstream connect error"),
])
def test_error_bodies_of_every_shape(body, message):
    assert error_message(body) == message


@pytest.mark.parametrize("make,expected,words", [
    (lambda: aiohttp.ServerDisconnectedError(), BackendUnavailable, "dropped the connection"),
    (lambda: aiohttp.ClientOSError(104, "Connection reset by peer"), BackendUnavailable, "dropped the connection"),
    (lambda: aiohttp.ClientPayloadError("Response payload is not completed"), BackendUnavailable, "dropped"),
    (lambda: aiohttp.SocketTimeoutError("read"), BackendTimeout, "read timeout"),
    (lambda: aiohttp.ConnectionTimeoutError("connect"), BackendTimeout, "connect timeout"),
    (lambda: aiohttp.ServerTimeoutError("slow"), BackendTimeout, "timed out"),
    (lambda: aiohttp.InvalidURL("nope://x"), BackendUnavailable, "invalid base_url"),
    (lambda: aiohttp.ClientError("odd"), BackendProtocolError, "broke the HTTP protocol"),
])
def test_aiohttp_errors_under_httpx_map_by_what_happened(make, expected, words):
    """The pool is aiohttp's (httpx-aiohttp); its translation into httpx classes is lossy, so the cause decides."""
    cause = make()
    wrapped = httpx.ConnectTimeout("lossy translation")
    wrapped.__cause__ = cause
    for exc in (wrapped, cause):
        error = map_transport_error(exc, WHERE, Timeouts())
        assert type(error) is expected and words in error.message and WHERE in error.message
