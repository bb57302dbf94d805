"""Does ``infer estimate --device cpu --calibrate`` predict another model's decode speed within 25 %?

End to end on this machine, with real measurements:
1. builds two random-weight Q8_0 GGUF models of different sizes with the project's model builder
   (cached under .bench/estimate/),
2. serves each with llama-cpp-python's server (``python -m llama_cpp.server``, llama.cpp inside) and runs
   ``infer bench --profile synchronous`` against it, alternating A, B, A, B, ... (``--rounds``),
3. calibrates ``infer estimate --device cpu`` on model A's bench (the round with A's median TPOT) and
   predicts model B's decode tok/s per user, and the other way round,
4. prints predicted vs measured (median over rounds of 1000 / median TPOT) and the error.

    .venv/bin/python bench/estimate_check.py [--rounds 3] [--json .bench/estimate/results.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fakes.live import free_port  # noqa: E402
from noise import wait_idle  # noqa: E402  (bench/ is the script's directory)
from registry.modelbuilder import ModelSpec, build_gguf  # noqa: E402

WORK = ROOT / ".bench" / "estimate"
# Two Qwen2-shaped decoders, ~0.17 B and ~0.55 B parameters, same 32k vocabulary.
MODELS = {
    "small": ModelSpec(name="est-small", vocab_size=32_000, hidden_size=1024, intermediate_size=2816, num_layers=12,
                       num_heads=16, num_kv_heads=4, context_length=2048),
    "large": ModelSpec(name="est-large", vocab_size=32_000, hidden_size=1536, intermediate_size=4096, num_layers=20,
                       num_heads=12, num_kv_heads=4, context_length=2048),
}
INPUT_TOKENS, OUTPUT_TOKENS = 16, 32
CLI = [sys.executable, "-m", "cli"]


def build(name: str) -> Path:
    path = WORK / f"{name}-q8_0.gguf"
    if not path.exists():
        WORK.mkdir(parents=True, exist_ok=True)
        print(f"building {path.name} ...", flush=True)
        build_gguf(path, MODELS[name], dtype="q8_0", seed=0)
    return path



def serve(model: Path, port: int) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-m", "llama_cpp.server", "--model", str(model), "--host", "127.0.0.1",
                             "--port", str(port), "--n_ctx", "512", "--n_threads", "2", "--n_threads_batch", "2",
                             "--model_alias", model.stem, "--verbose", "False"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while time.time() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            time.sleep(0.5)
    proc.kill()
    raise SystemExit(f"llama_cpp.server did not start for {model}")


def bench(model: Path, out: Path, requests: int) -> dict:
    port = free_port()
    proc = serve(model, port)
    try:
        subprocess.run([*CLI, "bench", "--url", f"http://127.0.0.1:{port}", "--model", model.stem,
                        "--api", "openai-completions", "--profile", "synchronous", "--num-requests", str(requests),
                        "--warmup", "1", "--input-tokens", str(INPUT_TOKENS), "--output-tokens", str(OUTPUT_TOKENS),
                        "--tokenizer", str(model), "--label", f"model_path={model}", "--out", str(out)],
                       check=True, stdout=subprocess.DEVNULL, cwd=ROOT)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    return json.loads((out / "summary.json").read_text())["load_points"][0]


def predict(target: Path, calibration_dir: Path, *, reprobe: bool) -> dict:
    """The CPU probe's own figures cancel out of a calibrated prediction; re-probing keeps the printed MFU/MBU sane."""
    out = subprocess.run([*CLI, "estimate", str(target), "--device", "cpu", "--calibrate", str(calibration_dir),
                          "--input-tokens", str(INPUT_TOKENS), "--output-tokens", str(OUTPUT_TOKENS), "--json",
                          *(["--reprobe"] if reprobe else [])],
                         check=True, capture_output=True, text=True, cwd=ROOT)
    return json.loads(out.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=4)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--wait", type=float, default=120, help="Seconds to wait for a quiet machine before each bench.")
    args = parser.parse_args()
    paths = {name: build(name) for name in MODELS}
    runs: dict[str, list[tuple[float, Path]]] = {name: [] for name in MODELS}
    for round_ in range(args.rounds):
        for name, path in paths.items():  # alternate both sides in every round
            out = WORK / f"bench-{name}-{round_}"
            busy = wait_idle(args.wait)
            point = bench(path, out, args.requests)
            runs[name].append((point["median_tpot_ms"], out))
            print(f"round {round_ + 1}: {name:5s} median TPOT {point['median_tpot_ms']:.2f} ms "
                  f"({1000 / point['median_tpot_ms']:.1f} tok/s per user), TTFT {point['median_ttft_ms']:.1f} ms "
                  f"[others used {busy:.2f} cores just before]",
                  flush=True)
    measured = {name: 1000 / statistics.median(t for t, _ in r) for name, r in runs.items()}
    results = []
    for source, target in (("small", "large"), ("large", "small")):
        ranked = sorted(runs[source])
        calibration = ranked[len(ranked) // 2][1]  # the round with the source's median TPOT
        if not results:
            wait_idle(args.wait)
        estimate = predict(paths[target], calibration, reprobe=not results)
        predicted = estimate["decode_tok_s_per_user"]
        error = predicted / measured[target] - 1
        eff = estimate["efficiency"]
        results.append({"calibrated_on": source, "predicted_model": target, "predicted_tok_s": predicted,
                        "measured_tok_s": measured[target], "error": error, "mfu": eff["mfu"], "mbu": eff["mbu"],
                        "binds": estimate["binds"], "calibration_dir": str(calibration)})
        print(f"calibrated on {source} (MBU {eff['mbu']:.3f}, MFU {eff['mfu']:.3f}): {target} predicted "
              f"{predicted:.1f} tok/s, measured {measured[target]:.1f} tok/s, error {100 * error:+.1f} % "
              f"({'within' if abs(error) <= 0.25 else 'OUTSIDE'} the 25 % goal; {estimate['binds']} binds)")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"measured_tok_s": measured, "results": results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
