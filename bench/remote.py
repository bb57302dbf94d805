"""What `infer serve` costs in front of a remote server: llama-cpp-python's server direct vs through the gateway.

Builds one GGUF with the project's model builder (default: Qwen2-0.5B shapes, q8_0, random weights,
as bench/gateway.py; cached under .bench/), then starts on free loopback ports:

- llama-cpp-python's OpenAI-compatible server (``python -m llama_cpp.server``, one process,
  ``--n_threads`` = cores, alias ``bench``);
- ``infer serve --config`` (``INFER_CONFIG``) with one backend per ``--types`` entry (default
  ``llamacpp``; ``vllm``/``openai`` also speak to this server) named ``bench-<type>``, plus
  ``bench-fake`` (type openai) in front of the fake server below.

The same client code (httpx, streaming ``POST /v1/completions``, ``stream: true``,
``stream_options.include_usage``, ``temperature: 0``, ``max_tokens`` N; ``min_tokens`` N for
llama-cpp-python's server called directly and ``ignore_eos`` for the gateway, whose llama.cpp adapter sends it
on as ``min_tokens`` — it holds back the EOS token only, so a random-weight model can still end early at
another end-of-generation token, and E2EL is compared over the longest output length both sides reached)
then ALTERNATES direct and
gateway requests, the order rotated every run; only the base URL and the model name differ. Each
request's prompt starts with its own number, so llama.cpp's KV prefix reuse cannot skip a prefill.

Client-side metrics, as /work/shared/reference/metrics-and-cost.md §1 (vLLM's ``bench serve``):
st = clock just before the POST; a token chunk = an SSE event with non-empty ``choices``;
TTFT = first token chunk - st; ITL = gaps between consecutive token chunks; E2EL = last token
chunk - st; TPOT = (E2EL - TTFT) / (output_len - 1). output_len = ``max_tokens`` when the stream ended
for ``length`` (exact on both sides), else the number of token chunks with a null finish_reason. §1
reads ``usage.completion_tokens`` first, but llama-cpp-python reports none and the gateway then
estimates it from the text, so usage is not used. The gateway drops llama.cpp's empty-text chunks
(partial UTF-8), so its chunk count, hence its pooled ITL, can be a little shorter.
Reported: medians over ``--runs`` of TTFT, TPOT, E2EL and ITL (pooled), ITL p90; overhead =
gateway - direct (TTFT in ms, also as the median of per-run differences, "paired"; TPOT in ms per
token) and the gateway/direct ratios.

No-model baseline (``--fake-runs``, 0 to skip): a fake OpenAI SSE server in this process
(Starlette + uvicorn thread) streams ``--fake-chunks`` chunks with no delay, measured direct vs
through ``bench-fake``: this isolates the gateway's own per-chunk cost (TPOT difference, in us) and
TTFT cost from llama.cpp's noise. On a 2-core machine the gateway, llama.cpp's threads and this
client share the cores, so the llama.cpp overhead includes the gateway's CPU stolen from decode;
the fake server's thread shares this process (and its GIL) with the client on both sides.

The model is bench/gateway.py's default (~195 prompt tokens: ~1.2 s prefill, ~25 ms/token on 2
idle cores), so the default run takes about a minute. The machine may be shared: the script first
waits (``--wait-idle`` s at most) for other processes to go quiet and reports what they used.

    .venv/bin/python bench/remote.py [--preset qwen2-0.5b] [--dtype q8_0] [--runs 5] [--max-tokens 64]
                                     [--types llamacpp,vllm,openai] [--fake-runs 30] [--wait-idle 120] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from itertools import pairwise
from pathlib import Path

import httpx
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from noise import wait_idle  # noqa: E402  (bench/ is the script's directory)
from registry.modelbuilder import PRESETS, build_gguf
from fakes.live import free_port, server_env

WORK = ROOT / ".bench" / "remote"
PROMPT = ("Write a short story about a lighthouse keeper who finds a message in a bottle. "
          "Describe the weather, the sea and the keeper's thoughts in detail. ")


def gguf_for(preset: str, dtype: str) -> Path:
    name = f"{preset}-{dtype}.gguf"
    for cached in (WORK / name, ROOT / ".bench" / "gateway" / name):  # same builder and seed as bench/gateway.py
        if cached.exists():
            return cached
    print(f"building {name} (random weights) ...", flush=True)
    return build_gguf(WORK / name, PRESETS[preset], dtype=dtype, seed=0)


def spawn(procs: list, args: list[str], log: Path, ready_url: str, env: dict | None = None) -> None:
    """Start ``args`` (registered in ``procs`` before anything can interrupt) and wait for ``ready_url``."""
    with open(log, "wb") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=env)
    procs.append(proc)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{args[2]} exited early:\n{log.read_text(errors='replace')}")
        try:
            if httpx.get(ready_url, timeout=1.0).status_code == 200:
                return
        except httpx.TransportError:
            time.sleep(0.1)
    raise RuntimeError(f"{args[2]} did not start:\n{log.read_text(errors='replace')}")


def stop_all(procs: list) -> None:
    for proc in reversed(procs):
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class FakeServer:
    """``POST /v1/completions`` streams ``max_tokens`` chunks back to back, then usage and ``[DONE]``."""

    def __init__(self, port: int):
        import uvicorn
        from starlette.applications import Starlette
        from starlette.responses import JSONResponse, StreamingResponse
        from starlette.routing import Route

        async def models(request):
            return JSONResponse({"object": "list", "data": [{"id": "fake", "object": "model"}]})

        async def completions(request):
            body = await request.json()
            n = int(body.get("max_tokens") or 16)
            head = {"id": "cmpl-fake", "object": "text_completion", "created": int(time.time()), "model": "fake"}

            async def events():
                for i in range(n):
                    choice = {"index": 0, "text": " tok", "logprobs": None,
                              "finish_reason": "length" if i == n - 1 else None}
                    yield f"data: {json.dumps({**head, 'choices': [choice]})}\n\n"
                usage = {"prompt_tokens": 8, "completion_tokens": n, "total_tokens": n + 8}
                yield f"data: {json.dumps({**head, 'choices': [], 'usage': usage})}\n\n"
                yield "data: [DONE]\n\n"
            return StreamingResponse(events(), media_type="text/event-stream")

        app = Starlette(routes=[Route("/v1/models", models), Route("/v1/completions", completions, methods=["POST"])])
        self.url = f"http://127.0.0.1:{port}"
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                                                    lifespan="off"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started and time.monotonic() < deadline:
            time.sleep(0.02)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=5)


def stream(client: httpx.Client, base_url: str, model: str, prompt: str, max_tokens: int) -> dict:
    """One streamed completion, the same code for every side; times in seconds."""
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0, "stream": True,
            "stream_options": {"include_usage": True}, "ignore_eos": True, "min_tokens": max_tokens}
    times, unfinished, finish = [], 0, None
    st = time.perf_counter()
    with client.stream("POST", base_url + "/v1/completions", json=body) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data:"):
                continue  # blank separators, comments, event/id lines
            data = line[5:].strip()
            if data == "[DONE]":
                break
            now = time.perf_counter()
            event = json.loads(data)
            if event.get("choices"):
                times.append(now)
                finish = event["choices"][0].get("finish_reason")
                unfinished += finish is None
    n = max_tokens if finish == "length" else unfinished
    ttft, e2el = times[0] - st, times[-1] - st
    return {"ttft": ttft, "e2el": e2el, "tpot": (e2el - ttft) / (n - 1) if n > 1 else float("nan"),
            "itl": [b - a for a, b in pairwise(times)], "output_len": n, "chunks": len(times)}


def summarize(rows: list[dict]) -> dict:
    """Medians; TPOT over the requests with more than one output token only (vLLM's rule: it is undefined
    for one token, and a random-weight model can stop at its first)."""
    itl = sorted(x for r in rows for x in r["itl"])
    tpots = [r["tpot"] for r in rows if r["output_len"] > 1]
    return {"ttft_ms": statistics.median(r["ttft"] for r in rows) * 1e3,
            "tpot_ms": statistics.median(tpots) * 1e3 if tpots else float("nan"),
            "e2el_ms": statistics.median(r["e2el"] for r in rows) * 1e3,
            "itl_median_ms": statistics.median(itl) * 1e3 if itl else float("nan"),
            "itl_p90_ms": statistics.quantiles(itl, n=10, method="inclusive")[8] * 1e3 if len(itl) > 1 else float("nan"),
            "output_len": statistics.median(r["output_len"] for r in rows), "runs": len(rows)}


def alternate(client, sides: dict[str, tuple[str, str]], prompt_for, max_tokens: int, runs: int, label: str) -> dict:
    """``sides``: name -> (base_url, model). One request per side per run, the order rotated each run."""
    rows: dict[str, list[dict]] = {name: [] for name in sides}
    names = list(sides)
    for name, (url, model) in sides.items():  # warm-up: connections, model load, first-request paths
        stream(client, url, model, prompt_for(f"warm {name}"), 4)
    for i in range(runs):
        order = names[i % len(names):] + names[:i % len(names)]
        for j, name in enumerate(order):
            tag = f"{i * len(names) + j:04d}"[::-1]  # the digit that changes first: only "Run " is shared
            rows[name].append(stream(client, *sides[name], prompt_for(tag), max_tokens))
        if label == "llama.cpp" or i + 1 == runs:
            print(f"{label} run {i + 1}: " + "  ".join(
                f"{k} ttft {v[-1]['ttft'] * 1e3:7.2f} ms tpot {v[-1]['tpot'] * 1e3:7.3f} ms ({v[-1]['output_len']} tok)"
                for k, v in rows.items()), flush=True)
    return {name: {"summary": summarize(r), "requests": r} for name, r in rows.items()}


def compare(results: dict) -> dict:
    d = results["direct"]["summary"]
    out = {}
    for name, res in results.items():
        if name == "direct":
            continue
        g = res["summary"]
        paired_ttft = statistics.median(x["ttft"] - y["ttft"] for x, y in
                                        zip(res["requests"], results["direct"]["requests"]))
        out[name] = {"ttft_overhead_ms": g["ttft_ms"] - d["ttft_ms"], "ttft_overhead_paired_ms": paired_ttft * 1e3,
                     "tpot_overhead_ms": g["tpot_ms"] - d["tpot_ms"], "ttft_ratio": g["ttft_ms"] / d["ttft_ms"],
                     "tpot_ratio": g["tpot_ms"] / d["tpot_ms"],
                     "e2el_ratio": _e2el_ratio(res["requests"], results["direct"]["requests"])}
    return out


def _e2el_ratio(side: list[dict], direct: list[dict]) -> float | None:
    """E2EL over direct's, from the requests of the longest output length both sides reached (a model that
    may end early — EOS other than the one ``min_tokens`` holds back — makes the other lengths incomparable)."""
    common = {r["output_len"] for r in side} & {r["output_len"] for r in direct}
    if not common:
        return None
    n = max(common)
    return statistics.median(r["e2el"] for r in side if r["output_len"] == n) / \
        statistics.median(r["e2el"] for r in direct if r["output_len"] == n)


def table(title: str, results: dict, overhead: dict, per_chunk_us: bool) -> None:
    print(f"\n{title}")
    print(f"  {'side':16s} {'TTFT ms':>9s} {'TPOT ms':>9s} {'ITL p50':>9s} {'ITL p90':>9s} {'E2EL ms':>9s} {'tokens':>7s}")
    for name, res in results.items():
        s = res["summary"]
        print(f"  {name:16s} {s['ttft_ms']:9.2f} {s['tpot_ms']:9.3f} {s['itl_median_ms']:9.3f} {s['itl_p90_ms']:9.3f} "
              f"{s['e2el_ms']:9.1f} {s['output_len']:7.0f}")
    for name, o in overhead.items():
        tpot = f"{o['tpot_overhead_ms'] * 1e3:+8.1f} us/chunk" if per_chunk_us else f"{o['tpot_overhead_ms']:+7.3f} ms/token"
        print(f"  {name} - direct: TTFT {o['ttft_overhead_ms']:+7.2f} ms (paired {o['ttft_overhead_paired_ms']:+7.2f}), "
              f"TPOT {tpot}; ratios TTFT {o['ttft_ratio']:.3f}, TPOT {o['tpot_ratio']:.3f}, "
              f"E2EL {'n/a (no output length in common)' if o['e2el_ratio'] is None else format(o['e2el_ratio'], '.3f')}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="qwen2-0.5b", choices=sorted(PRESETS))
    parser.add_argument("--dtype", default="q8_0", choices=["f32", "f16", "q8_0"])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--ctx", type=int, default=1024)
    parser.add_argument("--prompt-repeat", type=int, default=3, help="prompt length: repeats of a 27-word text")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="llama.cpp threads (default: cores)")
    parser.add_argument("--types", default="llamacpp", help="comma-separated backend types in front of llama.cpp")
    parser.add_argument("--fake-runs", type=int, default=30, help="no-model baseline runs (0: skip)")
    parser.add_argument("--fake-chunks", type=int, default=256)
    parser.add_argument("--wait-idle", type=float, default=120, help="wait up to this many s for a quiet machine")
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args()
    WORK.mkdir(parents=True, exist_ok=True)
    gguf = gguf_for(args.preset, args.dtype)
    types = [t.strip() for t in args.types.split(",") if t.strip()]
    text = PROMPT * args.prompt_repeat
    busy = wait_idle(args.wait_idle) if args.wait_idle > 0 else float("nan")
    procs: list[subprocess.Popen] = []
    fake = None
    report: dict = {"config": {**{k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
                               "gguf": str(gguf), "others_busy_cores_at_start": busy}}
    try:
        llama_url = f"http://127.0.0.1:{free_port()}"  # as tests/remote/conftest.py, with our ctx and threads
        spawn(procs, [sys.executable, "-m", "llama_cpp.server", "--model", str(gguf), "--model_alias", "bench",
                      "--host", "127.0.0.1", "--port", llama_url.rsplit(":", 1)[1], "--n_ctx", str(args.ctx),
                      "--verbose", "false", "--n_threads", str(args.threads),
                      "--n_threads_batch", str(args.threads)],
              WORK / "llama-server.log", llama_url + "/v1/models")
        fake = FakeServer(free_port()) if args.fake_runs > 0 else None
        backends = [{"name": f"bench-{t}", "type": t, "base_url": llama_url + "/v1", "model": "bench"} for t in types]
        if fake:
            backends.append({"name": "bench-fake", "type": "openai", "base_url": fake.url + "/v1", "model": "fake"})
        config = WORK / "backends.yaml"
        config.write_text(yaml.safe_dump({"backends": backends}, sort_keys=False))
        (WORK / "models").mkdir(exist_ok=True)
        port = free_port()  # as fakes/live.py's start_server
        gateway_url = f"http://127.0.0.1:{port}"
        env = server_env(WORK / "server-home", WORK / "models", port, INFER_CONFIG=str(config))
        spawn(procs, [sys.executable, "-m", "cli", "serve", "--log-level", "warning"], WORK / "server.log",
              gateway_url + "/", env)
        with httpx.Client(timeout=600) as client:
            sides = {"direct": (llama_url, "bench"), **{f"gateway-{t}": (gateway_url, f"bench-{t}") for t in types}}
            llm = alternate(client, sides, lambda tag: f"Run {tag}. {text}", args.max_tokens, args.runs, "llama.cpp")
            report["llamacpp"] = {"results": llm, "overhead": compare(llm)}
            if fake:
                sides = {"direct": (fake.url, "fake"), "gateway-openai": (gateway_url, "bench-fake")}
                base = alternate(client, sides, lambda tag: f"Run {tag}.", args.fake_chunks, args.fake_runs, "fake")
                report["fake"] = {"results": base, "overhead": compare(base)}
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        raise SystemExit(130) from None
    finally:
        stop_all(procs)
        if fake:
            fake.stop()
    table(f"llama.cpp server ({args.preset} {args.dtype}, {args.threads} threads, {args.max_tokens} max tokens, {args.runs} "
          f"runs; medians, ITL pooled; others used {busy:.2f} cores at start):", *report["llamacpp"].values(), False)
    if "fake" in report:
        table(f"no-model baseline (fake SSE server, {args.fake_chunks} chunks, no delay, {args.fake_runs} runs):",
              *report["fake"].values(), True)
    if args.json:
        for part in ("llamacpp", "fake"):  # keep per-request figures, drop the raw ITL lists
            for res in report.get(part, {}).get("results", {}).values():
                res["requests"] = [{k: v for k, v in r.items() if k != "itl"} for r in res["requests"]]
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2))
        print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()
