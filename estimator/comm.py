"""Tensor parallelism's price: the all-reduces a Megatron-split decoder adds to every forward pass.

Per layer, two all-reduces (after the attention's output projection and after the MLP's down
projection) of the pass's activations, ``tokens × hidden × activation bytes``; per pass, one more for
the vocabulary-parallel embedding, and a gather of the sampled rows' logits to rank 0
(``rows × vocab × 4`` bytes, float32). A ring all-reduce over ``N`` devices takes
``2(N−1)·α + 2(N−1)/N · bytes / B`` (the alpha-beta model that NCCL's "bus bandwidth" is defined by): ``α``
the latency of one hop, ``B`` the link's bandwidth per direction and device; the gather
``(N−1)·α + (N−1)/N · bytes / B``. Each layer waits for its sums, so the time adds to the step's
(weights and KV read, FLOPs) instead of hiding under it: a decode step at batch 1 moves a few KiB per
all-reduce, so the ``2·L·2(N−1)·α`` latency term decides whether TP pays.
"""

from __future__ import annotations

from dataclasses import dataclass

from .shape import ModelShape


@dataclass(frozen=True)
class Link:
    """The interconnect between the devices of one deployment."""

    gbs: float  # GB/s per direction and device (NVLink, PCIe, loopback)
    latency_us: float  # one hop of a ring step

    def __post_init__(self) -> None:
        if self.gbs <= 0 or self.latency_us < 0:
            raise ValueError("--link-gbs must be > 0 and --link-latency-us >= 0")


def all_reduce_s(nbytes: float, ranks: int, link: Link) -> float:
    if ranks <= 1:
        return 0.0
    steps = 2 * (ranks - 1)
    return steps * link.latency_us * 1e-6 + steps / ranks * nbytes / (link.gbs * 1e9)


def gather_s(nbytes: float, ranks: int, link: Link) -> float:
    if ranks <= 1:
        return 0.0
    return (ranks - 1) * link.latency_us * 1e-6 + (ranks - 1) / ranks * nbytes / (link.gbs * 1e9)


@dataclass(frozen=True)
class PassComm:
    """The collectives of one forward pass over ``tokens`` tokens that samples ``rows`` rows."""

    bytes_per_all_reduce: float
    all_reduce_s: float  # one
    per_layer_s: float  # two per layer
    total_s: float  # every layer, the embedding's, and the logits gather

    def as_dict(self) -> dict:
        return {"bytes_per_all_reduce": self.bytes_per_all_reduce, "all_reduce_us": self.all_reduce_s * 1e6,
                "per_layer_us": self.per_layer_s * 1e6, "total_ms": self.total_s * 1e3}


def pass_comm(m: ModelShape, tokens: int, rows: int, ranks: int, link: Link, act_bytes: float) -> PassComm:
    nbytes = tokens * m.hidden_size * act_bytes
    one = all_reduce_s(nbytes, ranks, link)
    total = (2 * m.num_layers + 1) * one + gather_s(rows * m.vocab_size * 4, ranks, link)
    return PassComm(nbytes, one, 2 * one, total)
