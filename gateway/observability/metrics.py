"""Prometheus metrics for ``/metrics``: one registry per app.

Per request (set when its ledger row is written, ``observe``):

- ``infer_requests_total{model,endpoint,route,backend,status,finish_reason,error_type}``: ``endpoint``
  is the API path (``/v1/chat/completions``), ``route`` the config's SLO route ("" when none),
  ``status`` ok | error | cancelled | shed, ``error_type`` the error's class (``BackendTimeout``…);
- ``infer_input_tokens_total``, ``infer_output_tokens_total``, ``infer_cached_input_tokens_total``
  ``{model,backend}``;
- histograms ``{model,route,backend}``: ``infer_time_to_first_token_seconds``,
  ``infer_time_per_output_token_seconds``, ``infer_request_duration_seconds`` and
  ``infer_request_queue_time_seconds`` (admitted → the backend starts work on it: the engine
  scheduler's wait, a remote backend's wait for a ``max_inflight`` slot);
- ``infer_requests_in_flight{model}``.

Per backend, read at scrape time from :class:`gateway.observability.monitor.BackendMonitor` (``refresh``):
``infer_backend_up``, ``infer_backend_requests_in_flight`` (the gateway's own count),
``infer_num_requests_running``, ``infer_num_requests_waiting`` (queue depth) and
``infer_kv_cache_usage_perc`` (0-1; the native engine's block manager, llama.cpp's slots, or the
figure a remote backend reports on its ``/metrics``), named as vLLM names its own gauges; and the
native engine's speculative decoding counters, ``infer_spec_decode_*`` (``gateway.observability.spec_decode_metrics``).

Label children are cached per label tuple, so a request costs dictionary lookups, not
``labels()`` calls. The ``*_created`` series are off (``disable_created_metrics``, once, when the
first registry is made).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics, generate_latest

disable_created_metrics()  # the gateway's own registries only carry counters/histograms without *_created

# Buckets in seconds; TTFT spans load-free prefill to cold loads, TPOT a few ms to a second.
TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.15, 0.3, 0.6, 1.2)
E2E_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
QUEUE_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)

_REQUEST_LABELS = ["model", "endpoint", "route", "backend", "status", "finish_reason", "error_type"]
_LATENCY_LABELS = ["model", "route", "backend"]


class _Latency:
    """The children of one (model, route, backend): the histograms and token counters a request touches."""

    __slots__ = ("ttft", "tpot", "e2e", "queue", "input_tokens", "output_tokens", "cached_tokens")

    def __init__(self, m: "GatewayMetrics", model: str, route: str, backend: str) -> None:
        self.ttft = m.ttft.labels(model, route, backend)
        self.tpot = m.tpot.labels(model, route, backend)
        self.e2e = m.e2e.labels(model, route, backend)
        self.queue = m.queue_time.labels(model, route, backend)
        self.input_tokens = m.input_tokens.labels(model, backend)
        self.output_tokens = m.output_tokens.labels(model, backend)
        self.cached_tokens = m.cached_tokens.labels(model, backend)


class GatewayMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.routes = None  # routing.metrics.RouteMetrics when the config has routes
        self.monitor = None  # gateway.observability.monitor.BackendMonitor, set by the app
        r = self.registry
        self.requests = Counter("infer_requests", "Requests finished, by outcome.", _REQUEST_LABELS, registry=r)
        self.input_tokens = Counter("infer_input_tokens", "Prompt tokens processed.", ["model", "backend"], registry=r)
        self.output_tokens = Counter("infer_output_tokens", "Tokens generated.", ["model", "backend"], registry=r)
        self.cached_tokens = Counter("infer_cached_input_tokens", "Prompt tokens served from the KV cache.",
                                     ["model", "backend"], registry=r)
        self.ttft = Histogram("infer_time_to_first_token_seconds", "Time to first token.", _LATENCY_LABELS,
                              buckets=TTFT_BUCKETS, registry=r)
        self.tpot = Histogram("infer_time_per_output_token_seconds", "Mean time per output token after the first.",
                              _LATENCY_LABELS, buckets=TPOT_BUCKETS, registry=r)
        self.e2e = Histogram("infer_request_duration_seconds", "End-to-end request latency.", _LATENCY_LABELS,
                             buckets=E2E_BUCKETS, registry=r)
        self.queue_time = Histogram("infer_request_queue_time_seconds", "Time from admission until the backend "
                                    "started work on the request.", _LATENCY_LABELS, buckets=QUEUE_BUCKETS,
                                    registry=r)
        self.cost = Counter("infer_cost_usd", "What requests cost, by token kind (provisional for hour-priced "
                            "backends).", ["route", "backend", "kind"], registry=r)
        self.overruns = Counter("infer_backend_output_overruns", "Requests whose backend reported more output than "
                                "the cap the gateway enforced (it ignored max_tokens); the excess is never charged.",
                                ["backend"], registry=r)
        self.overrun_tokens = Counter("infer_backend_output_overrun_tokens", "Output tokens backends reported beyond "
                                      "the gateway's cap (not forwarded, not charged).", ["backend"], registry=r)
        self.in_flight = Gauge("infer_requests_in_flight", "Requests being served now.", ["model"], registry=r)
        self._outcomes: dict[tuple, Counter] = {}
        self._latency: dict[tuple, _Latency] = {}
        self._in_flight: dict[str, Gauge] = {}

    def outcome(self, *labels: str) -> Counter:
        """The request counter's child for ``_REQUEST_LABELS`` values, cached."""
        child = self._outcomes.get(labels)
        if child is None:
            child = self._outcomes[labels] = self.requests.labels(*labels)
        return child

    def latency(self, model: str, route: str, backend: str) -> _Latency:
        key = (model, route, backend)
        children = self._latency.get(key)
        if children is None:
            children = self._latency[key] = _Latency(self, model, route, backend)
        return children

    def in_flight_of(self, model: str) -> Gauge:
        child = self._in_flight.get(model)
        if child is None:
            child = self._in_flight[model] = self.in_flight.labels(model)
        return child

    def render(self) -> bytes:
        if self.routes is not None:
            self.routes.refresh()
        if self.monitor is not None:
            self.monitor.refresh()
        return generate_latest(self.registry)
