"""estimate.md §2: bandwidth roofline, KV capacity, SLO sizing, cost; calibration from a bench summary."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from cli.main import app
from estimator import Deployment, Device, Efficiency, ModelShape, Workload, estimate, fit, parameter_count
from estimator.roofline import decode_step, largest_batch_meeting

LLAMA2_7B = ModelShape("llama-2-7b", 4096, 11008, 32, 32, 32, 32000)
DEVICE_2TBS = Device("test", 312, None, 80, 2000)


def _summary(path, *, tpot_ms: float, ttft_ms: float, prompt: int = 16, output: int = 64, model: str = "m") -> None:
    point = {"load_point": "synchronous", "max_concurrency": 1, "completed": 4, "request_throughput": 1.0,
             "total_input_tokens": 4 * prompt, "total_output_tokens": 4 * output,
             "median_tpot_ms": tpot_ms, "median_ttft_ms": ttft_ms}
    path.write_text(json.dumps({"model_id": model, "label": {}, "load_points": [point]}))


def test_kv_bytes_capacity_and_sequences():
    dep = Deployment(LLAMA2_7B, DEVICE_2TBS)
    assert LLAMA2_7B.kv_bytes_per_token("bf16") == 2 * 32 * 32 * 128 * 2 == 524_288  # 512 KiB (Llama-2-7B, MHA)
    weights = parameter_count(LLAMA2_7B) * 2
    assert dep.kv_capacity_tokens() == int((80e9 * 0.9 - weights - 1e9) // 524_288)
    assert dep.max_sequences(1024, 1024) == dep.kv_capacity_tokens() // 2048


def test_mbu_fit_matches_the_seed_example_and_round_trips(tmp_path):
    """7B fp16 at 14 ms per token on a 2 TB/s device is about 50 % MBU (estimate.md §2)."""
    _summary(tmp_path / "summary.json", tpot_ms=14.0, ttft_ms=50.0, prompt=1, output=2)
    dep = Deployment(LLAMA2_7B, DEVICE_2TBS)
    eff, basis = fit(dep, tmp_path / "summary.json")
    bytes_per_step = parameter_count(LLAMA2_7B) * 2 + 2.5 * 524_288
    assert eff.mbu == pytest.approx(bytes_per_step / 2e12 / 0.014)
    assert eff.mbu == pytest.approx(0.47, abs=0.01)
    assert basis["batch"] == 1 and basis["prompt_tokens"] == 1
    report = estimate(dep, Workload(1, 2), eff)
    assert report["tpot_ms"] == pytest.approx(14.0) and report["ttft_ms"] == pytest.approx(50.0)


def test_calibrated_prediction_scales_with_bytes_moved(tmp_path):
    small = ModelShape("small", 1024, 2816, 12, 16, 4, 32000)
    large = ModelShape("large", 1536, 4096, 20, 12, 4, 32000)
    _summary(tmp_path / "s.json", tpot_ms=20.0, ttft_ms=100.0)
    cpu = Device("cpu", 0.07, None, 24, 27)
    eff, _ = fit(Deployment(small, cpu), tmp_path / "s.json")
    work = Workload(16, 64)
    predicted = estimate(Deployment(large, cpu), work, eff)["tpot_ms"]
    step = decode_step(Deployment(small, cpu), Efficiency(1, 1), 16, 64, 1)
    ratio = decode_step(Deployment(large, cpu), Efficiency(1, 1), 16, 64, 1).memory_s / step.memory_s
    assert predicted == pytest.approx(20.0 * ratio)


def test_largest_batch_meeting_a_tpot_slo_and_devices_for_a_rate():
    dep = Deployment(LLAMA2_7B, DEVICE_2TBS)
    eff = Efficiency(0.6, 0.7)
    batch = largest_batch_meeting(dep, eff, 512, 256, 0.020)
    assert decode_step(dep, eff, 512, 256, batch).tpot_s <= 0.020 < decode_step(dep, eff, 512, 256, batch + 1).tpot_s
    report = estimate(dep, Workload(512, 256, tpot_slo_ms=20, rate=50, price_per_hour=2.0), eff)
    assert report["largest_batch_meeting_tpot_slo"] == batch
    per_deployment = report["requests_per_s_per_deployment"]
    assert report["devices_needed"] == -(-50 // per_deployment)
    # the bill-conserving split: an hour of input and output tokens at these prices costs the hour's price
    tokens_in, tokens_out = per_deployment * 512 * 3600, per_deployment * 256 * 3600
    bill = (report["input_usd_per_mtok"] * tokens_in + report["output_usd_per_mtok"] * tokens_out) / 1e6
    assert bill == pytest.approx(2.0)
    assert report["output_usd_per_mtok"] == pytest.approx(report["output_input_weight"] * report["input_usd_per_mtok"])


def test_batch_curve_turns_compute_bound():
    dep = Deployment(LLAMA2_7B, Device("big-memory", 312, None, 2000, 2000))
    curve = estimate(dep, Workload(16, 16), Efficiency(0.6, 0.7))["throughput_vs_batch"]
    assert curve[0]["binds"] == "bandwidth" and curve[-1]["binds"] == "compute"
    assert all(a["tok_s"] <= b["tok_s"] * (1 + 1e-9) for a, b in zip(curve, curve[1:]))


def test_calibrate_from_the_cli_reads_the_summary_model(tmp_path):
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / "config.json").write_text(json.dumps({"hidden_size": 1024, "intermediate_size": 2816,
                                                       "num_hidden_layers": 12, "num_attention_heads": 16,
                                                       "num_key_value_heads": 4, "vocab_size": 32000}))
    _summary(tmp_path / "summary.json", tpot_ms=20.0, ttft_ms=100.0, model=str(model_dir))
    result = CliRunner().invoke(app, ["estimate", str(model_dir), "--device", "l4", "--calibrate",
                                      str(tmp_path / "summary.json"), "--input-tokens", "16", "--output-tokens", "64"])
    assert result.exit_code == 0, result.output
    assert "TPOT 20.00 ms" in result.output and "(calibrated)" in result.output
    assert "calibrated on model at synchronous" in result.output


def test_a_calibration_over_100_percent_is_a_warning(tmp_path):
    small = ModelShape("small", 1024, 2816, 12, 16, 4, 32000)
    _summary(tmp_path / "s.json", tpot_ms=20.0, ttft_ms=0.001)  # a TTFT faster than the device's peak allows
    eff, basis = fit(Deployment(small, Device("cpu", 0.07, None, 24, 27)), tmp_path / "s.json")
    assert eff.mfu > 1 and len(basis["warnings"]) == 1
    assert basis["warnings"][0].startswith(f"calibrated MFU {eff.mfu:.2f} is over 100 %: the device's peak FLOP/s")
