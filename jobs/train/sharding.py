"""Sharded training (JobSpec `sharding: fsdp`, or `auto` when one GPU cannot hold the job): PyTorch
FSDP2 (`torch.distributed.fsdp.fully_shard`), one group per decoder layer and the root for the rest
(embeddings, final norm, head), as torchtitan and TRL's FSDP2 configs wrap a transformer.

Every rank holds 1/world of each layer's weights, frozen base and LoRA alike; a layer's weights are
all-gathered just before its forward (and again before its backward) and freed after. The LoRA
weights stay inside their layer's group on purpose: the fused kernels (kernels/lora_patch.py) read
`lora_A[adapter].weight` inside the layer's forward without calling the LoRA modules, so only a
layer-level group has them gathered then (a group of its own per `lora_A.default` would hand the
kernel its shard). A bf16 base with fp32 LoRA needs no mixed-precision policy: FSDP2 gathers each
parameter in its own dtype (checked in a trial before this was written, issue 37).

An image-text model (Qwen2-VL, Qwen2.5-VL) shards its language model's layers the same way; its
vision tower and projector stay in the root group: split at rest like everything, gathered whole
with the embeddings when the step's forward begins, on every rank. Groups per vision block would
gather only on the ranks whose micro-batch has an image (the tower does not run without one), and
the ranks without would leave them waiting in the all-gather; the tower is small beside the language
model (0.7B of Qwen2.5-VL-7B), and its LoRA gradients (vision_lora) are reduce-scattered with zeros
from a rank where it did not run (`set_reduce_scatter_unused_params`, the multimodal case PyTorch's
doc names).

GRPO samples through the sharded layers, the ranks in lockstep (jobs/train/rollout.py). A 4-bit base
(FSDP-QLoRA, after Answer.AI's): bitsandbytes' Params4bit stays one through FSDP2's split (its
`__torch_function__` rewraps torch.chunk's pieces), the gathered weight gets its quant state back
from the module at forward (bitsandbytes' fix_4bit_weight_quant_state_from_module), and FSDP2 gathers
the uint8 codes beside float parameters (mixed dtypes go as bytes), so no bf16 quant storage is needed.

Gradients are reduce-scattered as a SUM, like the DDP comm hook of jobs/train/distributed.py: each
rank's loss is already divided by the global batch's label tokens. Gloo has no pre-multiplied sum,
hence `set_force_sum_reduction_for_comms`.

Saving gathers the whole LoRA weights (DTensor.full_tensor, parameter by parameter) and AdamW
state (torch.distributed.checkpoint's `get_optimizer_state_dict`, full_state_dict) to rank 0; the frozen
base is never gathered. The files and their layout are an unsharded run's: an adapter or a checkpoint
does not know how it was trained, and resumes sharded or not, on any number of ranks.
"""
from __future__ import annotations

import torch



def is_sharded(model: torch.nn.Module) -> bool:
    from torch.distributed.fsdp import FSDPModule
    return isinstance(model, FSDPModule)


def decide(spec, config, dist, log) -> bool:
    """Whether this job trains sharded (and `dist.sharded` set to it). fsdp shards whenever there are
    several processes (one process has nothing to share: it trains unsharded and saves the same files);
    auto when the fit check says one GPU cannot hold the job (jobs/models/fit_shard.py)."""
    if spec.sharding == "fsdp":
        if dist.world_size < 2:
            log("note: sharding fsdp with one process has nothing to share; training unsharded")
    elif spec.sharding == "none":
        return False
    elif not _auto_shards(spec, config, dist, log):
        return False
    else:
        log(f"sharding auto: one GPU ({_gpu_gb(dist.device):.0f} GiB) cannot hold this job; fsdp over "
            f"{dist.world_size} processes")
    dist.sharded = dist.world_size > 1
    return dist.sharded


def _auto_shards(spec, config, dist, log) -> bool:
    from jobs.models import fit, fit_shard
    try:
        return fit_shard.wants_sharding(spec, config, dist.world_size, _gpu_gb(dist.device))
    except fit.ShapeUnknown as exc:
        log(f"note: sharding auto cannot size this model ({exc}); training unsharded")
        return False


def _gpu_gb(device) -> float | None:
    if device.type != "cuda":
        return None
    return torch.cuda.get_device_properties(device).total_memory / 2 ** 30


def load_device(trainer) -> torch.device:
    """Where the base model loads: a sharded job's on the CPU, since `fully_shard` then moves only each
    rank's shard to its GPU (a model too big for one GPU never lands whole on one)."""
    return torch.device("cpu") if trainer.sharded else trainer.device


def model_world(trainer) -> int:
    """The processes the model is split over (1 unsharded): what the budget plan and the fit check
    size each process by (jobs/models/fit_rank.py)."""
    return trainer.dist.world_size if trainer.sharded else 1


def language_layers(model: torch.nn.Module) -> list:
    """The decoder layers that get an FSDP group of their own: the language model's. An image-text
    model's vision blocks (GradientCheckpointingLayer too) stay in the root group (module doc)."""
    from jobs.models.vision import part_of
    from kernels.checkpoint import decoder_layers
    names = {id(module): name for name, module in model.named_modules()}
    return [layer for layer in decoder_layers(model) if part_of(names[id(layer)]) == "language"]


def shard_model(model: torch.nn.Module, dist, log) -> str:
    """Shard `model` in place over all ranks (each decoder layer, then the root); logs and returns the
    kernel report's line.
    Every rank must hold the same weights before (the LoRA init is seeded alike on every rank)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FSDPModule, fully_shard

    from kernels.checkpoint import decoder_layers
    mesh = init_device_mesh(dist.device.type, (dist.world_size,))
    layers = language_layers(model)
    for layer in layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(1.0)          # summed, not averaged (module doc)
            module.set_force_sum_reduction_for_comms(True)  # gloo: no PREMUL_SUM
    tower = " (the vision tower with the root)" if len(layers) < len(decoder_layers(model)) else ""
    if tower:
        _same_backward_on_every_rank(model)
    line = (f"sharding: fsdp over {dist.world_size} processes, {len(layers)} decoder layers and the root{tower} "
            "(base weights and LoRA split; the fused kernels run on each layer's gathered weights)")
    log(line)
    return line


def _same_backward_on_every_rank(model) -> None:
    """An image-text model's ranks must reduce the same groups in the same order although a rank whose
    micro-batch has no image never runs the tower (seen on the tiny Qwen2.5-VL with vision_lora: the
    ranks' reduce-scatters crossed, 22,528 against 16,384 values):
    - its vision LoRA has no gradient there: the root reduce-scatters zeros for it
      (`set_reduce_scatter_unused_params`, for "multi-modal models" in PyTorch's words);
    - the first decoder layer's input then needs no gradient, so its group would reduce only at the
      end of backward, after the root, where an image rank's (its input carries the tower's LoRA
      output) reduces before it: the embeddings' output always requires grad
      (`enable_input_require_grads`, as PEFT does for checkpointing)."""
    model.set_reduce_scatter_unused_params(True, recurse=False)
    model.enable_input_require_grads()


def full_tensor(value: torch.Tensor) -> torch.Tensor:
    """A DTensor's whole value (a collective: every rank calls it); a plain tensor as it is."""
    return value.full_tensor() if hasattr(value, "full_tensor") else value


def _options(**extra):
    from torch.distributed.checkpoint.state_dict import StateDictOptions
    return StateDictOptions(full_state_dict=True, **extra)


def gathered_weights(model) -> dict | None:
    """The full trainable (LoRA) weights by the model's names, on rank 0 ({} on the others; a
    collective: every rank calls it). None for an unsharded model, which saves as it is. Gathered
    parameter by parameter rather than by get_model_state_dict, whose ignore_frozen_params still
    gathers a frozen head tied to the embeddings (vocab x hidden, seen on the tiny Llama)."""
    if not is_sharded(model):
        return None
    import torch.distributed as dist
    full = {name: full_tensor(p.detach()).cpu() for name, p in model.named_parameters() if p.requires_grad}
    return full if dist.get_rank() == 0 else {}


def _trainable_names(model) -> list[str]:
    """The optimizer's parameters in its order (the loop builds it from model.parameters())."""
    return [name for name, p in model.named_parameters() if p.requires_grad]


def gathered_optimizer(model, optimizer) -> dict | None:
    """The full AdamW state on rank 0 in the plain `optimizer.state_dict()` layout (parameters by
    index), so that an unsharded run loads it as it is; {} on other ranks; None when unsharded."""
    if not is_sharded(model):
        return None
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict
    full = get_optimizer_state_dict(model, optimizer, options=_options(cpu_offload=True))
    if not full:
        return {}
    index = {name: i for i, name in enumerate(_trainable_names(model))}
    groups = [{**group, "params": [index[name] for name in group["params"]]} for group in full["param_groups"]]
    return {"state": {index[name]: state for name, state in full["state"].items()}, "param_groups": groups}


def load_optimizer(model, optimizer, plain: dict) -> None:
    """Load a plain (by index) optimizer state into a sharded model's optimizer; each rank keeps its shard."""
    from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict
    names = _trainable_names(model)
    groups = [{**group, "params": [names[i] for i in group["params"]]} for group in plain["param_groups"]]
    named = {"state": {names[int(i)]: state for i, state in plain["state"].items()}, "param_groups": groups}
    set_optimizer_state_dict(model, optimizer, named, options=_options())


def load_weights(model, peft_weights: dict) -> None:
    """Load a PEFT adapter's weights (adapter_model.safetensors keys) into a sharded model; each rank
    keeps its shard. PEFT names them without the adapter name: the model's names are mapped through
    PEFT's own renaming (get_peft_model_state_dict) rather than a copy of its rules."""
    from peft import get_peft_model_state_dict
    from torch.distributed.checkpoint.state_dict import set_model_state_dict
    names = _trainable_names(model)
    tokens = {name: torch.empty(0) for name in names}   # one distinct tensor per name: mapped back by identity
    renamed = get_peft_model_state_dict(model, state_dict=tokens)
    by_token = {id(token): name for name, token in tokens.items()}
    to_model = {key: by_token[id(token)] for key, token in renamed.items() if id(token) in by_token}
    missing = sorted(set(to_model) - set(peft_weights))
    if missing:
        raise ValueError(f"the checkpoint's adapter lacks {len(missing)} LoRA weights, e.g. {missing[0]}")
    full = {to_model[key]: peft_weights[key] for key in to_model}
    set_model_state_dict(model, full, options=_options(strict=False))
