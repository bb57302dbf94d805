"""Prefill attention (`layers/attention.prefill_attention`): right against a float64 reference with grouped
KV heads, with and without a cached prefix, and on CPU in float32 through PyTorch's flash kernel, not its math
kernel (bf16 keeps the math kernel: test_batching checks it stays batch-invariant)."""

from __future__ import annotations

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from native_engine.layers.attention import prefill_attention


def reference(q, k, v, num_cached, scale):  # q [n, nh, D]; k, v [num_cached + n, nkv, D]
    n, group = q.shape[0], q.shape[1] // k.shape[1]
    k, v = (x.double().repeat_interleave(group, dim=1).transpose(0, 1) for x in (k, v))
    scores = q.double().transpose(0, 1) @ k.transpose(1, 2) * scale
    visible = torch.arange(k.shape[1])[None, :] <= torch.arange(n)[:, None] + num_cached
    out = scores.masked_fill(~visible, float("-inf")).softmax(-1) @ v
    return out.transpose(0, 1)


@pytest.mark.parametrize("num_cached", [0, 37])
@pytest.mark.parametrize("heads", [(9, 3), (4, 4)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_prefill_attention_matches_reference(num_cached, heads, dtype):
    gen = torch.Generator().manual_seed(0)
    n, (nh, nkv), d = 45, heads, 64
    q = torch.randn(n, nh, d, generator=gen).to(dtype)
    k, v = (torch.randn(num_cached + n, nkv, d, generator=gen).to(dtype) for _ in range(2))
    out = prefill_attention(q, k, v, num_cached, d**-0.5)
    assert out.shape == (n, nh, d) and out.dtype == dtype
    atol = 2e-6 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(out.double(), reference(q, k, v, num_cached, d**-0.5), rtol=0, atol=atol)


@pytest.mark.parametrize("num_cached", [0, 16])
def test_prefill_attention_takes_the_flash_kernel_on_cpu(num_cached):
    q, k, v = torch.randn(64, 9, 64), torch.randn(num_cached + 64, 3, 64), torch.randn(num_cached + 64, 3, 64)
    with torch.inference_mode(), profile(activities=[ProfilerActivity.CPU]) as prof:
        prefill_attention(q, k, v, num_cached, 0.125)
    names = {event.key for event in prof.key_averages()}
    assert "aten::_scaled_dot_product_flash_attention_for_cpu" in names, sorted(names)
    assert "aten::_scaled_dot_product_attention_math" not in names


@pytest.mark.parametrize("total", [17, 100, 333, 600, 1100])
def test_cpu_prefill_gives_the_same_numbers_however_the_prompt_is_chunked_or_cached(total):
    """Cached and uncached prefills, and any chunking, compute bit-identical attention outputs."""
    gen = torch.Generator().manual_seed(total)
    q, k, v = torch.randn(total, 9, 64, generator=gen), torch.randn(total, 3, 64, generator=gen), torch.randn(
        total, 3, 64, generator=gen)
    whole = prefill_attention(q, k, v, 0, 0.125)
    for cached in sorted({16, 32, total // 2, total - 2} - {0}):  # the prefix cache serves whole blocks; any cut
        torch.testing.assert_close(prefill_attention(q[cached:], k, v, cached, 0.125), whole[cached:], rtol=0, atol=0)
    cuts = [0, total // 3, total // 3 + 7, total]
    chunks = [prefill_attention(q[a:b], k[:b], v[:b], a, 0.125) for a, b in zip(cuts, cuts[1:])]
    torch.testing.assert_close(torch.cat(chunks), whole, rtol=0, atol=0)
