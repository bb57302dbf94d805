"""Prometheus metrics for ``/metrics``: one registry per app, labelled by model."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

# Buckets in seconds; TTFT spans load-free prefill to cold loads, TPOT a few ms to a second.
TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.15, 0.3, 0.6, 1.2)
E2E_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)


class GatewayMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.routes = None  # routing.metrics.RouteMetrics when the config has routes
        r = self.registry
        self.requests = Counter("infer_requests", "Requests finished, by outcome.",
                                ["model", "route", "status"], registry=r)
        self.input_tokens = Counter("infer_input_tokens", "Prompt tokens processed.", ["model"], registry=r)
        self.output_tokens = Counter("infer_output_tokens", "Tokens generated.", ["model"], registry=r)
        self.cached_tokens = Counter("infer_cached_input_tokens", "Prompt tokens served from the KV cache.",
                                     ["model"], registry=r)
        self.ttft = Histogram("infer_time_to_first_token_seconds", "Time to first token.", ["model"],
                              buckets=TTFT_BUCKETS, registry=r)
        self.tpot = Histogram("infer_time_per_output_token_seconds", "Mean time per output token after the first.",
                              ["model"], buckets=TPOT_BUCKETS, registry=r)
        self.e2e = Histogram("infer_request_duration_seconds", "End-to-end request latency.", ["model"],
                             buckets=E2E_BUCKETS, registry=r)
        self.cost = Counter("infer_cost_usd", "What requests cost, by token kind (provisional for hour-priced "
                            "backends).", ["route", "backend", "kind"], registry=r)
        self.in_flight = Gauge("infer_requests_in_flight", "Requests being served now.", ["model"], registry=r)

    def render(self) -> bytes:
        if self.routes is not None:
            self.routes.refresh()
        return generate_latest(self.registry)
