"""Prometheus series of the routes, fed by each route's outcomes and refreshed at scrape time.

Latency histograms are labelled by route and backend and have bucket edges at every SLO value of
the config (so "share under the SLO" is exact from the buckets); the gauges (attainment, goodput)
are set from the routes' windows when ``/metrics`` is read; ``infer_backend_up`` of every backend,
route members included, is ``gateway/observability/monitor.py``'s.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from .route import Route
from .stats import Outcome

_BASE_TTFT = (0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
_BASE_TPOT = (0.005, 0.01, 0.02, 0.04, 0.08, 0.15, 0.3, 0.6)
_BASE_E2E = (0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


class RouteMetrics:
    def __init__(self, registry: CollectorRegistry, routes: Iterable[Route]) -> None:
        self.routes = list(routes)
        slos = [r.policy.slo for r in self.routes]
        edges = lambda base, values: tuple(sorted({*base, *(v / 1000 for v in values if v)}))  # noqa: E731
        labels = ["route", "backend"]
        self.ttft = Histogram("infer_route_time_to_first_token_seconds", "TTFT through a route.", labels,
                              buckets=edges(_BASE_TTFT, [s.ttft_ms for s in slos]), registry=registry)
        self.tpot = Histogram("infer_route_time_per_output_token_seconds", "TPOT (vLLM's) through a route.", labels,
                              buckets=edges(_BASE_TPOT, [s.tpot_ms for s in slos]), registry=registry)
        self.e2e = Histogram("infer_route_request_duration_seconds", "End-to-end latency through a route.", labels,
                             buckets=edges(_BASE_E2E, [s.e2e_ms for s in slos]), registry=registry)
        self.violations = Counter("infer_slo_violations", "Requests that missed an SLO part.",
                                  ["route", "backend", "kind"], registry=registry)
        self.shed = Counter("infer_requests_shed", "Requests refused by admission control.", ["route", "reason"],
                            registry=registry)
        self.attainment = Gauge("infer_slo_attainment", "Share of requests that met their SLO over the window.",
                                ["route"], registry=registry)
        self.goodput = Gauge("infer_goodput_requests_per_second", "Requests that met their SLO, per second.",
                             ["route"], registry=registry)

    def outcome(self, route: str, o: Outcome) -> None:
        backend = o.backend or "none"
        if o.kind == "shed":
            self.shed.labels(route, "slo").inc()
            return
        if o.kind != "ok":
            return
        for histogram, value in ((self.ttft, o.ttft_s), (self.tpot, o.tpot_s), (self.e2e, o.e2e_s)):
            if value is not None:
                histogram.labels(route, backend).observe(value)
        for part in o.missed:
            self.violations.labels(route, backend, part).inc()

    def refresh(self) -> None:
        for route in self.routes:
            summary = route.window.summary()
            if summary["attainment"] is not None:
                self.attainment.labels(route.name).set(summary["attainment"])
            self.goodput.labels(route.name).set(summary["goodput_rps"])
