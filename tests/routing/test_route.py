"""The route's policies end to end in-process: headroom routing, shedding (priority first),
first-token hedging, retries, fallbacks, the breaker, and what the final Done says."""

from __future__ import annotations

import asyncio

import pytest

from core.base import Chunk, Done, GenerationRequest
from core.errors import BackendUnavailable, InvalidRequest, RouteShed, RouteUnavailable
from routing.breaker import CircuitBreaker
from gateway.backends_config import SLOEntry as SLO
from routing.route import Route
from routing.strategies import Member
from tests.routing.policies import policy as policy_of
from tests.routing.scripted import Scripted


def route(*backends: Scripted, name: str = "chat", routes: dict | None = None, **policy) -> Route:
    members = [Member(name=b.name, backend=b, model=f"{b.name}-model") for b in backends]
    return Route(name, members, policy_of(**policy), resolve_route=(routes or {}).get)


def request(**fields) -> GenerationRequest:
    return GenerationRequest(model="chat", messages=[{"role": "user", "content": "hello there"}],
                             options={"num_predict": 4}, **fields)


def run(r: Route, req: GenerationRequest | None = None) -> tuple[list[Chunk], Done]:
    async def go():
        events = [e async for e in r.stream(req or request())]
        return [e for e in events if isinstance(e, Chunk)], events[-1]
    return asyncio.run(go())


def failure(r: Route, req: GenerationRequest | None = None) -> Exception:
    async def go():
        async for _ in r.stream(req or request()):
            pass
    with pytest.raises(Exception) as info:
        asyncio.run(go())
    return info.value


def test_the_backend_sees_its_own_model_name_and_the_done_names_the_route():
    a = Scripted("a")
    chunks, done = run(route(a, strategy="round_robin"))
    assert a.calls[0].model == "a-model" and len(chunks) == 4
    assert (done.route, done.served_by, done.attempts, done.slo_missed) == ("chat", "a", 1, None)


def test_slo_strategy_sends_to_the_backend_with_the_most_headroom():
    slow, fast = Scripted("slow", ttft=0.2), Scripted("fast", ttft=0.01)
    r = route(slow, fast, strategy="slo", slo=SLO(ttft_ms=100))
    tokens = r.counter.prompt_tokens(request())
    for _ in range(20):  # what each has shown so far
        for member in r.members:
            member.latency.ttft.update(member.latency.ttft_features(tokens), 0.2 if member.name == "slow" else 0.01)
    _, done = run(r)
    assert done.served_by == "fast" and done.slo_missed == ()


def learn(r: Route, ttft_s: float, times: int = 20) -> None:
    """Teach every member that a request like ``request()`` takes ``ttft_s`` to its first token."""
    tokens = r.counter.prompt_tokens(request())
    for _ in range(times):
        for member in r.members:
            member.latency.ttft.update(member.latency.ttft_features(tokens), ttft_s)


def test_shedding_answers_429_with_retry_after_naming_the_route_and_the_prediction():
    a = Scripted("a")
    r = route(a, strategy="slo", slo=SLO(ttft_ms=100), shed=True)
    learn(r, 2.5)  # ~2.5 s to a first token
    error = failure(r)
    assert isinstance(error, RouteShed) and error.status == 429 and error.retry_after >= 2
    assert "route 'chat'" in error.message and "TTFT SLO of 100 ms" in error.message and "predicted" in error.message
    assert a.calls == [] and error.partial.route == "chat"
    assert r.window.summary()["shed"] == 1


def test_slo_holds_a_request_while_the_backend_would_miss_its_tpot_then_serves_it():
    a = Scripted("a", ttft=0.05, tokens=4)
    r = route(a, strategy="slo", slo=SLO(ttft_ms=2000, tpot_ms=100), shed=True)
    for _ in range(50):  # TPOT 50 ms alone, 150 ms with two decoding: one at a time
        r.members[0].latency.tpot.update([1.0, 1.0, 0.0], 0.05)
        r.members[0].latency.tpot.update([1.0, 2.0, 0.0], 0.15)

    async def two():
        return await asyncio.gather(*(collect(r, request()) for _ in range(2)))
    (first, second) = asyncio.run(two())
    assert first.served_by == second.served_by == "a" and len(a.calls) == 2
    assert second.timings.ttft >= first.timings.total  # held at the gateway until the first finished
    assert r.window.summary()["shed"] == 0


async def collect(r: Route, req: GenerationRequest) -> Done:
    return [e async for e in r.stream(req)][-1]


def test_lower_priority_is_shed_first():
    r = route(Scripted("a", ttft=0.09), strategy="slo", slo=SLO(ttft_ms=100), shed=True)
    learn(r, 0.09)  # just inside the SLO
    _, done = run(r, request(priority=0))
    assert done.served_by == "a"
    assert isinstance(failure(r, request(priority=-1)), RouteShed)  # held to 75 ms


def test_a_client_may_tighten_the_slo_but_not_loosen_it():
    r = route(Scripted("a", ttft=0.03), slo=SLO(ttft_ms=1000))
    _, done = run(r, request(slo_ttft_ms=10))
    assert done.slo_missed == ("ttft",)
    _, done = run(r, request(slo_ttft_ms=100000))
    assert done.slo_missed == ()


def test_no_first_token_in_time_resubmits_to_the_next_backend_unseen_by_the_client():
    stalled, good = Scripted("stalled", stall=True), Scripted("good")
    r = route(stalled, good, strategy="round_robin", first_token_timeout_ms=100)
    chunks, done = run(r)
    assert stalled.cancelled == 1 and len(good.calls) == 1
    assert [c.text for c in chunks] == ["t0 ", "t1 ", "t2 ", "t3 "] and done.finish_reason == "length"
    assert (done.served_by, done.attempts) == ("good", 2)
    assert r.members[0].breaker.failures == 1


def test_a_5xx_before_any_byte_is_retried_on_the_next_backend():
    broken, good = Scripted("broken", fail_status=502), Scripted("good")
    _, done = run(route(broken, good, strategy="round_robin", retries=1))
    assert (done.served_by, done.attempts) == ("good", 2)


def test_retries_are_limited_and_client_errors_are_not_retried():
    b1, b2, b3 = (Scripted(n, fail_status=503) for n in ("b1", "b2", "b3"))
    error = failure(route(b1, b2, b3, strategy="round_robin", retries=1))
    assert isinstance(error, BackendUnavailable) and len(b3.calls) == 0
    bad, good = Scripted("bad", fail_status=400), Scripted("good")
    error = failure(route(bad, good, strategy="round_robin", retries=3))
    assert isinstance(error, InvalidRequest) and good.calls == []


def test_when_every_backend_is_out_the_fallback_route_serves():
    cheap = route(Scripted("cheap"), name="cheap")
    main = route(Scripted("x", fail_status=502), strategy="round_robin", retries=0, fallbacks=("cheap",),
                 routes={"cheap": cheap})
    main.resolve_route = {"cheap": cheap}.get
    _, done = run(main)
    assert (done.route, done.served_by) == ("cheap", "cheap")


def test_the_breaker_opens_after_failures_in_a_row_then_probes_one_request():
    clock = [0.0]
    flaky = Scripted("flaky", fail_status=502, fail_times=3)
    r = route(flaky, strategy="round_robin", retries=0)
    r.members[0].breaker = CircuitBreaker(threshold=3, cooldown_s=10, clock=lambda: clock[0])
    for _ in range(3):
        assert isinstance(failure(r), BackendUnavailable)
    assert r.members[0].breaker.state == "open"
    error = failure(r)  # skipped while open: no call reaches it
    assert isinstance(error, RouteUnavailable) and error.status == 503 and len(flaky.calls) == 3
    clock[0] = 11.0
    assert r.members[0].breaker.state == "half_open"
    _, done = run(r)  # the probe succeeds (the backend recovered): closed again
    assert done.served_by == "flaky" and r.members[0].breaker.state == "closed"


def test_attainment_and_goodput_of_a_scripted_mix_are_exact():
    fast, slow = Scripted("fast", ttft=0.005), Scripted("slow", ttft=0.15)
    r = route(fast, slow, strategy="round_robin", slo=SLO(ttft_ms=100, window_s=300))
    for _ in range(4):  # round robin: fast, slow, fast, slow
        run(r)
    summary = r.window.summary()
    assert (summary["requests"], summary["good"], summary["errors"], summary["shed"]) == (4, 2, 0, 0)
    assert summary["attainment"] == 0.5 and summary["missed"] == {"ttft": 2, "tpot": 0, "e2e": 0}
    assert r.window.summary("slow")["good"] == 0 and r.window.summary("fast")["attainment"] == 1.0
    span = min(300, r.window.outcomes[-1].at - r.window.started)
    assert summary["goodput_rps"] == pytest.approx(2 / span, rel=0.05)
