"""The README's `strategy: prefix` example: three queueing fakes with a prefix cache behind one
`prefix` route, three conversations of three turns (two share a system prompt), then `infer usage`
and each backend's prefix view in `GET /infer/routes`.

    .venv/bin/python scripts/prefix_example.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fakes.live import free_port  # noqa: E402
from fakes.queueing import QueueModel, start_queueing  # noqa: E402

SUPPORT = " ".join(f"policy{i}" for i in range(800))   # an 800-token system prompt
SALES = " ".join(f"catalog{i}" for i in range(800))


def converse(url: str, system: str, opening: str) -> None:
    messages = [{"role": "system", "content": system}, {"role": "user", "content": opening}]
    for turn in range(3):
        reply = httpx.post(url + "/v1/chat/completions", json={"model": "chat", "messages": messages,
                                                               "max_tokens": 8}, timeout=30).json()
        messages += [reply["choices"][0]["message"], {"role": "user", "content": f"and then, step {turn}?"}]


def main() -> None:
    fakes = [start_queueing(QueueModel(batch_limit=8, prefill_tok_s=2000, tpot_base_ms=10, tpot_slope_ms=1,
                                       prefix_cache_tokens=40_000, model="qwen")) for _ in range(3)]
    home, port = Path(tempfile.mkdtemp(prefix="infer-prefix-")), free_port()
    config = {"backends": [{"name": f"vllm-{c}", "type": "vllm", "base_url": f.url, "model": "qwen"}
                           for c, f in zip("abc", fakes)],
              "routes": [{"name": "chat", "backends": ["vllm-a", "vllm-b", "vllm-c"], "strategy": "prefix"}]}
    (home / "routes.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    env = dict(os.environ, INFER_HOME=str(home), INFER_HOST=f"127.0.0.1:{port}", INFER_CONFIG=str(home / "routes.yaml"))
    server = subprocess.Popen([sys.executable, "-m", "cli", "serve", "--log-level", "warning"], env=env, cwd=ROOT)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(150):
            try:
                httpx.get(url + "/")
                break
            except httpx.HTTPError:
                time.sleep(0.2)
        converse(url, SUPPORT, "my order is late")
        converse(url, SALES, "which plan fits a team of five?")
        converse(url, SUPPORT, "how do I reset my password?")
        time.sleep(1.0)  # the ledger writer's batch
        subprocess.run([sys.executable, "-m", "cli", "usage", "-n", "9"], cwd=ROOT, env=env, check=True)
        view = next(r for r in httpx.get(url + "/infer/routes").json()["routes"] if r["name"] == "chat")
        keys = ("name", "requests", "prefix_blocks", "cached_tokens_expected", "cached_tokens_reported",
                "cache_hit_ratio")
        print(json.dumps([{k: b[k] for k in keys} for b in view["backends"]], indent=1))
    finally:
        server.terminate()
        server.wait(timeout=30)
        for fake in fakes:
            fake.stop()


if __name__ == "__main__":
    main()
