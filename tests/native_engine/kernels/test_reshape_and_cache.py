import pytest
import torch

from native_engine.kernels.reshape_and_cache import (
    reshape_and_cache,
    reshape_and_cache_ref,
    reshape_and_cache_triton,
)
from tests.native_engine.kernels.helpers import DTYPES, randn

NUM_BLOCKS, BLOCK_SIZE = 4, 16
SLOTS = [0, 15, 16, 17, -1, 33, 63, -1]  # block boundaries and padding


def make_inputs(num_kv_heads, head_dim, dtype, device, slots=SLOTS, slot_dtype=torch.int64):
    num_tokens = len(slots)  # key/value as strided views of one qkv tensor, like the model produces them
    kv = randn(num_tokens, 3 * num_kv_heads * head_dim, dtype=dtype, device=device)[:, num_kv_heads * head_dim :]
    key, value = (t.view(num_tokens, num_kv_heads, head_dim) for t in kv.chunk(2, dim=-1))
    kv_cache = randn(2, 2, NUM_BLOCKS, BLOCK_SIZE, num_kv_heads, head_dim, dtype=dtype, device=device, seed=1)
    slot_mapping = torch.tensor(slots, dtype=slot_dtype, device=device)
    return key, value, kv_cache[0, 1], kv_cache[1, 1], slot_mapping  # one layer's caches


def reshape_and_cache_naive(key, value, k_cache, v_cache, slot_mapping):
    for token, slot in enumerate(slot_mapping.tolist()):
        if slot >= 0:
            k_cache[slot // BLOCK_SIZE, slot % BLOCK_SIZE] = key[token]
            v_cache[slot // BLOCK_SIZE, slot % BLOCK_SIZE] = value[token]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("num_kv_heads", "head_dim"), [(1, 64), (2, 80), (3, 64)])
@pytest.mark.parametrize("slot_dtype", [torch.int32, torch.int64])
def test_triton_matches_reference(device, dtype, num_kv_heads, head_dim, slot_dtype):
    inputs = make_inputs(num_kv_heads, head_dim, dtype, device, slot_dtype=slot_dtype)
    key, value, k_cache, v_cache, slot_mapping = inputs
    ref_k, ref_v = k_cache.clone(), v_cache.clone()
    reshape_and_cache_ref(key, value, ref_k, ref_v, slot_mapping)
    reshape_and_cache_triton(key, value, k_cache, v_cache, slot_mapping)
    assert torch.equal(k_cache, ref_k) and torch.equal(v_cache, ref_v)


def test_triton_all_padding_and_empty(device):
    key, value, k_cache, v_cache, slot_mapping = make_inputs(2, 64, torch.float32, device, slots=[-1, -1])
    before = k_cache.clone(), v_cache.clone()
    reshape_and_cache_triton(key, value, k_cache, v_cache, slot_mapping)
    reshape_and_cache_triton(key[:0], value[:0], k_cache, v_cache, slot_mapping[:0])
    assert torch.equal(k_cache, before[0]) and torch.equal(v_cache, before[1])


def test_triton_asserts_dtype_and_shape():
    pytest.importorskip("triton")
    key, value, k_cache, v_cache, slot_mapping = make_inputs(2, 64, torch.float32, "cpu")
    with pytest.raises(AssertionError):
        reshape_and_cache_triton(key.half(), value.half(), k_cache, v_cache, slot_mapping)
    with pytest.raises(AssertionError):
        reshape_and_cache_triton(key, value, k_cache, v_cache, slot_mapping[:3])


@pytest.mark.parametrize("slots", [SLOTS, [5], [-1, -1], []])
def test_reference_matches_naive(slots):
    key, value, k_cache, v_cache, slot_mapping = make_inputs(2, 16, torch.float32, "cpu", slots=slots)
    want_k, want_v = k_cache.clone(), v_cache.clone()
    reshape_and_cache_naive(key, value, want_k, want_v, slot_mapping)
    reshape_and_cache_ref(key, value, k_cache, v_cache, slot_mapping)
    assert torch.equal(k_cache, want_k) and torch.equal(v_cache, want_v)


def test_dispatcher_writes_in_place_on_cpu():
    key, value, k_cache, v_cache, slot_mapping = make_inputs(1, 16, torch.bfloat16, "cpu")
    reshape_and_cache(key, value, k_cache, v_cache, slot_mapping)
    assert torch.equal(k_cache[1, 1], key[3]) and torch.equal(v_cache[3, 15], value[6])
