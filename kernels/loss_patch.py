"""Compute a CausalLM's training loss with the fused linear cross-entropy (instance patch).

`patch_causal_lm_loss(model, report, use_triton)` rebinds the `forward` of the *ForCausalLM
instance inside `model` (PEFT-wrapped or not). Called WITH `labels`, the new forward runs the base
model (`self.model`), then `kernels.ops.fused_linear_cross_entropy` on the last hidden states and
the lm_head weight, with transformers' `ForCausalLMLoss` convention:

* labels are shifted inside (position t predicts token t+1; the last position gets ignore_index),
  or `shift_labels=` is used as given; ignore_index -100 (or `ignore_index=`);
* `num_items_in_batch=` (the Trainer's gradient-accumulation count): sum / num_items_in_batch,
  otherwise the mean over label tokens;
* Gemma 2/3 `final_logit_softcapping` from the config;

and returns a `CausalLMOutputWithPast` with the loss and `logits=None` (never materialising the
N x V logits is the point). Called WITHOUT labels (inference, `generate`), or with arguments the
fused path does not cover (`logits_to_keep` != 0, `return_dict=False`), it calls the original
forward unchanged.

`patch_label_rows_loss(model)` binds the same forward with PyTorch's loss over the labelled rows only
(`label_rows_cross_entropy`) for CPU jobs, where no Triton runs: a chat's prompt and the padding never
reach the LM head, whose logits over a 49K-128K vocabulary are a large share of a small model's step.
"""
from __future__ import annotations

import dataclasses
import inspect

import torch

from kernels.arch import text_config
from kernels.ops.fused_linear_cross_entropy import fused_linear_cross_entropy, label_rows_cross_entropy

OP = "fused_linear_cross_entropy"
ROWS_OP = "label_rows_cross_entropy"
LOSS_KWARGS = ("num_items_in_batch", "shift_labels", "ignore_index")


def find_causal_lm(model):
    """The *ForCausalLM module inside a plain or PEFT-wrapped model (None if there is none)."""
    if hasattr(model, "get_base_model"):
        model = model.get_base_model()
    return model if hasattr(model, "lm_head") and hasattr(model, "model") else None


def _unsupported_reason(lm) -> str | None:
    head = lm.lm_head
    config = text_config(lm.config)
    if hasattr(head, "lora_A") or type(head) is not torch.nn.Linear:
        return f"lm_head is a {type(head).__name__} (a LoRA adapter or quantized head), not nn.Linear"
    if getattr(head.weight, "quant_state", None) is not None:
        return "lm_head weight is quantized"
    for name in ("logit_scale", "logits_scaling"):
        value = getattr(config, name, None)
        if value not in (None, 1, 1.0):
            return f"config.{name}={value} (scaled logits are not fused)"
    if getattr(config, "output_router_logits", False):
        return "MoE router aux loss (output_router_logits=True) is added by the original forward"
    return None


def _output_fields():
    from transformers.modeling_outputs import CausalLMOutputWithPast
    return CausalLMOutputWithPast, {f.name for f in dataclasses.fields(CausalLMOutputWithPast)}


def _shifted_labels(labels, shift_labels, ignore_index):
    if shift_labels is not None:
        return shift_labels
    padded = torch.nn.functional.pad(labels, (0, 1), value=ignore_index)
    return padded[..., 1:]


def _fused_loss_forward(lm, named: dict, loss_fn=fused_linear_cross_entropy):
    labels = named.pop("labels")
    loss_kwargs = {k: named.pop(k) for k in LOSS_KWARGS if k in named}
    named.pop("logits_to_keep", None)
    named.pop("return_dict", None)
    outputs = lm.model(**named)
    hidden = outputs[0]
    ignore_index = loss_kwargs.get("ignore_index", -100)
    targets = _shifted_labels(labels, loss_kwargs.get("shift_labels"), ignore_index)
    config = text_config(lm.config)
    loss = loss_fn(
        hidden.reshape(-1, hidden.shape[-1]), lm.lm_head.weight,
        targets.reshape(-1).to(hidden.device), ignore_index=ignore_index,
        softcap=getattr(config, "final_logit_softcapping", None),
        num_items=loss_kwargs.get("num_items_in_batch"), bias=lm.lm_head.bias)
    output_cls, fields = _output_fields()
    rest = {k: v for k, v in outputs.items() if k in fields and k not in ("loss", "logits")}
    return output_cls(loss=loss, logits=None, **rest)


def _patch_forward(lm, loss_fn=fused_linear_cross_entropy, op: str = OP) -> None:
    original = lm.forward
    names = [n for n, p in inspect.signature(original).parameters.items()
             if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]

    def forward(*args, **kwargs):
        named = {**dict(zip(names, args)), **kwargs}
        keep = named.get("logits_to_keep", 0)
        plain_keep = isinstance(keep, int) and keep == 0
        if named.get("labels") is None or not plain_keep or named.get("return_dict") is False:
            return original(*args, **kwargs)
        return _fused_loss_forward(lm, named, loss_fn)

    lm.forward = forward
    lm._fusetune_loss = op
    lm._fusetune_patch = "loss"   # kernels.patch's tag: its _restore() undoes this patch


def patch_causal_lm_loss(model, report, use_triton: bool) -> None:
    """Route the CausalLM training loss through the fused linear cross-entropy (see module doc)."""
    lm = find_causal_lm(model)
    if lm is None:
        report.fallback(OP, 1, f"{type(model).__name__} has no lm_head/model pair (not a *ForCausalLM)")
        return
    reason = _unsupported_reason(lm)
    if reason is None and not use_triton:
        reason = "Triton not used (backend torch or no CUDA device)"
    if reason:
        report.fallback(OP, 1, reason)
        return
    if getattr(lm, "_fusetune_loss", None) is None:
        _patch_forward(lm)
    report.patched(OP, 1)


def patch_label_rows_loss(model) -> str:
    """A CPU job's loss over the labelled rows only, in PyTorch (module doc); returns train.log's line.
    A loss already patched (the fused one, under TRITON_INTERPRET=1) stays."""
    lm = find_causal_lm(model)
    if lm is not None and getattr(lm, "_fusetune_loss", None) is not None:
        return f"loss: {lm._fusetune_loss}"
    reason = (f"{type(model).__name__} has no lm_head/model pair" if lm is None else _unsupported_reason(lm))
    if reason:   # studio/server_text.py REPORT_LINES reads these two lines back for the page's language
        return f"loss: transformers' own, every position through the LM head ({reason})"
    _patch_forward(lm, label_rows_cross_entropy, ROWS_OP)
    return "loss: label rows only through the LM head (the prompt's and padding's logits are skipped)"
