"""Bill-conserving $ per million input and output tokens for one load point.

The bill for the point is ``price_per_hour * gpus * duration / 3600``. Output tokens weigh ``k`` input
tokens, where ``k`` = prefill tok/s ÷ decode tok/s measured on the same requests: prefill rate =
Σ prompt tokens / Σ TTFT, decode rate = Σ (output − 1) / Σ (E2EL − TTFT). Then
``c_in = bill / (T_in + k·T_out)``, ``c_out = k·c_in``, and ``c_in·T_in + c_out·T_out`` equals the bill
exactly (``metrics-and-cost.md`` §4.2). Idle time inside the window is billed too: this is the
realised price of the run; at saturation it is the capacity price.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .records import RequestRecord


@dataclass(frozen=True)
class Pricing:
    price_per_hour: float
    gpus: int = 1
    output_weight: float | None = None  # k; None = measure it

    def __post_init__(self) -> None:
        if self.price_per_hour < 0 or self.gpus < 1:
            raise ValueError("--price-per-hour must be >= 0 and --gpus >= 1")


def prefill_decode_ratio(records: Sequence[RequestRecord]) -> float | None:
    """Measured k: prefill tokens per second over decode tokens per second (None without decode data)."""
    ok = [r for r in records if r.success]
    prefill_s = sum(r.ttft for r in ok)
    decode_tokens = sum((r.output_tokens or 0) - 1 for r in ok if (r.output_tokens or 0) > 1)
    decode_s = sum(r.latency - r.ttft for r in ok if (r.output_tokens or 0) > 1)
    if prefill_s <= 0 or decode_tokens <= 0 or decode_s <= 0:
        return None
    return (sum(r.prompt_len for r in ok) / prefill_s) / (decode_tokens / decode_s)


def cached_prefill_weight(records: Sequence[RequestRecord]) -> float | None:
    """What a cached prompt token costs in prefill time, in uncached tokens (0 to 1): the least-squares
    fit TTFT ≈ a + b·uncached + c·cached over the requests whose cached tokens the server reported,
    then c / b. None unless some requests had cached tokens and some did not (``--shared-prefix``)."""
    rows = [(r.prompt_len - r.cached_tokens, r.cached_tokens, r.ttft) for r in records
            if r.success and r.cached_tokens is not None and r.ttft > 0]
    if len(rows) < 6 or not any(c for _, c, _ in rows) or all(c for _, c, _ in rows):
        return None
    x = np.array([[1.0, u, c] for u, c, _ in rows])
    (a, b, c), *_ = np.linalg.lstsq(x, np.array([t for _, _, t in rows]), rcond=None)
    return float(min(1.0, max(0.0, c / b))) if b > 0 else None


def split_bill(bill: float, input_tokens: int, output_tokens: int, k: float) -> tuple[float, float]:
    """(c_in, c_out) in $ per token such that c_in·T_in + c_out·T_out == bill."""
    denominator = input_tokens + k * output_tokens
    if denominator <= 0:
        return 0.0, 0.0
    c_in = bill / denominator
    return c_in, k * c_in


def cost_fields(pricing: Pricing, records: Sequence[RequestRecord], duration: float) -> dict:
    """The cost columns of a summary: bill, k, and $/Mtok for input and output."""
    ok = [r for r in records if r.success]
    t_in, t_out = sum(r.prompt_len for r in ok), sum(r.output_tokens or 0 for r in ok)
    bill = pricing.price_per_hour * pricing.gpus * duration / 3600.0
    k = pricing.output_weight or prefill_decode_ratio(records) or 1.0
    c_in, c_out = split_bill(bill, t_in, t_out, k)
    return {"bill_usd": bill, "output_input_weight": k, "input_usd_per_mtok": c_in * 1e6,
            "output_usd_per_mtok": c_out * 1e6, "price_per_hour": pricing.price_per_hour, "gpus": pricing.gpus}
