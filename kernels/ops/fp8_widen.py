"""Widen FP8 e4m3fn codes to bf16/fp16/fp32 exactly, in one pass (one read of a byte, one write).

Used where a fused LoRA node kept its input as FP8 codes (fp8_linear.SAVE_INPUT_FP8) and backward
needs it for dA = dYB^T X: the per-row scale goes onto the rank-sized dYB instead
(`_lora_common.lora_a_grad`), so X itself is just the codes, widened. Every e4m3fn value is exact
in bf16 and fp16 (4 exponent bits, 3 mantissa bits). torch's own cast measured ~1 TB/s on the H200
(4.7 ms a step over 96 nodes of the 8B shape); one Triton program per BLOCK elements runs at
memory speed. On the GPU the hardware converts (`tl.float8e4nv`); the CPU interpreter has no fp8
arithmetic, so there the bits are decoded by integer arithmetic (tested against torch's cast on
all 256 codes).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.ops._launch import triton_runs_on

BLOCK = 4096


@triton.jit
def _e4m3_value(bits):
    """uint8 e4m3fn code -> fp32 value (never 0x7F/0xFF: the quantizer clamps to +-448)."""
    b = bits.to(tl.int32)
    exponent = (b >> 3) & 0xF
    mantissa = b & 0x7
    normal = ((exponent + 120) << 23) | (mantissa << 20)          # rebias 7 -> 127
    magnitude = tl.where(exponent == 0, mantissa.to(tl.float32) * 0.001953125,   # m * 2^-9
                         normal.to(tl.float32, bitcast=True))
    return tl.where((b & 0x80) != 0, -magnitude, magnitude)


@triton.jit
def _widen_kernel(SRC, DST, n, HW_CAST: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    if HW_CAST:
        value = tl.load(SRC + offs, mask=mask, other=0.0).to(tl.float32)
    else:
        value = _e4m3_value(tl.load(SRC + offs, mask=mask, other=0))
    tl.store(DST + offs, value.to(DST.dtype.element_ty), mask=mask)


def widen_codes(codes: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """`codes` (float8_e4m3fn, any shape, contiguous) as `dtype`, value for value."""
    if codes.dtype != torch.float8_e4m3fn:
        raise ValueError(f"widen_codes takes float8_e4m3fn codes, got {codes.dtype}")
    if not triton_runs_on(codes) or not codes.is_contiguous():
        return codes.to(dtype)
    out = torch.empty(codes.shape, dtype=dtype, device=codes.device)
    n = codes.numel()
    if n:
        hw_cast = codes.is_cuda
        _widen_kernel[(triton.cdiv(n, BLOCK),)](codes if hw_cast else codes.view(torch.uint8), out, n,
                                                HW_CAST=hw_cast, BLOCK=BLOCK, num_warps=8)
    return out


def widen_codes_reference(codes: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return codes.to(dtype)
