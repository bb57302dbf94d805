import torch

from native_engine.kernels import cpu_kernels
from native_engine.kernels._triton import (
    assert_last_dim_contiguous,
    tl,
    triton,
    use_triton,
)


@triton.jit
def _rotate(x_ptr, num_heads, cos, sin, head_dim, half,
            IS_NEOX: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr):
    heads = tl.arange(0, BLOCK_H)[:, None]
    offs = tl.arange(0, BLOCK_HALF)[None, :]
    mask = (heads < num_heads) & (offs < half)
    if IS_NEOX:
        ptr1 = x_ptr + heads * head_dim + offs
        ptr2 = ptr1 + half
    else:
        ptr1 = x_ptr + heads * head_dim + 2 * offs
        ptr2 = ptr1 + 1
    x1 = tl.load(ptr1, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(ptr2, mask=mask, other=0.0).to(tl.float32)
    tl.store(ptr1, (x1 * cos - x2 * sin).to(x_ptr.dtype.element_ty), mask=mask)
    tl.store(ptr2, (x2 * cos + x1 * sin).to(x_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _rotary_embedding_kernel(
    positions_ptr, q_ptr, k_ptr, cos_sin_ptr,
    q_stride, k_stride, cos_sin_stride, num_heads, num_kv_heads, head_dim,
    IS_NEOX: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_KV: tl.constexpr, BLOCK_HALF: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    half = head_dim // 2
    pos = tl.load(positions_ptr + token)
    offs = tl.arange(0, BLOCK_HALF)[None, :]
    cs_row = cos_sin_ptr + pos * cos_sin_stride
    cos = tl.load(cs_row + offs, mask=offs < half, other=0.0).to(tl.float32)
    sin = tl.load(cs_row + half + offs, mask=offs < half, other=0.0).to(tl.float32)
    _rotate(q_ptr + token * q_stride, num_heads, cos, sin, head_dim, half, IS_NEOX, BLOCK_H, BLOCK_HALF)
    _rotate(k_ptr + token * k_stride, num_kv_heads, cos, sin, head_dim, half, IS_NEOX, BLOCK_KV, BLOCK_HALF)


def _check(positions, query, key, head_dim, cos_sin_cache) -> None:
    assert positions.dim() == 1 and positions.dtype in (torch.int32, torch.int64), (positions.shape, positions.dtype)
    assert query.dim() == 2 and key.dim() == 2 and query.shape[0] == key.shape[0] == positions.shape[0]
    assert query.shape[1] % head_dim == 0 and key.shape[1] % head_dim == 0 and head_dim % 2 == 0, head_dim
    assert cos_sin_cache.dim() == 2 and cos_sin_cache.shape[1] == head_dim, "cos_sin_cache must be [max_pos, head_dim]"
    assert query.dtype == key.dtype and query.dtype in (torch.float32, torch.float16, torch.bfloat16), query.dtype
    assert positions.is_contiguous()
    assert_last_dim_contiguous(query, key, cos_sin_cache)


def rotary_embedding_triton(
    positions: torch.Tensor,  # [T]
    query: torch.Tensor,  # [T, nh*D]
    key: torch.Tensor,  # [T, nkv*D]
    head_dim: int,
    cos_sin_cache: torch.Tensor,  # [max_pos, D]
    is_neox: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    _check(positions, query, key, head_dim, cos_sin_cache)
    num_heads, num_kv_heads = query.shape[1] // head_dim, key.shape[1] // head_dim
    if positions.shape[0] == 0:
        return query, key
    _rotary_embedding_kernel[(positions.shape[0],)](
        positions, query, key, cos_sin_cache,
        query.stride(0), key.stride(0), cos_sin_cache.stride(0), num_heads, num_kv_heads, head_dim,
        IS_NEOX=is_neox, BLOCK_H=triton.next_power_of_2(num_heads), BLOCK_KV=triton.next_power_of_2(num_kv_heads),
        BLOCK_HALF=triton.next_power_of_2(head_dim // 2),
    )
    return query, key


def _rotate_ref(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, head_dim: int, is_neox: bool) -> None:
    x = x.view(x.shape[0], -1, head_dim)  # [T, n, D]; cos, sin [T, 1, D/2]
    x1, x2 = (x[..., : head_dim // 2], x[..., head_dim // 2 :]) if is_neox else (x[..., 0::2], x[..., 1::2])
    x1f, x2f = x1.float(), x2.float()
    out1, out2 = x1f * cos - x2f * sin, x2f * cos + x1f * sin
    x1.copy_(out1)
    x2.copy_(out2)


def rotary_embedding_ref(
    positions: torch.Tensor,  # [T]
    query: torch.Tensor,  # [T, nh*D]
    key: torch.Tensor,  # [T, nkv*D]
    head_dim: int,
    cos_sin_cache: torch.Tensor,  # [max_pos, D]
    is_neox: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    cos, sin = cos_sin_cache.index_select(0, positions).float().unsqueeze(1).chunk(2, dim=-1)
    _rotate_ref(query, cos, sin, head_dim, is_neox)
    _rotate_ref(key, cos, sin, head_dim, is_neox)
    return query, key


def rotary_embedding(
    positions: torch.Tensor,  # [T]
    query: torch.Tensor,  # [T, nh*D]
    key: torch.Tensor,  # [T, nkv*D]
    head_dim: int,
    cos_sin_cache: torch.Tensor,  # [max_pos, D]
    is_neox: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    if use_triton(query):
        return rotary_embedding_triton(positions, query, key, head_dim, cos_sin_cache, is_neox)
    if is_neox and cpu_kernels.serves(query, key, cos_sin_cache) and query.stride(1) == key.stride(1) == 1:
        return cpu_kernels.rotary_neox(positions, query, key, head_dim, cos_sin_cache)
    return rotary_embedding_ref(positions, query, key, head_dim, cos_sin_cache, is_neox)
