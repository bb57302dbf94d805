"""``python -m adapters.engines.llamacpp.smoke [MODEL.gguf]``: does llama.cpp answer on this CPU?

Runs a quantized model (by default a tiny Q4_0 one built on the spot with the project's model
builder) on a prompt of several tokens, the case that segfaults a ``GGML_NATIVE`` build of
llama-cpp-python 0.3.36 on CPUs with AMX, and prints ``ok: N tokens``. Always run it in a child
process: a crash is its exit status (-11), not the caller's death. ``make install``
(``scripts/install_llama_cpp.py``) and the default test suite both do.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path


def tiny_quantized(directory: Path, dtype: str = "q4_0") -> Path:
    from registry.modelbuilder import PRESETS, build_gguf

    return build_gguf(directory / f"tiny-{dtype}.gguf", PRESETS["tiny-qwen2"], dtype=dtype, seed=0)


def answer(model: Path) -> int:
    import llama_cpp

    llm = llama_cpp.Llama(model_path=str(model), n_ctx=256, n_batch=64, verbose=False)
    tokens = llm.tokenize(b"hello there friend, how are you today?")
    out = llm(tokens, max_tokens=4, temperature=0.0)
    return out["usage"]["completion_tokens"]


def main(argv: list[str]) -> None:
    with tempfile.TemporaryDirectory(prefix="infer-llama-smoke-") as tmp:
        model = Path(argv[0]) if argv else tiny_quantized(Path(tmp))
        print(f"ok: {answer(model)} tokens from {model.name}")


if __name__ == "__main__":
    main(sys.argv[1:])
