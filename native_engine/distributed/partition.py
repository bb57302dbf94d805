"""How a tensor-parallel group splits a model: the heads, KV heads, MLP rows and vocabulary rows each
rank holds (Megatron-LM's scheme). Torch-free, so the rules are unit-tested without a group.

- **Attention.** A query head must sit on the rank that holds its KV head (grouped-query attention reads
  one KV head for ``group = num_heads / num_kv_heads`` query heads). Two legal layouts:
  - ``world_size <= num_kv_heads``: the KV heads are split in contiguous runs, as evenly as whole heads
    allow (sizes differ by at most one head), and each rank takes the query heads of its KV heads. When
    ``num_kv_heads`` is a multiple of ``world_size`` this is vLLM's even split; otherwise the ranks hold
    uneven shares (SmolLM2's 3 KV heads on 2 ranks: 2 + 1, so 6 + 3 query heads).
  - ``world_size > num_kv_heads``: each KV head is replicated on ``world_size / num_kv_heads`` ranks, each
    holding an equal share of its query heads (vLLM's rule: ``world_size`` a multiple of ``num_kv_heads``
    and a divisor of ``num_heads``).
  Anything else (a query head's KV head on another rank, or a rank whose query heads map unevenly onto
  its KV heads) is refused with the legal sizes named.
- **MLP.** gate/up rows (= down's input columns) in units of 32 (a GGUF quantization block, so 4-bit
  and 8-bit blocks split without dequantizing), as evenly as the units allow.
- **Vocabulary.** Embedding and LM-head rows in units of 64 (vLLM pads its vocabulary shards to 64), as
  evenly as the units allow; the LM head's logits are gathered to rank 0, padded to the largest shard.
- The hidden size, norms and rotary tables are replicated.
"""

from __future__ import annotations

from dataclasses import dataclass

MLP_UNIT = 32  # a Q4_0/Q4_1/Q5/Q8_0 block: down_proj's column shards stay whole blocks
VOCAB_UNIT = 64


@dataclass(frozen=True, slots=True)
class Span:
    """``size`` consecutive items from ``start``."""

    start: int
    size: int

    @property
    def end(self) -> int:
        return self.start + self.size

    def scaled(self, factor: int) -> Span:
        return Span(self.start * factor, self.size * factor)


def balanced(total: int, parts: int, unit: int = 1) -> list[Span]:
    """``total`` items in ``parts`` contiguous spans, cut at multiples of ``unit`` (the last span takes a
    remainder that is not a whole unit), the first spans one unit larger when the units do not divide."""
    assert total >= 0 and parts >= 1 and unit >= 1, (total, parts, unit)
    units, rest = divmod(total, unit)
    spans, start = [], 0
    for i in range(parts):
        size = (units // parts + (i < units % parts)) * unit + (rest if i == parts - 1 else 0)
        spans.append(Span(start, size))
        start += size
    return spans


def head_spans(num_heads: int, num_kv_heads: int, world_size: int) -> list[tuple[Span, Span]]:
    """(query heads, KV heads) of each rank; ValueError when ``world_size`` cannot split them."""
    problem = tensor_parallel_problem(num_heads, num_kv_heads, world_size)
    if problem:
        raise ValueError(problem)
    group = num_heads // num_kv_heads
    if world_size <= num_kv_heads:
        return [(kv.scaled(group), kv) for kv in balanced(num_kv_heads, world_size)]
    per_rank, replicas = num_heads // world_size, world_size // num_kv_heads
    return [(Span(r * per_rank, per_rank), Span(r // replicas, 1)) for r in range(world_size)]


def tensor_parallel_problem(num_heads: int, num_kv_heads: int, world_size: int) -> str | None:
    """Why ``world_size`` ranks cannot split these heads, or None when they can."""
    if world_size < 1:
        return f"tensor_parallel_size must be >= 1, got {world_size}"
    if is_legal(num_heads, num_kv_heads, world_size):
        return None
    legal = ", ".join(str(n) for n in legal_sizes(num_heads, num_kv_heads))
    return (f"tensor_parallel_size {world_size} cannot split {num_heads} query heads over {num_kv_heads} KV heads "
            f"(more ranks than KV heads needs a multiple of the KV heads that divides the query heads); "
            f"legal sizes: {legal}")


def legal_sizes(num_heads: int, num_kv_heads: int, limit: int = 64) -> list[int]:
    """Every tensor-parallel size up to ``limit`` that can split these heads."""
    return [n for n in range(1, limit + 1) if is_legal(num_heads, num_kv_heads, n)]


def is_legal(num_heads: int, num_kv_heads: int, world_size: int) -> bool:
    return 1 <= world_size <= num_kv_heads or (world_size % num_kv_heads == 0 and num_heads % world_size == 0)


@dataclass(frozen=True, slots=True)
class RankShard:
    """What one rank of a ``world_size`` group holds of a model (rank 0 of 1: everything)."""

    rank: int
    world_size: int
    q_heads: Span
    kv_heads: Span
    intermediate: Span  # gate/up rows, down columns
    vocab: Span  # embedding and LM-head rows
    vocab_sizes: tuple[int, ...]  # every rank's vocabulary rows (the logits gather)

    @property
    def is_sharded(self) -> bool:
        return self.world_size > 1


def shard_model(num_heads: int, num_kv_heads: int, intermediate_size: int, vocab_size: int, rank: int,
                world_size: int) -> RankShard:
    """Rank ``rank``'s share of a decoder with these sizes (see the module docstring)."""
    assert 0 <= rank < world_size, (rank, world_size)
    q_heads, kv_heads = head_spans(num_heads, num_kv_heads, world_size)[rank]
    mlp_unit = MLP_UNIT if intermediate_size % MLP_UNIT == 0 and intermediate_size >= MLP_UNIT * world_size else 1
    vocab = balanced(vocab_size, world_size, VOCAB_UNIT if vocab_size >= VOCAB_UNIT * world_size else 1)
    return RankShard(rank, world_size, q_heads, kv_heads, balanced(intermediate_size, world_size, mlp_unit)[rank],
                     vocab[rank], tuple(s.size for s in vocab))


def max_kv_heads(num_heads: int, num_kv_heads: int, world_size: int) -> int:
    """KV heads on the rank that holds the most: the per-rank KV cache is sized for it, so every rank has
    the same number of blocks."""
    return max(kv.size for _, kv in head_spans(num_heads, num_kv_heads, world_size))
