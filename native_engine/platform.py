"""Device, compute dtype and KV-cache memory budget."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
CPU_KV_CAP_BYTES = 4 << 30


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {name!r} was asked for but CUDA is not available")
    return device


@contextmanager
def loading_threads(device: torch.device) -> Iterator[None]:
    """One torch thread while weights are copied and packed on the CPU. The copies are bound by memory
    bandwidth, so more threads gain little; and when other processes keep the cores busy, the pool's
    threads wait for each other at every op: SmolLM2's model build took 1.8-5 s with 2 threads on a
    shared 2-core machine against 0.5 s with one (bench/native_load.py measures the load)."""
    if device.type != "cpu":
        yield
        return
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def resolve_dtype(name: str, device: torch.device, source_dtype: str | None) -> torch.dtype:
    """`auto`: bf16 on GPU; on CPU f32 and quantized weights compute in f32 (quantized ones through int4
    matmuls, see `layers/quant.py`), f16/bf16 ones in bf16."""
    if name != "auto":
        return _DTYPES[name]
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch.float32 if source_dtype in ("float32", "quantized") else torch.bfloat16


def to_device(values: list, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A small host list on the device without a host sync: through pinned memory and a non-blocking copy on
    CUDA (`torch.tensor(values, device="cuda")` copies from pageable memory and waits for the stream)."""
    if device.type != "cuda":
        return torch.tensor(values, dtype=dtype, device=device)
    return torch.tensor(values, dtype=dtype, pin_memory=True).to(device, non_blocking=True)


def available_cpu_memory() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 8 << 30


def cpu_kv_budget(fraction: float) -> int:
    return min(int(available_cpu_memory() * fraction), CPU_KV_CAP_BYTES)


def gpu_kv_budget(device: torch.device, utilization: float, profile) -> int:
    """vLLM's sizing: run `profile()` (a forward at the batch-token budget), then
    budget = total * utilization - memory used by others - this process's peak."""
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    profile()
    torch.cuda.synchronize(device)
    free, total = torch.cuda.mem_get_info(device)
    peak, current = torch.cuda.max_memory_allocated(device), torch.cuda.memory_allocated(device)
    used = total - free
    return int(total * utilization - used - peak + current)
