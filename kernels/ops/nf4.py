"""NF4 dequantization: bitsandbytes 4-bit NormalFloat weights -> bf16/fp16/fp32, bit-exactly.

bitsandbytes (`bitsandbytes.functional.dequantize_4bit`, 0.50) stores a weight of n values as
ceil(n/2) bytes, two 4-bit codes per byte, the FIRST value in the HIGH nibble. Every `blocksize`
(64) consecutive values share one fp32 scale `absmax[b]`. With double quantization
(`compress_statistics=True`, QLoRA's default) the scales themselves are stored as uint8 codes of
the 8-bit dynamic map (`state2.code`), in blocks of 256 with an fp32 scale per block
(`state2.absmax`), after subtracting their mean (`offset`). bitsandbytes recovers a value as

    scale   = fp32(code2[qabsmax[b]] * absmax2[b // 256])    # dequantize_blockwise, fp32 product
    scale   = fp32(scale + offset)                            # a separate torch add: no FMA
    value   = fp32(nf4_table[code] * scale)                   # kDequantizeBlockwise, fp32 product
    output  = round_to_nearest_even(value -> dtype)

and this kernel does exactly those three roundings in that order (fp contraction is switched off
so `a * b + c` is not fused into one FMA, which would round once instead of twice). One launch
instead of bitsandbytes' two (nested scales, then the weight), and it writes into a buffer the
caller keeps, so QLoRA's per-layer dequantization allocates nothing.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.ops._launch import triton_runs_on

BLOCK = 512  # packed bytes per program (1024 output values); memory-bound, 256..2048 all do


@triton.jit
def _block_scale(byte_idx, mask, absmax_ptr, nested_absmax_ptr, nested_code_ptr, offset_ptr,
                 BLOCKSIZE: tl.constexpr, NESTED_BLOCKSIZE: tl.constexpr, NESTED: tl.constexpr):
    """fp32 scale of each packed byte's block (a byte's two values never straddle a block)."""
    block = byte_idx // (BLOCKSIZE // 2)
    if NESTED:
        qscale = tl.load(absmax_ptr + block, mask=mask, other=0).to(tl.int32)
        scale = tl.load(nested_code_ptr + qscale, mask=mask, other=0.0)
        scale = scale * tl.load(nested_absmax_ptr + block // NESTED_BLOCKSIZE, mask=mask, other=0.0)
        scale = scale + tl.load(offset_ptr)
    else:
        scale = tl.load(absmax_ptr + block, mask=mask, other=0.0).to(tl.float32)
    return scale


@triton.jit
def _dequantize_nf4_kernel(
    packed_ptr, absmax_ptr, code_ptr, out_ptr, n_values,
    nested_absmax_ptr, nested_code_ptr, offset_ptr,
    BLOCKSIZE: tl.constexpr, NESTED_BLOCKSIZE: tl.constexpr, NESTED: tl.constexpr,
    BF16_BITS: tl.constexpr, BLOCK: tl.constexpr,
):
    # one contiguous load of BLOCK bytes, one scale per byte, then both nibbles
    byte_idx = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    byte_mask = byte_idx < (n_values + 1) // 2
    byte = tl.load(packed_ptr + byte_idx, mask=byte_mask, other=0).to(tl.int32)
    scale = _block_scale(byte_idx, byte_mask, absmax_ptr, nested_absmax_ptr, nested_code_ptr,
                         offset_ptr, BLOCKSIZE, NESTED_BLOCKSIZE, NESTED)
    high = tl.load(code_ptr + (byte >> 4)) * scale   # first value of the pair (bitsandbytes' order)
    low = tl.load(code_ptr + (byte & 15)) * scale
    value = tl.reshape(tl.join(high, low), [2 * BLOCK])   # interleave: high0, low0, high1, ...
    out_idx = tl.program_id(0).to(tl.int64) * (2 * BLOCK) + tl.arange(0, 2 * BLOCK)
    out_mask = out_idx < n_values
    if BF16_BITS:
        # round-to-nearest-even fp32 -> bf16 by hand: the CPU interpreter truncates instead, and
        # this way GPU and interpreter produce the very bits bitsandbytes does
        bits = value.to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
        tl.store(out_ptr + out_idx, bits.to(tl.uint16).to(tl.int16, bitcast=True), mask=out_mask)
    else:
        tl.store(out_ptr + out_idx, value.to(out_ptr.dtype.element_ty), mask=out_mask)


def _check_state(packed: torch.Tensor, quant_state) -> None:
    if getattr(quant_state, "quant_type", None) != "nf4":
        raise ValueError(
            f"dequantize_nf4 handles bitsandbytes NF4 weights only, got quant_type="
            f"{getattr(quant_state, 'quant_type', None)!r}; load the model with "
            "bnb_4bit_quant_type='nf4' or use backend='torch'"
        )
    if quant_state.blocksize % 2:
        raise ValueError(f"NF4 blocksize must be even, got {quant_state.blocksize}")
    if not triton_runs_on(packed):
        raise RuntimeError(
            "dequantize_nf4 runs on CUDA tensors (or on CPU with TRITON_INTERPRET=1); "
            f"the packed weight is on {packed.device}"
        )


def dequantize_nf4_reference(packed: torch.Tensor, quant_state, dtype=None) -> torch.Tensor:
    """PyTorch reference with the same order of fp32 operations (used by tests and the torch path)."""
    dtype = dtype or quant_state.dtype
    codes = packed.reshape(-1).view(torch.uint8)
    nibbles = torch.stack([codes >> 4, codes & 15], dim=1).reshape(-1).long()
    n = quant_state.shape.numel()
    absmax = quant_state.absmax
    if quant_state.nested:
        state2 = quant_state.state2
        absmax = state2.code[absmax.long()]
        absmax = (absmax.view(-1) * state2.absmax.repeat_interleave(state2.blocksize)[: absmax.numel()])
        absmax = absmax + quant_state.offset
    scale = absmax.float().repeat_interleave(quant_state.blocksize)[:n]
    values = quant_state.code[nibbles[:n]] * scale
    return values.to(dtype).reshape(quant_state.shape)


def dequantize_nf4(packed: torch.Tensor, quant_state, out: torch.Tensor | None = None,
                   dtype: torch.dtype | None = None) -> torch.Tensor:
    """Dequantize a bitsandbytes NF4 weight (`Params4bit` data + its `quant_state`).

    `out`, when given, must be a contiguous tensor of `quant_state.shape`; it is filled and returned
    (its dtype wins over `dtype`). Otherwise a new tensor of `dtype` (default `quant_state.dtype`).
    Bit-exact with `bitsandbytes.functional.dequantize_4bit(packed, quant_state)`.
    """
    _check_state(packed, quant_state)
    shape = quant_state.shape
    if out is None:
        out = torch.empty(shape, dtype=dtype or quant_state.dtype, device=packed.device)
    elif out.shape != shape or not out.is_contiguous():
        raise ValueError(f"out must be a contiguous tensor of shape {tuple(shape)}, got {tuple(out.shape)}")
    codes = packed.view(torch.uint8) if packed.dtype != torch.uint8 else packed
    n = shape.numel()
    nested = bool(quant_state.nested)
    state2 = quant_state.state2 if nested else None
    absmax = quant_state.absmax
    code = quant_state.code.to(device=packed.device, dtype=torch.float32)
    grid = (triton.cdiv(n, 2 * BLOCK),)
    bf16_bits = out.dtype == torch.bfloat16
    _dequantize_nf4_kernel[grid](
        codes, absmax, code, out.view(torch.int16) if bf16_bits else out, n,
        state2.absmax if nested else absmax,
        state2.code if nested else code,
        quant_state.offset.float().reshape(1) if nested else code,
        BLOCKSIZE=quant_state.blocksize,
        NESTED_BLOCKSIZE=state2.blocksize if nested else 1,
        NESTED=nested, BF16_BITS=bf16_bits, BLOCK=BLOCK,
        enable_fp_fusion=False,
    )
    return out


_BUFFERS: dict[tuple, torch.Tensor] = {}


def dequantize_nf4_into_buffer(weight, dtype: torch.dtype | None = None) -> torch.Tensor:
    """Dequantize a `Params4bit` into a buffer shared by every weight of the same shape/dtype/device.

    The buffer is reused by the next call of that shape: use the result before dequantizing another
    weight of the same shape (one CUDA stream orders this for free). The fused LoRA ops follow that
    rule: each dequantized weight feeds exactly one GEMM before the next dequantization.
    """
    state = weight.quant_state
    dtype = dtype or state.dtype
    key = (tuple(state.shape), dtype, weight.device)
    buffer = _BUFFERS.get(key)
    if buffer is None:
        buffer = torch.empty(state.shape, dtype=dtype, device=weight.device)
        _BUFFERS[key] = buffer
    return dequantize_nf4(weight.data, state, out=buffer)
