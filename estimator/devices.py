"""Accelerator specs (dense, no sparsity) and a measured profile of this machine's CPU.

Peaks are per device. ``fp8`` is ``None`` where the device has no FP8 tensor cores; int8/int4
*weights* still compute in bf16 (weight-only quantization), so only ``fp8`` uses the fp8 peak.

``link_gbs`` is the device-to-device link per direction (half the datasheets' bidirectional figures),
``link_latency_us`` one ring hop: what tensor parallelism's all-reduces cost (``comm.py``). For the CPU,
ranks are processes on one machine talking gloo over loopback: a latency of ~100 µs a hop dominates
(``bench/tp.py`` measures this machine's; give ``--link-latency-us`` to use it).
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from core.settings import RegistrySettings


@dataclass(frozen=True)
class Device:
    name: str
    bf16_tflops: float
    fp8_tflops: float | None
    memory_gb: float
    bandwidth_gbs: float
    link_gbs: float = 32.0  # PCIe 4.0 x16, per direction
    link_latency_us: float = 5.0

    def peak_flops(self, dtype: str) -> float:
        tflops = self.fp8_tflops if dtype == "fp8" and self.fp8_tflops else self.bf16_tflops
        return tflops * 1e12


DEVICES = {
    # NVIDIA H100 SXM5 datasheet: BF16 1,979 TFLOPS and FP8 3,958 "with sparsity" -> halved; 80 GB HBM3, 3.35 TB/s.
    # NVLink 4: 900 GB/s bidirectional per GPU.
    "h100": Device("h100", 989.4, 1978.9, 80, 3350, 450, 2.0),
    # NVIDIA H200 datasheet: same Hopper compute as H100 SXM; 141 GB HBM3e, 4.8 TB/s; NVLink 900 GB/s.
    "h200": Device("h200", 989.4, 1978.9, 141, 4800, 450, 2.0),
    # NVIDIA A100 datasheet (SXM): BF16 312 TFLOPS dense, no FP8; 80 GB HBM2e 2,039 GB/s; 40 GB HBM2 1,555 GB/s;
    # NVLink 3: 600 GB/s bidirectional.
    "a100-80g": Device("a100-80g", 312, None, 80, 2039, 300, 2.5),
    "a100-40g": Device("a100-40g", 312, None, 40, 1555, 300, 2.5),
    # NVIDIA L40S datasheet: BF16 733 / FP8 1,466 TFLOPS with sparsity -> 362 / 733 dense; 48 GB GDDR6, 864 GB/s.
    "l40s": Device("l40s", 362.05, 733, 48, 864),  # PCIe 4.0 x16 (the default link), as the L4
    # NVIDIA L4 datasheet: BF16 242 / FP8 485 TFLOPS with sparsity -> 121 / 242.5 dense; 24 GB, 300 GB/s.
    "l4": Device("l4", 121, 242.5, 24, 300),
    # NVIDIA Ada whitepaper (RTX 4090): FP16/BF16 tensor with FP32 accumulate 165.2 TFLOPS dense, FP8 330.3;
    # 24 GB GDDR6X, 1,008 GB/s. PCIe 4.0 without peer-to-peer: NCCL goes through host memory (~half).
    "rtx4090": Device("rtx4090", 165.2, 330.3, 24, 1008, 16, 10.0),
    # AMD Instinct MI300X datasheet: BF16 1,307.4 / FP8 2,614.9 TFLOPS dense; 192 GB HBM3, 5.3 TB/s;
    # Infinity Fabric: 7 links of 64 GB/s per direction to the other GPUs of an 8-GPU platform.
    "mi300x": Device("mi300x", 1307.4, 2614.9, 192, 5300, 448, 3.0),
}
DEVICE_NAMES = (*DEVICES, "cpu")
CPU_HOP_US = 100.0  # gloo over loopback between processes of one machine, idle (bench/tp.py measures it)


def cpu_cache_path() -> Path:
    return RegistrySettings.from_env().home / "estimate" / "cpu.json"


def probe_cpu(*, size_mb: int = 256, matmul_n: int = 1024, repeats: int = 5) -> Device:
    """Best-of-``repeats`` copy bandwidth (read + write bytes) and float32 matmul FLOP/s."""
    src = np.ones(size_mb * (1 << 20) // 8, dtype=np.float64)
    dst = np.empty_like(src)
    best_copy = min(_timed(lambda: np.copyto(dst, src)) for _ in range(repeats))
    a = np.random.default_rng(0).standard_normal((matmul_n, matmul_n), dtype=np.float32)
    best_mm = min(_timed(lambda: a @ a) for _ in range(repeats))
    bandwidth = 2 * src.nbytes / best_copy / 1e9
    return Device("cpu", 2 * matmul_n**3 / best_mm / 1e12, None, _memory_gb(), bandwidth, bandwidth / 4, CPU_HOP_US)


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _memory_gb() -> float:
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) / 1e6
    except OSError:
        pass
    return 0.0


def cpu_device(*, refresh: bool = False, size_mb: int = 256) -> Device:
    """This machine's CPU, measured once and cached under ``$INFER_HOME/estimate/cpu.json``."""
    path = cpu_cache_path()
    if path.exists() and not refresh:
        try:
            data = json.loads(path.read_text())
            data.setdefault("link_gbs", data.get("bandwidth_gbs", 4.0) / 4)  # a profile cached before links
            data.setdefault("link_latency_us", CPU_HOP_US)
            return Device(**data)
        except (TypeError, ValueError):
            pass
    device = probe_cpu(size_mb=size_mb)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(asdict(device), indent=2) + "\n")
    return device


def get_device(name: str, *, peak_tflops: float | None = None, bandwidth_gbs: float | None = None,
               memory_gb: float | None = None, link_gbs: float | None = None,
               link_latency_us: float | None = None) -> Device:
    """A named device with optional overrides; an unknown name needs all three overrides."""
    if name == "cpu":
        base = cpu_device()
    elif name in DEVICES:
        base = DEVICES[name]
    elif None not in (peak_tflops, bandwidth_gbs, memory_gb):
        base = Device(name, 0, None, 0, 0)
    else:
        raise ValueError(f"unknown --device {name!r}: choose {', '.join(DEVICE_NAMES)}, "
                         "or give --peak-tflops, --bandwidth-gbs and --memory-gb")
    return Device(base.name, peak_tflops or base.bf16_tflops, None if peak_tflops else base.fp8_tflops,
                  memory_gb or base.memory_gb, bandwidth_gbs or base.bandwidth_gbs, link_gbs or base.link_gbs,
                  base.link_latency_us if link_latency_us is None else link_latency_us)
