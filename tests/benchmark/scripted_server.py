"""A scripted streaming LLM server on 127.0.0.1 whose timings and token counts are known.

Run as ``python -m tests.benchmark.scripted_server SCRIPT.json LOG.jsonl``; it prints its port on the
first stdout line. The script maps a request's index (the last group of its ``x-request-id``,
``00000000-0000-4000-8000-000000000007`` -> 7, taken modulo the number of entries) to ``{"ttft": s, "gaps": [s, ...], "chunk_tokens": [n, ...], "prompt_tokens": n,
"status": 200}`` (optional ``"ttft_per_inflight": s`` adds that much TTFT per other request in flight,
a server that slows under load; warm-up ids, first group ``ffffffff``, get a one-token answer): the first content chunk leaves ``ttft`` after the request arrived, each next one after
its gap (``len(gaps) == len(chunk_tokens) - 1``). Sleeps aim at absolute deadlines, so errors never add
up; the LOG gets one line per request with the arrival and the actual send time of every content chunk
(``time.perf_counter``, the system-wide monotonic clock), which the tests take as the truth.

Speaks OpenAI chat/completions SSE (one event per chunk, the role with the first, the finish reason
with the last, as vLLM; the usage chunk last when ``include_usage``, then ``[DONE]``) and Ollama chat/generate NDJSON (done line with ``prompt_eval_count``/``eval_count``), and
serves vLLM-named Prometheus counters on ``/metrics``.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time

_WARMUP = {"ttft": 0.01, "gaps": [], "chunk_tokens": [1], "prompt_tokens": 1}
_STATE = {"inflight": 0, "prompt_tokens": 0, "generation_tokens": 0, "requests": 0}


async def _read_request(reader: asyncio.StreamReader) -> tuple[str, dict, bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    _, path, _ = lines[0].split(" ", 2)
    headers = {k.strip().lower(): v.strip() for k, v in (ln.split(":", 1) for ln in lines[1:] if ":" in ln)}
    body = await reader.readexactly(int(headers.get("content-length", "0")))
    return path, headers, body


def _chunked(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


def _sse(obj: object) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def _frames(path: str, body: dict, tokens: int, index: int, *, final: bool = False, entry: dict) -> bytes:
    text = "tok " * tokens
    if path.startswith("/api/"):
        key = "message" if path == "/api/chat" else "response"
        value = {"role": "assistant", "content": text} if key == "message" else text
        line = {"model": body.get("model"), key: value, "done": False}
        out = json.dumps(line).encode() + b"\n"
        if final:
            done = {"model": body.get("model"), key: {"role": "assistant", "content": ""} if key == "message" else "",
                    "done": True, "prompt_eval_count": entry["prompt_tokens"], "eval_count": sum(entry["chunk_tokens"])}
            out += json.dumps(done).encode() + b"\n"
        return out
    chat = path == "/v1/chat/completions"
    delta = {"role": "assistant", "content": text} if index == 0 else {"content": text}
    choice = {"index": 0, "delta": delta} if chat else {"index": 0, "text": text}
    out = _sse({"id": "x", "choices": [{**choice, "finish_reason": "length" if final else None}]})
    if final:
        if (body.get("stream_options") or {}).get("include_usage"):
            usage = {"prompt_tokens": entry["prompt_tokens"], "completion_tokens": sum(entry["chunk_tokens"])}
            out += _sse({"id": "x", "choices": [], "usage": usage})
        out += b"data: [DONE]\n\n"
    return out


async def _handle(reader, writer, script: list[dict], log) -> None:
    """Serves requests on one connection until the client closes it (HTTP/1.1 keep-alive)."""
    try:
        while True:
            try:
                path, headers, raw = await _read_request(reader)
            except (asyncio.IncompleteReadError, ConnectionError):
                return
            arrival = time.perf_counter()
            await _respond(writer, path, headers, raw, arrival, script, log)
            await writer.drain()
    finally:
        writer.close()


async def _respond(writer, path: str, headers: dict, raw: bytes, arrival: float, script: list[dict], log) -> None:
    if path == "/metrics":
        text = (f"vllm:prompt_tokens_total {_STATE['prompt_tokens']}.0\n"
                f"vllm:generation_tokens_total {_STATE['generation_tokens']}.0\n"
                f"vllm:request_success_total {_STATE['requests']}.0\n").encode()
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\n"
                     + f"content-length: {len(text)}\r\n\r\n".encode() + text)
        return
    rid = headers.get("x-request-id", "00000000-0000-4000-8000-000000000000")
    point, *_, index = rid.split("-")
    entry = _WARMUP if point == "ffffffff" else script[int(index, 16) % len(script)]
    if entry.get("status", 200) != 200:
        msg = b'{"error":"scripted failure"}'
        writer.write(f"HTTP/1.1 {entry['status']} Internal Server Error\r\ncontent-length: {len(msg)}\r\n\r\n"
                     .encode() + msg)
        log.write(json.dumps({"id": rid, "arrival": arrival, "status": entry["status"]}) + "\n")
        log.flush()
        return
    await _stream(writer, path, json.loads(raw), entry, arrival, rid, log)


async def _stream(writer, path: str, body: dict, entry: dict, arrival: float, rid: str, log) -> None:
    kind = "application/x-ndjson" if path.startswith("/api/") else "text/event-stream"
    writer.write(f"HTTP/1.1 200 OK\r\ncontent-type: {kind}\r\ntransfer-encoding: chunked\r\n\r\n".encode())
    await writer.drain()
    _STATE["inflight"] += 1
    deadlines = [entry["ttft"] + entry.get("ttft_per_inflight", 0.0) * (_STATE["inflight"] - 1)]
    for gap in entry["gaps"]:
        deadlines.append(deadlines[-1] + gap)
    sends = []
    last = len(entry["chunk_tokens"]) - 1
    for i, (due, tokens) in enumerate(zip(deadlines, entry["chunk_tokens"])):
        await asyncio.sleep(max(0.0, arrival + due - time.perf_counter()))
        writer.write(_chunked(_frames(path, body, tokens, i, final=i == last, entry=entry)))
        await writer.drain()
        sends.append(time.perf_counter())
    writer.write(b"0\r\n\r\n")
    _STATE["inflight"] -= 1
    _STATE["prompt_tokens"] += entry["prompt_tokens"]
    _STATE["generation_tokens"] += sum(entry["chunk_tokens"])
    _STATE["requests"] += 1
    log.write(json.dumps({"id": rid, "arrival": arrival, "sends": sends, "status": 200,
                          "prompt_tokens": entry["prompt_tokens"], "completion_tokens": sum(entry["chunk_tokens"])}) + "\n")
    log.flush()


async def main(script_path: str, log_path: str) -> None:
    script = json.loads(open(script_path).read())
    with open(log_path, "a") as log:
        server = await asyncio.start_server(lambda r, w: _handle(r, w, script, log), "127.0.0.1", 0)
        print(server.sockets[0].getsockname()[1], flush=True)
        async with server:
            await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
