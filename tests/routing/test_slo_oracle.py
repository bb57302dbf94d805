"""bench/slo_oracle.py's clairvoyant schedule: what it counts as good really is good on the replayed engines."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def oracle_bench():
    pytest.importorskip("aiohttp")  # bench/slo.py, whose fleet and workload it replays, imports it
    saved = list(sys.path)
    spec = importlib.util.spec_from_file_location("slo_oracle_bench", ROOT / "bench" / "slo_oracle.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path[:] = saved  # bench/gateway.py must not shadow the gateway package for later tests
    return module


def test_every_request_the_schedule_counts_is_good_when_replayed(oracle_bench):
    jobs = oracle_bench.draw(1.2, 12, 5)  # over capacity: some requests cannot be placed
    plan = oracle_bench.search(jobs, passes=2)
    placed = [job.index for name in plan.placed for _, job in plan.placed[name]]
    assert sorted(placed) == sorted(plan.where) and len(set(placed)) == len(placed)
    assert 0 < len(placed) < len(jobs)
    for name, sends in plan.placed.items():
        times = oracle_bench.serve(oracle_bench.FLEET[name], sends)
        for sent, job in sends:
            assert sent >= job.arrival
            assert oracle_bench.good(job, *times[job.index]), (name, job)


def test_more_orders_never_find_fewer_good_requests(oracle_bench):
    one = oracle_bench.oracle(1.2, 12, 5, passes=1, restarts=1)
    several = oracle_bench.oracle(1.2, 12, 5, passes=1, restarts=4)
    assert one["requests"] == several["requests"]
    assert several["good"] >= one["good"]
    assert several["attainment"] == pytest.approx(several["good"] / several["requests"])
