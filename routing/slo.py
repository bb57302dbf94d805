"""A latency SLO and the check of one finished request against it (metrics-and-cost.md §1, §3).

TPOT follows vLLM's definition: (e2e − ttft) / (output tokens − 1); a request with at most one
output token meets any TPOT SLO. A request meets its SLO when it meets every part that is set.

An SLO has no defaults of its own: ``routing.build.slo_policy`` makes one from the config's
``SLOEntry`` (``gateway/backends_config.py``), where each default is written once.
"""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class SLO:
    ttft_ms: float | None
    tpot_ms: float | None
    e2e_ms: float | None
    target: float    # the attainment the route promises
    window_s: float  # the window attainment and goodput are measured over

    @property
    def is_set(self) -> bool:
        return any(v is not None for v in (self.ttft_ms, self.tpot_ms, self.e2e_ms))

    def tightened(self, ttft_ms: float | None = None, tpot_ms: float | None = None) -> "SLO":
        """A client may ask for less latency than the route promises, never for more."""
        return replace(self, ttft_ms=_tighter(self.ttft_ms, ttft_ms), tpot_ms=_tighter(self.tpot_ms, tpot_ms))

    def missed(self, ttft_s: float | None, e2e_s: float, output_tokens: int) -> tuple[str, ...]:
        """The parts this request missed, in the order ttft, tpot, e2e (empty: it met its SLO)."""
        parts = []
        if self.ttft_ms is not None and (ttft_s is None or ttft_s * 1000 > self.ttft_ms):
            parts.append("ttft")
        tpot = vllm_tpot(ttft_s, e2e_s, output_tokens)
        if self.tpot_ms is not None and tpot is not None and tpot * 1000 > self.tpot_ms:
            parts.append("tpot")
        if self.e2e_ms is not None and e2e_s * 1000 > self.e2e_ms:
            parts.append("e2e")
        return tuple(parts)


def vllm_tpot(ttft_s: float | None, e2e_s: float, output_tokens: int) -> float | None:
    """(e2e − ttft) / (output − 1) seconds; None with fewer than two output tokens."""
    if ttft_s is None or output_tokens < 2:
        return None
    return max(0.0, e2e_s - ttft_s) / (output_tokens - 1)


def _tighter(current: float | None, asked: float | None) -> float | None:
    if asked is None:
        return current
    return asked if current is None else min(current, asked)
