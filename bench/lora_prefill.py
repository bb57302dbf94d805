"""A prefill's LoRA on the CPU, per linear: SmolLM2-135M Q4_1's layer 0 at 512 rows of one resident rank-16 adapter
(all seven projections, `bench/lora.py`'s adapters), CPU time (median of 5 x the median of 20 calls each):

- base: the tiled int16 matmul alone (`TiledBlocks.matmul`);
- fused: the same call with the adapter rows added inside it (`tiled_matmul_lora`, what `Linear.forward` runs);
- torch loop: the tiled matmul, then `LoRALayer.apply` (`sgmv_torch`: the path before, and the fallback).

The engine's TTFT ratio (`bench/lora.py`) is this overhead diluted by the rest of a prefill (attention, norms,
the LM head), and moves with the machine's load far more than this does.

    flock /tmp/infer-heavy.lock .venv/bin/python bench/lora_prefill.py [threads]
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from native_engine import LLMEngine
from native_engine.lora.punica import LoRAMapping
from registry.realmodels import fetch_smollm2

from lora import greedy, make_adapters  # bench/ is the script's directory

ROWS = 512
LINEARS = ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj")


def cpu_time(fn, calls: int = 20) -> float:
    times = []
    for _ in range(calls):
        c0 = time.process_time()
        fn()
        times.append(time.process_time() - c0)
    return statistics.median(times)


def main() -> None:
    if len(sys.argv) > 1:
        torch.set_num_threads(int(sys.argv[1]))
    path = fetch_smollm2()
    adapters = make_adapters(path, Path(tempfile.mkdtemp()))
    engine = LLMEngine.from_model(path, max_model_len=2048, max_loras=8)
    engine.generate([[1, 2, 3]], greedy(1), lora_request=adapters[1])  # the adapter into a slot
    manager = engine.model_runner.lora
    mapping = LoRAMapping.build([(ROWS, manager.slots[adapters[1].lora_name])])
    layer = engine.model_runner.model.model.layers[0]
    total = dict.fromkeys(("base", "fused", "torch"), 0.0)
    for name in LINEARS:
        linear = layer.get_submodule(name)
        tiled = linear.int4.tiled
        x = torch.randn(ROWS, tiled.shape[1])
        with manager.step(mapping):
            rows = linear.lora.c_rows(x)
            runs = {k: [] for k in total}
            for _ in range(5):
                runs["base"].append(cpu_time(lambda: tiled.matmul(x)))
                runs["fused"].append(cpu_time(lambda: tiled.matmul(x, rows)))
                runs["torch"].append(cpu_time(lambda: linear.lora.apply(x, tiled.matmul(x))))
        ms = {k: statistics.median(v) * 1e3 for k, v in runs.items()}
        for k in total:
            total[k] += ms[k]
        print(f"{name:20s} N={tiled.shape[0]:5d} K={tiled.shape[1]:5d}: base {ms['base']:.2f} ms, fused "
              f"{ms['fused']:.2f} (+{ms['fused'] - ms['base']:.2f}), torch loop {ms['torch']:.2f} "
              f"(+{ms['torch'] - ms['base']:.2f})")
    print(f"layer: base {total['base']:.2f} ms, fused {total['fused']:.2f} ({total['fused'] / total['base']:.3f}x), "
          f"torch loop {total['torch']:.2f} ({total['torch'] / total['base']:.3f}x)")


if __name__ == "__main__":
    main()
