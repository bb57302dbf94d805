"""What the load-time kernel check (native_engine/layers/kernel_check.py) costs: its share of SmolLM2's load.

In one process: a warm-up load (kernels built, file in the page cache), then ``--runs`` loads of SmolLM2-135M
Q4_1 with ``infer serve``'s settings (2048-token context), each with the verdicts forgotten so every check runs
again; the seconds spent inside the checks are summed per load. Prints the medians and the share; goal < 5 %.
Run it at each tier: ``INFER_CPU_MARCH=x86-64-v3 ATEN_CPU_CAPABILITY=avx2 python bench/kernel_check.py``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from native_engine import LLMEngine  # noqa: E402
from native_engine.kernels import cpu_kernels  # noqa: E402
from native_engine.layers import kernel_check  # noqa: E402
from registry.realmodels import fetch_smollm2  # noqa: E402

GOAL = 0.05


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    runs = parser.parse_args().runs
    path = fetch_smollm2()
    spent: list[float] = []
    check = kernel_check._check

    def timed(*args):
        start = time.perf_counter()
        try:
            return check(*args)
        finally:
            spent.append(time.perf_counter() - start)

    kernel_check._check = timed
    LLMEngine.from_model(str(path), max_model_len=2048).close()
    loads, checks = [], []
    for _ in range(runs):
        kernel_check._verdicts.clear()
        spent.clear()
        start = time.perf_counter()
        LLMEngine.from_model(str(path), max_model_len=2048).close()
        loads.append(time.perf_counter() - start)
        checks.append(sum(spent))
    load, cost = statistics.median(loads), statistics.median(checks)
    print(f"{kernel_check.cpu_description()}")
    print(f"verdicts: {kernel_check.verdicts()}")
    print(f"load {load:.3f} s, kernel check {cost * 1000:.1f} ms ({len(spent)} checks) = {cost / load:.2%} of load "
          f"(medians of {runs}); goal < {GOAL:.0%}: {'met' if cost / load < GOAL else 'MISSED'}")


if __name__ == "__main__":
    main()
