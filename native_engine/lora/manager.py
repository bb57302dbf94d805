"""Resident adapters: `max_loras` slots filled on first use, the least recently used one given up when
a new adapter needs a slot (never one the step uses: the scheduler keeps at most `max_loras` adapters
among the running requests).

An adapter is read and checked against the model when a request first names it (`check`, from
`add_request`, so a bad adapter fails its request alone), and kept on the host, grouped per layer, for the
`2 x max_loras` most recently named adapters, so a slot is refilled without reading the file again."""

from __future__ import annotations

import contextlib
from collections import OrderedDict

import torch
from torch import nn

from ..layers.linear import Linear
from .models import load_lora
from .punica import FLOAT16_MAX, LoRALayer, LoRAMapping, PunicaWrapper, storage_dtype
from .request import LoRARequest

LORA_MODULES = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")


class LoRAManager:
    def __init__(self, model: nn.Module, model_config, max_loras: int, device: torch.device,
                 dtype: torch.dtype, max_rank: int) -> None:
        self.model_config, self.max_loras, self.device = model_config, max_loras, device
        self.dtype = storage_dtype(device, dtype)
        self.max_rank = max_rank
        self.punica = PunicaWrapper()
        self.packed = getattr(model, "packed_modules_mapping", {})
        self.linears: dict[str, Linear] = {}
        for name, module in model.named_modules():
            if isinstance(module, Linear) and name.rsplit(".", 1)[-1] in LORA_MODULES:
                shards = getattr(module, "shard_offsets", None) or {None: (0, None)}
                module.lora = LoRALayer(self.punica, shards, max_loras, max_rank)
                self.linears[name] = module
        self.slots: OrderedDict[str, int] = OrderedDict()  # adapter name -> slot, least recently used first
        self.host: OrderedDict[str, tuple[float, dict]] = OrderedDict()  # name -> (scale, per-linear pairs)
        self.max_host = 2 * max_loras
        self.num_loads = 0  # adapters put into a slot
        self.num_reads = 0  # adapter files read

    def check(self, request: LoRARequest) -> None:
        """Read the adapter (once; then from the host cache) and check it fits the model; ValueError if not."""
        if request.lora_name in self.host:
            self.host.move_to_end(request.lora_name)
            return
        self.host[request.lora_name] = self._read(request)
        self.num_reads += 1
        while len(self.host) > self.max_host:
            self.host.popitem(last=False)

    def activate(self, scheduled: list) -> dict[str, int]:
        """A slot for each adapter of the step's rows (loading those not resident); name -> slot."""
        requests = [s.seq.lora_request for s in scheduled if s.seq.lora_request is not None]
        names = {r.lora_name for r in requests}
        assert len(names) <= self.max_loras, f"{len(names)} adapters in one step, max_loras is {self.max_loras}"
        for request in {r.lora_name: r for r in requests}.values():
            if request.lora_name in self.slots:
                self.slots.move_to_end(request.lora_name)
            else:
                self._load(request, self._free_slot(names))
        return {name: self.slots[name] for name in names}

    @staticmethod
    def mapping(ordered: list, slots: dict[str, int]) -> LoRAMapping | None:
        """The step's rows per slot, in batch order (`activate` gave the slots)."""
        return LoRAMapping.build([(s.num_new_tokens, -1 if s.seq.lora_request is None
                                   else slots[s.seq.lora_request.lora_name]) for s in ordered])

    @contextlib.contextmanager
    def step(self, mapping: LoRAMapping | None):
        """The layers see `mapping` during one forward, and nothing after it."""
        self.punica.mapping = mapping
        try:
            yield
        finally:
            self.punica.mapping = None

    def _free_slot(self, keep: set[str]) -> int:
        used = set(self.slots.values())
        free = [slot for slot in range(self.max_loras) if slot not in used]
        if free:
            return free[0]
        victim = next(name for name in self.slots if name not in keep)
        return self.slots.pop(victim)

    def _load(self, request: LoRARequest, slot: int) -> None:
        self.check(request)
        scale, by_module = self.host[request.lora_name]
        for name, linear in self.linears.items():
            pairs = {shard: by_module[name][shard] for shard in linear.lora.shards if shard in by_module[name]}
            linear.lora.set_slot(slot, pairs, scale, self._out_features(linear, pairs), self.dtype, self.device)
        self.slots[request.lora_name] = slot
        self.num_loads += 1

    def _read(self, request: LoRARequest) -> tuple[float, dict]:
        lora = load_lora(request.lora_name, request.lora_path, self.model_config)
        by_module: dict[str, dict] = {name: {} for name in self.linears}
        for base, pair in lora.weights.items():
            module, shard = self._target(base)
            if module not in self.linears:
                raise ValueError(f"LoRA adapter {request.lora_name!r} updates {base}, which the native engine "
                                 f"cannot adapt (only {', '.join(LORA_MODULES)})")
            if pair[0].shape[1] != self.linears[module].weight.shape[1]:
                raise ValueError(f"LoRA adapter {request.lora_name!r}: {base} takes {pair[0].shape[1]} inputs, "
                                 f"the model's {self.linears[module].weight.shape[1]}: made for another model")
            by_module[module][shard] = pair
        if self.dtype == torch.float16 and _largest(lora) > FLOAT16_MAX:
            raise ValueError(f"LoRA adapter {request.lora_name!r} has weights beyond float16's range "
                             f"(|A| or |B · alpha / r| > {FLOAT16_MAX:g}), which the CPU keeps adapters in")
        if lora.rank > self.max_rank:
            raise ValueError(f"LoRA adapter {request.lora_name!r} has rank {lora.rank}, more than max_lora_rank "
                             f"{self.max_rank}")
        return lora.scale, by_module

    def _target(self, base: str) -> tuple[str, object]:
        stem = base.removesuffix(".weight")
        for source, (packed, shard) in self.packed.items():
            if stem.endswith(f".{source}"):
                return stem.removesuffix(source) + packed, shard
        return stem, None

    @staticmethod
    def _out_features(linear: Linear, pairs: dict) -> int:
        sizes = [rows for _, rows in linear.lora.shards.values()]
        if None in sizes:
            return next(iter(pairs.values()))[1].shape[0] if pairs else 0
        return sum(sizes)


def _largest(lora) -> float:
    """The largest |value| the stacks would hold: of every A, and of every B times the scale."""
    return max(max(a.abs().max().item(), b.abs().max().item() * lora.scale) for a, b in lora.weights.values())
