"""Paged KV-cache blocks: ref counts, copy-on-write and a hash-chained prefix cache with LRU eviction (torch-free).

A sequence's block_table always covers exactly its computed tokens plus the tokens scheduled this step.
A verify step of speculative decoding schedules draft tokens that may be rejected: `truncate` then frees
the blocks past the computed tokens (their KV belongs to rejected tokens; they were never hashed, since
only full blocks of computed tokens are).
Free blocks sit in one LRU-ordered dict: cached (hashed) blocks stay findable until they are popped for reuse.
The chain of a sequence run through a LoRA adapter starts from the adapter's name (vLLM's extra hash keys), so
the same prompt through two adapters, or through an adapter and the base, never shares KV.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field

from native_engine.sequence import Sequence


def compute_hash(token_ids: Iterable[int], prefix_hash: int = -1) -> int:
    """Chained hash of one full block; prefix_hash is the previous block's hash (-1 for the first)."""
    return hash((prefix_hash, tuple(token_ids)))


def root_hash(seq: Sequence) -> int:
    """The prefix hash before a sequence's first block: -1, or its adapter's."""
    return -1 if seq.lora_request is None else hash(("lora", seq.lora_request.lora_name))


@dataclass(slots=True)
class Block:
    block_id: int
    ref_count: int = 0
    hash: int = -1  # -1 = not (yet) in the prefix cache
    token_ids: list[int] = field(default_factory=list)

    def reset(self) -> None:
        self.ref_count, self.hash, self.token_ids = 1, -1, []


class BlockManager:
    __slots__ = (
        "block_size",
        "blocks",
        "enable_prefix_caching",
        "free_block_ids",
        "hash_to_block_id",
        "num_prefix_hit_tokens",
        "num_prefix_query_tokens",
    )

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"need num_blocks >= 1 and block_size >= 1, got {num_blocks} and {block_size}")
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.free_block_ids: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))  # LRU first
        self.hash_to_block_id: dict[int, int] = {}
        self.num_prefix_query_tokens = 0
        self.num_prefix_hit_tokens = 0

    # ---- stats
    @property
    def num_total_blocks(self) -> int:
        return len(self.blocks)

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_block_ids)

    @property
    def num_cached_blocks(self) -> int:
        return len(self.hash_to_block_id)

    @property
    def usage(self) -> float:
        return 1.0 - self.num_free_blocks / self.num_total_blocks

    def kv_waste(self, seqs: Iterable[Sequence]) -> float:
        """Allocated-but-unused slots / allocated slots over the given sequences (0.0 if nothing is allocated)."""
        allocated = used = 0
        for seq in seqs:
            slots = len(seq.block_table) * self.block_size
            allocated += slots
            used += min(seq.num_tokens, slots)
        return (allocated - used) / allocated if allocated else 0.0

    # ---- prefix cache
    def get_computed_blocks(self, seq: Sequence) -> list[int]:
        """Leading full blocks of seq found in the cache; never all tokens (the last one must run for logits)."""
        if not self.enable_prefix_caching:
            return []
        hits: list[int] = []
        prefix_hash = root_hash(seq)
        for i in range((seq.num_tokens - 1) // self.block_size):
            token_ids = self._block_tokens(seq, i)
            prefix_hash = compute_hash(token_ids, prefix_hash)
            block_id = self.hash_to_block_id.get(prefix_hash)
            if block_id is None or self.blocks[block_id].token_ids != token_ids:
                break
            hits.append(block_id)
        return hits

    def hash_blocks(self, seq: Sequence) -> None:
        """Register the full blocks whose KV is now computed (call after num_computed_tokens advanced)."""
        if not self.enable_prefix_caching:
            return
        table, end = seq.block_table, seq.num_computed_tokens // self.block_size
        start = end
        while start > 0 and self.blocks[table[start - 1]].hash == -1:
            start -= 1
        prefix_hash = self.blocks[table[start - 1]].hash if start else root_hash(seq)
        for i in range(start, end):
            block = self.blocks[table[i]]
            block.token_ids = self._block_tokens(seq, i)
            prefix_hash = block.hash = compute_hash(block.token_ids, prefix_hash)
            self.hash_to_block_id.setdefault(prefix_hash, block.block_id)

    # ---- KV transfer between engines (kv_transfer.py)
    def find_prefix(self, token_ids: list[int], num_blocks: int) -> list[int]:
        """The cached blocks holding the first ``num_blocks`` full blocks of ``token_ids``, as far as all are."""
        found: list[int] = []
        prefix_hash = -1
        for i in range(num_blocks if self.enable_prefix_caching else 0):
            block_tokens = token_ids[i * self.block_size:(i + 1) * self.block_size]
            prefix_hash = compute_hash(block_tokens, prefix_hash)
            block_id = self.hash_to_block_id.get(prefix_hash)
            if block_id is None or self.blocks[block_id].token_ids != block_tokens:
                return []
            found.append(block_id)
        return found

    def import_prefix(self, token_ids: list[int], num_blocks: int) -> list[tuple[int, int]]:
        """Register the first ``num_blocks`` full blocks of ``token_ids`` as cached, free blocks (most recently
        used); returns (block index, block id) of those not cached already, whose KV the caller writes now.
        [] when prefix caching is off or too few blocks are free (the prompt is then recomputed)."""
        if not self.enable_prefix_caching:
            return []
        wanted, kept, prefix_hash = [], 0, -1
        for i in range(num_blocks):
            block_tokens = token_ids[i * self.block_size:(i + 1) * self.block_size]
            prefix_hash = compute_hash(block_tokens, prefix_hash)
            block_id = self.hash_to_block_id.get(prefix_hash)
            if block_id is None or self.blocks[block_id].token_ids != block_tokens:
                wanted.append((i, prefix_hash, block_tokens))
            elif block_id in self.free_block_ids:  # held already: kept from eviction by the imports below
                self.free_block_ids.move_to_end(block_id)
                kept += 1
        if len(wanted) > self.num_free_blocks - kept:
            return []
        targets = []
        for i, block_hash, block_tokens in wanted:
            block = self.blocks[self._pop_free_block()]
            block.ref_count, block.hash, block.token_ids = 0, block_hash, block_tokens
            self.hash_to_block_id[block_hash] = block.block_id
            self.free_block_ids[block.block_id] = None  # free and cached, evicted last
            targets.append((i, block.block_id))
        return targets

    # ---- allocation
    def can_allocate(self, seq: Sequence, num_new_tokens: int, computed_blocks: list[int] | None = None) -> bool:
        return self._num_required_blocks(seq, num_new_tokens, computed_blocks) <= self.num_free_blocks

    def allocate(
        self, seq: Sequence, num_new_tokens: int, computed_blocks: list[int] | None = None
    ) -> list[tuple[int, int]]:
        """Grow seq.block_table to cover num_computed_tokens + num_new_tokens; return (src, dst) block copies.

        A seq without blocks first takes its prefix-cache hits (computed_blocks, looked up when None), which set
        num_computed_tokens; num_new_tokens then counts the tokens after the hits.
        """
        table = seq.block_table
        if table and not self._needs_copy(seq, num_new_tokens):  # a running sequence grows (the usual case)
            needed = -(-(seq.num_computed_tokens + num_new_tokens) // self.block_size) - len(table)
            assert needed <= self.num_free_blocks, f"need {needed} blocks, {self.num_free_blocks} free"
            for _ in range(needed):
                table.append(self._pop_free_block())
            return []
        if not seq.block_table and computed_blocks is None:
            computed_blocks = self.get_computed_blocks(seq)
        required = self._num_required_blocks(seq, num_new_tokens, computed_blocks)
        assert required <= self.num_free_blocks, f"need {required} blocks, {self.num_free_blocks} free"
        if not seq.block_table:
            self._take_prefix(seq, computed_blocks or [])
        copies = [self._copy_on_write(seq)] if self._needs_copy(seq, num_new_tokens) else []
        num_blocks = -(-(seq.num_computed_tokens + num_new_tokens) // self.block_size)
        while len(seq.block_table) < num_blocks:
            seq.block_table.append(self._pop_free_block())
        return copies

    def can_append(self, seq: Sequence) -> bool:
        return self.can_allocate(seq, 1)

    def append(self, seq: Sequence) -> list[tuple[int, int]]:
        return self.allocate(seq, 1)

    def fork(self, parent: Sequence, child: Sequence) -> None:
        for block_id in parent.block_table:
            self.blocks[block_id].ref_count += 1
        child.block_table = list(parent.block_table)

    def truncate(self, seq: Sequence) -> None:
        """Roll the table back to the computed tokens: free the blocks that hold only rejected draft tokens.
        The slots of rejected tokens inside a kept block are simply overwritten by the next step."""
        keep = -(-seq.num_computed_tokens // self.block_size)
        while len(seq.block_table) > keep:
            self._release(seq.block_table.pop())
        seq.num_draft_computed_tokens = min(seq.num_draft_computed_tokens, seq.num_computed_tokens)

    def free(self, seq: Sequence) -> None:
        for block_id in reversed(seq.block_table):
            self._release(block_id)
        seq.block_table = []
        seq.num_computed_tokens = seq.num_draft_computed_tokens = 0

    # ---- private helpers
    def _block_tokens(self, seq: Sequence, i: int) -> list[int]:
        return seq.token_ids[i * self.block_size : (i + 1) * self.block_size]

    def _num_required_blocks(self, seq: Sequence, num_new_tokens: int, computed_blocks: list[int] | None) -> int:
        if seq.block_table:
            num_blocks = -(-(seq.num_computed_tokens + num_new_tokens) // self.block_size)
            return max(0, num_blocks - len(seq.block_table)) + self._needs_copy(seq, num_new_tokens)
        hits = self.get_computed_blocks(seq) if computed_blocks is None else computed_blocks
        num_blocks = -(-(len(hits) * self.block_size + num_new_tokens) // self.block_size)
        return num_blocks - len(hits) + sum(self.blocks[b].ref_count == 0 for b in hits)

    def _needs_copy(self, seq: Sequence, num_new_tokens: int) -> bool:
        """The next token lands in a partly filled block shared with a fork."""
        offset = seq.num_computed_tokens % self.block_size
        if num_new_tokens == 0 or offset == 0:
            return False
        return self.blocks[seq.block_table[seq.num_computed_tokens // self.block_size]].ref_count > 1

    def _copy_on_write(self, seq: Sequence) -> tuple[int, int]:
        i = seq.num_computed_tokens // self.block_size
        src, dst = seq.block_table[i], self._pop_free_block()
        self.blocks[src].ref_count -= 1
        seq.block_table[i] = dst
        return src, dst

    def _take_prefix(self, seq: Sequence, hits: list[int]) -> None:
        assert seq.num_computed_tokens == 0, "a sequence without blocks has no computed tokens"
        for block_id in hits:
            if self.blocks[block_id].ref_count == 0:
                del self.free_block_ids[block_id]
            self.blocks[block_id].ref_count += 1
        seq.block_table = list(hits)
        seq.num_computed_tokens = len(hits) * self.block_size
        if seq.num_completion_tokens == 0:
            seq.num_cached_tokens = max(seq.num_cached_tokens, seq.num_computed_tokens)
        if self.enable_prefix_caching:
            self.num_prefix_query_tokens += seq.num_tokens
            self.num_prefix_hit_tokens += seq.num_computed_tokens

    def _pop_free_block(self) -> int:
        block_id, _ = self.free_block_ids.popitem(last=False)
        block = self.blocks[block_id]
        assert block.ref_count == 0, f"free block {block_id} has ref_count {block.ref_count}"
        if self._is_cached(block):
            del self.hash_to_block_id[block.hash]
        block.reset()
        return block_id

    def _release(self, block_id: int) -> None:
        block = self.blocks[block_id]
        block.ref_count -= 1
        assert block.ref_count >= 0, f"block {block_id} freed more often than taken"
        if block.ref_count == 0:
            self.free_block_ids[block_id] = None
            if not self._is_cached(block):  # nothing worth keeping: reuse it first
                self.free_block_ids.move_to_end(block_id, last=False)

    def _is_cached(self, block: Block) -> bool:
        return block.hash != -1 and self.hash_to_block_id.get(block.hash) == block.block_id

    def _check_invariants(self, seqs: Iterable[Sequence] | None = None) -> None:
        """Free blocks have no references, used ones do, the hash map is exact; with seqs: refs == table entries."""
        for block in self.blocks:
            assert (block.ref_count == 0) == (block.block_id in self.free_block_ids), block
        for h, block_id in self.hash_to_block_id.items():
            assert self.blocks[block_id].hash == h, (h, self.blocks[block_id])
        if seqs is not None:
            counts = [0] * len(self.blocks)
            for seq in seqs:
                for block_id in seq.block_table:
                    counts[block_id] += 1
            assert counts == [b.ref_count for b in self.blocks], "ref counts differ from block-table entries"
