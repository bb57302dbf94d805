"""The two pricing methods, as pure functions.

List prices (an API): a request costs ``in·p_in + cached·p_cache + out·p_out`` with the provider's
prices per million tokens.

Self-hosted, bill-conserving (metrics-and-cost.md §4.2): a backend priced per hour costs
``C = hourly × gpus × hours`` for an accounting window, whatever it served. The window's tokens
share it by weight — uncached input 1, cached input ``k_cache``, output ``k`` (what an output token
costs the hardware in input tokens: prefill over decode throughput) — so

    c_in = C / (T_in + k_cache·T_cached + k·T_out),   c_cache = k_cache·c_in,   c_out = k·c_in

and Σ requests (c_in·in + c_cache·cached + c_out·out) = C exactly. A window with no tokens keeps its
bill unallocated (idle time), which is what raises realised $/Mtok.
"""

from __future__ import annotations

from dataclasses import dataclass

MTOK = 1_000_000


@dataclass(frozen=True)
class Tokens:
    input: int = 0          # uncached prompt tokens
    cached_input: int = 0
    output: int = 0

    def __add__(self, other: "Tokens") -> "Tokens":
        return Tokens(self.input + other.input, self.cached_input + other.cached_input, self.output + other.output)


@dataclass(frozen=True)
class Rates:
    """Dollars per token for each kind."""

    input: float
    cached_input: float
    output: float

    @classmethod
    def per_mtok(cls, input: float, output: float, cached_input: float | None = None) -> "Rates":
        return cls(input / MTOK, (input if cached_input is None else cached_input) / MTOK, output / MTOK)

    def cost(self, tokens: Tokens) -> "Cost":
        return Cost(tokens.input * self.input, tokens.cached_input * self.cached_input, tokens.output * self.output)

    def as_mtok(self) -> dict[str, float]:
        return {"input": self.input * MTOK, "cached_input": self.cached_input * MTOK, "output": self.output * MTOK}


@dataclass(frozen=True)
class Cost:
    input: float = 0.0
    cached_input: float = 0.0
    output: float = 0.0

    @property
    def total(self) -> float:
        return self.input + self.cached_input + self.output


def window_bill(gpu_hourly_usd: float, gpus: float, seconds: float) -> float:
    return gpu_hourly_usd * gpus * seconds / 3600.0


def conserving_rates(bill: float, tokens: Tokens, output_weight: float, cached_input_weight: float) -> Rates | None:
    """The per-token rates that divide ``bill`` exactly over ``tokens``; None when no token used it."""
    weighted = tokens.input + cached_input_weight * tokens.cached_input + output_weight * tokens.output
    if weighted <= 0:
        return None
    c_in = bill / weighted
    return Rates(c_in, cached_input_weight * c_in, output_weight * c_in)
