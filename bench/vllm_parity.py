"""Bench truth: ``infer bench`` and vLLM's own benchmark (``vllm.benchmarks.serve``) on the same vLLM
server and the same workload, interleaved over several rounds.

    flock /tmp/infer-heavy.lock .venv/bin/python bench/vllm_parity.py --rounds 5

The server: a running vLLM (``--url``, ``--model``, ``--tokenizer-dir``), else one started here
(``fakes/vllm_cpu.py``, ``make vllm-cpu``) serving ``--model-dir`` (default: the tiny random
``tiny-qwen2-vllm`` model, built under .bench/vllm-parity/). The workload, on both sides:
``/v1/completions`` streamed, ``--num-requests`` requests of ``--input-tokens`` random prompt tokens
and exactly ``--output-tokens`` output tokens (``ignore_eos``), ``--concurrency`` at a time, no warm-up
request on either side (vLLM's warm-up sends the first measured prompt, which its prefix cache then
serves to the measured request; ``infer bench`` warms up on other prompts; the server is warm anyway),
greedy on both sides (``infer bench`` sends ``temperature: 0``; vLLM's benchmark sends no temperature
unless given ``--temperature``, and the server's default, 1, samples other tokens: on the random model
greedy decoding repeats tokens that vLLM's detokenizer holds back, which costs its API server more). vLLM's side is its ``random`` dataset called through ``add_cli_args`` + ``main`` with the
vLLM venv's python (the ``vllm bench`` console script does not run from the ``vllm_cpu`` distribution);
``infer bench`` runs with ``--profile concurrent:N``. Each round runs both, the order alternating.

Reported: per metric (TTFT, TPOT, ITL, E2EL: mean, median, p99; request and output throughput; the
input and output tokens the server counted) the median over rounds on each side and the ratio
infer/vLLM; the goal is every mean and median within 3 %, every p99 within 10 %. ``--noise`` runs
vLLM's benchmark a second time each round and adds its ratio to the first (vLLM/vLLM): the spread the
same tool shows on the same server, against which a residual gap is judged. The order of the sides
rotates each round. ``--json PATH`` writes every round's figures.

On a machine of few cores the benchmark clients compete with the server they time: ``--server-cpus 0
--client-cpus 1`` binds the started vLLM (its processes and OpenMP threads) to core 0 and each client, in
turn, to core 1, so neither tool's own CPU cost lands in the other side's latencies or the server's.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fakes import vllm_cpu  # noqa: E402

METRICS = [f"{stat}_{name}_ms" for name in ("ttft", "tpot", "itl", "e2el") for stat in ("mean", "median", "p99")]
THROUGHPUT = ["request_throughput", "output_throughput", "total_input_tokens", "total_output_tokens"]
VLLM_BENCH = ("import argparse, sys; from vllm.benchmarks.serve import add_cli_args, main; "
              "p = argparse.ArgumentParser(); add_cli_args(p); main(p.parse_args(sys.argv[1:]))")


def run_infer(args, url: str, model: str, tokenizer: Path, out: Path, seed: int) -> dict:
    command = [sys.executable, "-m", "cli", "bench", "--url", url, "--model", model, "--api", "openai-completions",
               "--profile", f"concurrent:{args.concurrency}", "--num-requests", str(args.num_requests),
               "--input-tokens", str(args.input_tokens), "--output-tokens", str(args.output_tokens),
               "--tokenizer", str(tokenizer), "--extra-body", json.dumps({"ignore_eos": True}),
               "--warmup", "0", "--out", str(out), "--seed", str(seed)]
    _run(command, ROOT, args.client_cpus)
    point = json.loads((out / "summary.json").read_text())["load_points"][0]
    return {k: point[k] for k in METRICS + THROUGHPUT}


def run_vllm(args, url: str, model: str, tokenizer_dir: Path, out: Path, seed: int) -> dict:
    command = [str(vllm_cpu.VLLM_PYTHON), "-c", VLLM_BENCH, "--backend", "vllm", "--base-url", url,
               "--endpoint", "/v1/completions", "--model", model, "--tokenizer", str(tokenizer_dir),
               "--dataset-name", "random", "--random-input-len", str(args.input_tokens),
               "--random-output-len", str(args.output_tokens), "--num-prompts", str(args.num_requests),
               "--max-concurrency", str(args.concurrency), "--ignore-eos", "--temperature", "0", "--num-warmups", "0",
               "--seed", str(seed), "--disable-tqdm", "--percentile-metrics", "ttft,tpot,itl,e2el",
               "--metric-percentiles", "99", "--save-result", "--result-dir", str(out), "--result-filename", "r.json"]
    out.mkdir(parents=True, exist_ok=True)
    _run(command, out, args.client_cpus)
    result = json.loads((out / "r.json").read_text())
    return {k: result[k] for k in METRICS + THROUGHPUT}


def _run(command: list[str], cwd: Path, cpus: list[int] | None = None) -> None:
    pin = (lambda: os.sched_setaffinity(0, cpus)) if cpus else None
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, preexec_fn=pin)
    if done.returncode:
        sys.exit(f"{' '.join(command[:4])} ... failed ({done.returncode}):\n{done.stdout[-2000:]}{done.stderr[-3000:]}")


def report(rounds: list[dict], side: str = "infer") -> list[tuple[str, float, float, float]]:
    """Per metric: the median over rounds of ``side`` and of vLLM's benchmark, and their ratio."""
    rows = []
    for key in METRICS + THROUGHPUT:
        ours = statistics.median(r[side][key] for r in rounds)
        theirs = statistics.median(r["vllm"][key] for r in rounds)
        rows.append((key, ours, theirs, ours / theirs if theirs else float("nan")))
    return rows


def verdict(key: str, ratio: float) -> str:
    if key in THROUGHPUT:
        return ""
    limit = 0.10 if key.startswith("p99") else 0.03
    return "ok" if abs(ratio - 1) <= limit else f"off by {abs(ratio - 1) * 100:.1f} % (goal {limit * 100:.0f} %)"


def server(args, work: Path):
    """(url, model, tokenizer file, tokenizer dir, the started server or None)."""
    if args.url:
        tokenizer_dir = Path(args.tokenizer_dir).resolve()
        return args.url, args.model, tokenizer_dir / "tokenizer.json", tokenizer_dir, None
    model_dir = Path(args.model_dir).resolve() if args.model_dir else work / "tiny-qwen2-vllm"
    if not args.model_dir and not (model_dir / "config.json").exists():
        from registry.modelbuilder import PRESETS, build_hf

        build_hf(model_dir, PRESETS["tiny-qwen2-vllm"], dtype="bf16", seed=0)
    started = vllm_cpu.start_vllm(model_dir, work / "run", name=args.model, cpus=args.server_cpus)
    return started.url, args.model, model_dir / "tokenizer.json", model_dir, started


def cores(text: str) -> list[int]:
    """``0`` or ``0,2`` or ``0-3``: the core numbers, in order."""
    found: set[int] = set()
    for part in text.split(","):
        low, _, high = part.partition("-")
        found.update(range(int(low), int(high or low) + 1))
    return sorted(found)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--num-requests", type=int, default=40)
    parser.add_argument("--input-tokens", type=int, default=128)
    parser.add_argument("--output-tokens", type=int, default=64)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--url", help="a running vLLM (else one is started here)")
    parser.add_argument("--model", default="bench", help="the served model name")
    parser.add_argument("--tokenizer-dir", help="with --url: the model's directory (tokenizer.json)")
    parser.add_argument("--model-dir", help="a Hugging Face model directory to serve (default: tiny-qwen2-vllm)")
    parser.add_argument("--noise", action="store_true", help="run vLLM's benchmark twice a round: vLLM/vLLM too")
    parser.add_argument("--json", type=Path, help="write every round's figures here")
    parser.add_argument("--server-cpus", type=cores, help="bind the started vLLM to these cores (e.g. 0)")
    parser.add_argument("--client-cpus", type=cores, help="bind each benchmark client to these cores (e.g. 1)")
    args = parser.parse_args()
    work = ROOT / ".bench" / "vllm-parity"
    work.mkdir(parents=True, exist_ok=True)
    url, model, tokenizer, tokenizer_dir, started = server(args, work)
    rounds = []
    try:
        for i in range(args.rounds):
            with tempfile.TemporaryDirectory(dir=work) as tmp:
                sides = {"infer": lambda: run_infer(args, url, model, tokenizer, Path(tmp) / "infer", i),
                         "vllm": lambda: run_vllm(args, url, model, tokenizer_dir, Path(tmp) / "vllm", i),
                         "vllm again": lambda: run_vllm(args, url, model, tokenizer_dir, Path(tmp) / "again", i + 1000)}
                names = list(sides)[:3 if args.noise else 2]
                order = names[i % len(names):] + names[:i % len(names)]
                rounds.append({side: sides[side]() for side in order})
            print(f"round {i + 1}/{args.rounds} ({' then '.join(order)}): TTFT median "
                  f"{rounds[-1]['infer']['median_ttft_ms']:.1f} vs {rounds[-1]['vllm']['median_ttft_ms']:.1f} ms",
                  flush=True)
    finally:
        if started is not None:
            started.stop()
    rows = report(rounds)
    noise = {key: ratio for key, _, _, ratio in report(rounds, "vllm again")} if args.noise else {}
    print(f"\nload average at the end: {os.getloadavg()[0]:.1f} (1 min)")
    print(f"{args.rounds} rounds, {args.num_requests} requests of {args.input_tokens} in / {args.output_tokens} out, "
          f"concurrency {args.concurrency}, medians over rounds")
    print(f"{'metric':22} {'infer bench':>12} {'vllm bench':>12} {'ratio':>7}" + (f" {'vllm/vllm':>9}" if noise else ""))
    for key, ours, theirs, ratio in rows:
        spread = f" {noise[key]:9.3f}" if noise else ""
        print(f"{key:22} {ours:12.2f} {theirs:12.2f} {ratio:7.3f}{spread}  {verdict(key, ratio)}")
    if args.json:
        args.json.write_text(json.dumps({"args": vars(args) | {"json": str(args.json)}, "rounds": rounds,
                                         "medians": {k: {"infer": o, "vllm": t, "ratio": r, "vllm/vllm": noise.get(k)}
                                                     for k, o, t, r in rows}},
                                        indent=2) + "\n")


if __name__ == "__main__":
    main()
