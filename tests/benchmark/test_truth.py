"""Every reported metric against what the scripted server really did (its own log), within 1 %."""

from __future__ import annotations

import asyncio
import json
import math

import pytest

from benchmark import BenchConfig, Endpoint, calculate_metrics, run_bench
from benchmark.config import parse_goodput
from benchmark.metrics import DEFAULT_PERCENTILES
from benchmark.profiles import Profile, SearchSettings
from benchmark.prompts import LengthSpec
from benchmark.report import write_outputs

from .conftest import OthersLoad, entry

# Four shapes with widely spread TTFTs, gaps and TPOTs, chunks carrying 1-4 tokens. On this shared
# 2-core machine the client is sometimes descheduled for a few ms (up to ~30 ms seen while the whole
# suite ran), which must stay below 1 % of every statistic, standard deviations and the run's duration
# included: hence gaps of half a second and more, and 8 requests per wire format.
SCRIPT = [
    entry(0.60, [0.50, 0.90, 0.60], [1, 2, 1, 3], prompt_tokens=100),
    entry(1.20, [1.00, 0.56], [1, 1, 1], prompt_tokens=250),
    entry(0.90, [0.64, 0.64], None, prompt_tokens=64),
    entry(1.60, [0.52, 1.20], [2, 1, 4], prompt_tokens=512),
]
FAST = [entry(0.01, [0.005] * 2, [1, 2, 1], prompt_tokens=p) for p in (100, 250, 64, 512)]
SKIP = {"output_tokens_estimated", "good_completed", "request_goodput", "slo_attainment", "max_output_tokens_per_s"}


def _bench(url: str, api: str = "openai-chat", **overrides) -> BenchConfig:
    fields = {"profile": Profile.parse("concurrent:4"), "num_requests": 8, "warmup": 4,
              "input_tokens": LengthSpec(16), "output_tokens": LengthSpec(16)}
    fields.update(overrides)
    return BenchConfig(endpoint=Endpoint(url, "scripted", api), **fields)


def _misses(measured: dict, truth: dict) -> list[str]:
    """Metrics further than 1 % from the truth."""
    misses = [f"{key}: measured {measured[key]}, truth {want}" for key, want in truth.items()
              if key not in SKIP and isinstance(want, int | float) and measured[key] != pytest.approx(want, rel=0.01)]
    # A count of chunks per 1-s bucket: a chunk within a fraction of a ms of a bucket edge may land
    # on either side of it, client or server clock.
    if abs(measured["max_output_tokens_per_s"] - truth["max_output_tokens_per_s"]) > 1:
        misses.append("max_output_tokens_per_s")
    return misses


@pytest.mark.parametrize("api", ["openai-chat", "openai-completions", "ollama-chat", "ollama-generate"])
def test_every_metric_within_one_percent_of_the_server_truth(scripted, api):
    """On an overloaded machine (other processes keeping > 0.5 of our 2 cores busy during the run) the
    client itself runs late, so a miss is measured again, up to three runs; a quiet run must pass."""
    for attempt in range(3):
        server = scripted(SCRIPT)
        with OthersLoad([server.proc.pid]) as load:
            result = asyncio.run(run_bench(_bench(server.url, api, profile=Profile.parse("concurrent:8"), warmup=8)))
        point = result.points[0]
        truth_records, truth_duration = server.truth("00000000-")
        truth = calculate_metrics(truth_records, truth_duration, percentiles=DEFAULT_PERCENTILES)
        assert (point["completed"], point["failed"]) == (8, 0)
        assert point["total_output_tokens"] == 2 * (7 + 3 + 3 + 7)  # server-reported, not chunk counts
        assert point["total_input_tokens"] == 2 * (100 + 250 + 64 + 512)
        assert point["max_concurrent_requests"] == 8
        assert len([gap for r in result.runs[0].records for gap in r.itl]) == 2 * (3 + 2 + 2 + 2)
        misses = _misses(point, truth)
        if not misses or attempt == 2:
            break
    assert not misses, f"{misses} (others kept {load.cores:.2f} cores busy)"


def test_tpot_is_vllms_definition_on_known_numbers(scripted):
    """One request: TTFT ~0.5 s, then 9 gaps of ~0.08 s; 10 chunks carry 21 tokens: TPOT = 0.72 / 20 = 36 ms."""
    for attempt in range(3):  # measured again after a miss: a wrong definition misses every time, a stall once
        server = scripted([entry(0.5, [0.08] * 9, [3] + [2] * 9, prompt_tokens=10)])
        with OthersLoad([server.proc.pid]) as load:
            result = asyncio.run(run_bench(_bench(server.url, profile=Profile.parse("synchronous"), num_requests=1,
                                                  warmup=1)))
        point = result.points[0]
        (truth,), _ = server.truth("00000000-")
        assert point["total_output_tokens"] == 21
        expected = {"mean_ttft_ms": 1000 * truth.ttft, "mean_e2el_ms": 1000 * truth.latency,
                    "mean_tpot_ms": 1000 * (truth.latency - truth.ttft) / 20,
                    "mean_itl_ms": 1000 * (truth.latency - truth.ttft) / 9}
        misses = [key for key, want in expected.items() if point[key] != pytest.approx(want, rel=0.01)]
        if not misses or attempt == 2:
            break
    assert not misses, f"{misses}: {point} (others kept {load.cores:.2f} cores busy)"
    assert point["mean_tpot_ms"] == pytest.approx(36, rel=0.05)  # the script's nominal numbers


GOODPUT_SCRIPT = [
    entry(0.05, [0.02] * 4),                 # 0-3 good
    entry(0.05, [0.02] * 4),
    entry(0.06, [0.03] * 4),
    entry(0.05, [0.02] * 6),
    entry(0.40, [0.02] * 4),                 # 4, 5: TTFT over 200 ms
    entry(0.45, [0.02] * 4),
    entry(0.05, [0.10] * 4),                 # 6: TPOT 100 ms over 60 ms
    entry(0.05, [0.02], status=500),         # 7: failed -> a miss
    entry(0.05, [], [1]),                    # 8: one token: TPOT counts as 0 -> good
    entry(0.10, [0.05] * 22),                # 9: E2EL 1.2 s over 1000 ms
]


def test_goodput_and_attainment_are_exact_for_a_scripted_mix(scripted, tmp_path):
    server = scripted(GOODPUT_SCRIPT)
    slos = parse_goodput(["ttft:200", "tpot:60", "e2el:1000"])
    config = _bench(server.url, profile=Profile.parse("concurrent:10"), num_requests=10, warmup=0,
                    search=SearchSettings(goodput_slos=slos))
    result = asyncio.run(run_bench(config))
    point = result.points[0]
    assert (point["completed"], point["failed"]) == (9, 1)
    assert point["good_completed"] == 5
    assert point["slo_attainment"] == 0.5
    assert point["request_goodput"] == 5 / point["duration"]
    write_outputs(result, tmp_path / "run")
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["load_points"][0]["slo_attainment"] == 0.5
    errors = [json.loads(line)["error"] for line in (tmp_path / "run" / "requests.jsonl").read_text().splitlines()]
    assert sum(1 for e in errors if e.startswith("HTTP 500")) == 1


def test_server_side_token_counts_come_from_metrics(scripted):
    server = scripted(FAST)
    result = asyncio.run(run_bench(_bench(server.url, warmup=0, num_requests=4)))
    server_tokens = result.points[0]["server_tokens"]
    assert server_tokens["input_tokens"] == 100 + 250 + 64 + 512
    assert server_tokens["output_tokens"] == 4 * 4
    assert server_tokens["output_tokens_metric"] == "vllm:generation_tokens_total"
    assert not math.isnan(result.points[0]["duration"])
