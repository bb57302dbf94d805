"""Noise on a shared machine: how many cores other processes keep busy, and waiting for a quiet spell.

Benchmarks print the reading next to their figures, so a number taken on a busy machine says so.
"""

from __future__ import annotations

import os
import time


def cpu_ticks() -> tuple[int, int]:
    """(busy ticks of the whole machine, ticks of this process), in clock ticks."""
    with open("/proc/stat") as f:
        user, nice, system, _idle, _iowait, irq, softirq, steal = (int(v) for v in f.readline().split()[1:9])
    t = os.times()
    return user + nice + system + irq + softirq + steal, round((t.user + t.system) * os.sysconf("SC_CLK_TCK"))


def others_cores(before: tuple[int, int], after: tuple[int, int], seconds: float) -> float:
    """Mean number of cores other processes kept busy between two `cpu_ticks()` samples."""
    return max(0, (after[0] - before[0]) - (after[1] - before[1])) / os.sysconf("SC_CLK_TCK") / seconds


def wait_idle(limit_s: float, threshold: float = 0.25) -> float:
    """Wait (up to `limit_s`) for a 2 s window where others use < `threshold` cores; returns the last reading."""
    deadline = time.perf_counter() + limit_s
    while True:
        a = cpu_ticks()
        time.sleep(2.0)
        busy = others_cores(a, cpu_ticks(), 2.0)
        if busy < threshold or time.perf_counter() > deadline:
            return busy
        print(f"  (machine busy: others use {busy:.2f} cores; waiting)", flush=True)
