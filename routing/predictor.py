"""Predicted TTFT and TPOT of one more request on a backend, learned online from what the gateway sees.

The model is that of a continuous-batching server (vLLM, TGI, TensorRT-LLM): a new request waits for
the prefills queued ahead of it, then its own prefill; once decoding, each step lasts longer the more
sequences share the batch, and every other request's prefill stalls the batch while it runs. For each
backend the gateway knows what it has in flight there (requests waiting for a first token, with their
prompt tokens, and requests decoding); a backend that publishes its own queue (``/metrics``) adds
``requests_waiting``. Two linear models with non-negative weights are fitted by least squares over the
recent observations (:class:`WindowFit`, so they follow a backend whose speed drifts; the TTFT fit
minimises the relative error, so the few requests that waited long for a slot do not drown the rest):

    TTFT ≈ w0 + w1·own uncached prompt tokens + w2·own cached prompt tokens
            + w3·uncached prompt tokens waiting ahead + w4·cached prompt tokens waiting ahead
            + w5·requests waiting ahead + w6·requests decoding + w7·requests beyond the batch (waiting
            there for a slot to free)

A prompt's "cached" tokens are those the route's prefix index (``prefix.py``) expects the backend to
hold in its KV cache; the rest must be prefilled. The fit learns what an expected-cached token
really costs on each backend (``cached_cost``: w2 / w1, between 0 and 1): about nothing where the
backend caches and the index guesses well, as much as an uncached one where it does not (prefix
caching off, or evicted). Its prior is 0 (a cached token is free until the backend shows otherwise),
so a route that sends a conversation back to the backend holding it predicts the short prefill at
once. The prefill work a request puts on a backend (what stalls the decoding batch, the rate ``ρ``
below, the prefills due after a decoding request's first token) counts its uncached tokens plus
``cached_cost`` × its cached ones.
    TPOT ≈ v0 + v1·mean batch during the decode + v2·prompt tokens prefilled during the decode / tokens

The TPOT features are the ones the request actually lived through (the time-weighted number of
requests decoding there, the prompt tokens whose prefill ended while it decoded), so ``v1`` is the
per-sequence cost of a decode step and ``v2`` the seconds per prefilled token. A TPOT is predicted for
the batch the request would join (everything in flight there, plus itself) and the prefill tokens
arriving at the recent rate ``ρ`` (tokens/s) over its decode, which solves to
``(v0 + v1·batch) / (1 − v2·ρ)``.

Until a backend has answered a few requests the priors (50 ms to a first token, 0.1 ms per prompt
token, 20 ms per output token) keep predictions optimistic, so nothing is shed on a guess.
``ratio(kind, q)``: the q-quantile of recent actual / predicted, the margin the dispatcher applies.
"""

from __future__ import annotations

import math
import operator
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np


RELATIVE_TTFT = False
TPOT_PRIOR_STRENGTH = 0.3  # the TPOT fit's pull toward its prior, in observations
PROBE = 1  # before a backend's batch limit is known: at most this many beyond the most seen decoding there


class WindowFit:
    """y ≈ w·x with w ≥ 0, least squares over the last ``size`` observations, pulled toward ``prior``
    as much as ``strength`` observations would (so the prior decides only until data arrives)."""

    def __init__(self, prior: list[float], size: int = 200, strength: float = 3.0, relative: bool = False):
        self.prior = np.asarray(prior, dtype=float)
        self.strength, self.relative = strength, relative
        self.xs: deque[list[float]] = deque(maxlen=size)
        self.ys: deque[float] = deque(maxlen=size)
        self.observations = 0
        self._w: list[float] | None = None  # solved on demand, once per update (the routing decision reads it)

    @property
    def w(self) -> list[float]:
        if self._w is None:
            self._w = [float(v) for v in self._solve()]
        return self._w

    def update(self, x: list[float], y: float) -> None:
        self.xs.append([float(v) for v in x])
        self.ys.append(float(y))
        self.observations += 1
        self._w = None

    def predict(self, x: list[float]) -> float:
        return math.fsum(map(operator.mul, self.w, x))

    predict_monotone = predict  # the weights are never negative: more work ahead never predicts less

    def _solve(self) -> np.ndarray:
        if not self.ys:
            return self.prior.copy()
        x, y = np.asarray(self.xs), np.asarray(self.ys)
        if self.relative:  # least squares of the relative error: a few long waits do not drown the rest
            weight = 1.0 / np.maximum(y, 1e-3)
            x, y = x * weight[:, None], y * weight
        scale = np.sqrt((x ** 2).mean(axis=0))
        scale[scale == 0] = 1.0
        pull = np.sqrt(self.strength)
        rows = np.vstack([x / scale, pull * np.eye(len(scale))])
        target = np.concatenate([y, pull * self.prior * scale])
        active = np.ones(len(scale), dtype=bool)
        w = np.zeros(len(scale))
        while active.any():  # least squares; a weight below zero leaves the fit, the rest are refitted
            solved, *_ = np.linalg.lstsq(rows[:, active], target, rcond=None)
            w[:] = 0.0
            w[active] = solved
            if (solved >= 0).all():
                break
            active[np.flatnonzero(active)[solved < 0]] = False
        return np.maximum(w, 0.0) / scale


def median(values: list[float]) -> float | None:
    """The upper median (the value at half the sorted length), None for none."""
    return sorted(values)[len(values) // 2] if values else None


@dataclass
class InFlight:
    prompt_tokens: int           # uncached: those the backend must prefill
    started: float
    predicted: "Prediction"
    max_tokens: int = 0
    cached_tokens: int = 0       # expected in the backend's prefix cache
    first_token: float | None = None
    decode_area: float = 0.0     # the backend's ∫ decoding dt at this request's first token
    prefilled: float = 0.0       # the backend's prefilled prompt tokens at this request's first token


@dataclass
class Prediction:
    ttft_s: float
    tpot_s: float


def _ttft_prior() -> WindowFit:
    return WindowFit([0.05, 1e-4, 0.0, 1e-4, 0.0, 0.0, 0.0, 0.0], relative=True)


def _tpot_prior() -> WindowFit:
    # A light prior (a third of an observation): it is optimistic (no cost per sequence, no stall), and
    # a backend that has answered only a few requests, mostly alone, would keep that optimism about
    # its batch for long: at strength 3, seven observations of a 60 + 16 ms/sequence backend fitted
    # 53 + 12 ms, and the gateway bound a third sequence there that decoded at 108 ms.
    return WindowFit([0.02, 0.0, 0.0], strength=TPOT_PRIOR_STRENGTH)


@dataclass
class LatencyModel:
    """What one backend has in flight and how fast it has been; see the module docstring."""

    ttft: WindowFit = field(default_factory=_ttft_prior)
    tpot: WindowFit = field(default_factory=_tpot_prior)
    in_flight: dict[int, InFlight] = field(default_factory=dict)
    reported_waiting: float = 0.0  # the backend's own queue (its /metrics), other clients included
    errors: list[float] = field(default_factory=list)  # |predicted − actual| / actual of recent TTFTs
    tpot_errors: list[float] = field(default_factory=list)  # the same of recent TPOTs (requests of 2+ tokens)
    ratios: dict[str, list[float]] = field(default_factory=lambda: {"ttft": [], "tpot": []})  # actual / predicted
    clock: Callable[[], float] = field(default=time.monotonic, repr=False)
    rate_window_s: float = 30.0  # the prefill token rate ρ is measured over this long
    _area: float = 0.0           # ∫ (requests decoding) dt
    _prefilled: float = 0.0      # prompt tokens whose prefill has ended
    _changed: float | None = None
    _prefills: deque = field(default_factory=deque)  # (time, prompt tokens) of recent first tokens
    _prefill_sum: float = 0.0    # the sum of _prefills' tokens
    batch_limit: int = 0         # sequences the backend runs at once, from its /metrics (0: not known yet)
    _last_report: tuple[float, float] | None = None  # (running, waiting) of the previous report
    max_decoding: int = 0        # the most of the gateway's requests seen decoding here at once
    _sorted: dict = field(default_factory=dict)  # ratios[kind] sorted, until the next one arrives

    # -- what is in flight ----------------------------------------------------------------------

    def ttft_features(self, prompt_tokens: int, cached_tokens: int = 0) -> list[float]:
        """``prompt_tokens`` in all, ``cached_tokens`` of them expected in the backend's cache."""
        waiting = [r for r in self.in_flight.values() if r.first_token is None]
        decoding = len(self.in_flight) - len(waiting)
        queued = max(float(len(waiting)), self.reported_waiting)
        beyond = max(0, len(self.in_flight) + 1 - self.batch_limit) if self.batch_limit else 0
        cached = min(cached_tokens, prompt_tokens)
        return [1.0, float(prompt_tokens - cached), float(cached), float(sum(r.prompt_tokens for r in waiting)),
                float(sum(r.cached_tokens for r in waiting)), queued, float(decoding), float(beyond)]

    def cached_cost(self) -> float:
        """What a prompt token the index expects cached costs here, in uncached tokens (0 to 1)."""
        w = self.ttft.w
        return min(1.0, w[2] / w[1]) if w[1] > 0 else (0.0 if w[2] == 0 else 1.0)

    def prefill_work(self, prompt_tokens: int, cached_tokens: int = 0) -> float:
        """The prompt tokens a request makes this backend prefill, in uncached tokens."""
        cached = min(cached_tokens, prompt_tokens)
        return prompt_tokens - cached + (self.cached_cost() * cached if cached else 0.0)

    def reported(self, running: float | None, waiting: float | None) -> None:
        """The backend's own figures (its ``/metrics``). A queue there while it runs as many as in the
        previous report, which had a queue too, means its batch is full: ``running`` is its limit (one
        report with a queue may be a request waiting for the next step, not for a slot)."""
        before = self._last_report
        self._last_report = (float(running or 0.0), float(waiting or 0.0))
        self.reported_waiting = self._last_report[1]
        if before is not None and waiting and before[1] and running and running == before[0] \
                and running >= self.max_decoding:  # never below what the gateway has seen running there
            self.batch_limit = max(self.batch_limit, int(running))

    def is_full(self, fewest_on_peers: int = 0) -> bool:
        """One more request would wait there for a free slot in the batch. Before the batch limit is
        known (a backend without ``/metrics``, or one never seen with a queue), the limit is the most
        of the gateway's requests seen decoding there at once plus ``PROBE``: the gateway probes for
        room one request at a time instead of pushing a burst into a queue it cannot see; but it never
        holds a backend with two fewer in flight than every other backend of the route (the limit is
        at least ``fewest_on_peers`` − 1), so the probe does not send a burst to the busier one. A
        backend's own count grows only with its first tokens: one busy with a long prefill stayed at
        its first request's while its peer took a burst one by one (bench/disagg.py's start: 7 of 8
        streams on one runner). Within one of the peers it still probes: a backend with a prefill
        pending is not where the next request starts soonest (the −1 keeps bench/slo_sim.py's figures
        as they were; at the peers' count its conversations' mean TTFT rose 410 → 423 ms)."""
        limit = self.batch_limit or (max(self.max_decoding + PROBE, fewest_on_peers - 1) if PROBE else 0)
        return bool(limit) and len(self.in_flight) >= limit

    def decoding(self) -> int:
        return sum(1 for r in self.in_flight.values() if r.first_token is not None)

    def prefill_rate(self) -> float:
        """Prompt tokens per second prefilled here lately."""
        now = self.clock()
        while self._prefills and self._prefills[0][0] < now - self.rate_window_s:
            self._prefill_sum -= self._prefills.popleft()[1]
        if not self._prefills:
            self._prefill_sum = 0.0  # no drift from the float sums
        return self._prefill_sum / self.rate_window_s

    def predict(self, prompt_tokens: int, cached_tokens: int = 0) -> Prediction:
        ttft = max(0.0, self.ttft.predict(self.ttft_features(prompt_tokens, cached_tokens)))
        v0, v1, v2 = self.tpot.w
        stall = min(0.9, v2 * self.prefill_rate())  # the share of the time prefills hold the batch
        tpot = max(0.0, (v0 + v1 * (len(self.in_flight) + 1)) / (1.0 - stall))
        return Prediction(ttft, tpot)

    def idle_ttft(self, prompt_tokens: int, cached_tokens: int = 0) -> float:
        """The predicted TTFT of this prompt with nothing queued or decoding here."""
        cached = min(cached_tokens, prompt_tokens)
        return max(0.0, self.ttft.predict([1.0, float(prompt_tokens - cached), float(cached), 0.0, 0.0, 0.0, 0.0, 0.0]))

    def ratio(self, kind: str, quantile: float) -> float:
        """That quantile of recent actual / predicted (``ttft`` or ``tpot``), at least 1; 1 before 10."""
        seen = self._sorted.get(kind)
        if seen is None:
            seen = self._sorted[kind] = sorted(self.ratios[kind])
        if len(seen) < 10:
            return 1.0
        return max(1.0, seen[min(len(seen) - 1, int(quantile * len(seen)))])

    # -- what happens to a request --------------------------------------------------------------

    def started(self, key: int, prompt_tokens: int, max_tokens: int = 0,
                cached_tokens: int = 0) -> tuple[list[float], Prediction]:
        """A request was sent; returns the features it was predicted from and the prediction."""
        cached = min(cached_tokens, prompt_tokens)
        features, prediction = self.ttft_features(prompt_tokens, cached), self.predict(prompt_tokens, cached)
        self.in_flight[key] = InFlight(prompt_tokens - cached, self.clock(), prediction, max_tokens,
                                       cached_tokens=cached)
        return features, prediction

    def worst_tpot_with(self, prompt_tokens: int, cached_tokens: int = 0) -> float:
        """The highest TPOT a request in flight here would end with if one more request (this prompt)
        joined: its remaining tokens at the bigger batch's pace, plus the stalls of the new prefill and
        of every prefill still due there after its own first token (the requests sent after it that
        have no first token yet: a FIFO backend prefills them during its decode). A request still
        waiting for its first token counts too (all its tokens are left). A decoding request's tokens
        so far are counted from what it lived through (its mean batch, the prefills that stalled it),
        not from today's batch: one slowed by a prefill has more of its decode ahead."""
        if not self.in_flight:
            return 0.0
        now, v0, v1, v2 = self._advance(), *self.tpot.w
        stall = min(0.9, v2 * self.prefill_rate())
        pace_with = (v0 + v1 * (len(self.in_flight) + 1)) / (1.0 - stall)
        worst, due = 0.0, self.prefill_work(prompt_tokens, cached_tokens)  # prefilled after the entry's first token
        for entry in reversed(list(self.in_flight.values())):  # the latest sent first (a FIFO backend)
            if entry.max_tokens >= 2:
                elapsed = now - entry.first_token if entry.first_token is not None else 0.0
                left = max(0.0, entry.max_tokens - 1 - self._tokens_done(entry, elapsed))
                worst = max(worst, (elapsed + left * pace_with + v2 * due) / (entry.max_tokens - 1))
            if entry.first_token is None:
                due += self._work(entry)
        return worst

    def _work(self, entry: InFlight) -> float:
        return entry.prompt_tokens + (self.cached_cost() * entry.cached_tokens if entry.cached_tokens else 0.0)

    def _tokens_done(self, entry: InFlight, elapsed: float) -> float:
        """The tokens a decoding request has produced after its first, by the TPOT model over what it
        lived through: ``elapsed − v2·prefilled since`` at ``v0 + v1·mean batch since`` a token."""
        if entry.first_token is None or elapsed <= 0:
            return 0.0
        v0, v1, v2 = self.tpot.w
        batch = max(1.0, (self._area - entry.decode_area) / elapsed)
        step = v0 + v1 * batch
        return max(0.0, elapsed - v2 * (self._prefilled - entry.prefilled)) / step if step > 0 else 0.0

    def first_token(self, key: int, features: list[float]) -> float | None:
        """The request's first token arrived; learns its TTFT (from ``started``), returned in seconds."""
        entry = self.in_flight.get(key)
        if entry is None or entry.first_token is not None:
            return None
        now = self._advance()
        ttft = now - entry.started
        work = self._work(entry)
        self._prefilled += work
        self._prefills.append((now, work))
        self._prefill_sum += work
        entry.first_token, entry.decode_area, entry.prefilled = now, self._area, self._prefilled
        self.max_decoding = max(self.max_decoding, self.decoding())
        if self.batch_limit and self.max_decoding > self.batch_limit:  # more ran at once: that limit was wrong
            self.batch_limit = self.max_decoding
        self.ttft.update(features, ttft)
        if ttft > 0:
            self.errors.append(abs(entry.predicted.ttft_s - ttft) / ttft)
            del self.errors[:-200]
        self._ratio("ttft", entry.predicted.ttft_s, ttft)
        return ttft

    def finished(self, key: int, tpot_s: float | None = None, output_tokens: int = 0) -> None:
        """The request ended (or failed: no ``tpot_s``); learns its TPOT from what it lived through."""
        now = self._advance()
        entry = self.in_flight.pop(key, None)
        if entry is None or entry.first_token is None or tpot_s is None or output_tokens < 2:
            return
        span = now - entry.first_token
        batch = (self._area - entry.decode_area) / span if span > 0 else float(self.decoding() + 1)
        stall = (self._prefilled - entry.prefilled) / (output_tokens - 1)
        self.tpot.update([1.0, max(1.0, batch), stall], tpot_s)
        if tpot_s > 0:
            self.tpot_errors.append(abs(entry.predicted.tpot_s - tpot_s) / tpot_s)
            del self.tpot_errors[:-200]
        self._ratio("tpot", entry.predicted.tpot_s, tpot_s)

    def median_error(self, kind: str = "ttft") -> float | None:
        """The median |predicted − actual| / actual of recent TTFTs (or, ``kind="tpot"``, TPOTs)."""
        errors = self.errors if kind == "ttft" else self.tpot_errors
        return median(errors)

    def _advance(self) -> float:
        """Accrues ∫ decoding dt up to now (call before the number decoding changes)."""
        now = self.clock()
        self._area += self.decoding() * max(0.0, now - (now if self._changed is None else self._changed))
        self._changed = now
        return now

    def _ratio(self, kind: str, predicted: float, actual: float) -> None:
        fitted = (self.ttft if kind == "ttft" else self.tpot).observations >= 10  # not the priors' errors
        if fitted and predicted > 0 and actual > 0:
            self.ratios[kind].append(actual / predicted)
            del self.ratios[kind][:-100]
            self._sorted.pop(kind, None)
