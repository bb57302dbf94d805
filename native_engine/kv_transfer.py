"""KV blocks from a prefill engine to a decode engine on one host, in vLLM's ``kv_transfer_params`` terms.

A request's ``SamplingParams.kv_transfer_params`` says its role, as vLLM's KV connectors read it:

- ``do_remote_decode: true`` (the prefill leg): once the request finishes (one token), the engine saves
  the KV of the prompt's full blocks to a file in shared memory (``/dev/shm``) and answers
  ``kv_transfer_params: {do_remote_prefill: true, do_remote_decode: false, remote_block_ids,
  remote_engine_id, remote_request_id, remote_host, remote_port: null, tp_size: 1}`` plus where the
  blocks are (``remote_kv_path``), how many tokens they hold (``remote_num_tokens``) and the block
  chain's hash (``remote_block_hash``); the file is leased ``lease_s`` (vLLM: ``kv_lease_duration``,
  30 s) and removed by the prefill engine when nobody took it by then;
- ``do_remote_prefill: true`` (the decode leg): before the request is scheduled the engine reads the
  blocks it does not hold yet into free blocks of its own cache, registered as prefix-cache blocks
  of the prompt (``BlockManager.import_prefix``), and removes the file; the scheduler then finds them
  as a prefix hit and computes only the rest of the prompt (at least its last token, for the logits).
  Blocks that are gone (lease over), for another prompt (the hash differs), or of another shape are
  not used: the decode engine recomputes the prompt (vLLM's ``kv_load_failure_policy: recompute``).

Only full blocks travel, and only those a prefix hit can use (never the prompt's last token): a
prompt shorter than one block comes back with ``remote_block_ids: []`` and decode prefills it.
The exported blocks are read right after the prefill request finishes, on the engine thread, before
the next step can reuse them (they stay in the prefill engine's prefix cache meanwhile).
"""

from __future__ import annotations

import logging
import os
import socket
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from .block_manager import BlockManager, compute_hash

log = logging.getLogger(__name__)
LEASE_S = 30.0


def shm_dir() -> Path:
    return Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(tempfile.gettempdir())


def chain_hash(token_ids: list[int], num_blocks: int, block_size: int) -> int:
    """The prefix cache's hash of the first ``num_blocks`` full blocks (ints hash alike in every process)."""
    prefix_hash = -1
    for i in range(num_blocks):
        prefix_hash = compute_hash(token_ids[i * block_size:(i + 1) * block_size], prefix_hash)
    return prefix_hash


@dataclass
class KVTransfer:
    """One engine's side of the transfer: its id, the files it leased out, and counters."""

    block_size: int
    lease_s: float = LEASE_S
    engine_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    leased: dict[str, float] = field(default_factory=dict)  # path -> lease end (time.monotonic)
    num_saved_blocks: int = 0
    num_loaded_blocks: int = 0
    num_load_failures: int = 0

    # -- prefill side -------------------------------------------------------------------------------

    def save(self, kv_cache: torch.Tensor, blocks: BlockManager, request_id: str, token_ids: list[int]) -> dict:
        """Write the prompt's cached full blocks to shared memory; the decode leg's ``kv_transfer_params``."""
        self.reap()
        num_blocks = (len(token_ids) - 1) // self.block_size
        block_ids = blocks.find_prefix(token_ids, num_blocks)
        params = {"do_remote_prefill": True, "do_remote_decode": False, "remote_block_ids": block_ids,
                  "remote_engine_id": self.engine_id, "remote_request_id": request_id,
                  "remote_host": socket.gethostname(), "remote_port": None, "tp_size": 1}
        if not block_ids:
            return params
        path = shm_dir() / f"infer-kv-{self.engine_id[:12]}-{uuid.uuid4().hex}"
        data = kv_cache[:, :, block_ids].contiguous()
        path.write_bytes(data.cpu().view(torch.uint8).numpy().tobytes())
        self.leased[str(path)] = time.monotonic() + self.lease_s
        self.num_saved_blocks += len(block_ids)
        return {**params, "remote_kv_path": str(path), "remote_num_tokens": len(block_ids) * self.block_size,
                "remote_block_hash": chain_hash(token_ids, len(block_ids), self.block_size),
                "remote_kv_shape": list(data.shape), "remote_kv_dtype": str(data.dtype).removeprefix("torch.")}

    def reap(self, now: float | None = None) -> None:
        """Remove the files whose lease is over (the decode leg never came, or came too late)."""
        now = time.monotonic() if now is None else now
        for path, until in list(self.leased.items()):
            if until <= now or not os.path.exists(path):
                self.leased.pop(path)
                Path(path).unlink(missing_ok=True)

    # -- decode side --------------------------------------------------------------------------------

    def load(self, kv_cache: torch.Tensor, blocks: BlockManager, token_ids: list[int], params: dict[str, Any]) -> int:
        """Import the prefill's blocks as prefix-cache blocks of ``token_ids``; the tokens now cached
        (0: nothing usable arrived, the engine recomputes the prompt)."""
        path = params.get("remote_kv_path")
        num_blocks = len(params.get("remote_block_ids") or [])
        if not path or not num_blocks:
            return 0
        try:
            data = self._read(Path(path), params, kv_cache)
        except (OSError, ValueError, RuntimeError) as exc:
            self.num_load_failures += 1
            log.warning("KV blocks of request %s not loaded (%s): recomputing the prompt",
                        params.get("remote_request_id"), exc)
            return 0
        if chain_hash(token_ids, num_blocks, self.block_size) != params.get("remote_block_hash"):
            self.num_load_failures += 1
            log.warning("KV blocks of request %s are for another prompt: recomputing", params.get("remote_request_id"))
            return 0
        targets = blocks.import_prefix(token_ids, num_blocks)
        for i, block_id in targets:
            kv_cache[:, :, block_id].copy_(data[:, :, i])
        self.num_loaded_blocks += len(targets)
        return num_blocks * self.block_size

    @staticmethod
    def _read(path: Path, params: dict[str, Any], kv_cache: torch.Tensor) -> torch.Tensor:
        shape, dtype = params.get("remote_kv_shape") or [], getattr(torch, str(params.get("remote_kv_dtype")), None)
        if dtype != kv_cache.dtype or list(shape[:2]) + list(shape[3:]) != [*kv_cache.shape[:2], *kv_cache.shape[3:]]:
            raise ValueError(f"blocks of shape {shape} {dtype}, this cache is {list(kv_cache.shape)} {kv_cache.dtype}")
        raw = path.read_bytes()
        path.unlink(missing_ok=True)  # taken: the lease ends here
        flat = torch.frombuffer(bytearray(raw), dtype=torch.uint8)
        return flat.view(dtype).view(shape).to(kv_cache.device)
