"""The native engine on one GPU, in one command of a few minutes: Qwen2-0.5B and Qwen2-7B shapes, random bf16.

For each shape the model's config.json and tokenizer are written (registry.modelbuilder's Qwen2 presets),
then the engine loads them with `load_format="dummy"`: the weights are drawn on the device, nothing is
written or copied from the host. Measured, in one process, one side at a time:

1. the device's copy bandwidth (a 2 GiB device-to-device copy of random data, bytes read + written,
   CUDA events, median of 10 after warm-up): the ceiling for MBU;
2. batch 1: a 16-token prompt, 256 tokens; decode tok/s = (n - 1) / (last - first token time), greedy and
   with Ollama's default sampling (temperature 0.8, top_k 40, top_p 0.9, repeat_penalty 1.1);
   MBU = (bytes a decode step reads: the weights, less an untied input embedding of which it reads one row,
   plus the KV cache) x tok/s / copy bandwidth;
3. 64 uniform requests (256 in, 256 out) and 64 mixed ones (32..512 in, 32..256 out, seeded), all added at
   once, ignore_eos: output tok/s = requested tokens / wall time; median TTFT and TPOT; how many steps ran
   as CUDA graphs. The same prompts through transformers `generate` (one left-padded batch, the model built
   from the same config on the device, bf16, max_new_tokens = the longest output, only the requested tokens
   counted), greedy and sampled with the same settings;
4. ratios: ours / transformers, sampled / greedy; then a JSON file (--json).

Fair to both sides: each side first runs every workload once with 8 output tokens (compiles, cuBLAS and
attention kernels for every prefill shape, CUDA-graph buckets, the allocator), then the widest workload
(mixed, greedy) at full length once, untimed; then each workload is measured up to `--repeats` times, greedy
and sampled alternating which goes first, and the median is reported (each run's figure is in the JSON, the
table's `runs` column says how many each side got). Every measured prompt starts with its own tokens, so our
prefix cache never serves one; transformers gets the same prompts. Inside --budget-s: the 0.5B shape may use
45 % of it, a repeat starts only if it should end in time, and transformers on 7B is skipped when its
warm-up and one repeat (1.6x the 0.5B's) would not fit.

Also on the 0.5B shape (`profile` in the JSON, printed last): the wall time of a steady decode step at batch
1 and 64 with scheduling ahead off and on, the device's busy time per step under torch.profiler, the idle gap,
the top kernels; one mixed step (48 decoding rows beside fresh 256-token prompts up to the token budget) with the
per-chunk attention path and with the unified kernel; and each linear shape's one-row matmul against the copy
bandwidth (`bench/gpu_profile.py`).
A section that raises is reported and the rest goes on; if our engine raises with the unified attention kernel
or scheduling ahead, the workload is run again without it (`unified_failed`, `ahead_failed` in the JSON).

`--unified`: a pass (guarded) of the mixed workload, greedy, on the first shape, alternating on one engine, 3 runs
each (tok/s, TTFT and TPOT medians): the per-chunk attention path, the unified attention kernel
(kernels/unified_attention.py: a mixed step's rows in one launch a layer), and the unified kernel with the
steps that hold prefill chunks replayed from CUDA graphs (cuda_graph.MixedGraphs; CUDA only).

`--speculative`: after the models, one more pass (<= 40 s, guarded: its failure is reported and the rest
stands): the 0.5B shape with n-gram speculation (k = 4), batch 1, greedy, 256 tokens from a prompt that
repeats one 32-token span 8 times; the same engine with the request's `speculative=False` alternates with
it (3 runs each, medians), and the tokens are checked equal. Random weights make acceptance a property of
the random model (does its greedy continuation repeat the span?): the pass reports it as measured.

transformers for the 7B shape runs only while the run is inside --budget-s, so the command stays under
five minutes on an H100 or H200. `--quick`: a tiny model on the CPU (float32), a few requests, seconds: the
default test suite runs it so this script never rots.

    python bench/native_gpu.py [--quick] [--models 0.5b,7b] [--budget-s 170] [--repeats 2] [--speculative]
        [--json PATH]
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import random
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from native_engine import LLMEngine, SamplingParams  # noqa: E402
from registry.modelbuilder.hf_out import generation_config, hf_config, tokenizer_config  # noqa: E402
from registry.modelbuilder.spec import PRESETS  # noqa: E402
from registry.modelbuilder.tokenizer import padded_tokenizer, special_ids  # noqa: E402

from gpu_profile import decode_profile, gemv_table, mixed_profile, report_profile  # noqa: E402  (bench/ is the script's directory)

log = logging.getLogger("native_gpu")

SHAPES = {"0.5b": "qwen2-0.5b", "7b": "qwen2-7b", "tiny": "tiny-qwen2"}
OLLAMA = dict(temperature=0.8, top_k=40, top_p=0.9, repetition_penalty=1.1)
HF_OLLAMA = dict(do_sample=True, temperature=0.8, top_k=40, top_p=0.9, repetition_penalty=1.1)


def workloads(quick: bool) -> dict:
    rng = random.Random(0)
    ids = lambda n: [rng.randrange(300, 1000) for _ in range(n)]  # noqa: E731  (ordinary tokens, any model)
    n, single = (4, 8) if quick else (64, 256)
    lo, hi, olo, ohi, u_in, u_out = (8, 32, 4, 12, 16, 8) if quick else (32, 512, 32, 256, 256, 256)
    mixed_in = [rng.randint(lo, hi) for _ in range(n)]
    return {"single": (ids(16), single), "uniform": ([ids(u_in) for _ in range(n)], [u_out] * n),
            "mixed": ([ids(k) for k in mixed_in], [rng.randint(olo, ohi) for _ in range(n)])}


def model_dir(shape: str, root: Path) -> Path:
    """config.json and the tokenizer for a preset; no weights (the engine draws them)."""
    spec, out = PRESETS[SHAPES[shape]], root / shape
    out.mkdir(parents=True, exist_ok=True)
    tok = padded_tokenizer(spec.vocab_size, spec.tokenizer_vocab_size)
    ids = special_ids(tok)
    for name, data in (("config.json", hf_config(spec, "bf16", ids)), ("tokenizer_config.json", tokenizer_config(spec)),
                       ("generation_config.json", generation_config(ids))):
        (out / name).write_text(json.dumps(data))
    (out / "tokenizer.json").write_text(tok.to_str())
    return out


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def copy_bandwidth(device: torch.device, quick: bool) -> float:
    """Bytes read + written per second by a large device-to-device copy of random data (median of 10)."""
    n = (64 << 20 if quick or device.type == "cpu" else 2 << 30) // 4
    src = torch.rand(n, device=device)
    dst = torch.empty_like(src)
    times = []
    for i in range(13):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            dst.copy_(src)
            end.record()
            end.synchronize()
            elapsed = start.elapsed_time(end) / 1e3
        else:
            t0 = time.perf_counter()
            dst.copy_(src)
            elapsed = time.perf_counter() - t0
        if i >= 3:
            times.append(elapsed)
    assert torch.equal(dst[:1024], src[:1024])
    return 2 * n * 4 / statistics.median(times)


# -- the measured prompts ---------------------------------------------------------------------------


class Prompts:
    """The workloads' prompts, each time with its own first two tokens, so no prompt repeats another's first
    block (our prefix cache never serves one); both sides get the same prompts for the same run."""

    def __init__(self, w: dict) -> None:
        self.w = w
        self._heads = ((a, b) for a in range(100, 1000) for b in range(100, 1000))

    def fresh(self, load: str, tokens: int | None = None) -> tuple[list[list[int]], list[int]]:
        """(prompts, output lengths) of a workload; `tokens` caps the outputs (warm-up runs)."""
        prompts, outputs = self.w[load]
        if load == "single":
            prompts, outputs = [prompts], [outputs]
        fresh = [list(next(self._heads)) + p[2:] for p in prompts]
        return fresh, [min(n, tokens or n) for n in outputs]


def median_runs(runs: list[dict]) -> dict:
    """Each numeric field's median over the repeats; `runs` keeps every repeat's tok/s."""
    out = {k: statistics.median(r[k] for r in runs) for k, v in runs[0].items() if isinstance(v, (int, float))}
    out["runs_tok_s"] = [r["tok_s"] for r in runs]
    out.update({k: v for k, v in runs[0].items() if not isinstance(v, (int, float))})
    return out


def measure(run: Callable[[list, list, str, str], dict], prompts: Prompts, loads: tuple[str, ...], repeats: int,
            out: dict, deadline: float = float("inf")) -> None:
    """Warm every workload (8 tokens), then the widest at full length, then up to `repeats` timed runs of each
    workload, greedy and sampled alternating which goes first; medians into `out`. A repeat after the first
    runs only if one more, as long as the last, ends before `deadline` (perf_counter seconds)."""
    for load in loads:
        for name in ("greedy", "sampled"):
            run(*prompts.fresh(load, 8), name, f"warm-{load}")
    run(*prompts.fresh(loads[-1]), "greedy", "warm-full")
    runs: dict[str, list[dict]] = {}
    for r in range(repeats):
        t0 = time.perf_counter()
        for load in loads:
            for name in ("greedy", "sampled") if r % 2 == 0 else ("sampled", "greedy"):
                runs.setdefault(f"{load}_{name}", []).append(run(*prompts.fresh(load), name, f"{load}-{name}-{r}"))
        if time.perf_counter() + (time.perf_counter() - t0) > deadline:
            break
    out.update({key: median_runs(v) for key, v in runs.items()})


# -- ours -----------------------------------------------------------------------------------------


def engine_for(path: Path, device: torch.device, **kwargs) -> LLMEngine:
    dtype = "bfloat16" if device.type == "cuda" else "float32"
    return LLMEngine.from_model(path, load_format="dummy", device=str(device), dtype=dtype, max_num_seqs=64,
                                max_model_len=1024, max_num_batched_tokens=4096, **kwargs)


def greedy(n: int) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)


def sampled(n: int) -> SamplingParams:
    return SamplingParams(**OLLAMA, max_tokens=n, ignore_eos=True)


PARAMS = {"greedy": greedy, "sampled": sampled}


def ours_batch(engine: LLMEngine, prompts: list[list[int]], outputs: list[int], name: str, tag: str) -> dict:
    graphs = engine.model_runner.graphs
    replays = graphs.num_replays if graphs is not None else 0
    sync(engine.device)
    t0 = time.perf_counter()
    for i, (p, n) in enumerate(zip(prompts, outputs, strict=True)):
        engine.add_request(f"{tag}-{i}", p, PARAMS[name](n))
    generated, steps, ttft, tpot, token_times = 0, 0, [], [], []
    while engine.has_unfinished_requests():
        for out in engine.step():
            generated += len(out.outputs[0].token_ids)
            if out.finished:
                m = out.metrics
                ttft.append(m.first_token_time - m.arrival_time)
                tpot.append((m.last_token_time - m.first_token_time) / max(1, len(m.token_times) - 1))
                token_times = m.token_times
        steps += 1
    sync(engine.device)
    wall = time.perf_counter() - t0
    assert generated == sum(outputs), (generated, sum(outputs))
    graph_steps = (graphs.num_replays if graphs is not None else 0) - replays
    return {"tok_s": generated / wall, "wall_s": wall, "steps": steps, "graph_steps": graph_steps,
            "ttft_ms_p50": 1e3 * statistics.median(ttft), "tpot_ms_p50": 1e3 * statistics.median(tpot),
            "decode_tok_s": decode_rate(token_times)}


def decode_rate(token_times: list[float]) -> float:
    """A request's decode tok/s: the tokens after its first over the time they took (0 with one token)."""
    return (len(token_times) - 1) / (token_times[-1] - token_times[0]) if len(token_times) > 1 else 0.0


def guarded(engine: LLMEngine, res: dict) -> Callable:
    """ours_batch, run again without the unified attention kernel, then without scheduling ahead, if it raises
    with them (each failure recorded in `res`: `unified_failed`, `ahead_failed`)."""
    inputs = engine.model_runner.inputs

    def fallback() -> str | None:
        if inputs.unified:
            inputs.unified = False
            return "unified_failed"
        if engine.async_scheduling:
            engine.async_scheduling = False
            return "ahead_failed"
        return None

    def run(prompts, outputs, name, tag):
        while True:
            try:
                return ours_batch(engine, prompts, outputs, name, tag)
            except Exception:
                trace = traceback.format_exc(limit=8)
                key = fallback()
                if key is None:
                    raise
                res.setdefault(key, trace)
                log.error("%s, measuring without it:\n%s", key.replace("_", " "), trace)
                for request_id in list(engine.requests):
                    engine.abort(request_id)
                engine._inflight = None
                tag += "-" + key

    return run


def read_bytes(engine: LLMEngine) -> int:
    """Weight bytes a decode step reads: all of them, less an untied input embedding (of which it reads one row)."""
    model = engine.model_runner.model
    embed, head = model.model.embed_tokens.weight, model.lm_head.weight
    untied = embed.data_ptr() != head.data_ptr()
    return engine.model_runner.weight_bytes() - (embed.numel() * embed.element_size() if untied else 0)


def run_ours(path: Path, prompts: Prompts, device: torch.device, bandwidth: float, repeats: int,
             profile_too: bool, deadline: float = float("inf")) -> dict:
    t0 = time.perf_counter()
    engine = engine_for(path, device)
    res: dict = {"load_s": time.perf_counter() - t0, "weight_bytes": engine.model_runner.weight_bytes(),
                 "read_bytes": read_bytes(engine), "async_scheduling": engine.async_scheduling}
    measure(guarded(engine, res), prompts, ("single", "uniform", "mixed"), repeats, res, deadline)
    n = prompts.w["single"][1]
    kv = engine.stats()["kv_bytes_per_token"] * (len(prompts.w["single"][0]) + n / 2)  # KV read per token, on average
    for name in ("greedy", "sampled"):
        single = res[f"single_{name}"]
        single["mbu"] = (res["read_bytes"] + kv) * single["decode_tok_s"] / bandwidth
    res["profile"] = profile_section(engine, bandwidth, PROFILES if profile_too else PROFILES[:1])
    del engine
    free(device)
    return res


PROFILES = (("decode_b1_greedy", 1, "greedy"), ("decode_b1_sampled", 1, "sampled"), ("decode_b64_greedy", 64, "greedy"),
            ("decode_b64_sampled", 64, "sampled"))


def profile_section(engine: LLMEngine, bandwidth: float, profiles: tuple = PROFILES) -> dict:
    """bench/gpu_profile.py's decode profiles and the GEMV table at the model's shapes."""
    out: dict = {}
    steps = 20 if engine.device.type == "cuda" else 4
    for key, batch, name in profiles:
        try:
            out[key] = decode_profile(engine, min(batch, engine.config.max_num_seqs), PARAMS[name](400), steps)
        except Exception as exc:
            out[key] = {"error": f"{type(exc).__name__}: {exc}"}
            log.error("profile %s failed:\n%s", key, traceback.format_exc(limit=8))
    try:
        decodes = min(48, engine.config.max_num_seqs - 1)
        out["mixed"] = mixed_profile(engine, decodes, 256 if engine.device.type == "cuda" else 32, PARAMS["greedy"](400))
    except Exception as exc:
        out["mixed"] = {"error": f"{type(exc).__name__}: {exc}"}
        log.error("mixed step profile failed:\n%s", traceback.format_exc(limit=8))
    try:
        out["gemv"] = gemv_table(engine.model_runner.model, bandwidth, engine.device, engine.dtype,
                                 reps=30 if engine.device.type == "cuda" else 2)
    except Exception as exc:
        out["gemv_error"] = f"{type(exc).__name__}: {exc}"
    return out


# -- speculative decoding ------------------------------------------------------------------------


def run_speculative(path: Path, device: torch.device, quick: bool) -> dict:
    """n-gram (k = 4) vs the same engine with speculation off per request; batch 1, greedy."""
    engine = engine_for(path, device, speculative="ngram:k=4")
    rng = random.Random(7)
    span = [rng.randrange(300, 1000) for _ in range(32)]
    n, runs = (16, 1) if quick else (256, 3)

    def once(tag: str, on: bool) -> tuple[float, list[int]]:
        params = SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True, speculative=on)
        out = engine.generate([[100 + len(tag)] + span * 8], params)[0]  # a fresh first token: no prefix hits
        return decode_rate(out.metrics.token_times), out.outputs[0].token_ids

    once("w", True), once("ww", False)  # warm-up: graphs, kernels
    before = engine.spec_decode_stats()
    plain, spec, equal = [], [], True
    for i in range(runs):
        p_rate, p_tokens = once("p" * (i + 3), False)
        s_rate, s_tokens = once("s" * (i + 3), True)
        plain.append(p_rate)
        spec.append(s_rate)
        equal &= p_tokens == s_tokens
    after = engine.spec_decode_stats()
    drafts = after["num_draft_tokens"] - before["num_draft_tokens"]
    accepted = after["num_accepted_tokens"] - before["num_accepted_tokens"]
    verifies = after["num_drafts"] - before["num_drafts"]
    res = {"plain_tok_s": statistics.median(plain), "spec_tok_s": statistics.median(spec), "greedy_equal": equal,
           "draft_tokens": drafts, "accepted_tokens": accepted, "verify_steps": verifies,
           "acceptance_rate": accepted / drafts if drafts else None,
           "mean_accepted_length": 1 + accepted / verifies if verifies else None}
    res["ratio"] = res["spec_tok_s"] / res["plain_tok_s"]
    del engine
    free(device)
    return res


def guarded_pass(run: Callable[[Path, torch.device, bool], dict], path: Path, device: torch.device,
                 quick: bool) -> dict:
    """An extra pass (`run_speculative`, `run_fused`), its failure caught and reported (the rest of the bench
    stands), with the seconds it took."""
    t0 = time.perf_counter()
    try:
        res = run(path, device, quick)
    except Exception as exc:  # noqa: BLE001 -- a guarded extra pass
        res = {"error": f"{type(exc).__name__}: {exc}"}
        log.error("%s failed:\n%s", run.__name__, traceback.format_exc(limit=8))
    res["elapsed_s"] = time.perf_counter() - t0
    return res


def run_unified(path: Path, device: torch.device, quick: bool) -> dict:
    """The mixed workload (greedy) three ways on one engine, the runs alternating, medians: the per-chunk attention
    path, the unified attention kernel eager, and the unified kernel with the steps that hold prefill chunks
    replayed from CUDA graphs (`MixedGraphs`; CUDA only). On the CPU "unified" runs the kernel's torch reference,
    so the ratio there only shows the pass works."""
    engine = engine_for(path, device, unified_attention=True)
    runner = engine.model_runner
    inputs, graphs, prompts, runs = runner.inputs, runner.mixed_graphs, Prompts(workloads(quick)), 1 if quick else 3
    modes = {"per_chunk": (False, None), "unified": (True, None)} | ({"unified_graphs": (True, graphs)} if graphs else {})

    def once(mode: str, tag: str, tokens: int | None = None) -> dict:
        inputs.unified, runner.mixed_graphs = modes[mode]
        return ours_batch(engine, *prompts.fresh("mixed", tokens), "greedy", tag)

    for mode in modes:
        once(mode, f"w-{mode}", 8)  # warm-up: every prefill shape, each path
    got: dict[str, list[dict]] = {mode: [] for mode in modes}
    for i in range(runs):
        for mode in (list(modes) if i % 2 == 0 else list(reversed(modes))):
            got[mode].append(once(mode, f"{mode}-{i}"))
    res = {mode: {k: statistics.median(r[k] for r in rows) for k in ("tok_s", "ttft_ms_p50", "tpot_ms_p50")}
           for mode, rows in got.items()}
    res["ratio"] = res["unified"]["tok_s"] / res["per_chunk"]["tok_s"]
    if graphs:
        res["graphs_ratio"] = res["unified_graphs"]["tok_s"] / res["per_chunk"]["tok_s"]
        res["mixed_graph_replays"] = graphs.num_replays
    del engine
    free(device)
    return res


def run_fused(path: Path, device: torch.device, quick: bool) -> dict:
    """Batch-1 greedy decode with `fused_decode` on vs off (two engines, the runs alternating); on the CPU both
    engines run the module path (the fused kernels are CUDA's), so the ratio there only shows the pass works."""
    rng = random.Random(11)
    prompt = [rng.randrange(300, 1000) for _ in range(32)]
    n, runs = (16, 1) if quick else (256, 3)
    engines = {on: engine_for(path, device, fused_decode=on) for on in (False, True)}

    def once(on: bool, tag: str) -> tuple[float, list[int]]:
        out = engines[on].generate([[100 + len(tag)] + prompt], greedy(n))[0]  # a fresh first token: no prefix hits
        return decode_rate(out.metrics.token_times), out.outputs[0].token_ids

    once(False, "w"), once(True, "w")  # warm-up: graphs, kernels
    rates: dict[bool, list[float]] = {False: [], True: []}
    tokens: dict[bool, list[int]] = {}
    for i in range(runs):
        for on in ((False, True) if i % 2 == 0 else (True, False)):
            rate, tokens[on] = once(on, "r" * (i + 2))
            rates[on].append(rate)
    res = {"unfused_tok_s": statistics.median(rates[False]), "fused_tok_s": statistics.median(rates[True]),
           "fused_active": engines[True].model_runner.model.model.fused_decode,
           "same_tokens": sum(a == b for a, b in zip(tokens[False], tokens[True])) / max(1, len(tokens[False]))}
    res["ratio"] = res["fused_tok_s"] / res["unfused_tok_s"]
    del engines
    free(device)
    return res


# -- transformers -------------------------------------------------------------------------------


def hf_model(path: Path, device: torch.device):
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(path)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype).eval()
    model.generation_config.eos_token_id = None  # ignore_eos: every row runs max_new_tokens
    return model


@torch.inference_mode()
def hf_batch(model, prompts: list[list[int]], outputs: list[int], name: str, tag: str = "") -> dict:
    device = model.device
    width, pad = max(len(p) for p in prompts), 0
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
    kwargs = HF_OLLAMA if name == "sampled" else {"do_sample": False}
    sync(device)
    t0 = time.perf_counter()
    out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max(outputs), pad_token_id=pad, **kwargs)
    sync(device)
    wall = time.perf_counter() - t0
    assert out.shape[1] == width + max(outputs), out.shape
    return {"tok_s": sum(outputs) / wall, "wall_s": wall}


def run_hf(path: Path, prompts: Prompts, device: torch.device, repeats: int, deadline: float = float("inf")) -> dict:
    model = hf_model(path, device)
    res: dict = {}
    measure(lambda p, o, name, tag: hf_batch(model, p, o, name, tag), prompts, ("uniform", "mixed"), repeats, res,
            deadline)
    del model
    free(device)
    return res


def free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


# -- the plan -------------------------------------------------------------------------------------


def hf_fits(shape: str, left: float, spent: dict) -> bool:
    """Whether transformers on `shape` (warm-up and one repeat) should end inside the `left` seconds: for 7B,
    about 1.6x what it took on 0.5B."""
    if shape != "7b" or "0.5b" not in spent:
        return True
    return 1.6 * spent["0.5b"]["hf_first"] < left


# -- report ---------------------------------------------------------------------------------------


def report(res: dict) -> None:
    print(f"\n{res['device']}; copy bandwidth {res['copy_bandwidth'] / 1e12:.2f} TB/s (measured)")
    head = f"{'model':6s} {'workload':16s} {'ours tok/s':>11s} {'hf tok/s':>10s} {'ours/hf':>8s} " \
           f"{'TTFT ms':>8s} {'TPOT ms':>8s} {'graph steps':>12s} {'runs':>5s}"
    print(head)
    for shape, r in res["models"].items():
        ours, hf = r.get("ours", {}), r.get("hf", {})
        for key in ("single_greedy", "single_sampled", "uniform_greedy", "uniform_sampled", "mixed_greedy",
                    "mixed_sampled"):
            if key not in ours:
                continue
            o = ours[key]
            rate = o["decode_tok_s"] if key.startswith("single") else o["tok_s"]
            h = hf.get(key, {}).get("tok_s")
            ratio = f"{rate / h:7.2f}x" if h else f"{'-':>8s}"
            runs = f"{len(o['runs_tok_s'])}/{len(hf[key]['runs_tok_s']) if key in hf else 0}"
            print(f"{shape:6s} {key:16s} {rate:11.1f} {h or float('nan'):10.1f} {ratio} {o['ttft_ms_p50']:8.1f} "
                  f"{o['tpot_ms_p50']:8.2f} {o['graph_steps']:5.0f}/{o['steps']:<6.0f} {runs:>5s}")
        if "single_greedy" not in ours:
            continue
        for name in ("greedy", "sampled"):
            print(f"{shape:6s} batch 1 {name}: MBU {ours[f'single_{name}']['mbu']:.1%} of the measured copy bandwidth "
                  f"({ours['read_bytes'] / 1e9:.2f} GB of weights read per token)")
        for load in ("single", "uniform", "mixed"):
            g, s = ours[f"{load}_greedy"], ours[f"{load}_sampled"]
            key = "decode_tok_s" if load == "single" else "tok_s"
            print(f"{shape:6s} {load}: sampled / greedy {s[key] / g[key]:.2f}x (goal >= 0.90)")
        for key, what in (("unified_failed", "the unified attention kernel"), ("ahead_failed", "scheduling ahead")):
            if key in ours:
                print(f"{shape:6s} {what} FAILED, measured without it: {ours[key].splitlines()[-1]}")
    for shape, r in res["models"].items():
        if "profile" in r.get("ours", {}):
            report_profile(shape, r["ours"]["profile"])
    for shape, r in res["models"].items():
        for side in ("ours", "hf"):
            if f"{side}_error" in r:
                print(f"{shape:6s} {side} FAILED: {r[side + '_error'].splitlines()[-1]}")
        if "hf_skipped" in r:
            print(f"{shape:6s} transformers skipped: {r['hf_skipped']}")
    if "unified" in res:
        uni = res["unified"]
        if "error" in uni:
            print(f"unified attention pass failed after {uni['elapsed_s']:.0f} s: {uni['error']}")
        else:
            print(f"{res['unified_shape']:6s} unified attention, mixed greedy ({uni['elapsed_s']:.0f} s):")
            for mode in ("per_chunk", "unified", "unified_graphs"):
                if mode in uni:
                    m = uni[mode]
                    print(f"{'':8s}{mode:15s} {m['tok_s']:9.0f} tok/s = {m['tok_s'] / uni['per_chunk']['tok_s']:.2f}x; "
                          f"TTFT p50 {m['ttft_ms_p50']:7.1f} ms, TPOT p50 {m['tpot_ms_p50']:.2f} ms")
    if "fused" in res:
        fused = res["fused"]
        if "error" in fused:
            print(f"fused decode pass failed after {fused['elapsed_s']:.0f} s: {fused['error']}")
        else:
            print(f"{res['fused_shape']:6s} fused decode (kernels/fused_gemv.py), batch 1 greedy: {fused['fused_tok_s']:.1f} "
                  f"vs {fused['unfused_tok_s']:.1f} tok/s unfused = {fused['ratio']:.2f}x; active "
                  f"{fused['fused_active']}, same tokens {fused['same_tokens']:.0%} ({fused['elapsed_s']:.0f} s)")
    if "speculative" in res:
        spec = res["speculative"]
        if "error" in spec:
            print(f"speculative pass failed after {spec['elapsed_s']:.0f} s: {spec['error']}")
            return
        acc = spec["acceptance_rate"]
        print(f"{res['speculative_shape']:6s} speculative ngram:k=4, batch 1 greedy: {spec['spec_tok_s']:.1f} vs "
              f"{spec['plain_tok_s']:.1f} tok/s off = {spec['ratio']:.2f}x; acceptance "
              f"{'-' if acc is None else f'{acc:.0%}'}, mean accepted length {spec['mean_accepted_length'] or 0:.2f}, "
              f"tokens equal {spec['greedy_equal']} ({spec['elapsed_s']:.0f} s)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a tiny model on the CPU, seconds (the test suite's run)")
    parser.add_argument("--models", default="0.5b,7b", help="comma-separated: 0.5b, 7b")
    parser.add_argument("--budget-s", type=float, default=170.0, help="cut repeats, then transformers on 7B, past this")
    parser.add_argument("--repeats", type=int, default=2, help="timed runs of each workload per side (median)")
    parser.add_argument("--no-profile", action="store_true", help="skip the decode profiles and the GEMV table")
    parser.add_argument("--speculative", action="store_true", help="add the n-gram speculative decoding pass")
    parser.add_argument("--fused", action="store_true", help="add the pass of batch-1 decode with fused_decode on vs off")
    parser.add_argument("--unified", action="store_true",
                        help="add the pass of the mixed workload with the unified attention kernel on vs off")
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    started = time.perf_counter()
    device = torch.device("cpu" if args.quick or not torch.cuda.is_available() else "cuda")
    shapes = ["tiny"] if args.quick or device.type == "cpu" else args.models.split(",")
    w = workloads(args.quick or device.type == "cpu")
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    res: dict = {"device": name, "torch": torch.__version__, "copy_bandwidth": copy_bandwidth(device, args.quick),
                 "models": {}}
    spent: dict = {}
    end = started + args.budget_s
    with tempfile.TemporaryDirectory(prefix="native-gpu-") as tmp:
        for i, shape in enumerate(shapes):
            path = model_dir(shape, Path(tmp))
            # the first of two shapes may take up to 45 % of the budget; the last, what is left
            deadline = end if i == len(shapes) - 1 else started + 0.45 * args.budget_s
            hf_need = 1.6 * spent["0.5b"]["hf_first"] if shape == "7b" and "0.5b" in spent else 0.0
            entry = res["models"][shape] = {}
            t0 = time.perf_counter()
            side(entry, "ours", lambda: run_ours(path, Prompts(w), device, res["copy_bandwidth"], args.repeats,
                                                 not args.no_profile and shape in ("0.5b", "tiny"), deadline - hf_need))
            t1 = time.perf_counter()
            if hf_fits(shape, end - t1, spent):
                side(entry, "hf", lambda: run_hf(path, Prompts(w), device, args.repeats, deadline))
            else:
                entry["hf_skipped"] = f"not enough time left ({end - t1:.0f} s)"
            hf = entry.get("hf", {})
            runs = len(hf.get("uniform_greedy", {}).get("runs_tok_s", [0])) or 1
            spent[shape] = {"ours": t1 - t0, "hf_first": (time.perf_counter() - t1) * 2 / (1 + runs)}
            res["elapsed_s"] = time.perf_counter() - started
            print(f"  {shape}: done at {res['elapsed_s']:.0f} s", flush=True)
            dump(res, args.json)  # after each model: a run cut short still leaves what it measured
        if args.unified:
            res["unified_shape"] = shapes[0]
            res["unified"] = guarded_pass(run_unified, model_dir(shapes[0], Path(tmp)), device, args.quick)
            dump(res, args.json)
        if args.fused:
            res["fused_shape"] = shapes[0]
            res["fused"] = guarded_pass(run_fused, model_dir(shapes[0], Path(tmp)), device, args.quick)
            dump(res, args.json)
        if args.speculative:
            res["speculative_shape"] = shapes[0]
            res["speculative"] = guarded_pass(run_speculative, model_dir(shapes[0], Path(tmp)), device, args.quick)
            dump(res, args.json)
    report(res)


def side(entry: dict, key: str, fn: Callable[[], dict]) -> None:
    """One side of one model; a failure is recorded and the run goes on."""
    try:
        entry[key] = fn()
    except Exception:
        entry[f"{key}_error"] = traceback.format_exc(limit=10)
        log.error("%s failed:\n%s", key, entry[f"{key}_error"])
        free(torch.device("cuda" if torch.cuda.is_available() else "cpu"))


def dump(res: dict, path: Path | None) -> None:
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
