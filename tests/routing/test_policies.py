"""The routing policies' pieces: the SLO check (vLLM's TPOT), the breaker's states, the window's
figures, the orders, and the latency model learning a backend's costs."""

from __future__ import annotations

import pytest

from routing.breaker import CircuitBreaker
from routing.predictor import LatencyModel, Prediction, WindowFit
from routing.slo import vllm_tpot
from tests.routing.policies import slo as SLO
from routing.stats import Outcome, Window, percentiles
from routing.strategies import Member, Orderer, headroom


def test_slo_parts_and_vllms_tpot():
    slo = SLO(ttft_ms=500, tpot_ms=50, e2e_ms=2000)
    assert slo.missed(0.4, 1.4, 21) == ()                       # tpot = (1.4 − 0.4) / 20 = 50 ms: met
    assert slo.missed(0.6, 1.6, 21) == ("ttft",)
    assert slo.missed(0.4, 2.5, 21) == ("tpot", "e2e")           # 105 ms per token
    assert slo.missed(0.1, 1.9, 1) == ()                        # one token meets any TPOT SLO
    assert slo.missed(None, 0.2, 0) == ("ttft",)                 # no first token: missed
    assert vllm_tpot(0.5, 1.5, 11) == pytest.approx(0.1) and vllm_tpot(0.5, 1.5, 1) is None
    assert SLO(ttft_ms=500).tightened(ttft_ms=200, tpot_ms=30) == SLO(ttft_ms=200, tpot_ms=30)
    assert SLO(ttft_ms=500).tightened(ttft_ms=900).ttft_ms == 500


def test_breaker_closed_open_half_open_closed():
    now = [0.0]
    b = CircuitBreaker(threshold=2, cooldown_s=5, clock=lambda: now[0])
    b.failed()
    assert b.state == "closed" and b.allows()
    b.failed()
    assert b.state == "open" and not b.allows() and b.retry_after() == 5
    now[0] = 5.0
    assert b.state == "half_open" and b.allows()
    b.attempt()
    assert not b.allows()  # one probe at a time
    b.failed()
    assert b.state == "open"  # the probe failed: open again
    now[0] = 10.0
    b.attempt()
    b.succeeded()
    assert b.state == "closed" and b.failures == 0


def test_window_figures_are_exact_and_old_outcomes_leave():
    w = Window(window_s=10, started=0.0)
    w.add(Outcome(1.0, "a", "ok", good=True, ttft_s=0.1, tpot_s=0.01, e2e_s=1.0))
    w.add(Outcome(2.0, "a", "ok", good=False, ttft_s=0.9, tpot_s=0.02, e2e_s=2.0, missed=("ttft",)))
    w.add(Outcome(3.0, None, "shed"))
    w.add(Outcome(4.0, "b", "error"))
    w.add(Outcome(5.0, "b", "cancelled"))
    s = w.summary(now=8.0)
    assert (s["requests"], s["good"], s["shed"], s["errors"], s["cancelled"]) == (5, 1, 1, 1, 1)
    assert s["attainment"] == 0.25 and s["admitted_attainment"] == pytest.approx(1 / 3)
    assert s["goodput_rps"] == pytest.approx(1 / 8) and s["ttft"] == {"p50": 100.0, "p95": 900.0, "p99": 900.0}
    assert w.summary(now=12.5)["requests"] == 3  # the first two left the 10 s window
    assert percentiles([]) == {"p50": None, "p95": None, "p99": None}


def test_orders_of_each_strategy():
    a, b, c = (Member(name=n, backend=None, model=n) for n in "abc")
    preds = {"a": Prediction(0.4, 0.05), "b": Prediction(0.1, 0.08), "c": Prediction(0.2, 0.01)}
    slo = SLO(ttft_ms=500, tpot_ms=100)
    assert headroom(slo, preds["a"], 10) == pytest.approx(0.2)
    assert [m.name for m in Orderer("slo").order([a, b, c], preds, slo, 10)] == ["c", "a", "b"]
    a.latency.in_flight = {1: None, 2: None}
    assert [m.name for m in Orderer("least_inflight").order([a, b, c], preds, slo, 10)][0] in ("b", "c")
    rr = Orderer("round_robin")
    assert [rr.order([a, b, c], preds, slo, 10)[0].name for _ in range(4)] == ["a", "b", "c", "a"]
    a.weight, b.weight, c.weight = 3, 1, 1
    wrr = Orderer("weighted")
    picks = [wrr.order([a, b, c], preds, slo, 10)[0].name for _ in range(5)]
    assert sorted(picks) == ["a", "a", "a", "b", "c"]


def test_least_squares_recovers_a_linear_backend_and_never_goes_negative():
    fit = WindowFit([0.0, 0.0, 0.0], strength=1e-9)
    for i in range(200):
        x = [1.0, float(i % 17), float((i * 7) % 5)]
        fit.update(x, 0.05 + 0.002 * x[1] + 0.03 * x[2])
    assert fit.w == pytest.approx([0.05, 0.002, 0.03], abs=1e-6)
    falling = WindowFit([0.0, 0.0])
    for i in range(50):  # more work ahead, less time: read as no cost at all, never a negative one
        falling.update([1.0, float(i)], 1.0 - 0.01 * i)
    assert falling.w[1] == 0.0 and falling.predict([1.0, 40.0]) >= falling.predict([1.0, 0.0])


def test_latency_model_counts_what_is_in_flight_and_scores_its_predictions():
    clock = [0.0]
    m = LatencyModel(clock=lambda: clock[0])
    f1, p1 = m.started(1, 100, max_tokens=11)
    f2, _ = m.started(2, 50, max_tokens=11)
    assert f2 == [1.0, 50.0, 0.0, 100.0, 0.0, 1.0, 0.0, 0.0]  # 100 prompt tokens and one request queued ahead
    clock[0] = 0.2
    assert m.first_token(1, f1) == pytest.approx(0.2)
    assert m.ttft_features(10)[5:7] == [1.0, 1.0]  # one waiting, one decoding
    assert m.median_error() == pytest.approx(abs(p1.ttft_s - 0.2) / 0.2)
    clock[0] = 0.3
    m.first_token(2, f2)  # its 50 prompt tokens were prefilled while request 1 decoded
    clock[0] = 1.2
    m.finished(1, 0.1, 11)  # 1 s of decoding: 0.1 s with one decoding, 0.9 s with two
    assert m.tpot.xs[-1] == pytest.approx([1.0, 1.9, 5.0])  # mean batch 1.9, 50 tokens / 10 steps
    assert m.median_error("tpot") == pytest.approx(abs(p1.tpot_s - 0.1) / 0.1)
    assert list(m.in_flight) == [2]


def test_the_tpot_model_learns_a_continuous_batching_engine():
    """TPOT = 30 ms + 3 ms per sequence + the prefills during the decode at 4000 tokens/s."""
    m = LatencyModel(clock=lambda: 0.0)
    for _ in range(8):  # 192 observations: the prior weighs as 3 of them
        for batch in range(1, 9):
            for tokens in (0, 400, 1600):
                m.tpot.update([1.0, batch, tokens / 50], 0.030 + 0.003 * batch + tokens / 4000 / 50)
    assert m.tpot.w == pytest.approx([0.030, 0.003, 1 / 4000], rel=0.05)
    for key in range(3):
        m.started(key, 100)
    assert m.predict(100).tpot_s == pytest.approx(0.030 + 0.003 * 4, rel=0.05)  # the batch it joins: 3 + itself


def test_the_batch_limit_comes_from_a_queue_in_two_reports_and_never_stays_below_what_ran():
    clock = [0.0]
    m = LatencyModel(clock=lambda: clock[0])
    m.reported(running=3, waiting=1)  # one report: maybe a request waiting for the next step
    assert m.batch_limit == 0 and m.reported_waiting == 1.0
    m.reported(running=3, waiting=2)
    assert m.batch_limit == 3
    for key in range(3):
        m.started(key, 10)
    assert m.is_full()
    m.started(3, 10)
    for key in range(4):  # four decode at once: the limit was wrong
        m.first_token(key, m.ttft_features(10))
    assert m.batch_limit == 4 and m.max_decoding == 4
    m.reported(running=2, waiting=1)
    m.reported(running=2, waiting=1)
    assert m.batch_limit == 4  # never below what the gateway saw running


def test_a_few_observations_are_enough_to_learn_the_cost_of_a_sequence():
    """A backend at 60 ms + 16 ms per sequence, seen seven times (five alone, two at a batch of two):
    the prior (20 ms, nothing per sequence) must not keep the prediction at a batch of two optimistic."""
    m = LatencyModel(clock=lambda: 0.0)
    for batch in (1, 1, 1, 1, 1, 2, 2):
        m.tpot.update([1.0, batch, 0.0], 0.060 + 0.016 * batch)
    m.started(0, 100)
    assert m.predict(100).tpot_s == pytest.approx(0.092, rel=0.03)
