"""What the Messages and Responses translations add to a request: the same fake backend through
``/v1/chat/completions`` (the reference), ``/v1/messages`` and ``/v1/responses``, in one run.

    .venv/bin/python bench/agent_apis.py [--rounds 300] [--chunks 16] [--json PATH]
    flock /tmp/infer-heavy.lock .venv/bin/python bench/agent_apis.py     # on a shared machine

One ``infer serve`` in front of ``bench/fast_openai_server.py`` (canned answers, a few microseconds each);
one client (aiohttp, concurrency 1) sends, per round, one request to each endpoint in each mode (one
JSON answer, a stream), the order rotated every round so drift hits every endpoint alike. Every answer
is checked (text, usage, the final event). Endpoints: ``chat``, ``messages``, ``responses`` with
``store: false`` (the translation alone) and ``responses+store`` (plus saving the response and its
conversation in the ledger database, for ``previous_response_id``).

Prints each endpoint's median latency, its difference from chat's (the added latency, goal <= 0.3 ms)
and the ratio, per mode, and the machine's load average.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gateway_overhead import Processes, Side, start_fast, start_infer  # noqa: E402

GOAL_MS = 0.3
PROMPT = "Say hello to the benchmark"
MODES = ("json", "stream")
ENDPOINTS = ("chat", "messages", "responses", "responses+store")


def body(endpoint: str, model: str, stream: bool, chunks: int) -> tuple[str, dict]:
    if endpoint == "chat":
        out = {"model": model, "messages": [{"role": "user", "content": PROMPT}], "max_tokens": chunks,
               "stream": stream}
        if stream:
            out["stream_options"] = {"include_usage": True}
        return "/v1/chat/completions", out
    if endpoint == "messages":
        return "/v1/messages", {"model": model, "max_tokens": chunks, "stream": stream,
                                "messages": [{"role": "user", "content": PROMPT}]}
    return "/v1/responses", {"model": model, "input": PROMPT, "max_output_tokens": chunks, "stream": stream,
                             "store": endpoint == "responses+store"}


async def request(client: aiohttp.ClientSession, side: Side, endpoint: str, stream: bool, chunks: int) -> float:
    """One complete answer; its latency in seconds. Raises on an error or an incomplete answer."""
    path, payload = body(endpoint, side.model, stream, chunks)
    start = time.perf_counter()
    async with client.post(side.url + path, json=payload) as resp:
        raw = await resp.read()
    elapsed = time.perf_counter() - start
    if resp.status != 200:
        raise RuntimeError(f"{endpoint}: HTTP {resp.status}: {raw[:200]!r}")
    text = _text(endpoint, raw, stream)
    if text != " tok" * chunks:
        raise RuntimeError(f"{endpoint}: incomplete answer {text!r}")
    return elapsed


def _text(endpoint: str, raw: bytes, stream: bool) -> str:
    if not stream:
        data = json.loads(raw)
        if endpoint == "chat":
            return data["choices"][0]["message"]["content"]
        if endpoint == "messages":
            return data["content"][0]["text"]
        return data["output"][0]["content"][0]["text"]
    events = [json.loads(line[5:]) for line in raw.decode().splitlines()
              if line.startswith("data:") and line[5:].strip() != "[DONE]"]
    if endpoint == "chat":
        return "".join((c.get("delta") or {}).get("content") or "" for e in events for c in e.get("choices") or ())
    if endpoint == "messages":
        assert events[-1]["type"] == "message_stop", events[-1]
        return "".join(e["delta"].get("text", "") for e in events if e["type"] == "content_block_delta")
    assert events[-1]["type"] in ("response.completed", "response.incomplete"), events[-1]
    return "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")


async def measure(side: Side, rounds: int, warmup: int, chunks: int) -> dict[str, dict[str, list[float]]]:
    pairs = [(e, m) for e in ENDPOINTS for m in MODES]
    out: dict[str, dict[str, list[float]]] = {m: {e: [] for e in ENDPOINTS} for m in MODES}
    connector = aiohttp.TCPConnector(limit=1)
    async with aiohttp.ClientSession(connector=connector) as client:
        for _ in range(warmup):
            for endpoint, mode in pairs:
                await request(client, side, endpoint, mode == "stream", chunks)
        for i in range(rounds):
            k = i % len(pairs)
            for endpoint, mode in pairs[k:] + pairs[:k]:
                out[mode][endpoint].append(await request(client, side, endpoint, mode == "stream", chunks))
    return out


def report(results: dict[str, dict[str, list[float]]]) -> dict:
    summary: dict = {}
    for mode, by_endpoint in results.items():
        reference = statistics.median(by_endpoint["chat"]) * 1000
        rows = {}
        for endpoint, xs in by_endpoint.items():
            median = statistics.median(xs) * 1000
            rows[endpoint] = {"median_ms": median, "added_ms": median - reference, "ratio": median / reference}
        summary[mode] = rows
    return summary


def print_table(summary: dict, rounds: int, load: tuple[float, float, float]) -> None:
    print(f"\n{rounds} rounds per endpoint and mode, concurrency 1; load average before: "
          f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f} ({os.cpu_count()} cores)")
    for mode, rows in summary.items():
        print(f"  {mode}:")
        for endpoint, row in rows.items():
            verdict = "" if endpoint == "chat" else (
                f"   goal <= {GOAL_MS} ms: {'met' if row['added_ms'] <= GOAL_MS else 'MISSED'}"
                if endpoint != "responses+store" else "   (store: a ledger write, not translation)")
            print(f"    {endpoint:16s} median {row['median_ms']:7.3f} ms   added {row['added_ms']:+7.3f} ms   "
                  f"x{row['ratio']:.3f} of chat{verdict}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--chunks", type=int, default=16)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    load = os.getloadavg()
    procs = Processes()
    try:
        with tempfile.TemporaryDirectory(prefix="agent-apis-") as tmp:
            work = Path(tmp)
            fast = start_fast(procs, work, args.chunks)
            infer, _, _ = start_infer(procs, work, fast)
            results = asyncio.run(measure(infer, args.rounds, args.warmup, args.chunks))
    finally:
        procs.stop_all()
    summary = report(results)
    print_table(summary, args.rounds, load)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"rounds": args.rounds, "chunks": args.chunks, "load_average": load,
                                         "summary": summary}, indent=2))


if __name__ == "__main__":
    main()
