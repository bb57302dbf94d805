import torch
import torch.nn.functional as F

from native_engine.kernels import cpu_batch, cpu_kernels
from native_engine.kernels._triton import (
    assert_last_dim_contiguous,
    tl,
    triton,
    use_triton,
)


@triton.jit
def _silu_and_mul_kernel(
    x_ptr, out_ptr, x_stride, out_stride, inter_size,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < inter_size
    x_row = x_ptr + row.to(tl.int64) * x_stride
    a = tl.load(x_row + cols, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(x_row + inter_size + cols, mask=mask, other=0.0).to(tl.float32)
    out = a * tl.sigmoid(a) * b
    tl.store(out_ptr + row.to(tl.int64) * out_stride + cols, out.to(out_ptr.dtype.element_ty), mask=mask)


def silu_and_mul_triton(x: torch.Tensor) -> torch.Tensor:  # x [T, 2*I] -> [T, I]
    assert x.dim() == 2 and x.shape[1] % 2 == 0, f"x must be [T, 2*I], got {tuple(x.shape)}"
    assert x.dtype in (torch.float32, torch.float16, torch.bfloat16), x.dtype
    assert_last_dim_contiguous(x)
    num_tokens, inter_size = x.shape[0], x.shape[1] // 2
    out = torch.empty(num_tokens, inter_size, dtype=x.dtype, device=x.device)
    if num_tokens == 0:
        return out
    block = min(triton.next_power_of_2(inter_size), 1024)
    grid = (num_tokens, triton.cdiv(inter_size, block))
    _silu_and_mul_kernel[grid](x, out, x.stride(0), out.stride(0), inter_size, BLOCK=block)
    return out


def silu_and_mul_ref(x: torch.Tensor) -> torch.Tensor:  # x [T, 2*I] -> [T, I]
    a, b = x.chunk(2, dim=-1)
    return F.silu(a) * b


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:  # x [T, 2*I] -> [T, I]
    if use_triton(x):
        return silu_and_mul_triton(x)
    if cpu_batch.serves_silu_and_mul(x):
        return cpu_batch.silu_and_mul(x)
    return cpu_kernels.silu_and_mul(x) if cpu_kernels.serves(x) else silu_and_mul_ref(x)
