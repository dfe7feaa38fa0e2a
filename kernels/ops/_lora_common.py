"""Shared pieces of the fused LoRA ops (lora_qkv, lora_o, lora_mlp).

A LoRA projection is Y = X W^T + b + s (X A^T) B^T with W [out, in] frozen (plain or bitsandbytes
NF4), A [r, in], B [out, r] trainable, s = lora_alpha / r. `SharedInputLora` is the autograd
Function for k projections that read the same X (Q, K, V: k = 3; O: k = 1). Its backward uses the
cheap order (Unsloth's fast_lora.py, https://github.com/unslothai/unsloth; Hu et al. 2021):

    dYB_i = s_i dY_i B_i                 [M, r]     (rank-sized)
    dX    = sum_i dY_i W_i + [dYB_1 .. dYB_k] [A_1; ..; A_k]   (one [M, k r] x [k r, in] GEMM)
    dA    = [dYB_1 .. dYB_k]^T X         one GEMM for all k adapters, then split
    dB_i  = s_i dY_i^T (X A_i^T)         X A^T was saved in forward ([M, k r])

never forming B A (out x in). Saved for backward: X and X A^T ([M, k r]); the dense weights are
re-read (or re-dequantized into the shared NF4 buffer) in backward. All GEMMs run in X's dtype;
fp32 adapter weights (PEFT's default autocast_adapter_dtype) are cast to it once per forward
(r x in: tiny), and backward reuses those casts (A as the saved [A_1; ..; A_k], each B saved).

The base GEMM seam (`base_outputs`, `base_grad_input`): a weight may also be an FP8 `Fp8Weight`
(kernels/ops/fp8_linear.py). Then X is quantized once per row for all FP8 projections of the
node, and backward's sum_i dY_i W_i over all FP8 projections is ONE scaled FP8 GEMM (the dY_i
quantized together, the weights transposed side by side); the LoRA terms stay in X's dtype.
"""
from __future__ import annotations

import contextlib
from typing import NamedTuple

import torch
import torch.nn.functional as F

from kernels.ops import fp8_linear
from kernels.ops.fp8_linear import (dequantize_weight, fp8_grad_input, fp8_linear_reference, fp8_project,
                                    is_fp8)
from kernels.ops.fp8_quant import quantize_rows
from kernels.ops.fp8_widen import widen_codes
from kernels.ops.lora_add import lora_add_
from kernels.ops.nf4 import dequantize_nf4_into_buffer


class LoraProjection(NamedTuple):
    weight: torch.Tensor                 # [out, in]: a plain tensor, a bitsandbytes Params4bit or an Fp8Weight
    lora_A: torch.Tensor | None = None   # [r, in]
    lora_B: torch.Tensor | None = None   # [out, r]
    scaling: float = 1.0
    bias: torch.Tensor | None = None     # frozen base-layer bias [out]


def is_nf4(weight) -> bool:
    return getattr(weight, "quant_state", None) is not None


def dense_weight(weight, dtype: torch.dtype) -> torch.Tensor:
    """The base weight in `dtype`: NF4 dequantized into the shared per-shape buffer, FP8 dequantized."""
    if is_fp8(weight):
        return dequantize_weight(weight, dtype)
    if is_nf4(weight):
        # dequantize in the stored dtype first, as bitsandbytes does, so values round identically
        dense = dequantize_nf4_into_buffer(weight)
        return dense if dense.dtype == dtype else dense.to(dtype)
    return weight if weight.dtype == dtype else weight.to(dtype)


def out_features(weight) -> int:
    if is_fp8(weight):
        return weight.codes.shape[0]
    return int(weight.quant_state.shape[0]) if is_nf4(weight) else weight.shape[0]


def base_project(x2: torch.Tensor, weight, bias) -> torch.Tensor:
    """x2 @ W^T (+ bias) in x2's dtype."""
    w = dense_weight(weight, x2.dtype)
    if bias is None:
        return torch.mm(x2, w.t())
    return torch.addmm(bias.to(x2.dtype), x2, w.t())


def base_outputs(x2: torch.Tensor, weights, biases) -> tuple[list[torch.Tensor], tuple | None]:
    """([x2 W_i^T (+ b_i)] in x2's dtype, x2's (codes, scales) or None): FP8 weights share one
    per-row quantization of x2."""
    quantized, outputs = None, []
    for weight, bias in zip(weights, biases):
        if is_fp8(weight):
            quantized = quantized if quantized is not None else quantize_rows(x2)
            outputs.append(fp8_project(quantized, weight, bias, x2.dtype))
        else:
            outputs.append(base_project(x2, weight, bias))
    return outputs, quantized


def input_to_save(x2: torch.Tensor, quantized) -> tuple:
    """What a node keeps of its input for dA: (x2, None), or x2's FP8 (codes, scales) when the node
    quantized it anyway and fp8_linear.SAVE_INPUT_FP8 is on (half the bytes, e4m3 precision)."""
    if quantized is not None and fp8_linear.SAVE_INPUT_FP8:
        return quantized
    return x2, None


def lora_a_grad(dyb: torch.Tensor, saved, scale, dtype: torch.dtype) -> torch.Tensor:
    """dA (stacked) = dYB^T X from what `input_to_save` kept. From FP8 codes the per-row scale goes
    onto the rank-sized dYB (X = diag(s) codes, so dYB^T X = (diag(s) dYB)^T codes) and the codes
    are widened exactly (e4m3 fits in bf16/fp16, kernels/ops/fp8_widen.py): one pass over X."""
    if scale is None:
        return torch.mm(dyb.t(), saved)
    return torch.mm((dyb * scale).to(dtype).t(), widen_codes(saved, dtype))


def base_grad_input(grads, weights, dtype: torch.dtype) -> torch.Tensor:
    """sum_i dY_i W_i in `dtype`: the FP8 weights in one FP8 GEMM, the others added with addmm_."""
    fp8 = [(g, w) for g, w in zip(grads, weights) if is_fp8(w)]
    dx = fp8_grad_input([g for g, _ in fp8], [w for _, w in fp8], dtype) if fp8 else None
    for grad, weight in zip(grads, weights):
        if not is_fp8(weight):
            dense = dense_weight(weight, dtype)
            dx = torch.mm(grad, dense) if dx is None else dx.addmm_(grad, dense)
    return dx


def rank_offsets(lora_As) -> list[int]:
    offsets, total = [], 0
    for a in lora_As:
        offsets.append(total)
        total += 0 if a is None else a.shape[0]
    return offsets + [total]


# Off until a device A/B shows the host time it saves (bench switch `stepcasts`, bench/NOTES.md session 69).
CACHE_STEP_CASTS = False
_step_casts: dict | None = None   # (ids of the adapters, dtype) -> (the adapters, their cast or concatenation)


@contextlib.contextmanager
def step_casts():
    """Within, with CACHE_STEP_CASTS: an adapter's cast to the compute dtype (and a shared input's [A_1; ..;
    A_k]) is made by the step's first forward and reused by its others (a checkpointed layer's recompute,
    KTO's KL pass), where each forward made its own: a few hundred launches a step on a host-bound 1B.
    The trainer holds it over one optimizer step's passes and leaves it before the update: the weights must
    not change inside, and a version key would not see them change (torch's fused AdamW does not bump a
    tensor's version). Only casts made without grad (inside the fused ops) are kept, none a graph records."""
    global _step_casts
    outer, _step_casts = _step_casts, ({} if CACHE_STEP_CASTS else None)
    try:
        yield
    finally:
        _step_casts = outer


def _once_a_step(adapters: tuple, dtype: torch.dtype, make):
    cache = _step_casts
    if cache is None or torch.is_grad_enabled():
        return make()
    key = (tuple(map(id, adapters)), dtype)
    hit = cache.get(key)
    if hit is not None and all(a is b for a, b in zip(hit[0], adapters)):
        return hit[1]
    value = make()
    cache[key] = (adapters, value)
    return value


def as_dtype(t: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    """`t.to(dtype)` without the call where it would return `t` itself (None stays None): the fused
    LoRA paths make hundreds of such calls a step (bench/NOTES.md, KTO host time). An adapter weight's
    cast is made once a step within `step_casts`."""
    if t is None or t.dtype == dtype:
        return t
    if _step_casts is not None and t.is_leaf and t.requires_grad:
        return _once_a_step((t,), dtype, lambda: t.to(dtype))
    return t.to(dtype)


def cat_adapters(lora_As, dtype):
    present = [a for a in lora_As if a is not None]
    if len(present) > 1:
        def make():
            return torch.cat([as_dtype(a, dtype) for a in present])
        return make() if _step_casts is None else _once_a_step(tuple(present), dtype, make)
    return as_dtype(present[0], dtype) if present else None


def lora_reference(x: torch.Tensor, proj: LoraProjection) -> torch.Tensor:
    """Plain-PyTorch LoRA projection (dequantizing NF4 with bitsandbytes' own function; FP8 through
    the emulated FP8 linear, see kernels/ops/fp8_linear.py)."""
    w = proj.weight
    if is_fp8(w):
        y = fp8_linear_reference(x, w, proj.bias)
        if proj.lora_A is not None:
            y = y + proj.scaling * F.linear(F.linear(x, proj.lora_A.to(x.dtype)), proj.lora_B.to(x.dtype))
        return y
    if is_nf4(w):
        import bitsandbytes.functional as bnbf
        w = bnbf.dequantize_4bit(w.data, w.quant_state, quant_type="nf4")
    y = F.linear(x, w.to(x.dtype), None if proj.bias is None else proj.bias.to(x.dtype))
    if proj.lora_A is not None:
        y = y + proj.scaling * F.linear(F.linear(x, proj.lora_A.to(x.dtype)), proj.lora_B.to(x.dtype))
    return y


def flat_args(projections) -> list:
    out = []
    for p in projections:
        out += [p.weight, p.lora_A, p.lora_B, p.bias]
    return out


class SharedInputLora(torch.autograd.Function):
    """k LoRA projections of one input X. apply(X, scalings, W1, A1, B1, b1, W2, ...)."""

    @staticmethod
    def forward(ctx, x, scalings, *flat):
        projections = [flat[i:i + 4] for i in range(0, len(flat), 4)]
        x2 = x.reshape(-1, x.shape[-1])
        lora_As = [p[1] for p in projections]
        a_cat = cat_adapters(lora_As, x.dtype)
        xa = torch.mm(x2, a_cat.t()) if a_cat is not None else None
        offsets = rank_offsets(lora_As)
        # each B in x's dtype once: forward's add and backward's dYB both read it (saved below)
        lora_Bs = [as_dtype(p[2], x.dtype) for p in projections]
        outputs = []
        bases, quantized = base_outputs(x2, [p[0] for p in projections], [p[3] for p in projections])
        for i, (y, (_, lora_A, _, _)) in enumerate(zip(bases, projections)):
            if lora_A is not None:
                # tile-wise Triton add (kernels/ops/lora_add.py), not a K = r cuBLAS GEMM
                lora_add_(y, xa[:, offsets[i]:offsets[i + 1]], lora_Bs[i], scalings[i])
            outputs.append(y.view(*x.shape[:-1], y.shape[-1]))
        ctx.save_for_backward(*input_to_save(x2, quantized), xa, a_cat, *lora_Bs)
        ctx.projections, ctx.scalings, ctx.offsets, ctx.dtype = projections, scalings, offsets, x.dtype
        ctx.consumed = False
        return tuple(outputs)

    @staticmethod
    def backward(ctx, *grads):
        if ctx.consumed:
            raise RuntimeError("fused LoRA backward ran twice on one graph (retain_graph=True is not "
                               "supported by the fused path); use backend='torch' for that")
        ctx.consumed = True
        x_saved, x_scale, xa, a_cat, *lora_Bs = ctx.saved_tensors
        dtype, offsets = ctx.dtype, ctx.offsets
        dyb = xa.new_empty(xa.shape[0], offsets[-1]) if a_cat is not None else None
        result = [None] * (4 * len(ctx.projections))
        dys = [as_dtype(g.reshape(-1, g.shape[-1]), dtype) for g in grads]
        dx = base_grad_input(dys, [p[0] for p in ctx.projections], dtype) if ctx.needs_input_grad[0] else None
        for i, (dy, (_, lora_A, lora_B, _)) in enumerate(zip(dys, ctx.projections)):
            if lora_A is None:
                continue
            cols = slice(offsets[i], offsets[i + 1])
            # beta=0: the scaling rides in the GEMM epilogue, the uninitialised target is not read
            dyb[:, cols].addmm_(dy, lora_Bs[i], beta=0, alpha=ctx.scalings[i])
            db = dy.new_empty(dy.shape[1], offsets[i + 1] - offsets[i])
            result[4 * i + 2] = db.addmm_(dy.t(), xa[:, cols], beta=0, alpha=ctx.scalings[i]).to(lora_B.dtype)
        if dyb is not None:
            if dx is not None:
                dx.addmm_(dyb, a_cat)
            da = lora_a_grad(dyb, x_saved, x_scale, dtype)
            for i, (_, lora_A, _, _) in enumerate(ctx.projections):
                if lora_A is not None:
                    result[4 * i + 1] = da[offsets[i]:offsets[i + 1]].to(lora_A.dtype)
        dx = None if dx is None else dx.view(*grads[0].shape[:-1], x_saved.shape[-1])
        return (dx, None, *result)


def shared_input_lora(x: torch.Tensor, projections) -> tuple:
    """Apply k LoRA projections that share the input `x` through one autograd node."""
    scalings = tuple(float(p.scaling) for p in projections)
    return SharedInputLora.apply(x, scalings, *flat_args(projections))
