"""Fused LoRA MLP: gate/up LoRA projections, SwiGLU or GeGLU(tanh), down LoRA projection.

    e = X Wg^T + sg (X Ag^T) Bg^T      g = X Wu^T + su (X Au^T) Bu^T
    h = act(e) * g                      (silu for Llama/Qwen/Mistral, gelu-tanh for Gemma)
    Y = h Wd^T + sd (h Ad^T) Bd^T

One autograd node. Saved: X, e, g ([M, I] each, like HF's saved activations minus h and act(e)),
X [Ag; Au]^T ([M, 2r]) and h Ad^T ([M, r]). h is never kept: the backward kernel recomputes act(e)
from e and overwrites the three [M, I] buffers in place (dh -> h, e -> de, g -> dg), the trick of
Unsloth's swiglu/geglu backward kernels (https://github.com/unslothai/unsloth, fast_lora.py
`LoRA_MLP`); all LoRA gradients in the cheap order (see kernels.ops._lora_common):

    dYB = sd dY Bd;  dh = dY Wd + dYB Ad;  dBd = sd dY^T (h Ad^T);  dAd = dYB^T h
    dX  = de Wg + dg Wu + [sg de Bg, su dg Bu] [Ag; Au];  dA_{g,u} = [..]^T X;  dB = s d^T (X A^T)

silu'(e) = sig(e) (1 + e (1 - sig(e)));  gelu_tanh'(e) = 0.5 (1 + t) + 0.5 e (1 - t^2) k (1 + 3c e^2)
with t = tanh(k (e + c e^3)), k = sqrt(2/pi), c = 0.044715.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from kernels.ops._lora_common import (LoraProjection, as_dtype, base_grad_input, base_outputs, cat_adapters,
                                      flat_args, input_to_save, lora_a_grad, lora_reference, rank_offsets)
from kernels.ops.geglu import gelu_and_grad
from kernels.ops.lora_add import lora_add_

ACTIVATIONS = ("swiglu", "geglu")
BLOCK = 1024
# Off: measured slower on the H200 (bench/gpu_check.py `lora_act_backward`, [4096, 14336] r16:
# 0.47 ms fused vs 0.27 ms for addmm_ + the flat kernel; 64x128 tiles of 4 warps hold ~64 fp32
# values x 5 live tensors a thread). Kept, tested, for a retune (smaller tiles / 8 warps).
FUSE_DOWN_LORA_BACKWARD = False
# A forward without grad writes h over e and leaves e, g without their adapters' terms (LoraMLP, saving
# False). False: it writes them as a forward with grad does (bench/bench_fp8.py switch `mlpsave`).
NO_GRAD_OVER_E = True


@triton.jit
def _act_and_grad(e, GEGLU: tl.constexpr):
    """(act(e), act'(e)) in fp32: gelu-tanh from the geglu op, silu here."""
    if GEGLU:
        act, grad = gelu_and_grad(e, True)
    else:
        sig = tl.sigmoid(e)
        act = e * sig
        grad = sig * (1.0 + e * (1.0 - sig))
    return act, grad


@triton.jit
def _act_mul_forward_kernel(e_ptr, g_ptr, h_ptr, n, GEGLU: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    e = tl.load(e_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    g = tl.load(g_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    act, _ = _act_and_grad(e, GEGLU)
    tl.store(h_ptr + offs, (act * g).to(h_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _act_mul_backward_kernel(dh_ptr, e_ptr, g_ptr, n, GEGLU: tl.constexpr, BLOCK: tl.constexpr):
    """In place: dh <- h = act(e) g,  e <- de = dh g act'(e),  g <- dg = dh act(e)."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    dh = tl.load(dh_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    e = tl.load(e_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    g = tl.load(g_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    act, grad = _act_and_grad(e, GEGLU)
    tl.store(dh_ptr + offs, (act * g).to(dh_ptr.dtype.element_ty), mask=mask)
    tl.store(e_ptr + offs, (dh * g * grad).to(e_ptr.dtype.element_ty), mask=mask)
    tl.store(g_ptr + offs, (dh * act).to(g_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _lora_act_forward_kernel(E, G, H, XA, BG, BU, n_rows, n_cols, xa_stride, off_g, off_u, sg, su,
                             GEGLU: tl.constexpr, RANK: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                             DOT_FP32: tl.constexpr, SAVE: tl.constexpr):
    """In place e += sg (X Ag^T)_tile Bg^T_tile, g += su (X Au^T) Bu^T (tl.dot, K = rank); h = act(e) g.
    Saves the two addmm_ passes over [M, I] (7 -> 5 passes, 2 launches fewer). SAVE False (a forward
    without grad): e and g are not written back, and H may be E (each tile is read before it is
    written): 3 passes."""
    rows = tl.program_id(0) * BM + tl.arange(0, BM)
    cols = tl.program_id(1) * BN + tl.arange(0, BN)
    ks = tl.arange(0, RANK)
    row_ok, col_ok = rows < n_rows, cols < n_cols
    xa_rows = XA + rows[:, None].to(tl.int64) * xa_stride + ks[None, :]
    xa_g = tl.load(xa_rows + off_g, mask=row_ok[:, None], other=0.0)
    xa_u = tl.load(xa_rows + off_u, mask=row_ok[:, None], other=0.0)
    b_t = cols[None, :] * RANK + ks[:, None]          # B is [n_cols, RANK] row-major: load B^T tiles
    bg = tl.load(BG + b_t, mask=col_ok[None, :], other=0.0)
    bu = tl.load(BU + b_t, mask=col_ok[None, :], other=0.0)
    if DOT_FP32:  # the CPU interpreter computes a bf16 tl.dot wrongly; on the GPU bf16 is exact enough
        xa_g, xa_u, bg, bu = xa_g.to(tl.float32), xa_u.to(tl.float32), bg.to(tl.float32), bu.to(tl.float32)
    lora_g = tl.dot(xa_g, bg)
    lora_u = tl.dot(xa_u, bu)
    mask = row_ok[:, None] & col_ok[None, :]
    offs = rows[:, None].to(tl.int64) * n_cols + cols[None, :]
    e = (tl.load(E + offs, mask=mask, other=0.0).to(tl.float32) + sg * lora_g).to(E.dtype.element_ty)
    g = (tl.load(G + offs, mask=mask, other=0.0).to(tl.float32) + su * lora_u).to(G.dtype.element_ty)
    if SAVE:
        tl.store(E + offs, e, mask=mask)
        tl.store(G + offs, g, mask=mask)
    act, _ = _act_and_grad(e.to(tl.float32), GEGLU)
    tl.store(H + offs, (act * g.to(tl.float32)).to(H.dtype.element_ty), mask=mask)


@triton.jit
def _lora_act_backward_kernel(DH, E, G, DYB, AD, n_rows, n_cols, dyb_stride,
                              GEGLU: tl.constexpr, RANK: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                              DOT_FP32: tl.constexpr):
    """_act_mul_backward_kernel with the down adapter's dh term added first, tile-wise:
    dh = dY Wd (in DH) + (sd dY Bd)_tile Ad_tile (tl.dot, K = rank). Saves the addmm_ pass over
    [M, I] (a read and a write of dh: 235 MB a layer on the 8B shape)."""
    rows = tl.program_id(0) * BM + tl.arange(0, BM)
    cols = tl.program_id(1) * BN + tl.arange(0, BN)
    ks = tl.arange(0, RANK)
    row_ok, col_ok = rows < n_rows, cols < n_cols
    dyb = tl.load(DYB + rows[:, None].to(tl.int64) * dyb_stride + ks[None, :], mask=row_ok[:, None], other=0.0)
    ad = tl.load(AD + ks[:, None] * n_cols + cols[None, :], mask=col_ok[None, :], other=0.0)
    if DOT_FP32:  # the CPU interpreter computes a bf16 tl.dot wrongly; on the GPU bf16 is exact enough
        dyb, ad = dyb.to(tl.float32), ad.to(tl.float32)
    mask = row_ok[:, None] & col_ok[None, :]
    offs = rows[:, None].to(tl.int64) * n_cols + cols[None, :]
    dh = tl.load(DH + offs, mask=mask, other=0.0).to(tl.float32) + tl.dot(dyb, ad)
    e = tl.load(E + offs, mask=mask, other=0.0).to(tl.float32)
    g = tl.load(G + offs, mask=mask, other=0.0).to(tl.float32)
    act, grad = _act_and_grad(e, GEGLU)
    tl.store(DH + offs, (act * g).to(DH.dtype.element_ty), mask=mask)
    tl.store(E + offs, (dh * g * grad).to(E.dtype.element_ty), mask=mask)
    tl.store(G + offs, (dh * act).to(G.dtype.element_ty), mask=mask)


def _rank_fusable(rank: int) -> bool:
    return 16 <= rank <= 128 and rank & (rank - 1) == 0


def _lora_act_backward_(dh, e, g, dyb, ad, geglu: bool):
    """In place, like _act_mul_backward_, after dh += dyb @ ad ([M, r] x [r, I])."""
    (n_rows, n_cols), rank = e.shape, ad.shape[0]
    grid = (triton.cdiv(n_rows, 64), triton.cdiv(n_cols, 128))
    _lora_act_backward_kernel[grid](dh, e, g, dyb, ad.contiguous(), n_rows, n_cols, dyb.stride(0),
                                    GEGLU=geglu, RANK=rank, BM=64, BN=128, DOT_FP32=not e.is_cuda,
                                    num_warps=4)


def _lora_act_fusable(ag, au, bg_, bu_) -> bool:
    """Both adapters present with one power-of-two rank >= 16 (tl.dot needs K >= 16)."""
    if ag is None or au is None or ag.shape[0] != au.shape[0]:
        return False
    rank = ag.shape[0]
    return _rank_fusable(rank) and bg_.shape[1] == rank == bu_.shape[1]


def _lora_act_(e, g, xa, bg_, bu_, offsets, sg, su, geglu: bool, save: bool = True):
    """h = act(e + sg xa_g Bg^T) (g + su xa_u Bu^T); save: e and g take their adapters' terms in place
    (backward reads them), else h is written over e."""
    h = torch.empty_like(e) if save else e
    (n_rows, n_cols), rank = e.shape, bg_.shape[1]
    grid = (triton.cdiv(n_rows, 64), triton.cdiv(n_cols, 128))
    _lora_act_forward_kernel[grid](e, g, h, xa, bg_.contiguous(), bu_.contiguous(), n_rows, n_cols,
                                   xa.stride(0), offsets[0], offsets[1], float(sg), float(su),
                                   GEGLU=geglu, RANK=rank, BM=64, BN=128,
                                   DOT_FP32=not e.is_cuda, SAVE=save, num_warps=4)
    return h


def _act_mul(e, g, geglu: bool, save: bool = True):
    """h = act(e) g; save False: h written over e (an elementwise kernel: each value read before written)."""
    h = torch.empty_like(e) if save else e
    n = e.numel()
    _act_mul_forward_kernel[(triton.cdiv(n, BLOCK),)](e, g, h, n, GEGLU=geglu, BLOCK=BLOCK)
    return h


def _act_mul_backward_(dh, e, g, geglu: bool):
    n = e.numel()
    _act_mul_backward_kernel[(triton.cdiv(n, BLOCK),)](dh, e, g, n, GEGLU=geglu, BLOCK=BLOCK)


def _lora_out(y, inp_a, lora_B, scaling):
    """y += s inp_a B^T with B already in y's dtype (None: no adapter)."""
    if lora_B is not None:
        lora_add_(y, inp_a, lora_B, scaling)
    return y


def _lora_grads(d, lora_B, b_cast, scaling, inp_a, dyb_out):
    """Writes s d B [M, r] into dyb_out (b_cast: B in d's dtype, as forward cast it); returns
    dB = s d^T inp_a [out, r] in lora_B's dtype. beta=0: the scaling rides in the GEMM epilogue and
    the uninitialised target is not read."""
    dyb_out.addmm_(d, b_cast, beta=0, alpha=scaling)
    db = d.new_empty(d.shape[1], lora_B.shape[1]).addmm_(d.t(), inp_a, beta=0, alpha=scaling)
    return db.to(lora_B.dtype)


class LoraMLP(torch.autograd.Function):
    """apply(X, scalings, geglu, output_needed, saving, Wg, Ag, Bg, bg, Wu, Au, Bu, bu, Wd, Ad, Bd, bd).

    output_needed False: backward is built as usual but the down projection is not run and the
    output is left unwritten: for a checkpointed layer's recompute, whose output no one reads
    (its next layer's input was kept), when the MLP's output feeds only the residual sum.
    saving False: no backward will run (a forward without grad: a checkpointed layer's first pass,
    GRPO's sampling), so e and g keep no adapter terms and h overwrites e: the fused
    kernel makes 3 passes over [M, I] instead of 5, and one [M, I] buffer fewer is alive."""

    @staticmethod
    def forward(ctx, x, scalings, geglu, output_needed, saving, *flat):
        (wg, ag, bg_, biasg), (wu, au, bu_, biasu), (wd, ad, bd_, biasd) = (
            flat[0:4], flat[4:8], flat[8:12])
        dtype, x2 = x.dtype, x.reshape(-1, x.shape[-1])
        offsets = rank_offsets([ag, au])
        a_gu = cat_adapters([ag, au], dtype)
        xa = torch.mm(x2, a_gu.t()) if a_gu is not None else None
        (e, g), x_quantized = base_outputs(x2, [wg, wu], [biasg, biasu])   # FP8 weights: x2 quantized once
        # the adapters in x's dtype once: backward reuses these casts (saved below)
        bg_c, bu_c, ad_c, bd_c = (as_dtype(t, dtype) for t in (bg_, bu_, ad, bd_))
        if _lora_act_fusable(ag, au, bg_, bu_):
            h = _lora_act_(e, g, xa, bg_c, bu_c, offsets, scalings[0], scalings[1], geglu, saving)
        else:
            _lora_out(e, None if ag is None else xa[:, offsets[0]:offsets[1]], bg_c, scalings[0])
            _lora_out(g, None if au is None else xa[:, offsets[1]:offsets[2]], bu_c, scalings[1])
            h = _act_mul(e, g, geglu, saving)
        ha = torch.mm(h, ad_c.t()) if ad is not None else None
        if output_needed:
            (y,), _ = base_outputs(h, [wd], [biasd])
            _lora_out(y, ha, bd_c, scalings[2])
        else:   # ~28 % of the MLP's GEMM work (the down projection) saved in every recompute; the
            # output is as wide as the input (it joins the residual), whatever form Wd is stored in
            y = h.new_empty(h.shape[0], x2.shape[1])
        ctx.save_for_backward(*input_to_save(x2, x_quantized), e, g, xa, a_gu, ha, bg_c, bu_c, ad_c, bd_c)
        ctx.flat, ctx.scalings, ctx.geglu, ctx.offsets = flat, scalings, geglu, offsets
        ctx.consumed, ctx.x_shape = False, x.shape
        return y.view(*x.shape[:-1], y.shape[-1])

    @staticmethod
    def backward(ctx, dy):
        if ctx.consumed:
            raise RuntimeError("fused LoRA MLP backward ran twice on one graph (its buffers are reused "
                               "in place); retain_graph=True needs backend='torch'")
        ctx.consumed = True
        x_saved, x_scale, e, g, xa, a_gu, ha, bg_c, bu_c, ad_c, bd_c = ctx.saved_tensors
        wg, wu, (wd, ad, bd_, _) = ctx.flat[0], ctx.flat[4], ctx.flat[8:12]
        dtype, sd, result = e.dtype, ctx.scalings[2], [None] * 12
        dy = as_dtype(dy.reshape(-1, dy.shape[-1]), dtype)
        dh = base_grad_input([dy], [wd], dtype)
        if ad is not None:
            dyb_d = dy.new_empty(dy.shape[0], ad.shape[0])
            result[10] = _lora_grads(dy, bd_, bd_c, sd, ha, dyb_d)
        # dh <- h, e <- d(gate), g <- d(up); the down adapter's dh term rides in the kernel at rank 2^k
        if (FUSE_DOWN_LORA_BACKWARD and ad is not None and _rank_fusable(ad.shape[0])
                and e.stride() == dh.stride()):
            _lora_act_backward_(dh, e, g, dyb_d, ad_c, ctx.geglu)
        else:
            if ad is not None:
                dh.addmm_(dyb_d, ad_c)
            _act_mul_backward_(dh, e, g, ctx.geglu)
        if ad is not None:
            result[9] = torch.mm(dyb_d.t(), dh).to(ad.dtype)
        # e, g now hold d(gate), d(up): with FP8 weights one GEMM over [de dg] [Wg; Wu]
        dx = base_grad_input([e, g], [wg, wu], dtype) if ctx.needs_input_grad[0] else None
        if a_gu is not None:   # X comes back (from FP8 codes, see input_to_save) only here, for dA
            _gate_up_lora_grads(ctx, (x_saved, x_scale), e, g, xa, a_gu, (bg_c, bu_c), dx, result)
        return (None if dx is None else dx.view(ctx.x_shape), None, None, None, None, *result)


def _gate_up_lora_grads(ctx, saved_x, de, dg, xa, a_gu, b_casts, dx, result):
    (_, ag, bg_, _), (_, au, bu_, _) = ctx.flat[0:4], ctx.flat[4:8]
    (sg, su, _), offsets, dtype = ctx.scalings, ctx.offsets, de.dtype
    bg_c, bu_c = b_casts
    dyb = de.new_empty(de.shape[0], offsets[2])   # [s de Bg, s dg Bu]: one GEMM for dX, one for dA
    if ag is not None:
        result[2] = _lora_grads(de, bg_, bg_c, sg, xa[:, offsets[0]:offsets[1]], dyb[:, offsets[0]:offsets[1]])
    if au is not None:
        result[6] = _lora_grads(dg, bu_, bu_c, su, xa[:, offsets[1]:offsets[2]], dyb[:, offsets[1]:offsets[2]])
    if dx is not None:
        dx.addmm_(dyb, a_gu)
    da = lora_a_grad(dyb, *saved_x, dtype)
    if ag is not None:
        result[1] = da[offsets[0]:offsets[1]].to(ag.dtype)
    if au is not None:
        result[5] = da[offsets[1]:offsets[2]].to(au.dtype)


def lora_mlp(x: torch.Tensor, gate: LoraProjection, up: LoraProjection, down: LoraProjection,
             activation: str = "swiglu", output_needed: bool = True) -> torch.Tensor:
    """x [..., hidden] -> [..., hidden]. activation: "swiglu" (silu) or "geglu" (gelu, tanh approx).
    output_needed False: gradients as usual, the output's values unwritten (see LoraMLP)."""
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")
    for name, proj in (("gate", gate), ("up", up), ("down", down)):
        if (proj.lora_A is None) != (proj.lora_B is None):
            raise ValueError(f"{name}: lora_A and lora_B must be given together (or both None)")
    scalings = tuple(float(p.scaling) for p in (gate, up, down))
    flat = flat_args([gate, up, down])
    saving = (not NO_GRAD_OVER_E or torch.is_grad_enabled()
              and any(getattr(t, "requires_grad", False) for t in (x, *flat)))
    return LoraMLP.apply(x, scalings, activation == "geglu", output_needed, saving, *flat)


def lora_mlp_reference(x, gate: LoraProjection, up: LoraProjection, down: LoraProjection,
                       activation: str = "swiglu"):
    e, g = lora_reference(x, gate), lora_reference(x, up)
    act = F.silu(e) if activation == "swiglu" else F.gelu(e, approximate="tanh")
    return lora_reference(act * g, down)
