"""Who may call what: the one authorization policy of ``infer serve``, default-deny.

Every route of the app has an access class in :data:`ROUTES` (``"METHOD /path"``, the path as the
route declares it):

- ``public``: answered to anyone, credentials ignored (``/``, ``/api/version``, ``/health``,
  ``/ready``, the dashboard's static page files);
- ``caller``: any valid key (generation, embeddings, model reads, the ``/infer/*`` views a caller
  sees its own rows in);
- ``operator``: an operator key (model management: create, delete, copy, pull, push, blobs;
  ``/infer/cost``; ``/metrics`` and ``/openapi.json`` unless the config makes them public).

:meth:`AccessPolicy.build` refuses an app with a route that has no class (``infer serve`` does not
start; every test that builds the app fails), and a path that matches no route is ``caller``, so a
client without a key learns nothing from 404s. :meth:`AccessPolicy.decide` is pure: no I/O.

When auth is on (``INFER_API_KEYS`` set, or ``auth: {required: true}`` in the config), ``caller``
and ``operator`` routes need a key, sent as ``Authorization: Bearer <key>`` or ``x-api-key: <key>``
(Anthropic's SDKs send the latter). Operators are the ``INFER_API_KEYS`` keys and ledger keys
created with ``infer keys create NAME --operator``; other ledger keys are callers. When auth is off
every route is open, but a ledger key (``sk-infer-…``) that is sent must be valid: its budget and
limits then apply. Keys are compared by their sha256 (constant-time for ``INFER_API_KEYS``; a
ledger key is found by its hash, which is all the database holds).
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

LEDGER_PREFIX = "sk-infer-"


class Access(str, Enum):
    PUBLIC = "public"
    CALLER = "caller"
    OPERATOR = "operator"


PUBLIC, CALLER, OPERATOR = Access.PUBLIC, Access.CALLER, Access.OPERATOR

# Every route of the app, by method and declared path. A new route needs a line here.
ROUTES: dict[str, Access] = {
    "GET /": PUBLIC, "HEAD /": PUBLIC, "GET /api/version": PUBLIC, "HEAD /api/version": PUBLIC,
    "GET /health": PUBLIC, "GET /ready": PUBLIC,
    "GET /dashboard": PUBLIC, "GET /dashboard/": PUBLIC, "GET /dashboard/{name}": PUBLIC,
    # generation and embeddings
    "POST /api/generate": CALLER, "POST /api/chat": CALLER, "POST /api/embed": CALLER,
    "POST /api/embeddings": CALLER, "POST /v1/chat/completions": CALLER, "POST /v1/completions": CALLER,
    "POST /v1/embeddings": CALLER, "POST /v1/messages": CALLER, "POST /v1/messages/count_tokens": CALLER,
    "POST /v1/responses": CALLER,
    # a caller's key reads and deletes only the responses it stored
    "GET /v1/responses/{response_id}": CALLER, "DELETE /v1/responses/{response_id}": CALLER,
    # model reads
    "GET /api/tags": CALLER, "HEAD /api/tags": CALLER, "POST /api/show": CALLER, "GET /api/ps": CALLER,
    "GET /v1/models": CALLER, "GET /v1/models/{model:path}": CALLER,
    # the gateway's views (a caller's key sees its own rows and budget)
    "GET /infer/dashboard": CALLER, "GET /infer/requests": CALLER, "GET /infer/series": CALLER,
    "GET /infer/keys": CALLER, "GET /infer/routes": CALLER, "GET /infer/backends": CALLER,
    # every key's spend, the process's metrics, the API's schema
    "GET /infer/cost": OPERATOR, "GET /metrics": OPERATOR, "GET /openapi.json": OPERATOR,
    "HEAD /openapi.json": OPERATOR,
    # model management
    "POST /api/pull": OPERATOR, "POST /api/push": OPERATOR, "POST /api/create": OPERATOR,
    "DELETE /api/delete": OPERATOR, "POST /api/copy": OPERATOR,
    "HEAD /api/blobs/{digest}": OPERATOR, "POST /api/blobs/{digest}": OPERATOR,
}


def app_routes(routes: Iterable[Any]) -> Iterator[Any]:
    """Each route of an app (``path``, ``methods``, ``path_regex``), the included routers' flattened:
    FastAPI 0.16x keeps an included router as one object and gives its routes as contexts."""
    for route in routes:
        contexts = getattr(route, "effective_route_contexts", None)
        if contexts is not None:
            yield from contexts()
        else:
            yield route


class Unclassified(RuntimeError):
    """The app has a route without an access class."""


@dataclass(frozen=True)
class Principal:
    """Who a request's key says it is: a ledger key (``key``: its budget, limits, routes) or an
    ``INFER_API_KEYS`` key (``key`` None, an operator)."""

    name: str | None
    operator: bool
    key: Any = None  # ledger.keys.ApiKey

    def allows(self, model: str) -> bool:
        return self.key is None or self.key.allows(model)


@dataclass(frozen=True)
class Denial:
    status: int
    message: str


def credential_of(headers: dict[str, str]) -> str | None:
    """The key a request sends: ``Authorization: Bearer <key>``, else ``x-api-key: <key>``."""
    scheme, _, value = headers.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        return value.strip()
    return headers.get("x-api-key", "").strip() or None


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def is_operator_key(key: str, hashes: Iterable[str]) -> bool:
    """Whether ``key`` is one of ``hashes`` (sha256), comparing every one in constant time."""
    digest = hash_key(key)
    found = False
    for stored in hashes:
        found |= hmac.compare_digest(digest, stored)
    return found


@dataclass
class AccessPolicy:
    required: bool  # auth on: INFER_API_KEYS set or auth: {required: true}
    operator_hashes: frozenset[str] = frozenset()
    public: frozenset[str] = frozenset()  # "metrics", "docs": routes the config opens to everyone
    _static: dict[str, dict[str, Access]] = field(default_factory=dict)
    _dynamic: list[tuple[re.Pattern, dict[str, Access]]] = field(default_factory=list)

    @classmethod
    def build(cls, routes: Iterable[Any], *, required: bool, operator_hashes: frozenset[str] = frozenset(),
              public: Iterable[str] = ()) -> "AccessPolicy":
        """The policy for an app's ``routes`` (Starlette routes: ``path``, ``methods``, ``path_regex``)."""
        policy = cls(required, operator_hashes, frozenset(public))
        missing = []
        for route in app_routes(routes):
            classes = {}
            for method in sorted(getattr(route, "methods", None) or ()):
                access = ROUTES.get(f"{method} {route.path}")
                if access is None:
                    missing.append(f"{method} {route.path}")
                    continue
                classes[method] = policy._opened(route.path, access)
            if "{" in route.path:
                policy._dynamic.append((route.path_regex, classes))
            else:
                policy._static.setdefault(route.path, {}).update(classes)
        if missing:
            raise Unclassified(f"routes without an access class (add them to gateway/policy/access.py ROUTES): "
                               f"{', '.join(missing)}")
        return policy

    def _opened(self, path: str, access: Access) -> Access:
        if (path == "/metrics" and "metrics" in self.public) or (path == "/openapi.json" and "docs" in self.public):
            return PUBLIC
        return access

    def access(self, method: str, path: str) -> Access:
        """The class of a request: its route's (the strictest of the path's methods when the method is
        not one of them: the app answers 405), ``caller`` for a path no route has (404)."""
        classes = self._static.get(path)
        if classes is None:
            classes = next((c for regex, c in self._dynamic if regex.match(path)), None)
        if not classes:
            return CALLER
        found = classes.get(method)
        if found is None:
            found = max(classes.values(), key=_RANK.__getitem__)
        return found

    def operator(self, credential: str) -> bool:
        return bool(self.operator_hashes) and is_operator_key(credential, self.operator_hashes)

    def decide(self, access: Access, principal: Principal | None, credential: str | None) -> Denial | None:
        """None to let the request through, else why not. ``principal`` is who ``credential`` names
        (None: no credential, or one that names nobody)."""
        if access is PUBLIC:
            return None
        if credential is not None and principal is None and (self.required or credential.startswith(LEDGER_PREFIX)):
            return Denial(401, "invalid or revoked API key")
        if not self.required:
            return None
        if principal is None:
            return Denial(401, "this server requires an API key: send 'Authorization: Bearer <key>' "
                               "(or 'x-api-key: <key>')")
        if access is OPERATOR and not principal.operator:
            return Denial(403, "this route needs an operator key (one of INFER_API_KEYS, or a key made with "
                               "'infer keys create NAME --operator')")
        return None


_RANK = {PUBLIC: 0, CALLER: 1, OPERATOR: 2}


def exposure_warnings(*, host: str, loopback: bool, operator_keys: bool, required: bool,
                      public: Iterable[str] = ()) -> list[str]:
    """What ``infer serve`` says at start about who can reach what, every way auth can be set up:
    ``INFER_API_KEYS`` (operator keys), ``auth: {required: true}`` (ledger keys), neither."""
    public = tuple(public)
    if not operator_keys and not required:
        if loopback:
            return []
        return [f"warning: listening on {host}, beyond this machine, with auth off (no INFER_API_KEYS, no "
                "auth: {required: true} in the config): anyone who can reach this port can use every model and "
                "create, delete, copy, pull and push models (Host checks are off for a wildcard address)"]
    lines = []
    if not operator_keys:
        lines.append("auth is on with ledger keys only: model management, /infer/cost and /metrics need an "
                     "operator key (infer keys create NAME --operator)")
    if public and not loopback:
        opened = " and ".join({"metrics": "/metrics", "docs": "/openapi.json"}[name] for name in public)
        lines.append(f"warning: {opened} answer{'s' if len(public) == 1 else ''} without a key "
                     "(auth: public_metrics / public_docs in the config)")
    return lines
