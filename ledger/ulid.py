"""ULIDs: a 48-bit millisecond timestamp then 80 random bits, as 26 Crockford base32 characters.

Ids sort by creation time. Within one millisecond a process increments the random part instead of
drawing a new one (the spec's monotonic mode), so ids from one process also sort in creation order.
Kept rather than python-ulid (which does the same, monotonic by default): the ledger needs one function
returning a string, and 40 lines with no dependency cost less than a package and its ``ULID`` objects.
"""

from __future__ import annotations

import os
import threading
import time

ALPHABET = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
_RANDOM_BITS = 80
_lock = threading.Lock()
_last = (-1, 0)  # (timestamp_ms, random part) of the previous id


def new_ulid(timestamp_ms: int | None = None) -> str:
    """A new ULID for ``timestamp_ms`` (default: now)."""
    global _last
    ms = time.time_ns() // 1_000_000 if timestamp_ms is None else timestamp_ms
    with _lock:
        last_ms, last_random = _last
        if ms == last_ms and last_random + 1 < 1 << _RANDOM_BITS:
            random = last_random + 1
        else:
            random = int.from_bytes(os.urandom(_RANDOM_BITS // 8), "big")
        _last = (ms, random)
    return encode(ms << _RANDOM_BITS | random)


def encode(value: int) -> str:
    """130-bit zero-padded Crockford base32, most significant character first."""
    chars = []
    for _ in range(26):
        value, digit = divmod(value, 32)
        chars.append(ALPHABET[digit])
    return "".join(reversed(chars))
