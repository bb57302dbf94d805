"""The pricing method against metrics-and-cost.md §4.2's worked examples, to the cent and beyond."""

from __future__ import annotations

import random

import pytest

from pricing.method import Rates, Tokens, conserving_rates, window_bill


def test_worked_example_h100_one_hour():
    bill = window_bill(2.50, 1, 3600)
    rates = conserving_rates(bill, Tokens(input=40_000_000, output=8_000_000), output_weight=5, cached_input_weight=0)
    assert rates.as_mtok()["input"] == pytest.approx(0.03125) and rates.as_mtok()["output"] == pytest.approx(0.15625)
    assert rates.cost(Tokens(40_000_000, 0, 8_000_000)).total == pytest.approx(2.50, abs=1e-9)
    request = rates.cost(Tokens(input=1000, output=200))
    assert request.total == pytest.approx(0.0000625, abs=1e-15)
    assert (round(request.input, 10), round(request.output, 10)) == (0.00003125, 0.00003125)


def test_worked_example_with_caching():
    rates = conserving_rates(2.50, Tokens(30_000_000, 10_000_000, 8_000_000), output_weight=5, cached_input_weight=0.1)
    per = rates.as_mtok()
    assert (round(per["input"], 6), round(per["cached_input"], 7), round(per["output"], 6)) == (0.035211, 0.0035211,
                                                                                                 0.176056)
    parts = rates.cost(Tokens(30_000_000, 10_000_000, 8_000_000))
    assert (round(parts.input, 6), round(parts.cached_input, 6), round(parts.output, 6)) == (1.056338, 0.035211,
                                                                                             1.408451)
    assert parts.total == pytest.approx(2.50, abs=1e-9)


def test_request_costs_sum_to_the_bill_for_any_mix():
    rng = random.Random(7)
    requests = [Tokens(rng.randint(1, 4000), rng.choice([0, rng.randint(0, 2000)]), rng.randint(0, 1000))
                for _ in range(5000)]
    total = sum(requests, Tokens())
    bill = window_bill(3.20, 2, 3600)
    rates = conserving_rates(bill, total, output_weight=4.3, cached_input_weight=0.1)
    assert abs(sum(rates.cost(r).total for r in requests) - bill) < 1e-9


def test_an_idle_window_allocates_nothing_and_list_prices_are_per_token():
    assert conserving_rates(2.5, Tokens(), 5, 0.1) is None
    api = Rates.per_mtok(input=0.15, output=0.60, cached_input=0.075)
    cost = api.cost(Tokens(input=1000, cached_input=1000, output=500))
    assert (cost.input, cost.cached_input, cost.output) == pytest.approx((0.00015, 0.000075, 0.0003))
