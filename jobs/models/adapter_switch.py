"""The base model under a LoRA model, cheaply: every adapter switched off for a reference pass
(DPO, KTO, GRPO with beta > 0) or a base-model answer in chat.

PEFT's `PeftModel.disable_adapter()` does the same, but first builds `get_model_status()`, a report
that walks every module and formats each adapter layer (to warn when some layers are on and others
off), then walks every module again to find the adapter layers, twice. On the Llama-3.2-1B shape with
LoRA on all linear layers (1,337 modules, 112 adapter layers) that cost 14.7 ms of Python per
reference pass on a 2-core host (bench/NOTES.md, 2026-12-05), inside preference steps that are
host-bound: the 8-example KTO step's GPU sat idle 30-46 ms once per step (bench/results/
profile_job_kto_1b.json). Here the adapter layers are found once per model (again when its adapters
change) and switched with each layer's own `enable_adapters` (PEFT's public per-layer switch, which
also takes the adapter weights' requires_grad off and back as PEFT's context does): 2.9 ms there.

Only the layers that were on are switched back on leaving the context, so an adapter a caller had
switched off stays off (PEFT's context switches every layer on)."""
from __future__ import annotations

import contextlib
import weakref

import torch

from jobs.models.train_mode import set_training

_LAYERS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _switchable(module) -> bool:
    from peft.tuners.tuners_utils import BaseTunerLayer
    try:
        from peft.utils.other import AuxiliaryTrainingWrapper   # modules_to_save, trainable tokens
    except ImportError:   # an older PEFT: ModulesToSaveWrapper alone
        from peft.utils.other import ModulesToSaveWrapper as AuxiliaryTrainingWrapper
    return isinstance(module, (BaseTunerLayer, AuxiliaryTrainingWrapper))


def adapter_layers(peft) -> list:
    """The modules of `peft` that hold adapters, found once per set of adapter names."""
    key = tuple(getattr(peft, "peft_config", {}) or ())
    known = _LAYERS.get(peft)
    if known is None or known[0] != key:
        known = (key, [m for m in peft.modules() if _switchable(m)])
        _LAYERS[peft] = known
    return known[1]


def _layer_adapters(peft) -> bool:
    """Whether `peft` is a PEFT model whose adapters live in layers (LoRA and its kin), not prompts."""
    config = getattr(peft, "peft_config", {}).get(getattr(peft, "active_adapter", None))
    return config is not None and not (config.is_prompt_learning or getattr(config, "is_adaption_prompt", False))


@contextlib.contextmanager
def base_model_only(peft):
    """Every adapter of `peft` off inside the context; a model without PEFT adapters runs as it is."""
    if not hasattr(peft, "disable_adapter"):
        yield
        return
    if not _layer_adapters(peft):   # prompt tuning and the like: PEFT swaps the forward itself
        with peft.disable_adapter():
            yield
        return
    switched = [m for m in adapter_layers(peft) if not m.disable_adapters]
    for module in switched:
        module.enable_adapters(False)
    try:
        yield
    finally:
        for module in switched:
            module.enable_adapters(True)


@contextlib.contextmanager
def reference_pass(peft):
    """The base model as a frozen reference policy (DPO, KTO, GRPO with beta > 0): every adapter off,
    no grad, and eval mode, restored after. Eval mode matters beyond dropout: transformers' decoder
    layers checkpoint only in training mode, so a reference pass in training mode went through
    kernels/checkpoint.py, which copied each recomputed layer's input to pinned host memory for a
    backward that never runs (GRPO's reference pass did until 2026-12-05)."""
    was_training = peft.training
    set_training(peft, False)   # train_mode.py: one flat pass, 0.14 instead of 2.7 ms on the 1B shape
    try:
        with torch.no_grad(), base_model_only(peft):
            yield
    finally:
        set_training(peft, was_training)
