"""The README's `infer routes` example: two fake vLLM servers (one answers its first token 400 ms
later) behind one `slo` route, 30 requests from 6 clients, then `infer routes`.

    .venv/bin/python scripts/routes_example.py
"""

from __future__ import annotations

import concurrent.futures
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
from fakes import start_server  # noqa: E402
from fakes.behaviour import Behaviour  # noqa: E402


def main() -> None:
    fast = start_server("vllm", Behaviour(token_delay=0.01))
    slow = start_server("vllm", Behaviour(first_byte_delay=0.4, token_delay=0.03))
    home, port = Path(tempfile.mkdtemp(prefix="infer-routes-")), free_port()
    model = fast.behaviour.models[0]
    config = {"backends": [{"name": "vllm-a", "type": "vllm", "base_url": fast.url, "model": model},
                           {"name": "vllm-b", "type": "vllm", "base_url": slow.url, "model": model}],
              "routes": [{"name": "chat", "backends": ["vllm-a", "vllm-b"], "strategy": "slo", "shed": True,
                          "slo": {"ttft_ms": 300, "tpot_ms": 50, "e2e_ms": 5000, "window_s": 300},
                          "first_token_timeout_ms": 1500, "retries": 1}]}
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
        body = lambda i: {"model": "chat", "max_tokens": 8, "messages": [{"role": "user", "content": f"hello {i}"}]}  # noqa: E731
        with concurrent.futures.ThreadPoolExecutor(6) as pool:
            codes = list(pool.map(lambda i: httpx.post(url + "/v1/chat/completions", json=body(i), timeout=30).status_code,
                                  range(30)))
        print("statuses:", sorted(codes))
        subprocess.run([sys.executable, "-m", "cli", "routes", "--url", url], cwd=ROOT, check=True)
    finally:
        server.terminate()
        server.wait(timeout=30)
        fast.stop()
        slow.stop()


if __name__ == "__main__":
    main()
