"""Go-style durations: parse ``keep_alive`` values ("5m", "1h30m", "300", -1) and print ``3.1042s``."""

from __future__ import annotations

import math
import re

_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")


def parse_period(text: str) -> float:
    """Seconds of a reporting or budget period: a Go duration, or whole days (``30d``)."""
    text = text.strip()
    if text.endswith("d") and text[:-1].isdigit():
        return int(text[:-1]) * 86400.0
    return parse_duration(text)


def parse_duration(value: str | int | float) -> float:
    """Seconds from a number (seconds) or a Go duration string; negative means forever."""
    if isinstance(value, bool):
        raise ValueError(f"invalid duration {value!r}")
    if isinstance(value, (int, float)):
        return float(value)
    text = value.strip().strip("\"'")
    try:
        return float(text)
    except ValueError:
        pass
    sign = -1.0 if text.startswith("-") else 1.0
    body = text.lstrip("+-")
    pos, total = 0, 0.0
    for match in _PART.finditer(body):
        if match.start() != pos:
            break
        total += float(match.group(1)) * _UNITS[match.group(2)]
        pos = match.end()
    if not body or pos != len(body):
        raise ValueError(f"invalid duration {value!r}: use seconds or a form like 5m, 1h30m, 90s")
    return sign * total


MAX_KEEP_ALIVE_S = 9_223_372_036.0  # Go's longest time.Duration, about 292 years


def parse_keep_alive(value: str | int | float) -> float:
    """Seconds a model stays loaded: a duration up to ``MAX_KEEP_ALIVE_S``; negative means forever."""
    seconds = parse_duration(value)
    if not math.isfinite(seconds):
        raise ValueError(f"invalid duration {value!r}: not a finite number of seconds")
    if seconds > MAX_KEEP_ALIVE_S:
        raise ValueError(f"{value!r} is longer than the longest keep_alive ({MAX_KEEP_ALIVE_S:.0f} s, about 292 "
                         "years); a negative value keeps the model loaded for good")
    return seconds


def format_duration(seconds: float) -> str:
    """Go's ``time.Duration.String()``: ``3.104227711s``, ``199.402ms``, ``1m5.2s``, ``0s``."""
    ns = round(seconds * 1e9)
    if ns == 0:
        return "0s"
    sign, ns = ("-", -ns) if ns < 0 else ("", ns)
    if ns < 1_000:
        return f"{sign}{ns}ns"
    if ns < 1_000_000:
        return f"{sign}{_frac(ns, 1_000)}µs"
    if ns < 1_000_000_000:
        return f"{sign}{_frac(ns, 1_000_000)}ms"
    hours, rest = divmod(ns, 3_600 * 10**9)
    minutes, rest = divmod(rest, 60 * 10**9)
    out = f"{hours}h" if hours else ""
    out += f"{minutes}m" if hours or minutes else ""
    return f"{sign}{out}{_frac(rest, 10**9)}s"


def _frac(value: int, unit: int) -> str:
    whole, frac = divmod(value, unit)
    digits = len(str(unit)) - 1
    text = f"{frac:0{digits}d}".rstrip("0")
    return f"{whole}.{text}" if text else str(whole)
