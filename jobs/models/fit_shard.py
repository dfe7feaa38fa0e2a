"""The fit check of a sharded job (`sharding: fsdp`, jobs/train/sharding.py): per-GPU memory when N
processes share the model, how many GPUs a model needs, and whether `sharding: auto` shards.

Under FSDP2 each GPU keeps 1/N of every weight and of the LoRA weights with their gradients and AdamW
state; on top it holds, while they run, whole copies of what is gathered: a decoder layer's weights
and the next one's (FSDP2 prefetches one layer ahead, in forward and in backward), and the root
group's (embeddings, head, final norm), which FSDP2 keeps gathered from the forward to the backward
(the root is not resharded after forward). An image-text model's vision tower is in the root group
(jobs/train/sharding.py): 1/N of it at rest, and whole from the forward to the backward. Activations
are per process and do not shrink: `batch_size` stays per process. A 4-bit base (FSDP-QLoRA) splits
its NF4 codes; each layer's quantization state (absmax, about 1/32 of the codes) stays whole on
every process, as bitsandbytes keeps it on the module; and its layers run bitsandbytes' matmul with
PEFT's LoRA on the gathered codes, not the fused NF4 kernels (kernels/lora_patch.py says why), so they
keep a PyTorch layer's activations (the loss stays fused): without that the fit check predicted 2.59 GiB
for a rank of a 2-GPU QLoRA job that peaked at 3.98 (1B shape, H200, bench/results/fsdp_fit.jsonl,
2026-12-05). An fp8 base is not sharded yet (the spec refuses it)."""
from __future__ import annotations

import dataclasses

from jobs.models import fit
from jobs.models.fit_estimate import FitEstimate
from jobs.models.fit_plan import _activations
from jobs.models.fit_shape import NF4_BYTES_PER_WEIGHT, _dtype_bytes, _Shape

MAX_GPUS = 64   # the most GPUs `gpus_needed` considers
LORA_PART = "LoRA + AdamW (fp32)"
BASE_PARTS = ("base weights", "base weights (NF4)", "embeddings")   # jobs/models/fit_shape.py _weights
NF4_CODE_BYTES = 0.5   # two 4-bit codes a byte; the rest of NF4_BYTES_PER_WEIGHT is the quant state
VISION_PART, VISION_LORA_PART = "vision tower", "vision LoRA + AdamW (fp32)"   # jobs/models/fit.py


def shardable(spec) -> bool:
    """Whether this job could train sharded (what `sharding: fsdp` does not refuse)."""
    return spec.base_precision != "fp8"


def sharded(estimate: FitEstimate, spec, model_config, world: int, cuda: bool = True) -> FitEstimate:
    """`estimate` (the unsharded one of the same job) as each of `world` FSDP processes holds it."""
    shape, b = _Shape.of(model_config), _dtype_bytes(spec, cuda=cuda)
    parts = {k: v for k, v in estimate.parts.items() if k not in BASE_PARTS}
    linear = shape.linear_weights()
    per_weight = NF4_CODE_BYTES if spec.load_in_4bit else b
    whole = int(linear * per_weight) + shape.embedding_weights() * b
    parts[f"base weights (1/{world} each)"] = -(-whole // world)
    if spec.load_in_4bit:   # the codes are split; each Linear4bit keeps its whole quant state (absmax)
        parts["NF4 quantization state (whole on each)"] = int(linear * (NF4_BYTES_PER_WEIGHT - NF4_CODE_BYTES))
    parts["gathered: embeddings and head"] = shape.embedding_weights() * b
    parts["gathered: two decoder layers"] = 2 * int(linear // shape.layers * per_weight)
    for part in (LORA_PART, VISION_LORA_PART):
        if part in parts:
            parts[part] = -(-parts[part] // world)
    if VISION_PART in parts:   # gathered with the root for the whole step, beside its shard at rest
        tower = parts.pop(VISION_PART)
        parts["vision tower (gathered with the root)"] = tower + -(-tower // world)
    notes = [*estimate.notes, f"sharded (fsdp) over {world} GPUs: each holds 1/{world} of the weights and "
             "LoRA state, plus the layers being gathered"]
    if spec.load_in_4bit and spec.fused_kernels and estimate.layer_plan is not None:
        recomputed, offload = estimate.layer_plan
        parts.update(_activations(shape, estimate.tokens, b, True, recomputed, offload, layers_fused=False))
        notes.append("the 4-bit layers run bitsandbytes' matmul and PEFT's LoRA on the gathered codes "
                     "(the fused NF4 path needs them whole): a PyTorch layer's activations")
    return dataclasses.replace(estimate, parts=parts, notes=notes)


def gpus_needed(spec, model_config, gpu_gb: float, estimate: FitEstimate | None = None) -> int | None:
    """The fewest GPUs of `gpu_gb` GiB each that hold this job: 1 when one does unsharded, N when
    sharding over N does, None when not even MAX_GPUS do (or the job cannot shard)."""
    estimate = estimate or fit.estimate_peak(spec, model_config)
    if estimate.total_gb <= gpu_gb:
        return 1
    if not shardable(spec):
        return None
    for world in range(2, MAX_GPUS + 1):
        if sharded(estimate, spec, model_config, world).total_gb <= gpu_gb:
            return world
    return None


def wants_sharding(spec, model_config, world: int, gpu_gb: float | None) -> bool:
    """Whether the job shards: `fsdp` always; `auto` when it has several processes, could shard, and
    one GPU of `gpu_gb` GiB (the job's max_gpu_memory_gb when set) cannot hold it unsharded."""
    if spec.sharding == "fsdp":
        return True
    if spec.sharding != "auto" or world < 2 or not gpu_gb or not shardable(spec):
        return False
    limit = min(gpu_gb, spec.max_gpu_memory_gb) if spec.max_gpu_memory_gb > 0 else gpu_gb
    try:
        return fit.estimate_peak(spec, model_config).total_gb > limit
    except (AttributeError, TypeError, ValueError):   # an exotic config: no estimate, no sharding
        return False


def need_note(spec, model_config, estimate: FitEstimate, gpu_gb: float) -> str | None:
    """For the fit check: how many GPUs of this size the job needs when one is not enough."""
    if estimate.total_gb <= gpu_gb:
        return None
    needed = gpus_needed(spec, model_config, gpu_gb, estimate)
    if needed is None:
        return f"one GPU of {gpu_gb:.0f} GiB cannot hold this job, and sharding over {MAX_GPUS} would not either"
    return (f"one GPU of {gpu_gb:.0f} GiB cannot hold this job; with sharding fsdp (or auto) it needs "
            f"{needed} such GPUs")


def job_world(spec) -> int:
    """The processes a local job runs (JobSpec `processes`, else one per listed GPU)."""
    return spec.processes or len(spec.gpu_indices() or [0])


def for_job(spec, model_config, estimate: FitEstimate, gpu_gb: float | None) -> FitEstimate:
    """The fit check's estimate of the job as it will run: per GPU of a sharded job (fsdp with several
    processes, or auto when one GPU of `gpu_gb` GiB cannot hold it), with a note of how many GPUs the
    job needs when the GPU is too small."""
    world = job_world(spec)
    shards = world > 1 and (spec.sharding == "fsdp" or (
        spec.sharding == "auto" and gpu_gb and shardable(spec) and estimate.total_gb > gpu_gb))
    planned = sharded(estimate, spec, model_config, world) if shards else estimate
    note = need_note(spec, model_config, estimate, gpu_gb) if gpu_gb and planned.total_gb > gpu_gb else None
    return dataclasses.replace(planned, notes=[*planned.notes, note]) if note else planned
