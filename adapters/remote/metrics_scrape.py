"""Load signals from a backend's Prometheus ``/metrics`` page, for ``health()`` and routing.

``scrape(text, names, labels)`` sums the samples (a ratio takes the largest) of each wanted metric whose labels match (so a
vLLM server with several engines reports one figure) and returns them under our own keys.
"""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

# Info gauges (value 1) whose figure is in their labels: vLLM's KV cache size in tokens.
_FROM_LABELS = {"vllm:cache_config_info": lambda labels: float(labels["num_gpu_blocks"]) * float(labels["block_size"])}


def scrape(text: str, names: dict[str, str], labels: dict[str, str] | None = None,
           ratios: frozenset[str] = frozenset()) -> dict[str, float]:
    """``names`` maps a metric name (as exposed, e.g. ``vllm:num_requests_waiting``) to our key;
    keys in ``ratios`` (a 0-1 usage) take the largest sample instead of the sum."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            key = names.get(sample.name)
            if key is None or not _matches(sample.labels, labels):
                continue
            value = float(sample.value)
            if sample.name in _FROM_LABELS:
                try:
                    value = _FROM_LABELS[sample.name](sample.labels)
                except (KeyError, ValueError):
                    continue
            out[key] = max(out.get(key, value), value) if key in ratios else out.get(key, 0.0) + value
    return out


def _matches(sample_labels: dict[str, str], wanted: dict[str, str] | None) -> bool:
    return all(sample_labels.get(k, v) == v for k, v in (wanted or {}).items())
