"""A circuit breaker per backend: after ``threshold`` failures in a row the backend is skipped for
``cooldown_s``; then one request is let through (half-open): success closes it, failure opens it again.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Literal

State = Literal["closed", "open", "half_open"]


@dataclass
class CircuitBreaker:
    threshold: int = 3
    cooldown_s: float = 10.0
    failures: int = 0
    opened_at: float | None = None
    probing: bool = False
    clock: "callable" = field(default=time.monotonic, repr=False)

    @property
    def state(self) -> State:
        if self.opened_at is None:
            return "closed"
        return "half_open" if self.clock() - self.opened_at >= self.cooldown_s else "open"

    def allows(self) -> bool:
        """Whether a request may go to this backend now (a half-open breaker admits one probe)."""
        state = self.state
        return state == "closed" or (state == "half_open" and not self.probing)

    def attempt(self) -> None:
        if self.state == "half_open":
            self.probing = True

    def succeeded(self) -> None:
        self.failures, self.opened_at, self.probing = 0, None, False

    def failed(self) -> None:
        self.failures += 1
        if self.state == "half_open" or self.failures >= self.threshold:
            self.opened_at, self.probing = self.clock(), False

    def retry_after(self) -> float:
        return 0.0 if self.opened_at is None else max(0.0, self.cooldown_s - (self.clock() - self.opened_at))
