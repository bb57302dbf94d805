"""Request arrival times (vLLM's ``get_request``): all at once, Poisson, or gamma with burstiness.

Gaps are gamma(shape=burstiness, scale=1/(rate*burstiness)), so burstiness 1 is Poisson, < 1 burstier,
> 1 steadier. With a known request count the cumulative offsets are rescaled so the last one lands at
exactly ``n / rate`` seconds, as vLLM does.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np


def arrival_offsets(num: int, rate: float, burstiness: float = 1.0, *, seed: int = 0) -> list[float]:
    """Seconds after the start at which each of ``num`` requests is sent."""
    if burstiness <= 0:
        raise ValueError("burstiness must be > 0")
    if math.isinf(rate):
        return [0.0] * num
    gaps = np.random.default_rng(seed).gamma(shape=burstiness, scale=1.0 / (rate * burstiness), size=num)
    offsets = np.cumsum(gaps)
    if num and offsets[-1] > 0:
        offsets *= (num / rate) / offsets[-1]
    return [float(x) for x in offsets]


def open_ended_offsets(rate: float, burstiness: float = 1.0, *, seed: int = 0) -> Iterator[float]:
    """Endless offsets for duration-limited runs (no rescaling: the count is not known)."""
    rng = np.random.default_rng(seed)
    t = 0.0
    while True:
        if not math.isinf(rate):
            t += float(rng.gamma(shape=burstiness, scale=1.0 / (rate * burstiness)))
        yield t
