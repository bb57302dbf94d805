"""Device table, overrides, the cached CPU probe, and model shapes from GGUF headers."""

from __future__ import annotations

import json
import math

import pytest

from estimator import DEVICES, get_device, load_shape
from estimator.devices import cpu_cache_path, cpu_device
from registry.modelbuilder import PRESETS, build_gguf


def test_every_device_the_issue_names_is_in_the_table():
    assert set(DEVICES) == {"h100", "h200", "a100-80g", "a100-40g", "l40s", "l4", "rtx4090", "mi300x"}
    assert get_device("h100").peak_flops("fp8") == pytest.approx(2 * get_device("h100").peak_flops("bf16"), rel=1e-3)
    assert get_device("a100-80g").peak_flops("fp8") == 312e12  # no FP8 tensor cores: bf16 peak


def test_overrides_and_unknown_devices():
    custom = get_device("my-npu", peak_tflops=100, bandwidth_gbs=500, memory_gb=32)
    assert (custom.bf16_tflops, custom.bandwidth_gbs, custom.memory_gb) == (100, 500, 32)
    assert get_device("h100", bandwidth_gbs=1000).bandwidth_gbs == 1000
    with pytest.raises(ValueError, match="unknown --device 'my-npu'"):
        get_device("my-npu")


def test_cpu_probe_measures_once_then_reads_the_cache(infer_home):
    first = cpu_device(size_mb=32)
    assert cpu_cache_path() == infer_home / "estimate" / "cpu.json"
    assert first.bf16_tflops > 0 and first.bandwidth_gbs > 0 and first.memory_gb > 0
    cached = json.loads(cpu_cache_path().read_text())
    cached["bandwidth_gbs"] = 12.5
    cpu_cache_path().write_text(json.dumps(cached))
    assert cpu_device().bandwidth_gbs == 12.5


def test_shape_and_stored_bytes_from_a_gguf(tmp_path):
    spec = PRESETS["tiny-qwen2"]
    path = build_gguf(tmp_path / "tiny.gguf", spec, dtype="f32")
    shape = load_shape(str(path))
    assert (shape.hidden_size, shape.intermediate_size, shape.num_layers) == (64, 128, 2)
    assert (shape.num_heads, shape.num_kv_heads, shape.vocab_size) == (4, 2, 1024)
    from gguf_io.gguf_file import read_header

    assert shape.stored_weight_bytes == 4 * sum(math.prod(t.shape) for t in read_header(path).tensors)
    assert shape.weight_bytes(None) == shape.stored_weight_bytes
    assert shape.weight_bytes("int4") == shape.weight_bytes("bf16") / 4


def test_unreadable_model_is_a_clear_error(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 64}))
    with pytest.raises(ValueError, match="config.json has no intermediate_size"):
        load_shape(str(tmp_path))
