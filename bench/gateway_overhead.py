"""What a gateway adds in front of a fast OpenAI-compatible server: direct vs `infer serve` vs LiteLLM's proxy.

Starts on free 127.0.0.1 ports (all stopped at exit, also on errors and Ctrl-C):

- ``bench/fast_openai_server.py``: canned ``/v1/chat/completions`` answers (``--chunks`` content chunks,
  usage, ``[DONE]``) from a raw asyncio server, far cheaper per request than either gateway;
- ``infer serve --config cfg.yaml`` (``.venv/bin/infer``, ``INFER_HOME`` and ``INFER_DATABASE_URL`` in a
  temporary directory) with one ``type: openai`` backend entry, ``fast-openai``, pointing at it;
- LiteLLM's proxy as its docs start it, ``litellm --config config.yaml --port P`` (plus ``--host
  127.0.0.1``), with a ``model_list`` entry ``openai/fast`` whose ``api_base`` is the fast server. It is
  installed on first use into its own venv, ``.bench/litellm-venv`` (``pip install 'litellm[proxy]'``).
  Recent LiteLLM refuses to start without a master key, so one is set and sent as a Bearer token;
- ``bench/minimal_proxy.py`` (side ``minimal``, ``--no-minimal`` to skip): a bare ASGI proxy on the same
  uvicorn + aiohttp stack as ``infer serve``, the floor any gateway built on that stack starts from.

Each server runs with its default log level (both print an access line per request, as users get).
One async aiohttp client (uvloop when installed) drives every side with the same request:
``POST /v1/chat/completions``, one user message, ``max_tokens`` = ``--chunks``, non-streaming and
streaming (``stream_options.include_usage``); a request counts when the answer is complete (JSON
with content, or an SSE stream up to ``[DONE]`` with every content chunk and a usage chunk).

- concurrency 1: each gateway is measured against ``direct`` in pairs: blocks of 10 rounds per gateway,
  gateways taking turns, each round one request direct and one through the gateway per mode, in an
  order alternated every round (``--rounds`` rounds per gateway in all; a block's first round is a
  warm-up). "added" = median through the gateway - median direct of the same blocks, "paired" = the
  median of the per-round differences. Pairs, not one rotation over every side: a server's work after
  its answer (LiteLLM logs each call in the background, ~2 ms of CPU) lands on the next request, and
  that should be its own or direct's, not another gateway's. ``--settle`` instead waits, before each
  request, until every server has been idle for 2 ms and reports the CPU each ran after its answer;
- concurrency 32: ``--tput-rounds`` rounds of ``--tput-seconds`` per side and mode, alternated;
  requests/s (median over rounds) and each server's CPU ms per request (from /proc/PID/stat).

``--cost`` (issue 15): only c=1, direct vs three ``infer serve``: unpriced (``infer``), its backend with list
prices (``priced``), and priced with every request sent under an API key with a budget (``keyed``: the
budget is reserved and settled per request); added = the paired median over the unpriced run. Goal: <= 0.1 ms.
With ``--baseline DIR`` a fifth side, ``base-keyed``, runs the keyed path on DIR's code in the same run.

``--soak``: only the fast server and ``infer serve``; ``--soak-requests`` (10,000) streaming requests
in waves of 1,000 from ``--soak-concurrency`` (500) concurrent clients; errors, the server's VmRSS
after each wave, then SIGTERM and the number of ledger rows in its SQLite database (one per request).

``--local-load ENGINE`` (issue 27): the ``infer serve`` sides also hold SmolLM2 (``infer dev fetch-model``)
and, one side at a time, decode ``--local-streams`` (16) endless streams of it on ``ENGINE`` (native or
llamacpp) while that side's c=1 and c=32 figures are taken against direct (LiteLLM and the minimal proxy
are skipped). With ``--baseline DIR``, today's in-process engine shares the gateway's process and GIL;
this tree's runs in a runner process.

Goals (issue 11): added median latency at c=1 <= 1.0 ms; infer/LiteLLM req/s at c=32 >= 3x;
soak: 0 errors, one ledger row per request, RSS after 10,000 within 10 % of RSS after 1,000.
The machine may be shared: the script reports how many cores other processes used meanwhile.

    .venv/bin/python bench/gateway_overhead.py [--rounds 250] [--chunks 16] [--tput-seconds 3]
                                               [--no-litellm] [--soak] [--cost] [--json OUT]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import yaml

try:
    import aiohttp
except ImportError:  # pragma: no cover
    raise SystemExit("bench/gateway_overhead.py needs aiohttp (in the dev extra): .venv/bin/pip install -e '.[dev]'")

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "bench"), str(ROOT)]

from fakes.live import free_port  # noqa: E402
from noise import wait_idle  # noqa: E402  (bench/ is the script's directory)

WORK = ROOT / ".bench" / "gateway_overhead"
LITELLM_VENV = ROOT / ".bench" / "litellm-venv"
MASTER_KEY = "sk-bench-gateway-overhead-0123456789abcdef"
MODES = ("nonstream", "stream")
CLK = os.sysconf("SC_CLK_TCK")


@dataclass
class Side:
    name: str
    url: str
    model: str
    pid: int | None = None
    headers: dict = field(default_factory=dict)



# ---------------------------------------------------------------- processes


class Processes:
    """Subprocesses started by this run; all stopped (SIGTERM, then SIGKILL) on exit."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen] = []

    def start(self, args: list[str], log: Path, ready_url: str, env: dict | None = None,
              timeout: float = 180.0) -> subprocess.Popen:
        with open(log, "wb") as out:
            proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=log.parent)
        self.procs.append(proc)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"{args[0]} exited early ({proc.returncode}):\n{_tail(log)}")
            try:
                if httpx.get(ready_url, timeout=1.0).status_code == 200:
                    return proc
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"{args[0]} did not answer {ready_url} in {timeout:.0f}s:\n{_tail(log)}")

    def stop(self, proc: subprocess.Popen, timeout: float = 30.0) -> int:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        return proc.returncode

    def stop_all(self) -> None:
        for proc in reversed(self.procs):
            self.stop(proc, timeout=15)


def _tail(path: Path, lines: int = 30) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def start_fast(procs: Processes, work: Path, chunks: int) -> Side:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = procs.start([sys.executable, str(ROOT / "bench" / "fast_openai_server.py"), "--port", str(port),
                        "--chunks", str(chunks)], work / "fast-server.log", url + "/v1/models")
    return Side("direct", url, "fast", proc.pid)


def start_minimal(procs: Processes, work: Path, fast: Side) -> Side:
    port = free_port()
    proc = procs.start([sys.executable, str(ROOT / "bench" / "minimal_proxy.py"), fast.url, str(port)],
                       work / "minimal-proxy.log", f"http://127.0.0.1:{port}/")
    return Side("minimal", f"http://127.0.0.1:{port}", "fast", proc.pid)


def infer_command() -> list[str]:
    exe = ROOT / ".venv" / "bin" / "infer"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "cli"]


PRICES = {"input_per_mtok": 0.15, "output_per_mtok": 0.60, "cached_input_per_mtok": 0.075}  # --cost


def start_infer(procs: Processes, work: Path, fast: Side, variant: str = "infer",
                source: Path | None = None, models: Path | None = None,
                name: str | None = None) -> tuple[Side, subprocess.Popen, Path]:
    """``infer serve`` in front of ``fast``; ``variant`` ``priced`` gives its backend list prices, ``keyed``
    also sends every request with an API key whose budget (never reached) is reserved and settled.
    ``source``: run the code of that source tree instead (PYTHONPATH), e.g. an older commit's; ``name``:
    the side's name (default: the variant)."""
    name = name or variant
    backend = {"name": "fast-openai", "type": "openai", "base_url": fast.url + "/v1", "model": "fast"}
    if variant in ("priced", "keyed"):
        backend["pricing"] = PRICES
    config = work / f"{name}-config.yaml"
    config.write_text(yaml.safe_dump({"backends": [backend]}))
    home, db = work / f"{name}-home", work / f"{name}-home" / "usage.db"
    (home / "models").mkdir(parents=True, exist_ok=True)
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("INFER_")}
    env.update(INFER_HOME=str(home), INFER_MODELS=str(models or home / "models"), INFER_DATABASE_URL=f"sqlite:///{db}",
               INFER_KEEP_ALIVE="-1")
    if source is not None:
        env["PYTHONPATH"] = str(source)
    proc = procs.start([*infer_command(), "serve", "--config", str(config), "--host", f"127.0.0.1:{port}"],
                       work / f"{name}-serve.log", f"http://127.0.0.1:{port}/", env)
    side = Side(name, f"http://127.0.0.1:{port}", "fast-openai", proc.pid)
    if variant == "keyed":
        side.headers = {"Authorization": f"Bearer {create_bench_key(db)}"}
    return side, proc, db


def create_bench_key(db: Path) -> str:
    """A key with a budget no benchmark reaches, in the (already migrated) ledger of a running server."""
    key = subprocess.run([*infer_command(), "keys", "create", "bench", "--budget-usd", "1000000", "--db",
                          f"sqlite:///{db}"], capture_output=True, text=True, check=True).stdout
    return next(word for word in key.split() if word.startswith("sk-infer-"))


def ensure_litellm() -> Path | None:
    """``.bench/litellm-venv/bin/litellm``, installed on first use; None (with the reason printed) if it cannot be."""
    exe = LITELLM_VENV / "bin" / "litellm"
    if exe.exists():
        return exe
    print(f"installing LiteLLM's proxy into {LITELLM_VENV} (once) ...", flush=True)
    log = LITELLM_VENV.parent / "litellm-venv-install.log"
    LITELLM_VENV.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "wb") as out:
        ok = subprocess.call([sys.executable, "-m", "venv", "--clear", str(LITELLM_VENV)], stdout=out,
                             stderr=subprocess.STDOUT) == 0 and subprocess.call(
            [str(LITELLM_VENV / "bin" / "pip"), "install", "-q", "litellm[proxy]"], stdout=out,
            stderr=subprocess.STDOUT) == 0
    if ok and exe.exists():
        return exe
    print(f"LiteLLM could not be installed; its side is skipped (see {log}):\n{_tail(log, 10)}", flush=True)
    return None


def start_litellm(procs: Processes, work: Path, fast: Side, exe: Path) -> Side:
    config = work / "litellm-config.yaml"
    config.write_text(yaml.safe_dump({"model_list": [{"model_name": "fast", "litellm_params": {
        "model": "openai/fast", "api_base": fast.url + "/v1", "api_key": "none"}}]}))
    port = free_port()
    env = {**os.environ, "LITELLM_MASTER_KEY": MASTER_KEY,
           "LITELLM_LOCAL_MODEL_COST_MAP": "True"}  # offline: no price-map download at start
    proc = procs.start([str(exe), "--config", str(config), "--port", str(port), "--host", "127.0.0.1"],
                       work / "litellm-proxy.log", f"http://127.0.0.1:{port}/health/liveliness", env, timeout=300)
    return Side("litellm", f"http://127.0.0.1:{port}", "fast", proc.pid,
                {"Authorization": f"Bearer {MASTER_KEY}"})


# ---------------------------------------------------------------- /proc readings


def cpu_seconds(pid: int | None) -> float:
    """User + system CPU seconds of a process (0 when gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLK
    except (OSError, IndexError, TypeError):
        return 0.0


def machine_busy_seconds() -> float:
    with open("/proc/stat") as f:
        user, nice, system, _idle, _iowait, irq, softirq, steal = (int(v) for v in f.readline().split()[1:9])
    return (user + nice + system + irq + softirq + steal) / CLK


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


class Noise:
    """Cores used by processes other than this client and its servers, between start() and stop()."""

    def __init__(self, pids: list[int | None]) -> None:
        self.pids = pids

    def _ours(self) -> float:
        return sum(cpu_seconds(p) for p in self.pids) + cpu_seconds(os.getpid())

    def start(self) -> None:
        self.t0, self.busy0, self.ours0 = time.perf_counter(), machine_busy_seconds(), self._ours()

    def stop(self) -> dict:
        wall = time.perf_counter() - self.t0
        busy, ours = machine_busy_seconds() - self.busy0, self._ours() - self.ours0
        return {"wall_s": wall, "others_cores": max(0.0, busy - ours) / wall, "ours_cores": ours / wall,
                "cores": os.cpu_count()}


# ---------------------------------------------------------------- one request


def chat_body(side: Side, stream: bool, chunks: int) -> dict:
    body = {"model": side.model, "messages": [{"role": "user", "content": "Say hello to the benchmark"}],
            "max_tokens": chunks, "stream": stream}
    if stream:
        body["stream_options"] = {"include_usage": True}
    return body


async def request(client: aiohttp.ClientSession, side: Side, stream: bool, chunks: int) -> float:
    """One complete chat completion; its latency in seconds. Raises on any error or incomplete answer."""
    body = chat_body(side, stream, chunks)
    st = time.perf_counter()
    async with client.post(side.url + "/v1/chat/completions", json=body, headers=side.headers) as resp:
        if resp.status != 200:
            raise RuntimeError(f"{side.name}: HTTP {resp.status}: {(await resp.read())[:200]!r}")
        if not stream:
            data = json.loads(await resp.read())
            if not data["choices"][0]["message"]["content"] or not data.get("usage"):
                raise RuntimeError(f"{side.name}: empty answer {data}")
            return time.perf_counter() - st
        contents, usage, done = 0, False, False
        async for line in resp.content:
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                done = True
                break
            event = json.loads(data)
            usage = usage or bool(event.get("usage"))
            contents += sum(1 for c in event.get("choices") or () if (c.get("delta") or {}).get("content"))
    if not done or not usage or contents != chunks:
        raise RuntimeError(f"{side.name}: incomplete stream (done={done}, usage={usage}, {contents}/{chunks} chunks)")
    return time.perf_counter() - st


# ---------------------------------------------------------------- the three measurements


def run_ns(pids: list[int | None]) -> int:
    """Nanoseconds the processes' threads have run (/proc/PID/task/*/schedstat), summed."""
    total = 0
    for pid in pids:
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
        except (OSError, TypeError):
            continue
        for tid in tasks:
            try:
                with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                    total += int(f.read().split()[0])
            except (OSError, ValueError, IndexError):
                pass
    return total


async def settle(pids: list[int | None], window_s: float = 0.002, quiet_ns: int = 50_000,
                 limit_s: float = 0.05) -> int:
    """Wait until the servers ran < ``quiet_ns`` within one ``window_s`` (at most ``limit_s``);
    returns the nanoseconds they ran meanwhile (their work after the last answer)."""
    start = last = run_ns(pids)
    deadline = time.perf_counter() + limit_s
    while time.perf_counter() < deadline:
        await asyncio.sleep(window_s)
        now = run_ns(pids)
        if now - last < quiet_ns:
            return now - start
        last = now
    return last - start


BLOCK_ROUNDS = 10  # c=1 rounds per gateway before the next gateway's turn


async def _timed(client, side: Side, mode: str, chunks: int, pids: list | None, after: dict) -> float:
    latency = await request(client, side, mode == "stream", chunks)
    if pids is not None:
        after[mode].setdefault(side.name, []).append(await settle(pids) / 1e6)
    return latency


async def latency_c1(client, sides: list[Side], chunks: int, rounds: int, warmup: int,
                     settled: bool = False, pairs: bool = True) -> dict:
    """{mode: {side: [seconds]}, "direct@G": ...}. ``pairs``: per gateway G, ``rounds`` rounds of (direct, G)
    per mode in blocks of :data:`BLOCK_ROUNDS`, gateways taking turns, ``direct@G`` holding direct's
    latencies of G's rounds; else every round has one request per side and mode, order rotated.
    ``settled``: each request also waits for the servers to go idle first (see :func:`settle`)."""
    direct, gateways = sides[0], sides[1:]
    for _ in range(warmup):
        for side in sides:
            for mode in MODES:
                await request(client, side, mode == "stream", chunks)
    pids = [s.pid for s in sides] if settled else None
    groups = [[direct, g] for g in gateways] if pairs else [sides]
    block_rounds = BLOCK_ROUNDS if pairs else rounds
    out: dict = {m: {s.name: [] for s in sides} for m in MODES}
    after: dict = {m: {} for m in MODES}
    cpu0 = {s.name: cpu_seconds(s.pid) for s in sides}
    done = 0
    while done < rounds:
        block = min(block_rounds, rounds - done)
        for group in groups:
            label = f"direct@{group[1].name}" if pairs else direct.name
            if pairs:  # the block's warm-up: the previous gateway's after-answer work lands here
                await request(client, group[1], False, chunks)
            for i in range(block):
                order = [(side, mode) for mode in MODES for side in group]
                k = (done + i) % len(order)
                for side, mode in order[k:] + order[:k]:
                    latency = await _timed(client, side, mode, chunks, pids, after)
                    out[mode].setdefault(label if side is direct else side.name, []).append(latency)
        done += block
    if pairs:
        for m in MODES:
            out[m][direct.name] = [x for g in gateways for x in out[m][f"direct@{g.name}"]]
    blocks = -(-rounds // block_rounds) if pairs else 0  # each gateway's warm-up requests, one per block
    requests = {s.name: rounds * len(MODES) * (len(groups) if s is direct else 1) + (0 if s is direct else blocks)
                for s in sides}
    out["cpu_ms_per_request"] = {s.name: (cpu_seconds(s.pid) - cpu0[s.name]) * 1e3 / requests[s.name]
                                 for s in sides}
    out["after_answer_cpu_ms"] = {m: {name: statistics.median(xs) for name, xs in after[m].items()} for m in MODES}
    return out


async def throughput(client, side: Side, stream: bool, chunks: int, concurrency: int, seconds: float) -> dict:
    """``concurrency`` workers send requests back to back for ``seconds``; completed requests per second."""
    deadline = time.perf_counter() + seconds
    done, errors, first_error = 0, 0, None

    async def worker() -> None:
        nonlocal done, errors, first_error
        while time.perf_counter() < deadline:
            try:
                await request(client, side, stream, chunks)
                done += 1
            except Exception as exc:  # counted, the run goes on
                errors += 1
                first_error = first_error or repr(exc)[:300]

    cpu0, st = cpu_seconds(side.pid), time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    wall, cpu = time.perf_counter() - st, cpu_seconds(side.pid) - cpu0
    return {"rps": done / wall, "requests": done, "errors": errors, "first_error": first_error,
            "server_cpu_ms_per_request": cpu * 1e3 / done if done else None}


async def throughput_rounds(client, sides: list[Side], chunks: int, concurrency: int, seconds: float,
                            rounds: int) -> dict:
    """{mode: {side: [per-round results]}}, sides alternated in a rotated order every round."""
    out: dict = {m: {s.name: [] for s in sides} for m in MODES}
    for i in range(rounds):
        for mode in MODES:
            order = sides[i % len(sides):] + sides[:i % len(sides)]
            for side in order:
                out[mode][side.name].append(await throughput(client, side, mode == "stream", chunks,
                                                             concurrency, seconds))
    return out


# ---------------------------------------------------------------- summaries


def summarize(lat: dict, tput: dict, sides: list[Side]) -> dict:
    names = [s.name for s in sides]
    out: dict = {}
    for mode in MODES:
        direct = lat[mode]["direct"]
        row: dict = {"c1_cpu_ms_per_request": lat["cpu_ms_per_request"]}
        for name in names:
            xs = lat[mode][name]
            row[name] = {"p50_ms": statistics.median(xs) * 1e3, "c1_cpu_ms_per_request": lat["cpu_ms_per_request"][name],
                         "p90_ms": statistics.quantiles(xs, n=10)[8] * 1e3, "n": len(xs)}
            if name in lat["after_answer_cpu_ms"][mode]:
                row[name]["after_answer_cpu_ms"] = lat["after_answer_cpu_ms"][mode][name]
            if name != "direct":
                own = lat[mode][f"direct@{name}"]  # direct's latencies in this gateway's rounds
                row[name]["added_ms"] = row[name]["p50_ms"] - statistics.median(own) * 1e3
                row[name]["added_paired_ms"] = statistics.median(a - b for a, b in zip(xs, own)) * 1e3
            rounds = tput[mode][name]
            row[name]["rps"] = statistics.median(r["rps"] for r in rounds)
            row[name]["rps_rounds"] = [round(r["rps"], 1) for r in rounds]
            row[name]["errors"] = sum(r["errors"] for r in rounds)
            cpu = [r["server_cpu_ms_per_request"] for r in rounds if r["server_cpu_ms_per_request"]]
            row[name]["server_cpu_ms_per_request"] = statistics.median(cpu) if cpu else None
        if "litellm" in row and "infer" in row:
            row["infer_over_litellm_rps"] = row["infer"]["rps"] / row["litellm"]["rps"]
        if "minimal" in row and "infer" in row:  # the gateway's own work, beyond its stack's floor
            row["infer_beyond_minimal_ms"] = row["infer"]["p50_ms"] - row["minimal"]["p50_ms"]
        out[mode] = row
    return out


def print_table(summary: dict, names: list[str], args) -> None:
    print(f"\n{args.chunks} content chunks per answer; c=1: median over {args.rounds} rounds per gateway, each "
          f"paired with direct (alternated); "
          f"c={args.concurrency}: median of {args.tput_rounds} rounds x {args.tput_seconds:g} s")
    head = f"  {'mode':10s} {'side':8s} {'c=1 p50 ms':>11s} {'p90 ms':>8s} {'added ms':>9s} {'paired':>8s} " \
           f"{'c=' + str(args.concurrency) + ' req/s':>11s} {'cpu ms/req':>10s} {'errors':>6s}"
    print(head)
    for mode in MODES:
        for name in names:
            r = summary[mode][name]
            added = f"{r['added_ms']:+9.2f} {r['added_paired_ms']:+8.2f}" if "added_ms" in r else f"{'':9s} {'':8s}"
            cpu = f"{r['server_cpu_ms_per_request']:10.2f}" if r["server_cpu_ms_per_request"] else f"{'':10s}"
            print(f"  {mode:10s} {name:8s} {r['p50_ms']:11.2f} {r['p90_ms']:8.2f} {added} {r['rps']:11.0f} {cpu} "
                  f"{r['errors']:6d}")
    c1 = summary[MODES[0]]["c1_cpu_ms_per_request"]
    print("  server CPU ms per request at c=1 (both modes): " + ", ".join(f"{k} {v:.2f}" for k, v in c1.items()))
    for mode in MODES:
        after = {name: summary[mode][name].get("after_answer_cpu_ms") for name in names}
        if any(v is not None for v in after.values()):
            print(f"  {mode}: servers' CPU ms after the answer, waited out before the next request (median): "
                  + ", ".join(f"{k} {v:.2f}" for k, v in after.items() if v is not None))
    print("\n  goals:")
    for mode in MODES:
        row = summary[mode]
        if "infer" in row:
            added = row["infer"]["added_ms"]
            print(f"    {mode:10s} infer added median latency {added:+.2f} ms (paired {row['infer']['added_paired_ms']:+.2f})"
                  f" vs goal <= 1.0 ms: {'met' if added <= 1.0 else f'MISSED by {added - 1.0:.2f} ms'}")
        if "infer_beyond_minimal_ms" in row:
            print(f"    {mode:10s} of which the bare uvicorn + aiohttp proxy adds {row['minimal']['added_ms']:+.2f} ms, "
                  f"infer's own work {row['infer_beyond_minimal_ms']:+.2f} ms")
        if "infer_over_litellm_rps" in row:
            ratio = row["infer_over_litellm_rps"]
            print(f"    {mode:10s} infer/litellm req/s at c={args.concurrency}: {ratio:.2f}x vs goal >= 3x: "
                  f"{'met' if ratio >= 3 else f'MISSED ({ratio / 3:.0%} of the goal)'}")


# ---------------------------------------------------------------- runs


def make_client(connections: int) -> aiohttp.ClientSession:
    """The load generator's HTTP client: aiohttp, as its CPU cost per request is a tenth of httpx's
    (0.16 vs 2.2 ms for a 16-chunk stream here), so the client does not eat the cores the servers need."""
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=connections),
                                 timeout=aiohttp.ClientTimeout(total=300, sock_connect=30))


async def overhead_run(args, sides: list[Side]) -> dict:
    noise = Noise([s.pid for s in sides])
    noise.start()
    async with make_client(args.concurrency + 8) as client:
        print(f"c=1: {args.rounds} rounds x {len(sides)} sides x 2 modes ...", flush=True)
        lat = await latency_c1(client, sides, args.chunks, args.rounds, args.warmup, args.settle)
        print(f"c={args.concurrency}: {args.tput_rounds} rounds x {len(sides)} sides x 2 modes x "
              f"{args.tput_seconds:g} s ...", flush=True)
        tput = await throughput_rounds(client, sides, args.chunks, args.concurrency, args.tput_seconds,
                                       args.tput_rounds)
    return {"summary": summarize(lat, tput, sides), "noise": noise.stop(),
            "latency_ms": {m: {k: [round(x * 1e3, 3) for x in v] for k, v in lat[m].items()} for m in MODES},
            "throughput": tput}


LOCAL_MODEL = "smollm2:135m"


def make_local_store(work: Path) -> Path:
    """A store with SmolLM2-135M-Instruct Q4_1 (``--local-load``)."""
    from registry.create import create_model
    from registry.modelfile import parse_modelfile
    from registry.names import parse_name
    from registry.realmodels import fetch_smollm2
    from registry.store import Store

    home = work / "local-store"
    create_model(Store(home / "models"), parse_name(LOCAL_MODEL), parse_modelfile(f"FROM {fetch_smollm2()}\n"), home)
    return home / "models"


async def decode_forever(side: Side, engine: str, streams: int, tokens: list[int]) -> None:
    """``streams`` streams of the local model, each restarted when it ends; ``tokens[0]`` counts what arrived."""
    body = {"model": LOCAL_MODEL, "prompt": "Tell me a long story.", "stream": True,
            "options": {"engine": engine, "num_predict": 1000, "ignore_eos": True}}

    async def one(session: aiohttp.ClientSession) -> None:
        while True:
            async with session.post(side.url + "/api/generate", json=body) as resp:
                async for line in resp.content:
                    if line.strip():
                        tokens[0] += 1

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None)) as session:
        await asyncio.gather(*(one(session) for _ in range(streams)))


async def local_load_run(args, fast: Side, gateways: list[Side]) -> dict:
    """Each gateway alone against direct, its local model decoding ``--local-streams`` streams meanwhile."""
    out = {}
    for side in gateways:
        tokens = [0]
        load = asyncio.ensure_future(decode_forever(side, args.local_load, args.local_streams, tokens))
        await asyncio.sleep(5.0)  # loaded, every stream decoding
        t0, n0 = time.perf_counter(), tokens[0]
        result = await overhead_run(args, [fast, side])
        result["local_tok_s"] = (tokens[0] - n0) / (time.perf_counter() - t0)
        load.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await load
        out[side.name] = result
    return out


async def soak_run(args, infer: Side) -> dict:
    """Streaming requests in waves of 1,000 (``--soak-concurrency`` at once); errors and RSS after each wave."""
    errors, first_errors, rss, sent = 0, [], [], 0
    noise = Noise([infer.pid])
    noise.start()
    async with make_client(args.soak_concurrency + 8) as client:
        while sent < args.soak_requests:
            wave = min(1000, args.soak_requests - sent)
            queue = iter(range(wave))

            async def worker() -> None:
                nonlocal errors
                for _ in queue:
                    try:
                        await request(client, infer, True, args.chunks)
                    except Exception as exc:  # counted, the run goes on
                        errors += 1
                        if len(first_errors) < 5:
                            first_errors.append(repr(exc)[:300])

            st = time.perf_counter()
            await asyncio.gather(*(worker() for _ in range(min(args.soak_concurrency, wave))))
            sent += wave
            rss.append({"requests": sent, "rss_kib": rss_kib(infer.pid), "wave_s": time.perf_counter() - st})
            print(f"  soak: {sent} requests, {errors} errors, infer RSS {rss[-1]['rss_kib'] / 1024:.1f} MiB, "
                  f"wave {rss[-1]['wave_s']:.1f} s", flush=True)
    return {"requests": sent, "errors": errors, "first_errors": first_errors, "rss": rss, "noise": noise.stop()}


COST_SIDES = ("infer", "priced", "keyed")


async def cost_run(args, sides: list[Side]) -> dict:
    noise = Noise([s.pid for s in sides])
    noise.start()
    async with make_client(8) as client:
        print(f"cost path, c=1: {args.rounds} rounds x {len(sides)} sides x 2 modes ...", flush=True)
        lat = await latency_c1(client, sides, args.chunks, args.rounds, args.warmup, args.settle, pairs=False)
    summary: dict = {}
    for mode in MODES:
        base = lat[mode]["infer"]
        row = {name: {"p50_ms": statistics.median(lat[mode][name]) * 1e3,
                      "p90_ms": statistics.quantiles(lat[mode][name], n=10)[8] * 1e3,
                      "c1_cpu_ms_per_request": lat["cpu_ms_per_request"][name]} for name in lat[mode]}
        for name in [n for n in lat[mode] if n not in ("direct", "infer")]:
            xs = lat[mode][name]
            row[name]["added_over_unpriced_ms"] = row[name]["p50_ms"] - row["infer"]["p50_ms"]
            row[name]["added_paired_ms"] = statistics.median(a - b for a, b in zip(xs, base)) * 1e3
        summary[mode] = row
    return {"summary": summary, "noise": noise.stop(),
            "latency_ms": {m: {k: [round(x * 1e3, 3) for x in v] for k, v in lat[m].items()} for m in MODES}}


def print_cost_table(result: dict, args) -> None:
    print(f"\ncost path: {args.chunks} content chunks; c=1 median over {args.rounds} rounds (sides alternated); "
          "infer = unpriced backend, priced = list prices, keyed = priced + an API key with a budget"
          + (", base-keyed = keyed on --baseline's code" if args.baseline else ""))
    print(f"  {'mode':10s} {'side':10s} {'c=1 p50 ms':>11s} {'p90 ms':>8s} {'added ms':>9s} {'paired':>8s} "
          f"{'cpu ms/req':>10s}")
    for mode in MODES:
        for name, r in result["summary"][mode].items():
            added = (f"{r['added_over_unpriced_ms']:+9.3f} {r['added_paired_ms']:+8.3f}" if "added_paired_ms" in r
                     else f"{'':9s} {'':8s}")
            print(f"  {mode:10s} {name:10s} {r['p50_ms']:11.2f} {r['p90_ms']:8.2f} {added} "
                  f"{r['c1_cpu_ms_per_request']:10.3f}")
    print("  (cpu ms/req: the server's CPU over both modes at c=1, per request)")
    print("\n  goal (issue 15): the cost path adds <= 0.1 ms median over the unpriced run:")
    for mode in MODES:
        for name in [n for n in result["summary"][mode] if n not in ("direct", "infer")]:
            added = result["summary"][mode][name]["added_paired_ms"]
            print(f"    {mode:10s} {name:10s} {added:+.3f} ms (paired median): "
                  f"{'met' if added <= 0.1 else f'MISSED by {added - 0.1:.3f} ms'}")


def count_ledger_rows(db: Path) -> int:
    with sqlite3.connect(db) as conn:
        return conn.execute("SELECT count(*) FROM requests").fetchone()[0]


def soak(args, procs: Processes, work: Path, fast: Side) -> dict:
    infer, proc, db = start_infer(procs, work, fast)
    result = run_async(soak_run(args, infer))
    st = time.perf_counter()
    result["exit_code"] = procs.stop(proc, timeout=60)
    result["shutdown_s"] = time.perf_counter() - st
    result["graceful"] = "Application shutdown complete" in (work / "infer-serve.log").read_text(errors="replace")
    result["ledger_rows"] = count_ledger_rows(db)
    first = next((r["rss_kib"] for r in result["rss"] if r["requests"] >= 1000), None)
    result["rss_growth"] = result["rss"][-1]["rss_kib"] / first - 1 if first else None
    print(f"\nsoak ({result['requests']} streaming requests through infer serve, {args.soak_concurrency} concurrent, "
          f"{args.chunks} chunks; others used {result['noise']['others_cores']:.2f} cores):")
    print(f"  errors: {result['errors']} (goal 0){'  first: ' + result['first_errors'][0] if result['errors'] else ''}")
    print(f"  ledger rows after SIGTERM: {result['ledger_rows']} for {result['requests']} requests "
          f"(goal: equal); shutdown {result['shutdown_s']:.1f} s, "
          f"{'graceful' if result['graceful'] else 'NOT graceful'} (exit code {result['exit_code']}: uvicorn re-raises "
          f"the SIGTERM it handled)")
    if first:
        print(f"  RSS after 1,000: {first / 1024:.1f} MiB, after {result['requests']:,}: "
              f"{result['rss'][-1]['rss_kib'] / 1024:.1f} MiB ({result['rss_growth']:+.1%}; goal within 10 %)")
    return result


def run_async(coro):
    try:
        import uvloop
        factory = uvloop.new_event_loop
    except ImportError:
        factory = None
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(coro)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=250, help="c=1 rounds (one request per side and mode each)")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--chunks", type=int, default=16, help="content chunks (max_tokens) per answer")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--tput-seconds", type=float, default=3.0)
    parser.add_argument("--tput-rounds", type=int, default=3)
    parser.add_argument("--no-litellm", action="store_true", help="skip LiteLLM's proxy")
    parser.add_argument("--settle", action="store_true", help="c=1: before each request wait for every server "
                        "to go idle, and report the CPU each ran after its answer")
    parser.add_argument("--no-minimal", action="store_true", help="skip the bare uvicorn + aiohttp reference proxy")
    parser.add_argument("--soak", action="store_true", help="run the soak test instead")
    parser.add_argument("--local-load", choices=("native", "llamacpp"), help="gateway overhead while a local "
                        "model decodes (issue 27)")
    parser.add_argument("--local-streams", type=int, default=16)
    parser.add_argument("--cost", action="store_true", help="the cost path instead (issue 15): infer unpriced vs "
                        "a priced backend vs priced + an API key with a budget, c=1 only")
    parser.add_argument("--soak-requests", type=int, default=10_000)
    parser.add_argument("--soak-concurrency", type=int, default=500)
    parser.add_argument("--wait-idle", type=float, default=60, help="wait up to this many s for a quiet machine")
    parser.add_argument("--baseline", type=Path, metavar="DIR", help="one more side, 'base': infer serve from the "
                        "source tree DIR (e.g. `git archive <commit> | tar -x -C DIR`), to measure a change")
    parser.add_argument("--json", type=Path, help="write every figure here")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    procs = Processes()
    report: dict = {"config": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
                    "loadavg_at_start": open("/proc/loadavg").read().split()[:3]}
    if args.wait_idle > 0:
        report["others_cores_at_start"] = wait_idle(args.wait_idle)
    work = WORK / "run"  # the last run's configs, logs and ledger, kept for a look afterwards
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    try:
        fast = start_fast(procs, work, args.chunks)
        if args.soak:
            report["soak"] = soak(args, procs, work, fast)
        elif args.cost:
            sides = [fast] + [start_infer(procs, work, fast, variant)[0] for variant in COST_SIDES]
            if args.baseline:  # the keyed path of another source tree, in the same run
                sides.append(start_infer(procs, work, fast, "keyed", source=args.baseline, name="base-keyed")[0])
            report["cost"] = run_async(cost_run(args, sides))
            print_cost_table(report["cost"], args)
            n = report["cost"]["noise"]
            print(f"\n  noise: other processes used {n['others_cores']:.2f} of {n['cores']} cores during the "
                  f"{n['wall_s']:.0f} s run (this client and its servers: {n['ours_cores']:.2f})")
        elif args.local_load:
            models = make_local_store(work)
            gateways = [start_infer(procs, work, fast, models=models)[0]]
            if args.baseline:
                gateways.append(start_infer(procs, work, fast, "base", source=args.baseline, models=models)[0])
            report["local_load"] = run_async(local_load_run(args, fast, gateways))
            for side in gateways:
                result = report["local_load"][side.name]
                print(f"\n== {side.name}, its local model decoding {args.local_streams} streams on {args.local_load} "
                      f"({result['local_tok_s']:.0f} tok/s meanwhile)")
                print_table(result["summary"], [fast.name, side.name], args)
        else:
            sides = [fast] + ([] if args.no_minimal else [start_minimal(procs, work, fast)])
            sides.append(start_infer(procs, work, fast)[0])
            if args.baseline:
                sides.append(start_infer(procs, work, fast, "base", source=args.baseline)[0])
            exe = None if args.no_litellm else ensure_litellm()
            if exe:
                sides.append(start_litellm(procs, work, fast, exe))
            report["overhead"] = run_async(overhead_run(args, sides))
            print_table(report["overhead"]["summary"], [s.name for s in sides], args)
            n = report["overhead"]["noise"]
            print(f"\n  noise: other processes used {n['others_cores']:.2f} of {n['cores']} cores during the "
                  f"{n['wall_s']:.0f} s run (this client and its servers: {n['ours_cores']:.2f})")
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        raise SystemExit(130) from None
    finally:
        procs.stop_all()
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1))
        print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()
