"""How the trainer sets up its model for speed and memory (jobs/train/loop.py Trainer.prepare): the fused
kernels or the PyTorch path, activation checkpointing, the plan that holds max_gpu_memory_gb on a GPU
(jobs/models/fit.py) and its last resort, the input embeddings in host memory; then the predicted peak
that an out-of-memory message quotes. Each step says what it did in train.log."""
from __future__ import annotations

from jobs.models import load as models
from jobs.train import sharding
from kernels.checkpoint import enable_recompute
from kernels.host_embedding import host_input_embeddings, hostable_reason
from kernels.loss_patch import patch_label_rows_loss


def accelerate(trainer) -> list[str]:
    """Fused kernels and activation checkpointing, with what happened written to the log; sets
    trainer.checkpointing_line for the OOM message."""
    if trainer.spec.fused_kernels:
        from kernels import apply_checkpointing, patch_model
        report = patch_model(trainer.model, backend="auto", base_precision=trainer.spec.base_precision)
        tokens, plan = trainer.method.batch_tokens(), budget_plan(trainer)
        policy = apply_checkpointing(trainer.model, trainer.spec.gradient_checkpointing, batch_tokens=tokens,
                                     plan=plan)
        lines = report.lines() + ["  checkpointing: " + policy] + _host_embeddings(trainer, plan)
    else:
        lines = ["fused kernels: off (PyTorch path)", "  checkpointing: " + _torch_checkpointing(trainer)]
    trainer.checkpointing_line = lines[-1].strip()
    if trainer.device.type == "cpu":   # no Triton here: the loss still skips the unlabelled rows' logits
        lines.append("  " + patch_label_rows_loss(trainer.model))
    for line in lines:
        trainer.log(line)
    return lines


def budget_plan(trainer):
    """The fastest checkpointing plan within max_gpu_memory_gb (jobs/models/fit.py, the same one the
    fit check states, with what the method knows of its data), on a GPU; None without a budget."""
    if trainer.device.type != "cuda":
        return None
    from jobs.models import fit
    sizes = trainer.method.fit_sizes()   # out of the try: the method's errors are bugs, not exotic configs
    try:
        world = sharding.model_world(trainer)   # a sharded job plans what each process holds
        refusal = fit.budget_refusal(trainer.spec, trainer.model.config, trainable=trainer.trainable, world=world)
        if refusal:   # as --dry-run and Start refuse it (jobs/checks/preflight.py), before any step
            raise models.ModelError(f"max_gpu_memory_gb: {refusal}")
        return fit.plan_within_budget(trainer.spec, trainer.model.config, trainable=trainer.trainable, world=world,
                                      **sizes)
    except fit.ShapeUnknown as exc:   # a config the fit check cannot count; any other error is a bug
        trainer.log(f"note: no plan within max_gpu_memory_gb for this model ({exc}): the budget is not held")
        return None


def _host_embeddings(trainer, plan) -> list[str]:
    """The budget plan's last resort: the frozen input embedding table in pinned host memory
    (kernels/host_embedding.py), after checkpointing read the model's device from its parameters."""
    if not plan or not plan[3]:
        return []
    reason = "sharded: FSDP gathers it with the root's weights" if trainer.sharded else hostable_reason(trainer.model)
    if reason:
        return [f"  input embeddings: kept on the GPU ({reason})"]
    return [f"  input embeddings: in pinned CPU memory ({host_input_embeddings(trainer.model) / 2 ** 30:.2f} GiB "
            "off the GPU; each forward gathers its rows there)"]


def _torch_checkpointing(trainer) -> str:
    mode = trainer.spec.gradient_checkpointing
    if mode == "auto":
        mode = "on" if trainer.device.type == "cuda" else "off"
    if mode == "off":
        return "off"
    enable_recompute(trainer.model)
    note = " (offload needs fused_kernels; using plain recompute)" if mode == "offload" else ""
    return "on: every decoder layer recomputed in backward" + note


def estimate_fit(trainer) -> None:
    """The predicted peak of each process, kept for the OOM message (jobs/models/fit.py)."""
    from jobs.models import fit
    try:
        trainer.fit_estimate = fit.estimate_peak(trainer.spec, trainer.model.config, packed=trainer.packed,
                                                 trainable=trainer.trainable, model=trainer.model,
                                                 world=sharding.model_world(trainer), **trainer.method.fit_sizes())
    except (AttributeError, TypeError, ValueError) as exc:  # only the OOM message reads it: no estimate, no failure
        trainer.log(f"note: no memory estimate for this model ({exc})")
        return
    if trainer.device.type == "cuda":
        trainer.log(f"memory estimate: {trainer.fit_estimate.summary()}")
