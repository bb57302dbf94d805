import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from native_engine.config import EngineConfig

ROOT = Path(__file__).resolve().parents[2]
BOOKKEEPING = ("config", "sampling_params", "sequence", "block_manager", "scheduler")


def test_defaults_do_not_touch_the_model():
    config = EngineConfig(model="/no/such/model.gguf")
    assert (config.block_size, config.max_num_batched_tokens, config.max_num_seqs) == (16, 2048, 256)
    assert config.max_model_len == 2048 and config.dtype == "auto" and config.enable_prefix_caching


def test_frozen():
    config = EngineConfig(model="m")
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.block_size = 32  # type: ignore[misc]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"model": ""}, "model must be a non-empty path"),
        ({"block_size": 0}, "block_size must be an integer >= 1, got 0"),
        ({"block_size": 16.0}, "block_size must be an integer >= 1, got 16.0"),
        ({"max_num_batched_tokens": 0}, "max_num_batched_tokens must be an integer >= 1"),
        ({"max_num_seqs": -1}, "max_num_seqs must be an integer >= 1, got -1"),
        ({"max_model_len": 0}, "max_model_len must be None or an integer >= 1, got 0"),
        ({"kv_cache_memory_bytes": 0}, "kv_cache_memory_bytes must be None or an integer >= 1"),
        ({"gpu_memory_utilization": 0}, "gpu_memory_utilization must be in (0, 1], got 0"),
        ({"gpu_memory_utilization": 1.2}, "gpu_memory_utilization must be in (0, 1]"),
        ({"kv_cache_fraction_cpu": 0}, "kv_cache_fraction_cpu must be in (0, 1]"),
        ({"dtype": "int8"}, "dtype must be one of auto, float32, bfloat16, float16; got 'int8'"),
        ({"device": "tpu"}, "device must be 'auto', 'cpu', 'cuda' or 'cuda:N', got 'tpu'"),
        ({"num_threads": 0}, "num_threads must be None or an integer >= 1"),
        ({"seed": -1}, "seed must be an integer >= 0, got -1"),
    ],
)
def test_invalid_values_raise_clear_errors(kwargs, message):
    kwargs = {"model": "m", **kwargs}
    with pytest.raises(ValueError) as info:
        EngineConfig(**kwargs)
    assert message in str(info.value)


def test_bookkeeping_modules_import_no_torch():
    # A stub package skips native_engine/__init__.py, which may import the torch side of the engine.
    code = (
        "import sys, types\n"
        f"pkg = types.ModuleType('native_engine'); pkg.__path__ = [{str(ROOT / 'native_engine')!r}]\n"
        "sys.modules['native_engine'] = pkg\n"
        f"for name in {BOOKKEEPING!r}: __import__('native_engine.' + name)\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('torch', 'numpy', 'triton', 'registry', 'adapters')]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)
