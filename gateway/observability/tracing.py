"""OpenTelemetry traces, on when ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or ``…_TRACES_ENDPOINT``) is set.

:func:`tracer_from_env` returns ``None`` otherwise, and every caller checks for ``None``: with tracing
off a request pays one comparison and nothing of OpenTelemetry is imported.

With tracing on:

- one span per generation or embedding request, named ``{operation} {model}`` (``chat tiny``,
  ``text_completion tiny``, ``embeddings tiny``), with the GenAI semantic-convention attributes
  (``gen_ai.operation.name``, ``gen_ai.provider.name`` and the older ``gen_ai.system`` = the
  backend type, ``gen_ai.request.model``/``max_tokens``/``temperature``/``top_p``,
  ``gen_ai.response.model``, ``gen_ai.response.finish_reasons``, ``gen_ai.usage.input_tokens``/
  ``output_tokens``, ``server.address``/``server.port`` of a remote backend) and ours:
  ``infer.endpoint``, ``infer.route``, ``infer.backend``, ``infer.ttft_s``, ``infer.queue_s``;
  a failed request has status ERROR and ``error.type``;
- an incoming W3C ``traceparent`` is continued (:class:`TraceContextMiddleware`), and the span's
  context is injected into every request a remote adapter sends for it (``RemoteBackend.inject``);
- spans leave through a ``BatchSpanProcessor`` (its own thread) and the OTLP/HTTP protobuf
  exporter, configured by the standard ``OTEL_*`` variables; ``OTEL_SERVICE_NAME`` defaults to ``infer``.

Nothing is installed globally (no global tracer provider or propagator): the app owns its tracer.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from core.base import GenerationRequest

ENDPOINT_VARS = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")


def tracer_from_env(environ: Mapping[str, str] | None = None) -> "Tracer | None":
    env = os.environ if environ is None else environ
    if not any(env.get(name) for name in ENDPOINT_VARS):
        return None
    return Tracer(env.get("OTEL_SERVICE_NAME") or "infer")


class Tracer:
    def __init__(self, service_name: str) -> None:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self.provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
        self.provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        self.tracer = self.provider.get_tracer("infer.gateway")
        self.propagator = TraceContextTextMapPropagator()

    # -- spans ------------------------------------------------------------------------------------

    def start(self, request: GenerationRequest, *, endpoint: str, backend: Any, label: str) -> Any:
        operation = "chat" if request.is_chat else "text_completion"
        attributes = {"gen_ai.operation.name": operation, "gen_ai.request.model": request.model,
                      "infer.endpoint": endpoint, "infer.backend": label, **_backend_attributes(backend)}
        for option, key in (("num_predict", "gen_ai.request.max_tokens"), ("temperature",
                            "gen_ai.request.temperature"), ("top_p", "gen_ai.request.top_p")):
            value = request.options.get(option)
            if value is not None:
                attributes[key] = value
        return self._span(f"{operation} {request.model}", attributes, remote=hasattr(backend, "settings"))

    def start_embedding(self, model: str, *, endpoint: str, backend: Any, label: str) -> Any:
        attributes = {"gen_ai.operation.name": "embeddings", "gen_ai.request.model": model,
                      "infer.endpoint": endpoint, "infer.backend": label, **_backend_attributes(backend)}
        return self._span(f"embeddings {model}", attributes, remote=hasattr(backend, "settings"))

    def _span(self, name: str, attributes: dict[str, Any], *, remote: bool) -> Any:
        from opentelemetry.trace import SpanKind

        kind = SpanKind.CLIENT if remote else SpanKind.INTERNAL
        return self.tracer.start_span(name, kind=kind, attributes=attributes)

    def end(self, span: Any, record: Any, *, backend: str, error_type: str = "") -> None:
        """Close ``span`` with what the ledger row says (``ledger.tables.UsageRecord``)."""
        from opentelemetry.trace import Status, StatusCode

        attributes: dict[str, Any] = {
            "gen_ai.response.model": record.model, "gen_ai.usage.input_tokens": record.input_tokens,
            "gen_ai.usage.output_tokens": record.output_tokens, "infer.backend": backend,
            "infer.route": record.route_name or "", "infer.status": record.status}
        if record.finish_reason:
            attributes["gen_ai.response.finish_reasons"] = [record.finish_reason]
        for field, key in (("ttft_ms", "infer.ttft_s"), ("queue_ms", "infer.queue_s")):
            value = getattr(record, field, None)
            if value is not None:
                attributes[key] = value / 1000
        span.set_attributes(attributes)
        if record.status in ("error", "shed"):
            span.set_attribute("error.type", error_type or "error")
            span.set_status(Status(StatusCode.ERROR, record.error or error_type))
        span.end()

    # -- propagation ------------------------------------------------------------------------------

    def context_of(self, span: Any) -> Any:
        from opentelemetry import trace

        return trace.set_span_in_context(span)

    def attach(self, context: Any) -> Any:
        from opentelemetry import context as otel_context

        return otel_context.attach(context)

    def detach(self, token: Any) -> None:
        from opentelemetry import context as otel_context

        otel_context.detach(token)

    def inject(self, headers: dict[str, str]) -> None:
        """Add ``traceparent`` (the current span's) to an outgoing request's headers."""
        self.propagator.inject(headers)

    def extract(self, headers: Mapping[str, str]) -> Any:
        return self.propagator.extract(headers)

    async def aclose(self, timeout: float = 2.0) -> None:
        """Flush the spans still queued, waiting at most ``timeout`` seconds: a collector that is down
        (the exporter retries for up to 10 s) never holds the server's shutdown."""
        done = threading.Event()

        def shutdown() -> None:
            self.provider.shutdown()
            done.set()
        threading.Thread(target=shutdown, name="otel-shutdown", daemon=True).start()
        await asyncio.to_thread(done.wait, timeout)


def _backend_attributes(backend: Any) -> dict[str, Any]:
    settings = getattr(backend, "settings", None)
    kind = getattr(settings, "type", None) or getattr(backend, "name", "") or "infer"
    attributes: dict[str, Any] = {"gen_ai.provider.name": kind, "gen_ai.system": kind}
    base_url = getattr(settings, "base_url", None)
    if isinstance(base_url, str):
        parts = urlsplit(base_url)
        if parts.hostname:
            attributes["server.address"] = parts.hostname
        if parts.port:
            attributes["server.port"] = parts.port
    return attributes


class TraceContextMiddleware:
    """ASGI: a request's ``traceparent``/``tracestate`` become the current context while it is served
    (installed only with tracing on)."""

    def __init__(self, app: Any, tracer: Tracer) -> None:
        self.app, self.tracer = app, tracer

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]
                   if k in (b"traceparent", b"tracestate")}
        if not headers:
            await self.app(scope, receive, send)
            return
        token = self.tracer.attach(self.tracer.extract(headers))
        try:
            await self.app(scope, receive, send)
        finally:
            self.tracer.detach(token)
