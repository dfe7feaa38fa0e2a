"""A vision tower's attention in one varlen launch a block (Qwen2-VL, Qwen2.5-VL).

transformers runs a vision block's attention one image at a time (and, in Qwen2.5-VL's windowed
blocks, one window of 8 x 8 patches at a time) unless the tower's attention implementation is a
flash one: it copies the pieces' lengths to the host (`lengths.tolist()`), splits q/k/v and calls
sdpa once a piece (`VisionAttention.forward` of modeling_qwen2_vl / modeling_qwen2_5_vl,
transformers 5.17 and 5.24). A 1024 x 768 image is about 60 windows, so a training step over a
few images makes thousands of small launches in each of the 32 blocks, and the GPU waits on
Python. The flash branch of that same forward instead hands the whole tower input, with
`cu_seq_lens_q/k` and `max_length_q/k` (one host read a tower forward), to the attention interface
in one call.

`use_vision_varlen_attention` registers one function in transformers' `AttentionInterface` under
a name holding "flash" (transformers picks that branch by `"flash" in config._attn_implementation`:
`utils.generic.is_flash_attention_requested`) and switches the tower's config to it. The function
runs `kernels.ops.varlen_attention` with `causal=False`: FlashAttention-2's varlen kernel as torch
ships it, bidirectional within each image or window, forward and backward (a LoRA'd tower). Where
that kernel cannot run (CPU, fp32, no varlen kernel in this torch, head_dim > 256) the tower keeps
transformers' attention and the kernel report says why. Only the tower's config changes: the
language model's attention is kernels/packed_attention.py's concern.
"""
from __future__ import annotations

import torch

from kernels.arch import base_model
from kernels.ops.varlen_attention import kernel_unavailable_reason, varlen_attention

NAME = "fusetune_flash_varlen"   # "flash" in the name is what routes transformers' vision blocks here
OP = "vision_attention"
PREVIOUS_ATTR = "_fusetune_previous_vision_attn"
ATTENTION_CLASSES = ("Qwen2_5_VLVisionAttention", "VisionAttention")   # Qwen2.5-VL's, Qwen2-VL's


def vision_varlen_attention_forward(module, query, key, value, attention_mask=None, scaling=None,
                                    dropout: float = 0.0, cu_seq_lens_q=None, max_length_q=None, **kwargs):
    """transformers' attention-interface call of a vision block's flash branch: q/k/v
    [1, heads, T, head_dim] over every image's patches back to back, `cu_seq_lens_q` their
    pieces (images or windows). Returns ([1, T, heads, head_dim], None) as flash functions do."""
    if attention_mask is not None or cu_seq_lens_q is None or query.shape[0] != 1:
        raise ValueError(f"{NAME}: a vision tower's call needs cu_seq_lens_q, one row and no mask")
    q, k, v = (t[0].transpose(0, 1) for t in (query, key, value))   # [T, heads, head_dim]
    longest = max_length_q if max_length_q is not None else int((cu_seq_lens_q[1:] - cu_seq_lens_q[:-1]).max())
    out = varlen_attention(q, k, v, cu_seq_lens_q, int(longest), scale=scaling, dropout=dropout, causal=False)
    return out.unsqueeze(0), None


def _registered() -> None:
    from transformers import AttentionInterface

    AttentionInterface.register(NAME, vision_varlen_attention_forward)


def _tower_configs(model) -> tuple[list, list]:
    """(the tower's attention modules, the distinct configs they read their implementation from)."""
    modules = [m for m in base_model(model).modules() if type(m).__name__ in ATTENTION_CLASSES]
    configs = {id(m.config): m.config for m in modules if hasattr(m, "config")}
    vision_config = getattr(base_model(model).config, "vision_config", None)
    if modules and vision_config is not None:
        configs.setdefault(id(vision_config), vision_config)
    return modules, list(configs.values())


def why_not_fused(modules: list, use_triton: bool) -> str | None:
    """Why the tower keeps transformers' attention (None when the varlen kernel runs it)."""
    if not use_triton:
        return "the fused engine is off (backend torch)"
    weight = modules[0].qkv.weight if hasattr(modules[0], "qkv") else next(modules[0].parameters())
    probe = torch.empty(1, 1, modules[0].head_dim, dtype=weight.dtype, device=weight.device)
    return kernel_unavailable_reason(probe, None, getattr(modules[0], "attention_dropout", 0.0) or 0.0)


def restore_vision_attention(configs: list) -> None:
    for config in configs:
        previous = config.__dict__.pop(PREVIOUS_ATTR, None)
        if previous is not None:
            config._attn_implementation = previous


def use_vision_varlen_attention(model, report, use_triton: bool) -> None:
    """kernels.patch's helper: switch an image-text model's tower to the varlen function (module
    doc) and say so in `report`; a text model is left alone and unmentioned."""
    modules, configs = _tower_configs(model)
    if not modules:
        return
    reason = why_not_fused(modules, use_triton)
    if reason is not None:
        restore_vision_attention(configs)
        report.fallback(OP, len(modules), f"{reason}: transformers' attention, one launch per image or window")
        return
    _registered()
    for config in configs:
        if config._attn_implementation != NAME:
            setattr(config, PREVIOUS_ATTR, config._attn_implementation)
            config._attn_implementation = NAME
    report.patched(OP, len(modules))
    report.note(f"{OP}: FlashAttention varlen (torch's kernel), one launch a vision block over every "
                "image and window, instead of transformers' one sdpa call per piece")
