"""Shared helpers for the fused-LoRA op tests: random projections and a relative-error check."""
from __future__ import annotations

import torch

from kernels.ops._lora_common import LoraProjection

# max |a - b| / max |b| allowed per compute dtype (bf16 has 8 mantissa bits, fp16 11)
REL_TOL = {torch.float32: 2e-5, torch.float16: 4e-3, torch.bfloat16: 3e-2}


def projection(out_f: int, in_f: int, dtype, rank: int = 5, lora: bool = True, bias: bool = False,
               scaling: float = 2.0, adapter_dtype=torch.float32) -> LoraProjection:
    """A frozen base weight in `dtype` and (optionally) trainable fp32 adapters, as PEFT makes them."""
    weight = (torch.randn(out_f, in_f) / in_f ** 0.5).to(dtype)
    lora_A = (torch.randn(rank, in_f) / in_f ** 0.5).to(adapter_dtype).requires_grad_() if lora else None
    lora_B = (torch.randn(out_f, rank) * 0.2).to(adapter_dtype).requires_grad_() if lora else None
    b = (torch.randn(out_f) * 0.1).to(dtype) if bias else None
    return LoraProjection(weight, lora_A, lora_B, scaling, b)


def adapters(projections) -> list[torch.Tensor]:
    return [t for p in projections for t in (p.lora_A, p.lora_B) if t is not None]


def assert_rel_close(actual: torch.Tensor, expected: torch.Tensor, tol: float, what: str = "") -> None:
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    err = (actual.float() - expected.float()).abs().max().item()
    scale = expected.float().abs().max().item() or 1.0
    assert err <= tol * scale, f"{what}: max error {err:.3g} > {tol} x {scale:.3g}"


def compare_op(fused_fn, reference_fn, x: torch.Tensor, projections, tol: float, **kwargs) -> None:
    """Outputs and the gradients of x and of every adapter agree between fused and reference."""
    x_fused, x_ref = x.clone().requires_grad_(), x.clone().requires_grad_()
    params = adapters(projections)
    out_fused = fused_fn(x_fused, *projections, **kwargs)
    out_ref = reference_fn(x_ref, *projections, **kwargs)
    out_fused = out_fused if isinstance(out_fused, tuple) else (out_fused,)
    out_ref = out_ref if isinstance(out_ref, tuple) else (out_ref,)
    upstream = [torch.randn_like(o) for o in out_ref]
    grads_fused = torch.autograd.grad(out_fused, [x_fused] + params, upstream)
    grads_ref = torch.autograd.grad(out_ref, [x_ref] + params, upstream)
    for i, (a, b) in enumerate(zip(out_fused, out_ref)):
        assert a.dtype == b.dtype
        assert_rel_close(a, b, tol, f"output {i}")
    names = ["dX"] + [f"d(adapter {i})" for i in range(len(params))]
    for name, a, b in zip(names, grads_fused, grads_ref):
        assert a.dtype == b.dtype, f"{name}: dtype {a.dtype} != {b.dtype}"
        assert_rel_close(a, b, tol, name)
