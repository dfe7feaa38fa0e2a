"""The fit check of a sharded job (`sharding: fsdp`, jobs/train/sharding.py): per-GPU memory when N
processes share the model, how many GPUs a model needs, and whether `sharding: auto` shards.

What each process holds is fit_rank.py's arithmetic: 1/N of the weights and LoRA state, the gathered
layers and root, and a sharded 4-bit base's PyTorch-path activations; without counting those the fit
check predicted 2.59 GiB for a rank of a 2-GPU QLoRA job that peaked at 3.98 (1B shape, H200,
bench/results/fsdp_fit.jsonl, 2026-12-05). Activations are per process and do not shrink:
`batch_size` stays per process. The job's budget plan (max_gpu_memory_gb) sizes one process the same
way (fit.py `world`), so the fit check of a sharded job re-plans it per process rather than scaling
the unsharded job's plan. An fp8 base is not sharded yet (the spec refuses it)."""
from __future__ import annotations

import dataclasses

from jobs.models import fit, fit_rank
from jobs.models.fit_estimate import FitEstimate
from jobs.models.fit_plan import _activations
from jobs.models.fit_shape import _dtype_bytes, _Shape

MAX_GPUS = 64   # the most GPUs `gpus_needed` considers


def shardable(spec) -> bool:
    """Whether this job could train sharded (what `sharding: fsdp` does not refuse)."""
    return spec.base_precision != "fp8"


def sharded(estimate: FitEstimate, spec, model_config, world: int, cuda: bool = True) -> FitEstimate:
    """`estimate` (the unsharded one of the same job) as each of `world` FSDP processes holds it under
    the same checkpointing plan (how many GPUs hold the job: gpus_needed; a job's own estimate is
    planned per process, fit.estimate_peak's `world`)."""
    shape, b = _Shape.of(model_config), _dtype_bytes(spec, cuda=cuda)
    parts = fit_rank.per_rank(estimate.parts, spec, shape, b, world)
    if estimate.layer_plan is not None and not fit_rank.layers_fused(spec, spec.fused_kernels, world):
        recomputed, offload = estimate.layer_plan
        parts.update(_activations(shape, estimate.tokens, b, True, recomputed, offload, layers_fused=False))
    if estimate.layer_plan is not None:   # the first layer's gather beside the root's all-gather output
        parts.update(fit_rank.first_gather(parts, shape, b, world, estimate.tokens,
                                           estimate.parts.get(fit_rank.VISION_PART, 0)))
    return dataclasses.replace(estimate, parts=parts, notes=[*estimate.notes, *fit_rank.notes(spec, world)])


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
    one GPU of `gpu_gb` GiB (the job's max_gpu_memory_gb when set) cannot hold it unsharded. A config
    the fit check cannot count raises fit.ShapeUnknown (the caller says so and trains unsharded); any
    other error is a bug and surfaces, rather than silently training unsharded into an OOM."""
    if spec.sharding == "fsdp":
        return True
    if spec.sharding != "auto" or world < 2 or not gpu_gb or not shardable(spec):
        return False
    return _too_big(spec, fit.estimate_peak(spec, model_config), gpu_gb)


def _too_big(spec, estimate: FitEstimate, gpu_gb: float) -> bool:
    """Whether one GPU of `gpu_gb` GiB, or the job's budget when smaller, cannot hold the unsharded job."""
    limit = min(gpu_gb, spec.max_gpu_memory_gb) if spec.max_gpu_memory_gb > 0 else gpu_gb
    return estimate.total_gb > limit


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


def model_world(spec, estimate: FitEstimate, gpu_gb: float | None) -> int:
    """The processes the job's model is split over: job_world when it shards (fsdp with several
    processes, or auto as wants_sharding decides), else 1."""
    world = job_world(spec)
    shards = world > 1 and (spec.sharding == "fsdp" or (
        spec.sharding == "auto" and bool(gpu_gb) and shardable(spec) and _too_big(spec, estimate, gpu_gb)))
    return world if shards else 1


def for_job(spec, model_config, estimate: FitEstimate, gpu_gb: float | None, **sizes) -> FitEstimate:
    """The fit check's estimate of the job as it will run: per GPU of a sharded job, planned as each
    process plans (its budget plan included; `sizes`: estimate_peak's free/total bytes), with a note of
    how many GPUs the job needs when the GPU is too small."""
    world = model_world(spec, estimate, gpu_gb)
    planned = fit.estimate_peak(spec, model_config, world=world, **sizes) if world > 1 else estimate
    note = need_note(spec, model_config, estimate, gpu_gb) if gpu_gb and planned.total_gb > gpu_gb else None
    return dataclasses.replace(planned, notes=[*planned.notes, note]) if note else planned
