"""The tensor-parallel group's parts that need no second process: backends, devices, commands, messages.
(Groups themselves are exercised by tests/native_engine/engine/test_tensor_parallel.py.)"""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch

from native_engine import EngineConfig
from native_engine.distributed.parallel_state import (TensorParallelGroup, backend_for, new_init_method,
                                                      object_payload, rank_device, worker_command)


def test_gloo_on_cpu_nccl_on_cuda():
    assert backend_for(torch.device("cpu")) == "gloo"
    assert backend_for(torch.device("cuda", 1)) == "nccl"
    with pytest.raises(ValueError, match="cpu or cuda"):
        backend_for(torch.device("meta"))


def test_rank_r_takes_the_rth_gpu_after_the_configured_one():
    assert rank_device(torch.device("cpu"), 3) == torch.device("cpu")
    assert rank_device(torch.device("cuda"), 1) == torch.device("cuda", 1)
    assert rank_device(torch.device("cuda", 2), 1) == torch.device("cuda", 3)


def test_a_worker_command_runs_the_worker_module_with_its_rank():
    init = new_init_method()
    command = worker_command(2, 4, init, torch.device("cpu"), parent=123)
    assert command[:4] == [sys.executable, "-P", "-m", "native_engine.distributed.worker"]  # -P: not the cwd
    assert command[command.index("--rank") + 1] == "2" and command[command.index("--world-size") + 1] == "4"
    assert command[command.index("--init-method") + 1] == init and init.startswith("file:///")
    assert command[command.index("--parent") + 1] == "123"


def test_an_object_survives_the_int64_message_it_travels_in():
    config = EngineConfig("/models/x.gguf", tensor_parallel_size=2, max_num_seqs=3)
    payload = object_payload(config)
    assert payload.dtype == np.int64 and payload.ndim == 1
    assert TensorParallelGroup.object_from(payload.copy()) == config


def test_the_config_refuses_a_bad_size_or_init_method():
    with pytest.raises(ValueError, match="tensor_parallel_size must be an integer >= 1"):
        EngineConfig("m.gguf", tensor_parallel_size=0)
    with pytest.raises(ValueError, match="file://PATH or tcp://HOST:PORT"):
        EngineConfig("m.gguf", tensor_parallel_size=2, distributed_init_method="localhost:1234")
