"""The CLI as a client of a running server: ``infer serve`` (or Ollama) at ``INFER_HOST``/``OLLAMA_HOST``.

:func:`find_server` probes ``GET /api/version`` with a short timeout; a server that answers with a
version is used by ``infer run`` (its models stay warm, its ledger gets the row, ``keep_alive`` is
honoured), ``infer ps``, ``infer stop`` and ``infer --version``. Every failure is a
:class:`core.errors.BackendError` whose message is the server's ``error`` (one CLI line):
a 404 is :class:`ModelNotFound`, an unreachable server :class:`BackendUnavailable`.
``INFER_API_KEY`` is sent as ``Authorization: Bearer`` for a server that has ``INFER_API_KEYS``.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator, Mapping
from typing import Any

import httpx

from core.errors import BackendError, BackendUnavailable, ModelNotFound
from gateway.version import VERSION
from core.settings import ClientSettings, client_url

PROBE_TIMEOUT = 2.0  # seconds: nothing listening is refused at once; a busy server still answers in time
TIMEOUT = httpx.Timeout(None, connect=5.0)  # generation and pulls take as long as they take


class ServerClient:
    """Ollama API calls against one base URL; sync for commands, async streaming for chat turns."""

    def __init__(self, url: str, env: Mapping[str, str] | None = None) -> None:
        self.url = url
        self.headers = {"User-Agent": f"infer/{VERSION} (cli)", **ClientSettings.from_env(env).auth_headers}

    def version(self, timeout: float | None = None) -> str:
        body = self.call("GET", "/api/version", timeout=timeout)
        if not isinstance(body.get("version"), str):
            raise BackendError(f"{self.url} is not an Ollama-compatible server (no version)")
        return body["version"]

    def call(self, method: str, path: str, body: dict | None = None, *, timeout: float | None = None) -> dict:
        """One request answered with one JSON object (``{}`` for an empty body)."""
        try:
            r = httpx.request(method, self.url + path, json=body, headers=self.headers,
                              timeout=timeout or TIMEOUT)
        except httpx.HTTPError as exc:
            raise self.unreachable(exc) from None
        _raise_for_error(r.status_code, r.content)
        try:
            return r.json() if r.content else {}
        except ValueError:
            raise BackendError(f"{self.url}{path} answered something that is not JSON") from None

    def stream(self, path: str, body: dict) -> Iterator[dict]:
        """The NDJSON lines of a streamed answer (pull progress)."""
        try:
            with httpx.stream("POST", self.url + path, json=body, headers=self.headers, timeout=TIMEOUT) as r:
                if r.status_code >= 400:
                    _raise_for_error(r.status_code, r.read())
                for line in r.iter_lines():
                    if line.strip():
                        yield _line(line)
        except httpx.HTTPError as exc:
            raise self.unreachable(exc) from None

    async def astream(self, path: str, body: dict) -> AsyncIterator[dict]:
        """The NDJSON lines of a streamed generation; a line with ``error`` raises."""
        try:
            async with httpx.AsyncClient(timeout=TIMEOUT, headers=self.headers) as http:
                async with http.stream("POST", self.url + path, json=body) as r:
                    if r.status_code >= 400:
                        _raise_for_error(r.status_code, await r.aread())
                    async for line in r.aiter_lines():
                        if line.strip():
                            yield _line(line)
        except httpx.HTTPError as exc:
            raise self.unreachable(exc) from None

    def unreachable(self, exc: Exception) -> BackendUnavailable:
        if isinstance(exc, httpx.ConnectError):
            return BackendUnavailable(f"could not connect to a server at {self.url}; is 'infer serve' running?")
        return BackendUnavailable(f"the server at {self.url} failed: {exc or exc.__class__.__name__}")


class NotFound(ModelNotFound):
    """A 404 from the server, with its message (``model 'x' not found``)."""

    def __init__(self, message: str) -> None:
        BackendError.__init__(self, message, param="model")
        self.model = ""


def find_server(env: Mapping[str, str] | None = None) -> tuple[ServerClient, str] | None:
    """The server at INFER_HOST/OLLAMA_HOST and its version, if one answers the probe quickly."""
    client = ServerClient(client_url(env), env)
    try:
        return client, client.version(timeout=PROBE_TIMEOUT)
    except BackendError:
        return None


def _line(text: str) -> dict:
    try:
        data = json.loads(text)
    except ValueError:
        raise BackendError(f"the server sent a line that is not JSON: {text[:80]!r}") from None
    if isinstance(data, dict) and data.get("error"):
        raise BackendError(str(data["error"]))
    return data if isinstance(data, dict) else {}


def _raise_for_error(status: int, content: bytes) -> None:
    if status < 400:
        return
    message = _error_text(content) or f"the server answered {status}"
    raise NotFound(message) if status == 404 else BackendError(message)


def _error_text(content: bytes) -> str:
    """Ollama's ``{"error": "..."}`` or OpenAI's ``{"error": {"message": ...}}``, else the text."""
    try:
        data: Any = json.loads(content)
    except ValueError:
        return content.decode("utf-8", "replace").strip()[:200]
    error = data.get("error") if isinstance(data, dict) else None
    if isinstance(error, dict):
        error = error.get("message")
    return str(error) if error else ""
