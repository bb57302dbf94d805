"""``infer estimate --tp N``: tensor parallelism's all-reduces priced per layer and step, against one device."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from cli.main import app
from estimator import Deployment, Efficiency, ModelShape, Workload, estimate
from estimator.comm import Link, all_reduce_s, gather_s, pass_comm
from estimator.devices import DEVICES, get_device
from estimator.roofline import decode_step

LLAMA_70B = ModelShape("llama-3.1-70b", 8192, 28672, 80, 64, 8, 128256)
SMOLLM2 = ModelShape("smollm2-135m", 576, 1536, 30, 9, 3, 49152)


def test_a_ring_all_reduce_is_latency_hops_plus_bytes_over_the_link():
    link = Link(gbs=100, latency_us=10)
    assert all_reduce_s(1e6, 2, link) == pytest.approx(2 * 10e-6 + 1 * 1e6 / 100e9)
    assert all_reduce_s(1e6, 8, link) == pytest.approx(14 * 10e-6 + 14 / 8 * 1e6 / 100e9)
    assert gather_s(8e6, 4, link) == pytest.approx(3 * 10e-6 + 3 / 4 * 8e6 / 100e9)
    assert all_reduce_s(1e9, 1, link) == gather_s(1e9, 1, link) == 0.0


def test_a_pass_has_two_all_reduces_per_layer_the_embeddings_and_a_logits_gather():
    link = Link(gbs=450, latency_us=2)
    comm = pass_comm(LLAMA_70B, tokens=64, rows=64, ranks=8, link=link, act_bytes=2)
    assert comm.bytes_per_all_reduce == 64 * 8192 * 2  # 1 MiB of bf16 activations
    assert comm.per_layer_s == pytest.approx(2 * comm.all_reduce_s)
    assert comm.total_s == pytest.approx(161 * comm.all_reduce_s + gather_s(64 * 128256 * 4, 8, link))


def test_tp_pays_for_a_70b_model_on_nvlink_and_not_for_a_small_one_at_batch_1():
    work = Workload(1024, 256, batch=64)
    big = estimate(Deployment(LLAMA_70B, DEVICES["h100"], gpus=8), work, Efficiency())
    tp = big["tensor_parallel"]
    assert tp["pays"] and not tp["fits_one_device"] and tp["decode_scaling"]["64"]["speedup"] > 4
    assert 0 < tp["comm_share_of_tpot"] < 0.5
    small = estimate(Deployment(SMOLLM2, DEVICES["h100"], gpus=2), Workload(256, 64), Efficiency())
    assert not small["tensor_parallel"]["pays"] and small["tensor_parallel"]["decode_scaling"]["1"]["speedup"] < 1
    assert small["throughput_vs_batch"][0]["binds"] == "communication"


def test_one_device_has_no_collectives():
    dep = Deployment(SMOLLM2, DEVICES["h100"])
    assert dep.comm(64, 64).total_s == 0.0 and decode_step(dep, Efficiency(), 16, 16, 4).comm_s == 0.0
    assert "tensor_parallel" not in estimate(dep, Workload(), Efficiency())


def test_the_cli_prints_the_collectives_and_the_verdict(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({
        "_name_or_path": "llama-3.1-70b", "hidden_size": 8192, "intermediate_size": 28672, "num_hidden_layers": 80,
        "num_attention_heads": 64, "num_key_value_heads": 8, "vocab_size": 128256}))
    result = CliRunner().invoke(app, ["estimate", str(tmp_path), "--device", "h100", "--tp", "8", "--batch", "64"])
    assert result.exit_code == 0, result.output
    assert "tensor parallel       8 ranks, link 450 GB/s, 2 us/hop; 2 all-reduces per layer" in result.output
    assert "decode all-reduce   1024.0 KiB" in result.output and "TP pays at this batch" in result.output
    slow = CliRunner().invoke(app, ["estimate", str(tmp_path), "--device", "h100", "--tp", "8", "--batch", "64",
                                    "--link-gbs", "32", "--link-latency-us", "50", "--json"])
    assert json.loads(slow.output)["tensor_parallel"]["link_latency_us"] == 50
    assert json.loads(slow.output)["tensor_parallel"]["decode"]["total_ms"] > 30


def test_link_overrides_and_the_cpu_profile_cached_before_links(tmp_path, monkeypatch):
    monkeypatch.setenv("INFER_HOME", str(tmp_path))
    (tmp_path / "estimate").mkdir()
    (tmp_path / "estimate" / "cpu.json").write_text(json.dumps(
        {"name": "cpu", "bf16_tflops": 0.1, "fp8_tflops": None, "memory_gb": 8, "bandwidth_gbs": 20}))
    cpu = get_device("cpu")
    assert (cpu.link_gbs, cpu.link_latency_us) == (5.0, 100.0)
    assert get_device("h100", link_latency_us=0.5).link_latency_us == 0.5
