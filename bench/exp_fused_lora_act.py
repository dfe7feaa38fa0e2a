"""EXPERIMENT (bench only, not the engine): the gate/up LoRA terms added inside the activation kernel.

Today `kernels.ops.lora_mlp.LoraMLP.forward` runs, for the gate and up projections, a base GEMM, then
`y.addmm_(X A^T, B^T)` (a K=r GEMM that reads and writes the whole [M, I] output again), then the
activation kernel (reads e and g, writes h): 7 passes over [M, I] tensors. Here one Triton kernel
takes the base outputs e0, g0 and adds s (X A^T)_tile B^T_tile (a tl.dot with K = r) on the fly,
writes e and g back in place (what backward reads, unchanged) and h: 5 passes, 2 launches fewer.

`install()` swaps LoraMLP.forward for this version; it refuses (returns False) when the engine's
forward no longer saves (x2, e, g, xa, a_gu, ha), so the experiment never runs against a changed
contract. Used by `bench_lora.py --experiment fused-lora-act`; measured result in bench/NOTES.md.
"""
from __future__ import annotations

import inspect

import torch
import triton
import triton.language as tl

from kernels.ops import lora_mlp as engine
from kernels.ops._lora_common import base_project, cat_adapters, rank_offsets

CONTRACT = "ctx.save_for_backward(x2, e, g, xa, a_gu, ha)"
BLOCK_M, BLOCK_N = 64, 128


@triton.jit
def _lora_act_forward_kernel(E, G, H, XA, BG, BU, n_rows, n_cols, xa_stride, off_g, off_u, sg, su,
                             GEGLU: tl.constexpr, RANK: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr):
    rows = tl.program_id(0) * BM + tl.arange(0, BM)
    cols = tl.program_id(1) * BN + tl.arange(0, BN)
    ks = tl.arange(0, RANK)
    row_ok, col_ok = rows < n_rows, cols < n_cols
    xa_rows = XA + rows[:, None].to(tl.int64) * xa_stride + ks[None, :]
    xa_g = tl.load(xa_rows + off_g, mask=row_ok[:, None], other=0.0)
    xa_u = tl.load(xa_rows + off_u, mask=row_ok[:, None], other=0.0)
    b_t = cols[None, :] * RANK + ks[:, None]          # B is [n_cols, RANK] row-major; load B^T tiles
    bg = tl.load(BG + b_t, mask=col_ok[None, :], other=0.0)
    bu = tl.load(BU + b_t, mask=col_ok[None, :], other=0.0)
    lora_g = tl.dot(xa_g, bg)
    lora_u = tl.dot(xa_u, bu)
    mask = row_ok[:, None] & col_ok[None, :]
    offs = rows[:, None].to(tl.int64) * n_cols + cols[None, :]
    e = tl.load(E + offs, mask=mask, other=0.0).to(tl.float32) + sg * lora_g
    g = tl.load(G + offs, mask=mask, other=0.0).to(tl.float32) + su * lora_u
    e = e.to(E.dtype.element_ty)
    g = g.to(G.dtype.element_ty)
    tl.store(E + offs, e, mask=mask)
    tl.store(G + offs, g, mask=mask)
    act, _ = engine._act_and_grad(e.to(tl.float32), GEGLU)
    tl.store(H + offs, (act * g.to(tl.float32)).to(H.dtype.element_ty), mask=mask)


def lora_act_(e, g, xa, bg, bu, offsets, sg, su, geglu):
    """In place e += sg xa_g bg^T, g += su xa_u bu^T; returns h = act(e) * g."""
    n_rows, n_cols = e.shape
    rank = bg.shape[1]
    h = torch.empty_like(e)
    grid = (triton.cdiv(n_rows, BLOCK_M), triton.cdiv(n_cols, BLOCK_N))
    _lora_act_forward_kernel[grid](e, g, h, xa, bg.contiguous(), bu.contiguous(), n_rows, n_cols,
                                   xa.stride(0), offsets[0], offsets[1], float(sg), float(su),
                                   GEGLU=geglu, RANK=rank, BM=BLOCK_M, BN=BLOCK_N, num_warps=4)
    return h


def _usable(x, ag, au, bg_, bu_) -> bool:
    if ag is None or au is None or ag.shape[0] != au.shape[0]:
        return False
    rank = ag.shape[0]
    return rank >= 16 and rank & (rank - 1) == 0 and bg_.shape[1] == rank and bu_.shape[1] == rank


def make_forward(original):
    def forward(ctx, x, scalings, geglu, *flat):
        (wg, ag, bg_, biasg), (wu, au, bu_, biasu), (wd, ad, bd_, biasd) = (
            flat[0:4], flat[4:8], flat[8:12])
        if not _usable(x, ag, au, bg_, bu_):
            return original(ctx, x, scalings, geglu, *flat)
        dtype, x2 = x.dtype, x.reshape(-1, x.shape[-1])
        offsets = rank_offsets([ag, au])
        a_gu = cat_adapters([ag, au], dtype)
        xa = torch.mm(x2, a_gu.t())
        e, g = base_project(x2, wg, biasg), base_project(x2, wu, biasu)
        h = lora_act_(e, g, xa, bg_.to(dtype), bu_.to(dtype), offsets, scalings[0], scalings[1], geglu)
        y = base_project(h, wd, biasd)
        ha = torch.mm(h, ad.to(dtype).t()) if ad is not None else None
        engine._lora_out(y, ha, bd_, scalings[2], dtype)
        ctx.save_for_backward(x2, e, g, xa, a_gu, ha)
        ctx.flat, ctx.scalings, ctx.geglu, ctx.offsets = flat, scalings, geglu, offsets
        ctx.consumed, ctx.x_shape = False, x.shape
        return y.view(*x.shape[:-1], y.shape[-1])
    return forward


def install() -> bool:
    original = engine.LoraMLP.forward
    source = inspect.getsource(original)
    needed = (CONTRACT, "ctx.flat, ctx.scalings, ctx.geglu, ctx.offsets = flat, scalings, geglu, offsets",
              "ctx.consumed, ctx.x_shape = False, x.shape")
    if not all(line in source for line in needed) or not hasattr(engine, "_lora_out"):
        return False
    engine.LoraMLP.forward = staticmethod(make_forward(original))
    return True
