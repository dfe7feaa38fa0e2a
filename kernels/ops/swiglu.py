"""SwiGLU: out = silu(gate) * up, the Llama/Mistral/Qwen/Phi-3 MLP activation, fused.

Forward reads gate and up once and writes out once (eager PyTorch runs silu and the product as two
kernels and materialises silu(gate)). Only gate and up are saved; backward recomputes the sigmoid
from gate (Liger-Kernel `swiglu.py`, Unsloth `swiglu_DWf_DW_dfg_kernel`):
    s = sigmoid(g),  d_up = d_out * g * s,  d_gate = d_out * up * s * (1 + g * (1 - s)).
Where safe, backward writes d_gate and d_up over the saved gate and up buffers, so it allocates
nothing: gate and up are intermediates that only this op reads (a projection output). Rows may be
strided (Phi-3's `gate_up_proj(x).chunk(2, -1)` halves) as long as the last dim is contiguous.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.ops._launch import (GATED_BLOCK_COLS, can_overwrite_pair, dense_rows, gated_grid,
                                  triton_runs_on)


@triton.jit
def _swiglu_forward_kernel(GATE, UP, OUT, gate_row_stride, up_row_stride, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n_cols
    g = tl.load(GATE + row * gate_row_stride + cols, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(UP + row * up_row_stride + cols, mask=mask, other=0.0).to(tl.float32)
    out = g * tl.sigmoid(g) * u
    tl.store(OUT + row * n_cols + cols, out.to(OUT.dtype.element_ty), mask=mask)


@triton.jit
def _swiglu_backward_kernel(
    DOUT, GATE, UP, DGATE, DUP, dout_row_stride, gate_row_stride, up_row_stride,
    dgate_row_stride, dup_row_stride, n_cols, BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n_cols
    dout = tl.load(DOUT + row * dout_row_stride + cols, mask=mask, other=0.0).to(tl.float32)
    g = tl.load(GATE + row * gate_row_stride + cols, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(UP + row * up_row_stride + cols, mask=mask, other=0.0).to(tl.float32)
    s = tl.sigmoid(g)
    d_up = dout * g * s
    d_gate = dout * u * s * (1.0 + g * (1.0 - s))
    tl.store(DGATE + row * dgate_row_stride + cols, d_gate.to(DGATE.dtype.element_ty), mask=mask)
    tl.store(DUP + row * dup_row_stride + cols, d_up.to(DUP.dtype.element_ty), mask=mask)


def swiglu_forward(gate_rows: torch.Tensor, up_rows: torch.Tensor) -> torch.Tensor:
    """[rows, cols] gate and up (dense last dim) -> a new contiguous [rows, cols] output."""
    n_rows, n_cols = gate_rows.shape
    out = torch.empty((n_rows, n_cols), dtype=gate_rows.dtype, device=gate_rows.device)
    _swiglu_forward_kernel[gated_grid(n_rows, n_cols)](
        gate_rows, up_rows, out, gate_rows.stride(0), up_rows.stride(0), n_cols,
        BLOCK=GATED_BLOCK_COLS, num_warps=4,
    )
    return out


def swiglu_backward(dout, gate_rows, up_rows, in_place: bool):
    """Returns (d_gate, d_up) as [rows, cols]; in place over gate/up when `in_place`."""
    dout_rows = dense_rows(dout)
    n_rows, n_cols = gate_rows.shape
    d_gate = gate_rows if in_place else torch.empty_like(gate_rows)
    d_up = up_rows if in_place else torch.empty_like(up_rows)
    _swiglu_backward_kernel[gated_grid(n_rows, n_cols)](
        dout_rows, gate_rows, up_rows, d_gate, d_up, dout_rows.stride(0), gate_rows.stride(0),
        up_rows.stride(0), d_gate.stride(0), d_up.stride(0), n_cols, BLOCK=GATED_BLOCK_COLS, num_warps=4,
    )
    return d_gate, d_up


class SwiGLUFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, gate, up, in_place):
        gate_rows, up_rows = dense_rows(gate), dense_rows(up)
        out = swiglu_forward(gate_rows, up_rows)
        ctx.in_place = in_place
        ctx.save_for_backward(gate_rows, up_rows)
        ctx.shapes = (gate.shape, up.shape)
        return out.view(gate.shape)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dout):
        gate_rows, up_rows = ctx.saved_tensors
        d_gate, d_up = swiglu_backward(dout, gate_rows, up_rows, ctx.in_place)
        return d_gate.view(ctx.shapes[0]), d_up.view(ctx.shapes[1]), None


def swiglu_reference(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """PyTorch reference: transformers' `act_fn(gate_proj(x)) * up_proj(x)` with act_fn = silu."""
    return torch.nn.functional.silu(gate) * up


def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up. On the Triton path backward overwrites gate and up with their gradients
    when they are intermediate tensors (not leaves), so do not read them after backward."""
    if gate.shape != up.shape:
        raise ValueError(f"swiglu: gate {tuple(gate.shape)} and up {tuple(up.shape)} must have one shape")
    if not triton_runs_on(gate):
        return swiglu_reference(gate, up)
    return SwiGLUFunction.apply(gate, up, can_overwrite_pair(gate, up))
