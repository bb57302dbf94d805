"""JSON on the wire: orjson bytes, and a response that carries them without FastAPI's encoder pass.

Routes on the request path return :class:`JSONBytes` instead of a dict: a dict return makes
FastAPI walk the whole body through ``jsonable_encoder`` before encoding it.
"""

from __future__ import annotations

from typing import Any

import orjson
from starlette.responses import Response


def dumps(obj: Any) -> bytes:
    """Compact UTF-8 JSON (no spaces, non-ASCII kept as is)."""
    return orjson.dumps(obj)


class JSONBytes(Response):
    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return dumps(content)
