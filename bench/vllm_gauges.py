"""How late the gateway's per-backend gauges follow a real vLLM during a load change.

    flock /tmp/infer-heavy.lock .venv/bin/python bench/vllm_gauges.py --url http://127.0.0.1:8000 --model bench

``infer serve`` (a subprocess, ``type: vllm`` backend ``v``) in front of a running vLLM (``--url``), or of
one started here (``fakes/vllm_cpu.py``). A burst of ``--burst`` streamed completions (``--output-tokens``
each, ``ignore_eos``) is sent through the gateway; meanwhile one poller reads vLLM's ``/metrics``
(``vllm:num_requests_running`` + ``waiting``) and the gateway's ``/metrics``
(``infer_num_requests_running`` + ``waiting{backend="v"}``) every ``--every`` seconds. For each level
vLLM's total reaches (every change, up and down), the lag is the time from vLLM showing it to the
gateway first showing it (or more, going up; or less, going down). Reported: median and max lag, and
how many levels the gateway showed before vLLM did (requests it had sent that vLLM did not count yet).
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fakes import vllm_cpu  # noqa: E402


def vllm_load(url: str) -> float:
    page = httpx.get(url + "/metrics", timeout=5).text
    return sum(float(v) for v in re.findall(r"^vllm:num_requests_(?:running|waiting)\{[^}]*\} (\S+)$", page, re.M))


def gateway_load(url: str) -> float:
    page = httpx.get(url + "/metrics", timeout=5).text
    return sum(float(v) for v in re.findall(r'^infer_num_requests_(?:running|waiting)\{backend="v"\} (\S+)$', page, re.M))


def start_gateway(tmp: Path, url: str, model: str) -> tuple[subprocess.Popen, str]:
    config = tmp / "backends.yaml"
    config.write_text(yaml.safe_dump({"backends": [{"name": "v", "type": "vllm", "base_url": url, "model": model}]}))
    port = vllm_cpu.free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("INFER_", "OLLAMA_"))}
    env.update(INFER_HOME=str(tmp / "home"), INFER_MODELS=str(tmp / "models"), INFER_HOST=f"127.0.0.1:{port}",
               INFER_CONFIG=str(config))
    process = subprocess.Popen([sys.executable, "-m", "cli", "serve", "--log-level", "warning"], cwd=ROOT, env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    gateway = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(gateway + "/ready", timeout=1).status_code == 200:
                return process, gateway
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    process.kill()
    raise SystemExit("infer serve did not start")


def burst(gateway: str, count: int, output_tokens: int) -> None:
    body = {"model": "v", "prompt": "count: " + "one two three " * 20, "max_tokens": output_tokens, "stream": True,
            "ignore_eos": True, "temperature": 0}

    def one() -> None:
        with httpx.stream("POST", gateway + "/v1/completions", json=body, timeout=600) as reply:
            for _ in reply.iter_bytes():
                pass

    threads = [threading.Thread(target=one) for _ in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def sample(vllm: str, gateway: str, every: float, stop: threading.Event) -> list[tuple[float, float, float]]:
    """(time, vLLM's load, the gateway's) every ``every`` s; a read that fails or takes over 5 s is no sample."""
    out = []
    while not stop.is_set():
        t = time.monotonic()
        try:
            out.append((t, vllm_load(vllm), gateway_load(gateway)))
        except httpx.HTTPError as exc:
            print(f"no sample at {t:.1f}: {type(exc).__name__}", flush=True)
        time.sleep(max(0.0, every - (time.monotonic() - t)))
    return out


def median_step(samples: list[tuple[float, float, float]]) -> float:
    steps = [b[0] - a[0] for a, b in zip(samples, samples[1:])]
    return statistics.median(steps) if steps else 0.0


def lags(samples: list[tuple[float, float, float]]) -> tuple[list[float], int]:
    """Per change of vLLM's total: seconds until the gateway reached it; and the changes it showed first."""
    out, ahead = [], 0
    for i in range(1, len(samples)):
        t, level, before = samples[i][0], samples[i][1], samples[i - 1][1]
        if level == before:
            continue
        up = level > before
        reached = [s for s in samples[:i + 1] if (s[2] >= level if up else s[2] <= level)
                   and s[0] >= samples[i - 1][0]]
        if reached and reached[0][0] <= t:
            ahead += 1
            out.append(0.0)
            continue
        later = next((s[0] for s in samples[i:] if (s[2] >= level if up else s[2] <= level)), None)
        if later is not None:
            out.append(later - t)
    return out, ahead


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", help="a running vLLM (else one is started here)")
    parser.add_argument("--model", default="bench")
    parser.add_argument("--burst", type=int, default=8)
    parser.add_argument("--output-tokens", type=int, default=400)
    parser.add_argument("--every", type=float, default=0.1)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    work = ROOT / ".bench" / "vllm-gauges"
    work.mkdir(parents=True, exist_ok=True)
    started = None
    if args.url is None:
        from registry.modelbuilder import PRESETS, build_hf

        model_dir = build_hf(work / "tiny-qwen2-vllm", PRESETS["tiny-qwen2-vllm"], dtype="bf16", seed=0)
        started = vllm_cpu.start_vllm(model_dir, work / "run", name=args.model)
    url = args.url or started.url
    all_lags, ahead = [], 0
    with tempfile.TemporaryDirectory(dir=work) as tmp:
        process, gateway = start_gateway(Path(tmp), url, args.model)
        try:
            for i in range(args.rounds):
                stop = threading.Event()
                found: list = []
                poller = threading.Thread(target=lambda: found.extend(sample(url, gateway, args.every, stop)))
                poller.start()
                time.sleep(1.0)
                burst(gateway, args.burst, args.output_tokens)
                time.sleep(1.0)
                stop.set()
                poller.join()
                got, first = lags(found)
                all_lags += got
                ahead += first
                print(f"round {i + 1}: {len(got)} level changes, median lag {statistics.median(got) if got else 0:.3f} s, "
                      f"max {max(got) if got else 0:.3f} s, {first} shown by the gateway first; {len(found)} samples, "
                      f"median step {median_step(found):.3f} s", flush=True)
        finally:
            process.terminate()
            process.wait(timeout=30)
            if started is not None:
                started.stop()
    if all_lags:
        p90 = statistics.quantiles(all_lags, n=10, method="inclusive")[-1] if len(all_lags) > 1 else all_lags[0]
        print(f"\n{len(all_lags)} changes of vLLM's running+waiting over {args.rounds} bursts of {args.burst}: "
              f"gateway lag median {statistics.median(all_lags):.3f} s, p90 {p90:.3f} s, max {max(all_lags):.3f} s "
              f"(sampled every {args.every:g} s); {ahead} shown by the gateway first")


if __name__ == "__main__":
    main()
