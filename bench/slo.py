"""Routes with latency SLOs on a heterogeneous fleet: `infer serve` (slo, least_inflight, round_robin) vs LiteLLM.

The fleet: three queueing fake backends (``fakes/queueing.py``, each a subprocess speaking
vLLM's wire and ``/metrics``), a fast, a medium and a slow one (:data:`FLEET`). Each runs a simple
continuous-batching engine: FIFO queue, at most ``batch_limit`` sequences decoding, a prefill of P tokens
taking P / ``prefill_tok_s`` and blocking the batch, a decode step of n sequences lasting
``tpot(n) = tpot_base_ms + tpot_slope_ms * n``.

**Capacity.** With mean prompt P and mean output O, a backend kept at batch n serves
``R(n) = 1 / (P / prefill_tok_s + (O - 1) * tpot(n) / n)`` requests/s (prefill time per request plus its
share of the decode steps), and then its requests see ``TPOT(n) = tpot(n) / (1 - R(n) * P / prefill_tok_s)``
(decode steps stretched by the prefills between them). Its capacity is the largest ``R(n)``, n <= batch_limit,
with ``TPOT(n) <= slo.tpot_ms``; the fleet's capacity is the sum. So the slow backend counts only at the small
batch where it still meets the TPOT SLO, which is what makes the fleet's heterogeneity matter.

**Workload.** Per load x in ``--loads`` (0.5, 0.9, 1.2): Poisson arrivals at x * capacity for ``--seconds``,
prompts uniform in [``PROMPT_WORDS``], outputs (``max_tokens``) uniform in [``OUTPUT_TOKENS``], seeded; the same
requests for every side. Streamed chat completions with ``stream_options.include_usage``; a request still
unanswered ``--grace`` s after the last arrival is cancelled and counted as an error.

**Sides.** ``infer serve --config cfg.yaml`` with three routes over the same three backends, ``strategy: slo``
with ``shed: true``, ``least_inflight`` and ``round_robin`` (the SLO in each, for its live view), and
LiteLLM's proxy (``.bench/litellm-venv``, installed by ``bench/gateway_overhead.py``'s helper) with the three
backends in one model group and ``routing_strategy: latency-based-routing``. Sides run in a rotated order
per load; the fleet is drained (``/metrics`` running + waiting = 0) between runs. ``--sides ...,weighted`` adds
a reference: ``strategy: weighted`` with each backend's weight = its capacity below (a static split that knows
the fleet's model, which no adaptive strategy is told).

**Per run** (metrics-and-cost.md §1): TTFT = first content chunk, TPOT = (last - first) / (chunks - 1), e2e =
last content chunk; good = complete and every SLO part met; attainment = good / all requests (sheds and errors
are misses); admitted attainment = good / (all - shed); goodput = good / duration (first dispatch to last
answer, vLLM's ``dur_s``); p50/p99 TTFT and TPOT of completed requests; the route's prediction errors
(median |predicted - actual| / actual of TTFT, and of TPOT) from ``GET /infer/routes``.

Goals (issue 13): at 0.9x, slo attainment >= 0.95 and goodput >= 1.3x the best other side; at 1.2x, slo
admitted attainment >= 0.95 and goodput >= 1.5x LiteLLM's; prediction error median <= 20 %.

    .venv/bin/python bench/slo.py [--quick] [--seconds 60] [--loads 0.5,0.9,1.2] [--no-litellm] [--json OUT]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import shutil
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT))

import gateway_overhead as go  # noqa: E402  (bench/ is the script's directory)
from noise import wait_idle  # noqa: E402
from fakes.queueing import QueueModel  # noqa: E402

WORK = ROOT / ".bench" / "slo"
SERVED_MODEL = "sim-8b"
FLEET = {  # name: the backend's queueing model (times are a few x a real GPU's, so 2 shared cores keep up)
    "fast": QueueModel(batch_limit=8, prefill_tok_s=4000, tpot_base_ms=30, tpot_slope_ms=3, model=SERVED_MODEL),
    "medium": QueueModel(batch_limit=6, prefill_tok_s=2000, tpot_base_ms=50, tpot_slope_ms=5, model=SERVED_MODEL),
    "slow": QueueModel(batch_limit=8, prefill_tok_s=1000, tpot_base_ms=60, tpot_slope_ms=16, model=SERVED_MODEL),
}
SLO = {"ttft_ms": 1500, "tpot_ms": 100, "e2e_ms": 15000, "target": 0.95, "window_s": 600}
PROMPT_WORDS = (64, 768)
OUTPUT_TOKENS = (16, 96)
STRATEGIES = ("slo", "least_inflight", "round_robin", "weighted")  # weighted: only with --sides ...,weighted


# ---------------------------------------------------------------- model arithmetic


def mean_lengths() -> tuple[float, float]:
    """Mean prompt tokens (the rendered chat adds one: "user:") and mean output tokens."""
    return sum(PROMPT_WORDS) / 2 + 1, sum(OUTPUT_TOKENS) / 2


def backend_capacity(model: QueueModel, tpot_slo_ms: float) -> dict:
    """The largest R(n) whose TPOT(n) meets the SLO (module docstring), with that n."""
    prompt, output = mean_lengths()
    prefill = prompt / model.prefill_tok_s
    best = {"rps": 0.0, "batch": 0, "tpot_ms": None}
    for n in range(1, model.batch_limit + 1):
        rps = 1 / (prefill + (output - 1) * model.tpot(n) / n)
        tpot = model.tpot(n) / (1 - rps * prefill)
        if tpot * 1000 <= tpot_slo_ms and rps > best["rps"]:
            best = {"rps": rps, "batch": n, "tpot_ms": tpot * 1000}
    return best


def fleet_capacity() -> dict:
    per = {name: backend_capacity(model, SLO["tpot_ms"]) for name, model in FLEET.items()}
    return {"rps": sum(b["rps"] for b in per.values()), "backends": per}


@dataclass(frozen=True)
class Call:
    at: float          # seconds after the run's start
    words: int         # prompt = "abc " * words → words + 1 prompt tokens on the backend
    max_tokens: int


def workload(rate: float, seconds: float, seed: int) -> list[Call]:
    rng, calls, t = random.Random(seed), [], 0.0
    while True:
        t += rng.expovariate(rate)
        if t >= seconds:
            return calls
        calls.append(Call(t, rng.randint(*PROMPT_WORDS), rng.randint(*OUTPUT_TOKENS)))


# ---------------------------------------------------------------- processes


@dataclass
class Side:
    name: str
    url: str
    model: str
    headers: dict = field(default_factory=dict)
    route: str | None = None  # the infer route whose /infer/routes view to read
    pid: int | None = None    # the gateway process, for its CPU use


def start_fleet(procs: go.Processes, work: Path) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    urls = {}
    for name, model in FLEET.items():
        port = go.free_port()
        args = [sys.executable, "-m", "fakes.queueing", "--port", str(port)]
        for key in ("batch_limit", "prefill_tok_s", "tpot_base_ms", "tpot_slope_ms", "model"):
            args += ["--" + key.replace("_", "-"), str(getattr(model, key))]
        urls[name] = f"http://127.0.0.1:{port}"
        procs.start(args, work / f"backend-{name}.log", urls[name] + "/health", env, timeout=60)
    return urls


def infer_config(fleet: dict[str, str]) -> dict:
    backends = [{"name": name, "type": "vllm", "base_url": url, "model": SERVED_MODEL} for name, url in fleet.items()]
    weights = {name: round(b["rps"], 3) for name, b in fleet_capacity()["backends"].items()}
    routes = [{"name": f"chat-{s}", "backends": list(fleet), "strategy": s, "slo": dict(SLO),
               **({"shed": True} if s == "slo" else {}), **({"weights": weights} if s == "weighted" else {})}
              for s in STRATEGIES]
    return {"backends": backends, "routes": routes}


def start_infer(procs: go.Processes, work: Path, fleet: dict[str, str]) -> list[Side]:
    """The three infer sides, or a SystemExit-worthy RuntimeError naming why infer serve refused."""
    config = work / "infer-config.yaml"
    config.write_text(yaml.safe_dump(infer_config(fleet), sort_keys=False))
    home = work / "infer-home"
    (home / "models").mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("INFER_")}
    env.update(INFER_HOME=str(home), INFER_MODELS=str(home / "models"),
               INFER_DATABASE_URL=f"sqlite:///{home / 'usage.db'}")
    port = go.free_port()
    url = f"http://127.0.0.1:{port}"
    proc = procs.start([*go.infer_command(), "serve", "--config", str(config), "--host", f"127.0.0.1:{port}"],
                       work / "infer-serve.log", url + "/", env, timeout=120)
    return [Side(s, url, f"chat-{s}", route=f"chat-{s}", pid=proc.pid) for s in STRATEGIES]


def start_litellm(procs: go.Processes, work: Path, fleet: dict[str, str], exe: Path) -> Side:
    config = work / "litellm-config.yaml"
    entries = [{"model_name": "chat", "litellm_params": {"model": f"openai/{SERVED_MODEL}", "api_base": url + "/v1",
                                                         "api_key": "none"}, "model_info": {"id": name}}
               for name, url in fleet.items()]
    config.write_text(yaml.safe_dump({"model_list": entries,
                                      "router_settings": {"routing_strategy": "latency-based-routing"}}))
    port = go.free_port()
    env = {**os.environ, "LITELLM_MASTER_KEY": go.MASTER_KEY, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    proc = procs.start([str(exe), "--config", str(config), "--port", str(port), "--host", "127.0.0.1"],
                       work / "litellm-proxy.log", f"http://127.0.0.1:{port}/health/liveliness", env, timeout=300)
    return Side("litellm", f"http://127.0.0.1:{port}", "chat", {"Authorization": f"Bearer {go.MASTER_KEY}"},
                pid=proc.pid)


# ---------------------------------------------------------------- one request


@dataclass
class Result:
    kind: str                      # ok | shed | error
    sent: float
    done: float
    ttft: float | None = None
    tpot: float | None = None
    e2e: float | None = None
    chunks: int = 0
    status: int | None = None
    error: str | None = None
    retry_after: str | None = None

    def good(self) -> bool:
        return (self.kind == "ok" and self.ttft * 1000 <= SLO["ttft_ms"] and self.e2e * 1000 <= SLO["e2e_ms"]
                and (self.tpot is None or self.tpot * 1000 <= SLO["tpot_ms"]))


def chat_body(side: Side, call: Call) -> dict:
    # the first word is the request's own, so no two prompts share a prefix (issue 13's fleet has no prefix cache)
    words = [f"r{call.at:.9f}"] + ["abc"] * (call.words - 1)
    return {"model": side.model, "messages": [{"role": "user", "content": " ".join(words)}],
            "max_tokens": call.max_tokens, "stream": True, "stream_options": {"include_usage": True}}


async def send(client, side: Side, call: Call) -> Result:
    st = time.perf_counter()
    times: list[float] = []
    try:
        async with client.post(side.url + "/v1/chat/completions", json=chat_body(side, call),
                               headers=side.headers) as resp:
            if resp.status != 200:
                text = (await resp.read())[:200].decode(errors="replace")
                kind = "shed" if resp.status == 429 else "error"
                return Result(kind, st, time.perf_counter(), status=resp.status, error=text,
                              retry_after=resp.headers.get("retry-after"))
            async for line in resp.content:
                if line.startswith(b"data:") and b'"content":"' in line and b'"content":""' not in line:
                    times.append(time.perf_counter())
    except asyncio.CancelledError:
        return Result("error", st, time.perf_counter(), error="unanswered within the grace period")
    except Exception as exc:  # counted; the run goes on
        return Result("error", st, time.perf_counter(), error=repr(exc)[:200])
    if len(times) != call.max_tokens:
        return Result("error", st, time.perf_counter(), chunks=len(times),
                      error=f"{len(times)} of {call.max_tokens} content chunks")
    tpot = (times[-1] - times[0]) / (len(times) - 1) if len(times) > 1 else None
    return Result("ok", st, times[-1], times[0] - st, tpot, times[-1] - st, len(times), 200)


async def run_load(client, side: Side, calls: list[Call], grace: float) -> tuple[list[Result], float]:
    """Every call at its time; the results, and the duration (first dispatch to last answer)."""
    start = time.perf_counter()

    async def at(call: Call) -> Result:
        await asyncio.sleep(max(0.0, start + call.at - time.perf_counter()))
        return await send(client, side, call)

    tasks = [asyncio.create_task(at(c)) for c in calls]
    await asyncio.wait(tasks, timeout=(calls[-1].at if calls else 0) + grace)
    for task in tasks:
        task.cancel()
    results = [await t if not t.cancelled() else Result("error", start, time.perf_counter(), error="cancelled")
               for t in tasks]
    first = min((r.sent for r in results), default=start)
    return results, max((r.done for r in results), default=first) - first


# ---------------------------------------------------------------- summaries


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    data = sorted(values)
    return data[min(len(data) - 1, max(0, round(q * (len(data) - 1))))] * 1000


def summarize(results: list[Result], duration: float) -> dict:
    ok = [r for r in results if r.kind == "ok"]
    shed = sum(1 for r in results if r.kind == "shed")
    errors = [r for r in results if r.kind == "error"]
    good = sum(1 for r in results if r.good())
    admitted = len(results) - shed
    missed = {part: sum(1 for r in ok if getattr(r, part) is not None and getattr(r, part) * 1000 > SLO[f"{part}_ms"])
              for part in ("ttft", "tpot", "e2e")}
    return {
        "requests": len(results), "ok": len(ok), "good": good, "shed": shed, "errors": len(errors),
        "first_errors": sorted({r.error for r in errors if r.error})[:3],
        "attainment": good / len(results) if results else None,
        "admitted_attainment": good / admitted if admitted else None,
        "goodput_rps": good / duration if duration > 0 else 0.0, "duration_s": duration, "missed": missed,
        "retry_after": sorted({r.retry_after for r in results if r.retry_after})[:5],
        **{f"{m}_p{q}_ms": pct([getattr(r, m) for r in ok if getattr(r, m) is not None], q / 100)
           for m in ("ttft", "tpot") for q in (50, 99)},
    }


async def route_view(client, side: Side) -> dict | None:
    """The route's entry in ``GET /infer/routes`` (None for LiteLLM or when unreadable)."""
    if side.route is None:
        return None
    try:
        async with client.get(side.url + "/infer/routes") as resp:
            routes = (await resp.json())["routes"]
    except Exception:  # a view we cannot read is reported as missing, not as a failed run
        return None
    return next((r for r in routes if r.get("name") == side.route), None)


async def served(client, fleet: dict[str, str]) -> dict[str, float]:
    """Requests each backend has finished so far (``vllm:request_success_total``)."""
    out = {}
    for name, url in fleet.items():
        async with client.get(url + "/metrics") as resp:
            text = await resp.text()
        out[name] = sum(float(v) for v in re.findall(r"^vllm:request_success_total\{[^}]*\} ([0-9.]+)$", text, re.M))
    return out


async def drain(client, fleet: dict[str, str], limit: float = 120.0) -> float:
    """Wait until every backend's /metrics shows nothing running or waiting; seconds waited."""
    st = time.perf_counter()
    pattern = re.compile(r"^vllm:num_requests_(running|waiting)\{[^}]*\} ([0-9.]+)$", re.M)
    while time.perf_counter() - st < limit:
        busy = 0.0
        for url in fleet.values():
            async with client.get(url + "/metrics") as resp:
                busy += sum(float(v) for _, v in pattern.findall(await resp.text()))
        if busy == 0:
            break
        await asyncio.sleep(0.5)
    return time.perf_counter() - st


async def bench(args, sides: list[Side], fleet: dict[str, str], capacity: float, fleet_pids: list[int]) -> list[dict]:
    runs = []
    async with go.make_client(1024) as client:
        if args.warmup > 0:
            calls = workload(0.5 * capacity, args.warmup, args.seed + 99)
            for side in sides:
                print(f"warm-up: {side.name}, {len(calls)} requests at 0.5x ...", flush=True)
                await run_load(client, side, calls, args.grace)
                await drain(client, fleet)
        for i, load in enumerate(args.loads):
            calls = workload(load * capacity, args.seconds, args.seed + i)
            for side in sides[i % len(sides):] + sides[:i % len(sides)]:
                print(f"load {load:g}x ({load * capacity:.2f} req/s, {len(calls)} requests): {side.name} ...",
                      flush=True)
                before, noise, cpu0 = await served(client, fleet), go.Noise([side.pid, *fleet_pids]), go.cpu_seconds(side.pid)
                noise.start()
                results, duration = await run_load(client, side, calls, args.grace)
                row = {"load": load, "rate_rps": load * capacity, "side": side.name, **summarize(results, duration)}
                row["noise"] = noise.stop()
                row["gateway_cores"] = (go.cpu_seconds(side.pid) - cpu0) / row["noise"]["wall_s"]
                view = await route_view(client, side)
                row["prediction_error"] = view.get("prediction_error") if view else None
                row["tpot_prediction_error"] = view.get("tpot_prediction_error") if view else None
                row["route_view"] = view
                row["drain_s"] = await drain(client, fleet)
                after = await served(client, fleet)
                row["served"] = {name: int(after[name] - before[name]) for name in fleet}
                runs.append(row)
                print_row(row)
    return runs


def fmt(value, spec: str = ".0f", width: int = 6) -> str:
    return f"{'-':>{width}s}" if value is None else f"{value:{width}{spec}}"


HEADER = (f"  {'load':>4s} {'side':15s} {'reqs':>5s} {'good':>5s} {'shed':>5s} {'err':>4s} {'attain':>6s} "
          f"{'adm.at':>6s} {'goodput':>7s} {'ttft50':>6s} {'ttft99':>6s} {'tpot50':>6s} {'tpot99':>6s} {'pred.err':>8s} "
          f"{'tpot.err':>8s} {'served f/m/s':>12s} {'gw cpu':>6s} {'others':>6s}")


def print_row(r: dict) -> None:
    print(f"  {r['load']:4.1f} {r['side']:15s} {r['requests']:5d} {r['good']:5d} {r['shed']:5d} {r['errors']:4d} "
          f"{fmt(r['attainment'], '.3f')} {fmt(r['admitted_attainment'], '.3f')} {r['goodput_rps']:7.3f} "
          f"{fmt(r['ttft_p50_ms'])} {fmt(r['ttft_p99_ms'])} {fmt(r['tpot_p50_ms'])} {fmt(r['tpot_p99_ms'])} "
          f"{fmt(r['prediction_error'], '.1%', 8)} {fmt(r.get('tpot_prediction_error'), '.1%', 8)} "
          f"{'/'.join(str(v) for v in r.get('served', {}).values()):>12s} "
          f"{r['gateway_cores']:6.2f} {r['noise']['others_cores']:6.2f}", flush=True)


def goals(runs: list[dict]) -> list[dict]:
    """The issue's three goals, each with its figure and whether it was met."""
    by = {(r["load"], r["side"]): r for r in runs}
    out = []
    slo9, slo12 = by.get((0.9, "slo")), by.get((1.2, "slo"))
    if slo9:
        others = [r for (load, side), r in by.items() if load == 0.9 and side != "slo"]
        best = max(others, key=lambda r: r["goodput_rps"], default=None)
        out.append({"goal": "0.9x: slo attainment >= 0.95", "value": slo9["attainment"],
                    "met": slo9["attainment"] >= 0.95})
        if best:
            ratio = slo9["goodput_rps"] / best["goodput_rps"] if best["goodput_rps"] else float("inf")
            out.append({"goal": f"0.9x: slo goodput >= 1.3x the best other ({best['side']})", "value": ratio,
                        "met": ratio >= 1.3})
    if slo12:
        out.append({"goal": "1.2x: slo admitted attainment >= 0.95", "value": slo12["admitted_attainment"],
                    "met": (slo12["admitted_attainment"] or 0) >= 0.95})
        lite = by.get((1.2, "litellm"))
        if lite:
            ratio = slo12["goodput_rps"] / lite["goodput_rps"] if lite["goodput_rps"] else float("inf")
            out.append({"goal": "1.2x: slo goodput >= 1.5x LiteLLM's", "value": ratio, "met": ratio >= 1.5})
    errors = [r["prediction_error"] for r in runs if r["side"] == "slo" and r["prediction_error"] is not None]
    if errors:
        out.append({"goal": "slo route prediction error median <= 20 %", "value": errors[-1],
                    "met": errors[-1] <= 0.2})
    return out


def system_goodput(runs: list[dict], side: str, target: float) -> tuple[str, float] | None:
    """DistServe's goodput of one side: the largest arrival rate whose attainment is >= ``target``, linear
    between the measured loads. ("=", rate), ("<", lowest rate) when even the lowest load misses, (">=",
    highest rate) when the highest meets; None without runs. Coarse: only as fine as ``--loads``."""
    points = sorted((r["rate_rps"], r["attainment"]) for r in runs if r["side"] == side)
    if not points:
        return None
    if points[0][1] < target:
        return "<", points[0][0]
    for (rate, att), (next_rate, next_att) in zip(points, points[1:]):
        if next_att < target:
            return "=", rate + (next_rate - rate) * (att - target) / (att - next_att)
    return ">=", points[-1][0]


def print_system_goodput(runs: list[dict]) -> None:
    sides = sorted({r["side"] for r in runs}, key=lambda name: (name != "slo", name))
    if len({r["load"] for r in runs}) < 2:
        return
    print("\n  system goodput (DistServe: the largest arrival rate with attainment >= the target, linear between "
          "the loads run; not a goal of the issue, which compares good req/s at 0.9x):")
    for target in (0.9, SLO["target"]):
        cells = []
        for side in sides:
            found = system_goodput(runs, side, target)
            if found:
                bound, rate = found
                cells.append(f"{side} {'' if bound == '=' else bound + ' '}{rate:.2f}")
        print(f"    attainment >= {target:g}: " + ", ".join(cells) + " req/s")


def print_report(runs: list[dict], cap: dict, args) -> None:
    print(f"\nfleet capacity at the TPOT SLO: {cap['rps']:.2f} req/s ("
          + ", ".join(f"{n} {b['rps']:.2f} at batch {b['batch']}" for n, b in cap["backends"].items())
          + f"); SLO ttft {SLO['ttft_ms']} ms, tpot {SLO['tpot_ms']} ms, e2e {SLO['e2e_ms']} ms; "
          f"{args.seconds:g} s per run, seed {args.seed}")
    print(HEADER)
    for r in sorted(runs, key=lambda r: (r["load"], r["side"])):
        print_row(r)
    print("  (ms; goodput in good req/s; pred.err = the route's median |predicted - actual| / actual of TTFT,\n"
          "   tpot.err the same of TPOT (predicted at binding, for the batch it joined); served = requests each\n"
          "   backend finished; gw cpu = cores the gateway process used; others = cores used by processes other\n"
          "   than this client, the gateway and the fleet)")
    for r in runs:
        if r["errors"]:
            print(f"  {r['load']:g}x {r['side']}: {r['errors']} errors, e.g. {'; '.join(r['first_errors'])}")
    print("\n  goals:")
    for g in goals(runs):
        print(f"    {g['goal']}: {g['value']:.3f} -> {'met' if g['met'] else 'MISSED'}")
    print_system_goodput(runs)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, help="arrival window per run (60; --quick 20)")
    parser.add_argument("--loads", default="0.5,0.9,1.2", help="multiples of the fleet's capacity")
    parser.add_argument("--grace", type=float, help="s after the last arrival before cancelling (30; --quick 15)")
    parser.add_argument("--warmup", type=float, help="s of 0.5x load per side before the runs (15; --quick 8)")
    parser.add_argument("--seed", type=int, default=13)
    parser.add_argument("--sides", default="slo,least_inflight,round_robin,litellm")
    parser.add_argument("--no-litellm", action="store_true")
    parser.add_argument("--quick", action="store_true", help="20 s runs, 15 s grace, 8 s warm-up")
    parser.add_argument("--wait-idle", type=float, default=60, help="wait up to this many s for a quiet machine")
    parser.add_argument("--json", type=Path, help="write every figure here")
    parser.add_argument("--report", type=Path, metavar="JSON", help="print the report of an earlier run's --json "
                        "file (its fleet and loads) instead of running")
    args = parser.parse_args()
    args.loads = [float(x) for x in args.loads.split(",")]
    args.sides = [s for s in args.sides.split(",") if s and not (s == "litellm" and args.no_litellm)]
    defaults = {"seconds": 20.0, "grace": 15.0, "warmup": 8.0} if args.quick else \
        {"seconds": 60.0, "grace": 30.0, "warmup": 15.0}
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    return args


def reprint(path: Path, args) -> None:
    saved = json.loads(path.read_text())
    for key in ("seconds", "seed"):
        setattr(args, key, saved["config"].get(key, getattr(args, key)))
    print(f"{path} (loadavg at its start {' '.join(saved.get('loadavg_at_start', []))})")
    print_report(saved["runs"], saved["capacity"], args)


def main() -> None:
    args = parse_args()
    if args.report:
        return reprint(args.report, args)
    cap = fleet_capacity()
    print(f"fleet capacity {cap['rps']:.2f} req/s at TPOT <= {SLO['tpot_ms']} ms: "
          + json.dumps({n: {k: round(v, 2) for k, v in b.items() if v is not None} for n, b in cap["backends"].items()}))
    if args.wait_idle > 0:
        print(f"others use {wait_idle(args.wait_idle):.2f} cores at the start", flush=True)
    work = WORK / "run"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    procs = go.Processes()
    report: dict = {"config": {"fleet": {n: asdict(m) for n, m in FLEET.items()}, "slo": SLO,
                               "prompt_words": PROMPT_WORDS, "output_tokens": OUTPUT_TOKENS,
                               **{k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}},
                    "capacity": cap, "loadavg_at_start": open("/proc/loadavg").read().split()[:3]}
    try:
        fleet = start_fleet(procs, work)
        fleet_pids = [p.pid for p in procs.procs]
        sides: list[Side] = []
        if any(s in STRATEGIES for s in args.sides):
            try:
                sides += [s for s in start_infer(procs, work, fleet) if s.name in args.sides]
            except RuntimeError as exc:
                print(f"infer serve refused the routes config (has routing landed?):\n{exc}", file=sys.stderr)
                report["infer_error"] = str(exc)
        if "litellm" in args.sides and (exe := go.ensure_litellm()):
            sides.append(start_litellm(procs, work, fleet, exe))
        if not sides:
            raise SystemExit("no side to measure")
        report["runs"] = go.run_async(bench(args, sides, fleet, cap["rps"], fleet_pids))
        report["goals"] = goals(report["runs"])
        print_report(report["runs"], cap, args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        raise SystemExit(130) from None
    finally:
        procs.stop_all()
        if args.json and "runs" in report:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(report, indent=1, default=str))
            print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()
