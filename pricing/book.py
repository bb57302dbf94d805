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
import time
from dataclasses import dataclass, field

from .catalog import Priced, by_member
from .method import Cost, Rates, Tokens, conserving_rates, window_bill


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
    """Pricing by the ledger's backend names (``catalog.Priced``); one running window per hour-priced
    entry, shared by the names it prices (the local engines and local route members share one bill)."""

    def __init__(self, priced: list[Priced]) -> None:
        self.priced = priced
        self.entries = {name: p.entry for name, p in by_member(priced).items()}
        self._versions = {p.name: version_of(p) for p in priced}
        self._of = {name: p.name for name, p in by_member(priced).items()}
        self.hourly = {p.name: HourlyLedger(p.entry.gpu_hourly_usd, p.entry.gpus, p.entry.window_s, p.output_weight,
                                            p.cached_input_weight) for p in priced if p.is_hourly}

    def cost(self, backend: str, tokens: Tokens, now: float | None = None) -> tuple[Cost, str] | None:
        """The provisional cost of ``tokens`` served by ``backend``; None when it has no pricing."""
        name = self._of.get(backend)
        if name is None:
            return None
        now = time.time() if now is None else now
        if name in self.hourly:
            self.hourly[name].add(tokens, now)
        rates = self._rates(name, now)
        return (rates.cost(tokens) if rates is not None else Cost()), self._versions[name]

    def _rates(self, name: str, now: float) -> Rates | None:
        hourly = self.hourly.get(name)
        if hourly is not None:
            return hourly.rates(now)
        entry = next(p.entry for p in self.priced if p.name == name)
        return Rates.per_mtok(entry.input_per_mtok, entry.output_per_mtok, entry.cached_input_per_mtok)

    def estimate(self, names: tuple[str, ...], tokens: Tokens) -> float:
        """What ``tokens`` would cost on the first of ``names`` that has pricing, at today's rates,
        without counting them (a budget reservation); 0 when none is priced."""
        name = next((self._of[n] for n in names if n in self._of), None)
        rates = self._rates(name, time.time()) if name is not None else None
        return rates.cost(tokens).total if rates is not None else 0.0


def version_of(priced: Priced) -> str:
    """A hash of the pricing entry, with a measured output weight's value (a new calibration is a new version)."""
    entry = priced.entry.model_dump()
    if entry["output_weight"] == "measured":
        entry["output_weight"] = priced.output_weight
    if entry["cached_input_weight"] == "measured":
        entry["cached_input_weight"] = priced.cached_input_weight
    text = json.dumps(entry, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:12]
