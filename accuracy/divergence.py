"""KL divergence between two next-token distributions, and the summary statistics of many positions.

Definitions follow llama.cpp's ``llama-perplexity --kl-divergence``: at each position
KL(A‖B) = Σ_v p_A(v) · (log p_A(v) − log p_B(v)), with A the reference (the base logits) and B the
model under test; "same top" is the share of positions where B's most likely token is A's; Δp is
p_B(t) − p_A(t) for the token t that A chose.

Two ways to compute one position's KL:

- ``kl_rows``: exact, over the whole vocabulary, from two rows of log-probabilities (our engines).
- ``kl_buckets``: from the log-probabilities of a set S of tokens known on both sides (an API's
  top-k), plus one bucket for the rest of the vocabulary whose mass is 1 − Σ_S p. Merging tokens
  into one bucket can only lose information, so this is a lower bound of the exact KL (the
  data-processing inequality); it is exact when S holds every token A gives mass to.

Numbers are float64 throughout; no torch here.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

# A bucket that one side reports as empty still gets this much mass, so that a rounding API
# (top-k probabilities that add up to 1.0000001) gives a large, finite KL instead of infinity.
MIN_TAIL = 1e-12
PERCENTILES = (99.9, 99.0, 95.0, 90.0, 50.0, 10.0, 5.0, 1.0)


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """Rows of logits -> rows of log-probabilities, in float64."""
    x = np.asarray(logits, dtype=np.float64)
    shifted = x - x.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def kl_rows(logp_a: np.ndarray, logp_b: np.ndarray) -> np.ndarray:
    """Exact KL(A‖B) per row of two [n, V] (or [V]) log-probability arrays."""
    a, b = np.asarray(logp_a, dtype=np.float64), np.asarray(logp_b, dtype=np.float64)
    if a.shape != b.shape:
        raise ValueError(f"the two sides' rows differ in shape: {a.shape} vs {b.shape}")
    p = np.exp(a)
    with np.errstate(invalid="ignore"):  # -inf - -inf where p = 0: masked out
        return (p * np.where(p > 0, a - b, 0.0)).sum(axis=-1)


def tail_mass(logprobs: Sequence[float]) -> float:
    """1 − Σ exp(logprobs): the probability left for every token not listed (never below 0)."""
    return max(0.0, 1.0 - math.fsum(math.exp(lp) for lp in logprobs))


def kl_buckets(logp_a: Sequence[float], logp_b: Sequence[float]) -> float:
    """KL(A‖B) over the listed tokens (the same tokens, in the same order, on both sides) plus one
    bucket for the rest of the vocabulary. A lower bound of the exact KL."""
    if len(logp_a) != len(logp_b):
        raise ValueError(f"{len(logp_a)} log-probabilities for A but {len(logp_b)} for B")
    listed = math.fsum(math.exp(a) * (a - b) for a, b in zip(logp_a, logp_b, strict=True))
    tail_a, tail_b = tail_mass(logp_a), tail_mass(logp_b)
    if tail_a == 0.0:
        return listed
    return listed + tail_a * (math.log(tail_a) - math.log(max(tail_b, MIN_TAIL)))


@dataclass(frozen=True, slots=True)
class Summary:
    """Statistics of per-position values, as llama-perplexity prints them (mean ± standard error)."""

    count: int
    mean: float
    stderr: float
    max: float
    min: float
    percentiles: dict[str, float]  # "99.9" -> value, ..., "50.0" is the median

    @property
    def median(self) -> float:
        return self.percentiles["50.0"]

    def as_dict(self) -> dict:
        return {"count": self.count, "mean": self.mean, "stderr": self.stderr, "max": self.max, "min": self.min,
                "median": self.median, "percentiles": self.percentiles}


def summarize(values: Sequence[float]) -> Summary | None:
    """Mean ± standard error of the mean, max, min and percentiles; None for no values."""
    x = np.asarray([v for v in values if v is not None], dtype=np.float64)
    if x.size == 0:
        return None
    stderr = float(x.std(ddof=1) / math.sqrt(x.size)) if x.size > 1 else 0.0
    pct = {f"{q:.1f}": float(np.percentile(x, q)) for q in PERCENTILES}
    return Summary(int(x.size), float(x.mean()), stderr, float(x.max()), float(x.min()), pct)


def share(hits: int, n: int) -> tuple[float, float]:
    """A share and its standard error sqrt(p(1 − p)/n) (llama-perplexity's "Same top p ± ...")."""
    if n == 0:
        return math.nan, math.nan
    p = hits / n
    return p, math.sqrt(p * (1 - p) / n)


def rms(values: Sequence[float]) -> float:
    x = np.asarray(values, dtype=np.float64)
    return float(np.sqrt((x * x).mean())) if x.size else math.nan
