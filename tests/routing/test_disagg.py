"""Prefill/decode disaggregation through a route, against the fake P/D servers of both protocols
(``fakes/pd.py``) over real HTTP and the real remote adapters: the legs' bodies and headers on the
wire, where the prompt was prefilled, what the client gets, the fallbacks, cancellation and the
per-request decision."""

from __future__ import annotations

import asyncio

import pytest

from core.base import Chunk, Done, GenerationRequest
from adapters.remote.base import RemoteSettings
from adapters.remote.registry import create_remote
from fakes import FakeEngine, start_server
from fakes.behaviour import Behaviour
from fakes.pd import start_pd_server
from gateway.backends_config import RouteEntry
from routing.build import build_routes

LONG = " ".join(f"w{i}" for i in range(40))  # 40 prompt tokens for the fake engine: two full 16-token blocks
SHORT = "hello there"                        # shorter than one block


@pytest.fixture
def servers():
    started = []

    def start(protocol: str, role: str, **settings):
        server = start_pd_server(protocol, role, **settings)
        started.append(server)
        return server
    yield start
    for server in started:
        server.stop()


def route_over(servers: dict, **entry):
    remotes = {name: create_remote(RemoteSettings(name=name, type="vllm" if s.kind.startswith("vllm") else "openai",
                                                  base_url=s.url, model=s.behaviour.models[0]))
               for name, s in servers.items()}
    routes = build_routes([RouteEntry.model_validate({"name": "chat", **entry})], remotes, lambda name: None)
    return routes["chat"]


def request(prompt: str = LONG, max_tokens: int = 5) -> GenerationRequest:
    return GenerationRequest(model="chat", prompt=prompt, options={"num_predict": max_tokens})


def run(route, *reqs: GenerationRequest, between=None):
    """Each request in turn through ``route`` (``between(route)`` after the first), in one event loop
    that closes the route's clients at the end: (text, Done) of one request, or a list of them."""
    async def go():
        results = []
        try:
            for i, req in enumerate(reqs):
                if i and between is not None:
                    between(route)
                events = [e async for e in route.stream(req)]
                results.append(("".join(e.text for e in events if isinstance(e, Chunk)), events[-1]))
        finally:
            for member in route.all_members:
                await member.backend.aclose()
        return results
    results = asyncio.run(go())
    return results[0] if len(results) == 1 else results


def generations(server) -> list[dict]:
    return [r for r in server.behaviour.requests if r["path"].startswith("/v1/")]


VLLM_POOLS = {"prefill": {"protocol": "vllm", "backends": ["p"]}, "decode": {"protocol": "vllm", "backends": ["d"]},
              "disagg": {"when": "always"}}


def test_vllm_legs_on_the_wire_follow_the_toy_proxy_and_the_client_gets_the_colocated_answer(servers):
    p, d = servers("vllm", "prefill"), servers("vllm", "decode")
    route = route_over({"p": p, "d": d}, **VLLM_POOLS)
    text, done = run(route, request())

    [prefill_body], [decode_body] = generations(p), generations(d)
    assert prefill_body["max_tokens"] == 1 and prefill_body["stream"] is False
    assert "stream_options" not in prefill_body and "min_tokens" not in prefill_body
    assert prefill_body["kv_transfer_params"] == {"do_remote_decode": True, "do_remote_prefill": False,
                                                  "remote_engine_id": None, "remote_block_ids": None,
                                                  "remote_host": None, "remote_port": None}
    request_id = prefill_body["headers"]["x-request-id"]
    assert decode_body["headers"]["x-request-id"] == request_id
    assert decode_body["kv_transfer_params"] == {
        "do_remote_prefill": True, "do_remote_decode": False, "remote_block_ids": [0, 1],
        "remote_engine_id": p.pd.engine_id, "remote_request_id": f"cmpl-{request_id}-0",
        "remote_host": "127.0.0.1", "remote_port": 5600, "tp_size": 1}
    assert decode_body["max_tokens"] == 5 and decode_body["stream"] is True
    assert text == FakeEngine.expected_text(LONG, 5)
    assert (p.pd.prefilled, d.pd.kv_loaded, d.pd.prefilled) == ([40], [32], [8])  # decode computes the partial block
    assert (done.route, done.served_by, done.prefill_by) == ("chat", "d", "p")
    assert (done.usage.input_tokens, done.usage.output_tokens) == (40, 5)  # counted once, from the decode leg
    assert done.prefill_s is not None and 0 < done.prefill_s <= done.timings.ttft


def test_vllm_prompt_shorter_than_one_block_comes_back_without_blocks_and_decode_prefills_it(servers):
    p, d = servers("vllm", "prefill"), servers("vllm", "decode")
    text, done = run(route_over({"p": p, "d": d}, **VLLM_POOLS), request(SHORT))
    assert generations(d)[0]["kv_transfer_params"]["remote_block_ids"] == []
    assert (d.pd.kv_loaded, d.pd.prefilled) == ([0], [2])
    assert text == FakeEngine.expected_text(SHORT, 5) and done.prefill_by == "p"


def test_a_failed_prefill_leg_is_served_colocated_by_the_decode_worker(servers):
    p, d = servers("vllm", "prefill"), servers("vllm", "both")
    p.behaviour.fail_status = 503
    route = route_over({"p": p, "d": d}, **VLLM_POOLS)
    text, done = run(route, request())
    assert text == FakeEngine.expected_text(LONG, 5)
    assert "kv_transfer_params" not in generations(d)[0] and d.pd.prefilled == [40]
    assert (done.served_by, done.prefill_by) == ("d", None)
    assert route.disagg.counts["prefill_failed"] == 1
    assert route.members[0].name == "d"  # no plain backends: the decode pool serves co-located


def test_a_prefill_answer_without_kv_transfer_params_sends_decode_the_body_as_it_is(servers):
    plain = start_server("vllm", Behaviour())  # a server without a KV connector (or one that moves KV otherwise)
    d = servers("vllm", "both")
    try:
        text, done = run(route_over({"p": plain, "d": d}, **VLLM_POOLS), request())
    finally:
        plain.stop()
    assert "kv_transfer_params" not in generations(d)[0] and d.pd.prefilled == [40]
    assert text == FakeEngine.expected_text(LONG, 5) and (done.served_by, done.prefill_by) == ("d", "p")


def test_a_prefill_leg_past_its_timeout_is_cancelled_and_served_colocated(servers):
    p, d = servers("vllm", "prefill"), servers("vllm", "both")
    p.behaviour.first_byte_delay = 2.0
    route = route_over({"p": p, "d": d}, **{**VLLM_POOLS, "disagg": {"when": "always", "prefill_timeout_ms": 200}})
    text, done = run(route, request())
    assert text == FakeEngine.expected_text(LONG, 5) and done.prefill_by is None
    assert done.timings.total < 1.5
    assert p.behaviour.wait_for(lambda b: b.disconnects == 1)  # the prefill server saw the leg go


def test_the_client_leaving_during_the_prefill_cancels_both_legs(servers):
    p, d = servers("vllm", "prefill"), servers("vllm", "decode")
    p.behaviour.first_byte_delay = 2.0
    route = route_over({"p": p, "d": d}, **VLLM_POOLS)
    req = request()

    async def go():
        asyncio.get_running_loop().call_later(0.2, req.cancel.cancel)
        try:
            return [e async for e in route.stream(req)]
        finally:
            for member in route.all_members:
                await member.backend.aclose()
    events = asyncio.run(go())
    assert isinstance(events[-1], Done) and events[-1].finish_reason == "cancelled"
    assert events[-1].prefill_by == "p" and generations(d) == []
    assert p.behaviour.wait_for(lambda b: b.disconnects == 1)


SGLANG_POOLS = {"prefill": {"protocol": "sglang", "backends": ["p"], "bootstrap_port": 9001},
                "decode": {"protocol": "sglang", "backends": ["d"]}, "disagg": {"when": "always"}}


def test_sglang_legs_get_the_same_body_with_bootstrap_fields_and_the_client_gets_decode(servers):
    p, d = servers("sglang", "prefill", bootstrap_port=9001), servers("sglang", "decode")
    text, done = run(route_over({"p": p, "d": d}, **SGLANG_POOLS), request())
    [prefill_body], [decode_body] = generations(p), generations(d)
    strip = lambda body: {k: v for k, v in body.items() if k != "headers"}  # noqa: E731
    assert strip(prefill_body) == strip(decode_body)
    assert decode_body["bootstrap_host"] == "127.0.0.1" and decode_body["bootstrap_port"] == 9001
    assert 0 <= decode_body["bootstrap_room"] < 2 ** 63
    assert prefill_body["headers"]["x-request-id"] == decode_body["headers"]["x-request-id"]
    assert text == FakeEngine.expected_text(LONG, 5) and d.pd.kv_loaded == [40]
    assert (done.served_by, done.prefill_by, done.usage.input_tokens) == ("d", "p", 40)


def test_sglang_failed_prefill_stops_the_waiting_decode_and_the_plain_backend_serves(servers):
    p, d = servers("sglang", "prefill", bootstrap_port=9001), servers("sglang", "decode")
    plain = start_server("vllm", Behaviour())
    try:
        p.behaviour.fail_status = 500
        route = route_over({"p": p, "d": d, "plain": plain}, backends=["plain"], **SGLANG_POOLS)
        text, done = run(route, request())
    finally:
        plain.stop()
    assert text == FakeEngine.expected_text(LONG, 5)
    assert (done.served_by, done.prefill_by) == ("plain", None)
    assert d.behaviour.wait_for(lambda b: b.disconnects == 1) and d.pd.kv_loaded == []


def test_long_disaggregates_only_prompts_whose_uncached_part_is_over_the_threshold(servers):
    p, d = servers("vllm", "prefill"), servers("vllm", "both")
    route = route_over({"p": p, "d": d}, **{**VLLM_POOLS, "disagg": {"when": "long", "threshold_tokens": 8}})
    (_, short), (_, long) = run(route, request(SHORT), request())
    assert (short.prefill_by, long.prefill_by) == (None, "p")
    assert route.disagg.counts == {"disaggregated": 1, "colocated": 1, "prefill_failed": 0}


def busy(latency, key: int = 10**6) -> None:
    """A TPOT model of 10 ms a step and 100 ms per prompt token prefilled per token of a decode, and a
    stream decoding there: any prefill of a few tokens breaks a 30 ms TPOT."""
    for _ in range(20):
        latency.tpot.update([1.0, 1.0, 0.0], 0.010)
        latency.tpot.update([1.0, 1.0, 1.0], 0.110)
    latency.started(key, 4, 100)
    latency.first_token(key, latency.ttft_features(4))


def test_slo_disaggregates_a_long_prompt_only_when_colocating_it_would_break_the_decode_tpot(servers):
    p, d = servers("vllm", "prefill"), servers("vllm", "both")
    route = route_over({"p": p, "d": d}, backends=["d"], strategy="slo", slo={"tpot_ms": 30},
                       **{**VLLM_POOLS, "disagg": {"when": "slo", "threshold_tokens": 8}})
    # the first: nothing decoding there, co-locating breaks nobody's TPOT
    other = " ".join(f"v{i}" for i in range(40))  # not the first prompt: nothing of it is cached on d
    (_, idle), (_, busy_d), (_, again) = run(route, request(), request(other), request(other),
                                             between=lambda route: busy(route.disagg.decode[0].latency))
    assert (idle.prefill_by, busy_d.prefill_by) == (None, "p")
    assert again.prefill_by is None  # d holds that prompt now (the prefix index): nothing long to prefill


def test_slo_keeps_a_prompt_colocated_when_the_prefill_worker_decodes_streams_it_would_stall_too(servers):
    p, d = servers("vllm", "both"), servers("vllm", "both")
    route = route_over({"p": p, "d": d}, backends=["p", "d"], strategy="slo", slo={"tpot_ms": 30, "ttft_ms": 300},
                       **{**VLLM_POOLS, "disagg": {"when": "slo", "threshold_tokens": 8}})
    busy(route.disagg.decode[0].latency)  # fits nowhere: held to its TTFT deadline, then sent co-located
    busy(route.disagg.prefill[0].latency)  # p serves the route's streams too: the stall would only move there
    _, done = run(route, request())
    assert done.prefill_by is None and d.pd.kv_loaded == []
    assert route.disagg.counts == {"disaggregated": 0, "colocated": 1, "prefill_failed": 0}
