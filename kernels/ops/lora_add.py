"""In-place LoRA add: y += s (X A^T) B^T in one tile-wise Triton kernel (K = rank).

The fused LoRA ops compute the base output y = X W^T with cuBLAS, then add the rank-r term. As
`y.addmm_(XA, B^T, alpha=s)` that is a GEMM with K = 16, which cuBLAS runs as a full GEMM launch with
a beta=1 epilogue (the `badd` kernels in bench/results/profile_fusetune_*.json: ~40 us a call on
the 1B shapes, ~2.8 TB/s). Here each program loads a [BM, r] tile of XA and an [r, BN] tile of
B^T, does one `tl.dot`, and adds it to its [BM, BN] tile of y in place: one read and one write of
y, the floor for an unfused add. Same idea as the gate/up add inside the activation kernel
(kernels/ops/lora_mlp.py `_lora_act_forward_kernel`), and as Unsloth's fused LoRA forward
(fast_lora.py, https://github.com/unslothai/unsloth), which keeps the LoRA term rank-sized.

`BACKEND` selects the path ("triton" or "addmm"); bench/ab_rows.py (in git history) flipped it to measure both in one
process. Shapes the kernel does not cover (a rank that is not a power of two >= 16, strided y, CPU
tensors without the interpreter) always take addmm_.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.ops._launch import triton_runs_on

BACKEND = "triton"
BM, BN = 64, 128


@triton.jit
def _lora_add_kernel(Y, XA, B, n_rows, n_cols, y_stride, xa_stride, b_stride, scaling,
                     RANK: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, DOT_FP32: tl.constexpr):
    rows = tl.program_id(0) * BM + tl.arange(0, BM)
    cols = tl.program_id(1) * BN + tl.arange(0, BN)
    ks = tl.arange(0, RANK)
    row_ok, col_ok = rows < n_rows, cols < n_cols
    xa = tl.load(XA + rows[:, None].to(tl.int64) * xa_stride + ks[None, :], mask=row_ok[:, None], other=0.0)
    b_t = tl.load(B + cols[None, :] * b_stride + ks[:, None], mask=col_ok[None, :], other=0.0)
    if DOT_FP32:  # the CPU interpreter computes a bf16 tl.dot wrongly; on the GPU bf16 is exact enough
        xa, b_t = xa.to(tl.float32), b_t.to(tl.float32)
    lora = tl.dot(xa, b_t)
    mask = row_ok[:, None] & col_ok[None, :]
    offs = rows[:, None].to(tl.int64) * y_stride + cols[None, :]
    y = tl.load(Y + offs, mask=mask, other=0.0).to(tl.float32) + scaling * lora
    tl.store(Y + offs, y.to(Y.dtype.element_ty), mask=mask)


def kernel_applies(y: torch.Tensor, xa: torch.Tensor, lora_B: torch.Tensor) -> bool:
    """True where the Triton path runs: 2-D y with unit column stride, one dtype, rank 16..128 (2^k)."""
    rank = xa.shape[-1]
    return (BACKEND == "triton" and triton_runs_on(y) and y.dim() == 2 and xa.dim() == 2
            and y.stride(1) == 1 and xa.stride(1) == 1 and lora_B.stride(1) == 1
            and y.dtype == xa.dtype == lora_B.dtype and 16 <= rank <= 128 and rank & (rank - 1) == 0)


def _launch(y, xa, lora_B, scaling: float) -> None:
    n_rows, n_cols = y.shape
    grid = (triton.cdiv(n_rows, BM), triton.cdiv(n_cols, BN))
    _lora_add_kernel[grid](y, xa, lora_B, n_rows, n_cols, y.stride(0), xa.stride(0), lora_B.stride(0),
                           float(scaling), RANK=xa.shape[1], BM=BM, BN=BN, DOT_FP32=not y.is_cuda,
                           num_warps=4)


def lora_add_(y: torch.Tensor, xa: torch.Tensor, lora_B: torch.Tensor, scaling: float) -> torch.Tensor:
    """y [M, out] += scaling * xa [M, r] @ lora_B [out, r]^T, in place, no autograd; returns y.

    lora_B must already be in y's dtype (the callers cast fp32 adapters once per call)."""
    if xa.shape[0] != y.shape[0] or lora_B.shape != (y.shape[1], xa.shape[1]):
        raise ValueError(f"lora_add_: y {tuple(y.shape)}, xa {tuple(xa.shape)} and lora_B "
                         f"{tuple(lora_B.shape)} do not fit y[M, out] += xa[M, r] @ lora_B[out, r]^T")
    if kernel_applies(y, xa, lora_B):
        _launch(y, xa, lora_B, scaling)
    else:
        y.addmm_(xa, lora_B.t(), alpha=scaling)
    return y


class _LoraAdd(torch.autograd.Function):
    """Differentiable in-place form: dy passes through, dxa = s dY B, dB = s dY^T xa."""

    @staticmethod
    def forward(ctx, y, xa, lora_B, scaling):
        ctx.mark_dirty(y)
        ctx.save_for_backward(xa, lora_B)
        ctx.scaling = scaling
        return lora_add_(y, xa, lora_B, scaling)

    @staticmethod
    def backward(ctx, grad):
        xa, lora_B = ctx.saved_tensors
        d_xa = torch.mm(grad, lora_B) * ctx.scaling if ctx.needs_input_grad[1] else None
        d_b = torch.mm(grad.t(), xa) * ctx.scaling if ctx.needs_input_grad[2] else None
        return grad, d_xa, d_b, None


def lora_add(y: torch.Tensor, xa: torch.Tensor, lora_B: torch.Tensor, scaling: float) -> torch.Tensor:
    """Autograd-aware y += scaling * xa @ lora_B^T (y is modified in place and returned)."""
    return _LoraAdd.apply(y, xa, lora_B, float(scaling))


def lora_add_reference(y, xa, lora_B, scaling):
    return y + scaling * (xa @ lora_B.t())
