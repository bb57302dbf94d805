"""Random LoRA adapters for a model shape, in the two formats servers read.

- PEFT directory (vLLM, SGLang, LoRAX): ``adapter_config.json`` (``r``, ``lora_alpha``,
  ``target_modules``) and ``adapter_model.safetensors`` with
  ``base_model.model.model.layers.N.self_attn.q_proj.lora_A.weight`` [r, in] and ``…lora_B.weight``
  [out, r].
- GGUF LoRA as llama.cpp's ``convert_lora_to_gguf.py`` writes it (llama.cpp, Ollama's ``ADAPTER``):
  ``general.type = adapter``, ``adapter.type = lora``, ``adapter.lora.alpha``, tensors
  ``blk.N.attn_q.weight.lora_a`` (A, ``[r, in]`` in torch order) and ``….lora_b`` (B, ``[out, r]``),
  B's rows permuted for llama's q/k as the base's weights are.

The update of a target's weight is ``W + (alpha / r) · B · A``. Each tensor has its own generator
(``weights.make_tensor``), A ~ N(0, 1/in), B ~ N(0, 1/r), so ``B · A · x`` is about as large as ``W · x``.
Tensors are stored as ``LoraSpec.dtype``: f16 by default (``convert_lora_to_gguf.py --outtype f16``; the
native engine keeps adapters in float16 on the CPU), f32 on request.
``merged_tensor`` gives the base's weight with the adapter as stored merged in (the exactness tests' reference).
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np

from . import safetensors_out
from .gguf_out import gguf_name, hf_to_gguf_values
from .spec import ModelSpec
from .weights import TensorSpec, make_tensor

TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
_MODULE_PATH = {"q_proj": "self_attn", "k_proj": "self_attn", "v_proj": "self_attn", "o_proj": "self_attn",
                "gate_proj": "mlp", "up_proj": "mlp", "down_proj": "mlp"}
PEFT_PREFIX = "base_model.model."
PEFT_CONFIG = "adapter_config.json"
PEFT_WEIGHTS = "adapter_model.safetensors"


@dataclass(frozen=True)
class LoraSpec:
    rank: int = 8
    alpha: float = 8.0
    targets: tuple[str, ...] = TARGETS
    seed: int = 0
    dtype: str = "f16"  # how the tensors are stored: f16 or f32

    def __post_init__(self) -> None:
        if self.dtype not in ("f16", "f32"):
            raise ValueError(f"adapter dtype must be f16 or f32, got {self.dtype!r}")
        unknown = sorted(set(self.targets) - set(TARGETS))
        if unknown or not self.targets:
            raise ValueError(f"target modules must be some of {', '.join(TARGETS)}, got {', '.join(unknown) or 'none'}")
        if self.rank <= 0 or self.alpha <= 0:
            raise ValueError(f"rank and alpha must be positive, got r={self.rank}, alpha={self.alpha}")

    @property
    def scale(self) -> float:
        return self.alpha / self.rank


def module_shape(spec: ModelSpec, module: str) -> tuple[int, int]:
    """(out, in) of one target projection."""
    h, inter, hd = spec.hidden_size, spec.intermediate_size, spec.head_dim
    return {"q_proj": (spec.num_heads * hd, h), "k_proj": (spec.num_kv_heads * hd, h),
            "v_proj": (spec.num_kv_heads * hd, h), "o_proj": (h, spec.num_heads * hd),
            "gate_proj": (inter, h), "up_proj": (inter, h), "down_proj": (h, inter)}[module]


def base_name(layer: int, module: str) -> str:
    """The Hugging Face name of the base weight a target updates."""
    return f"model.layers.{layer}.{_MODULE_PATH[module]}.{module}.weight"


def lora_pairs(spec: ModelSpec, lora: LoraSpec) -> list[tuple[str, TensorSpec, TensorSpec]]:
    """(base weight name, A spec, B spec) for every target of every layer, PEFT names."""
    out = []
    for i in range(spec.num_layers):
        for module in lora.targets:
            rows, cols = module_shape(spec, module)
            stem = PEFT_PREFIX + base_name(i, module).removesuffix(".weight")
            out.append((base_name(i, module), TensorSpec(f"{stem}.lora_A.weight", (lora.rank, cols), "linear"),
                        TensorSpec(f"{stem}.lora_B.weight", (rows, lora.rank), "linear")))
    return out


def lora_tensor(spec: ModelSpec, lora: LoraSpec, ts: TensorSpec) -> np.ndarray:
    """The tensor as stored: float16 or float32 (``lora.dtype``)."""
    values = make_tensor(spec, ts, lora.seed)
    return values.astype(np.float16) if lora.dtype == "f16" else values


def merged_tensor(spec: ModelSpec, lora: LoraSpec, ts: TensorSpec, model_seed: int) -> np.ndarray:
    """A base tensor (HF layout) with the adapter merged in: ``W + scale · B · A`` for targets."""
    values = make_tensor(spec, ts, model_seed)
    for name, a, b in lora_pairs(spec, lora):
        if name == ts.name:
            delta = lora_tensor(spec, lora, b).astype(np.float64) @ lora_tensor(spec, lora, a).astype(np.float64)
            values = (values + lora.scale * delta).astype(np.float32)
    return values


def build_merged_gguf(out_path: str | os.PathLike[str], spec: ModelSpec, lora: LoraSpec, *, seed: int = 0,
                      dtype: str = "f32") -> Path:
    """The model of ``spec`` and ``seed`` with the adapter merged into its weights, as a GGUF file."""
    from .gguf_out import build_gguf

    return build_gguf(out_path, spec, dtype=dtype, seed=seed, produce=lambda ts: merged_tensor(spec, lora, ts, seed))


def peft_config(spec: ModelSpec, lora: LoraSpec) -> dict:
    return {"peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": spec.name,
            "r": lora.rank, "lora_alpha": lora.alpha, "target_modules": list(lora.targets),
            "lora_dropout": 0.0, "bias": "none", "fan_in_fan_out": False, "inference_mode": True}


def _write_peft(tmp: Path, spec: ModelSpec, lora: LoraSpec) -> None:
    specs = [ts for _, a, b in lora_pairs(spec, lora) for ts in (a, b)]
    safetensors_out.save(tmp / PEFT_WEIGHTS, specs, lambda ts: lora_tensor(spec, lora, ts), lora.dtype)
    (tmp / PEFT_CONFIG).write_text(json.dumps(peft_config(spec, lora), indent=2) + "\n")


def _write_gguf(path: Path, spec: ModelSpec, lora: LoraSpec) -> None:
    w = gguf.GGUFWriter(path, spec.arch)
    w.add_type(gguf.GGUFType.ADAPTER)
    w.add_name(f"{spec.name}-lora-r{lora.rank}")
    w.add_string(gguf.Keys.Adapter.TYPE, "lora")
    w.add_float32(gguf.Keys.Adapter.LORA_ALPHA, float(lora.alpha))
    for name, a, b in lora_pairs(spec, lora):
        w.add_tensor(gguf_name(name) + ".lora_a", lora_tensor(spec, lora, a))
        w.add_tensor(gguf_name(name) + ".lora_b", np.ascontiguousarray(
            hf_to_gguf_values(spec, name, lora_tensor(spec, lora, b))))
    try:
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
    finally:
        w.close()


def build_lora(out_path: str | os.PathLike[str], spec: ModelSpec, lora: LoraSpec, *, fmt: str = "gguf") -> Path:
    """Write the adapter as a GGUF file (``fmt="gguf"``) or a PEFT directory (``"peft"``), atomically."""
    if fmt not in ("gguf", "peft"):
        raise ValueError(f"unsupported adapter format {fmt!r}; choose gguf or peft")
    out = Path(out_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    if fmt == "peft":
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
        _write_peft(tmp, spec, lora)
        tmp.chmod(0o755)
    else:
        fd, name = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent)
        os.close(fd)
        tmp = Path(name)
        _write_gguf(tmp, spec, lora)
        tmp.chmod(0o644)
    if fmt == "peft" and out.is_dir():
        for f in out.iterdir():
            f.unlink()
        out.rmdir()
    os.replace(tmp, out)
    return out


def spec_from_gguf(path: str | os.PathLike[str]) -> ModelSpec:
    """The shape of a GGUF model (its header only), to make an adapter for it."""
    from ..gguf_info import read_gguf_info

    return spec_from_metadata(read_gguf_info(Path(path), verbose=False).metadata, Path(path).stem)


def spec_from_metadata(meta: dict, default_name: str = "model") -> ModelSpec:
    """The shape of a model from its GGUF metadata."""
    arch = str(meta.get("general.architecture"))
    key = lambda k: int(meta[f"{arch}.{k}"])  # noqa: E731
    heads = key("attention.head_count")
    return ModelSpec(arch=arch, vocab_size=int(meta.get(f"{arch}.vocab_size") or 32000),
                     hidden_size=key("embedding_length"), intermediate_size=key("feed_forward_length"),
                     num_layers=key("block_count"), num_heads=heads,
                     num_kv_heads=int(meta.get(f"{arch}.attention.head_count_kv") or heads),
                     qkv_bias=arch == "qwen2", name=str(meta.get("general.name") or default_name))


def peft_to_gguf(peft_dir: Path, out: Path, spec: ModelSpec) -> None:
    """A PEFT adapter directory as a GGUF LoRA for a base of shape ``spec`` (what Ollama's ``ADAPTER`` of
    a safetensors directory does; llama.cpp's ``convert_lora_to_gguf.py`` writes the same tensors)."""
    from safetensors.numpy import load_file

    config = json.loads((peft_dir / PEFT_CONFIG).read_text())
    tensors = load_file(peft_dir / PEFT_WEIGHTS)
    w = gguf.GGUFWriter(out, spec.arch)
    w.add_type(gguf.GGUFType.ADAPTER)
    w.add_name(peft_dir.name)
    w.add_string(gguf.Keys.Adapter.TYPE, "lora")
    w.add_float32(gguf.Keys.Adapter.LORA_ALPHA, float(config.get("lora_alpha", config["r"])))
    for key in sorted(tensors):
        stem, _, kind = key.removeprefix(PEFT_PREFIX).rpartition(".lora_")
        if kind not in ("A.weight", "B.weight"):
            raise ValueError(f"{peft_dir}: {key} is not a lora_A or lora_B tensor")
        values = tensors[key].astype(np.float32)
        base = stem + ".weight"
        suffix = ".lora_a" if kind == "A.weight" else ".lora_b"
        w.add_tensor(gguf_name(base) + suffix, values if kind == "A.weight"
                     else np.ascontiguousarray(hf_to_gguf_values(spec, base, values)))
    try:
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
    finally:
        w.close()
