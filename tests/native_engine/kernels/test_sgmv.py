"""The SGMV kernels (`kernels/sgmv.py`) against the segmented matmul in torch: runs of rows of different
adapters (gaps between them: base rows), ranks below the stacked width, odd sizes."""

import itertools

import pytest
import torch

from native_engine.kernels.sgmv import sgmv_ref, sgmv_triton
from tests.native_engine.kernels.helpers import DTYPES, on_gpu_only_if, randn


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("k", "n", "rank_cap", "ranks"), [(64, 96, 16, [16, 8, 4]), (70, 33, 48, [48, 0, 24]),
                                                          (200, 130, 24, [3, 24, 17])])
def test_sgmv_equals_the_segmented_matmul(device, dtype, k, n, rank_cap, ranks):
    on_gpu_only_if(device, k == 64 or dtype == torch.float32)
    segments = [(0, 5, 1), (5, 6, 0), (9, 30, 2), (30, 31, 1)]  # rows 6..8 and 31..33: no adapter
    x, out = randn(34, k, dtype=dtype, device=device, seed=1), randn(34, n, dtype=dtype, device=device, seed=2)
    a = randn(3, rank_cap, k, dtype=dtype, device=device, seed=3)
    b = randn(3, rank_cap, n, dtype=dtype, device=device, seed=4)  # Bᵀ
    expected = sgmv_ref(x.float(), out.float().clone(), a.float(), b.float(), ranks, segments)
    table = torch.tensor([[s for s, _, _ in segments], [e - s for s, e, _ in segments],
                          [slot for _, _, slot in segments]], dtype=torch.int32, device=device)
    got = sgmv_triton(x, out.clone(), a, b, torch.tensor(ranks, dtype=torch.int32, device=device), table, 21)
    assert got.dtype == dtype
    tol = {"atol": 1e-4, "rtol": 1e-4} if dtype == torch.float32 else {"atol": 0.25, "rtol": 2e-2}
    torch.testing.assert_close(got.float(), expected, **tol)
    torch.testing.assert_close(got[6:9].float(), out[6:9].float(), atol=0, rtol=0)  # base rows untouched


@pytest.mark.parametrize("segments", [[(0, 2, 0), (2, 4, 1), (4, 6, 2)], [(0, 2, 1), (2, 4, 2), (5, 6, 0), (6, 7, 1)],
                                      [(1, 4, 0), (4, 7, 1), (7, 20, 2)]])
def test_batched_runs_equal_the_segmented_matmul(segments):
    from native_engine.kernels.sgmv import batches, sgmv_torch

    ranks = [8, 3, 0]
    a, b = randn(3, 8, 40, seed=3), randn(3, 8, 24, seed=4)  # A, Bᵀ
    for slot, r in enumerate(ranks):  # past a slot's rank: zeros, as LoRALayer keeps them
        a[slot, r:], b[slot, r:] = 0, 0
    x, out = randn(20, 40, seed=1), randn(20, 24, seed=2)
    expected = sgmv_ref(x, out.clone(), a, b, ranks, segments)
    runs = batches(segments)
    assert len(runs) < len(segments) or segments[0][0] == 1
    torch.testing.assert_close(sgmv_torch(x, out.clone(), a, b, ranks, runs), expected, atol=1e-5, rtol=1e-5)


def test_a_packed_linears_run_expands_only_its_shards_blocks():
    """Bᵀ block diagonal over a packed linear's shards (q: outputs 0..15, v: 24..31; k: none), as LoRALayer
    stacks it: expanding block by block gives the dense product, and outputs of no shard stay untouched."""
    from native_engine.kernels.sgmv import batches, sgmv_torch

    rank, blocks = 4, [[(0, 4, 0, 16), (4, 8, 24, 32)]]
    a, b = randn(1, 8, 40, seed=3), torch.zeros(1, 8, 32)
    b[0, 0:4, 0:16], b[0, 4:8, 24:32] = randn(4, 16, seed=4), randn(4, 8, seed=5)
    x, out = randn(9, 40, seed=1), randn(9, 32, seed=2)
    segments = [(0, 7, 0)]  # rows 7, 8: no adapter
    expected = sgmv_ref(x, out.clone(), a, b, [2 * rank], segments)
    got = sgmv_torch(x, out.clone(), a, b, [2 * rank], batches(segments), blocks)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    assert torch.equal(got[:, 16:24], out[:, 16:24]) and torch.equal(got[7:], out[7:])
    assert not torch.equal(got[:7, :16], out[:7, :16])


def _layer(shards: dict, in_features: int, out_features: int, adapters: list[tuple[int, int, tuple]], max_rank: int):
    """A `LoRALayer` stored as on the CPU (float16 stacks, Bᵀ's tiles) with `adapters`: (slot, rank, shards it
    targets); slot 3 stays empty."""
    from native_engine.lora.punica import LoRALayer, PunicaWrapper

    layer = LoRALayer(PunicaWrapper(), shards, max_loras=4, max_rank=max_rank)
    for slot, rank, targets in adapters:
        pairs = {s: (randn(rank, in_features, seed=10 * slot + i) / 8,
                     randn(shards[s][1] or out_features, rank, seed=10 * slot + i + 5) / 8)
                 for i, s in enumerate(targets)}
        layer.set_slot(slot, pairs, 2.0, out_features, torch.float16, torch.device("cpu"))
    assert layer.tiles is not None and layer.c_fields is not None
    return layer


def _runs(tokens: int) -> list[tuple[int, int]]:
    """(rows, slot) runs over `tokens` rows: runs of one slot (as the runner orders them) of 1..19 rows (from 8
    aligned rows on, the shrink vectorized over the rank), base rows (-1) between them, and rows of the empty slot 3."""
    runs, pattern = [], itertools.cycle([(1, 2), (19, 0), (2, -1), (3, 1), (1, 0), (12, 2), (2, 3), (9, 1), (5, 0)])
    while (left := tokens - sum(count for count, _ in runs)) > 0:
        count, slot = next(pattern)
        runs.append((min(count, left), slot))
    return runs


QKV = ({"q": (0, 64), "k": (64, 32), "v": (96, 32)}, 128)  # a packed qkv: 4 query heads, 2 KV heads of 16
GATE_UP = ({0: (0, 96), 1: (96, 96)}, 192)
DOWN = ({None: (0, None)}, 80)


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize(("linear", "tokens", "ranks"), [(QKV, 77, (16, 8)), (GATE_UP, 130, (16, 8)),
                                                         (DOWN, 4, (16, 8)), (QKV, 9, (16, 8)), (DOWN, 61, (12, 5))])
def test_tiled_matmul_with_lora_equals_the_segmented_matmul(linear, tokens, ranks, threads, monkeypatch):
    """`cpu_batch.tiled_matmul_lora` (a prefill's linear with its adapter rows in one C call) against the tiled
    matmul plus `sgmv_ref`: slots of rank 16 and 8 (or 12, the stacks' width, and 5) on every shard, one of the
    smaller rank on the first and last shards only, rows of mixed slots and of none (-1), row counts not a multiple
    of the kernel's 64-row blocks."""
    from native_engine.kernels import cpu_batch
    from native_engine.lora.punica import LoRAMapping
    from tests.native_engine.kernels.test_cpu_kernels import blocks

    if cpu_batch.library() is None:
        pytest.skip("a plain-C build (no AVX2 or AVX-512 tier): no tiled kernel, the torch loop serves")
    monkeypatch.setattr(torch, "get_num_threads", lambda: threads)
    shards, n = linear
    names = list(shards)
    big, small = ranks
    layer = _layer(shards, 96, n, [(0, big, names), (1, small, names), (2, small, (names[0], names[-1]))], big)
    tiled = cpu_batch.TiledBlocks.build(*blocks(n, 96, False))
    x = randn(tokens, 96, seed=1)
    layer.punica.mapping = mapping = LoRAMapping.build(_runs(tokens))

    got = tiled.matmul(x, layer.c_rows(x))
    base = tiled.matmul(x)
    expected = sgmv_ref(x, base.clone(), layer.a, layer.bt, layer.ranks, mapping.segments)
    delta = (expected - base).abs().amax()
    assert delta > 0.1
    torch.testing.assert_close(got, expected, rtol=0, atol=2e-6 * float(delta + base.abs().amax()))
    slots = mapping.row_slots(tokens)
    assert torch.equal(got[slots < 0], base[slots < 0]) and torch.equal(got[slots == 3], base[slots == 3])
    k, v = shards.get("k"), shards.get("v")
    if k is not None:  # slot 2 has no k: those outputs are the base's
        assert torch.equal(got[slots == 2, k[0] : k[0] + k[1]], base[slots == 2, k[0] : k[0] + k[1]])
        assert not torch.equal(got[slots == 2, v[0] : v[0] + v[1]], base[slots == 2, v[0] : v[0] + v[1]])
