"""Rotary position embedding applied to Q and K in place, in one launch, forward and backward.

Convention: transformers' half rotation (`rotate_half`, used by Llama, Mistral, Qwen, Gemma, Phi-3):
with x = [x1, x2] split at half the rotary dim,
    out1 = x1 * cos - x2 * sin,    out2 = x2 * cos + x1 * sin.
transformers builds cos/sin as cat(freqs, freqs), so both halves of a cos/sin row are equal and the
kernel reads only the first half. The backward of a rotation by theta is the rotation by -theta
(the same kernel with sin negated), as in Liger-Kernel's `rope.py` and Unsloth's `Fast_RoPE_Embedding`.

Partial rotary (Phi-3 variants with `partial_rotary_factor < 1`): cos/sin are narrower than the head;
only the first `cos.shape[-1]` dims rotate and the rest pass through untouched (they are left in place).

One program per (batch, position): it loads that position's cos/sin once and rotates every Q head
and every K head (GQA: different head counts) of that token. Q/K may be any strided view whose last
dim is contiguous, e.g. the [batch, heads, seq, head_dim] transpose of a projection output.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.ops._launch import triton_runs_on


@triton.jit
def _rotate_heads(base, head_stride, n_heads, cos, sin, half, BLOCK_H: tl.constexpr,
                  BLOCK_HALF: tl.constexpr):
    heads = tl.arange(0, BLOCK_H)
    dims = tl.arange(0, BLOCK_HALF)
    mask = (heads[:, None] < n_heads) & (dims[None, :] < half)
    first = base + heads[:, None] * head_stride + dims[None, :]
    x1 = tl.load(first, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(first + half, mask=mask, other=0.0).to(tl.float32)
    out1 = x1 * cos[None, :] - x2 * sin[None, :]
    out2 = x2 * cos[None, :] + x1 * sin[None, :]
    tl.store(first, out1.to(base.dtype.element_ty), mask=mask)
    tl.store(first + half, out2.to(base.dtype.element_ty), mask=mask)


@triton.jit
def _rope_kernel(
    Q, K, COS, SIN,
    q_batch_stride, q_head_stride, q_seq_stride,
    k_batch_stride, k_head_stride, k_seq_stride,
    cos_batch_stride, cos_seq_stride,
    seq_len, n_q_heads, n_k_heads, half,
    BACKWARD: tl.constexpr, BLOCK_QH: tl.constexpr, BLOCK_KH: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
):
    pid = tl.program_id(0).to(tl.int64)
    batch = pid // seq_len
    pos = pid % seq_len
    dims = tl.arange(0, BLOCK_HALF)
    trig = batch * cos_batch_stride + pos * cos_seq_stride + dims
    cos = tl.load(COS + trig, mask=dims < half, other=0.0).to(tl.float32)
    sin = tl.load(SIN + trig, mask=dims < half, other=0.0).to(tl.float32)
    if BACKWARD:
        sin = -sin
    _rotate_heads(Q + batch * q_batch_stride + pos * q_seq_stride, q_head_stride, n_q_heads,
                  cos, sin, half, BLOCK_QH, BLOCK_HALF)
    _rotate_heads(K + batch * k_batch_stride + pos * k_seq_stride, k_head_stride, n_k_heads,
                  cos, sin, half, BLOCK_KH, BLOCK_HALF)


def _check_inputs(q, k, cos, sin):
    if q.dim() != 4 or k.dim() != 4:
        raise ValueError("rope expects q and k as [batch, heads, seq, head_dim] tensors")
    if cos.shape != sin.shape or cos.dim() != 3:
        raise ValueError("rope expects cos and sin as [batch or 1, seq, rotary_dim] (transformers' layout)")
    rot = cos.shape[-1]
    if rot % 2 or rot > q.shape[-1] or q.shape[-1] != k.shape[-1]:
        raise ValueError(f"rope: rotary dim {rot} must be even and <= head_dim {q.shape[-1]} (q and k equal)")
    if q.shape[0] != k.shape[0] or q.shape[2] != k.shape[2] or cos.shape[1] != q.shape[2] \
            or cos.shape[0] not in (1, q.shape[0]):
        raise ValueError("rope: q, k, cos and sin must agree on batch and sequence length")


def rope_launch(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, backward: bool):
    """Rotate q and k in place (both [batch, heads, seq, head_dim], last dim contiguous)."""
    batch, n_q_heads, seq_len, _ = q.shape
    if cos.stride(-1) != 1 or sin.stride() != cos.stride():
        cos, sin = cos.contiguous(), sin.contiguous()
    half = cos.shape[-1] // 2
    cos_batch_stride = 0 if cos.shape[0] == 1 else cos.stride(0)
    _rope_kernel[(batch * seq_len,)](
        q, k, cos, sin,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        cos_batch_stride, cos.stride(1), seq_len, n_q_heads, k.shape[1], half,
        BACKWARD=backward, BLOCK_QH=triton.next_power_of_2(n_q_heads),
        BLOCK_KH=triton.next_power_of_2(k.shape[1]), BLOCK_HALF=triton.next_power_of_2(half),
        num_warps=4 if n_q_heads * half <= 4096 else 8,
    )


def _writable(t: torch.Tensor) -> torch.Tensor:
    # The kernel walks rows with explicit strides but needs a dense last dim and no broadcast strides.
    if t.stride(-1) == 1 and 0 not in t.stride():
        return t
    return t.contiguous()


class RopeFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, cos, sin):
        q_out, k_out = _writable(q), _writable(k)
        rope_launch(q_out, k_out, cos, sin, backward=False)
        # Neither `mark_dirty` (autograd refuses it for several outputs that are views, and q/k are
        # transposed projection outputs) nor a version bump (it would invalidate sibling views of
        # one fused qkv buffer, Phi-3's v). Safe because callers pass fresh projection outputs
        # that no autograd node saved; see `rope`'s docstring.
        ctx.save_for_backward(cos, sin)
        return q_out, k_out

    @staticmethod
    def backward(ctx, dq, dk):
        cos, sin = ctx.saved_tensors
        # Rotating by -theta in place: the incoming gradients are fresh buffers from attention's
        # backward; saving a second Q/K-sized buffer per layer is the point of doing it in place.
        dq, dk = _writable(dq), _writable(dk)
        rope_launch(dq, dk, cos, sin, backward=True)
        return dq, dk, None, None


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rope_reference(q, k, cos, sin):
    """PyTorch reference: transformers' `apply_rotary_pos_emb` with Phi-3's partial-rotary split."""
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    rot = cos.shape[-1]

    def apply(x):
        x_rot, x_pass = x[..., :rot], x[..., rot:]
        return torch.cat([x_rot * cos + rotate_half(x_rot) * sin, x_pass], dim=-1)

    return apply(q), apply(k)


def rope(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    """Apply rotary embedding to q [b, hq, s, d] and k [b, hk, s, d] with transformers' cos/sin
    [b or 1, s, rot]. On the Triton path q and k are rotated in place and returned, and backward
    rotates the incoming gradients in place: pass tensors nothing else has saved for backward
    (a projection output is such a tensor) and do not reuse the gradients you feed in."""
    _check_inputs(q, k, cos, sin)
    if not triton_runs_on(q):
        return rope_reference(q, k, cos, sin)
    # A leaf that trains cannot be overwritten; rotate a copy of it instead.
    q = q.clone() if q.is_leaf and q.requires_grad else q
    k = k.clone() if k.is_leaf and k.requires_grad else k
    return RopeFunction.apply(q, k, cos, sin)
