"""GeGLU: out = gelu(gate) * up, the Gemma 1/2/3 MLP activation, fused.

`approximate="tanh"` is transformers' `gelu_pytorch_tanh` (Gemma's default),
    gelu(g) = 0.5 g (1 + tanh(k0 (g + k1 g^3))),  k0 = sqrt(2/pi), k1 = 0.044715,
    gelu'(g) = 0.5 (1 + t) + 0.5 g (1 - t^2) k0 (1 + 3 k1 g^2);
`approximate="none"` is the exact erf form,
    gelu(g) = 0.5 g (1 + erf(g / sqrt 2)),
    gelu'(g) = 0.5 (1 + erf(g / sqrt 2)) + g exp(-g^2 / 2) / sqrt(2 pi).
(Unsloth `geglu.py`, Liger-Kernel `geglu.py`.) tanh is written with exp so that it only needs
core `tl` ops that exist in every Triton 3.x (libdevice import paths moved between versions).

Same memory plan as swiglu: save only gate and up, recompute the activation in backward, and write
d_gate / d_up over the saved buffers where they are intermediates nobody else reads.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.ops._launch import (GATED_BLOCK_COLS, can_overwrite_pair, dense_rows, gated_grid,
                                  triton_runs_on)

APPROXIMATIONS = ("tanh", "none")


@triton.jit
def _tanh(x):
    # 1 - 2 / (exp(2x) + 1); clamping first keeps exp finite (tanh(+-15) is +-1 in fp32 already).
    x = tl.minimum(tl.maximum(x, -15.0), 15.0)
    return 1.0 - 2.0 / (tl.exp(2.0 * x) + 1.0)


@triton.jit
def gelu_and_grad(g, TANH: tl.constexpr):
    if TANH:
        inner = 0.7978845608028654 * (g + 0.044715 * g * g * g)
        t = _tanh(inner)
        act = 0.5 * g * (1.0 + t)
        grad = 0.5 * (1.0 + t) + 0.5 * g * (1.0 - t * t) * 0.7978845608028654 * (1.0 + 0.134145 * g * g)
    else:
        cdf = 0.5 * (1.0 + tl.math.erf(g * 0.7071067811865476))
        act = g * cdf
        grad = cdf + g * tl.exp(-0.5 * g * g) * 0.3989422804014327
    return act, grad


@triton.jit
def _geglu_forward_kernel(GATE, UP, OUT, gate_row_stride, up_row_stride, n_cols,
                          TANH: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n_cols
    g = tl.load(GATE + row * gate_row_stride + cols, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(UP + row * up_row_stride + cols, mask=mask, other=0.0).to(tl.float32)
    act, _ = gelu_and_grad(g, TANH)
    tl.store(OUT + row * n_cols + cols, (act * u).to(OUT.dtype.element_ty), mask=mask)


@triton.jit
def _geglu_backward_kernel(
    DOUT, GATE, UP, DGATE, DUP, dout_row_stride, gate_row_stride, up_row_stride,
    dgate_row_stride, dup_row_stride, n_cols, TANH: tl.constexpr, BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n_cols
    dout = tl.load(DOUT + row * dout_row_stride + cols, mask=mask, other=0.0).to(tl.float32)
    g = tl.load(GATE + row * gate_row_stride + cols, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(UP + row * up_row_stride + cols, mask=mask, other=0.0).to(tl.float32)
    act, grad = gelu_and_grad(g, TANH)
    tl.store(DGATE + row * dgate_row_stride + cols, (dout * u * grad).to(DGATE.dtype.element_ty), mask=mask)
    tl.store(DUP + row * dup_row_stride + cols, (dout * act).to(DUP.dtype.element_ty), mask=mask)


def geglu_forward(gate_rows: torch.Tensor, up_rows: torch.Tensor, tanh: bool) -> torch.Tensor:
    n_rows, n_cols = gate_rows.shape
    out = torch.empty((n_rows, n_cols), dtype=gate_rows.dtype, device=gate_rows.device)
    _geglu_forward_kernel[gated_grid(n_rows, n_cols)](
        gate_rows, up_rows, out, gate_rows.stride(0), up_rows.stride(0), n_cols,
        TANH=tanh, BLOCK=GATED_BLOCK_COLS, num_warps=4,
    )
    return out


def geglu_backward(dout, gate_rows, up_rows, tanh: bool, in_place: bool):
    dout_rows = dense_rows(dout)
    n_rows, n_cols = gate_rows.shape
    d_gate = gate_rows if in_place else torch.empty_like(gate_rows)
    d_up = up_rows if in_place else torch.empty_like(up_rows)
    _geglu_backward_kernel[gated_grid(n_rows, n_cols)](
        dout_rows, gate_rows, up_rows, d_gate, d_up, dout_rows.stride(0), gate_rows.stride(0),
        up_rows.stride(0), d_gate.stride(0), d_up.stride(0), n_cols, TANH=tanh,
        BLOCK=GATED_BLOCK_COLS, num_warps=4,
    )
    return d_gate, d_up


class GeGLUFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, gate, up, tanh, in_place):
        gate_rows, up_rows = dense_rows(gate), dense_rows(up)
        out = geglu_forward(gate_rows, up_rows, tanh)
        ctx.tanh, ctx.in_place = tanh, in_place
        ctx.save_for_backward(gate_rows, up_rows)
        ctx.shapes = (gate.shape, up.shape)
        return out.view(gate.shape)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dout):
        gate_rows, up_rows = ctx.saved_tensors
        d_gate, d_up = geglu_backward(dout, gate_rows, up_rows, ctx.tanh, ctx.in_place)
        return d_gate.view(ctx.shapes[0]), d_up.view(ctx.shapes[1]), None, None


def geglu_reference(gate: torch.Tensor, up: torch.Tensor, approximate: str = "tanh") -> torch.Tensor:
    """PyTorch reference: transformers' `act_fn(gate_proj(x)) * up_proj(x)` with a GELU act_fn."""
    return torch.nn.functional.gelu(gate, approximate=approximate) * up


def geglu(gate: torch.Tensor, up: torch.Tensor, approximate: str = "tanh") -> torch.Tensor:
    """gelu(gate) * up. On the Triton path backward overwrites gate and up with their gradients
    when they are intermediate tensors (not leaves), so do not read them after backward."""
    if approximate not in APPROXIMATIONS:
        raise ValueError(f"geglu: approximate must be one of {APPROXIMATIONS}, got {approximate!r}")
    if gate.shape != up.shape:
        raise ValueError(f"geglu: gate {tuple(gate.shape)} and up {tuple(up.shape)} must have one shape")
    if not triton_runs_on(gate):
        return geglu_reference(gate, up, approximate)
    return GeGLUFunction.apply(gate, up, approximate == "tanh", can_overwrite_pair(gate, up))
