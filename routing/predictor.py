"""Predicted TTFT and TPOT of one more request on a backend, learned online from what the gateway sees.

For each backend the gateway knows what it has in flight there: requests still waiting for their
first token (with their prompt tokens: prefill work queued ahead of a new request) and requests
decoding. A backend that publishes its own queue (vLLM, TGI, TensorRT-LLM ``/metrics``) adds
``requests_waiting`` from clients other than us. Two linear models are fitted by recursive least
squares with forgetting, so they follow a backend whose speed drifts:

    TTFT ≈ w0 + w1·own prompt tokens + w2·prompt tokens waiting ahead + w3·requests waiting ahead
            + w4·requests decoding
    TPOT ≈ v0 + v1·requests decoding + v2·prompt tokens waiting (their prefills stall the decode)

and a TTFT is never predicted below what the backend takes for such a prompt when idle (a second
fit, ``idle``, over the requests that found nothing queued).

(a prefill rate, the queue in front of the batch, and a per-token time that grows with the batch).
Until a backend has answered a few requests, the priors (no queueing cost, a generous per-token
time) keep predictions optimistic, so nothing is shed on a guess.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field


class RecursiveLeastSquares:
    """y ≈ w·x, updated one observation at a time; ``forgetting`` < 1 weights recent ones more."""

    def __init__(self, prior: list[float], *, forgetting: float = 0.98, variance: list[float] | None = None,
                 confidence: float = 1e-2):
        """``variance``: how far each weight may be from its prior, squared (in the units of y per unit
        of that feature); small for per-token slopes, so early errors go to the intercept first."""
        n = len(prior)
        self.w = list(prior)
        spread = variance if variance is not None else [1.0 / confidence] * n
        self.p = [[spread[i] if i == j else 0.0 for j in range(n)] for i in range(n)]
        self.forgetting = forgetting
        self.observations = 0

    def predict(self, x: list[float]) -> float:
        return sum(wi * xi for wi, xi in zip(self.w, x))

    def predict_monotone(self, x: list[float]) -> float:
        """As ``predict``, with negative slopes read as 0: more work ahead never makes a request faster."""
        return self.w[0] * x[0] + sum(max(0.0, wi) * xi for wi, xi in zip(self.w[1:], x[1:]))

    def update(self, x: list[float], y: float) -> None:
        n, lam = len(x), self.forgetting
        px = [sum(self.p[i][j] * x[j] for j in range(n)) for i in range(n)]
        denominator = lam + sum(x[i] * px[i] for i in range(n))
        if denominator <= 1e-12:
            return
        gain = [v / denominator for v in px]
        error = y - self.predict(x)
        self.w = [self.w[i] + gain[i] * error for i in range(n)]
        xp = [sum(x[i] * self.p[i][j] for i in range(n)) for j in range(n)]
        self.p = [[(self.p[i][j] - gain[i] * xp[j]) / lam for j in range(n)] for i in range(n)]
        self.observations += 1


@dataclass
class InFlight:
    prompt_tokens: int
    started: float
    first_token: bool = False


@dataclass
class Prediction:
    ttft_s: float
    tpot_s: float


@dataclass
class LatencyModel:
    """What one backend has in flight and how fast it has been; see the module docstring."""

    # Priors: 50 ms to a first token, 0.1 ms per prompt token, nothing for a queue; the variances let
    # the intercept move by seconds, a per-token cost by ~1 ms and a per-request cost by ~0.3 s.
    ttft: RecursiveLeastSquares = field(default_factory=lambda: RecursiveLeastSquares(
        [0.05, 1e-4, 1e-4, 0.0, 0.0], variance=[1.0, 1e-6, 1e-6, 0.1, 0.1]))
    tpot: RecursiveLeastSquares = field(default_factory=lambda: RecursiveLeastSquares(
        [0.02, 0.0, 0.0], variance=[1e-2, 1e-4, 1e-8]))
    idle: RecursiveLeastSquares = field(default_factory=lambda: RecursiveLeastSquares(
        [0.0, 0.0], variance=[1.0, 1e-6]))
    in_flight: dict[int, InFlight] = field(default_factory=dict)
    reported_waiting: float = 0.0  # the backend's own queue (its /metrics), other clients included
    errors: list[float] = field(default_factory=list)  # |predicted − actual| / actual of recent TTFTs

    # -- what is in flight ----------------------------------------------------------------------

    def ttft_features(self, prompt_tokens: int) -> list[float]:
        waiting = [r for r in self.in_flight.values() if not r.first_token]
        decoding = len(self.in_flight) - len(waiting)
        queued = max(float(len(waiting)), self.reported_waiting)
        return [1.0, float(prompt_tokens), float(sum(r.prompt_tokens for r in waiting)), queued, float(decoding)]

    def decoding(self) -> int:
        return sum(1 for r in self.in_flight.values() if r.first_token)

    def tpot_features(self, extra_decoding: int = 1) -> list[float]:
        waiting = sum(r.prompt_tokens for r in self.in_flight.values() if not r.first_token)
        return [1.0, float(self.decoding() + extra_decoding), float(waiting)]

    def predict(self, prompt_tokens: int) -> Prediction:
        features = self.ttft_features(prompt_tokens)
        floor = self.idle.predict_monotone([1.0, float(prompt_tokens)]) if self.idle.observations else 0.0
        ttft = max(0.0, floor, self.ttft.predict_monotone(features))
        tpot = max(0.0, self.tpot.predict_monotone(self.tpot_features()))
        return Prediction(ttft, tpot)

    def started(self, key: int, prompt_tokens: int) -> tuple[list[float], Prediction]:
        """A request was sent; returns the features it was predicted from and the prediction."""
        features, prediction = self.ttft_features(prompt_tokens), self.predict(prompt_tokens)
        self.in_flight[key] = InFlight(prompt_tokens, time.monotonic())
        return features, prediction

    def first_token(self, key: int, features: list[float], predicted: Prediction, ttft_s: float) -> None:
        entry = self.in_flight.get(key)
        if entry is not None:
            entry.first_token = True
        self.ttft.update(features, ttft_s)
        if not any(features[2:]):  # nothing was queued or decoding: what this backend takes when idle
            self.idle.update(features[:2], ttft_s)
        if ttft_s > 0:
            self.errors.append(abs(predicted.ttft_s - ttft_s) / ttft_s)
            del self.errors[:-200]

    def finished(self, key: int, tpot_s: float | None, tpot_features: list[float] | None) -> None:
        self.in_flight.pop(key, None)
        if tpot_s is not None and tpot_features is not None:
            self.tpot.update(tpot_features, tpot_s)

    def median_error(self) -> float | None:
        if not self.errors:
            return None
        ordered = sorted(self.errors)
        return ordered[len(ordered) // 2]
