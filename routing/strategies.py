"""The order in which a route tries its backends: the first is where a request goes, the others
take retries and hedges in turn.

- ``slo``: most headroom first, headroom = the smallest of (SLO − prediction) / SLO over the parts
  the SLO sets (e2e predicted as TTFT + TPOT × (max tokens − 1)); ties broken by fewer in flight;
- ``least_inflight``: fewest requests in flight through this gateway first;
- ``round_robin``: each request starts one further along the list;
- ``weighted``: smooth weighted round robin (nginx's), by each backend's ``weight``;
- ``prefix``: the backend with the longest cached prefix of the prompt, within a bounded load
  (``prefix.choose``), then the others by fewest in flight.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .breaker import CircuitBreaker
from .predictor import LatencyModel, Prediction
from .slo import SLO

STRATEGIES = ("slo", "least_inflight", "round_robin", "weighted", "prefix")


@dataclass
class Member:
    """One backend of a route, with what the route knows about it."""

    name: str
    backend: Any  # core.base.Backend
    model: str    # the model name the backend serves this route under
    weight: float = 1.0
    latency: LatencyModel = field(default_factory=LatencyModel)
    breaker: CircuitBreaker = field(default_factory=CircuitBreaker)
    current_weight: float = 0.0  # smooth WRR state
    up: bool = True              # the last health check

    @property
    def in_flight(self) -> int:
        return len(self.latency.in_flight)


def headroom(slo: SLO, prediction: Prediction, max_tokens: int) -> float:
    """The smallest relative margin over the set SLO parts (negative: predicted to miss)."""
    margins = []
    if slo.ttft_ms is not None:
        margins.append((slo.ttft_ms - prediction.ttft_s * 1000) / slo.ttft_ms)
    if slo.tpot_ms is not None:
        margins.append((slo.tpot_ms - prediction.tpot_s * 1000) / slo.tpot_ms)
    if slo.e2e_ms is not None:
        e2e = prediction.ttft_s + prediction.tpot_s * max(0, max_tokens - 1)
        margins.append((slo.e2e_ms - e2e * 1000) / slo.e2e_ms)
    return min(margins) if margins else -prediction.ttft_s


@dataclass
class Orderer:
    strategy: str
    turn: int = 0

    def order(self, members: list[Member], predictions: dict[str, Prediction], slo: SLO,
              max_tokens: int, first: Member | None = None) -> list[Member]:
        """``first``: the ``prefix`` strategy's pick (the route's prefix index chose it)."""
        if self.strategy == "prefix":
            rest = sorted((m for m in members if m is not first), key=lambda m: m.in_flight)
            return ([first] if first is not None and first in members else []) + rest
        if self.strategy == "slo":
            return sorted(members, key=lambda m: (-headroom(slo, predictions[m.name], max_tokens), m.in_flight))
        if self.strategy == "least_inflight":
            return sorted(members, key=lambda m: m.in_flight)
        if self.strategy == "weighted":
            return self._weighted(members)
        start = self.turn % max(1, len(members))
        self.turn += 1
        return members[start:] + members[:start]

    def _weighted(self, members: list[Member]) -> list[Member]:
        if not members:
            return []
        total = sum(m.weight for m in members)
        for m in members:
            m.current_weight += m.weight
        best = max(members, key=lambda m: m.current_weight)
        best.current_weight -= total
        return [best] + [m for m in members if m is not best]
