import pytest
import torch

from native_engine.kernels.qkv_rope_cache import qkv_rope_cache, qkv_rope_cache_ref, qkv_rope_cache_triton
from tests.native_engine.kernels.helpers import DTYPES, on_gpu_only_if, randn, tolerances
from tests.native_engine.kernels.test_rotary_embedding import MAX_POS, cos_sin_cache

BLOCK_SIZE, NUM_BLOCKS = 4, 6


def _inputs(num_tokens, nh, nkv, hd, dtype, device, bias: bool):
    qkv = randn(num_tokens, (nh + 2 * nkv) * hd, dtype=dtype, device=device, seed=1)
    b = randn((nh + 2 * nkv) * hd, dtype=dtype, device=device, seed=2) if bias else None
    positions = torch.tensor([0, 1, 17, MAX_POS - 1, 5, 9][:num_tokens], device=device)
    slots = torch.tensor([3, -1, 0, 22, 7, 12][:num_tokens], device=device)  # -1: not written
    k_cache = randn(NUM_BLOCKS, BLOCK_SIZE, nkv, hd, dtype=dtype, device=device, seed=3)
    return qkv, b, positions, slots, k_cache, k_cache.clone() + 1


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("nh", "nkv", "hd"), [(14, 2, 64), (4, 4, 80), (28, 4, 128)])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("is_neox", [True, False])
def test_triton_matches_the_unfused_ops(device, dtype, nh, nkv, hd, bias, is_neox):
    on_gpu_only_if(device, (dtype == torch.bfloat16 and bias and is_neox and nh != 4)
                   or (dtype == torch.float32 and not bias and not is_neox and nh == 4))
    qkv, b, positions, slots, k_cache, v_cache = _inputs(6, nh, nkv, hd, dtype, device, bias)
    cache = cos_sin_cache(hd, device=device)
    ref_kv = (k_cache.clone(), v_cache.clone())
    ref = qkv_rope_cache_ref(qkv.clone(), b, positions, cache, *ref_kv, slots, nh, nkv, hd, is_neox)
    out = qkv_rope_cache_triton(qkv, b, positions, cache, k_cache, v_cache, slots, nh, nkv, hd, is_neox)
    for mine, theirs in zip(out, ref, strict=True):
        torch.testing.assert_close(mine, theirs, **tolerances(dtype))
    torch.testing.assert_close(k_cache, ref_kv[0], **tolerances(dtype))
    torch.testing.assert_close(v_cache, ref_kv[1], **tolerances(dtype))
    assert out[0].data_ptr() == qkv.data_ptr()  # views of qkv, computed in place


def test_cache_rows_hold_the_rotated_keys_and_untouched_slots_stay(device):
    nh, nkv, hd = 4, 2, 64
    qkv, b, positions, slots, k_cache, v_cache = _inputs(6, nh, nkv, hd, torch.float32, device, True)
    before_k, before_v = k_cache.clone(), v_cache.clone()
    _, k, v = qkv_rope_cache_triton(qkv, b, positions, cos_sin_cache(hd, device=device), k_cache, v_cache, slots,
                                    nh, nkv, hd)
    flat_k, flat_v = k_cache.view(-1, nkv, hd), v_cache.view(-1, nkv, hd)
    for t, slot in enumerate(slots.tolist()):
        if slot >= 0:
            torch.testing.assert_close(flat_k[slot], k[t].view(nkv, hd))
            torch.testing.assert_close(flat_v[slot], v[t].view(nkv, hd))
    written = {s for s in slots.tolist() if s >= 0}
    untouched = [s for s in range(NUM_BLOCKS * BLOCK_SIZE) if s not in written]
    assert torch.equal(flat_k[untouched], before_k.view(-1, nkv, hd)[untouched])
    assert torch.equal(flat_v[untouched], before_v.view(-1, nkv, hd)[untouched])


def test_dispatcher_without_a_cache_or_slots_only_biases_and_rotates():
    nh, nkv, hd = 4, 2, 64
    qkv, b, positions, _, _, _ = _inputs(4, nh, nkv, hd, torch.float32, "cpu", True)
    cache = cos_sin_cache(hd)
    expected = qkv_rope_cache_ref(qkv.clone(), b, positions, cache, torch.empty(0), torch.empty(0), None, nh, nkv, hd)
    got = qkv_rope_cache(qkv, b, positions, cache, torch.empty(0), torch.empty(0), None, nh, nkv, hd)
    for mine, theirs in zip(got, expected, strict=True):
        torch.testing.assert_close(mine, theirs)
