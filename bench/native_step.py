"""The native engine's host time per step, on CPU: a proxy for the overhead a GPU step pays on its host.

A 1-layer Qwen2-shaped model with a hidden size of 64 (tiny-qwen2, one layer), so the model's arithmetic is a
small part of a step and what is measured is the engine around it: the scheduler, building the step's
inputs, the sampler's metadata and ops, the detokenizer and the outputs. Decode steps only (the prefill
steps are left out), at batch 1 and 64, greedy and with Ollama's default sampling (temperature 0.8, top_k
40, top_p 0.9, repeat_penalty 1.1); medians over the steps, in microseconds, split into:

- schedule: `Scheduler.schedule`;
- forward: the model and its LM head (`model_runner.model` and `compute_logits`);
- sample: the sampler (`model_runner.sampler`), its metadata and the host copy of the ids;
- rest: everything else in `LLMEngine.step` (inputs, postprocess, detokenizer, outputs).

One intra-op thread, so a busy machine moves the numbers less.

Then the same with the decode steps on the CUDA-graph path and the replay replaced by nothing ("graph path",
`NullGraphs`): the model's forward drops out and what is left is the host work a GPU decode step does around
its replay (the inputs in the graph's layout, the LM head and sampler launches, the bookkeeping), CPU op
dispatch standing in for CUDA launches. The LM head and the sampler still compute on the CPU there.

    .venv/bin/python bench/native_step.py [--steps 128] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from native_engine import LLMEngine, SamplingParams  # noqa: E402
from native_engine.cuda_graph import DecodeGraphs  # noqa: E402
from noise import cpu_ticks, others_cores  # noqa: E402  (bench/ is the script's directory)
from registry.modelbuilder import PRESETS, build_gguf  # noqa: E402

OLLAMA = dict(temperature=0.8, top_k=40, top_p=0.9, repetition_penalty=1.1)


class NullGraphs(DecodeGraphs):
    """The graph path's host side: inputs go to the static buffers, the replay does nothing (no model)."""

    def _capture_all(self) -> None:
        self.graphs = dict.fromkeys(self.buckets)

    def _replay(self, bs: int) -> None:
        pass


def timed(owner, name: str, spent: dict):
    """Wrap owner.name so each call adds its time to spent[name]; returns the undo."""
    fn = getattr(owner, name)
    own = name in vars(owner)

    def wrapper(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            spent[name] += time.perf_counter() - t0

    setattr(owner, name, wrapper)
    return lambda: setattr(owner, name, fn) if own else delattr(owner, name)


def measure(engine: LLMEngine, batch: int, steps: int, params: SamplingParams) -> dict:
    spent: dict = defaultdict(float)
    runner = engine.model_runner
    undo = [timed(engine.scheduler, "schedule", spent), timed(runner.model, "forward", spent),
            timed(runner.model, "compute_logits", spent), timed(runner, "_sampling_metadata", spent),
            timed(runner, "sampler", spent)]
    for i in range(batch):
        engine.add_request(f"b{batch}-{i}-{time.monotonic_ns()}", [5 + i % 200, 9, 11, 13], params)
    while any(s.is_prefill or s.num_computed_tokens == 0 for s in engine.scheduler.running + engine.scheduler.waiting):
        engine.step()
    rows: dict = defaultdict(list)
    for _ in range(steps):
        spent.clear()
        t0 = time.perf_counter()
        engine.step()
        total = time.perf_counter() - t0
        forward = spent["forward"] + spent["compute_logits"]
        sample = spent["sampler"] + spent["_sampling_metadata"]
        for key, value in (("total", total), ("schedule", spent["schedule"]), ("forward", forward),
                           ("sample", sample), ("rest", total - spent["schedule"] - forward - sample)):
            rows[key].append(value * 1e6)
    for request_id in list(engine.requests):
        engine.abort(request_id)
    for restore in undo:
        restore()
    return {key: statistics.median(values) for key, values in rows.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=128)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        path = build_gguf(Path(tmp) / "one-layer.gguf", PRESETS["tiny-qwen2"].with_(num_layers=1, name="one-layer"))
        engine = LLMEngine.from_model(path, max_num_seqs=64, max_model_len=512, kv_cache_memory_bytes=64 << 20)
    res, before, t0 = {}, cpu_ticks(), time.perf_counter()
    for path_name in ("module", "graph"):
        if path_name == "graph":
            runner = engine.model_runner
            runner.graphs = NullGraphs(runner.model, 64, runner.inputs.max_blocks, engine.model_config.hidden_size,
                                       engine.device, engine.dtype)
        for batch in (1, 64):
            for name, extra in (("greedy", {"temperature": 0.0}), ("sampled", OLLAMA)):
                params = SamplingParams(**extra, max_tokens=args.steps + 8, ignore_eos=True)
                key = f"batch{batch}_{name}" + ("_graph" if path_name == "graph" else "")
                res[key] = measure(engine, batch, args.steps, params)
    res["others_cores"] = others_cores(before, cpu_ticks(), time.perf_counter() - t0)
    print("\nnative engine, host time per decode step (1-layer tiny model, CPU, 1 thread), median microseconds; "
          f"other processes used {res['others_cores']:.2f} cores meanwhile")
    print(f"  {'':22s} {'total':>8s} {'schedule':>9s} {'forward':>8s} {'sample':>8s} {'rest':>8s} {'host':>8s}")
    for key, r in res.items():
        if key == "others_cores":
            continue
        print(f"  {key:22s} {r['total']:8.0f} {r['schedule']:9.0f} {r['forward']:8.0f} {r['sample']:8.0f} "
              f"{r['rest']:8.0f} {r['total'] - r['forward']:8.0f}")
    for batch in (1, 64):
        g, s = res[f"batch{batch}_greedy"]["total"], res[f"batch{batch}_sampled"]["total"]
        print(f"  batch {batch}: sampled / greedy step time {s / g:.2f}x")
    print("  host = total - forward; the _graph rows: decode steps on the CUDA-graph path with the replay a no-op")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
