"""What `infer run` imports before it loads a model: a fresh interpreter, the modules its local path
uses, and the heavy ones it must not pull in (they cost seconds on a small machine; the model's load
is measured by bench/native_load.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def imported(code: str) -> set[str]:
    probe = code + "\nimport json, sys; print(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True)
    return set(json.loads(out.stdout.strip().splitlines()[-1]))


def test_infer_run_local_path_leaves_the_web_stack_and_torch_alone():
    modules = imported("import cli.main, cli.run, cli.chat_session, adapters.engines.native.backend")
    assert not modules & {"fastapi", "starlette", "aiohttp", "uvicorn", "torch", "triton", "transformers"}


def test_gguf_header_and_tokenizer_come_without_torch_or_the_engine():
    modules = imported("from gguf_io.gguf_file import GGUFFile\n"
                       "from gguf_io.tokenizer import Tokenizer\n"
                       "import frontend.prompt_text, frontend.token_count, benchmark.tokenizer")
    assert "torch" not in modules and not {m for m in modules if m.split(".")[0] == "native_engine"}


def test_engine_on_cpu_does_not_import_triton():
    modules = imported("import os; os.environ.pop('TRITON_INTERPRET', None)\nimport native_engine.llm_engine")
    assert "torch" in modules and "triton" not in modules
