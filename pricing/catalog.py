"""Who is priced how: one :class:`Priced` per pricing entry of the config, with the ledger's backend
names it prices and its output weight, resolved once at start.

A remote backend's entry prices that backend. ``local: {pricing: …}`` is one bill for this machine:
it prices the in-process engines (``llamacpp``, ``native``) and every route member that is a model
of the local store, which share that bill.

``output_weight: measured`` is resolved here from the latest ``infer bench`` run that calibrates the
backend (``pricing.calibration``); without one it is :data:`DEFAULT_OUTPUT_WEIGHT`, and
``weight_source`` says which command to run. ``cached_input_weight: measured`` likewise, from the
latest run that measured cached prefill (``infer bench --shared-prefix N`` against a backend that
reports cached tokens); without one :data:`DEFAULT_CACHED_WEIGHT`. ``weight_source`` travels to the log at start, to
``infer cost`` and to ``GET /infer/cost``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .calibration import CACHED, OUTPUT, latest_calibration, runs_dir

log = logging.getLogger(__name__)

DEFAULT_OUTPUT_WEIGHT = 5.0  # output_weight: measured, before any infer bench calibration
DEFAULT_CACHED_WEIGHT = 0.1  # cached_input_weight: measured, before any (and its configured default)
LOCAL = "local"


@dataclass(frozen=True)
class Priced:
    name: str                  # a backend's name, or "local"
    entry: Any                 # gateway.backends_config.PricingEntry
    members: tuple[str, ...]   # the ledger's backend names this entry prices
    output_weight: float = DEFAULT_OUTPUT_WEIGHT
    weight_source: str = "configured"
    cached_input_weight: float = 0.1
    cached_weight_source: str = "configured"

    @property
    def is_hourly(self) -> bool:
        return self.entry.gpu_hourly_usd is not None

    @classmethod
    def of(cls, name: str, entry: Any, members: tuple[str, ...] = (), *, home: Path | None = None,
           address: tuple[str, str] | None = None) -> Priced:
        """``entry`` pricing ``members`` (default: ``name`` alone), its weight resolved under ``home``."""
        members = members or (name,)
        output = ((float(entry.output_weight), "configured") if entry.output_weight != "measured"
                  else measured_weight(name, members, address, home))
        cached = ((float(entry.cached_input_weight), "configured") if entry.cached_input_weight != "measured"
                  else measured_weight(name, members, address, home, CACHED))
        return cls(name, entry, members, *output, *cached)


def measured_weight(name: str, members: tuple[str, ...], address: tuple[str, str] | None,
                    home: Path | None, field: str = OUTPUT) -> tuple[float, str]:
    """The latest bench calibration's weight and where it came from, or the default and what to run."""
    found = latest_calibration(home, {name, *members}, address, field) if home is not None else None
    if found is not None:
        log.info("%s: %s", name, found.describe())
        return found.output_weight, found.describe()
    url, model = address or ("http://127.0.0.1:11434", "MODEL")
    where = runs_dir(home) if home is not None else "$INFER_HOME/bench"
    default, what, extra = ((DEFAULT_OUTPUT_WEIGHT, "output_weight", "") if field == OUTPUT
                            else (DEFAULT_CACHED_WEIGHT, "cached_input_weight", " --shared-prefix 1024"))
    source = (f"{what} {default:g} (default): no infer bench calibration of {name} in {where}; "
              f"run: infer bench --url {url} --model {model}{extra} --label backend={name}")
    log.warning("%s: %s", name, source)
    return default, source


def by_member(priced: list[Priced]) -> dict[str, Priced]:
    return {member: p for p in priced for member in p.members}


def owner(members: dict[str, Priced], backend: str, model: str) -> Priced | None:
    """The entry that prices a ledger row, as the recorder costs it: by the row's backend (an engine,
    a route's member), else by its model (a remote backend's public name: the row's backend is then
    the adapter's type, e.g. ``vllm``)."""
    return members.get(backend) or members.get(model)
