"""RMSNorm: y = x / sqrt(mean(x^2) + eps) * (offset + w), fused forward and backward.

Two casting conventions, matched to transformers exactly:
- Llama/Mistral/Qwen/Phi-3 (offset 0.0): normalise in fp32, cast the normalised row back to the
  input dtype, then multiply by the weight (`LlamaRMSNorm`: `weight * hidden.to(input_dtype)`).
- Gemma 1/2/3 (offset 1.0): normalise in fp32, multiply by `(1 + w.float())` in fp32, cast at the
  end (`GemmaRMSNorm`; see transformers PR #29402).

Forward saves only the input row and one fp32 rstd per row (no normalised copy). Backward is one
kernel: dX = rstd * (g - x_hat * mean(g * x_hat)) with g = dY * (offset + w), and, only when the
weight trains, per-program partial dW sums (reduced by one torch.sum) as in Liger-Kernel's
`rms_norm.py` (Liger-Kernel, BSD-2) and Unsloth's `fast_rms_layernorm`. A frozen weight (the LoRA
case) skips the dW work entirely.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.ops._launch import row_block, sm_count, triton_runs_on


@triton.jit
def _rms_norm_forward_kernel(
    Y, X, W, RSTD, x_row_stride, y_row_stride, n_cols, eps, offset,
    CAST_BEFORE_WEIGHT: tl.constexpr, BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(X + row * x_row_stride + cols, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / n_cols + eps)
    tl.store(RSTD + row, rstd)
    x_hat = x * rstd
    if CAST_BEFORE_WEIGHT:
        x_hat = x_hat.to(X.dtype.element_ty).to(tl.float32)
    y = x_hat * (offset + w)
    tl.store(Y + row * y_row_stride + cols, y.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _rms_norm_backward_kernel(
    DY, DX, X, W, RSTD, DW_PARTIAL, dy_row_stride, dx_row_stride, x_row_stride,
    n_rows, n_cols, offset, rows_per_program,
    CAST_BEFORE_WEIGHT: tl.constexpr, COMPUTE_DW: tl.constexpr, BLOCK: tl.constexpr,
):
    pid = tl.program_id(0)
    row_start = pid.to(tl.int64) * rows_per_program
    row_end = tl.minimum(row_start + rows_per_program, n_rows)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32) + offset
    dw_acc = tl.zeros([BLOCK], dtype=tl.float32)
    for row in range(row_start, row_end):
        dy = tl.load(DY + row * dy_row_stride + cols, mask=mask, other=0.0).to(tl.float32)
        x = tl.load(X + row * x_row_stride + cols, mask=mask, other=0.0).to(tl.float32)
        rstd = tl.load(RSTD + row)
        x_hat = x * rstd
        if COMPUTE_DW:
            if CAST_BEFORE_WEIGHT:
                dw_acc += dy * x_hat.to(X.dtype.element_ty).to(tl.float32)
            else:
                dw_acc += dy * x_hat
        g = dy * w
        dx = rstd * (g - x_hat * (tl.sum(g * x_hat, axis=0) / n_cols))
        tl.store(DX + row * dx_row_stride + cols, dx.to(DX.dtype.element_ty), mask=mask)
    if COMPUTE_DW:
        tl.store(DW_PARTIAL + pid * n_cols + cols, dw_acc, mask=mask)


def _as_rows(x: torch.Tensor) -> torch.Tensor:
    rows = x.reshape(-1, x.shape[-1])
    return rows if rows.stride(-1) == 1 else rows.contiguous()


def _output_dtype(x: torch.Tensor, weight: torch.Tensor, offset: float) -> torch.dtype:
    # Llama multiplies `weight * x.to(input_dtype)`, so torch type promotion decides; Gemma casts to x.
    return x.dtype if offset != 0.0 else torch.promote_types(x.dtype, weight.dtype)


def rms_norm_forward(x: torch.Tensor, weight: torch.Tensor, eps: float, offset: float):
    """Launch the forward kernel; returns (y, x_rows, rstd) with y shaped like x."""
    x_rows = _as_rows(x)
    n_rows, n_cols = x_rows.shape
    y = torch.empty((n_rows, n_cols), dtype=_output_dtype(x, weight, offset), device=x.device)
    rstd = torch.empty(n_rows, dtype=torch.float32, device=x.device)
    block, num_warps = row_block(n_cols)
    _rms_norm_forward_kernel[(n_rows,)](
        y, x_rows, weight, rstd, x_rows.stride(0), y.stride(0), n_cols, float(eps), float(offset),
        CAST_BEFORE_WEIGHT=offset == 0.0, BLOCK=block, num_warps=num_warps,
    )
    return y.view(*x.shape[:-1], n_cols), x_rows, rstd


def rms_norm_backward(dy, x_rows, weight, rstd, offset: float, compute_dw: bool):
    """Launch the backward kernel; returns (dx_rows, dw or None)."""
    n_rows, n_cols = x_rows.shape
    dy_rows = _as_rows(dy)
    dx = torch.empty_like(x_rows)
    block, num_warps = row_block(n_cols)
    # dW needs a cross-row sum: few programs, each looping over a slab of rows, keep the partial
    # sums small; without dW every row is independent, so one program per row.
    programs = min(n_rows, 4 * sm_count(x_rows.device)) if compute_dw else n_rows
    rows_per_program = triton.cdiv(n_rows, max(programs, 1))
    dw_partial = torch.empty((programs, n_cols) if compute_dw else (1,), dtype=torch.float32,
                             device=x_rows.device)
    _rms_norm_backward_kernel[(programs,)](
        dy_rows, dx, x_rows, weight, rstd, dw_partial, dy_rows.stride(0), dx.stride(0),
        x_rows.stride(0), n_rows, n_cols, float(offset), rows_per_program,
        CAST_BEFORE_WEIGHT=offset == 0.0, COMPUTE_DW=compute_dw, BLOCK=block, num_warps=num_warps,
    )
    dw = dw_partial.sum(0).to(weight.dtype) if compute_dw else None
    return dx, dw


class RMSNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, eps, offset):
        y, x_rows, rstd = rms_norm_forward(x, weight, eps, offset)
        ctx.save_for_backward(x_rows, weight, rstd)
        ctx.offset = offset
        ctx.x_shape = x.shape
        return y

    @staticmethod
    def backward(ctx, dy):
        x_rows, weight, rstd = ctx.saved_tensors
        dx, dw = rms_norm_backward(dy, x_rows, weight, rstd, ctx.offset, ctx.needs_input_grad[1])
        return dx.view(ctx.x_shape), dw, None, None


def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float, offset: float = 0.0):
    """PyTorch reference, line for line transformers' LlamaRMSNorm (offset 0) / GemmaRMSNorm (1)."""
    x32 = x.to(torch.float32)
    x_hat = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    if offset == 0.0:
        return weight * x_hat.to(x.dtype)
    return (x_hat * (offset + weight.float())).type_as(x)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, offset: float = 0.0):
    """RMSNorm over the last dim of `x` (any leading shape). `offset=1.0` is Gemma's (1 + w).

    Runs the Triton kernel on CUDA tensors (or anywhere under TRITON_INTERPRET=1), else the
    PyTorch reference. dW is computed only when `weight.requires_grad`.
    """
    if x.shape[-1] != weight.shape[-1]:
        raise ValueError(
            f"rms_norm: x has {x.shape[-1]} features but weight has {weight.shape[-1]}; "
            "the weight must match the last dim of x"
        )
    if not triton_runs_on(x):
        return rms_norm_reference(x, weight, eps, offset)
    return RMSNormFunction.apply(x, weight, eps, offset)
