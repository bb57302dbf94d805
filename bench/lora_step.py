"""The C decode step alone (`llama_decode_batch`, models/cpu_decode.py) with and without LoRA adapters.

bench/lora.py measures whole requests; this times the one C call of a 16-row decode step of SmolLM2-135M (Q4_1)
on the same step's inputs, with no row through an adapter, every row through one adapter, and the rows over
eight rank-16 adapters (two each), the three calls alternated `--calls` times; medians and the fastest call, by wall
time and by the process's CPU time (both threads, their waits for each other included, as bench/lora.py's
tokens per CPU second count them; an idle OpenMP thread spinning on after a call is counted too).
The step is taken from bench/lora.py's eight-adapter load once every request decodes; the calls rewrite its
keys and values with those of the step as run last, the real one, so the generation goes on unchanged.

    flock /tmp/infer-heavy.lock .venv/bin/python bench/lora_step.py [--calls 200] [--loads eight]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from native_engine import LLMEngine
from native_engine.lora.punica import LoRAMapping
from native_engine.models.cpu_decode import CPUDecodeStack
from registry.realmodels import fetch_smollm2

from lora import NUM_ADAPTERS, NUM_REQUESTS, Prompts, greedy, make_adapters  # bench/ is the script's directory


def time_calls(call, stack: CPUDecodeStack, hidden: torch.Tensor, positions: torch.Tensor, ctx, calls: int,
               kinds: list[str]) -> dict:
    """(wall seconds, CPU seconds of the process: both threads, spinning included) of each C call (`call`: the
    stack's own __call__) per load of `kinds`, the loads alternated."""
    eight = ctx.lora
    first = eight.segments[0][2]
    loads = {"base": None, "one": LoRAMapping.build([(1, first)] * hidden.shape[0]), "eight": eight}
    loads = {k: v for k, v in loads.items() if k in kinds}
    times: dict[str, list[tuple[float, float]]] = {k: [] for k in loads}
    for _ in range(calls):
        for kind, mapping in loads.items():
            ctx.lora, h = mapping, hidden.clone()
            t0, c0 = time.perf_counter(), time.process_time()
            call(stack, h, positions, ctx)
            times[kind].append((time.perf_counter() - t0, time.process_time() - c0))
    ctx.lora = eight
    return times


def capture(engine: LLMEngine, adapters: list, calls: int, kinds: list[str]) -> dict:
    """Runs the eight-adapter load; times the first step where all requests decode."""
    stack = engine.model_runner.model.model.cpu_decode
    real, found = CPUDecodeStack.__call__, {}

    def hook(self, hidden, positions, ctx):
        rows = hidden.shape[0]
        if not found and rows == NUM_REQUESTS and ctx.lora is not None and self._batch_serves(rows, ctx):
            found.update(time_calls(real, self, hidden, positions, ctx, calls, kinds))
        return real(self, hidden, positions, ctx)

    prompts = Prompts(engine.tokenizer, quick=False)
    CPUDecodeStack.__call__ = hook
    try:
        for i, p in enumerate(prompts.batch()):
            engine.add_request(f"s{i}", p, greedy(64), lora_request=adapters[i % NUM_ADAPTERS])
        while engine.has_unfinished_requests():
            engine.step()
    finally:
        CPUDecodeStack.__call__ = real
    assert found, f"no 16-row decode step through the C call ({stack})"
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--loads", default="base,one,eight", help="which loads to time (one alone: to profile it)")
    args = parser.parse_args()
    path = fetch_smollm2()
    with tempfile.TemporaryDirectory() as tmp:
        adapters = make_adapters(path, Path(tmp))
        engine = LLMEngine.from_model(path, max_model_len=2048, max_loras=NUM_ADAPTERS)
        times = capture(engine, adapters, args.calls, args.loads.split(","))
    for i, clock in enumerate(("wall", "CPU")):
        med = {k: statistics.median(t[i] for t in v) for k, v in times.items()}
        low = {k: min(t[i] for t in v) for k, v in times.items()}
        print(f"C decode step, {NUM_REQUESTS} rows, {torch.get_num_threads()} threads, {args.calls} calls each "
              f"({clock} time: median / fastest, ms):")
        for kind in times:
            if "base" not in times:
                print(f"  {kind:5s} {med[kind] * 1e3:6.2f} / {low[kind] * 1e3:6.2f}")
                continue
            print(f"  {kind:5s} {med[kind] * 1e3:6.2f} / {low[kind] * 1e3:6.2f}  over base "
                  f"{(med[kind] - med['base']) * 1e3:+5.2f} / {(low[kind] - low['base']) * 1e3:+5.2f}  "
                  f"base / it {med['base'] / med[kind]:.3f} / {low['base'] / low[kind]:.3f}")


if __name__ == "__main__":
    main()
