"""What a Prometheus/OpenTelemetry user sees from a live ``infer serve``: ``/metrics`` after scripted
requests (labels, queue depth and time, backend up and load, error types, no ``*_created``),
``/health`` and ``/ready``, and OTLP spans with the GenAI attributes whose trace reaches the backend
as ``traceparent``."""

from __future__ import annotations

import gzip
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest
import yaml
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from prometheus_client.parser import text_string_to_metric_families

from fakes.live import free_port, start_server, stop_server
from fakes import Behaviour, start_server as start_fake

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"


class OTLPReceiver:
    """An OTLP/HTTP trace receiver on 127.0.0.1: decodes each ExportTraceServiceRequest into spans."""

    def __init__(self) -> None:
        self.spans: list = []
        spans = self.spans

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                request = ExportTraceServiceRequest.FromString(body)
                spans.extend(s for r in request.resource_spans for scope in r.scope_spans for s in scope.spans)
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def wait_for(self, predicate, timeout: float = 10.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = [s for s in list(self.spans) if predicate(s)]
            if found:
                return found[0]
            time.sleep(0.05)
        raise AssertionError(f"no such span among {[s.name for s in self.spans]}")


def attributes(span) -> dict:
    out = {}
    for kv in span.attributes:
        value = kv.value
        kind = value.WhichOneof("value")
        array = kind == "array_value"
        out[kv.key] = [v.string_value for v in value.array_value.values] if array else getattr(value, kind)
    return out


@pytest.fixture(scope="module")
def receiver():
    server = OTLPReceiver()
    yield server
    server.server.shutdown()


@pytest.fixture(scope="module")
def vllm():
    server = start_fake("vllm", Behaviour(running=3, waiting=2, kv_usage=0.25))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def tgi():
    server = start_fake("tgi")
    yield server
    server.stop()


@pytest.fixture(scope="module")
def gateway(vllm, tgi, receiver, tiny_store, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("obs")
    config = tmp / "backends.yaml"
    config.write_text(yaml.safe_dump({"backends": [
        {"name": "vl", "type": "vllm", "base_url": vllm.url, "model": vllm.behaviour.models[0], "max_inflight": 1},
        {"name": "tg", "type": "tgi", "base_url": tgi.url, "model": tgi.behaviour.models[0]},
        {"name": "dead", "type": "vllm", "base_url": f"http://127.0.0.1:{free_port()}", "model": "m",
         "timeout": {"connect": 1}}]}))
    server = start_server(tmp, tiny_store.root, INFER_CONFIG=str(config), OTEL_EXPORTER_OTLP_ENDPOINT=receiver.url,
                          OTEL_BSP_SCHEDULE_DELAY="50")
    yield server
    stop_server(server)


def samples(url: str) -> dict[tuple, float]:
    """``{(name, (label, value)...): value}`` of a /metrics page."""
    page = httpx.get(url + "/metrics").text
    return {(s.name, *sorted(s.labels.items())): s.value
            for family in text_string_to_metric_families(page) for s in family.samples}


def value(found: dict, name: str, **labels: str) -> float | None:
    return next((v for (n, *items), v in found.items() if n == name and labels.items() <= dict(items).items()), None)


def chat(url: str, model: str, **extra) -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5, **extra}
    return httpx.post(url + "/v1/chat/completions", json=body, timeout=30)


def test_metrics_after_scripted_requests(gateway, vllm):
    assert httpx.get(gateway.url + "/ready").status_code == 200  # waits for the first health checks
    assert chat(gateway.url, "vl").status_code == 200
    failed = chat(gateway.url, "dead")
    assert failed.status_code == 502, failed.text
    assert chat(gateway.url, "tiny").status_code == 200
    page = httpx.get(gateway.url + "/metrics").text
    assert "_created" not in page
    found = samples(gateway.url)
    ok = dict(model="vl", endpoint="/v1/chat/completions", route="", backend="vl", status="ok", error_type="")
    assert value(found, "infer_requests_total", **ok) == 1.0
    assert value(found, "infer_requests_total", model="dead", backend="dead", status="error",
                 error_type="BackendUnavailable", finish_reason="") == 1.0
    assert value(found, "infer_requests_total", model="tiny", backend="llamacpp", status="ok") == 1.0
    assert value(found, "infer_time_to_first_token_seconds_count", model="vl", route="", backend="vl") == 1.0
    assert value(found, "infer_request_queue_time_seconds_count", model="tiny", backend="llamacpp") == 1.0
    assert value(found, "infer_output_tokens_total", model="vl", backend="vl") > 0
    # Per backend: up, and the load vLLM reports on its /metrics.
    assert value(found, "infer_backend_up", backend="vl") == 1.0
    assert value(found, "infer_backend_up", backend="dead") == 0.0
    assert value(found, "infer_num_requests_running", backend="vl") == 3.0
    assert value(found, "infer_num_requests_waiting", backend="vl") == 2.0
    assert value(found, "infer_kv_cache_usage_perc", backend="vl") == 0.25
    assert value(found, "infer_backend_up", backend="llamacpp") == 1.0
    assert 0 < value(found, "infer_kv_cache_usage_perc", backend="llamacpp") < 1


def test_queue_depth_and_queue_time_for_a_remote_past_max_inflight(gateway, vllm):
    vllm.behaviour.token_delay = 0.2  # 5 streamed tokens: a second per request
    before = value(samples(gateway.url), "infer_request_queue_time_seconds_count", model="vl", backend="vl") or 0
    results: list[httpx.Response] = []
    threads = [threading.Thread(target=lambda: results.append(chat(gateway.url, "vl", stream=True))) for _ in range(2)]
    try:
        for t in threads:
            t.start()
        deadline, seen = time.monotonic() + 5, None
        while time.monotonic() < deadline:
            found = samples(gateway.url)
            seen = (value(found, "infer_num_requests_waiting", backend="vl"),
                    value(found, "infer_backend_requests_in_flight", backend="vl"))
            if seen == (3.0, 2.0):  # vLLM's 2 waiting + 1 in the gateway for the one slot; 2 sent our way
                break
            time.sleep(0.02)
        assert seen == (3.0, 2.0), (results, [r.text for r in results])
        view = {b["name"]: b for b in httpx.get(gateway.url + "/infer/backends").json()["backends"]}
        assert (view["vl"]["requests_waiting"], view["vl"]["in_flight"], view["vl"]["up"]) == (3.0, 2, True)
        for t in threads:
            t.join(30)
    finally:
        vllm.behaviour.token_delay = 0.0
    assert [r.status_code for r in results] == [200, 200]
    found = samples(gateway.url)
    assert value(found, "infer_request_queue_time_seconds_count", model="vl", backend="vl") == before + 2
    # One waited for the other's second, less however late the second thread's request came (0.2 s
    # on a busy machine): well over half of it.
    assert value(found, "infer_request_queue_time_seconds_sum", model="vl", backend="vl") > 0.5
    assert value(found, "infer_num_requests_waiting", backend="vl") == 2.0


def test_gauges_show_a_backend_load_change_at_the_next_scrape(gateway, vllm):
    """The backend's figures are read when /metrics answers: a change shows at the very next scrape, not
    at the next health poll (every 5 s) nor when a cached read expires."""
    assert httpx.get(gateway.url + "/ready").status_code == 200
    samples(gateway.url)
    vllm.behaviour.running, vllm.behaviour.waiting = 7, 4
    try:
        found = samples(gateway.url)
        assert (value(found, "infer_num_requests_running", backend="vl"),
                value(found, "infer_num_requests_waiting", backend="vl")) == (7.0, 4.0)
    finally:
        vllm.behaviour.running, vllm.behaviour.waiting = 3, 2


def test_requests_sent_that_the_backend_does_not_count_yet_are_waiting_there(gateway, vllm):
    """vLLM's API server holds requests its scheduler has not seen yet: a backend reporting nothing running
    while the gateway has a request there shows it waiting."""
    vllm.behaviour.running, vllm.behaviour.waiting, vllm.behaviour.token_delay = 0, 0, 1.0
    result: list[httpx.Response] = []
    thread = threading.Thread(target=lambda: result.append(chat(gateway.url, "vl", stream=True)))
    try:
        thread.start()
        deadline, seen = time.monotonic() + 10, None
        while time.monotonic() < deadline:
            view = {b["name"]: b for b in httpx.get(gateway.url + "/infer/backends").json()["backends"]}["vl"]
            seen = (view["in_flight"], view["requests_running"], view["requests_waiting"])
            if seen[0] == 1:
                break
            time.sleep(0.02)
        assert seen == (1, 0.0, 1.0), (seen, [r.status_code for r in result])
        thread.join(30)
    finally:
        vllm.behaviour.running, vllm.behaviour.waiting, vllm.behaviour.token_delay = 3, 2, 0.0
    assert result[0].status_code == 200


def test_queue_time_a_backend_reports(gateway, tgi):
    """TGI's ``x-queue-time`` header (its scheduler's wait, ms) is the queue time of a one-reply request."""
    tgi.behaviour.first_byte_delay = 0.3  # the fake reports its delay as time queued
    try:
        assert chat(gateway.url, "tg").status_code == 200
    finally:
        tgi.behaviour.first_byte_delay = 0.0
    found = samples(gateway.url)
    assert value(found, "infer_request_queue_time_seconds_count", model="tg", backend="tg") == 1.0
    queued = value(found, "infer_request_queue_time_seconds_sum", model="tg", backend="tg")
    assert queued == pytest.approx(0.3, abs=0.01)


def test_backends_view_json(gateway):
    view = {b["name"]: b for b in httpx.get(gateway.url + "/infer/backends").json()["backends"]}
    assert view["dead"]["up"] is False and "unreachable" in view["dead"]["detail"]
    assert view["vl"]["type"] == "vllm" and view["vl"]["kv_cache_usage"] == 0.25
    assert view["vl"]["reported"] == {"requests_running": 3.0, "requests_waiting": 2.0, "kv_cache_usage": 0.25}


def test_a_span_per_request_with_genai_attributes_and_traceparent_to_the_backend(gateway, vllm, receiver):
    vllm.behaviour.requests.clear()
    r = httpx.post(
        gateway.url + "/v1/chat/completions", timeout=30, headers={"traceparent": f"00-{TRACE_ID}-{PARENT_ID}-01"},
        json={"model": "vl", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5, "temperature": 0.5})
    assert r.status_code == 200
    span = receiver.wait_for(lambda s: s.trace_id.hex() == TRACE_ID)
    assert span.name == "chat vl" and span.parent_span_id.hex() == PARENT_ID
    attrs = attributes(span)
    assert {k: attrs[k] for k in ("gen_ai.operation.name", "gen_ai.provider.name", "gen_ai.system",
                                  "gen_ai.request.model", "infer.backend", "infer.endpoint", "server.address")} == {
        "gen_ai.operation.name": "chat", "gen_ai.provider.name": "vllm", "gen_ai.system": "vllm",
        "gen_ai.request.model": "vl", "infer.backend": "vl", "infer.endpoint": "/v1/chat/completions",
        "server.address": "127.0.0.1"}
    assert attrs["gen_ai.request.max_tokens"] == 5 and attrs["gen_ai.request.temperature"] == 0.5
    usage = r.json()["usage"]
    assert (attrs["gen_ai.usage.input_tokens"], attrs["gen_ai.usage.output_tokens"]) == (
        usage["prompt_tokens"], usage["completion_tokens"])
    assert attrs["gen_ai.response.finish_reasons"] == [r.json()["choices"][0]["finish_reason"]]
    assert attrs["infer.ttft_s"] > 0 and span.status.code == 0  # unset: no error
    sent = [q for q in vllm.behaviour.requests if q["path"] == "/v1/chat/completions"]
    version, trace_id, parent_id, flags = sent[-1]["headers"]["traceparent"].split("-")
    assert (trace_id, parent_id) == (TRACE_ID, span.span_id.hex())


def test_a_failed_request_has_an_error_span(gateway, receiver):
    chat(gateway.url, "dead")
    span = receiver.wait_for(lambda s: s.name == "chat dead")
    assert span.status.code == 2 and "unreachable" in span.status.message  # STATUS_CODE_ERROR
    assert attributes(span)["error.type"] == "BackendUnavailable"


def test_health_is_live_and_ready_says_why(gateway, tmp_path):
    assert httpx.get(gateway.url + "/health").json() == {"status": "ok"}
    assert httpx.get(gateway.url + "/ready").json() == {"status": "ready", "reason": "vl, tg are up"}
    config = tmp_path / "backends.yaml"
    dead = f"http://127.0.0.1:{free_port()}"
    config.write_text(yaml.safe_dump({"backends": [{"name": "gone", "type": "vllm", "base_url": dead, "model": "m"}]}))
    empty = tmp_path / "no-models"
    empty.mkdir()
    server = start_server(tmp_path, empty, INFER_CONFIG=str(config))
    try:
        assert httpx.get(server.url + "/health").status_code == 200
        r = httpx.get(server.url + "/ready", timeout=10)
        assert r.status_code == 503
        reason = r.json()["reason"]
        assert r.json()["status"] == "not ready" and reason.startswith("no backend is reachable (gone: vllm backend")
        assert reason.endswith("and the local store has no model")
    finally:
        stop_server(server)


def test_ready_with_only_local_models(tiny_store, tmp_path):
    server = start_server(tmp_path, tiny_store.root)
    try:
        available = f"{len(tiny_store.list_models())} local model(s) available"
        assert httpx.get(server.url + "/ready").json() == {"status": "ready", "reason": available}
        httpx.post(server.url + "/api/generate", json={"model": "tiny", "prompt": "hi", "stream": False,
                                                        "options": {"num_predict": 1}}, timeout=60)
        assert httpx.get(server.url + "/ready").json() == {"status": "ready", "reason": "tiny:latest is loaded"}
    finally:
        stop_server(server)


@pytest.mark.slow  # the native engine's start (torch) takes ~15 s on 2 cores
def test_native_engine_load_and_kv_cache_use(tiny_store, tmp_path):
    server = start_server(tmp_path, tiny_store.root, INFER_ENGINE="native")
    try:
        body = {"model": "slow", "prompt": "Once", "stream": True, "options": {"num_predict": 3000, "ignore_eos": True}}
        with httpx.stream("POST", server.url + "/api/generate", json=body, timeout=60) as stream:
            lines = stream.iter_lines()  # held: dropping it would close the stream
            next(lines)
            found = samples(server.url)
    finally:
        stop_server(server)
    assert value(found, "infer_num_requests_running", backend="native") == 1.0
    assert value(found, "infer_num_requests_waiting", backend="native") == 0.0
    assert value(found, "infer_backend_requests_in_flight", backend="native") == 1.0
    assert 0 < value(found, "infer_kv_cache_usage_perc", backend="native") <= 1


def test_tracing_is_off_without_the_endpoint(vllm, tiny_store, tmp_path):
    config = tmp_path / "backends.yaml"
    config.write_text(yaml.safe_dump({"backends": [
        {"name": "vl", "type": "vllm", "base_url": vllm.url, "model": vllm.behaviour.models[0]}]}))
    server = start_server(tmp_path, tiny_store.root, INFER_CONFIG=str(config))
    try:
        vllm.behaviour.requests.clear()
        body = {"model": "vl", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        r = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=30,
                       headers={"traceparent": f"00-{TRACE_ID}-{PARENT_ID}-01"})
        assert r.status_code == 200
    finally:
        stop_server(server)
    sent = [q for q in vllm.behaviour.requests if q["path"] == "/v1/chat/completions"]
    assert len(sent) == 1 and "traceparent" not in sent[0]["headers"]
