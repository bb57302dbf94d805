"""When and where a request of an ``slo`` route goes: late binding at the gateway, shedding what cannot wait.

A continuous-batching backend serves what it has admitted at a pace that depends on everything in its
batch: one more sequence slows every step, and each new prompt's prefill stalls the whole batch. So
the route does not push a request into a backend whose predicted TPOT or TTFT would miss the SLO; it
holds it until some backend has room, and binds it then (late binding: the request goes to whichever
backend frees up first). The held queue is ordered by ``priority`` (higher first), then by cost
(output tokens, plus a tenth of the prompt tokens: what the request takes from a backend's batch),
then arrival: when room frees, the cheapest request of the highest priority takes it, so in a burst
the requests left to be shed at their deadlines are the costly ones, and fewer are lost.

For each held request and each backend (``predictor.LatencyModel``) the prediction, scaled by the
backend's recent error (a quantile of actual / predicted, so the margin is what the backend has
shown, not a constant), must fit:

- TTFT within what is left of the TTFT SLO (the time already held counts);
- TPOT within the TPOT SLO (the batch it would join, the prefills waiting there);
- e2e = held + TTFT + TPOT × (max tokens − 1) within the e2e SLO.

Among the backends where it fits, the one with the most headroom (the smallest relative margin over
the parts) plus its cache bonus wins. The bonus is the prefill time the backend's prefix cache is
expected to save this request (the route's prefix index, ``prefix.py``; what a cached token is
worth there is learnt, ``LatencyModel.cached_cost``) as a share of the TTFT SLO: a conversation goes
back to the backend that holds it while that meets the SLO, and spreads when it does not. Without
shared prefixes every bonus is 0. A request that fits nowhere waits. Its **deadline** is the last moment at which the
quickest backend, idle, would still give its first token in time; past it (or at once, when the
requests held ahead of it, at the pace requests have been leaving the queue, would hold it past its
deadline) it is shed with ``shed: true``, or sent to the backend with the most headroom without; at
its deadline a backend whose batch is full (a limit learnt from its ``/metrics``; before it is
known, one more than the gateway has seen decoding there, but never two below the fewest in flight
on the route's other backends: the probe does not send a burst to the busier one) but where it would
fit is still taken rather than shedding (so a wrongly learnt limit corrects itself). A request is not bound where its
prefill would push a request in flight there (decoding, or still waiting for its first token) past
the TPOT SLO.
A negative priority takes 25 % off the TTFT SLO per step, so low priority is shed first.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .predictor import Prediction
from .slo import SLO
from .strategies import Member

_keys = itertools.count()
# The policy's knobs, chosen with bench/slo_sim.py over 8 seeds (``--set NAME=VALUE`` compares others).
TTFT_QUANTILE = 0.8  # the margins: these quantiles of a backend's recent actual / predicted
TPOT_QUANTILE = 0.5
HOLD_WHEN_FULL = True
PROTECT_DECODING = True
EARLY_SHED = True  # shed at arrival when the queue ahead would hold it past its deadline
PICK = "most"  # among the backends where it fits: the most headroom, or the least (pack tightly)
PROMPT_TOKEN_COST = 0.1  # a prompt token's share of a backend, in output tokens (the held queue's order)


@dataclass(eq=False)
class Waiter:
    """One request held by the route until it is bound to a backend, or shed."""

    prompt_tokens: int
    max_tokens: int
    arrival: float
    slo: SLO
    priority: int = 0
    cached: dict[str, int] = field(default_factory=dict)  # member → prompt tokens expected in its cache
    payload: Any = None
    key: int = field(default_factory=lambda: next(_keys))
    deadline: float = 0.0
    decided: bool = False
    backend: str | None = None         # where it goes; None once decided: shed
    features: list[float] = field(default_factory=list)
    prediction: Prediction | None = None
    reason: str = ""                   # why it was shed, for the 429's message
    retry_after_s: float = 1.0

    @property
    def cost(self) -> float:
        """What serving it takes from a backend, in output tokens: each is a decode step shared with
        the batch; a prompt token's prefill is far cheaper (``PROMPT_TOKEN_COST``)."""
        return self.max_tokens + PROMPT_TOKEN_COST * self.prompt_tokens

    @property
    def rank(self) -> tuple[int, float]:
        """The held queue's order: higher priority first, then the cheaper request."""
        return (-self.priority, self.cost)

    @property
    def ttft_limit_s(self) -> float:
        return (self.slo.ttft_ms or 1e12) / 1000 * max(0.25, 1.0 + 0.25 * min(0, self.priority))


@dataclass
class Fit:
    member: Member
    prediction: Prediction
    headroom: float   # smallest relative margin over the SLO parts (negative: predicted to miss)
    fits: bool
    bonus: float = 0.0  # the prefill time its cache saves, as a share of the TTFT SLO

    @property
    def score(self) -> float:
        return self.headroom + self.bonus


class Dispatcher:
    def __init__(self, shed: bool, clock: Callable[[], float] = time.monotonic):
        self.shed, self.clock = shed, clock
        self.queue: list[Waiter] = []
        self.gap_s = 0.0          # recent seconds between two requests leaving the queue, while it was busy
        self.last_left: float | None = None

    # -- arrival --------------------------------------------------------------------------------

    def arrive(self, waiter: Waiter, members: list[Member]) -> None:
        now = self.clock()
        quickest = min((m.latency.idle_ttft(waiter.prompt_tokens, waiter.cached.get(m.name, 0))
                        * m.latency.ratio("ttft", TTFT_QUANTILE) for m in members), default=0.0)
        waiter.deadline = waiter.arrival + waiter.ttft_limit_s - quickest
        ahead = sum(1 for w in self.queue if w.rank <= waiter.rank)
        expected = now + ahead * self.gap_s
        if EARLY_SHED and self.shed and members and ahead and expected > waiter.deadline:
            self._shed(waiter, f"{ahead} request(s) are held ahead of it, about {ahead * self.gap_s * 1000:.0f} ms")
            return
        self.queue.append(waiter)
        self.queue.sort(key=lambda w: w.rank)  # stable: FIFO among equals

    # -- binding --------------------------------------------------------------------------------

    def ready(self, members: list[Member]) -> list[Waiter]:
        """The held requests decided now (bound: ``backend`` set and the backend told it started;
        shed: ``backend`` None), in queue order; the others stay held."""
        now, decided = self.clock(), []
        for waiter in list(self.queue):
            fits = [self.fit(waiter, m, now, min((p.in_flight for p in members if p is not m), default=0))
                    for m in members]
            sign = 1 if PICK == "most" else -1
            best = max(fits, key=lambda f: (f.fits, sign * f.score if f.fits else f.headroom,
                                            -f.member.in_flight), default=None)
            queued = max((f for f in fits if f.headroom >= 0), key=lambda f: f.headroom, default=None)
            if best is not None and best.fits:
                self._bind(waiter, best, now)
            elif queued is not None and now >= waiter.deadline:  # rather than shed: queue where it would fit
                self._bind(waiter, queued, now)
            elif best is None or now >= waiter.deadline:
                if self.shed or best is None:
                    self._shed(waiter, self._why(waiter, best, now), best)
                else:
                    self._bind(waiter, best, now)
            else:
                continue
            self.queue.remove(waiter)
            decided.append(waiter)
        return decided

    def fit(self, waiter: Waiter, member: Member, now: float, fewest_on_peers: int = 0) -> Fit:
        """``fewest_on_peers``: the fewest requests in flight on the route's other backends (the probe for
        room, ``LatencyModel.is_full``)."""
        latency, slo = member.latency, waiter.slo
        cached = waiter.cached.get(member.name, 0)
        raw = latency.predict(waiter.prompt_tokens, cached)
        held = now - waiter.arrival
        ttft_margin, tpot_margin = latency.ratio("ttft", TTFT_QUANTILE), latency.ratio("tpot", TPOT_QUANTILE)
        ttft, tpot = raw.ttft_s * ttft_margin, raw.tpot_s * tpot_margin
        limit = waiter.ttft_limit_s
        margins = [(limit - held - ttft) / limit]
        if slo.tpot_ms is not None and waiter.max_tokens > 1:
            margins.append((slo.tpot_ms / 1000 - tpot) / (slo.tpot_ms / 1000))
        if slo.tpot_ms is not None and PROTECT_DECODING:  # nor may it push those decoding there past theirs
            others = latency.worst_tpot_with(waiter.prompt_tokens, cached) * tpot_margin
            margins.append((slo.tpot_ms / 1000 - others) / (slo.tpot_ms / 1000))
        if slo.e2e_ms is not None:
            e2e = held + ttft + tpot * max(0, waiter.max_tokens - 1)
            margins.append((slo.e2e_ms / 1000 - e2e) / (slo.e2e_ms / 1000))
        headroom = min(margins)
        bonus = 0.0
        if cached:  # the TTFT model is linear: a cached token saves w1 - w2 (uncached less cached weight)
            w = latency.ttft.w
            saved = (w[1] - w[2]) * min(cached, waiter.prompt_tokens)
            bonus = max(0.0, saved) * ttft_margin / limit
        full = HOLD_WHEN_FULL and latency.is_full(fewest_on_peers)
        return Fit(member, raw, headroom, headroom >= 0 and not full, bonus)

    def next_deadline(self) -> float | None:
        return min((w.deadline for w in self.queue), default=None)

    def forget(self, waiter: Waiter) -> None:
        """The client left while held."""
        if waiter in self.queue:
            self.queue.remove(waiter)

    def _bind(self, waiter: Waiter, fit: Fit, now: float) -> None:
        held = now - waiter.arrival
        if held > 0 and self.last_left is not None:
            gap = now - self.last_left
            self.gap_s = gap if self.gap_s == 0 else 0.8 * self.gap_s + 0.2 * gap
        self.last_left = now
        waiter.decided, waiter.backend = True, fit.member.name
        waiter.features, waiter.prediction = fit.member.latency.started(
            waiter.key, waiter.prompt_tokens, waiter.max_tokens, waiter.cached.get(fit.member.name, 0))

    def _shed(self, waiter: Waiter, reason: str, best: Fit | None = None) -> None:
        """Retry-After: when the queue held here should have drained, or the best backend's work."""
        waiter.decided, waiter.backend, waiter.reason = True, None, reason
        backlog = best.prediction.ttft_s - waiter.ttft_limit_s if best is not None else 0.0
        waiter.retry_after_s = max(1.0, len(self.queue) * self.gap_s, backlog)

    def _why(self, waiter: Waiter, best: Fit | None, now: float) -> str:
        if best is None:
            return "no backend is available"
        held = now - waiter.arrival
        return ((f"held {held * 1000:.0f} ms; " if held >= 0.001 else "")
                + f"best: {best.member.name}, predicted TTFT {best.prediction.ttft_s * 1000:.0f} ms, "
                f"TPOT {best.prediction.tpot_s * 1000:.0f} ms")
