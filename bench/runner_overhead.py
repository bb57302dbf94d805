"""The cost of the process boundary (issue 27): a local model through ``infer serve`` with today's
in-process engines (the tree given by ``--baseline``) vs this tree's runners, both sides in one run.

    git archive <commit-before-runners> | tar -x -C /tmp/base
    flock /tmp/infer-heavy.lock .venv/bin/python bench/runner_overhead.py --baseline /tmp/base

Both servers run at once on free loopback ports over one store holding SmolLM2-135M-Instruct Q4_1
(``infer dev fetch-model``), ``INFER_KEEP_ALIVE=-1``; each engine (native, llama.cpp) is warmed up on
both first. Then ``--rounds`` rounds, for each engine:

- 1 stream: ``--requests`` streamed ``/api/generate`` per side, one after the other and interleaved
  between the sides (in-process, runner, runner, in-process, ...: a noisy moment on a shared machine
  hits both); the same ~40-token raw prompt, greedy, ``--tokens`` tokens (``ignore_eos``); TTFT =
  request sent -> first token line; decode tok/s = (tokens - 1) / (last token line - first token line);
- 16 streams: 16 such requests at once, one side after the other (the order flips every round);
  per-stream decode tok/s (median) and the batch's output tokens / its wall time.

With ``--keyed``, every request carries a ledger key of its side (made by that tree's ``infer keys
create``), so it is admitted before it generates: in a tree whose runner counts its own prompt, that is
the ``Admit``/``Admitted`` round trip. With ``--same-tree``, a third side runs this tree's runners on threads of
the gateway process (``bench/serve_in_process.py``, as ``infer run --local`` does): against it the ratio is
the cost of a process, the socket, the messages and the engine code held equal (before issue 41 that side
had the engines in the gateway with no runner: the whole boundary); against ``--baseline`` it also carries
every engine change since. Medians over all the 1-stream
requests of a side, and over the rounds for the 16-stream figures;
ratio = runner / in-process. Goals: TTFT +<= 2 ms, decode tok/s >= 0.97x at 1 and at 16 streams, for
each engine. Then ``--kill`` (default on): 16 streams on the runner side's native model, SIGKILL of
its runner 1 s in; the seconds until every stream has ended (goal <= 2 s), and whether the gateway's
PID is unchanged.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fakes.live import free_port  # noqa: E402

MODEL = "smollm2:135m"
ENGINES = ("native", "llamacpp")
PROMPT = ("<|im_start|>user\nWrite a long story about a lighthouse keeper who finds a map in a bottle, "
          "and tell it slowly.<|im_end|>\n<|im_start|>assistant\n")



def make_store(home: Path) -> Path:
    from registry.create import create_model
    from registry.modelfile import parse_modelfile
    from registry.names import parse_name
    from registry.realmodels import fetch_smollm2
    from registry.store import Store

    create_model(Store(home / "models"), parse_name(MODEL), parse_modelfile(f"FROM {fetch_smollm2()}\n"), home)
    return home / "models"


def start(tree: Path, name: str, models: Path, work: Path, launcher: list[str] | None = None
          ) -> tuple[subprocess.Popen, str]:
    """``infer serve`` of ``tree`` (or ``launcher``'s command, run in ``tree``) on a free port; (process, URL)."""
    port = free_port()
    env = server_env(tree, name, models, work)
    env["INFER_HOST"] = f"127.0.0.1:{port}"
    log = open(work / f"{name}.log", "wb")
    command = launcher or [sys.executable, "-m", "cli", "serve"]
    proc = subprocess.Popen([*command, "--log-level", "warning"], cwd=tree, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return proc, url
        except OSError:
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited: {(work / f'{name}.log').read_text()[-2000:]}")
            time.sleep(0.1)
    raise RuntimeError(f"{name} did not start")


def server_env(tree: Path, name: str, models: Path, work: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("INFER_", "OLLAMA_"))}
    env.update(INFER_HOME=str(work / name), INFER_MODELS=str(models), INFER_KEEP_ALIVE="-1", PYTHONPATH=str(tree))
    return env


def create_key(tree: Path, name: str, models: Path, work: Path) -> str:
    """A ledger key (``sk-infer-…``) in the side's own ledger, made by that tree's CLI: a keyed request is
    admitted (its count and cap decided by the gateway) before it generates."""
    (work / name).mkdir(parents=True, exist_ok=True)
    out = subprocess.run([sys.executable, "-m", "cli", "keys", "create", "bench", "--max-tokens", "100000"],
                         cwd=tree, env=server_env(tree, name, models, work), capture_output=True, text=True, check=True)
    return next(word for word in out.stdout.split() if word.startswith("sk-infer-"))


KEYS: dict[str, str] = {}  # url -> the side's ledger key (--keyed)


async def one(session: aiohttp.ClientSession, url: str, engine: str, tokens: int) -> dict:
    body = {"model": MODEL, "prompt": PROMPT, "raw": True, "stream": True,
            "options": {"engine": engine, "num_predict": tokens, "temperature": 0, "ignore_eos": True, "seed": 1}}
    headers = {"Authorization": f"Bearer {KEYS[url]}"} if url in KEYS else {}
    t0 = time.perf_counter()
    first = last = None
    final: dict = {}
    async with session.post(url + "/api/generate", json=body, headers=headers) as resp:
        async for line in resp.content:
            item = json.loads(line)
            now = time.perf_counter()
            if "error" in item:
                return {"error": item["error"], "end": now}
            if item.get("response"):
                first = first or now
                last = now
            if item.get("done"):
                final, last = item, now
    n = final.get("eval_count", 0)
    return {"ttft": first - t0, "decode": (n - 1) / (last - first) if n > 1 and last > first else 0.0, "tokens": n,
            "wall": last - t0}


async def measure(urls: dict[str, str], engine: str, args, flip: bool) -> dict[str, dict]:
    """One round for ``engine`` on every side: the 1-stream requests interleaved between the sides (so a noisy
    moment hits both), then each side's ``--streams`` batch in turn."""
    sides = list(urls)[::-1] if flip else list(urls)
    singles: dict[str, list[dict]] = {side: [] for side in sides}
    got: dict[str, dict] = {}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:
        for i in range(args.requests):
            for side in (sides if i % 2 == 0 else sides[::-1]):
                singles[side].append(await one(session, urls[side], engine, args.tokens))
        for side in sides:
            t0 = time.perf_counter()
            batch = await asyncio.gather(*(one(session, urls[side], engine, args.tokens) for _ in range(args.streams)))
            wall = time.perf_counter() - t0
            got[side] = {"ttft_ms": [r["ttft"] * 1000 for r in singles[side]],
                         "decode_1": [r["decode"] for r in singles[side]],
                         "decode_16": statistics.median(r["decode"] for r in batch),
                         "batch_tok_s": sum(r["tokens"] for r in batch) / wall}
    return got


async def kill_drill(url: str, proc: subprocess.Popen, args) -> dict:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:
        streams = [asyncio.ensure_future(one(session, url, "native", 100000)) for _ in range(args.streams)]
        await asyncio.sleep(1.0)
        async with session.get(url + "/api/ps") as resp:
            pids = [m["runner"]["pid"] for m in (await resp.json())["models"]
                    if (m.get("runner") or {}).get("engine") == "native"]
        killed = time.perf_counter()
        os.kill(pids[0], signal.SIGKILL)
        ends = await asyncio.gather(*streams)
    return {"streams": len(ends), "errors": sum("error" in e for e in ends),
            "all_ended_s": max(e["end"] for e in ends if "end" in e) - killed, "gateway_alive": proc.poll() is None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", type=Path, help="a source tree of infer before runners (without it: the "
                        "runner side's figures and the kill drill only)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=10, help="1-stream requests per round and side")
    parser.add_argument("--streams", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--engines", default=",".join(ENGINES))
    parser.add_argument("--same-tree", action="store_true", help="add this tree's runners on threads of the gateway "
                        "process (bench/serve_in_process.py): the cost of a process, all else held equal")
    parser.add_argument("--no-kill", action="store_true")
    parser.add_argument("--keyed", action="store_true", help="every request with a ledger key (admitted before it "
                        "generates: the Admit round trip to a runner that counts its own prompt)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    engines = args.engines.split(",")
    names = (*(("inproc",) if args.baseline else ()), *(("same",) if args.same_tree else ()), "runner")
    results: dict = {e: {name: [] for name in names} for e in engines}
    with tempfile.TemporaryDirectory(prefix="runner-overhead-") as tmp:
        work = Path(tmp)
        models = make_store(work / "store")
        trees = {"runner": ROOT, "inproc": args.baseline.resolve() if args.baseline else None, "same": ROOT}
        keys = {side: create_key(trees[side], side, models, work) for side in names} if args.keyed else {}
        procs = {"runner": start(ROOT, "runner", models, work)}
        if args.baseline:
            procs["inproc"] = start(args.baseline.resolve(), "inproc", models, work)
        if args.same_tree:
            procs["same"] = start(ROOT, "same", models, work, [sys.executable, str(ROOT / "bench" / "serve_in_process.py")])
        KEYS.update({procs[side][1]: key for side, key in keys.items()})
        try:
            urls = {side: procs[side][1] for side in names}
            warm = argparse.Namespace(**{**vars(args), "requests": 1, "streams": 2})
            for engine in engines:  # loads, kernels compiled
                asyncio.run(measure(urls, engine, warm, False))
            time.sleep(8.0)  # the runner side's next spares have started and imported their engines
            for r in range(args.rounds):
                for engine in engines:
                    for side, got in asyncio.run(measure(urls, engine, args, flip=r % 2 == 1)).items():
                        results[engine][side].append(got)
                        print(f"round {r + 1} {engine:8} {side:7} ttft_ms={statistics.median(got['ttft_ms']):.2f}  "
                              f"decode_1={statistics.median(got['decode_1']):.2f}  decode_16={got['decode_16']:.2f}  "
                              f"batch_tok_s={got['batch_tok_s']:.2f}", flush=True)
            drill = None if args.no_kill else asyncio.run(kill_drill(procs["runner"][1], procs["runner"][0], args))
        finally:
            for proc, _ in procs.values():
                proc.send_signal(signal.SIGTERM)
                proc.wait(timeout=60)
    report(results, drill, args)


def _median(rounds: list[dict], key: str) -> float:
    """The median over every request of every round (1-stream figures are lists), or over the rounds."""
    values = [v for r in rounds for v in (r[key] if isinstance(r[key], list) else [r[key]])]
    return statistics.median(values)


def _paired(base: list[dict], runner: list[dict], key: str) -> float:
    """The median of per-pair runner - base (TTFT) or runner / base: 1-stream figures pair the two sides'
    requests of the same index in a round (sent within a few requests of each other), 16-stream figures
    pair round by round."""
    if isinstance(base[0][key], list):
        pairs = [(x, y) for a, b in zip(base, runner) for x, y in zip(a[key], b[key])]
    else:
        pairs = [(a[key], b[key]) for a, b in zip(base, runner)]
    return statistics.median((y - x) if key == "ttft_ms" else y / x for x, y in pairs)


SIDES = {"inproc": "the --baseline tree (in-process engines before runners, or an older tree with runners)",
         "same": "this tree's runners on threads of the gateway process (--same-tree: a process's cost)"}


def report(results: dict, drill: dict | None, args) -> None:
    table = {}
    print(f"\nmedians: TTFT and 1-stream decode over all {args.rounds * args.requests} requests of a side, the "
          f"{args.streams}-stream figures over {args.rounds} rounds; ratio = runner / in-process")
    metrics = (("ttft_ms", "TTFT ms (1 stream)", "+<= 2 ms"), ("decode_1", "decode tok/s, 1 stream", ">= 0.97x"),
               ("decode_16", f"decode tok/s, {args.streams} str.", ">= 0.97x"),
               ("batch_tok_s", f"batch tok/s, {args.streams} str.", ""))
    baselines = [side for side in SIDES if any(side in sides for sides in results.values())]
    if not baselines:
        for engine, sides in results.items():
            for key, label, _ in metrics:
                print(f"{engine:9} {label:22} runner {_median(sides['runner'], key):9.2f}")
    for side in baselines:
        print(f"\nagainst {SIDES[side]}")
        print(f"{'engine':9} {'metric':22} {'in-process':>11} {'runner':>9} {'ratio':>9} {'paired':>9}  goal")
        for engine, sides in results.items():
            for key, label, goal in metrics:
                a, b = _median(sides[side], key), _median(sides["runner"], key)
                met = (b - a <= 2.0) if key == "ttft_ms" else (b / a >= 0.97 if goal else None)
                verdict = "" if met is None else ("met" if met else "MISSED")
                extra = f"{b - a:+.2f} ms" if key == "ttft_ms" else f"{b / a:.3f}x"
                pair = _paired(sides[side], sides["runner"], key)
                paired = f"{pair:+.2f} ms" if key == "ttft_ms" else f"{pair:.3f}x"
                print(f"{engine:9} {label:22} {a:11.2f} {b:9.2f} {extra:>9} {paired:>9}  {goal} {verdict}")
                table[f"{side}.{engine}.{key}"] = {side: a, "runner": b, "met": met, "paired": pair}
    print("\nratio: of the two sides' medians (the verdict); paired: the median over requests (1 stream: the "
          "two sides' requests of the same index in a round) or rounds (16 streams) of the difference or ratio")
    if drill:
        print(f"\nkill drill: SIGKILL of the native runner during {drill['streams']} streams: {drill['errors']} ended "
              f"with an error, all within {drill['all_ended_s']:.3f} s (goal <= 2 s); gateway alive: "
              f"{drill['gateway_alive']}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"rounds": results, "medians": table, "kill": drill}, indent=2))


if __name__ == "__main__":
    main()
