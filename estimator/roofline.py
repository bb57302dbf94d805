"""The bandwidth roofline of estimate.md §2 on top of the §1 FLOPs, with efficiency factors.

- decode step at batch ``b``: ``TPOT = max(bytes / (bandwidth · MBU), decode FLOPs / (F · MFU))`` where
  bytes = weight bytes + ``b`` × KV bytes per token × the average cached length ``p + (1+o)/2``;
  the larger term is the one that *binds*.
- ``TTFT = prefill FLOPs / (F · MFU)`` for one prompt (no queueing).
- KV capacity = ``(memory · utilisation − weights − workspace) / KV bytes per token``; max concurrent
  sequences = capacity ÷ (p + o).
- ``gpus`` > 1 is tensor parallelism: peaks, bandwidth and memory add up, and each forward pass pays its
  all-reduces on top (``comm.py``): ``TPOT = max(memory, compute) + comm``, ``TTFT = prefill + comm``.
"""

from __future__ import annotations

from dataclasses import dataclass

from .comm import Link, PassComm, pass_comm
from .devices import Device
from .flops import decode_flops_per_token, prefill_flops
from .shape import ModelShape


@dataclass(frozen=True)
class Efficiency:
    """Fractions of peak achieved: MFU for FLOPs, MBU for bytes (defaults: the documents' ~60 %, a mid MBU).

    ``mfu`` times prefill; decode steps use ``decode_mfu`` (``None``: the same ``mfu``), since a measured
    TTFT carries per-request overheads that a decode step does not.
    """

    mfu: float = 0.6
    mbu: float = 0.7
    source: str = "default"
    decode_mfu: float | None = None

    def __post_init__(self) -> None:
        if not (self.mfu > 0 and self.mbu > 0 and (self.decode_mfu is None or self.decode_mfu > 0)):
            raise ValueError("MFU and MBU must be > 0")

    @property
    def decode_compute(self) -> float:
        return self.decode_mfu or self.mfu


@dataclass(frozen=True)
class Deployment:
    model: ModelShape
    device: Device
    gpus: int = 1
    dtype: str | None = None  # None: the file's own weights; else bf16 | fp8 | int8 | int4
    kv_dtype: str = "bf16"
    memory_utilisation: float = 0.9
    workspace_gb: float = 1.0

    @property
    def weight_bytes(self) -> float:
        return self.model.weight_bytes(self.dtype)

    @property
    def peak_flops(self) -> float:
        return self.device.peak_flops(self.dtype or "bf16") * self.gpus

    @property
    def bandwidth(self) -> float:
        return self.device.bandwidth_gbs * 1e9 * self.gpus

    def kv_capacity_tokens(self) -> int:
        free = self.device.memory_gb * 1e9 * self.gpus * self.memory_utilisation - self.weight_bytes \
            - self.workspace_gb * 1e9
        return max(0, int(free // self.model.kv_bytes_per_token(self.kv_dtype)))

    def max_sequences(self, prompt: int, output: int) -> int:
        return self.kv_capacity_tokens() // (prompt + output)

    @property
    def link(self) -> Link:
        return Link(self.device.link_gbs, self.device.link_latency_us)

    @property
    def activation_bytes(self) -> float:
        return 4.0 if self.device.name == "cpu" else 2.0  # the CPU engines compute in float32, GPUs in bf16

    def comm(self, tokens: int, rows: int) -> PassComm:
        """The tensor-parallel collectives of one forward pass (zero on one device)."""
        return pass_comm(self.model, tokens, rows, self.gpus, self.link, self.activation_bytes)

    def with_gpus(self, gpus: int) -> Deployment:
        return Deployment(self.model, self.device, gpus, self.dtype, self.kv_dtype, self.memory_utilisation,
                          self.workspace_gb)


@dataclass(frozen=True)
class DecodeStep:
    batch: int
    memory_s: float
    compute_s: float
    comm_s: float = 0.0  # tensor parallelism's all-reduces, on the critical path

    @property
    def tpot_s(self) -> float:
        return max(self.memory_s, self.compute_s) + self.comm_s

    @property
    def binds(self) -> str:
        if self.comm_s >= max(self.memory_s, self.compute_s):
            return "communication"
        return "bandwidth" if self.memory_s >= self.compute_s else "compute"

    @property
    def tokens_per_s(self) -> float:
        return self.batch / self.tpot_s


def step_bytes(dep: Deployment, prompt: int, output: int, batch: int) -> float:
    cached = prompt + (1 + output) / 2
    return dep.weight_bytes + batch * cached * dep.model.kv_bytes_per_token(dep.kv_dtype)


def decode_step(dep: Deployment, eff: Efficiency, prompt: int, output: int, batch: int) -> DecodeStep:
    memory = step_bytes(dep, prompt, output, batch) / (dep.bandwidth * eff.mbu)
    compute = decode_flops_per_token(dep.model, prompt, output, batch) / (dep.peak_flops * eff.decode_compute)
    return DecodeStep(batch, memory, compute, dep.comm(batch, batch).total_s)


def ttft_s(dep: Deployment, eff: Efficiency, prompt: int) -> float:
    return prefill_flops(dep.model, prompt) / (dep.peak_flops * eff.mfu) + dep.comm(prompt, 1).total_s


def largest_batch_meeting(dep: Deployment, eff: Efficiency, prompt: int, output: int, tpot_slo_s: float) -> int:
    """Largest batch (≤ the KV limit) whose TPOT meets the SLO; 0 if even batch 1 misses it."""
    low, high = 0, max(1, dep.max_sequences(prompt, output))
    while low < high:
        middle = (low + high + 1) // 2
        if decode_step(dep, eff, prompt, output, middle).tpot_s <= tpot_slo_s:
            low = middle
        else:
            high = middle - 1
    return low
