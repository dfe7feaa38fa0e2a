"""FP8 base weights: swap the frozen linears of every decoder layer for `Fp8Linear` (instances only).

`quantize_base_fp8(model, report, use_triton)` walks the decoder layers (transformers'
GradientCheckpointingLayer instances) and replaces
  * the base layer of every PEFT LoRA Linear (`lora_module.base_layer`), and
  * every other frozen `nn.Linear` of the layer (projections that carry no adapter),
with an `Fp8Linear` (kernels/ops/fp8_linear.py): e4m3fn codes + one fp32 scale per output channel,
quantized once from the bf16 weight, which is then released (half the base memory). The LoRA
adapters, norms, embeddings, lm_head (read by the fused loss in bf16) and anything outside the
decoder layers stay as they are. `kernels.lora_patch` then routes the FP8 bases through the fused
LoRA ops (one quantization of X per node, one backward GEMM per node); an unfused PEFT forward
still works because `Fp8Linear.forward` is itself the FP8 product.

Falls back (weights untouched, the reason in the report) where no row-wise FP8 GEMM exists: the
torch backend, CPU without the Triton interpreter, GPUs below compute capability 8.9, torch
without `_scaled_mm`. On CPU under TRITON_INTERPRET=1 (tests) the same quantized numbers are
multiplied in fp32. Not undone by a later `patch_model` call: the bf16 weights are gone.
"""
from __future__ import annotations

from collections import Counter

import torch

from kernels.ops.fp8_linear import Fp8Linear, fp8_gemm_supported

PRECISIONS = ("bf16", "fp8")
GB = 1e9


def _is_lora_layer(module) -> bool:
    return hasattr(module, "lora_A") and hasattr(module, "base_layer")


def _skip_reason(linear: torch.nn.Module) -> str | None:
    if type(linear) is not torch.nn.Linear:
        return None if isinstance(linear, Fp8Linear) else f"{type(linear).__name__} base layer"
    if linear.weight.requires_grad or (linear.bias is not None and linear.bias.requires_grad):
        return "trainable weight"
    if linear.in_features % 16 or linear.out_features % 16:
        return "in/out features not multiples of 16 (FP8 GEMM tiles)"
    return None


def _targets(layer: torch.nn.Module):
    """(short name, owner module, attribute, linear) for each frozen linear of a decoder layer."""
    lora_parts = set()
    for module in layer.modules():
        if _is_lora_layer(module):
            lora_parts.update(id(m) for m in module.modules())
    found = []
    for qualified, module in layer.named_modules():
        name = qualified.rsplit(".", 1)[-1]
        if _is_lora_layer(module):
            found.append((name, module, "base_layer", module.base_layer))
        elif isinstance(module, (torch.nn.Linear, Fp8Linear)) and id(module) not in lora_parts:
            parent = layer.get_submodule(qualified.rpartition(".")[0]) if "." in qualified else layer
            found.append((name, parent, name, module))
    return found


def fp8_unavailable(model: torch.nn.Module, use_triton: bool) -> str | None:
    """Why the FP8 path cannot run on this model, or None."""
    if not use_triton:
        return "needs the Triton backend (backend torch or no CUDA device)"
    device = next(model.parameters()).device
    if device.type == "cpu":
        return None   # use_triton on CPU means TRITON_INTERPRET=1: emulated FP8 products (tests)
    ok, reason = fp8_gemm_supported(device)
    return None if ok else reason


def _swap(owner, attribute: str, linear, sizes: list[int]) -> None:
    """Put an Fp8Linear in place of `linear` (kept as is when it already is one)."""
    if isinstance(linear, Fp8Linear):
        return
    sizes[0] += linear.weight.numel() * linear.weight.element_size()
    fp8 = Fp8Linear.from_linear(linear)
    setattr(owner, attribute, fp8)
    sizes[1] += fp8.weight.numel() + fp8.weight_scale.numel() * fp8.weight_scale.element_size()


def quantize_base_fp8(model: torch.nn.Module, report, use_triton: bool) -> int:
    """Replace the frozen decoder linears of `model` by Fp8Linear; returns how many. See module doc."""
    from kernels.arch import decoder_layers

    layers = decoder_layers(model)
    reason = fp8_unavailable(model, use_triton) if layers else "no transformers decoder layers found"
    if reason:
        report.fallback("fp8_linear", 0, reason + "; base weights stay bf16")
        return 0
    done, skipped, sizes = Counter(), Counter(), [0, 0]
    for layer in layers:
        for name, owner, attribute, linear in _targets(layer):
            why = _skip_reason(linear)
            if why:
                skipped[(name, why)] += 1
            else:
                _swap(owner, attribute, linear, sizes)
                done[name] += 1
    if torch.cuda.is_available():
        torch.cuda.empty_cache()   # the released bf16 weights become free memory for "auto" planning
    for name, n in sorted(done.items()):
        report.patched(f"fp8_linear[{name}]", n)
    for (name, why), n in sorted(skipped.items()):
        report.fallback(f"fp8_linear[{name}]", n, why)
    if sizes[0]:
        report.note(f"FP8 base weights (e4m3fn, per-channel scales): {sum(done.values())} linears, "
                    f"{sizes[0] / GB:.2f} GB -> {sizes[1] / GB:.2f} GB; embeddings, lm_head, "
                    "norms and LoRA adapters unchanged")
    return sum(done.values())
