"""Where ``infer bench`` keeps its runs, and the latest calibration of a backend among them.

A run without ``--out`` is saved under ``$INFER_HOME/bench/<UTC time>/`` (``summary.json`` and the
rest of ``report.write_outputs``). Each load point of a summary carries ``prefill_decode_ratio``:
prefill tok/s ÷ decode tok/s measured on its requests (``cost.prefill_decode_ratio``), which is the
output weight ``k`` of ``metrics-and-cost.md`` §4.2, and, when the backend reported cached prompt
tokens (``infer bench --shared-prefix``), ``cached_prefill_weight``: what a cached prompt token costs
in prefill time against an uncached one (``cost.cached_prefill_weight``), the cached input weight.
A run's calibration is the figure of its load point with the highest total token throughput (the
one nearest saturation) that has it.

A run calibrates a backend when its ``--label backend=NAME`` names it, when its ``--model`` is one
of the backend's names (benched through ``infer serve``), or when its ``--url`` and ``--model`` are
the backend's own ``base_url`` and ``model`` (benched directly). The latest such run, by the
summary's ``date``, wins.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

RUNS_DIR = "bench"  # under INFER_HOME


def runs_dir(home: Path) -> Path:
    return home / RUNS_DIR


def new_run_dir(home: Path) -> Path:
    """A fresh directory for a run saved by default: ``$INFER_HOME/bench/20261123T230500Z``."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    path, n = runs_dir(home) / stamp, 1
    while path.exists():
        n += 1
        path = runs_dir(home) / f"{stamp}-{n}"
    return path


OUTPUT = "prefill_decode_ratio"     # a load point's figure for output_weight
CACHED = "cached_prefill_weight"     # and for cached_input_weight
_NAMES = {OUTPUT: "output_weight", CACHED: "cached_input_weight"}


@dataclass(frozen=True)
class Calibration:
    output_weight: float  # the weight measured (for ``field`` CACHED: the cached input weight)
    date: str
    path: Path
    load_point: str
    field: str = OUTPUT

    def describe(self) -> str:
        return (f"{_NAMES[self.field]} {self.output_weight:.4g} measured by infer bench at {self.date} "
                f"from {self.path} "
                f"(load point {self.load_point})")


def latest_calibration(home: Path, names: Iterable[str], address: tuple[str, str] | None = None,
                       field: str = OUTPUT) -> Calibration | None:
    """The newest run under ``$INFER_HOME/bench`` that calibrates the backend known by ``names``
    (at ``address`` = its base URL and model) with a ``field`` figure, or None."""
    names = set(names)
    found = [c for c in (_calibration(f, names, address, field) for f in runs_dir(home).glob("*/summary.json")) if c]
    return max(found, key=lambda c: (c.date, str(c.path)), default=None)


def _calibration(file: Path, names: set[str], address: tuple[str, str] | None, field: str) -> Calibration | None:
    try:
        summary = json.loads(file.read_text(encoding="utf-8"))
        if not _targets(summary, names, address):
            return None
        points = [p for p in summary["load_points"] if _ratio(p, field) is not None]
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return None  # not a bench summary: some other file
    if not points:
        return None
    best = max(points, key=lambda p: p.get("total_token_throughput") or 0.0)
    return Calibration(_ratio(best, field), str(summary.get("date", "")), file.parent, str(best.get("load_point", "")),
                       field)


def _targets(summary: dict, names: set[str], address: tuple[str, str] | None) -> bool:
    if (summary.get("label") or {}).get("backend") in names or summary.get("model_id") in names:
        return True
    return address is not None and (_root(summary.get("base_url") or ""), summary.get("model_id")) == (
        _root(address[0]), address[1])


def _ratio(point: dict, field: str = OUTPUT) -> float | None:
    value = point.get(field)
    ok = isinstance(value, (int, float)) and math.isfinite(value) and (value > 0 or (field == CACHED and value == 0))
    return float(value) if ok else None


def _root(url: str) -> str:
    url = url.strip().rstrip("/")
    return url[:-3].rstrip("/") if url.endswith("/v1") else url
