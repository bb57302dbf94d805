"""Prefix-cache-aware routing on multi-turn chat: `infer serve` with strategy prefix, slo, least_inflight
and round_robin in front of a fleet of queueing fakes with a prefix cache.

**Fleet** (per side, started afresh so no side inherits another's caches): three queueing fakes
(``fakes/queueing.py``, subprocesses speaking vLLM's wire) whose prefill counts only the prompt
tokens not found in their prefix cache (:data:`FLEET`: 1,500 prompt tokens/s, 16-token blocks,
``prefix_cache_tokens`` each, LRU), decode steps of ``tpot(n)``, and usage with
``prompt_tokens_details.cached_tokens``.

**Workload** (``benchmark/conversations.py``, seeded): ``--conversations`` users, each with a long system
prompt of their own (1,500 words = 1,500 tokens on the fakes; ``--systems N``: N prompts shared round-robin
instead), 6-10 turns each of 20-80 words, answers of 16-48
tokens, exponential think time of mean 2 s between turns, conversations starting over the first 10 s.
Each turn sends the whole conversation so far (system prompt, every turn and answer). Streamed chat
completions; TTFT = the first content chunk.

**Per side**: requests, mean and p90 TTFT, each backend's share of the requests (from the fakes'
``vllm:request_success_total``), the cache-hit ratio (Σ cached tokens / Σ prompt tokens, from the
usage the fakes reported), and the ratios of mean TTFT to ``least_inflight``'s.

**Decision cost** (``--decision``): the route's own code (``routing.prefix``, the ``slo`` dispatcher)
in-process, with ``--tracked`` conversations already in the index: µs per routing decision (lookup,
choice, insertion; for ``slo`` the prediction and binding too), mean and p99 over 10,000 decisions.

Goals (issue 29): mean TTFT with prefix and with slo <= 0.5x least_inflight's; no backend above 60 %
of the requests; the decision <= 50 us with 10,000 conversations tracked.

    .venv/bin/python bench/prefix.py [--conversations 24] [--seed 7] [--sides prefix,slo,least_inflight,round_robin]
                                     [--decision-only] [--json OUT]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import statistics
import sys
import time
from dataclasses import asdict
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT))

import gateway_overhead as go  # noqa: E402  (bench/ is the script's directory)
from benchmark.conversations import Conversation, Workload, conversations  # noqa: E402
from fakes.queueing import QueueModel  # noqa: E402

WORK = ROOT / ".bench" / "prefix"
SERVED_MODEL = "sim-8b"
FLEET = {name: QueueModel(batch_limit=8, prefill_tok_s=1500, tpot_base_ms=20, tpot_slope_ms=2, model=SERVED_MODEL,
                          prefix_cache_tokens=40_000, block_size=16) for name in ("gpu0", "gpu1", "gpu2")}
SLO = {"ttft_ms": 2000, "tpot_ms": 150, "window_s": 600}
SIDES = ("prefix", "slo", "least_inflight", "round_robin")


# ---------------------------------------------------------------- processes


def start_fleet(procs: go.Processes, work: Path) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    urls = {}
    for name, model in FLEET.items():
        port = go.free_port()
        args = [sys.executable, "-m", "fakes.queueing", "--port", str(port)]
        for key in ("batch_limit", "prefill_tok_s", "tpot_base_ms", "tpot_slope_ms", "model", "prefix_cache_tokens",
                    "block_size"):
            args += ["--" + key.replace("_", "-"), str(getattr(model, key))]
        urls[name] = f"http://127.0.0.1:{port}"
        procs.start(args, work / f"backend-{name}.log", urls[name] + "/health", env, timeout=60)
    return urls


def start_infer(procs: go.Processes, work: Path, fleet: dict[str, str], strategy: str) -> str:
    backends = [{"name": name, "type": "vllm", "base_url": url, "model": SERVED_MODEL} for name, url in fleet.items()]
    route = {"name": "chat", "backends": list(fleet), "strategy": strategy, "slo": dict(SLO)}
    config = work / "infer-config.yaml"
    config.write_text(yaml.safe_dump({"backends": backends, "routes": [route]}, sort_keys=False))
    home = work / "infer-home"
    (home / "models").mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("INFER_")}
    env.update(INFER_HOME=str(home), INFER_MODELS=str(home / "models"), PYTHONPATH=str(ROOT),
               INFER_DATABASE_URL=f"sqlite:///{home / 'usage.db'}")
    port = go.free_port()
    url = f"http://127.0.0.1:{port}"
    procs.start([*go.infer_command(), "serve", "--config", str(config), "--host", f"127.0.0.1:{port}"],
                work / "infer-serve.log", url + "/", env, timeout=120)
    return url


# ---------------------------------------------------------------- the sessions


async def turn(client, url: str, messages: list[dict], max_tokens: int) -> dict:
    body = {"model": "chat", "messages": messages, "max_tokens": max_tokens, "stream": True,
            "stream_options": {"include_usage": True}}
    start, first, text, usage = time.perf_counter(), None, [], None
    async with client.post(url + "/v1/chat/completions", json=body) as resp:
        if resp.status != 200:
            return {"error": f"{resp.status}: {(await resp.read())[:200]!r}"}
        async for line in resp.content:
            if not line.startswith(b"data: {"):
                continue
            event = json.loads(line[6:])
            for choice in event.get("choices") or []:
                if choice.get("delta", {}).get("content"):
                    first = first or time.perf_counter()
                    text.append(choice["delta"]["content"])
            usage = event.get("usage") or usage
    details = (usage or {}).get("prompt_tokens_details") or {}
    return {"ttft": first - start if first else None, "text": "".join(text),
            "prompt_tokens": (usage or {}).get("prompt_tokens", 0), "cached_tokens": details.get("cached_tokens", 0)}


async def session(client, url: str, conv: Conversation, start: float, results: list[dict]) -> None:
    await asyncio.sleep(max(0.0, start + conv.start_s - time.perf_counter()))
    messages = [conv.system_message()]
    for step in conv.turns:
        messages.append({"role": "user", "content": step.user})
        result = await turn(client, url, messages, step.max_tokens)
        results.append({"conversation": conv.index, **result})
        if "error" in result:
            return
        messages.append({"role": "assistant", "content": result["text"]})
        await asyncio.sleep(step.think_s)


async def served(client, fleet: dict[str, str]) -> dict[str, int]:
    out = {}
    for name, url in fleet.items():
        async with client.get(url + "/metrics") as resp:
            text = await resp.text()
        out[name] = int(sum(float(v) for v in re.findall(r"^vllm:request_success_total\{[^}]*\} ([0-9.]+)$", text, re.M)))
    return out


async def run_side(url: str, fleet: dict[str, str], convs: list[Conversation]) -> dict:
    results: list[dict] = []
    async with go.make_client(256) as client:
        start = time.perf_counter()
        await asyncio.gather(*(session(client, url, c, start, results) for c in convs))
        wall = time.perf_counter() - start
        counts = await served(client, fleet)
    return summarize(results, counts, wall)


def summarize(results: list[dict], counts: dict[str, int], wall: float) -> dict:
    ok = [r for r in results if "error" not in r and r["ttft"] is not None]
    ttfts = sorted(r["ttft"] for r in ok)
    total = sum(counts.values()) or 1
    prompt = sum(r["prompt_tokens"] for r in ok)
    return {"requests": len(results), "errors": len(results) - len(ok), "wall_s": wall,
            "first_errors": sorted({r["error"] for r in results if "error" in r})[:3],
            "ttft_mean_ms": statistics.fmean(ttfts) * 1000 if ttfts else None,
            "ttft_p90_ms": ttfts[min(len(ttfts) - 1, int(0.9 * len(ttfts)))] * 1000 if ttfts else None,
            "shares": {name: n / total for name, n in counts.items()},
            "cache_hit_ratio": sum(r["cached_tokens"] for r in ok) / prompt if prompt else None,
            "prompt_tokens": prompt}


def run_strategy(strategy: str, convs: list[Conversation]) -> dict:
    work = WORK / "run" / strategy
    work.mkdir(parents=True, exist_ok=True)
    procs = go.Processes()
    try:
        fleet = start_fleet(procs, work)
        url = start_infer(procs, work, fleet, strategy)
        return go.run_async(run_side(url, fleet, convs))
    finally:
        procs.stop_all()


# ---------------------------------------------------------------- the decision's cost


def decision_cost(tracked: int, decisions: int, seed: int) -> dict:
    """µs per routing decision of the prefix and slo strategies with ``tracked`` conversations indexed."""
    from core.base import GenerationRequest
    from routing.dispatch import Dispatcher, Waiter
    from gateway.backends_config import PrefixEntry, SLOEntry
    from routing.build import prefix_policy, slo_policy
    from routing.prefix import RoutePrefixes
    from routing.strategies import Member, Orderer

    convs = conversations(Workload(count=tracked, systems=20, system_words=300, turns=(3, 3)), seed)
    members = [Member(name=n, backend=None, model=n) for n in FLEET]
    requests = []
    for c in convs:
        messages = [c.system_message()]
        for step in c.turns:
            messages = messages + [{"role": "user", "content": step.user},
                                   {"role": "assistant", "content": "alpha bravo charlie " * 8}]
        requests.append(GenerationRequest(model="chat", messages=messages))
    policy = prefix_policy(PrefixEntry(capacity_tokens=10_000_000))  # every conversation stays tracked
    out = {"tracked": tracked, "decisions": decisions}
    for strategy in ("prefix", "slo"):
        prefixes = RoutePrefixes("chat", list(FLEET), policy)
        for req in requests:  # index every conversation first
            lookup = prefixes.lookup(req, 1000)
            prefixes.sent(prefixes.pick(lookup, members).name, lookup)
        orderer, dispatcher, slo = Orderer(strategy), Dispatcher(shed=False), slo_policy(SLOEntry(ttft_ms=2000, tpot_ms=150))
        times = []
        for i in range(decisions):
            req = requests[(i * 7919) % len(requests)]
            t0 = time.perf_counter()
            lookup = prefixes.lookup(req, 1000)
            if strategy == "prefix":
                member = orderer.order(members, {}, slo, 32, prefixes.pick(lookup, members))[0]
                name = member.name
            else:
                waiter = Waiter(1000, 32, time.monotonic(), slo, cached=lookup.cached)
                dispatcher.arrive(waiter, members)
                name = dispatcher.ready(members)[0].backend
                next(m for m in members if m.name == name).latency.in_flight.pop(waiter.key)
            prefixes.sent(name, lookup)
            times.append(time.perf_counter() - t0)
        times.sort()
        out[strategy] = {"mean_us": statistics.fmean(times) * 1e6, "p50_us": times[len(times) // 2] * 1e6,
                         "p99_us": times[int(0.99 * len(times))] * 1e6,
                         "index_blocks": sum(prefixes.index.size(i) for i in range(len(FLEET))),
                         "prompt_chars": statistics.fmean(len(m["content"]) for m in requests[0].messages) *
                         len(requests[0].messages)}
    return out


# ---------------------------------------------------------------- report


def goals(runs: dict[str, dict], cost: dict | None) -> list[dict]:
    out = []
    base = (runs.get("least_inflight") or {}).get("ttft_mean_ms")
    for side in ("prefix", "slo"):
        if side in runs and base:
            ratio = runs[side]["ttft_mean_ms"] / base
            out.append({"goal": f"{side}: mean TTFT <= 0.5x least_inflight's", "value": ratio, "met": ratio <= 0.5})
            top = max(runs[side]["shares"].values())
            out.append({"goal": f"{side}: no backend above 60 % of the requests", "value": top, "met": top <= 0.6})
    for side in ("prefix", "slo"):
        if cost and side in cost:
            value = cost[side]["mean_us"]
            out.append({"goal": f"{side}: decision <= 50 us with {cost['tracked']} conversations tracked (mean)",
                        "value": value, "met": value <= 50})
    return out


def print_report(runs: dict[str, dict], cost: dict | None, args) -> None:
    if runs:
        base = (runs.get("least_inflight") or {}).get("ttft_mean_ms")
        print(f"\n{args.conversations} conversations ({args.systems or 'one'} system prompt(s)"
              f"{'' if args.systems else ' each'}), seed {args.seed}; fleet: 3 x (prefill 1500 tok/s, "
              f"prefix cache {FLEET['gpu0'].prefix_cache_tokens} tokens); loadavg at start {args.loadavg}")
        print(f"  {'side':15s} {'reqs':>5s} {'err':>4s} {'ttft mean':>9s} {'ttft p90':>9s} {'/li':>6s} "
              f"{'hit ratio':>9s}  shares gpu0/gpu1/gpu2")
        for side, r in runs.items():
            ratio = r["ttft_mean_ms"] / base if base and r["ttft_mean_ms"] else None
            print(f"  {side:15s} {r['requests']:5d} {r['errors']:4d} {r['ttft_mean_ms']:9.0f} {r['ttft_p90_ms']:9.0f} "
                  f"{ratio if ratio is not None else float('nan'):6.2f} {r['cache_hit_ratio']:9.3f}  "
                  + "/".join(f"{v:.0%}" for v in r["shares"].values()))
            if r["errors"]:
                print(f"    errors: {r['first_errors']}")
        print("  (ms; /li = mean TTFT over least_inflight's; hit ratio = cached / prompt tokens, as the backends "
              "reported them)")
    if cost:
        print(f"\n  routing decision, {cost['tracked']} conversations tracked, {cost['decisions']} decisions "
              f"(prompts of ~{cost['prefix']['prompt_chars']:.0f} characters):")
        for side in ("prefix", "slo"):
            c = cost[side]
            print(f"    {side:7s} mean {c['mean_us']:6.1f} us, p50 {c['p50_us']:6.1f} us, p99 {c['p99_us']:6.1f} us "
                  f"({c['index_blocks']} blocks indexed)")
    print("\n  goals:")
    for g in goals(runs, cost):
        print(f"    {g['goal']}: {g['value']:.3f} -> {'met' if g['met'] else 'MISSED'}")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--conversations", type=int, default=24)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--systems", type=int, help="system prompts shared round-robin (default: one per user)")
    parser.add_argument("--sides", default=",".join(SIDES))
    parser.add_argument("--tracked", type=int, default=10_000, help="conversations in the index (--decision)")
    parser.add_argument("--decisions", type=int, default=10_000)
    parser.add_argument("--decision-only", action="store_true", help="only the in-process decision cost")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    args.sides = [s for s in args.sides.split(",") if s]
    args.loadavg = " ".join(open("/proc/loadavg").read().split()[:3])
    return args


def main() -> None:
    args = parse_args()
    runs: dict[str, dict] = {}
    if not args.decision_only:
        convs = conversations(Workload(count=args.conversations, systems=args.systems), args.seed)
        print(f"{len(convs)} conversations, {sum(len(c.turns) for c in convs)} turns", flush=True)
        for side in args.sides:
            print(f"{side} ...", flush=True)
            runs[side] = run_strategy(side, convs)
            r = runs[side]
            print(f"  mean TTFT {r['ttft_mean_ms']:.0f} ms, p90 {r['ttft_p90_ms']:.0f} ms, hit ratio "
                  f"{r['cache_hit_ratio']:.3f}, shares " + "/".join(f"{v:.0%}" for v in r["shares"].values()), flush=True)
    cost = decision_cost(args.tracked, args.decisions, args.seed)
    print_report(runs, cost, args)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"config": {"fleet": {n: asdict(m) for n, m in FLEET.items()}, "slo": SLO,
                                                    "conversations": args.conversations, "seed": args.seed,
                                                    "loadavg_at_start": args.loadavg},
                                         "runs": runs, "decision": cost, "goals": goals(runs, cost)}, indent=1))
        print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()
