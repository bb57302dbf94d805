"""bench/slo.py's DistServe system goodput: the largest arrival rate with attainment >= a target."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def slo_bench():
    pytest.importorskip("aiohttp")
    saved = list(sys.path)
    spec = importlib.util.spec_from_file_location("slo_bench", ROOT / "bench" / "slo.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    try:
        spec.loader.exec_module(module)  # it puts bench/ on sys.path for its neighbours
    finally:
        sys.path[:] = saved  # bench/gateway.py must not shadow the gateway package for later tests
    return module


def runs(side: str, *points: tuple[float, float]) -> list[dict]:
    return [{"side": side, "rate_rps": rate, "attainment": att, "load": rate} for rate, att in points]


def test_interpolates_the_crossing(slo_bench):
    data = runs("slo", (1.0, 1.0), (2.0, 0.96), (3.0, 0.86))
    bound, rate = slo_bench.system_goodput(data, "slo", 0.9)
    assert bound == "=" and rate == pytest.approx(2.6)  # 0.96 -> 0.86 over 1 req/s crosses 0.9 at 60 %


def test_bounds_outside_the_loads(slo_bench):
    data = runs("a", (1.0, 0.8), (2.0, 0.5)) + runs("b", (1.0, 1.0), (2.0, 0.99))
    assert slo_bench.system_goodput(data, "a", 0.9) == ("<", 1.0)
    assert slo_bench.system_goodput(data, "b", 0.9) == (">=", 2.0)
    assert slo_bench.system_goodput(data, "c", 0.9) is None


def test_report_prints_it(slo_bench, capsys):
    slo_bench.print_system_goodput(runs("slo", (1.0, 1.0), (2.0, 0.96), (3.0, 0.86))
                                   + runs("least_inflight", (1.0, 0.93), (2.0, 0.77), (3.0, 0.5)))
    out = capsys.readouterr().out
    assert "attainment >= 0.9: slo 2.60, least_inflight 1.19 req/s" in out
    assert "attainment >= 0.95: slo 2.10, least_inflight < 1.00 req/s" in out
