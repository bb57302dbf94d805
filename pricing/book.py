"""What each backend charges, and the cost of a finished request.

A backend with list prices costs its tokens at those prices. A backend priced per hour gets a
**provisional** cost when the request finishes (so budgets can act at once): the rates of the last
complete accounting window, or, in the first window, the rates that divide the bill accrued so far
over the tokens seen so far. ``infer cost`` settles the exact figures afterwards from the ledger
(``pricing.settle``). ``pricing_version`` identifies the pricing entry a row was costed with (a
hash of it), so a change of prices never rewrites history.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from .method import Cost, Rates, Tokens, conserving_rates, window_bill

log = logging.getLogger(__name__)

DEFAULT_OUTPUT_WEIGHT = 5.0  # when output_weight is "measured" and no bench calibration exists


@dataclass
class HourlyLedger:
    """The running window of one hour-priced backend: its tokens so far, the last window's rates."""

    hourly_usd: float
    gpus: float
    window_s: float
    output_weight: float
    cached_input_weight: float
    window_start: float = field(default_factory=time.time)
    tokens: Tokens = field(default_factory=Tokens)
    last_rates: Rates | None = None

    def rates(self, now: float) -> Rates | None:
        self._roll(now)
        if self.last_rates is not None:
            return self.last_rates
        elapsed = max(1.0, now - self.window_start)
        return conserving_rates(window_bill(self.hourly_usd, self.gpus, elapsed), self.tokens,
                                self.output_weight, self.cached_input_weight)

    def add(self, tokens: Tokens, now: float) -> None:
        self._roll(now)
        self.tokens = self.tokens + tokens

    def _roll(self, now: float) -> None:
        while now >= self.window_start + self.window_s:
            bill = window_bill(self.hourly_usd, self.gpus, self.window_s)
            self.last_rates = conserving_rates(bill, self.tokens, self.output_weight,
                                               self.cached_input_weight) or self.last_rates
            self.window_start += self.window_s
            self.tokens = Tokens()


class PriceBook:
    """Pricing entries by backend name (``gateway.backends_config.PricingEntry``)."""

    def __init__(self, entries: dict[str, Any]) -> None:
        self.entries = entries
        self.versions = {name: version_of(entry) for name, entry in entries.items()}
        self.hourly: dict[str, HourlyLedger] = {}
        for name, entry in entries.items():
            if entry.gpu_hourly_usd is not None:
                self.hourly[name] = HourlyLedger(entry.gpu_hourly_usd, entry.gpus, entry.window_s,
                                                 output_weight(name, entry), entry.cached_input_weight)

    def cost(self, backend: str, tokens: Tokens, now: float | None = None) -> tuple[Cost, str] | None:
        """The provisional cost of ``tokens`` served by ``backend``; None when it has no pricing."""
        entry = self.entries.get(backend)
        if entry is None:
            return None
        now = time.time() if now is None else now
        if backend in self.hourly:
            self.hourly[backend].add(tokens, now)
        rates = self._rates(backend, now)
        return (rates.cost(tokens) if rates is not None else Cost()), self.versions[backend]

    def _rates(self, name: str, now: float) -> Rates | None:
        hourly = self.hourly.get(name)
        if hourly is not None:
            return hourly.rates(now)
        entry = self.entries[name]
        return Rates.per_mtok(entry.input_per_mtok, entry.output_per_mtok, entry.cached_input_per_mtok)


    def estimate(self, names: tuple[str, ...], tokens: Tokens) -> float:
        """What ``tokens`` would cost on the first of ``names`` that has pricing, at today's rates,
        without counting them (a budget reservation); 0 when none is priced."""
        name = next((n for n in names if n in self.entries), None)
        rates = self._rates(name, time.time()) if name is not None else None
        return rates.cost(tokens).total if rates is not None else 0.0


def output_weight(name: str, entry: Any) -> float:
    if entry.output_weight != "measured":
        return float(entry.output_weight)
    log.warning("backend %s: output_weight is 'measured' but no infer bench calibration is wired in yet; "
                "using %g until one is (set a number to silence this)", name, DEFAULT_OUTPUT_WEIGHT)
    return DEFAULT_OUTPUT_WEIGHT


def version_of(entry: Any) -> str:
    text = json.dumps(entry.model_dump(), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:12]
