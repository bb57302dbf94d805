"""Request bodies are JSON whatever their Content-Type, as Ollama and OpenAI servers treat them.

``curl -d '{...}'`` sends ``application/x-www-form-urlencoded``; clients in the wild also send no
Content-Type at all. FastAPI only parses JSON bodies declared as JSON, so this middleware declares
them: on API routes (not blob uploads), a missing or form Content-Type becomes ``application/json``.
"""

from __future__ import annotations

_REWRITE = (b"", b"application/x-www-form-urlencoded", b"text/plain")


class JSONBodies:
    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and _is_api_body(scope):
            scope = dict(scope)
            scope["headers"] = _as_json(scope["headers"])
        await self.app(scope, receive, send)


def _is_api_body(scope) -> bool:
    path = scope["path"]
    return (scope["method"] in ("POST", "PUT", "PATCH", "DELETE")
            and path.startswith(("/api/", "/v1/")) and not path.startswith("/api/blobs/"))


def _as_json(headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    current = next((v for k, v in headers if k.lower() == b"content-type"), b"")
    if current.split(b";")[0].strip().lower() not in _REWRITE:
        return headers
    kept = [(k, v) for k, v in headers if k.lower() != b"content-type"]
    return [*kept, (b"content-type", b"application/json")]
