"""Speculative decoding in ``/metrics``, read from the in-process engines at scrape time.

vLLM's ``vllm:spec_decode_*`` family under our prefix, labelled by backend and model:

- counters ``infer_spec_decode_num_drafts_total`` (verify steps), ``infer_spec_decode_num_draft_tokens_total``,
  ``infer_spec_decode_num_accepted_tokens_total`` and ``infer_spec_decode_num_accepted_tokens_per_pos_total``
  (``position``: draft j accepted), as vLLM's;
- gauges ``infer_spec_decode_acceptance_rate`` (accepted / draft tokens) and
  ``infer_spec_decode_mean_acceptance_length`` (tokens per verify step, the target's own included),
  which vLLM leaves to PromQL.

A backend takes part when it has ``spec_decode_stats() -> {model: counters}`` (the native engine's
``LLMEngine.spec_decode_stats``); models that never speculated are absent."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

_COUNTERS = (("num_drafts", "Verify steps (draft proposals checked by the target)."),
             ("num_draft_tokens", "Draft tokens the target verified."),
             ("num_accepted_tokens", "Draft tokens the target accepted."))
_GAUGES = (("acceptance_rate", "Accepted / draft tokens since the model loaded."),
           ("mean_acceptance_length", "Tokens per verify step since the model loaded, the target's own included."))


class SpecDecodeCollector(Collector):
    def __init__(self, targets: Callable[[], dict[str, Any]]) -> None:
        self.targets = targets

    def collect(self) -> Iterator:
        rows = list(self._rows())
        for name, doc in _COUNTERS:
            family = CounterMetricFamily(f"infer_spec_decode_{name}", doc, labels=["backend", "model"])
            for backend, model, stats in rows:
                family.add_metric([backend, model], stats[name])
            yield family
        per_pos = CounterMetricFamily("infer_spec_decode_num_accepted_tokens_per_pos", "Verify steps whose draft at "
                                      "this position was accepted.", labels=["backend", "model", "position"])
        for backend, model, stats in rows:
            for position, count in enumerate(stats["num_accepted_tokens_per_pos"]):
                per_pos.add_metric([backend, model, str(position)], count)
        yield per_pos
        for name, doc in _GAUGES:
            family = GaugeMetricFamily(f"infer_spec_decode_{name}", doc, labels=["backend", "model"])
            for backend, model, stats in rows:
                if stats[name] is not None:
                    family.add_metric([backend, model], stats[name])
            yield family

    def _rows(self) -> Iterator[tuple[str, str, dict]]:
        for backend_name, backend in self.targets().items():
            read = getattr(backend, "spec_decode_stats", None)
            if read is None:
                continue
            try:
                models = read()
            except Exception:  # advisory; an engine shutting down must not fail a scrape
                continue
            for model, stats in models.items():
                yield backend_name, model, stats
