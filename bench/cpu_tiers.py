"""The native engine's CPU matmul kernels at each -march tier, side by side: GFLOP/s of one thread.

For each tier this CPU can run (``native``, ``x86-64-v3``: AVX2, ``x86-64``: plain C), in a child process with
``INFER_CPU_MARCH`` set: the 1-row block matmul (a decode row) and the tiled batch kernel at 4, 8 and 16 rows,
on SmolLM2's gate_up shape (1536 x 576, Q4_1), the fastest of 25 timings of 50 calls each (min: the machine is
shared). Then the ceiling under them: the peak rate of each tier's dot-product instruction on registers alone
(``bench/isa_peak.c``: no loads, no unpacking, no scaling), and of the 8-bit one llama.cpp's AVX2 path uses, in
the same unit (two FLOPs a multiply-add), with the tiled kernel's share of its instruction's peak.
``.venv/bin/python bench/cpu_tiers.py``
"""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from native_engine.kernels import cpu_kernels  # noqa: E402
from native_engine.layers import kernel_check  # noqa: E402

CHILD = """
import json, time, torch
torch.set_num_threads(1)
from native_engine.kernels import cpu_batch, cpu_kernels
g = torch.Generator().manual_seed(0)
N, K = 1536, 576
q = torch.randint(0, 16, (N, K), dtype=torch.uint8, generator=g)
d, m = torch.rand(N, K // 32, generator=g) / 50, torch.randn(N, K // 32, generator=g) / 50
qs = cpu_kernels.pack_q4_1(q)
tiles = cpu_batch.TiledBlocks.build(qs, d, m)
out = {"tier": cpu_kernels.tier()}
for rows in (1, 4, 8, 16):
    x = torch.randn(rows, K, generator=g)
    if rows == 1 or tiles is None:
        f = lambda: cpu_kernels.blocks_matmul(x, qs, d, m)
    else:
        f = lambda: tiles.matmul(x)
    for _ in range(20):
        f()
    best = float("inf")
    for _ in range(25):
        t = time.perf_counter()
        for _ in range(50):
            f()
        best = min(best, (time.perf_counter() - t) / 50)
    out[rows] = 2 * N * K * rows / best / 1e9
print(json.dumps(out))
"""


# instruction -> (function in isa_peak.c, -march that has it, multiply-adds a round, what uses it)
PEAKS = {
    "vpmaddwd+vpaddd ymm": ("peak_maddwd", "x86-64-v3", 8 * 16, "int16 activations: the AVX2 tier"),
    "vpmaddubsw+vpaddw ymm": ("peak_maddubsw", "x86-64-v3", 8 * 32, "int8 activations: llama.cpp's AVX2 q4_1 x q8_1"),
    "vpdpwssd zmm": ("peak_dpwssd", "native", 8 * 32, "int16 activations: the AVX-512 tier"),
}


def peak(function: str, march: str, macs: int, rounds: int = 2_000_000) -> float | None:
    """GFLOP/s of `function` in isa_peak.c built with -march=`march`: the best of 9 timings; None where absent."""
    with tempfile.TemporaryDirectory() as tmp:
        lib_path = Path(tmp) / "isa_peak.so"
        subprocess.run(["cc", "-O3", f"-march={march}", "-shared", "-fPIC", "-o", str(lib_path),
                        str(ROOT / "bench" / "isa_peak.c")], check=True)
        lib = ctypes.CDLL(str(lib_path))
        if not hasattr(lib, function):
            return None
        fn = getattr(lib, function)
        fn.argtypes, fn.restype = (ctypes.c_int64,), ctypes.c_int64
        fn(rounds)
        best = float("inf")
        for _ in range(9):
            t = time.perf_counter()
            fn(rounds)
            best = min(best, time.perf_counter() - t)
    return 2 * macs * rounds / best / 1e9


def activation_nmse(levels: int, centred: bool) -> float:
    """The normalized squared error of the tiled kernels' scheme with activations rounded per group of 32 to
    `levels` (32767: int16, today; 127: int8), on the load-time check's random Q4_1 blocks and inputs
    (layers/kernel_check.py), computed exactly in float64. `centred`: the weights taken as q - 8 with 8 d moved
    into the offset, which the float sums carry exactly."""
    q, d, m = (t.double() for t in kernel_check.sample_blocks("q4_1"))
    x = torch.randn(9, q.shape[1], generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    reference = x @ kernel_check._dequantize(q, d, m).t()
    groups = x.view(x.shape[0], -1, 32)
    scale = groups.abs().amax(-1) / levels
    rounded = torch.round(groups / scale[..., None])
    q, offset = (q - 8, m + 8 * d) if centred else (q, m)
    sums = torch.einsum("tgj,ngj->tng", rounded, q.view(q.shape[0], -1, 32))
    out = (sums * scale[:, None, :] * d[None]).sum(-1) + (groups.sum(-1)[:, None, :] * offset[None]).sum(-1)
    return float(((out - reference) ** 2).sum() / (reference**2).sum())


def main() -> None:
    print(f"{'march':12} {'tier':8} " + " ".join(f"{r:>3} row{'s' if r > 1 else ' '}" for r in (1, 4, 8, 16))
          + "   (GFLOP/s, one thread)")
    tiled16 = {}
    for march in reversed(cpu_kernels.runnable_marches()):
        env = {**os.environ, "INFER_CPU_MARCH": march}
        done = subprocess.run([sys.executable, "-c", CHILD], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=600, check=True)
        r = json.loads(done.stdout.strip().splitlines()[-1])
        tiled16[r["tier"]] = r["16"]
        print(f"{march:12} {r['tier']:8} " + " ".join(f"{r[str(n)]:8.1f}" for n in (1, 4, 8, 16)))
    marches = cpu_kernels.runnable_marches()
    print(f"\n{'instruction':24} {'peak':>8}  tiled at 16 rows / peak   (GFLOP/s, one thread, registers only)")
    for name, (function, march, macs, use) in PEAKS.items():
        rate = peak(function, march, macs) if march in marches else None
        if rate is None:
            print(f"{name:24} {'-':>8}  (not on this CPU)")
            continue
        tier = {"vpmaddwd+vpaddd ymm": "avx2", "vpdpwssd zmm": "avx512"}.get(name)
        share = f"{tiled16[tier] / rate:6.0%}" if tier in tiled16 else "     -"
        print(f"{name:24} {rate:8.1f}  {share}                    {use}")
    print("\nnormalized squared error of the activations' rounding, the load-time check's Q4_1 blocks "
          f"(its limit for the tiled path: {kernel_check.LIMITS['tiled']:g}):")
    for levels, name in ((32767, "int16"), (127, "int8")):
        plain, centred = activation_nmse(levels, False), activation_nmse(levels, True)
        print(f"  {name}: {plain:.2g}  (weights centred on 8: {centred:.2g})")


if __name__ == "__main__":
    main()
