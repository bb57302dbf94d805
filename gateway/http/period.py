"""The ``since`` query parameter of the reporting endpoints: a period back from now.

``since_epoch("1h")`` is the epoch second one hour ago; a Go duration or whole days (``30d``), longer
than 0 (and, when given, at most ``most_s``). Anything else is a 400 naming ``since``.
"""

from __future__ import annotations

import time

from core.durations import parse_period
from gateway.http.errors import APIError


def since_epoch(text: str, most_s: float | None = None) -> float:
    try:
        seconds = parse_period(text)
    except ValueError as exc:
        raise APIError(400, f"since: {exc}", param="since") from None
    if seconds <= 0:
        raise APIError(400, "since: a period longer than 0", param="since")
    if most_s is not None and seconds > most_s:
        raise APIError(400, f"since: a period of at most {most_s / 86400:g}d", param="since")
    return time.time() - seconds
