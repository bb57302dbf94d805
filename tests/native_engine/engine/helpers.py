"""Shared helpers for the end-to-end engine tests."""

from __future__ import annotations

import torch

from native_engine import LLMEngine, SamplingParams
from native_engine.models import llama
from native_engine.output import RequestOutput


def greedy(max_tokens: int, **kwargs) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, **kwargs)


def seeded(max_tokens: int, seed: int, **kwargs) -> SamplingParams:
    kwargs = {"temperature": 0.8, "top_p": 0.9, **kwargs}
    return SamplingParams(max_tokens=max_tokens, seed=seed, ignore_eos=True, **kwargs)


def module_path(engine: LLMEngine, fused_decode: bool = False) -> LLMEngine:
    """The engine with its C decode stack off, so the module path runs every step; with ``fused_decode`` its
    few-row steps take the fused decode layers (no device check: on the CPU they run the torch references)."""
    model = engine.model_runner.model.model
    model.cpu_decode = None
    model.fused_decode = fused_decode
    return engine


def on_cuda_path(monkeypatch, kernel: str) -> list[tuple]:
    """The model's CUDA branches taken on the CPU (`use_triton` true: the kernels' torch references run), with
    `llama.<kernel>` recording each call's arguments first; returns that record."""
    calls: list[tuple] = []
    inner = getattr(llama, kernel)
    monkeypatch.setattr(llama, "use_triton", lambda x: True)
    monkeypatch.setattr(llama, kernel, lambda *a, **k: calls.append(a) or inner(*a, **k))
    return calls


def token_ids(outputs: list[RequestOutput]) -> list[list[int]]:
    """First completion's token ids of each request."""
    return [out.outputs[0].token_ids for out in outputs]


def all_token_ids(outputs: list[RequestOutput]) -> list[list[list[int]]]:
    """Every completion's token ids, per request, in index order."""
    return [[c.token_ids for c in out.outputs] for out in outputs]


def kl_per_position(reference: torch.Tensor, ours: torch.Tensor) -> torch.Tensor:
    """KL(reference || ours) at each position; logits [n, V] -> [n]."""
    ref, mine = reference.double().log_softmax(-1), ours.double().log_softmax(-1)
    return (ref.exp() * (ref - mine)).sum(-1)


def assert_all_blocks_free(engine: LLMEngine) -> None:
    stats = engine.stats()
    assert not engine.has_unfinished_requests()
    assert stats["num_free_blocks"] == stats["num_kvcache_blocks"], stats
    engine.scheduler.block_manager._check_invariants([])


class PreemptionCounter:
    """Wraps engine.scheduler.schedule and counts the sequences it preempts."""

    def __init__(self, engine: LLMEngine) -> None:
        self.count = 0
        self._schedule = engine.scheduler.schedule
        engine.scheduler.schedule = self  # instance attribute shadows the method

    def __call__(self):
        out = self._schedule()
        self.count += len(out.preempted)
        return out


def stream(engine: LLMEngine, requests: dict[str, tuple[list[int], SamplingParams]]) -> dict[str, list[RequestOutput]]:
    """add_request every request, then step until done; returns each request's outputs (deltas) in order."""
    for request_id, (prompt, params) in requests.items():
        engine.add_request(request_id, prompt, params)
    deltas: dict[str, list[RequestOutput]] = {request_id: [] for request_id in requests}
    while engine.has_unfinished_requests():
        for out in engine.step():
            deltas[out.request_id].append(out)
    return deltas
