"""Prefill/decode disaggregation on this CPU (issue 43): 1P+1D vs two co-located runners vs ``strategy: slo``
with selective P/D, and the route's orchestration cost.

**Workers.** Two ``infer serve`` processes with the native engine serving SmolLM2-135M-Instruct (Q4_1, the
GGUF ``registry.realmodels.fetch_smollm2`` caches), each pinned to one core (``taskset -c``) with one
thread; their engines move KV blocks over ``/dev/shm`` (``native_engine/kv_transfer.py``).

**The front** is the route itself, in this process: ``routing.build.build_routes`` over the real remote
adapters (type ``vllm``), exactly what ``infer serve --config`` runs per request, so the figures hold
the route's own work and nothing of a third HTTP hop.

**Workload** (seeded token ids, other ids for each side and run: the workers' prefix caches would
otherwise serve a side the prompts of the one before): 8 decoding streams (32-token prompts, 200 greedy
tokens with ``ignore_eos``; a finished stream is replaced at once) while a ``--long-prompt``-token prompt
(2,000 by default; 16 output tokens) arrives every ``--every`` s (2 by default), for ``--seconds``.

**Sides**: ``colocated`` (backends [w0, w1], least_inflight), ``pd`` (prefill [w0], decode [w1],
``when: always``), ``selective`` (backends [w0, w1] with ``strategy: slo``, prefill [w0], decode [w1],
``when: slo``, threshold 512). Each side runs ``--runs`` times, rotated; medians of the runs. Between two
sides the bench waits for both workers' queues to empty (their ``/metrics`` gauges), and each run's line
says where its requests ran (``placed``: ``stream@w0>w1`` was prefilled on w0 and decoded on w1).

**Figures**: P99 inter-token latency of the streams; mean TTFT of the long prompts; SLO goodput = requests
(streams and long prompts) that finished within ``--ttft-ms`` to the first token and ``--tpot-ms`` per
token after it, per second. Goals (issue 43): pd vs colocated P99 ITL <= 0.3x, mean TTFT <= 1.5x, goodput
>= 1.2x; selective goodput >= both.

**Orchestration cost** (fake P/D servers from ``fakes/pd.py`` that answer at once, in a process of their
own): per
request, the TTFT through the route minus the TTFT of the same two legs sent by hand with the same
adapters (prefill POST, then the decode stream), alternated, medians. Goal <= 1 ms.

The machine is shared: run it under ``flock /tmp/infer-heavy.lock``; figures are noisy.

    flock /tmp/infer-heavy.lock .venv/bin/python bench/disagg.py [--seconds 30] [--runs 3] [--overhead-only]
        [--bf16-prefill]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from core.base import Chunk, Done, GenerationRequest  # noqa: E402
from adapters.remote.base import RemoteSettings  # noqa: E402
from adapters.remote.registry import create_remote  # noqa: E402
from fakes.live import free_port  # noqa: E402
from gateway.backends_config import RouteEntry  # noqa: E402
from routing.build import build_routes  # noqa: E402

STREAMS, STREAM_PROMPT, STREAM_TOKENS = 8, 32, 200
LONG_PROMPT, LONG_TOKENS, LONG_EVERY_S = 2000, 16, 2.0
SIDES = {
    "colocated": {"backends": ["w0", "w1"], "strategy": "least_inflight"},
    "pd": {"prefill": {"protocol": "vllm", "backends": ["w0"]}, "decode": {"protocol": "vllm", "backends": ["w1"]},
           "disagg": {"when": "always"}, "strategy": "least_inflight"},
    "selective": {"backends": ["w0", "w1"], "strategy": "slo", "prefill": {"protocol": "vllm", "backends": ["w0"]},
                  "decode": {"protocol": "vllm", "backends": ["w1"]},
                  "disagg": {"when": "slo", "threshold_tokens": 512}},
}


@dataclass
class Outcome:
    kind: str  # "stream" | "long"
    start: float
    ttft: float | None = None
    times: list[float] = field(default_factory=list)
    end: float | None = None
    tokens: int = 0
    worker: str = ""  # "w1", or "w0>w1": prefilled on w0, decoded on w1


# -- workers ---------------------------------------------------------------------------------------------

def start_workers(tmp: Path, bf16_prefill: bool = False) -> list[tuple[str, subprocess.Popen]]:
    from registry.create import create_model
    from registry.modelfile import parse_modelfile
    from registry.names import parse_name
    from registry.realmodels import fetch_smollm2
    from registry.store import Store

    store = Store(tmp / "models")
    create_model(store, parse_name("smol", insecure=True),
                 parse_modelfile(f"FROM {fetch_smollm2()}\nPARAMETER num_ctx 4096\n"), tmp)
    workers = []
    for core in (0, 1):
        port = free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith(("INFER_", "OLLAMA_"))}
        env.update(INFER_HOME=str(tmp / f"home{core}"), INFER_MODELS=str(tmp / "models"),
                   INFER_HOST=f"127.0.0.1:{port}", INFER_ENGINE="native", OMP_NUM_THREADS="1")
        if bf16_prefill:  # both workers: P/D's exactness compares the same engine config on both sides
            env["INFER_NATIVE"] = json.dumps({"cpu_bf16_prefill": True})
        log = open(tmp / f"worker{core}.log", "wb")  # noqa: SIM115 (kept open for the process's life)
        proc = subprocess.Popen(["taskset", "-c", str(core % os.cpu_count()), sys.executable, "-m", "cli", "serve",
                                 "--log-level", "warning"], env=env, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
        workers.append((f"http://127.0.0.1:{port}", proc))
    for url, proc in workers:
        _wait(url, proc)
        httpx.post(url + "/v1/completions", json={"model": "smol", "prompt": [1, 2, 3], "max_tokens": 2},
                   timeout=120).raise_for_status()  # loads the model
    return workers


def _wait(url: str, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"worker at {url} exited")
        try:
            if httpx.get(url + "/v1/models", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            time.sleep(0.3)
    raise RuntimeError(f"worker at {url} did not start")



def route_for(side: str, urls: dict[str, str], model: str, slo: dict):
    remotes = {name: create_remote(RemoteSettings(name=name, type="vllm", base_url=url, model=model))
               for name, url in urls.items()}
    entry = RouteEntry.model_validate({"name": side, "slo": slo, **SIDES[side]})
    return build_routes([entry], remotes, lambda name: None)[side], remotes


# -- load ------------------------------------------------------------------------------------------------

async def one(route, prompt: list[int], max_tokens: int, kind: str, outcomes: list[Outcome]) -> None:
    out = Outcome(kind, time.perf_counter())
    outcomes.append(out)
    request = GenerationRequest(model=route.name, prompt="", prompt_tokens=prompt,
                                options={"num_predict": max_tokens, "temperature": 0.0, "ignore_eos": True})
    async for event in route.stream(request):
        if isinstance(event, Chunk) and event.text:
            now = time.perf_counter()
            out.ttft = out.ttft if out.ttft is not None else now - out.start
            out.times.append(now)
        elif isinstance(event, Done):
            out.tokens, out.end = event.usage.output_tokens, time.perf_counter()
            out.worker = f"{event.prefill_by}>{event.served_by}" if event.prefill_by else str(event.served_by)


async def run_side(route, seconds: float, seed: int, long_prompt: int, every_s: float) -> list[Outcome]:
    rng = random.Random(seed)
    ids = lambda n: [rng.randrange(100, 40000) for _ in range(n)]  # noqa: E731
    outcomes: list[Outcome] = []
    end = time.perf_counter() + seconds

    async def stream_slot() -> None:
        while time.perf_counter() < end:
            await one(route, ids(STREAM_PROMPT), STREAM_TOKENS, "stream", outcomes)

    async def arrivals() -> None:
        tasks = []
        while time.perf_counter() < end:
            tasks.append(asyncio.create_task(one(route, ids(long_prompt), LONG_TOKENS, "long", outcomes)))
            await asyncio.sleep(every_s)
        await asyncio.gather(*tasks)

    await asyncio.gather(*(stream_slot() for _ in range(STREAMS)), arrivals())
    return outcomes


def figures(outcomes: list[Outcome], seconds: float, slo: dict) -> dict:
    gaps = sorted(b - a for o in outcomes if o.kind == "stream" for a, b in zip(o.times, o.times[1:]))
    longs = [o.ttft for o in outcomes if o.kind == "long" and o.ttft is not None]
    good = sum(1 for o in outcomes if _good(o, slo))
    placed = Counter(f"{o.kind}@{o.worker}" for o in outcomes if o.end is not None)
    return {"placed": dict(sorted(placed.items())),
            "p99_itl_ms": 1000 * gaps[int(0.99 * (len(gaps) - 1))] if gaps else None,
            "mean_ttft_long_ms": 1000 * statistics.mean(longs) if longs else None,
            "goodput_rps": good / seconds, "requests": len(outcomes), "good": good}


def _good(o: Outcome, slo: dict) -> bool:
    if o.end is None or o.ttft is None or o.ttft * 1000 > slo["ttft_ms"]:
        return False
    tpot = (o.times[-1] - o.times[0]) / (len(o.times) - 1) if len(o.times) > 1 else 0.0
    return tpot * 1000 <= slo["tpot_ms"]


# -- orchestration cost -----------------------------------------------------------------------------------

FAKES = """
import json, sys
from fakes.pd import start_pd_server
p, d = start_pd_server("vllm", "prefill"), start_pd_server("vllm", "decode")
print(json.dumps([p.url, d.url, p.behaviour.models[0]]), flush=True)
sys.stdin.read()
"""


async def overhead(n: int) -> dict:
    """The fakes run in a process of their own, as real servers do: work the route does while a leg is
    on the wire overlaps the server's, as it would in production, instead of taking its GIL."""
    fakes = subprocess.Popen([sys.executable, "-c", FAKES], stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=ROOT,
                             text=True)
    try:
        p_url, d_url, model = json.loads(fakes.stdout.readline())
        route, remotes = route_for("pd", {"w0": p_url, "w1": d_url}, model, {"ttft_ms": 10_000, "tpot_ms": 10_000})
        prompt = " ".join(f"w{i}" for i in range(64))
        routed, direct = [], []
        for i in range(n):
            for side in ((routed, direct) if i % 2 else (direct, routed)):
                side.append(await (_through_route(route, prompt) if side is routed else _by_hand(remotes, prompt)))
        for backend in remotes.values():
            await backend.aclose()
        r, h = statistics.median(routed[5:]), statistics.median(direct[5:])
        return {"route_ttft_ms": r * 1000, "by_hand_ttft_ms": h * 1000, "overhead_ms": (r - h) * 1000}
    finally:
        fakes.stdin.close()
        fakes.wait(timeout=30)


async def _through_route(route, prompt: str) -> float:
    request = GenerationRequest(model=route.name, prompt=prompt, options={"num_predict": 4})
    async for event in route.stream(request):
        if isinstance(event, Chunk):
            return time.perf_counter() - request.arrival
    raise RuntimeError("no token")


async def _by_hand(remotes: dict, prompt: str) -> float:
    request = GenerationRequest(model="x", prompt=prompt, options={"num_predict": 4}, request_id=os.urandom(8).hex())
    prefill, decode = remotes["w0"], remotes["w1"]
    path, body = prefill.body(replace(request, model=prefill.settings.model), stream=False)
    body.update(max_tokens=1, kv_transfer_params={"do_remote_decode": True, "do_remote_prefill": False,
                                                  "remote_engine_id": None, "remote_block_ids": None,
                                                  "remote_host": None, "remote_port": None})
    reply = await prefill.post_json(path, body, request.request_id)
    leg = replace(request, model=decode.settings.model, disagg_fields={"kv_transfer_params": reply["kv_transfer_params"]})
    events = decode.stream(leg)
    try:
        async for event in events:
            if isinstance(event, Chunk):
                return time.perf_counter() - request.arrival
    finally:
        await events.aclose()
    raise RuntimeError("no token")


# -- main ---------------------------------------------------------------------------------------------------

def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--long-prompt", type=int, default=LONG_PROMPT, help="tokens of the long prompts")
    parser.add_argument("--every", type=float, default=LONG_EVERY_S, help="seconds between long prompts")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--ttft-ms", type=float, default=5000.0)
    parser.add_argument("--tpot-ms", type=float, default=150.0)
    parser.add_argument("--overhead-requests", type=int, default=200)
    parser.add_argument("--overhead-only", action="store_true")
    parser.add_argument("--bf16-prefill", action="store_true",
                        help="both workers prefill in bf16 (INFER_NATIVE cpu_bf16_prefill: AMX where the CPU has it)")
    args = parser.parse_args()
    cost = asyncio.run(overhead(args.overhead_requests))
    print(f"orchestration: route TTFT {cost['route_ttft_ms']:.2f} ms, legs by hand {cost['by_hand_ttft_ms']:.2f} ms, "
          f"added {cost['overhead_ms']:.3f} ms (median of {args.overhead_requests} each)")
    if args.overhead_only:
        return
    slo = {"ttft_ms": args.ttft_ms, "tpot_ms": args.tpot_ms}
    with tempfile.TemporaryDirectory(prefix="infer-disagg-") as tmp:
        workers = start_workers(Path(tmp), args.bf16_prefill)
        try:
            results = asyncio.run(_sides(workers, args, slo))
        finally:
            for _, proc in workers:
                proc.terminate()
                proc.wait(timeout=15)
    _report(results)


async def _sides(workers, args, slo: dict) -> dict[str, list[dict]]:
    urls = {"w0": workers[0][0], "w1": workers[1][0]}
    results: dict[str, list[dict]] = {side: [] for side in SIDES}
    order = list(SIDES)
    for run in range(args.runs):
        for side in order[run % len(order):] + order[:run % len(order)]:
            route, remotes = route_for(side, urls, "smol", slo)
            seed = 1000 * run + list(SIDES).index(side)
            outcomes = await run_side(route, args.seconds, seed, args.long_prompt, args.every)
            results[side].append(figures(outcomes, args.seconds, slo))
            print(side, run, results[side][-1], getattr(route.disagg, "counts", None), flush=True)
            for backend in remotes.values():
                await backend.aclose()
            print(f"  workers drained in {await drain(list(urls.values())):.1f} s", flush=True)
    return results


async def drain(urls: list[str], limit_s: float = 180.0) -> float:
    """Wait until no worker runs or queues a request: a side that overloaded a worker (pd's prefill queue)
    would otherwise hand its backlog to the side after it."""
    start = time.monotonic()
    async with httpx.AsyncClient(timeout=5) as client:
        while time.monotonic() < start + limit_s:
            texts = [(await client.get(url + "/metrics")).text for url in urls]
            gauges = [float(line.rsplit(" ", 1)[1]) for text in texts for line in text.splitlines()
                      if line.startswith(("infer_num_requests_running", "infer_num_requests_waiting"))]
            if not gauges:
                raise RuntimeError("the workers' /metrics have no infer_num_requests_* gauges")
            if sum(gauges) == 0:
                break
            await asyncio.sleep(0.5)
    return time.monotonic() - start


def _report(results: dict[str, list[dict]]) -> None:
    med = {side: {k: statistics.median(r[k] for r in runs if r[k] is not None)
                  for k in ("p99_itl_ms", "mean_ttft_long_ms", "goodput_rps")} for side, runs in results.items()}
    for side, m in med.items():
        print(f"{side:10s} P99 ITL {m['p99_itl_ms']:8.1f} ms  mean TTFT (long prompts) {m['mean_ttft_long_ms']:8.1f} ms  "
              f"goodput {m['goodput_rps']:.3f} req/s")
    c, p, s = med["colocated"], med["pd"], med["selective"]
    ratio = lambda a, b: f"{a / b:.2f}x" if b else "n/a (0 below)"  # noqa: E731
    print(f"pd / colocated: P99 ITL {ratio(p['p99_itl_ms'], c['p99_itl_ms'])} (goal <= 0.3), mean TTFT "
          f"{ratio(p['mean_ttft_long_ms'], c['mean_ttft_long_ms'])} (goal <= 1.5), goodput "
          f"{ratio(p['goodput_rps'], c['goodput_rps'])} (goal >= 1.2)")
    print(f"selective goodput / best fixed: {ratio(s['goodput_rps'], max(p['goodput_rps'], c['goodput_rps']))} "
          "(goal >= 1.0)")


if __name__ == "__main__":
    main()
