import torch
import torch.nn.functional as F

from native_engine.kernels import cpu_kernels
from native_engine.kernels._triton import (
    assert_last_dim_contiguous,
    tl,
    triton,
    use_triton,
)


@triton.jit
def _fused_add_rms_norm_kernel(
    x_ptr, residual_ptr, weight_ptr, out_ptr, residual_out_ptr,
    x_stride, residual_stride, out_stride, residual_out_stride, hidden_size, eps,
    HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < hidden_size
    x = tl.load(x_ptr + row * x_stride + cols, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(residual_ptr + row * residual_stride + cols, mask=mask, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(x_ptr.dtype.element_ty)
        tl.store(residual_out_ptr + row * residual_out_stride + cols, x, mask=mask)
    xf = x.to(tl.float32)
    rstd = tl.rsqrt(tl.sum(xf * xf, axis=0) / hidden_size + eps)
    w = tl.load(weight_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * out_stride + cols, (xf * rstd * w).to(out_ptr.dtype.element_ty), mask=mask)


def _check(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor) -> None:
    assert x.dim() == 2, f"x must be [T, H], got {tuple(x.shape)}"
    assert x.dtype in (torch.float32, torch.float16, torch.bfloat16), x.dtype
    assert weight.shape == (x.shape[1],) and weight.is_contiguous(), f"weight must be [H], got {tuple(weight.shape)}"
    assert_last_dim_contiguous(x)
    if residual is not None:
        assert residual.shape == x.shape and residual.dtype == x.dtype, (residual.shape, residual.dtype)
        assert_last_dim_contiguous(residual)


def fused_add_rms_norm_triton(
    x: torch.Tensor,  # [T, H]
    residual: torch.Tensor | None,  # [T, H]
    weight: torch.Tensor,  # [H]
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    _check(x, residual, weight)
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    residual_out = x if residual is None else torch.empty_like(out)
    if x.shape[0] == 0:
        return out, residual_out
    block = triton.next_power_of_2(x.shape[1])
    r = x if residual is None else residual
    _fused_add_rms_norm_kernel[(x.shape[0],)](
        x, r, weight, out, residual_out,
        x.stride(0), r.stride(0), out.stride(0), residual_out.stride(0), x.shape[1], eps,
        HAS_RESIDUAL=residual is not None, BLOCK=block, num_warps=min(max(block // 256, 1), 16),
    )
    return out, residual_out


def rms_norm_ref(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:  # x [T, H], weight [H]
    return F.rms_norm(x.float(), weight.shape, weight.float(), eps).to(x.dtype)


def fused_add_rms_norm_ref(
    x: torch.Tensor,  # [T, H]
    residual: torch.Tensor | None,  # [T, H]
    weight: torch.Tensor,  # [H]
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    if residual is not None:
        x = x + residual
    return rms_norm_ref(x, weight, eps), x


def rms_norm_triton(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:  # x [T, H], weight [H]
    return fused_add_rms_norm_triton(x, None, weight, eps)[0]


def fused_add_rms_norm(
    x: torch.Tensor,  # [T, H]
    residual: torch.Tensor | None,  # [T, H]
    weight: torch.Tensor,  # [H]
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    if use_triton(x):
        return fused_add_rms_norm_triton(x, residual, weight, eps)
    if cpu_kernels.serves(x, weight):
        return cpu_kernels.add_rms_norm(x, residual, weight, eps)
    return fused_add_rms_norm_ref(x, residual, weight, eps)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:  # x [T, H], weight [H]
    if use_triton(x):
        return rms_norm_triton(x, weight, eps)
    if cpu_kernels.serves(x, weight):
        return cpu_kernels.add_rms_norm(x, None, weight, eps)[0]
    return rms_norm_ref(x, weight, eps)
