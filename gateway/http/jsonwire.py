"""JSON on the wire: orjson bytes, and a response that carries them without FastAPI's encoder pass.

Routes on the request path return :class:`JSONBytes` instead of a dict: a dict return makes
FastAPI walk the whole body through ``jsonable_encoder`` before encoding it.
"""

from __future__ import annotations

from collections.abc import Sequence
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


def cost_header(cost_usd: float | None, gens: Sequence[Any] = ()) -> dict[str, str] | None:
    """``x-infer-cost-usd`` on a non-streaming answer whose backend is priced, and the gateway's notes."""
    headers = note_header(gens) or {}
    if cost_usd is not None:
        headers["x-infer-cost-usd"] = f"{cost_usd:.12f}".rstrip("0").rstrip(".") or "0"
    return headers or None


def note_header(gens: Sequence[Any]) -> dict[str, str] | None:
    """``x-infer-note``: why the gateway limited a generation's output (a key's budget or cap)."""
    notes = list(dict.fromkeys(g.note for g in gens if g.note))
    if not notes:
        return None
    return {"x-infer-note": "; ".join(notes).encode("latin-1", "replace").decode("latin-1")}
