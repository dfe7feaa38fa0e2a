"""Fused LoRA for one projection (the attention output projection, or any lone LoRA Linear).

Y = X W^T + b + s (X A^T) B^T through one autograd node that saves only X and X A^T ([M, r]) and
computes dX = dY W + (s dY B) A, dA = (s dY B)^T X, dB = s dY^T (X A^T) in the cheap order
(never an out x in product). W may be a plain tensor or a bitsandbytes NF4 `Params4bit`
(dequantized into a reused buffer in forward and backward). The maths and backward live in
`kernels.ops._lora_common.SharedInputLora` (this is its one-projection case); the idea follows
Unsloth's `LoRA_W` in fast_lora.py.
"""
from __future__ import annotations

import torch

from kernels.ops._lora_common import LoraProjection, lora_reference, shared_input_lora


def lora_o(x: torch.Tensor, weight, lora_A=None, lora_B=None, scaling: float = 1.0,
           bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., in] -> [..., out]. lora_A [r, in] and lora_B [out, r] may both be None (no adapter)."""
    if (lora_A is None) != (lora_B is None):
        raise ValueError("lora_A and lora_B must be given together (or both None)")
    (y,) = shared_input_lora(x, [LoraProjection(weight, lora_A, lora_B, scaling, bias)])
    return y


def lora_o_reference(x, weight, lora_A=None, lora_B=None, scaling=1.0, bias=None):
    return lora_reference(x, LoraProjection(weight, lora_A, lora_B, scaling, bias))
