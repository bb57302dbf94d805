"""What ``infer bench``'s HTTP client adds to every TTFT and ITL it measures, against raw asyncio
streams (the floor), aiohttp (what vLLM's benchmark uses) and httpx, all in one run.

    flock /tmp/infer-heavy.lock .venv/bin/python bench/client_overhead.py --rounds 5

The server is the scripted one (``tests/benchmark/scripted_server.py``, a subprocess): it logs when
each request arrived and when it sent each chunk, on the machine's monotonic clock, which the client's
``time.perf_counter`` shares. Each request gets ``/v1/completions`` streamed: the first chunk 20 ms after
arrival, then 9 more 10 ms apart. Per request, one side at a time, the sides interleaved per round:

- ``send``: server arrival - client start (the client's cost before the request is on the wire);
- ``first``: client sees chunk 1 - server sent it (its cost on the way back);
- ``ttft over``: client TTFT - server TTFT = send + first;
- ``itl error``: mean |client gap - server gap| over the request's 9 gaps.

Sides: ``infer bench`` (``benchmark.runner.run_point``, one request at a time on one kept connection:
the client the benchmark really uses, timed by its own records), ``raw`` (one POST written on an open
asyncio stream), ``aiohttp`` (a ``ClientSession``, lines from ``response.content``), ``httpx`` (an
``AsyncClient``, ``aiter_lines``). The first request of each side and round opens the connection and
is left out. Reported: medians over every request of a side, in ms.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp
import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmark.clients import Endpoint  # noqa: E402
from benchmark.metrics import chunk_times  # noqa: E402
from benchmark.records import BenchRequest  # noqa: E402
from benchmark.runner import LoadPoint, request_id, run_point  # noqa: E402

CHUNKS = 10
SCRIPT = [{"ttft": 0.02, "gaps": [0.01] * (CHUNKS - 1), "chunk_tokens": [1] * CHUNKS, "prompt_tokens": 8}]
SIDES = ("infer bench", "raw", "aiohttp", "httpx")
Timed = tuple[float, list[float]]  # (start, the content chunks' arrival times)
Sender = Callable[[str, int], Awaitable[Timed]]


def start_server(tmp: Path) -> tuple[subprocess.Popen, str, Path]:
    script, log = tmp / "script.json", tmp / "log.jsonl"
    script.write_text(json.dumps(SCRIPT))
    proc = subprocess.Popen([sys.executable, "-m", "tests.benchmark.scripted_server", str(script), str(log)],
                            cwd=ROOT, stdout=subprocess.PIPE, text=True)
    return proc, f"http://127.0.0.1:{int(proc.stdout.readline())}", log


def body(rid: str) -> bytes:
    return json.dumps({"model": "m", "prompt": "x", "max_tokens": CHUNKS, "stream": True,
                       "stream_options": {"include_usage": True}, "x": rid}).encode()


def is_content(line: str) -> bool:
    return line.startswith("data: {") and '"text": "tok' in line


async def bench_side(url: str, point: int, n: int) -> list[tuple[str, Timed]]:
    """The benchmark's own client and timing: one load point of ``n`` requests, one at a time."""
    requests = [BenchRequest("x", 8, CHUNKS)] * n
    run = await run_point(Endpoint(url, "m", "openai-completions"), requests,
                          LoadPoint("synchronous", max_concurrency=1), point_index=point)
    return [(r.request_id, (r.start_time, chunk_times(r))) for r in run.records if r.success]


async def raw_side(url: str, point: int, n: int) -> list[tuple[str, Timed]]:
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    out = []
    for i in range(n):
        rid = request_id(point, i)
        data = body(rid)
        head = (f"POST /v1/completions HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/json\r\n"
                f"x-request-id: {rid}\r\ncontent-length: {len(data)}\r\n\r\n").encode()
        start = time.perf_counter()
        writer.write(head + data)
        times = []
        while (line := await reader.readline()) != b"0\r\n":  # chunked: sizes, frames, the last chunk
            if is_content(line.decode()):
                times.append(time.perf_counter())
        await reader.readline()
        out.append((rid, (start, times)))
    writer.close()
    return out


async def aiohttp_side(url: str, point: int, n: int) -> list[tuple[str, Timed]]:
    out = []
    async with aiohttp.ClientSession() as session:
        for i in range(n):
            rid = request_id(point, i)
            start = time.perf_counter()
            async with session.post(url + "/v1/completions", data=body(rid), headers={"x-request-id": rid}) as resp:
                times = [time.perf_counter() async for line in resp.content if is_content(line.decode())]
            out.append((rid, (start, times)))
    return out


async def httpx_side(url: str, point: int, n: int) -> list[tuple[str, Timed]]:
    out = []
    async with httpx.AsyncClient() as client:
        for i in range(n):
            rid = request_id(point, i)
            start = time.perf_counter()
            async with client.stream("POST", url + "/v1/completions", content=body(rid),
                                     headers={"x-request-id": rid}) as resp:
                times = [time.perf_counter() async for line in resp.aiter_lines() if is_content(line)]
            out.append((rid, (start, times)))
    return out


RUNNERS = {"infer bench": bench_side, "raw": raw_side, "aiohttp": aiohttp_side, "httpx": httpx_side}


def measure(timed: list[tuple[str, Timed]], truth: dict[str, dict]) -> list[dict[str, float]]:
    rows = []
    for rid, (start, times) in timed[1:]:  # the first request opened the connection
        row = truth[rid]
        sends = row["sends"]
        assert len(times) == len(sends), f"{rid}: {len(times)} chunks seen, {len(sends)} sent"
        gaps = [abs((b - a) - (d - c)) for a, b, c, d in zip(times, times[1:], sends, sends[1:])]
        rows.append({"send": row["arrival"] - start, "first": times[0] - sends[0],
                     "ttft over": (times[0] - start) - (sends[0] - row["arrival"]), "itl error": statistics.mean(gaps)})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=21, help="per side and round (the first is left out)")
    args = parser.parse_args()
    found: dict[str, list[dict[str, float]]] = {side: [] for side in SIDES}
    with tempfile.TemporaryDirectory() as tmp:
        proc, url, log = start_server(Path(tmp))
        try:
            for r in range(args.rounds):
                order = SIDES if r % 2 == 0 else SIDES[::-1]
                timed = {side: asyncio.run(RUNNERS[side](url, r * len(SIDES) + SIDES.index(side), args.requests))
                         for side in order}
                time.sleep(0.2)  # the server's last log lines
                truth = {row["id"]: row for row in map(json.loads, log.read_text().splitlines())}
                for side in SIDES:
                    found[side] += measure(timed[side], truth)
        finally:
            proc.terminate()
            proc.wait(timeout=10)
    keys = ("send", "first", "ttft over", "itl error")
    print(f"{args.rounds} rounds x {args.requests - 1} requests per side; medians in ms (client - server clock)")
    print(f"{'side':12}" + "".join(f"{k:>11}" for k in keys))
    for side in SIDES:
        print(f"{side:12}" + "".join(f"{statistics.median(row[k] for row in found[side]) * 1000:11.3f}" for k in keys))


if __name__ == "__main__":
    main()
