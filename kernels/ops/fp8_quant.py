"""Per-row FP8 quantization: x [M, K] -> codes [M, K] float8_e4m3fn and one fp32 scale per row.

The FP8 base-weight path (kernels/ops/fp8_linear.py) quantizes every GEMM operand row by row:
activations per token in forward, output gradients per token in backward, frozen weights per
output channel once. For a row r (after an optional per-column factor c, used in backward to fold
the weight's per-output-channel scale into dY, see fp8_linear.py):

    amax_r  = max(max_k |x_rk c_k|, 1e-12)
    code_rk = e4m3fn(clamp(x_rk c_k * (448 / amax_r), -448, 448))     round to nearest even
    scale_r = amax_r / 448                                             x_rk c_k ~= code_rk * scale_r

448 is e4m3fn's largest finite value, so each row uses the whole range (3 mantissa bits: a
relative rounding error of at most 2^-4 for normal values, subnormals below amax_r * 2^-15).
This is the "row-wise" recipe of torchao's float8 training and of torch._scaled_mm's row-wise
scaling (https://github.com/pytorch/ao, float8 README); the kernel is ours.

One Triton program per row reads the row twice (amax, then the codes; the second read hits L2) and
writes codes + scale: one pass over HBM. Up to three segments (e.g. dQ, dK, dV) are quantized as
one concatenated row with one scale, written side by side into one codes buffer, so the backward
GEMM over all of them needs no torch.cat. The CPU interpreter's fp32 -> fp8 cast is wrong (it
truncates and overflows to NaN), so there the code is built bit by bit (`_e4m3_bits`); on the GPU
the hardware cast (round to nearest even, saturating) produces the same bits.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.ops._launch import triton_runs_on

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0
MIN_AMAX = 1e-12     # an all-zero row (padding, masked gradients) gets codes 0, not NaN
MAX_SEGMENTS = 3


@triton.jit
def _e4m3_bits(v):
    """fp32 v in [-448, 448] -> e4m3fn code (uint8), round to nearest even, by integer arithmetic."""
    sign = ((v.to(tl.uint32, bitcast=True) >> 24) & 0x80).to(tl.uint32)
    a = tl.abs(v)
    abits = a.to(tl.uint32, bitcast=True)
    # normal range (>= 2^-6): keep 3 of fp32's 23 mantissa bits, ties to even, exponent 127 -> 7
    normal = ((abits + 0x7FFFF + ((abits >> 20) & 1)) >> 20) - (120 << 3)
    # subnormal range: multiples of 2^-9 (m = 8 rounds up into the smallest normal, code 0x08)
    t = a * 512.0
    whole = tl.floor(t)
    frac = t - whole
    m = whole.to(tl.uint32)
    up = (frac > 0.5) | ((frac == 0.5) & ((m & 1) == 1))
    sub = m + up.to(tl.uint32)
    code = tl.where(a < 0.015625, sub, normal)
    return (code | sign).to(tl.uint8)


@triton.jit
def _segment_amax(acc, X, n, CS, cs_off, HAS_CS: tl.constexpr, BLOCK: tl.constexpr):
    for start in range(0, n, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        mask = cols < n
        x = tl.load(X + cols, mask=mask, other=0.0).to(tl.float32)
        if HAS_CS:
            x = x * tl.load(CS + cs_off + cols, mask=mask, other=0.0)
        acc = tl.maximum(acc, tl.abs(x))
    return acc


@triton.jit
def _segment_store(X, n, CS, cs_off, inv, Q, HAS_CS: tl.constexpr, HW_CAST: tl.constexpr,
                   BLOCK: tl.constexpr):
    for start in range(0, n, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        mask = cols < n
        x = tl.load(X + cols, mask=mask, other=0.0).to(tl.float32)
        if HAS_CS:
            x = x * tl.load(CS + cs_off + cols, mask=mask, other=0.0)
        v = tl.minimum(tl.maximum(x * inv, -448.0), 448.0)
        if HW_CAST:
            tl.store(Q + cols, v.to(tl.float8e4nv), mask=mask)
        else:
            tl.store(Q + cols, _e4m3_bits(v), mask=mask)


@triton.jit
def _quantize_rows_kernel(X0, X1, X2, ld0, ld1, ld2, n0, n1, n2, CS, Q, ld_q, SCALE,
                          HAS_CS: tl.constexpr, NSEG: tl.constexpr, HW_CAST: tl.constexpr,
                          BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    acc = _segment_amax(acc, X0 + row * ld0, n0, CS, 0, HAS_CS, BLOCK)
    if NSEG > 1:
        acc = _segment_amax(acc, X1 + row * ld1, n1, CS, n0, HAS_CS, BLOCK)
    if NSEG > 2:
        acc = _segment_amax(acc, X2 + row * ld2, n2, CS, n0 + n1, HAS_CS, BLOCK)
    amax = tl.maximum(tl.max(acc, axis=0), 1e-12)
    inv = tl.math.div_rn(448.0, amax)
    tl.store(SCALE + row, tl.math.div_rn(amax, 448.0))
    q_row = Q + row * ld_q
    _segment_store(X0 + row * ld0, n0, CS, 0, inv, q_row, HAS_CS, HW_CAST, BLOCK)
    if NSEG > 1:
        _segment_store(X1 + row * ld1, n1, CS, n0, inv, q_row + n0, HAS_CS, HW_CAST, BLOCK)
    if NSEG > 2:
        _segment_store(X2 + row * ld2, n2, CS, n0 + n1, inv, q_row + n0 + n1, HAS_CS, HW_CAST, BLOCK)


def _rows_view(t: torch.Tensor) -> torch.Tensor:
    """A 2-D [rows, cols] view with unit column stride (a copy only when none exists)."""
    t = t.reshape(-1, t.shape[-1]) if t.dim() != 2 else t
    return t if t.stride(-1) == 1 else t.contiguous()


def _check(segments, col_scale) -> int:
    if not 1 <= len(segments) <= MAX_SEGMENTS:
        raise ValueError(f"quantize_rows takes 1 to {MAX_SEGMENTS} segments, got {len(segments)}")
    rows = {s.shape[0] for s in segments}
    if len(rows) != 1:
        raise ValueError(f"quantize_rows: segments must have the same rows, got {sorted(rows)}")
    width = sum(s.shape[1] for s in segments)
    if col_scale is not None and col_scale.numel() != width:
        raise ValueError(f"quantize_rows: col_scale has {col_scale.numel()} values for {width} columns")
    return width


def quantize_rows(segments, col_scale: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize the row-wise concatenation of `segments` (a tensor or up to three [M, k_i] tensors).

    Returns (codes [M, sum k_i] float8_e4m3fn, scale [M, 1] float32) with
    concat(segments) * col_scale ~= codes * scale. `col_scale` ([sum k_i], fp32) is optional.
    """
    segments = [_rows_view(s) for s in ([segments] if torch.is_tensor(segments) else segments)]
    width = _check(segments, col_scale)
    if not triton_runs_on(segments[0]):
        return quantize_rows_reference(torch.cat(segments, dim=1) if len(segments) > 1 else segments[0],
                                       col_scale)
    rows, device = segments[0].shape[0], segments[0].device
    codes = torch.empty(rows, width, dtype=FP8_DTYPE, device=device)
    scale = torch.empty(rows, 1, dtype=torch.float32, device=device)
    if rows == 0 or width == 0:
        return codes, scale.fill_(MIN_AMAX / FP8_MAX)
    padded = segments + [segments[0]] * (MAX_SEGMENTS - len(segments))
    widths = [s.shape[1] for s in segments] + [0] * (MAX_SEGMENTS - len(segments))
    block = min(triton.next_power_of_2(max(widths)), 2048)
    cs = col_scale.to(device=device, dtype=torch.float32).contiguous() if col_scale is not None else scale
    hw_cast = segments[0].is_cuda
    _quantize_rows_kernel[(rows,)](
        *padded, *(s.stride(0) for s in padded), *widths, cs,
        codes if hw_cast else codes.view(torch.uint8), width, scale,
        HAS_CS=col_scale is not None, NSEG=len(segments), HW_CAST=hw_cast, BLOCK=block,
        num_warps=4 if block <= 1024 else 8)
    return codes, scale


def quantize_rows_reference(x: torch.Tensor, col_scale: torch.Tensor | None = None):
    """PyTorch reference with the same fp32 operations (torch's cast rounds to nearest even)."""
    xf = x.reshape(-1, x.shape[-1]).float()
    if col_scale is not None:
        xf = xf * col_scale.float().reshape(1, -1)
    amax = xf.abs().amax(dim=1, keepdim=True).clamp_min(MIN_AMAX)
    # tensor / tensor: a true division (torch turns `448 / t` and `t / 448` into reciprocal
    # multiplies, which round differently from the kernel's correctly rounded div_rn)
    fp8_max = torch.full_like(amax, FP8_MAX)
    codes = (xf * (fp8_max / amax)).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return codes, amax / fp8_max


def dequantize_rows(codes: torch.Tensor, scale: torch.Tensor, dtype=torch.float32) -> torch.Tensor:
    """codes * scale (scale [M, 1] or [M]) in fp32, then cast to `dtype`."""
    return (codes.float() * scale.float().reshape(-1, 1)).to(dtype)
