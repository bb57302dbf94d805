"""Settling costs from the ledger: a self-hosted bill divided exactly over each window's requests,
idle windows reported, list prices kept as written, provisional vs settled."""

from __future__ import annotations

import random
from datetime import datetime, timezone

import pytest

from gateway.backends_config import PricingEntry
from ledger.db import open_db
from ledger.tables import UsageRecord
from ledger.usage import insert_rows, stamp
from pricing.book import PriceBook
from pricing.catalog import Priced
from pricing.method import Tokens
from pricing.settle import cost_report

HOUR = 3600.0
START = 1_800_000_000.0 - 1_800_000_000.0 % HOUR  # an hour boundary


@pytest.fixture
def db(tmp_path):
    engine = open_db(f"sqlite:///{tmp_path / 'usage.db'}")
    yield engine
    engine.dispose()


def write(db, book: PriceBook, backend: str, at: float, tokens: Tokens, route: str = "chat",
          key: str | None = None) -> None:
    record = UsageRecord(source="gateway", route="/v1/chat/completions", route_name=route, model="m",
                         backend=backend, key_name=key, input_tokens=tokens.input + tokens.cached_input,
                         cached_input_tokens=tokens.cached_input, output_tokens=tokens.output)
    cost, version = book.cost(backend, tokens, now=at)
    record.input_cost_usd, record.cached_input_cost_usd, record.output_cost_usd = cost.input, cost.cached_input, cost.output
    record.total_cost_usd, record.pricing_version = cost.total, version
    insert_rows(db, [stamp(record, datetime.fromtimestamp(at, timezone.utc))])


def test_request_costs_add_up_to_each_windows_bill_and_idle_windows_are_reported(db):
    prices = [Priced.of("gpu", PricingEntry(gpu_hourly_usd=2.50, gpus=2, output_weight=5, cached_input_weight=0.1)),
              Priced.of("api", PricingEntry(input_per_mtok=0.15, output_per_mtok=0.60, cached_input_per_mtok=0.075))]
    book = PriceBook(prices)
    rng = random.Random(3)
    busy_hours = [0, 1, 3, 4]  # hour 2 is idle: its bill is paid by nobody
    for hour in busy_hours:
        for _ in range(300):
            at = START + hour * HOUR + rng.uniform(0, HOUR - 1)
            tokens = Tokens(rng.randint(1, 3000), rng.choice([0, rng.randint(1, 500)]), rng.randint(1, 800))
            write(db, book, rng.choice(["gpu", "api"]), at, tokens)
    now = START + 5 * HOUR
    report = cost_report(db, prices, since=START, by="backend", now=now)
    bill = report["bills"]["gpu"]
    assert bill["bill_usd"] == pytest.approx(2.50 * 2 * 5, abs=1e-9) and bill["windows"] == 5  # now is a window's end
    assert (bill["windows_with_traffic"], bill["idle_usd"]) == (4, pytest.approx(2.50 * 2 * 1, abs=1e-9))
    gpu = next(g for g in report["groups"] if g["key"] == "gpu")
    assert abs(gpu["total_cost_usd"] - 2.50 * 2 * 4) < 1e-9  # Σ request costs = the busy windows' bills
    assert gpu["difference_usd"] != 0  # provisional (last window's rates) differs from settled
    api = next(g for g in report["groups"] if g["key"] == "api")
    assert api["difference_usd"] == pytest.approx(0, abs=1e-12)  # list prices are exact when written
    assert api["usd_per_mtok_output"] == pytest.approx(0.60)


def test_grouping_by_route_key_and_day(db):
    prices = [Priced.of("api", PricingEntry(input_per_mtok=1.0, output_per_mtok=2.0))]
    book = PriceBook(prices)
    write(db, book, "api", START + 10, Tokens(1000, 0, 500), route="a", key="team-a")
    write(db, book, "api", START + 20, Tokens(3000, 0, 100), route="b")
    by_route = {g["key"]: g for g in cost_report(db, prices, since=START, by="route", now=START + 60)["groups"]}
    assert by_route["a"]["total_cost_usd"] == pytest.approx(0.001 + 0.001)
    assert by_route["b"]["total_cost_usd"] == pytest.approx(0.003 + 0.0002)
    by_key = {g["key"]: g["total_cost_usd"]
              for g in cost_report(db, prices, since=START, by="key", now=START + 60)["groups"]}
    assert by_key == {"team-a": pytest.approx(0.002), "(no key)": pytest.approx(0.0032)}
    days = cost_report(db, prices, since=START, by="day", now=START + 60)["groups"]
    assert [g["requests"] for g in days] == [2]
    with pytest.raises(ValueError):
        cost_report(db, prices, since=START, by="team")


def test_the_first_window_gets_provisional_rates_from_the_bill_so_far():
    book = PriceBook([Priced.of("gpu", PricingEntry(gpu_hourly_usd=3.6, gpus=1, output_weight=2, cached_input_weight=0))])
    cost, _ = book.cost("gpu", Tokens(1000, 0, 500), now=book.hourly["gpu"].window_start + 100)
    assert cost.total == pytest.approx(3.6 * 100 / 3600)  # the only request so far pays the 100 s accrued
    assert book.cost("nope", Tokens(1, 0, 1)) is None


def test_the_local_engines_and_local_route_members_share_one_bill(db):
    """``local:`` is one machine: its engines and the route members that are store models pay one bill."""
    local = Priced.of("local", PricingEntry(gpu_hourly_usd=0.36, gpus=1, output_weight=3), ("llamacpp", "tiny"))
    book = PriceBook([local])
    for i, backend in enumerate(["llamacpp", "tiny", "tiny", "llamacpp"]):
        write(db, book, backend, START + 10 + i, Tokens(100 * (i + 1), 0, 40))
    report = cost_report(db, [local], since=START, by="backend", now=START + HOUR)
    assert list(report["bills"]) == ["local"] and report["bills"]["local"]["backends"] == ["llamacpp", "tiny"]
    groups = {g["key"]: g for g in report["groups"]}
    assert abs(groups["llamacpp"]["total_cost_usd"] + groups["tiny"]["total_cost_usd"] - 0.36) < 1e-12  # once
    assert groups["tiny"]["usd_per_mtok_output"] == pytest.approx(3 * groups["tiny"]["usd_per_mtok_input"])
