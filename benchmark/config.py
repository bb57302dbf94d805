"""``infer bench`` settings, validated once at start; parsers for the flag mini-languages."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from .clients import Endpoint
from .cost import Pricing
from .metrics import DEFAULT_PERCENTILES, SLO_KEYS
from .profiles import Profile, SearchSettings
from .prompts import LengthSpec


def parse_goodput(items: list[str]) -> dict[str, float]:
    """``["ttft:500", "tpot:50"]`` (or one comma/space-separated string) -> {"ttft": 500.0, ...} in ms."""
    slos: dict[str, float] = {}
    for item in (part for text in items for part in text.replace(",", " ").split()):
        key, _, value = item.partition(":")
        if key not in SLO_KEYS:
            raise ValueError(f"--goodput {item!r}: key must be one of {', '.join(SLO_KEYS)}")
        try:
            slos[key] = float(value)
        except ValueError:
            raise ValueError(f"--goodput {item!r}: value must be a number of ms") from None
        if slos[key] < 0:
            raise ValueError(f"--goodput {item!r}: value must be >= 0 ms")
    return slos


def parse_labels(items: list[str]) -> dict[str, str]:
    labels = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--label {item!r} is not KEY=VALUE")
        labels[key] = value
    return labels


def parse_extra_body(text: str | None) -> dict | None:
    if not text:
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"--extra-body is not JSON: {exc.msg}") from None
    if not isinstance(value, dict):
        raise ValueError("--extra-body must be a JSON object")
    return value


@dataclass(frozen=True)
class BenchConfig:
    endpoint: Endpoint
    profile: Profile = field(default_factory=lambda: Profile("synchronous"))
    num_requests: int = 20
    duration: float | None = None
    warmup: int = 0
    input_tokens: LengthSpec = field(default_factory=lambda: LengthSpec(256))
    output_tokens: LengthSpec = field(default_factory=lambda: LengthSpec(128))
    output_tokens_given: bool = True
    dataset: Path | None = None
    tokenizer: Path | None = None
    search: SearchSettings = field(default_factory=SearchSettings)
    pricing: Pricing | None = None
    out: Path | None = None
    labels: dict[str, str] = field(default_factory=dict)
    percentiles: tuple[float, ...] = DEFAULT_PERCENTILES
    seed: int = 0
    scrape_metrics: bool = True
    shared_prefix: int = 0  # tokens every other synthetic prompt starts with (cached prefill's cost)

    def __post_init__(self) -> None:
        if self.num_requests < 1:
            raise ValueError("--num-requests must be >= 1")
        if self.duration is not None and self.duration <= 0:
            raise ValueError("--duration must be > 0 seconds")
        if self.warmup < 0:
            raise ValueError("--warmup must be >= 0")
        if self.shared_prefix < 0 or (self.shared_prefix and self.dataset):
            raise ValueError("--shared-prefix must be >= 0 and goes with synthetic prompts, not --dataset")
        if self.search.max_concurrency < 1 or self.search.sweep_size < 3:
            raise ValueError("--max-concurrency must be >= 1 and --sweep-size >= 3")
        if not 0 < self.search.target_attainment <= 1:
            raise ValueError("--target-attainment must be in (0, 1]")
        if self.profile.kind == "slo-search" and not self.search.goodput_slos:
            raise ValueError("--profile slo-search needs --goodput, e.g. --goodput \"ttft:500 tpot:50\"")

    @property
    def goodput_slos(self) -> dict[str, float] | None:
        return self.search.goodput_slos
