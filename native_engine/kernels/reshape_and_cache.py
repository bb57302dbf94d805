import torch

from native_engine.kernels import cpu_kernels
from native_engine.kernels._triton import (
    assert_last_dim_contiguous,
    tl,
    triton,
    use_triton,
)


@triton.jit
def _reshape_and_cache_kernel(
    key_ptr, value_ptr, k_cache_ptr, v_cache_ptr, slot_mapping_ptr,
    key_stride_t, key_stride_h, value_stride_t, value_stride_h,
    cache_stride_b, cache_stride_s, cache_stride_h, block_size, num_kv_heads, head_dim,
    BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_mapping_ptr + token).to(tl.int64)
    if slot < 0:
        return
    heads = tl.arange(0, BLOCK_H)[:, None]
    dims = tl.arange(0, BLOCK_D)[None, :]
    mask = (heads < num_kv_heads) & (dims < head_dim)
    cache_slot = (slot // block_size) * cache_stride_b + (slot % block_size) * cache_stride_s
    cache_offs = cache_slot + heads * cache_stride_h + dims
    k = tl.load(key_ptr + token * key_stride_t + heads * key_stride_h + dims, mask=mask)
    v = tl.load(value_ptr + token * value_stride_t + heads * value_stride_h + dims, mask=mask)
    tl.store(k_cache_ptr + cache_offs, k, mask=mask)
    tl.store(v_cache_ptr + cache_offs, v, mask=mask)


def _check(key, value, k_cache, v_cache, slot_mapping) -> None:
    assert key.dim() == 3 and key.shape == value.shape, f"key/value must be [T, nkv, D]: {key.shape} {value.shape}"
    assert k_cache.dim() == 4 and k_cache.shape == v_cache.shape and k_cache.stride() == v_cache.stride()
    assert k_cache.shape[2:] == key.shape[1:], f"cache {tuple(k_cache.shape)} vs key {tuple(key.shape)}"
    assert key.dtype == value.dtype == k_cache.dtype == v_cache.dtype, (key.dtype, k_cache.dtype)
    assert slot_mapping.shape == (key.shape[0],) and slot_mapping.dtype in (torch.int32, torch.int64)
    assert slot_mapping.is_contiguous()
    assert_last_dim_contiguous(key, value, k_cache, v_cache)


def reshape_and_cache_triton(
    key: torch.Tensor,  # [T, nkv, D]
    value: torch.Tensor,  # [T, nkv, D]
    k_cache: torch.Tensor,  # [num_blocks, block_size, nkv, D]
    v_cache: torch.Tensor,  # [num_blocks, block_size, nkv, D]
    slot_mapping: torch.Tensor,  # [T], -1 = skip
) -> None:
    _check(key, value, k_cache, v_cache, slot_mapping)
    num_tokens, num_kv_heads, head_dim = key.shape
    if num_tokens == 0:
        return
    _reshape_and_cache_kernel[(num_tokens,)](
        key, value, k_cache, v_cache, slot_mapping,
        key.stride(0), key.stride(1), value.stride(0), value.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), k_cache.shape[1], num_kv_heads, head_dim,
        BLOCK_H=triton.next_power_of_2(num_kv_heads), BLOCK_D=triton.next_power_of_2(head_dim),
    )


def reshape_and_cache_ref(
    key: torch.Tensor,  # [T, nkv, D]
    value: torch.Tensor,  # [T, nkv, D]
    k_cache: torch.Tensor,  # [num_blocks, block_size, nkv, D]
    v_cache: torch.Tensor,  # [num_blocks, block_size, nkv, D]
    slot_mapping: torch.Tensor,  # [T], -1 = skip
) -> None:
    if slot_mapping.numel() and int(slot_mapping.min()) < 0:
        valid = slot_mapping >= 0
        slot_mapping, key, value = slot_mapping[valid], key[valid], value[valid]
    slots = slot_mapping.long()
    k_cache.view(-1, *k_cache.shape[2:]).index_copy_(0, slots, key)  # [num_blocks*block_size, nkv, D]
    v_cache.view(-1, *v_cache.shape[2:]).index_copy_(0, slots, value)


def reshape_and_cache(
    key: torch.Tensor,  # [T, nkv, D]
    value: torch.Tensor,  # [T, nkv, D]
    k_cache: torch.Tensor,  # [num_blocks, block_size, nkv, D]
    v_cache: torch.Tensor,  # [num_blocks, block_size, nkv, D]
    slot_mapping: torch.Tensor,  # [T], -1 = skip
) -> None:
    if use_triton(key):
        reshape_and_cache_triton(key, value, k_cache, v_cache, slot_mapping)
    elif (cpu_kernels.serves(key, value, k_cache) and k_cache.is_contiguous() and v_cache.is_contiguous()
          and key.stride()[1:] == value.stride()[1:] == (key.shape[2], 1)):
        cpu_kernels.cache_write(key, value, k_cache, v_cache, slot_mapping)
    else:
        reshape_and_cache_ref(key, value, k_cache, v_cache, slot_mapping)
