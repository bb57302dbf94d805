"""Decode steps of 1-3 rows in one C call (`llama_decode_rows`, kernels/cpu_decode.c) against the module path.

tiny-llama with its linears requantized to Q4_1 blocks (float16 d and m, as GGUF stores them) and its LM
head to Q8_0 blocks; at every decode step the module path (each layer's kernels, themselves checked against
torch references in kernels/test_cpu_kernels.py) runs first on the same inputs, then the one C call, and
their logits are compared.
"""

from __future__ import annotations

import pytest
import torch

from native_engine.kernels import cpu_kernels
from native_engine.layers.quant import BlockWeight
from native_engine.models.cpu_decode import CPUDecodeStack

from .conftest import PRESETS, new_engine
from .helpers import greedy, kl_per_position

pytestmark = pytest.mark.skipif(cpu_kernels.library() is None, reason="no C compiler: decode runs through modules")


def q4_1(w: torch.Tensor) -> BlockWeight:
    groups = w.view(w.shape[0], -1, 32)
    lo, hi = groups.amin(-1), groups.amax(-1)
    d, m = ((hi - lo) / 15).half().float(), lo.half().float()
    q = ((groups - m[..., None]) / d[..., None].clamp_min(1e-8)).round().clamp(0, 15).to(torch.uint8)
    return BlockWeight.q4_1(q.view(w.shape), d, m)


def q8_0(w: torch.Tensor) -> BlockWeight:
    groups = w.view(w.shape[0], -1, 32)
    d = (groups.abs().amax(-1) / 127).half().float()
    q = (groups / d[..., None].clamp_min(1e-8)).round().clamp(-127, 127).to(torch.int8)
    return BlockWeight.q8_0(q.view(w.shape), d)


def requantized_engine(tmp_path, name: str, spec, num_blocks: int, **engine_args):
    """An engine of `spec` (random f32 weights) whose linears compute on Q4_1 blocks; its model."""
    from registry.modelbuilder import build_gguf

    from .conftest import BuiltModel

    path = build_gguf(tmp_path / f"{name}.gguf", spec, dtype="f32")
    engine = new_engine(BuiltModel(name, spec, path, path), num_blocks=num_blocks, block_size=4, **engine_args)
    lm = engine.model_runner.model
    for layer in lm.model.layers:
        for linear in (layer.self_attn.qkv_proj, layer.self_attn.o_proj, layer.mlp.gate_up_proj, layer.mlp.down_proj):
            linear.int4 = q4_1(linear.weight.data)
    return engine, lm


class ModulePath:
    """Stands in for the model's CPUDecodeStack: each step through the layers' modules first (`expected`, the
    final-norm output), then through the stack, whose output is returned; subclasses record the distance."""

    def __init__(self, lm, stack: CPUDecodeStack) -> None:
        self.lm, self.stack, self.rows, self.diff = lm, stack, [], []

    def can_run(self, num_tokens, ctx) -> bool:
        return self.stack.can_run(num_tokens, ctx)

    def __call__(self, hidden, positions, ctx):
        model = self.lm.model
        h, residual = hidden.clone(), None
        for layer in model.layers:
            h, residual = layer(positions, h, residual, ctx)
        expected = model.norm(h, residual)[0]
        out = self.stack(hidden.clone(), positions, ctx)
        self.compare(len(hidden), expected, out, ctx)
        return out


class Checked(ModulePath):
    """1-3 rows: the logits the C call left in ctx.logits against the module path's LM head."""

    def __init__(self, lm, stack: CPUDecodeStack) -> None:
        super().__init__(lm, stack)
        self.kl = []

    def compare(self, rows, normed, out, ctx) -> None:
        expected = self.lm.lm_head(normed)
        assert ctx.logits is not None and ctx.logits.shape == expected.shape
        self.rows.append(rows)
        self.kl.append(float(kl_per_position(expected, ctx.logits).max()))
        self.diff.append(float((ctx.logits - expected).abs().max() / expected.abs().max()))


@pytest.mark.parametrize("threads", [1, 2])
def test_decode_rows_in_one_c_call_match_the_module_path(tmp_path, threads, monkeypatch):
    engine, lm = requantized_engine(tmp_path, "tiny-llama", PRESETS["tiny-llama"], num_blocks=64)
    lm.lm_head.packed = (q8_0(lm.lm_head.weight.data),)
    stack = CPUDecodeStack.build(lm.model, lm.lm_head)
    assert stack is not None and stack.rows is not None and stack.head is not None
    lm.model.cpu_decode = checked = Checked(lm, stack)
    monkeypatch.setattr(torch, "get_num_threads", lambda: threads)  # what the C call is given

    prompts = [[5, 17, 300, 2, 9], list(range(40, 61)), [7]]
    outputs = engine.generate(prompts, [greedy(n) for n in (6, 12, 20)])

    assert [len(o.outputs[0].token_ids) for o in outputs] == [6, 12, 20]
    assert {1, 2, 3} <= set(checked.rows)  # three rows, then two, then one
    # both round matmul inputs to int16 per group of 32 (module path: per matmul call), so not bit-equal
    assert max(checked.kl) < 1e-8 and max(checked.diff) < 1e-3, (max(checked.kl), max(checked.diff))


class CheckedBatch(ModulePath):
    """4+ rows (`llama_decode_batch`, head left to Python): the final-norm outputs."""

    def compare(self, rows, expected, out, ctx) -> None:
        if rows >= 4:
            self.rows.append(rows)
            self.diff.append(float((out - expected).abs().max() / expected.abs().max()))


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("preset", ["tiny-llama", "tiny-qwen2"])  # qwen2: a bias on qkv
def test_decode_batches_in_one_parallel_region_match_the_module_path(tmp_path, threads, preset, monkeypatch):
    from native_engine.kernels import cpu_batch

    if cpu_batch.library() is None:
        pytest.skip("a plain-C build (no AVX2 or AVX-512 tier): batches use the float32 kernels")
    spec = PRESETS[preset].with_(hidden_size=256, num_heads=4, num_kv_heads=2)  # head_dim 64, 2 heads a group
    engine, lm = requantized_engine(tmp_path, f"{preset}-64", spec, num_blocks=96)
    assert (lm.model.layers[0].self_attn.qkv_proj.bias is not None) == (preset == "tiny-qwen2")
    stack = CPUDecodeStack.build(lm.model, lm.lm_head)
    assert stack is not None and stack.batch_pointers is not None
    lm.model.cpu_decode = checked = CheckedBatch(lm, stack)
    monkeypatch.setattr(torch, "get_num_threads", lambda: threads)

    prompts = [[5, 17, 300, 2, 9], list(range(40, 61)), [7], [8, 9], list(range(100, 137)), [11, 12, 13]]
    outputs = engine.generate(prompts, [greedy(n) for n in (6, 9, 12, 15, 18, 21)])

    assert [len(o.outputs[0].token_ids) for o in outputs] == [6, 9, 12, 15, 18, 21]
    assert {4, 5, 6} <= set(checked.rows)
    # int16-rounded matmul inputs on both sides, attention summed in another order: ~2e-4 of max |hidden|
    assert max(checked.diff) < 1e-3, max(checked.diff)


class CheckedLoRABatch(CheckedBatch):
    """Steps of which some rows have an adapter (from one row on, all in `llama_decode_batch`): the C step's LoRA
    deltas against the layers' (`LoRALayer.apply`)."""

    def compare(self, rows, expected, out, ctx) -> None:
        if ctx.lora is not None:
            self.rows.append(rows)
            self.diff.append(float((out - expected).abs().max() / expected.abs().max()))


def _two_adapter_engine(tmp_path, threads: int, monkeypatch, ranks: tuple[int, int], num_blocks: int):
    """A 64-wide tiny Llama whose C decode step is checked against the module path (`CheckedLoRABatch`), and two
    adapters: a1 on every projection, a2 on q, v and down only; the C call is given `threads`."""
    from native_engine.kernels import cpu_batch
    from registry.modelbuilder import LoraSpec, build_lora

    if cpu_batch.library() is None:
        pytest.skip("a plain-C build (no AVX2 or AVX-512 tier): batches use the float32 kernels")
    spec = PRESETS["tiny-llama"].with_(hidden_size=256, num_heads=4, num_kv_heads=2)
    engine, lm = requantized_engine(tmp_path, "tiny-llama-64", spec, num_blocks=num_blocks, max_loras=2)
    adapters = {"a1": LoraSpec(rank=ranks[0], alpha=32.0, seed=1),
                "a2": LoraSpec(rank=ranks[1], alpha=16.0, targets=("q_proj", "v_proj", "down_proj"), seed=2)}
    paths = {name: build_lora(tmp_path / f"{name}.gguf", spec, lora) for name, lora in adapters.items()}
    stack = CPUDecodeStack.build(lm.model, lm.lm_head)
    assert stack is not None and stack.batch_pointers is not None
    lm.model.cpu_decode = checked = CheckedLoRABatch(lm, stack)
    monkeypatch.setattr(torch, "get_num_threads", lambda: threads)
    return engine, lm, stack, paths, checked


@pytest.mark.parametrize("threads", [1, 2, 3])  # 3 on 2 cores: a thread late in an op, others already on
def test_decode_batches_with_lora_adapters_match_the_module_path(tmp_path, threads, monkeypatch):
    """Rows of two adapters (one on every projection, one on q, v and down only) and of the base in one step:
    `llama_decode_batch` adds each row's adapter deltas as the module path does."""
    from native_engine import LoRARequest

    engine, lm, stack, paths, checked = _two_adapter_engine(tmp_path, threads, monkeypatch, (8, 4), num_blocks=96)

    prompts = [[5, 17, 300, 2, 9], list(range(40, 61)), [7], [8, 9], list(range(100, 137)), [11, 12, 13]]
    names = ["a1", "a2", None, "a1", "a2", "a1"]
    requests = [None if n is None else LoRARequest(n, str(paths[n])) for n in names]
    params = [greedy(n) for n in (6, 9, 12, 15, 18, 21)]
    outputs = engine.generate(prompts, params, lora_request=requests)

    assert [len(o.outputs[0].token_ids) for o in outputs] == [6, 9, 12, 15, 18, 21]
    assert {1, 2, 3, 4, 5, 6} <= set(checked.rows)  # LoRA steps of 1 to 6 rows went through the C call
    assert max(checked.diff) < 1e-3, max(checked.diff)
    lm.model.cpu_decode = stack
    base = engine.generate(prompts, params)
    assert [o.outputs[0].token_ids for o in base] != [o.outputs[0].token_ids for o in outputs]  # the deltas matter


@pytest.mark.parametrize("threads", [1, 2])
def test_long_runs_of_one_adapter_match_the_module_path(tmp_path, threads, monkeypatch):
    """A step whose rows are mostly one adapter's (as 16 requests through one adapter are): the C step cuts such a
    run into groups of up to 8 rows (4 on AVX2) of equal size for the shrink and takes it 8 rows at a time in the
    expand; with rows of another adapter and of the base beside it, every row gets its own deltas."""
    from native_engine import LoRARequest

    engine, lm, stack, paths, checked = _two_adapter_engine(tmp_path, threads, monkeypatch, (16, 8), num_blocks=256)

    names = ["a1"] * 11 + ["a2", None, "a2"]
    prompts = [[5 + i, 17, 300 - i, 2, 9][: 1 + i % 5] for i in range(len(names))]
    requests = [None if n is None else LoRARequest(n, str(paths[n])) for n in names]
    params = [greedy(4 + i % 6) for i in range(len(names))]
    outputs = engine.generate(prompts, params, lora_request=requests)

    assert [len(o.outputs[0].token_ids) for o in outputs] == [4 + i % 6 for i in range(len(names))]
    assert max(checked.rows) == len(names)  # every request decoding in one C step: a run of 11 rows of a1
    assert max(checked.diff) < 1e-3, max(checked.diff)
