"""Engine configuration: a frozen, validated slotted dataclass. It never reads the model."""

from __future__ import annotations

import os
from dataclasses import dataclass

from .spec_decode.config import SpeculativeConfig

DTYPES = ("auto", "float32", "bfloat16", "float16")
LOAD_FORMATS = ("auto", "dummy")
DEFAULT_MAX_LORAS = 4
DEFAULT_MAX_MODEL_LEN = 2048  # tokens of context when none is asked for (min with the model's own)


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_int(name: str, value: object, minimum: int, optional: bool = False) -> None:
    ok = (optional and value is None) or (_is_int(value) and value >= minimum)  # type: ignore[operator]
    _check(ok, f"{name} must be {'None or ' if optional else ''}an integer >= {minimum}, got {value!r}")


def _check_fraction(name: str, value: float) -> None:
    _check(0 < value <= 1, f"{name} must be in (0, 1], got {value}")


@dataclass(frozen=True, slots=True)
class EngineConfig:
    model: str  # path to a .gguf file or a Hugging Face model directory
    block_size: int = 16
    max_num_batched_tokens: int = 2048
    max_num_seqs: int = 256
    # Capped at the model's max_position_embeddings (model_loading.py); None = the whole trained context
    # (vLLM's default), on purpose only: the default is infer's context rule (core/settings.py), whose
    # INFER_CONTEXT_LENGTH default this must equal (tests/test_settings_tree.py checks it).
    max_model_len: int | None = DEFAULT_MAX_MODEL_LEN
    kv_cache_memory_bytes: int | None = None  # None = sized from free memory
    gpu_memory_utilization: float = 0.9
    kv_cache_fraction_cpu: float = 0.25  # fraction of free RAM for the KV cache on CPU
    dtype: str = "auto"
    device: str = "auto"
    enable_prefix_caching: bool = True
    enforce_eager: bool = False
    num_threads: int | None = None  # None: torch's default; with tensor parallelism on CPU, the cores / ranks
    seed: int = 0
    cpu_fp16_small_batch: bool = True  # bf16 on CPU: fp16 weight copies for 1-2 row batches (faster GEMV)
    cpu_int4_matmul: bool = True  # f32 on CPU: weights that are exactly 4/8-bit GGUF blocks run as int4 matmuls
    cpu_bf16_prefill: bool = False  # f32 on CPU with AMX / AVX512-BF16: prefill rows multiply bf16 copies of the
    # layer weights and attend on bf16 q/k/v (layers/bf16_prefill.py: ~2.5x the f32 prefill on one core, outputs
    # off by bf16 rounding); decode rows stay f32. A CPU that cannot prove it at load keeps f32
    load_format: str = "auto"  # "dummy": config and tokenizer from `model`, weights drawn on the device (vLLM's)
    async_scheduling: bool | None = None  # schedule a decode step while the one before runs; None = on CUDA only
    fused_decode: bool = False  # CUDA: steps of <= 4 tokens as six kernels a layer (kernels/fused_gemv.py); off
    # until a GPU run shows it faster (bench/native_gpu.py measures both)
    unified_attention: bool = False  # CUDA: a step with prefill chunks runs its attention in one kernel for all
    # rows (kernels/unified_attention.py) instead of a gather and an attention call per chunk, and is replayed
    # from a CUDA graph (cuda_graph.MixedGraphs) unless enforce_eager; off until a GPU run shows it faster
    # (bench/native_gpu.py --unified measures each)
    speculative: str | None = None  # "ngram:k=4", "draft:MODEL:k=4" (spec_decode/config.py); None = off
    max_loras: int | None = None  # LoRA adapters resident at once (lora/); None: DEFAULT_MAX_LORAS on one rank,
    # 0 when split over ranks; 0: requests cannot name an adapter
    max_lora_rank: int = 64  # the largest adapter rank the slots hold (vLLM's --max-lora-rank)
    tensor_parallel_size: int = 1  # ranks the model is split over (Megatron-LM): gloo on CPU, NCCL on CUDA
    distributed_init_method: str | None = None  # file://PATH or tcp://HOST:PORT where ranks started by
    # someone else (the gateway) meet; None: the engine starts ranks 1..N-1 itself

    @property
    def lora_slots(self) -> int:
        """The adapters resident at once: `max_loras`, else the default for the ranks."""
        if self.max_loras is not None:
            return self.max_loras
        return DEFAULT_MAX_LORAS if self.tensor_parallel_size == 1 else 0

    @property
    def speculative_config(self) -> SpeculativeConfig | None:
        return SpeculativeConfig.parse(self.speculative)

    def __post_init__(self) -> None:
        model = self.model
        _check(
            isinstance(model, (str, os.PathLike)) and str(model) != "", f"model must be a non-empty path, got {model!r}"
        )
        _check_int("block_size", self.block_size, 1)
        _check_int("max_num_batched_tokens", self.max_num_batched_tokens, 1)
        _check_int("max_num_seqs", self.max_num_seqs, 1)
        _check_int("max_model_len", self.max_model_len, 1, optional=True)
        _check_int("kv_cache_memory_bytes", self.kv_cache_memory_bytes, 1, optional=True)
        _check_int("num_threads", self.num_threads, 1, optional=True)
        _check_int("seed", self.seed, 0)
        _check_int("tensor_parallel_size", self.tensor_parallel_size, 1)
        _check_int("max_loras", self.max_loras, 0, optional=True)
        _check_int("max_lora_rank", self.max_lora_rank, 1)
        _check(not self.max_loras or self.tensor_parallel_size == 1,
               "LoRA adapters run without tensor parallelism for now: max_loras > 0 needs tensor_parallel_size 1")
        init = self.distributed_init_method
        _check(init is None or str(init).startswith(("file://", "tcp://")),
               f"distributed_init_method must be file://PATH or tcp://HOST:PORT, got {self.distributed_init_method!r}")
        _check_fraction("gpu_memory_utilization", self.gpu_memory_utilization)
        _check_fraction("kv_cache_fraction_cpu", self.kv_cache_fraction_cpu)
        _check(self.dtype in DTYPES, f"dtype must be one of {', '.join(DTYPES)}; got {self.dtype!r}")
        _check(isinstance(self.fused_decode, bool), f"fused_decode must be true or false; got {self.fused_decode!r}")
        _check(isinstance(self.cpu_bf16_prefill, bool),
               f"cpu_bf16_prefill must be true or false; got {self.cpu_bf16_prefill!r}")
        _check(isinstance(self.unified_attention, bool),
               f"unified_attention must be true or false; got {self.unified_attention!r}")
        _check(self.async_scheduling is None or isinstance(self.async_scheduling, bool),
               f"async_scheduling must be None, true or false; got {self.async_scheduling!r}")
        _check(self.load_format in LOAD_FORMATS,
               f"load_format must be one of {', '.join(LOAD_FORMATS)}; got {self.load_format!r}")
        _check(self.speculative is None or isinstance(self.speculative, str),
               f"speculative must be a string such as 'ngram:k=4', got {self.speculative!r}")
        spec = self.speculative_config  # raises ValueError with what is wrong
        _check(spec is None or spec.method != "draft" or self.tensor_parallel_size == 1,
               "a draft model runs without tensor parallelism for now: use speculative 'ngram' with "
               "tensor_parallel_size > 1")
        device = self.device
        _check(
            isinstance(device, str) and device.split(":")[0] in ("auto", "cpu", "cuda"),
            f"device must be 'auto', 'cpu', 'cuda' or 'cuda:N', got {device!r}",
        )
