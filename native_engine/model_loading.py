"""From an `EngineConfig` to a ready `ModelRunner`: checkpoint, model, KV cache, CUDA graphs.

Every rank of a tensor-parallel group runs these steps in the same order (rank 0 in `LLMEngine`, the
others in `distributed/worker.py`), so their collectives meet: the KV-cache size they agree on
(`ModelRunner.allocate_kv_cache`), the GPU profile run and the CUDA-graph captures, which all-reduce.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from . import platform
from .config import EngineConfig
from .distributed.partition import tensor_parallel_problem
from .loader import load_checkpoint
from .model_runner import ModelRunner
from .spec_decode.build import DEFAULT_K


@dataclass(slots=True)
class Checkpoint:
    model_config: object  # loader.ModelConfig
    weights: object  # an iterator of (name, tensor or lazy weight), None for dummy weights
    tokenizer: object
    dtype: torch.dtype
    max_model_len: int


def read_checkpoint(config: EngineConfig, device: torch.device) -> Checkpoint:
    """Config, weights (lazy in a group: each rank reads its shard) and tokenizer; ValueError when the
    group cannot split the model."""
    keep_q4_1 = device.type == "cpu" and config.cpu_int4_matmul  # for the int4 matmuls (f32 only)

    def dtype_of(model_config) -> torch.dtype:
        return platform.resolve_dtype(config.dtype, device, model_config.torch_dtype)

    model_config, weights, tokenizer = load_checkpoint(config.model, dtype_of, keep_q4_1, config.load_format,
                                                       lazy=config.tensor_parallel_size > 1)
    problem = tensor_parallel_problem(model_config.num_heads, model_config.num_kv_heads,
                                      config.tensor_parallel_size)
    if problem:
        raise ValueError(problem)
    max_model_len = min(config.max_model_len or model_config.max_position_embeddings,
                        model_config.max_position_embeddings)
    return Checkpoint(model_config, weights, tokenizer, dtype_of(model_config), max_model_len)


def build_runner(config: EngineConfig, checkpoint: Checkpoint, device: torch.device, tp=None,
                 draft=None) -> ModelRunner:
    """The model (this rank's shard of it), its KV cache and its CUDA graphs. `draft`: a draft model's
    runner (rank 0, speculative decoding), whose cache takes as many blocks as the target's."""
    with platform.loading_threads(device):
        runner = ModelRunner(config, checkpoint.model_config, checkpoint.weights, device, checkpoint.dtype, tp)
    checkpoint.weights = None
    spec = config.speculative_config  # every rank sizes its input buffers for the same verify rows
    runner.max_spec_tokens = spec.num_speculative_tokens if spec else DEFAULT_K
    runner.allocate_kv_cache(kv_budget(config, checkpoint, device, runner, draft))
    runner.capture_cudagraphs(checkpoint.max_model_len)
    return runner


def kv_budget(config: EngineConfig, checkpoint: Checkpoint, device: torch.device, runner: ModelRunner,
              draft=None) -> int:
    """The target's share of `kv_bytes`; with a draft model both caches count per token."""
    target = runner.block_bytes
    both = target + (draft.block_bytes if draft is not None else 0)
    return kv_bytes(config, checkpoint, device, runner, both // config.block_size) * target // both


def kv_bytes(config: EngineConfig, checkpoint: Checkpoint, device: torch.device, runner: ModelRunner,
             per_token: int) -> int:
    """Explicit bytes (per rank), else a share of free memory, never more than every sequence at full
    length needs. The ranks of a group on one CPU share its memory: each takes its part of the share."""
    if config.kv_cache_memory_bytes is not None:
        return config.kv_cache_memory_bytes
    needed = per_token * (checkpoint.max_model_len + config.block_size) * config.max_num_seqs
    if device.type == "cuda":
        return min(needed, platform.gpu_kv_budget(device, config.gpu_memory_utilization, runner.profile_run))
    return min(needed, platform.cpu_kv_budget(config.kv_cache_fraction_cpu / config.tensor_parallel_size))
