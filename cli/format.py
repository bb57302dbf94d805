"""Human-readable sizes, rates and times, formatted the way Ollama's CLI prints them."""

from __future__ import annotations

import re
import time
from datetime import datetime

_UNITS = ((1e12, "TB"), (1e9, "GB"), (1e6, "MB"), (1e3, "KB"))


def human_bytes(n: float) -> str:
    """Decimal units; an integer at 10 and above, one decimal below: 352 MB, 1.1 GB, 59 B."""
    for scale, unit in _UNITS:
        if n >= scale:
            value = n / scale
            return f"{value:.0f} {unit}" if value >= 10 else f"{value:.1f} {unit}"
    return f"{int(n)} B"


def human_duration(seconds: float) -> str:
    """ETA as Ollama prints it: 16s, 59m59s, 1h2m, 99h+."""
    seconds = int(seconds)
    if seconds >= 100 * 3600:
        return "99h+"
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes}m"
    return f"{minutes}m{secs}s" if minutes else f"{secs}s"


def human_time_ago(timestamp: float, now: float | None = None) -> str:
    return f"{human_span((now or time.time()) - timestamp)} ago"


def human_until(timestamp: float, now: float | None = None) -> str:
    """``ollama ps``'s UNTIL: ``4 minutes from now``, ``Forever``, ``Stopping...`` once past."""
    delta = timestamp - (now or time.time())
    if delta > 20 * 365 * 86400:
        return "Forever"
    return f"{human_span(delta)} from now" if delta > 0 else "Stopping..."


def human_span(delta: float) -> str:
    """Go's ``format.humanDuration``: ``Less than a second``, ``About a minute``, ``4 minutes``, ``2 days``."""
    delta = max(0.0, delta)
    if delta < 1:
        return "Less than a second"
    steps = ((60, 1, "second"), (3600, 60, "minute"), (86400, 3600, "hour"),
             (7 * 86400, 86400, "day"), (30 * 86400, 7 * 86400, "week"),
             (365 * 86400, 30 * 86400, "month"))
    for limit, unit, word in steps:
        if delta < limit:
            count = int(delta // unit)
            if count == 1 and word in ("minute", "hour"):
                return f"About {'an' if word == 'hour' else 'a'} {word}"
            return f"{count} {word}{'s' if count != 1 else ''}"
    years = int(delta // (365 * 86400))
    return f"{years} year{'s' if years != 1 else ''}"


def table(rows: list[list[str]]) -> str:
    """Left-aligned columns separated by at least four spaces (like Ollama's list)."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["    ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    return "\n".join(lines)


def parse_time(text: str | None) -> float:
    """Epoch seconds of an RFC 3339 time as Go writes it (nanoseconds, ``Z``); 0 when absent."""
    if not text:
        return 0.0
    text = re.sub(r"(\.\d{6})\d+", r"\1", text.replace("Z", "+00:00"))
    return datetime.fromisoformat(text).timestamp()
