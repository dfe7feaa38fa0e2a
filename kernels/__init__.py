"""Fusetune's Triton engine: fused ops and the model patcher.

Kept deliberately light. `kernels` is also the import name of Hugging Face's kernel-hub package,
and transformers / bitsandbytes probe for it (`is_kernels_available`, `from kernels import
get_kernel`). With our repo on sys.path they find this package, so it must import nothing heavy
(importing transformers here would be circular), define no `__version__` and no `get_kernel`.
Everything public is resolved lazily on first attribute access.
"""
from __future__ import annotations

import importlib

# public name -> (module, attribute)
_LAZY = {
    "patch_model": ("kernels.patch", "patch_model"),
    "apply_checkpointing": ("kernels.checkpoint", "apply_checkpointing"),
    "PatchReport": ("kernels.report", "PatchReport"),
    "rms_norm": ("kernels.ops.rms_norm", "rms_norm"),
    "rope": ("kernels.ops.rope", "rope"),
    "swiglu": ("kernels.ops.swiglu", "swiglu"),
    "geglu": ("kernels.ops.geglu", "geglu"),
    "fused_linear_cross_entropy": ("kernels.ops.fused_linear_cross_entropy", "fused_linear_cross_entropy"),
    "fused_linear_logprobs": ("kernels.ops.fused_linear_logprobs", "fused_linear_logprobs"),
    "sequence_logps": ("kernels.ops.fused_linear_logprobs", "sequence_logps"),
    "lora_qkv": ("kernels.ops.lora_qkv", "lora_qkv"),
    "lora_o": ("kernels.ops.lora_o", "lora_o"),
    "lora_mlp": ("kernels.ops.lora_mlp", "lora_mlp"),
    "dequantize_nf4": ("kernels.ops.nf4", "dequantize_nf4"),
    "step_casts": ("kernels.ops._lora_common", "step_casts"),
}

__all__ = sorted(_LAZY)


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'kernels' has no attribute {name!r}")
    module_name, attribute = _LAZY[name]
    value = getattr(importlib.import_module(module_name), attribute)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY))
