"""Fused LoRA for the attention Q, K and V projections: one input X, three (W, A, B, s).

One autograd node for all three: X A^T for the three adapters is one GEMM ([M, in] x [in, 3r]);
in backward dX accumulates the three base GEMMs in place (addmm_ into one buffer) plus one
[M, 3r] x [3r, in] GEMM for all LoRA parts, and dA for the three adapters is one GEMM too.
Saved: X and X A^T ([M, 3r]) only. Formulas in `kernels.ops._lora_common` (after Unsloth's
`LoRA_QKV`, fast_lora.py). Projections without an adapter (A, B None) are plain (frozen) GEMMs.
"""
from __future__ import annotations

import torch

from kernels.ops._lora_common import LoraProjection, lora_reference, shared_input_lora


def lora_qkv(x: torch.Tensor, q: LoraProjection, k: LoraProjection, v: LoraProjection):
    """x [..., hidden] -> (q [..., q_out], k [..., kv_out], v [..., kv_out])."""
    for name, proj in (("q", q), ("k", k), ("v", v)):
        if (proj.lora_A is None) != (proj.lora_B is None):
            raise ValueError(f"{name}: lora_A and lora_B must be given together (or both None)")
    return shared_input_lora(x, [q, k, v])


def lora_qkv_reference(x, q: LoraProjection, k: LoraProjection, v: LoraProjection):
    return tuple(lora_reference(x, p) for p in (q, k, v))
