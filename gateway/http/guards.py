"""Request guards, as one ASGI middleware: Host header, CORS, API keys, body size.

- Host guard (DNS-rebinding defence): when bound to loopback, a ``Host`` that is not loopback,
  private, unspecified, ``localhost``/``*.localhost``/``*.local``/``*.internal`` or this machine's
  hostname gets ``403`` with an empty body, as Ollama does.
- CORS: allowed origins are the Ollama defaults plus ``INFER_ORIGINS``; a disallowed ``Origin`` gets
  ``403`` with an empty body; a preflight on an allowed origin gets ``204``.
- API keys: the access policy (``gateway/policy/access.py``) decides, from the route's class and the
  key the request sends, whether it goes on (401, 403 otherwise; 503 with ``Retry-After`` when the
  ledger database cannot be asked about a key). Who the key names goes on in ``scope["state"]
  ["principal"]`` for the route (budgets, limits, a key's models, whose rows a view shows).
- Bodies larger than ``max_body_bytes`` get ``413`` before the route sees them (except blob
  uploads, ``/api/blobs/*``, which are streamed to disk and verified by digest); a prompt route's
  (``gateway/http/limits.py``) larger than ``max_prompt_bytes``, as parsing it holds the event loop.
"""

from __future__ import annotations

import ipaddress
import json
import socket

from gateway.policy.access import LEDGER_PREFIX, PUBLIC, AccessPolicy, Principal, credential_of
from gateway.http.errors import error_body
from gateway.http.limits import PROMPT_ROUTES
from gateway.http.outage import Unavailable
from core.settings import ServerSettings, env_name

ALLOWED_HEADERS = ", ".join([
    "Authorization", "Content-Type", "User-Agent", "Accept", "X-Requested-With", "OpenAI-Beta",
    "x-api-key", "anthropic-version", "anthropic-beta", "anthropic-dangerous-direct-browser-access",
    *(f"x-stainless-{h}" for h in ("arch", "async", "custom-poll-interval", "helper-method", "lang", "os",
                                    "package-version", "poll-helper", "retry-count", "runtime",
                                    "runtime-version", "timeout")),
])
ALLOWED_METHODS = "GET, POST, PUT, PATCH, DELETE, HEAD, OPTIONS"


class GuardMiddleware:
    def __init__(self, app, settings: ServerSettings):
        self.app = app
        self.settings = settings
        self._hostname = socket.gethostname().lower()
        self._hosts: dict[str, bool] = {}  # Host header -> allowed (a client sends the same one every time)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        if self.settings.is_loopback and not self._host_ok(headers.get("host", "")):
            return await _send(send, 403, b"")
        origin = headers.get("origin")
        if origin is not None and not self.settings.origin_allowed(origin):
            return await _send(send, 403, b"")
        if scope["method"] == "OPTIONS" and origin is not None:
            return await _send(send, 204, b"", self._cors_headers(origin))
        refusal = await self._authorize(scope, headers)
        if refusal is not None:
            status, message, extra = refusal
            body = json.dumps(error_body(scope["path"], status, message)).encode()
            return await _send(send, status, body, [(b"content-type", b"application/json"), *extra])
        limited = not scope["path"].startswith("/api/blobs/")  # model uploads are streamed to disk
        if limited and _content_length(headers) > self._limit(scope):
            return await self._too_large(scope, send)
        send = self._with_cors(send, origin)
        if not limited or "content-length" in headers:  # a declared length was checked above: nothing to count
            return await self.app(scope, receive, send)
        state = _BodyLimit()
        try:
            await self.app(scope, self._limited(receive, state, scope, send), state.guard(send))
        except Exception:
            if not state.answered:
                raise

    def _host_ok(self, host: str) -> bool:
        allowed = self._hosts.get(host)
        if allowed is None:
            allowed = self._host_allowed(host)
            if len(self._hosts) < 1024:  # bounded: a client cycling Host values gains nothing
                self._hosts[host] = allowed
        return allowed

    def _host_allowed(self, host: str) -> bool:
        name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
        name = name.strip("[]").lower()
        if not name or name in ("localhost", self._hostname) or name.endswith((".localhost", ".local", ".internal")):
            return True
        try:
            ip = ipaddress.ip_address(name)
        except ValueError:
            return False
        return ip.is_loopback or ip.is_private or ip.is_unspecified

    async def _authorize(self, scope, headers: dict[str, str]) -> tuple[int, str, list] | None:
        """None when the policy lets the request through (who it is then rides in the scope's state),
        else the answer's status, message and extra headers."""
        state = scope["app"].state
        policy: AccessPolicy = state.access
        access = policy.access(scope["method"], scope["path"])
        if access is PUBLIC:
            return None
        credential = credential_of(headers)
        try:
            principal = await _principal(credential, policy, state.keys)
        except Unavailable as exc:
            return 503, exc.message, [(b"retry-after", str(round(exc.retry_after)).encode())]
        denial = policy.decide(access, principal, credential)
        if denial is not None:
            return denial.status, denial.message, []
        scope.setdefault("state", {})["principal"] = principal
        return None

    def _cors_headers(self, origin: str) -> list[tuple[bytes, bytes]]:
        return [(b"access-control-allow-origin", origin.encode("latin-1")),
                (b"access-control-allow-methods", ALLOWED_METHODS.encode()),
                (b"access-control-allow-headers", ALLOWED_HEADERS.encode()),
                (b"access-control-max-age", b"43200"), (b"vary", b"Origin")]

    def _with_cors(self, send, origin: str | None):
        if origin is None:
            return send

        async def wrapped(message):
            if message["type"] == "http.response.start":
                message = dict(message)
                message["headers"] = [*message.get("headers", []),
                                      (b"access-control-allow-origin", origin.encode("latin-1")),
                                      (b"vary", b"Origin")]
            await send(message)
        return wrapped

    def _limited(self, receive, state: "_BodyLimit", scope, send):
        """Count the body as it arrives (chunked bodies have no Content-Length): past the limit, answer
        413 at once and tell the app the client is gone, so it stops reading and answers nothing."""
        seen = 0
        limit = self._limit(scope)

        async def wrapped():
            nonlocal seen
            if state.answered:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    await self._too_large(scope, send)
                    state.answered = True
                    return {"type": "http.disconnect"}
            return message
        return wrapped

    def _limit(self, scope) -> int:
        """The largest body the route takes: a prompt route's is ``max_prompt_bytes`` (parsing holds the loop)."""
        if scope["path"] in PROMPT_ROUTES:
            return min(self.settings.max_body_bytes, self.settings.max_prompt_bytes)
        return self.settings.max_body_bytes

    async def _too_large(self, scope, send) -> None:
        limit_mib = self._limit(scope) / (1 << 20)
        variable = env_name(ServerSettings, "max_prompt_bytes" if scope["path"] in PROMPT_ROUTES else "max_body_bytes")
        body = error_body(scope["path"], 413, f"request body too large (limit {limit_mib:g} MiB, {variable})")
        await _send(send, 413, json.dumps(body).encode(), [(b"content-type", b"application/json")])


class _BodyLimit:
    """Whether the guard has answered 413 itself; the app's own messages are then dropped."""

    def __init__(self) -> None:
        self.answered = False

    def guard(self, send):
        async def wrapped(message):
            if not self.answered:
                await send(message)
        return wrapped


async def _principal(credential: str | None, policy: AccessPolicy, keys) -> Principal | None:
    """Who ``credential`` names: an operator of INFER_API_KEYS, a live ledger key, or nobody."""
    if credential is None:
        return None
    if policy.operator(credential):
        return Principal(None, operator=True)
    if not credential.startswith(LEDGER_PREFIX):
        return None
    key = await keys.find(credential)
    if key is None or key.revoked:
        return None
    return Principal(key.name, operator=key.operator, key=key)


def _content_length(headers: dict[str, str]) -> int:
    try:
        return int(headers.get("content-length", "0"))
    except ValueError:
        return 0


async def _send(send, status: int, body: bytes, headers: list | None = None) -> None:
    headers = [*(headers or []), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
