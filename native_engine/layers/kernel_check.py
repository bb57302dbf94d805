"""Every quantized matmul path proven on this CPU when a model loads, before it serves a token.

The fast paths depend on things a test on one machine cannot settle for another: PyTorch's int4 kernel
(a packed layout private to the kernel it picks per CPU), and the C kernels as compiled here (`-march`,
`INFER_CPU_MARCH`). So the first matrix of each format that asks for a path (the model's first layer)
lends its first rows: a few activation rows go through the path and through the float64 product of the
dequantized blocks, and the normalized mean squared error (llama.cpp's `test-backend-ops` measure) must
stay within the path's known error. A path that fails is not used for the rest of the process (callers
take the next one down, ending at the exact float32 path), and one warning names it with the CPU's
flags and PyTorch's capability. The cost: a handful of 64-row matmuls, well under a millisecond each.

Paths (`usable(path, blocks)`):
- "torch-int4": `Int4Weight` (PyTorch's `_weight_int4pack_mm_for_cpu`, bf16 activations);
- "blocks": `kernels/cpu_kernels.c` (1-3 rows: int16 activations; 4-31: float32 tiles; 32+: BLAS);
- "decode-rows": `llama_decode_rows`' matmul rows (`kernels/cpu_decode.c`, float16 scales);
- "tiled": the tiled batch kernel (`kernels/cpu_batch.c`), also under `llama_decode_batch`.
"""

from __future__ import annotations

import logging
import platform
from collections.abc import Callable

import torch

from ..kernels import cpu_batch, cpu_kernels
from . import quant

log = logging.getLogger(__name__)
ROWS = 64  # output rows lent by the first matrix: a multiple of the tiles (16) and of the decode pairs (2)
# The error each path is known to have, as NMSE against float64 (measured on SmolLM2's first layer: int16
# activations ~1e-10, float32 ~1e-14, bf16 ~1e-5); a wrong layout or a miscompiled kernel gives ~1.
LIMITS = {"torch-int4": 1e-3, "blocks": 1e-6, "decode-rows": 1e-6, "tiled": 1e-6}
_verdicts: dict[tuple[str, str], bool] = {}


def usable(path: str, q: torch.Tensor, d: torch.Tensor, m: torch.Tensor | None) -> bool:
    """Whether `path` multiplies these blocks right on this CPU (Q4_1: q [N, K] values 0..15, d, m [N, K / 32];
    Q8_0: q int8, m None). Decided on the first call per path and format, then remembered."""
    if not _available(path):
        return False  # not built here (no compiler, or a plain-C build without tiles): nothing to warn about
    fmt = "q8_0" if m is None else "q4_1"
    key = (path, fmt)
    if key not in _verdicts:
        _verdicts[key] = _check(path, fmt, q[:ROWS], d[:ROWS], None if m is None else m[:ROWS])
    return _verdicts[key]


def sample_blocks(fmt: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Random blocks of `fmt` ("q4_1" or "q8_0"), for a path whose matrix did not come as blocks (a float
    matrix recovered as exact 4- or 8-bit groups)."""
    g = torch.Generator().manual_seed(0)
    d = torch.rand(ROWS, 4, generator=g) / 50
    if fmt == "q8_0":
        return torch.randint(-127, 128, (ROWS, 128), dtype=torch.int8, generator=g), d, None
    return torch.randint(0, 16, (ROWS, 128), dtype=torch.uint8, generator=g), d, torch.randn(ROWS, 4, generator=g) / 50


def usable_weight(path: str, weight: quant.BlockWeight) -> bool:
    """`usable` for blocks kept as a `BlockWeight` (Q4_1 nibbles packed in GGUF order)."""
    return usable(path, weight.unpacked()[:ROWS], weight.d[:ROWS], None if weight.m is None else weight.m[:ROWS])


def verdicts() -> dict[str, bool]:
    """What was decided so far, as "path/format": passed."""
    return {f"{path}/{fmt}": ok for (path, fmt), ok in _verdicts.items()}


def _available(path: str) -> bool:
    if path == "torch-int4":
        return True
    return (cpu_batch.library() if path == "tiled" else cpu_kernels.library()) is not None


def _check(path: str, fmt: str, q: torch.Tensor, d: torch.Tensor, m: torch.Tensor | None) -> bool:
    run = _RUNNERS[path]
    if q.shape[0] < 2 or q.shape[1] % 64:
        return True  # too small a matrix to lend rows; its callers' shape rules apply
    if path == "decode-rows":  # the decode step keeps the scales as float16 (exact for GGUF's): so does the reference
        d, m = d.half().float(), None if m is None else m.half().float()
    x = torch.randn(9, q.shape[1], generator=torch.Generator().manual_seed(0))
    reference = x.double() @ _dequantize(q, d, m).t()
    try:
        errors = [nmse(run(x[:rows], q, d, m), reference[:rows]) for rows in _row_counts(path)]
    except Exception as exc:  # noqa: BLE001 - a path that raises is as unusable as one that is wrong
        errors, why = [float("inf")], f"{type(exc).__name__}: {exc}"
    else:
        why = f"normalized squared error {max(errors):.3g} > {LIMITS[path]:g}"
    if max(errors) <= LIMITS[path]:
        return True
    log.warning("kernel check: %s on %s blocks fails on this CPU (%s; %s); it is not used, the next path down "
                "computes instead", path, fmt, why, cpu_description())
    return False


def _row_counts(path: str) -> tuple[int, ...]:
    return {"blocks": (1, 3, 8), "decode-rows": (1, 3), "tiled": (4, 9), "torch-int4": (1, 5)}[path]


def cpu_description() -> str:
    """The CPU flags that decide which kernels run, PyTorch's capability and the kernels' build tier."""
    have = sorted(cpu_kernels.cpu_flags() & {"avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_vnni", "avx512vl",
                                             "amx_int8"})
    return (f"{platform.machine()} flags {' '.join(have) or 'none of note'}; PyTorch capability "
            f"{torch.backends.cpu.get_cpu_capability()}; C kernels -march={cpu_kernels.march()} "
            f"tier {cpu_kernels.tier()}")


def nmse(out: torch.Tensor, reference: torch.Tensor) -> float:
    reference = reference.double()
    return float(((out.double() - reference) ** 2).sum() / (reference**2).sum().clamp_min(1e-300))


def _dequantize(q: torch.Tensor, d: torch.Tensor, m: torch.Tensor | None) -> torch.Tensor:
    n = q.shape[0]
    w = q.double().view(n, -1, 32) * d.double()[..., None]
    return (w if m is None else w + m.double()[..., None]).view(n, -1)


def _torch_int4(x, q, d, m):
    q, d, m = q.contiguous(), d.contiguous(), None if m is None else m.contiguous()
    weights = quant.from_q8_blocks(q, d) if m is None else (quant.from_blocks(q, d, m),)
    return sum(w.matmul(x) for w in weights)


def _c_blocks(x, q, d, m):
    qs = q.contiguous() if m is None else cpu_kernels.pack_q4_1(q)
    return cpu_kernels.blocks_matmul(x, qs, d.contiguous(), None if m is None else m.contiguous())


def _decode_rows(x, q, d, m):
    qs = q.contiguous() if m is None else cpu_kernels.pack_q4_1(q)
    d16 = d.to(torch.float16).contiguous()  # as the decode step keeps them (GGUF stores them as float16)
    m16 = None if m is None else m.to(torch.float16).contiguous()
    return cpu_kernels.decode_rows_matmul(x, qs.contiguous(), d16, m16)


def _tiled(x, q, d, m):
    qs = q.contiguous() if m is None else cpu_kernels.pack_q4_1(q)
    tiles = cpu_batch.TiledBlocks.build(qs.contiguous(), d.contiguous(), None if m is None else m.contiguous())
    return tiles.matmul(x)


_RUNNERS: dict[str, Callable] = {"torch-int4": _torch_int4, "blocks": _c_blocks, "decode-rows": _decode_rows,
                                 "tiled": _tiled}
