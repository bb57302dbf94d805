"""HTTP side of the registry protocol: manifests, blob locations, bearer-token auth.

Every httpx exception is translated in one place (``map_http_errors``) into the registry
error tree, so callers only ever see RegistryError subclasses.
"""

from __future__ import annotations

import base64
import contextlib
import platform
import re
from collections.abc import Iterator
from urllib.parse import urlencode, urljoin, urlsplit

import httpx

from . import __version__
from .errors import AuthError, ModelNotFound, RegistryError, RegistryHTTPError, RegistryUnreachable
from .manifest import MANIFEST_MEDIA_TYPE
from .names import ModelName

USER_AGENT = f"infer/{__version__} ({platform.machine()} {platform.system().lower()})"
DEFAULT_TIMEOUT = httpx.Timeout(connect=10.0, read=30.0, write=30.0, pool=30.0)
_CHALLENGE_RE = re.compile(r'(\w+)="([^"]*)"')


@contextlib.contextmanager
def map_http_errors(url: str) -> Iterator[None]:
    """The one translation point from httpx exceptions to RegistryError."""
    host = urlsplit(url).netloc or url
    try:
        yield
    except httpx.TimeoutException as exc:
        raise RegistryUnreachable(f"registry {host} timed out ({type(exc).__name__}); check your connection and retry") from exc
    except (httpx.ConnectError, httpx.NetworkError, httpx.ProxyError) as exc:
        raise RegistryUnreachable(
            f"could not reach registry {host} ({exc or type(exc).__name__}); are you offline, "
            "or is the registry address wrong?"
        ) from exc
    except httpx.RemoteProtocolError as exc:
        raise RegistryUnreachable(f"registry {host} closed the connection early: {exc}") from exc
    except httpx.HTTPError as exc:
        raise RegistryError(f"HTTP error talking to {host}: {exc}") from exc


class RegistryClient:
    """Wraps an injected ``httpx.AsyncClient``; adds auth and error mapping."""

    def __init__(self, http: httpx.AsyncClient | None = None, *, basic_auth: str | None = None) -> None:
        self.http = http or httpx.AsyncClient(timeout=DEFAULT_TIMEOUT, headers={"User-Agent": USER_AGENT})
        self._owns_http = http is None
        self._basic = base64.b64encode(basic_auth.encode()).decode() if basic_auth else None
        self._tokens: dict[str, str] = {}  # host -> bearer token

    async def aclose(self) -> None:
        if self._owns_http:
            await self.http.aclose()

    async def __aenter__(self) -> "RegistryClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # -- generic request with the bearer challenge -----------------------------------
    async def request(self, method: str, url: str, *, headers: dict[str, str] | None = None,
                      content: bytes | None = None, follow_redirects: bool = True) -> httpx.Response:
        """Send a request; on a 401 bearer challenge fetch a token and retry once."""
        resp = await self._send(method, url, headers, content, follow_redirects)
        if resp.status_code == 401 and "bearer" in resp.headers.get("www-authenticate", "").lower():
            await self._authenticate(url, resp.headers["www-authenticate"])
            resp = await self._send(method, url, headers, content, follow_redirects)
        if resp.status_code in (401, 403):
            raise AuthError(f"registry {urlsplit(url).netloc} refused access ({resp.status_code}); "
                            "check INFER_REGISTRY_AUTH (user:password) for this registry")
        return resp

    def auth_headers(self, url: str) -> dict[str, str]:
        token = self._tokens.get(urlsplit(url).netloc)
        return {"Authorization": f"Bearer {token}"} if token else {}

    async def _send(self, method: str, url: str, headers: dict[str, str] | None,
                    content: bytes | None, follow_redirects: bool) -> httpx.Response:
        merged = {**self.auth_headers(url), **(headers or {})}
        with map_http_errors(url):
            return await self.http.request(method, url, headers=merged, content=content,
                                           follow_redirects=follow_redirects)

    async def _authenticate(self, url: str, challenge: str) -> None:
        params = dict(_CHALLENGE_RE.findall(challenge))
        realm = params.pop("realm", None)
        if not realm:
            raise AuthError(f"registry {urlsplit(url).netloc} sent a bearer challenge without a realm")
        headers = {}
        if self._basic and urlsplit(realm).netloc == urlsplit(url).netloc:
            headers["Authorization"] = f"Basic {self._basic}"  # credentials never leave the host
        token_url = f"{realm}?{urlencode(params)}" if params else realm
        with map_http_errors(token_url):
            resp = await self.http.get(token_url, headers=headers)
        if resp.status_code != 200:
            raise AuthError(f"token request to {realm} failed ({resp.status_code}); "
                            "check INFER_REGISTRY_AUTH (user:password) for this registry")
        body = resp.json()
        token = body.get("token") or body.get("access_token")
        if not token:
            raise AuthError(f"token endpoint {realm} returned no token")
        self._tokens[urlsplit(url).netloc] = token

    # -- registry operations ----------------------------------------------------------
    async def get_manifest(self, name: ModelName) -> bytes:
        """Raw manifest bytes, unchanged (the model ID is their sha256)."""
        resp = await self.request("GET", name.manifest_url, headers={"Accept": MANIFEST_MEDIA_TYPE})
        if resp.status_code == 404:
            raise ModelNotFound(f"model '{name.display}' not found on {name.host}; check the name "
                                "and tag (e.g. 'qwen2:0.5b')")
        raise_for_status(resp, f"pull model manifest for {name.display}")
        return resp.content

    async def blob_location(self, name: ModelName, digest: str) -> str:
        """The URL to fetch blob bytes from: a same-host redirect chain is followed, the first
        cross-host redirect (a CDN) is returned without being fetched, as Ollama does."""
        url = name.blob_url(digest)
        for _ in range(10):
            resp = await self.request("HEAD", url, follow_redirects=False)
            if resp.is_redirect:
                target = urljoin(url, resp.headers["location"])
                if urlsplit(target).netloc != urlsplit(url).netloc:
                    return target
                url = target
                continue
            if resp.status_code == 404:
                raise ModelNotFound(f"blob {digest} not found on {name.host} for {name.display}")
            if resp.status_code == 405:
                return url  # registry without HEAD support; GET will tell
            raise_for_status(resp, f"locate blob {digest}")
            return url
        raise RegistryError(f"too many redirects locating blob {digest}")


def raise_for_status(resp: httpx.Response, doing: str) -> None:
    """RegistryHTTPError carrying the registry's own message: the OCI ``errors`` list when the
    body has one (``CODE: message; …``), else the start of the body."""
    if resp.status_code < 400:
        return
    try:
        message = "; ".join(f"{e.get('code')}: {e.get('message')}" for e in resp.json()["errors"])
    except (ValueError, KeyError, TypeError, AttributeError):
        message = resp.text.strip().replace("\n", " ")[:200]
    raise RegistryHTTPError(f"{doing}: {resp.status_code}: {message}", resp.status_code)
