"""Issue 40's figures against one `infer serve`: event-loop stalls, memory and spend under a hostile
caller and a backend that ignores ``max_tokens``. Run it against two checkouts for before/after:

    flock /tmp/infer-heavy.lock .venv/bin/python bench/hostile.py --root /work/main   # before
    flock /tmp/infer-heavy.lock .venv/bin/python bench/hostile.py --root .            # after

``--root`` is the source tree whose gateway is started (``python -P -m cli serve`` with the tree first
on ``PYTHONPATH``); the fake backend and this client always come from this checkout. The server serves
a tiny local model (``tiny``, built once under ``.bench/hostile``, GGUF Jinja template, and ``tiny-go``,
whose Go template has no tools) and ``priced``, a fake vLLM (``fakes/``) that generates
``--ignored`` tokens whatever ``max_tokens`` says, priced $1000/Mtok in and out.

Measured:
- stall: a thread GETs ``/health`` every 10 ms while one hostile request runs; p50/p99/max of those
  latencies, and the request's status and seconds. Requests: ``/v1/messages/count_tokens`` of 10,000
  messages (3.6 and 7.4 MB) and 30,000 (10.8 MB), ``/v1/chat/completions`` with 10,000 tools (2.8 MB)
  and 512 for ``tiny-go`` (no tool support);
- RSS of the server after a small warm-up request (the tiny vocabulary cached) and 3 s after the last
  hostile request (MB);
- spend: a key with ``--budget-usd 10`` sends 20 concurrent requests (streaming and not, OpenAI chat,
  Ollama chat and generate, Anthropic messages, Responses), each asking for 100 tokens (so all 20 are
  admitted: a hold of about $0.25 each) and getting ``--ignored``: spent vs budget; a key with
  ``--max-tokens 10`` and no limit in the requests: the most tokens one answer carried (usage as each
  API reports it);
- slow consumers: 10 clients stream a ``--ignored``-token answer, read 30 events and hang up: their
  rows' statuses and median output tokens.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from fakes import start_server as start_fake  # noqa: E402
from fakes.behaviour import Behaviour  # noqa: E402
from fakes.live import free_port  # noqa: E402

PRICE = {"input_per_mtok": 1000.0, "output_per_mtok": 1000.0}
CHAT = [{"role": "user", "content": "tell me a story"}]


def build_store(root: Path) -> Path:
    """``tiny`` and ``tiny-go`` as the tests build them (fakes/models.py), cached."""
    models = root / "models"
    if (models / "manifests").exists():
        return models
    from fakes.models import install_tiny_models

    install_tiny_models(root)
    return models



def start_gateway(source: Path, work: Path, models: Path, fake_url: str, fake_model: str):
    import yaml

    port = free_port()
    config = work / "config.yaml"
    config.write_text(yaml.safe_dump({"backends": [{"name": "priced", "type": "vllm", "base_url": fake_url,
                                                    "model": fake_model, "pricing": PRICE}]}))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("INFER_", "OLLAMA_"))}
    env.update(INFER_HOME=str(work / "home"), INFER_MODELS=str(models), INFER_HOST=f"127.0.0.1:{port}",
               INFER_CONFIG=str(config), PYTHONPATH=str(source))
    log = open(work / "server.log", "wb")
    proc = subprocess.Popen([sys.executable, "-P", "-m", "cli", "serve", "--log-level", "warning"], env=env,
                            stdout=log, stderr=subprocess.STDOUT, cwd=work)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return proc, url, f"sqlite:///{work / 'home' / 'usage.db'}", env
        except httpx.TransportError:
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError((work / "server.log").read_text())


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e6


def health_while(url: str, send) -> dict:
    """``send()`` in this thread while another polls /health every 10 ms."""
    latencies: list[float] = []
    done = threading.Event()

    def poll() -> None:
        with httpx.Client(timeout=120) as client:
            while not done.is_set():
                t0 = time.perf_counter()
                client.get(url + "/health")
                latencies.append((time.perf_counter() - t0) * 1000)
                time.sleep(0.01)

    poller = threading.Thread(target=poll)
    poller.start()
    time.sleep(0.2)
    t0 = time.perf_counter()
    status, note = send()
    seconds = time.perf_counter() - t0
    done.set()
    poller.join()
    ordered = sorted(latencies)
    return {"status": status, "note": note[:160], "seconds": round(seconds, 3),
            "health_p50_ms": round(statistics.median(ordered), 1),
            "health_p99_ms": round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))], 1),
            "health_max_ms": round(ordered[-1], 1), "health_samples": len(ordered)}


def long_history(n: int, size: int) -> list[dict]:
    text = "word " * (size // 5)
    return [{"role": "user" if i % 2 == 0 else "assistant", "content": f"{i} {text}"} for i in range(n)]


def hostile_requests() -> dict[str, tuple[str, dict]]:
    tools = [{"type": "function", "function": {"name": f"tool_{i}", "description": "does a thing " * 8,
                                               "parameters": {"type": "object", "properties": {
                                                   "x": {"type": "string", "description": "the input"}}}}}
             for i in range(10_000)]
    return {
        "count_tokens_10k_msgs": ("/v1/messages/count_tokens",
                                  {"model": "tiny", "messages": long_history(10_000, 320)}),
        "count_tokens_10k_msgs_7MB": ("/v1/messages/count_tokens",
                                      {"model": "tiny", "messages": long_history(10_000, 700)}),
        "count_tokens_30k_msgs_10MB": ("/v1/messages/count_tokens",
                                       {"model": "tiny", "messages": long_history(30_000, 320)}),
        "chat_512_tools_no_tool_support": ("/v1/chat/completions",
                                           {"model": "tiny-go", "messages": CHAT, "tools": tools[:512],
                                            "max_tokens": 4}),
        "chat_10k_tools_no_tool_support": ("/v1/chat/completions",
                                           {"model": "tiny-go", "messages": CHAT, "tools": tools, "max_tokens": 4}),
    }


def stalls(url: str) -> dict:
    out = {}
    with httpx.Client(timeout=300) as client:
        for name, (path, body) in hostile_requests().items():
            data = json.dumps(body).encode()

            def send(path=path, data=data):
                r = client.post(url + path, content=data, headers={"content-type": "application/json"})
                return r.status_code, r.text
            out[name] = {"body_mb": round(len(data) / 1e6, 2), **health_while(url, send)}
    return out


def new_key(env: dict, db: str, *args: str) -> str:
    done = subprocess.run([sys.executable, "-P", "-m", "cli", "keys", "create", *args, "--db", db], env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


CALLS = [("/v1/chat/completions", {"model": "priced", "messages": CHAT}),
         ("/api/chat", {"model": "priced", "messages": CHAT}),
         ("/v1/messages", {"model": "priced", "messages": CHAT, "max_tokens": 4096}),
         ("/v1/responses", {"model": "priced", "input": "tell me a story"}),
         ("/api/generate", {"model": "priced", "prompt": "once upon a time"})]


def asking(path: str, body: dict, n: int) -> dict:
    """``body`` asking for at most ``n`` tokens, in its API's words."""
    if path == "/v1/responses":
        return {**body, "max_output_tokens": n}
    if path.startswith("/api/"):
        return {**body, "options": {"num_predict": n}}
    return {**body, "max_tokens": n}


def output_tokens(path: str, response: httpx.Response, stream: bool) -> int:
    """The answer's output tokens as the API reports them (the last usage seen on a stream)."""
    objects = [response.json()] if not stream else [
        json.loads(line.removeprefix("data: ")) for line in response.text.splitlines()
        if line.removeprefix("data: ").startswith("{")]
    found = 0
    for obj in objects:
        inner = [obj.get(k) for k in ("response", "message")]
        usage = obj.get("usage") or next((i["usage"] for i in inner if isinstance(i, dict) and i.get("usage")), {})
        found = usage.get("completion_tokens") or usage.get("output_tokens") or obj.get("eval_count") or found
    return found


def spend(url: str, env: dict, db: str) -> dict:
    budget = 10.0
    key = new_key(env, db, "bench-budget", "--budget-usd", str(budget))
    ten = new_key(env, db, "bench-ten", "--max-tokens", "10")
    calls = [(path, {**body, "stream": stream}) for path, body in CALLS for stream in (True, False)]

    async def burst(key: str, jobs: list) -> list:
        async with httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_connections=len(jobs))) as client:
            return await asyncio.gather(*(client.post(url + p, json=b, headers={"Authorization": f"Bearer {key}"})
                                          for p, b in jobs))
    jobs = [(path, asking(path, body, 100)) for path, body in (calls * 2)[:20]]
    answers = asyncio.run(burst(key, jobs))
    tens = asyncio.run(burst(ten, calls))
    time.sleep(2)
    import sqlalchemy as sa

    engine = sa.create_engine(db)
    with engine.connect() as conn:
        spent = conn.execute(sa.text("SELECT spent_usd FROM api_keys WHERE name = 'bench-budget'")).scalar()
    engine.dispose()
    most = max(output_tokens(p, r, b["stream"]) for (p, b), r in zip(calls, tens))
    return {"budget_usd": budget, "spent_usd": round(spent, 4), "codes": sorted({r.status_code for r in answers}),
            "max_tokens_10_key_most_tokens": most}


def slow_consumers(url: str, db: str) -> dict:
    """10 clients stream an answer of ``--ignored`` tokens, read 30 events (about 1 %) and hang up, at once."""
    def one(i: int) -> None:
        body = {"model": "priced", "messages": CHAT, "stream": True}
        with httpx.Client(timeout=60) as client, client.stream(
                "POST", url + "/v1/chat/completions", json=body, headers={"User-Agent": f"bench-slow-{i}"}) as r:
            seen = 0
            for line in r.iter_lines():
                seen += line.startswith("data:")
                if seen >= 30:
                    break
    threads = [threading.Thread(target=one, args=(i,)) for i in range(10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    time.sleep(3)
    import sqlalchemy as sa

    engine = sa.create_engine(db)
    with engine.connect() as conn:
        rows = conn.execute(sa.text("SELECT status, output_tokens FROM requests WHERE client LIKE 'bench-slow-%'")).all()
    engine.dispose()
    return {"rows": len(rows), "statuses": sorted({s for s, _ in rows}),
            "output_tokens_median": statistics.median(t for _, t in rows) if rows else None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--root", type=Path, default=REPO, help="the source tree whose gateway runs")
    parser.add_argument("--ignored", type=int, default=3000, help="tokens the fake backend generates")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    cache = REPO / ".bench" / "hostile"
    cache.mkdir(parents=True, exist_ok=True)
    models = build_store(cache.resolve())
    work = cache / f"run-{os.getpid()}"
    work.mkdir()
    fake = start_fake("vllm", Behaviour(ignore_max_tokens=args.ignored))
    proc, url, db, env = start_gateway(args.root.resolve(), work, models, fake.url, fake.behaviour.models[0])
    try:
        warm = {"model": "tiny", "messages": long_history(10, 320)}  # the vocabulary is loaded and cached once
        httpx.post(url + "/v1/messages/count_tokens", json=warm, timeout=60).raise_for_status()
        httpx.post(url + "/v1/chat/completions", json={"model": "tiny-go", "messages": CHAT, "max_tokens": 1},
                   timeout=60).raise_for_status()  # its runner started
        before = rss_mb(proc.pid)
        result = {"root": str(args.root.resolve()), "stalls": stalls(url)}
        print(json.dumps(result, indent=2), flush=True)
        time.sleep(3)
        result["rss_mb"] = {"before": round(before, 1), "after": round(rss_mb(proc.pid), 1)}
        result["spend"] = spend(url, env, db)
        print(json.dumps(result["spend"]), flush=True)
        result["slow_consumers"] = slow_consumers(url, db)
    finally:
        proc.terminate()
        proc.wait(timeout=20)
        fake.stop()
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
