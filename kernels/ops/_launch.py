"""Launch settings shared by the row-wise Triton kernels (rms_norm, rope, swiglu, geglu).

One config per shape, no autotune: the CPU interpreter needs exactly one config, and for these
memory-bound row kernels the block only has to cover the row (next power of two) with enough warps
to keep every lane busy. The warp ladder is the one Liger-Kernel's `calculate_settings` uses.
"""
from __future__ import annotations

import os

import torch
import triton

MAX_FUSED_BLOCK = 65536  # one row must fit in a block; 64K fp32 values is the practical ceiling


def row_block(n_cols: int) -> tuple[int, int]:
    """(BLOCK_SIZE, num_warps) for a kernel that keeps one whole row of `n_cols` in registers."""
    block = triton.next_power_of_2(n_cols)
    if block > MAX_FUSED_BLOCK:
        raise ValueError(
            f"a row of {n_cols} elements is too wide for the fused row kernel (max {MAX_FUSED_BLOCK}); "
            "use backend='torch' for this model"
        )
    num_warps = 4
    if block >= 32768:
        num_warps = 32
    elif block >= 8192:
        num_warps = 16
    elif block >= 2048:
        num_warps = 8
    return block, num_warps


def triton_runs_on(t: torch.Tensor) -> bool:
    """True where a Triton kernel can run on `t`: a CUDA tensor, or any tensor under TRITON_INTERPRET=1."""
    return t.is_cuda or os.environ.get("TRITON_INTERPRET") == "1"


def sm_count(device: torch.device) -> int:
    """Streaming multiprocessors on `device` (a small fixed number on CPU, for the interpreter)."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 4


# ---- shared by the gated-activation ops (swiglu, geglu) ---------------------------------------
GATED_BLOCK_COLS = 1024  # elements per program along the row; 4 warps x 32 lanes x 8 values


def dense_rows(t: torch.Tensor) -> torch.Tensor:
    """A [rows, cols] view with a dense last dim (a copy only when no such view exists)."""
    if t.dim() >= 2 and t.stride(-1) == 1:
        try:
            return t.view(-1, t.shape[-1])
        except RuntimeError:
            pass
    return t.reshape(-1, t.shape[-1]).contiguous()


def gated_grid(n_rows: int, n_cols: int) -> tuple[int, int]:
    return (n_rows, triton.cdiv(n_cols, GATED_BLOCK_COLS))


def can_overwrite_pair(gate: torch.Tensor, up: torch.Tensor) -> bool:
    """Backward may write d(gate), d(up) over the saved gate/up only for distinct, dense-row
    buffers that are not user-visible leaves."""
    if gate.is_leaf or up.is_leaf or gate.stride(-1) != 1 or up.stride(-1) != 1:
        return False
    return gate.data_ptr() != up.data_ptr()
