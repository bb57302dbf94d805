"""End-to-end engine tests: the two tiny presets built once per session (GGUF and HF directory of the
same weights), engine factories, and the references (transformers, llama.cpp) loaded lazily per preset."""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from native_engine import LLMEngine
from registry.modelbuilder import PRESETS, ModelSpec, build_gguf, build_hf

from .helpers import greedy, token_ids

PRESET_NAMES = ("tiny-qwen2", "tiny-llama")
MIXED_LENGTHS = (3, 9, 17, 30, 48, 64, 95, 130)  # 8 prompts of mixed lengths, block-aligned and not


@dataclass(frozen=True, slots=True)
class BuiltModel:
    name: str
    spec: ModelSpec
    gguf: Path
    hf: Path

    def kv_bytes(self, num_blocks: int, block_size: int) -> int:
        """KV-cache bytes for exactly num_blocks blocks in float32."""
        s = self.spec
        return num_blocks * block_size * 2 * s.num_layers * s.num_kv_heads * s.head_dim * 4


_MODELS: dict[str, BuiltModel] = {}
_CACHE: dict[tuple, object] = {}
GGML_TYPE_F32 = 0  # llama.cpp KV-cache type: f32 instead of the default f16, so it is a tight reference


@pytest.fixture(scope="session", autouse=True)
def _one_thread():
    """Tiny models: one intra-op thread is fastest, and far faster on a shared, oversubscribed machine."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
    for key, value in list(_CACHE.items()):
        if key[0] == "llama.cpp":
            value.close()  # now, not in __del__ at interpreter exit
    _CACHE.clear()


@pytest.fixture(scope="session")
def models_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("engine-models")


@pytest.fixture(scope="session", params=PRESET_NAMES)
def model(request: pytest.FixtureRequest, models_root: Path) -> BuiltModel:
    name = request.param
    if name not in _MODELS:
        spec = PRESETS[name]
        _MODELS[name] = BuiltModel(
            name,
            spec,
            build_gguf(models_root / f"{name}.gguf", spec, dtype="f32"),
            build_hf(models_root / f"{name}-hf", spec),
        )
    return _MODELS[name]


def new_engine(
    model: BuiltModel,
    *,
    source: str = "gguf",
    num_blocks: int = 256,
    block_size: int = 16,
    max_num_batched_tokens: int = 512,
    max_num_seqs: int = 16,
    enable_prefix_caching: bool = True,
    **kwargs,
) -> LLMEngine:
    path = model.gguf if source == "gguf" else model.hf
    return LLMEngine.from_model(
        path,
        kv_cache_memory_bytes=model.kv_bytes(num_blocks, block_size),
        block_size=block_size,
        max_num_batched_tokens=max_num_batched_tokens,
        max_num_seqs=max_num_seqs,
        enable_prefix_caching=enable_prefix_caching,
        dtype="float32",
        **kwargs,
    )


@pytest.fixture
def f16_gguf(model: BuiltModel, models_root: Path) -> Path:
    """The same preset with F16 matrices: dtype="auto" computes it in bfloat16 on CPU."""
    key = ("f16", model.name)
    if key not in _CACHE:
        _CACHE[key] = build_gguf(models_root / f"{model.name}-f16.gguf", model.spec, dtype="f16")
    return _CACHE[key]


@pytest.fixture(scope="session")
def bos_model(models_root: Path) -> BuiltModel:
    """tiny-llama whose GGUF says tokenizer.ggml.add_bos_token = true (as real Llama/Mistral/Gemma GGUFs do)."""
    import gguf

    spec, add_bos = PRESETS["tiny-llama"], gguf.GGUFWriter.add_add_bos_token
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(gguf.GGUFWriter, "add_add_bos_token", lambda writer, value: add_bos(writer, True))
        path = build_gguf(models_root / "tiny-llama-bos.gguf", spec, dtype="f32")
    return BuiltModel("tiny-llama-bos", spec, path, path)


@pytest.fixture
def make_engine(model: BuiltModel):
    """make_engine(num_blocks=..., block_size=..., max_num_batched_tokens=..., ...) -> a fresh LLMEngine."""
    return lambda **kwargs: new_engine(model, **kwargs)


@pytest.fixture
def engine(model: BuiltModel) -> LLMEngine:
    """A fresh engine with the default test settings (256 blocks of 16, 512-token budget, 16 seqs)."""
    return new_engine(model)


@pytest.fixture
def prompts(model: BuiltModel):
    """prompts(lengths, seed=0) -> random non-special token-id prompts of the given lengths."""
    tokenizer = new_tokenizer(model)
    ordinary = [i for i in range(model.spec.vocab_size) if not tokenizer.is_special(i)]

    def _prompts(lengths, seed: int = 0) -> list[list[int]]:
        rng = random.Random(seed)
        return [rng.choices(ordinary, k=n) for n in lengths]

    return _prompts


def new_tokenizer(model: BuiltModel):
    key = ("tokenizer", model.name)
    if key not in _CACHE:
        from gguf_io.tokenizer import load_tokenizer

        _CACHE[key] = load_tokenizer(model.gguf)
    return _CACHE[key]


@pytest.fixture
def mixed_prompts(prompts) -> list[list[int]]:
    return prompts(MIXED_LENGTHS, seed=1)


@pytest.fixture
def greedy_single(model: BuiltModel, mixed_prompts) -> list[list[int]]:
    """16 greedy tokens for each mixed prompt, each generated alone on a default engine (cached per preset)."""
    key = ("greedy_single", model.name)
    if key not in _CACHE:
        engine = new_engine(model)
        _CACHE[key] = [token_ids(engine.generate([p], greedy(16)))[0] for p in mixed_prompts]
    return _CACHE[key]


@pytest.fixture
def hf_model(model: BuiltModel):
    key = ("hf", model.name)
    if key not in _CACHE:
        from transformers import AutoModelForCausalLM

        _CACHE[key] = AutoModelForCausalLM.from_pretrained(model.hf, dtype=torch.float32).eval()
    return _CACHE[key]


@pytest.fixture
def hf_logits(hf_model):
    """hf_logits(token_ids) -> transformers' per-position logits [n, V] float32."""

    @torch.no_grad()
    def _logits(ids: list[int]) -> torch.Tensor:
        return hf_model(torch.tensor([ids])).logits[0].float()

    return _logits


@pytest.fixture
def llama_cpp_model(model: BuiltModel):
    llama_cpp = pytest.importorskip("llama_cpp")
    key = ("llama.cpp", model.name)
    if key not in _CACHE:
        _CACHE[key] = llama_cpp.Llama(
            str(model.gguf),
            n_ctx=model.spec.context_length,
            logits_all=True,
            verbose=False,
            n_threads=1,
            n_threads_batch=1,
            type_k=GGML_TYPE_F32,
            type_v=GGML_TYPE_F32,
        )
    return _CACHE[key]


@pytest.fixture
def llama_cpp_logits(llama_cpp_model):
    """llama_cpp_logits(token_ids) -> llama.cpp's per-position logits [n, V] float32."""

    def _logits(ids: list[int]) -> torch.Tensor:
        llama_cpp_model.reset()
        llama_cpp_model.eval(ids)
        return torch.tensor(llama_cpp_model.scores[: len(ids)], dtype=torch.float32)

    return _logits
