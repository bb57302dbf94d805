"""Every exception aiohttp exports (the remote backends' one HTTP client) maps into the project's error tree,
with a sentence naming the backend, and error statuses map to the right class (bad requests pass the
backend's words through)."""

from __future__ import annotations

import inspect
from types import SimpleNamespace

import aiohttp
import pytest
from multidict import CIMultiDict, CIMultiDictProxy
from yarl import URL

from core.errors import (BackendError, BackendOverloaded, BackendProtocolError, BackendTimeout,
                                  BackendUnavailable, InvalidRequest)
from adapters.remote.http_errors import error_from_status, map_transport_error
from adapters.remote.base import RemoteSettings, Timeouts, error_message
from adapters.remote.registry import REMOTE_TYPES, create_remote

WHERE = "vllm backend 'pub' at http://10.0.0.1:8000"
CLIENT_ERRORS = sorted((obj for name in aiohttp.__all__ if inspect.isclass(obj := getattr(aiohttp, name))
                        and issubclass(obj, aiohttp.ClientError)), key=lambda cls: cls.__name__)
URL_ = URL("http://10.0.0.1:8000/v1/completions")
KEY = SimpleNamespace(host="10.0.0.1", port=8000, ssl=True, is_ssl=True)

EXPECTED = {
    "ConnectionTimeoutError": (BackendTimeout, "connect timeout"), "SocketTimeoutError": (BackendTimeout, "read timeout"),
    "ServerTimeoutError": (BackendTimeout, "timed out"),
    "InvalidURL": (BackendUnavailable, "invalid base_url"), "InvalidUrlClientError": (BackendUnavailable, "invalid base_url"),
    "InvalidUrlRedirectClientError": (BackendUnavailable, "invalid base_url"),
    "NonHttpUrlClientError": (BackendUnavailable, "invalid base_url"),
    "NonHttpUrlRedirectClientError": (BackendUnavailable, "invalid base_url"),
    "ClientPayloadError": (BackendUnavailable, "dropped the connection"),
}
for name in ("ClientConnectorError", "ClientConnectorDNSError", "ClientConnectorSSLError", "ClientSSLError",
             "ClientConnectorCertificateError", "ClientProxyConnectionError"):
    EXPECTED[name] = (BackendUnavailable, "is unreachable")
for name in ("ClientConnectionError", "ClientConnectionResetError", "ClientOSError", "ServerConnectionError",
             "ServerDisconnectedError", "ServerFingerprintMismatch"):
    EXPECTED[name] = (BackendUnavailable, "dropped the connection")


def instance(cls: type[Exception]) -> Exception:
    if issubclass(cls, aiohttp.ClientResponseError):
        info = aiohttp.RequestInfo(URL_, "POST", CIMultiDictProxy(CIMultiDict()), URL_)
        return cls(info, (), status=500, message="boom")
    if issubclass(cls, aiohttp.ClientConnectorCertificateError):
        return cls(KEY, ValueError("bad certificate"))
    if issubclass(cls, aiohttp.ClientConnectorError):
        return cls(KEY, OSError(111, "Connection refused"))
    if issubclass(cls, aiohttp.ServerFingerprintMismatch):
        return cls(b"a", b"b", "10.0.0.1", 8000)
    return cls("boom")


def test_aiohttp_exports_what_this_test_walks():
    assert len(CLIENT_ERRORS) >= 25  # a new aiohttp release with new classes still gets mapped (next test)


@pytest.mark.parametrize("cls", CLIENT_ERRORS, ids=lambda c: c.__name__)
def test_every_aiohttp_client_error_is_mapped(cls):
    error = map_transport_error(instance(cls), WHERE, Timeouts(connect=2, read=7))
    expected, words = EXPECTED.get(cls.__name__, (BackendProtocolError, "broke the HTTP protocol"))
    assert type(error) is expected and words in error.message, cls.__name__
    assert WHERE in error.message
    assert 500 <= error.status < 600


def test_a_calls_own_time_limit_is_a_timeout():
    error = map_transport_error(TimeoutError(), WHERE, Timeouts())
    assert type(error) is BackendTimeout and WHERE in error.message


@pytest.mark.parametrize("kind", REMOTE_TYPES)
def test_each_adapter_maps_through_its_one_point(kind):
    backend = create_remote(RemoteSettings(name="pub", type=kind, base_url="http://10.0.0.1:8000", model="m",
                                           timeouts=Timeouts(connect=2)))
    for cls in CLIENT_ERRORS:
        assert isinstance(backend.to_error(instance(cls)), BackendError)
    assert "within 2 s" in backend.to_error(aiohttp.ConnectionTimeoutError("connect")).message
    assert "is unreachable" in backend.to_error(instance(aiohttp.ClientConnectorError)).message


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
    error = error_from_status(WHERE, 503, "busy", CIMultiDictProxy(CIMultiDict({"Retry-After": "7"})))
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
