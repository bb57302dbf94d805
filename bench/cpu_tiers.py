"""The native engine's CPU matmul kernels at each -march tier, side by side: GFLOP/s of one thread.

For each tier this CPU can run (``native``, ``x86-64-v3``: AVX2, ``x86-64``: plain C), in a child process with
``INFER_CPU_MARCH`` set: the 1-row block matmul (a decode row) and the tiled batch kernel at 4, 8 and 16 rows,
on SmolLM2's gate_up shape (1536 x 576, Q4_1), the fastest of 25 timings of 50 calls each (min: the machine is
shared). ``.venv/bin/python bench/cpu_tiers.py``
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from native_engine.kernels import cpu_kernels  # noqa: E402

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


def main() -> None:
    print(f"{'march':12} {'tier':8} " + " ".join(f"{r:>3} row{'s' if r > 1 else ' '}" for r in (1, 4, 8, 16))
          + "   (GFLOP/s, one thread)")
    for march in reversed(cpu_kernels.runnable_marches()):
        env = {**os.environ, "INFER_CPU_MARCH": march}
        done = subprocess.run([sys.executable, "-c", CHILD], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=600, check=True)
        r = json.loads(done.stdout.strip().splitlines()[-1])
        print(f"{march:12} {r['tier']:8} " + " ".join(f"{r[str(n)]:8.1f}" for n in (1, 4, 8, 16)))


if __name__ == "__main__":
    main()
