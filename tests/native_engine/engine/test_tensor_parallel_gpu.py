"""Tensor parallelism on CUDA (NCCL), with the decode steps replayed from CUDA graphs that capture the
all-reduces. Needs two GPUs; the machines lent to this project have one, so these are skipped there
(the CPU tests in test_tensor_parallel.py run the same code over gloo)."""

from __future__ import annotations

import pytest
import torch

from native_engine import LLMEngine

from .conftest import new_engine
from .helpers import greedy, kl_per_position, token_ids
from .test_tensor_parallel import tp_kv_bytes

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")]


def test_two_gpus_answer_as_one_and_replay_graphs_with_the_all_reduces(model, mixed_prompts):
    one = new_engine(model, device="cuda")
    two = LLMEngine.from_model(model.gguf, tensor_parallel_size=2, device="cuda", dtype="float32",
                               kv_cache_memory_bytes=tp_kv_bytes(model, 256, 16, 2), max_num_seqs=16,
                               max_num_batched_tokens=512)
    try:
        assert isinstance(two.tp.device_group, torch.distributed.ProcessGroupNCCL)
        assert two.model_runner.graphs is not None
        for prompt in mixed_prompts[:3]:
            kl = kl_per_position(one.score(prompt).cpu(), two.score(prompt).cpu())
            assert kl.max() < 1e-9, f"max KL {kl.max():.3g}"
        replays = two.model_runner.graphs.num_replays
        assert token_ids(two.generate(mixed_prompts, greedy(64))) == token_ids(one.generate(mixed_prompts, greedy(64)))
        assert two.model_runner.graphs.num_replays > replays  # decode steps ran as graphs, all-reduces inside
    finally:
        two.close()
