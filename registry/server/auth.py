"""Optional auth: Basic ``user:password`` at ``/token`` buys a scoped, expiring, HMAC-signed bearer token."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import time

from fastapi import Request, Response
from fastapi.responses import JSONResponse

from ..names import ModelName
from .common import LOOSEST_HOST, OCIError, repo_name

SERVICE = "infer-registry"
TOKEN_TTL = 3600


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class TokenAuthority:
    """Issues and checks ``<payload>.<hmac>`` bearer tokens; the secret lives only in this process."""

    def __init__(self, credentials: str) -> None:
        user, sep, _ = credentials.partition(":")
        if not sep or not user:
            raise ValueError("registry auth must be 'user:password'")
        self._basic = base64.b64encode(credentials.encode()).decode()
        self._secret = secrets.token_bytes(32)
        self.user = user

    def check_basic(self, header: str | None) -> bool:
        scheme, _, value = (header or "").partition(" ")
        return scheme.lower() == "basic" and hmac.compare_digest(value.strip().encode(), self._basic.encode())

    def issue(self, scopes: list[str]) -> str:
        payload = _b64(json.dumps({"sub": self.user, "scopes": scopes, "exp": int(time.time()) + TOKEN_TTL}).encode())
        return f"{payload}.{self._sign(payload)}"

    def allows(self, header: str | None, repository: str | None, actions: tuple[str, ...]) -> bool:
        scheme, _, token = (header or "").partition(" ")
        payload, _, signature = token.strip().partition(".")
        if scheme.lower() != "bearer" or not hmac.compare_digest(signature.encode(), self._sign(payload).encode()):
            return False
        claims = json.loads(_unb64(payload))
        if claims["exp"] < time.time():
            return False
        return repository is None or any(_grants(s, repository, actions) for s in claims["scopes"])

    def _sign(self, payload: str) -> str:
        return _b64(hmac.new(self._secret, payload.encode(), hashlib.sha256).digest())


def _grants(scope: str, repository: str, actions: tuple[str, ...]) -> bool:
    kind, _, rest = scope.partition(":")
    repo, _, granted = rest.rpartition(":")
    return kind == "repository" and repo == repository and set(actions) <= set(granted.split(","))


def guard(request: Request, namespace: str, model: str, tag: str = "latest", host: str = LOOSEST_HOST) -> ModelName:
    """Validate the repository in the URL, then check the caller may use it; 400/401 otherwise."""
    name = repo_name(namespace, model, tag, host)
    authorize(request, namespace, model)
    return name


def authorize(request: Request, namespace: str | None = None, model: str | None = None) -> None:
    authority: TokenAuthority | None = request.app.state.auth
    if authority is None:
        return
    repository = f"{namespace}/{model}" if namespace else None
    actions = ("pull",) if request.method in ("GET", "HEAD") else ("pull", "push")
    if authority.allows(request.headers.get("authorization"), repository, actions):
        return
    realm = f"{request.url.scheme}://{request.headers.get('host', '')}/token"
    challenge = f'Bearer realm="{realm}",service="{SERVICE}"'
    if repository:
        challenge += f',scope="repository:{repository}:{",".join(actions)}"'
    raise OCIError(401, "UNAUTHORIZED", "authentication required", {"WWW-Authenticate": challenge})


def token_response(request: Request) -> Response:
    """``GET /token``: a token for the requested repository scopes ("anonymous" when auth is off)."""
    authority: TokenAuthority | None = request.app.state.auth
    if authority and not authority.check_basic(request.headers.get("authorization")):
        raise OCIError(401, "UNAUTHORIZED", "wrong user or password",
                       {"WWW-Authenticate": f'Basic realm="{SERVICE}"'})
    scopes = [s for s in request.query_params.getlist("scope") if s.startswith("repository:")]
    value = authority.issue(scopes) if authority else "anonymous"
    return JSONResponse({"token": value, "access_token": value, "expires_in": TOKEN_TTL})
