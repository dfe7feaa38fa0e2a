"""Transpose FP8 weight codes for the backward GEMM: [W_1; ..; W_k] ([out_i, in] each) -> [in, sum out_i].

Hopper's FP8 tensor-core GEMMs (cuBLASLt and CUTLASS behind torch._scaled_mm) take both operands
K-major ("TN": A row-major, B column-major). Forward Y = X W^T has K = in, W's contiguous dim: no
copy. Backward dX = dY W has K = out, so W must be read as [in, out] with out contiguous, i.e.
transposed. Keeping a transposed copy of every weight would cost as much memory as bf16 (the
point of FP8 is half), so each backward transposes the weights of one GEMM into a transient
buffer: 2 bytes of traffic per weight value (Llama-3.1-8B: ~14 GB a step, ~4 ms at HBM speed,
against ~60 ms the FP8 GEMMs save). Several weights of one backward GEMM (Q, K, V; gate, up) are
written side by side, so dX = [dQ dK dV] [Wq; Wk; Wv] is ONE GEMM with K = sum out_i and no adds.

One Triton program moves one square tile (loaded row-major, `tl.trans`, stored row-major), on
uint8 views so that the CPU interpreter, which has no fp8 arithmetic, moves the same bytes.
`BACKEND = "torch"` uses `copy_` of a transposed view instead (bench/fp8_microbench.py, now in git history, timed both).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.ops._launch import triton_runs_on

BACKEND = "triton"


@triton.jit
def _transpose_kernel(SRC, DST, n_rows, n_cols, ld_src, ld_dst, TILE: tl.constexpr):
    rows = tl.program_id(0) * TILE + tl.arange(0, TILE)
    cols = tl.program_id(1) * TILE + tl.arange(0, TILE)
    mask = (rows[:, None] < n_rows) & (cols[None, :] < n_cols)
    tile = tl.load(SRC + rows[:, None].to(tl.int64) * ld_src + cols[None, :], mask=mask, other=0)
    out = DST + cols[:, None].to(tl.int64) * ld_dst + rows[None, :]
    tl.store(out, tl.trans(tile), mask=(cols[:, None] < n_cols) & (rows[None, :] < n_rows))


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8) if t.element_size() == 1 and t.dtype != torch.uint8 else t


def transpose_codes(weights, out: torch.Tensor | None = None) -> torch.Tensor:
    """[W_1; ..; W_k]^T: each [out_i, in] (same in, row-major, 1-byte dtype) -> [in, sum out_i]."""
    weights = list(weights)
    n_in = {w.shape[1] for w in weights}
    if len(n_in) != 1 or any(w.dim() != 2 or w.stride(1) != 1 for w in weights):
        raise ValueError("transpose_codes: weights must be row-major [out_i, in] with one `in`, got "
                         f"{[tuple(w.shape) for w in weights]}")
    (n_in,), total = n_in, sum(w.shape[0] for w in weights)
    if out is None:
        out = torch.empty(n_in, total, dtype=weights[0].dtype, device=weights[0].device)
    elif out.shape != (n_in, total) or not out.is_contiguous():
        raise ValueError(f"transpose_codes: out must be a contiguous [{n_in}, {total}] tensor")
    dst, col = _bytes(out), 0
    for w in weights:
        _transpose_one(_bytes(w), dst, col)
        col += w.shape[0]
    return out


def _transpose_one(src: torch.Tensor, dst: torch.Tensor, col: int) -> None:
    n_rows, n_cols = src.shape
    target = dst[:, col:col + n_rows]
    if BACKEND != "triton" or not triton_runs_on(src):
        target.copy_(src.t())
        return
    # 128 x 128 bytes: every row of a tile is one 128-byte line on load and on store
    tile, warps = (128, 8) if src.is_cuda else (32, 4)
    grid = (triton.cdiv(n_rows, tile), triton.cdiv(n_cols, tile))
    _transpose_kernel[grid](src, target, n_rows, n_cols, src.stride(0), dst.stride(0),
                            TILE=tile, num_warps=warps)


def transpose_codes_reference(weights) -> torch.Tensor:
    return torch.cat([_bytes(w) for w in weights], dim=0).t().contiguous().view(weights[0].dtype)
