"""A model's training flag set on every module in one flat pass: what `model.train(mode)` does, for
the switches inside a step.

`nn.Module.train(mode)` recurses through `children()` and sets `training` through
`Module.__setattr__`, which checks the parameter, buffer and submodule dicts first: 2.7 ms of Python
on the Llama-3.2-1B shape with LoRA on every linear layer (1,337 modules, a 2-core host). A DPO or
KTO step switches twice (eval for the reference pass, back to training), and those steps are
host-bound (bench/results/profile_job_kto_1b_s52.json). Here the modules are listed once per model
and the flag is written straight into each one's `__dict__` (where `Module.__init__` keeps it):
0.14 ms for the same switch.

The flat pass is only taken where it is exactly `train(mode)`: every module's class must use
`nn.Module.train` itself, or transformers' `PreTrainedModel.train` with its kernel hub off (that
override only re-applies hub kernels when the mode changes); any other override goes through
`model.train(mode)`. The list is taken at the first switch, which in a job comes after the kernel
patches, LoRA and any sharding (nothing adds modules during training); it is taken again when the
model's own top-level modules change.
"""
from __future__ import annotations

import weakref

import torch

_FLAT: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()   # model -> (top-level count, modules or None)


def _plain_train(module) -> bool:
    train = type(module).train
    if train is torch.nn.Module.train:
        return True
    try:
        from transformers import PreTrainedModel
    except ImportError:   # pragma: no cover - transformers is a requirement
        return False
    return train is PreTrainedModel.train and not getattr(module, "use_kernels", False)


def _flat_modules(model) -> list | None:
    """Every module below `model` when a flat pass equals train(mode), else None; listed once per model.
    The model itself is left out of its list: a value that held its key would keep it alive for good."""
    count = len(model._modules)
    known = _FLAT.get(model)
    if known is None or known[0] != count:
        below = list(model.modules())[1:]
        known = (count, below if all(_plain_train(m) for m in [model, *below]) else None)
        _FLAT[model] = known
    return known[1]


def set_training(model, mode: bool) -> None:
    """`model.train(mode)`, in one flat pass where that is the same thing."""
    modules = _flat_modules(model)
    if modules is None:
        model.train(mode)
        return
    model.__dict__["training"] = mode
    for module in modules:
        module.__dict__["training"] = mode
